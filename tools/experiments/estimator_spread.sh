#!/usr/bin/env bash
# How far the teacher-to-operator speed-up moves from process to process
# under each latency estimator: N asap_bench processes in a row, each timing
# the teacher and the operators round-robin (41 rounds, as compile's latency
# phase), then per process the speed-up from medians and from least times,
# and over the processes their range, standard deviation and how many reach
# TARGET. The numbers behind docs/decisions.md, "Latency stays the median
# of a call, not its least time".
#
#   tools/experiments/estimator_spread.sh [N] [TARGET] [TEACHER OP [OP ...]]
#   defaults: 14 1.25 layer_teacher_6 layer_s3_1 layer_sinkhorn_4 (the
#   bundled ViT's shape: n = 17, 16 x 4 heads, d = 16, 2 threads, active wait)
# BENCH (default build/tools/asap_bench), PYTHON (default /usr/bin/python3),
# BENCH_ARGS (more asap_bench flags).
set -euo pipefail
cd "$(dirname "$0")/../.."
N=${1:-14}
TARGET=${2:-1.25}
shift $(( $# < 2 ? $# : 2 ))
OPS=("$@")
[ ${#OPS[@]} -ge 2 ] || OPS=(layer_teacher_6 layer_s3_1 layer_sinkhorn_4)
BENCH=${BENCH:-build/tools/asap_bench}
PYTHON=${PYTHON:-/usr/bin/python3}
only=$(IFS=,; echo "${OPS[*]}")
for _ in $(seq 1 "$N"); do
  "$BENCH" --n 17 --bh 16x4 --d 16 --slices 0 --T 6,8 --k 1,2,3,4,5,6 --threads 2 --wait-policy active \
    --reps 41 --no-mem ${BENCH_ARGS:-} --only "$only" 2>/dev/null
  echo
done | "$PYTHON" -c "
import json, statistics, sys
ops = sys.argv[1].split(','); target = float(sys.argv[2])
runs = [json.loads(b) for b in sys.stdin.read().split('\n\n') if b.strip()]
rows = {o: {'median_s': [], 'min_s': []} for o in ops[1:]}
print('%-4s %12s %12s  %s' % ('run', 'teacher med', 'teacher min', '  '.join('%s med/min' % o for o in ops[1:])))
for i, d in enumerate(runs, 1):
    r = {x['op'] + '_' + str(x['param']): x for x in d['results']}
    missing = [o for o in ops if o not in r]
    if missing: sys.exit('estimator_spread.sh: asap_bench gave no time for ' + ', '.join(missing))
    t = r[ops[0]]
    cells = []
    for o in ops[1:]:
        for est in ('median_s', 'min_s'):
            rows[o][est].append(t[est] / r[o][est])
        cells.append('%.3f / %.3f' % (rows[o]['median_s'][-1], rows[o]['min_s'][-1]))
    print('%-4d %9.1f us %9.1f us  %s' % (i, t['median_s'] * 1e6, t['min_s'] * 1e6, '  '.join(cells)))
print()
for o in ops[1:]:
    for est, name in (('median_s', 'medians'), ('min_s', 'least times')):
        v = rows[o][est]
        print('%s / %s by %-11s: range %.3f-%.3f, sd %.3f, %d of %d at >= %.2fx' % (ops[0], o, name, min(v), max(v),
              statistics.pstdev(v), sum(x >= target for x in v), len(v), target))
" "$only" "$TARGET"
