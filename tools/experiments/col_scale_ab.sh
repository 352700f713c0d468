#!/usr/bin/env bash
# Where the final column pass's scales go, compared in one build: with
# tools/experiments/col_scale_switch.patch applied (git apply, then cmake
# --build build), ASAP_XP=0 is the default choice, 1 scales E's columns in
# place, 2 multiplies a copy of V's rows, 3 scales V's rows in the output GEMM.
# Without the patch the runs are the same code, and their ratios are the noise.
# (The patch applies to commit d53a35c, rebased there from 060094a; later
# changes to src/lib/fast/engine.cpp may need it rebased again.)
# Prints, per n and operator, the least time over ROUNDS rounds (the three
# switches alternate within a round) and its ratio to ASAP_XP=0
# (docs/performance.md, "Issue 24 on an AMD EPYC family 25 model 17").
#   tools/experiments/col_scale_ab.sh [D=16] [ROUNDS=5] [NS=17,32,50,64] [OPS=asap_1,asap_3] [KS=1,3]
# THR: threads (default 1); XPS: the switches to run (default "0 1 2").
set -euo pipefail
cd "$(dirname "$0")/../.."
d=${1:-16} rounds=${2:-5} ns=${3:-17,32,50,64} ops=${4:-asap_1,asap_3} ks=${5:-1,3}
bench=${ASAP_BUILD:-build}/tools/asap_bench
[ -x "$bench" ] || { echo "col_scale_ab.sh: expected $bench (cmake --build build), found none" >&2; exit 2; }
out="$(mktemp)"
trap 'rm -f "$out"' EXIT
for _ in $(seq "$rounds"); do
  for xp in ${XPS:-0 1 2}; do
    ASAP_XP=$xp "$bench" --n "$ns" --bh 16x4 --d "$d" --slices 0 --T 6 --k "$ks" --threads "${THR:-1}" \
      --wait-policy active --reps 801 --no-mem --only "$ops" 2>&1 | awk -v xp="$xp" '/^n=/{print xp, $2, $4, $6}' >> "$out"
  done
done
/usr/bin/python3 - "$out" <<'PY'
import collections, sys
best = collections.defaultdict(lambda: float("inf"))
for line in open(sys.argv[1]):
    xp, n, op, t = line.split()
    best[(int(n), op, xp)] = min(best[(int(n), op, xp)], float(t))
xps = sorted({k[2] for k in best})
for n, op in sorted({(k[0], k[1]) for k in best}):
    base = best[(n, op, xps[0])]
    print(n, op, " ".join(f"xp{x}={best[(n, op, x)] * 1e3:.1f}us ({best[(n, op, x)] / base:.3f})" for x in xps))
PY
