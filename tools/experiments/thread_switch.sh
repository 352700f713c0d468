#!/usr/bin/env bash
# The cost of switching LibTorch's thread count (tools/experiments/thread_switch.cpp):
# at::set_num_threads (mode 0) against omp_set_num_threads (mode 1). Installs nothing.
#   tools/experiments/thread_switch.sh [MODE ...]   (default: 0 1)
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT
g++ -O2 -std=c++17 -fopenmp "$here/thread_switch.cpp" -o "$out/thread_switch" -ltorch_cpu -lc10
for mode in "${@:-0 1}"; do
  # shellcheck disable=SC2086
  "$out/thread_switch" $mode
done
