#!/usr/bin/env bash
# Times one fork/join of LibTorch's OpenMP team (tools/experiments/fork_join.cpp)
# with the threads and wait policy asap_bench uses, and for scale a round trip
# of a flag between two spinning threads and one system call. Installs nothing.
#   tools/experiments/fork_join.sh [THREADS=2] [WAIT_POLICY=active]
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
threads="${1:-2}"
policy="${2:-active}"
[[ "$threads" =~ ^[1-9][0-9]*$ ]] || { echo "fork_join.sh: expected THREADS as a positive integer, found '$threads'" >&2; exit 2; }
[[ "$policy" == active || "$policy" == passive ]] ||
  { echo "fork_join.sh: expected WAIT_POLICY active or passive, found '$policy'" >&2; exit 2; }
out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT
g++ -O2 -std=c++17 -fopenmp -I/usr/include/torch/csrc/api/include "$here/fork_join.cpp" -o "$out/fork_join" \
  -ltorch_cpu -lc10
OMP_NUM_THREADS="$threads" OMP_WAIT_POLICY="$policy" "$out/fork_join"
