#!/usr/bin/env bash
# Serving benchmark (docs/serving.md): calls/s of CompiledModel::attend for
# callers x intra-op threads x OpenMP wait policy, on the bundled teacher's
# first layer (n = 17, B = 1 unless given). A benchmark: run it on a quiet
# machine (nothing else running), never in CI. Prints a Markdown table and
# writes the JSON lines to build/bench_serving.jsonl.
#
#   tools/bench/bench_serving.sh [ARTIFACT]     (default: out/vit_mnist_t6.asap.h5,
#                                          compiled by tools/run_main.sh)
# Environment: SECONDS_PER_CELL (default 5), CALLERS ("1 2 4"),
# THREADS ("1 2"), POLICIES ("PASSIVE ACTIVE default"), N (17), BATCH (1).
set -euo pipefail
cd "$(dirname "$0")/../.."
art=${1:-out/vit_mnist_t6.asap.h5}
bin=build/tools/asap_bench_serving
[ -x "$bin" ] || cmake --build build --target asap_bench_serving -j2
if [ ! -f "$art" ]; then
  echo "bench_serving: $art is missing; run tools/run_main.sh first (or give an artifact)" >&2
  exit 2
fi
out=build/bench_serving.jsonl
: > "$out"
echo "| callers | intra-op threads | OMP_WAIT_POLICY | calls/s |"
echo "|---|---|---|---|"
for c in ${CALLERS:-1 2 4}; do
  for t in ${THREADS:-1 2}; do
    for p in ${POLICIES:-PASSIVE ACTIVE default}; do
      if [ "$p" = default ]; then
        line=$(env -u OMP_WAIT_POLICY "$bin" "$art" --callers "$c" --threads "$t" --n "${N:-17}" \
               --batch "${BATCH:-1}" --seconds "${SECONDS_PER_CELL:-5}")
      else
        line=$(OMP_WAIT_POLICY=$p "$bin" "$art" --callers "$c" --threads "$t" --n "${N:-17}" \
               --batch "${BATCH:-1}" --seconds "${SECONDS_PER_CELL:-5}")
      fi
      echo "$line" >> "$out"
      rate=$(echo "$line" | sed -E 's/.*"calls_per_s": ([0-9]+).*/\1/')
      echo "| $c | $t | $p | $rate |"
    done
  done
done
