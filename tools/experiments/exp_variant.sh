#!/usr/bin/env bash
# Builds asap_bench with a coarser float32 exponential of degree DEG (exp_poly.py
# patch: 2^f with a one-step reduction) from this checkout's committed tree, in
# DIR, for a build_ab.sh comparison against the repo's own build: the throw-away
# builds of docs/performance.md, "A shorter exponential".
#
#   tools/experiments/exp_variant.sh DEG DIR
#   e.g. tools/experiments/exp_variant.sh 3 /tmp/exp3 &&
#        STAT=min BH=4x4 ROUNDS=7 tools/experiments/build_ab.sh build /tmp/exp3/build 17 16 1 0 sinkhorn_1 layer_teacher_6
# About 5 minutes on 2 cores. PYTHON (default /usr/bin/python3).
set -euo pipefail
cd "$(dirname "$0")/../.."
[ $# -eq 2 ] || { sed -n '2,10p' "$0" >&2; exit 2; }
deg=$1 dir=$2
PYTHON=${PYTHON:-/usr/bin/python3}
case "$deg" in [2-8]) ;; *) echo "exp_variant.sh: expected DEG an integer from 2 to 8, found '$deg'" >&2; exit 2 ;; esac
[ ! -e "$dir" ] || { echo "exp_variant.sh: expected DIR not to exist yet, found '$dir'" >&2; exit 2; }
mkdir -p "$dir"
git archive HEAD | tar -x -C "$dir"
"$PYTHON" tools/experiments/exp_poly.py patch "$deg" "$dir/src/lib/fast/kernels_impl.h"
cmake -S "$dir" -B "$dir/build" -DCMAKE_BUILD_TYPE=Release > "$dir/cmake.log"
make -C "$dir/build" -j2 asap_bench > "$dir/make.log"
echo "built $dir/build/tools/asap_bench (degree-$deg exponential)"
