#!/usr/bin/env bash
# One head per SIMD lane against the fused kernels' layout (one head at a
# time, keys or rows in the lanes): builds the prototype
# tools/experiments/heads_in_lanes.cpp and times it against asap_bench's
# Sinkhorn T' = 1, 2, 4, 6 through run_layer (layer_sinkhorn_K, what compile
# and verify time), alternately, one thread, B x H = 16 x 4, at several
# shapes. Prints per shape and T' the least median of ROUNDS runs of each,
# their ratio, and for each layout the fixed cost F and the cost p of a pass
# from a least-squares line through T' = 2, 4, 6 (the column-ending counts),
# with the bound (F + 6p) / (F + 4p) that a 4-pass operator has against a
# T = 6 teacher. docs/performance.md, "One head per lane (a prototype)".
#
#   tools/experiments/heads_in_lanes.sh [ROUNDS] [SHAPES]
# SHAPES: "N:D N:D ..." (default "17:16 32:16 50:16 64:16 17:64"). CXX
# (default g++), BENCH (default build/tools/asap_bench), OUT (default
# build/tools/heads_in_lanes), PYTHON (default /usr/bin/python3).
set -euo pipefail
cd "$(dirname "$0")/../.."
rounds=${1:-3}
shapes=${2:-"17:16 32:16 50:16 64:16 17:64"}
case "$rounds" in ''|0|*[!0-9]*) echo "heads_in_lanes.sh: expected ROUNDS as a positive integer, found '$rounds'" >&2; exit 2;; esac
CXX=${CXX:-g++}
BENCH=${BENCH:-build/tools/asap_bench}
OUT=${OUT:-build/tools/heads_in_lanes}
PYTHON=${PYTHON:-/usr/bin/python3}
[ -x "$BENCH" ] || { echo "heads_in_lanes.sh: expected asap_bench at '$BENCH', found none (build first)" >&2; exit 2; }
mkdir -p "$(dirname "$OUT")"
"$CXX" -std=c++17 -O3 -march=native -o "$OUT.tmp" tools/experiments/heads_in_lanes.cpp
mv "$OUT.tmp" "$OUT"
echo "machine: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(nproc) cores; $(date -u '+%Y-%m-%d %H:%M UTC')"
for shape in $shapes; do
  n=${shape%%:*} d=${shape##*:}
  case "$n:$d" in *[!0-9:]*|:*|*:) echo "heads_in_lanes.sh: expected N:D, found '$shape'" >&2; exit 2;; esac
  "$OUT" "$n" "$d" 64 1 1 > /dev/null || exit 2  # the prototype's own checks (D, the vector width), in one sentence
  reps=$(( 20000 / n + 1 ))
  for _ in $(seq 1 "$rounds"); do
    "$OUT" "$n" "$d" 64 "$reps" 1,2,4,6 | sed -n "s/^T'=\([0-9]*\) median \([0-9.]*\) us.*|out - float64 reference| \(.*\)$/lanes \1 \2 \3/p"
    "$BENCH" --n "$n" --bh 16x4 --d "$d" --slices 0 --T 8 --k 1,2,4,6 --threads 1 --wait-policy active \
      --reps "$reps" --no-mem --only layer_sinkhorn_1,layer_sinkhorn_2,layer_sinkhorn_4,layer_sinkhorn_6 2>/dev/null |
      "$PYTHON" -c "import json,sys; [print('fused', r['param'], r['median_s'] * 1e6, 0) for r in json.load(sys.stdin)['results']]"
  done | "$PYTHON" -c "
import sys
best, err = {}, 0.0
for line in sys.stdin:
    who, t, us, e = line.split()
    k = (who, int(t))
    best[k] = min(best.get(k, float('inf')), float(us))
    err = max(err, float(e))
print('== n = $n, d = dv = $d, 64 heads, one thread (least median of $rounds rounds; lanes vs float64: max |diff| %.1e)' % err)
print(\"%4s %12s %12s %8s\" % (\"T'\", 'fused (us)', 'lanes (us)', 'ratio'))
for t in (1, 2, 4, 6):
    f, l = best.get(('fused', t)), best.get(('lanes', t))
    if f is None or l is None:
        sys.exit('heads_in_lanes.sh: a run gave no time for T\'=%d' % t)
    print('%4d %12.1f %12.1f %8.2f' % (t, f, l, f / l))
for who in ('fused', 'lanes'):
    xs = [2, 4, 6]
    ys = [best[(who, x)] for x in xs]
    mx, my = sum(xs) / 3, sum(ys) / 3
    p = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
    F = my - p * mx
    print('%s: F = %.1f us, p = %.1f us a pass, F/p = %.2f, (F + 6p) / (F + 4p) = %.3f' % (who, F, p, F / p, (F + 6 * p) / (F + 4 * p)))
"
done
