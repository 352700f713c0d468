#!/usr/bin/env bash
# The main job: set up, build, then compile the bundled teacher in
# calib_data/ and verify it against the teacher on the bundled held-out set.
set -euo pipefail
cd "$(dirname "$0")/.."
tools/setup.sh
out=${ASAP_OUT:-out}
mkdir -p "$out"
name=vit_mnist_t6
echo "== asapc inspect calib_data/$name.pt"
./build/asapc inspect "calib_data/$name.pt" --T 6 --heads 4 > /dev/null
echo "== asapc compile"
./build/asapc compile "calib_data/$name.pt" --spec "calib_data/$name.spec.json" \
  --calib "calib_data/$name.calib.h5" -o "$out/$name.asap.h5"
echo "== asapc inspect $out/$name.asap.h5"
./build/asapc inspect "$out/$name.asap.h5"
echo "== asapc verify"
./build/asapc verify "calib_data/$name.pt" --artifact "$out/$name.asap.h5" --data "calib_data/$name.heldout.h5" \
  --report "$out/$name.verify.html" --json-out "$out/$name.verify.json"
