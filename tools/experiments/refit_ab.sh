#!/usr/bin/env bash
# The attention refit against LS with the stored operators held fixed
# (docs/fitting.md, "`--fit attention` (the default)"): one default compile
# gives the latency table; both fits then compile with that table, so they
# store the same operators; each is timed and evaluated on the full test split.
#   tools/experiments/refit_ab.sh [NAME=BASE ...]
# default: vit6=calib_data/vit_mnist_t6 text=out/teachers/text_wordnet_t8
# (the text teacher comes from tools/train/evaluate.sh --train). Output in out/refit_ab.
set -euo pipefail
cd "$(dirname "$0")/../.."
ASAPC=${ASAPC:-build/asapc} PYTHON=${PYTHON:-/usr/bin/python3} OUT=out/refit_ab
mkdir -p "$OUT"
pairs=("$@"); [ ${#pairs[@]} -gt 0 ] || pairs=(vit6=calib_data/vit_mnist_t6 text=out/teachers/text_wordnet_t8)
for pair in "${pairs[@]}"; do
  name=${pair%%=*} base=${pair#*=}
  [ -f "$base.pt" ] || { echo "refit_ab: $base.pt not found" >&2; exit 2; }
  args=("$base.pt" --spec "$base.spec.json" --calib "$base.calib.h5" --no-report)
  "$ASAPC" compile "${args[@]}" -o "$OUT/$name.table.asap.h5" -q --json > "$OUT/$name.compile.json"
  "$PYTHON" - "$OUT/$name.compile.json" "$OUT/$name.latency.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
json.dump({l["layer"]: {o["key"]: o["latency_s"] for o in l["latency"]["choice"]["operators"]
                        if o.get("latency_s") is not None} for l in d["layers"]}, open(sys.argv[2], "w"))
PY
  for fit in ls attention; do
    art="$OUT/$name.$fit.asap.h5"
    start=$(date +%s.%N)
    "$ASAPC" compile "${args[@]}" -o "$art" --latency-table "$OUT/$name.latency.json" --fit "$fit" > "$OUT/$name.$fit.log"
    secs=$(echo "$(date +%s.%N) - $start" | bc)
    "$PYTHON" tools/train/evaluate.py run --name "$name" --teacher "$base.pt" --artifact "$art" --max-closures 0 \
      -o "$OUT/$name.$fit.eval.json" > "$OUT/$name.$fit.eval.log" 2>&1
    printf '%s --fit %-9s compile %5.1f s  %s\n' "$name" "$fit" "$secs" \
      "$(grep 'ASAP default' "$OUT/$name.$fit.eval.log" | sed 's/ \{2,\}/ /g')"
  done
done
