#!/usr/bin/env bash
# The fidelity guard on the released Sinkformer MNIST configuration
# (tools/experiments/released_vit.py): trains it (about 2.5 min on 2 cores),
# compiles it nine ways -- the default (1.25x budget, --guard 0.25),
# --guard 0 (the budget's own choice), --objective fidelity, --budget layer
# with and without the guard, --fit attention, --guard 0.1, Sinkhorn T' = 3
# (--objective max-error --max-error 0.33) and the 3-pass map with 16 slices
# (--objective fidelity --fixed-slices 16) -- and prints
# each one's decision and its test-split agreement with the teacher, with
# the last layer's attention error on the test split, whole and on the
# class token's row.
#
#   tools/experiments/released_vit.sh OUT [T] [CONFIG]
# T: Sinkhorn iterations (default 5, the released default); CONFIG:
# released (default), released4 (the same with patch 4: n = 50) or p4 (the
# n = 50 ViT of the issue: patch 4, 2 layers of 4 heads of 16).
# EPOCHS (default 12) and LR (default 1e-3) of the training; ASAPC (default
# build/asapc), PYTHON (default /usr/bin/python3).
set -euo pipefail
cd "$(dirname "$0")/../.."
[ $# -ge 1 ] || { sed -n '2,14p' "$0" >&2; exit 2; }
out=$1 T=${2:-5} config=${3:-released}
ASAPC=${ASAPC:-build/asapc}
PYTHON=${PYTHON:-/usr/bin/python3}
[ -x "$ASAPC" ] || { echo "released_vit.sh: expected the asapc binary '$ASAPC', found none (build first)" >&2; exit 2; }
stem="$out/${config}_t$T"
[ -f "$stem.heldout.h5" ] || "$PYTHON" tools/experiments/released_vit.py train "$out" --T "$T" --config "$config" \
  --epochs "${EPOCHS:-12}" --lr "${LR:-1e-3}" |
  grep -E "test-acc|summary"
arts=()
for how in default guard0 fidelity layer layer-guard0 fit-attention guard0.1 max-error slices16; do
  flags=()
  [ "$how" = guard0 ] && flags=(--guard 0)
  [ "$how" = fidelity ] && flags=(--objective fidelity)
  [ "$how" = layer ] && flags=(--budget layer)
  [ "$how" = layer-guard0 ] && flags=(--budget layer --guard 0)
  [ "$how" = fit-attention ] && flags=(--fit attention)
  [ "$how" = guard0.1 ] && flags=(--guard 0.1)
  [ "$how" = max-error ] && flags=(--objective max-error --max-error 0.33)
  [ "$how" = slices16 ] && flags=(--objective fidelity --features slices+alpha+softmax --fixed-slices 16 --closures 2 --max-passes 3)
  echo "== asapc compile ${flags[*]:-(defaults)}"
  "$ASAPC" compile "$stem.pt" --spec "$stem.spec.json" --calib "$stem.calib.h5" -o "$stem.$how.asap.h5" \
    --no-report "${flags[@]}" 2>&1 | grep -v '^\[' | grep -Ev '^ *[0-9]+%'
  arts+=("$stem.$how.asap.h5")
done
"$PYTHON" tools/experiments/released_vit.py agree "$stem.pt" "${arts[@]}" --config "$config"
