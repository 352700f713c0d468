#!/usr/bin/env bash
# Times pairs of fused operators at one shape, alternately, and prints each
# pair's least median over ROUNDS runs and their ratio (second / first): the
# numbers behind docs/performance.md, "What is left between a slice-free map
# and the loop". One asap_bench process per operator and round, so a burst
# of load hits one sample, not a whole pair.
#
#   tools/experiments/pair_ratios.sh N D THREADS SLICES A:B [A:B ...]
#   e.g. tools/experiments/pair_ratios.sh 17 16 1 0 sinkhorn_2:asap_sm_1 sinkhorn_4:asap_s3_1
# BENCH_ARGS: more asap_bench flags (e.g. --lengths 5,11,5,8 for a padded batch). ROUNDS (default 5), BENCH (default build/tools/asap_bench), PYTHON (default /usr/bin/python3).
set -euo pipefail
cd "$(dirname "$0")/../.."
[ $# -ge 5 ] || { sed -n '2,10p' "$0" >&2; exit 2; }
n=$1 d=$2 th=$3 L=$4
shift 4
BENCH=${BENCH:-build/tools/asap_bench}
PYTHON=${PYTHON:-/usr/bin/python3}
ROUNDS=${ROUNDS:-5}
for pair in "$@"; do
  a=${pair%%:*} b=${pair##*:}
  [ "$a" != "$pair" ] || { echo "pair_ratios.sh: expected A:B, found '$pair'" >&2; exit 2; }
  for _ in $(seq 1 "$ROUNDS"); do
    for op in "$a" "$b"; do
      "$BENCH" --n "$n" --bh 16x4 --d "$d" --slices "$L" --T 6,8 --k 1,2,3,4,5,6 --threads "$th" \
        --wait-policy active --reps 401 --no-mem ${BENCH_ARGS:-} --only "$op" 2>/dev/null |
        "$PYTHON" -c "import json,sys; [print('$op', r['median_s'] * 1e6) for r in json.load(sys.stdin)['results']]"
    done
  done | "$PYTHON" -c "
import sys
m = {}
for line in sys.stdin:
    k, v = line.split(); m.setdefault(k, []).append(float(v))
a, b = '$a', '$b'
if a not in m or b not in m:
    sys.exit('pair_ratios.sh: asap_bench gave no time for %s' % (a if a not in m else b))
print('%-12s %8.2f us  %-12s %8.2f us  ratio %.3f' % (a, min(m[a]), b, min(m[b]), min(m[b]) / min(m[a])))"
done
