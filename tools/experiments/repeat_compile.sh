#!/usr/bin/env bash
# Compiles one teacher N times in a row with default flags and prints, per
# run, what the model budget stored: the model's speed-up, whether the
# choice needed the timing-noise margin, the measured noise, and per layer
# the operator, its held-out attention error and its speed-up (compile's
# own latency table). The numbers behind docs/decisions.md, "One budget for
# the model" ("What stays noisy").
#
#   tools/experiments/repeat_compile.sh [BASE] [N] [extra asapc compile flags...]
#   BASE defaults to calib_data/vit_mnist_t6 (BASE.pt, BASE.spec.json,
#   BASE.calib.h5); N to 10. ASAPC (default build/asapc), PYTHON (default
#   /usr/bin/python3). EVALUATE=1 also runs each artifact over the teacher's
#   whole test split (tools/train/evaluate.py run --max-closures 0; needs
#   tools/train/fetch_data.sh's data) and prints its agreement line.
set -euo pipefail
cd "$(dirname "$0")/../.."
BASE=${1:-calib_data/vit_mnist_t6}
N=${2:-10}
shift $(( $# < 2 ? $# : 2 ))
ASAPC=${ASAPC:-build/asapc}
PYTHON=${PYTHON:-/usr/bin/python3}
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
for i in $(seq 1 "$N"); do
  "$ASAPC" compile "$BASE.pt" --spec "$BASE.spec.json" --calib "$BASE.calib.h5" -o "$TMP/a.h5" \
    --no-report --json -q "$@" > "$TMP/s.json"
  "$PYTHON" - "$TMP/s.json" "$i" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
m = d.get("model_budget")
head = "run %s: " % sys.argv[2]
if m:
    head += "model %.3fx, within noise %s, noise %s | " % (
        m["speedup"], m["within_noise"],
        "%.4f" % m["noise_measured"] if m.get("noise_measured") is not None else "given")
print(head + " | ".join("%s: %s, error %.4f, %sx" % (
    L["layer"], L["chosen"]["description"], L["chosen"]["heldout_attention_error"],
    "%.2f" % L["chosen"]["speedup"] if L["chosen"].get("speedup") else "-") for L in d["layers"]))
PY
  if [ "${EVALUATE:-0}" = 1 ]; then
    "$PYTHON" tools/train/evaluate.py run --name "$(basename "$BASE")" --teacher "$BASE.pt" --artifact "$TMP/a.h5" \
      --max-closures 0 -o "$TMP/e.json" 2>&1 | grep -E '\(default\)|ASAP default' | sed "s/^ */run $i: /"
  fi
done
