#!/bin/sh
# Runs the performance benchmark (C++ operators and the PyTorch Sinkformer
# loop, same sizes and threads) and renders docs/performance.md and
# docs/performance.svg from it (with the compile section from
# docs/bench_compile.json when tools/bench_compile.sh has written it).
#
#   tools/bench.sh [asap_bench options...]     e.g. tools/bench.sh --quick
#
# ASAP_BENCH=path/to/asap_bench picks the binary (default: the first of
# build/tools, build-perf/tools, build-perf/tools-standalone); OUT=file.json
# where the raw results go (default docs/bench.json).
set -eu
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BENCH=${ASAP_BENCH:-}
if [ -z "$BENCH" ]; then
  for c in build/tools/asap_bench build-perf/tools/asap_bench build-perf/tools-standalone/asap_bench; do
    if [ -x "$ROOT/$c" ]; then BENCH=$ROOT/$c; break; fi
  done
fi
if [ -z "$BENCH" ]; then
  echo "bench.sh: no asap_bench found; build it (target asap_bench) or set ASAP_BENCH" >&2
  exit 1
fi
OUT=${OUT:-$ROOT/docs/bench.json}
PY=${PYTHON:-/usr/bin/python3}
echo "machine: $(lscpu | sed -n 's/^Model name:[ ]*//p' | head -1), $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg)" >&2
"$BENCH" --pytorch --json "$OUT" "$@"
"$PY" "$ROOT/tools/bench_report.py" "$OUT" --md "$ROOT/docs/performance.md" --svg "$ROOT/docs/performance.svg" \
  --compile-json "$ROOT/docs/bench_compile.json"
echo "wrote $OUT, docs/performance.md, docs/performance.svg" >&2
