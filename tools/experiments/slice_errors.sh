#!/usr/bin/env bash
# Held-out attention error of one feature family by slice count, per layer:
# what slices buy in accuracy, next to what they cost
# (tools/experiments/slice_floor.py). Compiles with --objective fidelity
# (no timing) and prints, per layer, target and heads mode, the error at
# each number of closures k for every slice prefix that compile fitted
# (a k-matched target runs with its own k only).
#
#   tools/experiments/slice_errors.sh TEACHER_STEM [FEATURES] [BANK]
#   e.g. tools/experiments/slice_errors.sh calib_data/vit_mnist_t6 slices+alpha+softmax+sinkhorn3 64
# TEACHER_STEM names STEM.pt, STEM.spec.json and STEM.calib.h5. ASAPC
# (default build/asapc), PYTHON (default /usr/bin/python3).
set -euo pipefail
cd "$(dirname "$0")/../.."
[ $# -ge 1 ] || { sed -n '2,12p' "$0" >&2; exit 2; }
stem=$1 features=${2:-slices+alpha+softmax+sinkhorn3} bank=${3:-64}
ASAPC=${ASAPC:-build/asapc}
PYTHON=${PYTHON:-/usr/bin/python3}
for f in "$stem.pt" "$stem.spec.json" "$stem.calib.h5"; do
  [ -f "$f" ] || { echo "slice_errors.sh: expected the teacher file '$f', found none" >&2; exit 2; }
done
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$ASAPC" compile "$stem.pt" --spec "$stem.spec.json" --calib "$stem.calib.h5" -o "$tmp/a.asap.h5" \
  --objective fidelity --slices "$bank" --features "$features" --targets both \
  --report-json "$tmp/r.json" -q > /dev/null
"$PYTHON" - "$tmp/r.json" "$features" <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))
print(f"{sys.argv[2]}: held-out attention error by slice count L (log-sum-exp passes in brackets)")
for layer in j["layers"]:
    print(layer["name"])
    for c in sorted(layer["fit"]["candidates"], key=lambda c: (c["target"], c["per_head"], c["slices"])):
        if c["features"] != sys.argv[2]:
            continue
        ks = range(len(c["heldout_attention_error_by_k"]))
        if c["target"] != "closure-ready":
            ks = [c["target_closures"] - 1]
        cells = "  ".join(f"k={k + 1} {c['heldout_attention_error_by_k'][k]:.4f} [{c['lse_passes_by_k'][k]}]"
                          for k in ks)
        print(f"  {c['target']:13s} {'per-head' if c['per_head'] else 'pooled  '} L = {c['slices']:3d}: {cells}")
PY
