#!/usr/bin/env bash
# Times fused Sinkhorn T' = 1..6 at one shape with the row passes on the
# transposed tile on (the default) and off, and prints what ending on a column
# pass costs more than ending on a row pass (tools/experiments/pass_costs.cpp;
# docs/performance.md, "AVX-512 again"). Builds against the repo's libasap.
#   tools/experiments/pass_costs.sh [N=17] [D=16] [ROUNDS=3] [REPS=301]
# ASAP_BUILD: the build directory with libasap.so (default build).
set -euo pipefail
cd "$(dirname "$0")/../.."
n=${1:-17} d=${2:-16} rounds=${3:-3} reps=${4:-301}
build=${ASAP_BUILD:-build}
[ -e "$build/libasap.so" ] || { echo "pass_costs.sh: expected libasap.so in '$build' (cmake --build $build), found none" >&2; exit 2; }
out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT
g++ -O2 -std=c++17 -Iinclude -Isrc/lib -I/usr/include/torch/csrc/api/include tools/experiments/pass_costs.cpp \
  -o "$out/pass_costs" -L"$build" -lasap -ltorch_cpu -lc10
OMP_NUM_THREADS=1 OMP_WAIT_POLICY=ACTIVE LD_LIBRARY_PATH="$build${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" \
  "$out/pass_costs" "$n" "$d" "$rounds" "$reps"
