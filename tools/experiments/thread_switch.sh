#!/usr/bin/env bash
# The cost of switching LibTorch's thread count (tools/experiments/thread_switch.cpp):
# at::set_num_threads against omp_set_num_threads. Installs nothing.
#   tools/experiments/thread_switch.sh
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT
g++ -O2 -std=c++17 -fopenmp "$here/thread_switch.cpp" -o "$out/thread_switch" -ltorch_cpu -lc10
"$out/thread_switch" 0
"$out/thread_switch" 1
