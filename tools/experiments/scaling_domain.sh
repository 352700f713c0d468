#!/usr/bin/env bash
# Sinkhorn passes in the scaling domain (K = exp(S - rowmax) once, then one
# matrix-vector product a pass) against the log domain every fused operator
# runs today: builds the prototype tools/experiments/scaling_domain.cpp and
# runs it at the released configuration's shape (n = 17, one head of 64,
# T = 5), the bundled ViT's (n = 17, 4 heads of 16, T = 6) and the issue's
# n = 50 ViT's (4 heads of 16, T = 6), with the
# fused kernels' own cost of a pass at the same shapes in the same run
# (asap_bench: Sinkhorn T' = T against T' = 1, one thread), and an estimate
# of the fused teacher with its passes in the scaling domain (T' = 1 plus T
# of the prototype's passes); then with text-like scores (std 100), where
# the range check must refuse; last, the bundled teacher's own score range
# (tools/experiments/score_range.py). docs/performance.md, "Sinkhorn in the
# scaling domain".
#
#   tools/experiments/scaling_domain.sh [REPS]
# CXX (default g++), BENCH (default build/tools/asap_bench), OUT (where the
# prototype is built; default build/tools/scaling_domain).
set -euo pipefail
cd "$(dirname "$0")/../.."
reps=${1:-1001}
case "$reps" in ''|0|*[!0-9]*) echo "scaling_domain.sh: expected REPS as a positive integer, found '$reps'" >&2; exit 2;; esac
CXX=${CXX:-g++}
BENCH=${BENCH:-build/tools/asap_bench}
OUT=${OUT:-build/tools/scaling_domain}
PYTHON=${PYTHON:-/usr/bin/python3}
[ -x "$BENCH" ] || { echo "scaling_domain.sh: expected asap_bench at '$BENCH', found none (build first)" >&2; exit 2; }
mkdir -p "$(dirname "$OUT")"
"$CXX" -std=c++17 -O3 -march=native -ffast-math -o "$OUT.tmp" tools/experiments/scaling_domain.cpp
mv "$OUT.tmp" "$OUT"
# n, B x H, d, T, prototype repetitions
for shape in "17 16x1 64 5 $reps" "17 16x4 16 6 $reps" "50 16x4 16 6 $((reps / 4 + 1))"; do
  set -- $shape
  heads=$(( ${2%x*} * ${2#*x} ))
  echo "== n = $1, B x H = $2, d = $3, T = $4"
  proto=$("$OUT" "$1" "$3" "$heads" "$4" 3 "$5")
  echo "$proto" | sed 's/^/prototype: /'
  m=$(echo "$proto" | sed -n 's/.*the passes \([0-9.]*\) us a pass a head.*/\1/p')
  "$BENCH" --n "$1" --bh "$2" --d "$3" --slices 0 --T "$4" --k "1,$4" --threads 1 --wait-policy active \
    --reps 401 --no-mem --only "sinkhorn_1,sinkhorn_$4" 2>/dev/null |
    "$PYTHON" -c "
import json, sys
t = {r['param']: r['median_s'] * 1e6 for r in json.load(sys.stdin)['results'] if r['op'] == 'sinkhorn'}
one, full, T, H, m = t[1], t[$4], $4, $heads, $m
est = one + T * m * H
print(\"fused kernels: Sinkhorn T'=1 %.2f us, T'=%d %.2f us: %.3f us a log-domain pass a head\" % (one, T, full, (full - one) / (T - 1) / H))
print(\"estimate: the fused T'=%d with the prototype's passes %.1f us, %.2fx faster than today's, %.2fx T'=1\" % (T, est, full / est, est / one))"
done
echo "== text-like scores (std 100): the range check must refuse"
"$OUT" 17 64 16 5 100 "$reps" | sed 's/^/prototype: /'
echo "== the bundled teacher's scores (calib_data/vit_mnist_t6)"
"$PYTHON" tools/experiments/score_range.py calib_data/vit_mnist_t6.pt calib_data/vit_mnist_t6.spec.json \
  calib_data/vit_mnist_t6.calib.h5
