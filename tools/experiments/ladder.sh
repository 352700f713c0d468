#!/usr/bin/env bash
# The interleaved ladder of docs/performance.md: Sinkhorn T' = k and the
# slice-free `alpha` map with k closures, k = 1..5, in one asap_bench run
# (the ten operators round-robin, so a drift of the machine's speed cancels in
# their differences), and for each k the map's median less Sinkhorn's, in us.
#   tools/experiments/ladder.sh [N=17] [D=16] [THREADS=1] [REPS=2001]
# ASAP_BENCH: the asap_bench binary (default build/tools/asap_bench; its
# libasap is found through LD_LIBRARY_PATH first).
set -euo pipefail
cd "$(dirname "$0")/../.."
n=${1:-17} d=${2:-16} th=${3:-1} reps=${4:-2001}
bench=${ASAP_BENCH:-build/tools/asap_bench}
[ -x "$bench" ] || { echo "ladder.sh: expected an asap_bench at '$bench', found none" >&2; exit 2; }
ops=sinkhorn_1,sinkhorn_2,sinkhorn_3,sinkhorn_4,sinkhorn_5,asap_1,asap_2,asap_3,asap_4,asap_5
"$bench" --n "$n" --bh 16x4 --d "$d" --slices 0 --T 6 --k 1,2,3,4,5 --threads "$th" --wait-policy active \
  --reps "$reps" --no-mem --only "$ops" 2>/dev/null | ${PYTHON:-/usr/bin/python3} -c "
import json, sys
t = {'%s_%d' % (r['op'], r['param']): 1e6 * r['median_s'] for r in json.load(sys.stdin)['results']}
print(' '.join('k=%d S=%.1f A-S=%+.1f' % (k, t['sinkhorn_%d' % k], t['asap_%d' % k] - t['sinkhorn_%d' % k])
               for k in range(1, 6)))
"
