#!/usr/bin/env bash
# The accuracy evaluation of issue 6: compile each available teacher (LS and
# --fit kl), verify it, run tools/train/evaluate.py over its whole test split and
# write docs/results.md (+ its plots, PNGs under docs/images/, drawn with matplotlib).
#
#   tools/train/evaluate.sh [--train] [--force] [--quick] [--no-curve] [--only NAME,...] [--threads N]
#
# Teachers: the bundled MNIST ViT T = 6 (calib_data/vit_mnist_t6.*), and,
# when present under out/teachers/, the MNIST ViT T = 5 (vit_mnist_t5.*) and
# the WordNet text teacher T = 8 (text_wordnet_t8.*).
#   --train    (re)train the T = 5 and text teachers with tools/train/train_teachers.py first
#              (about 5 + 12 minutes on 2 cores; needs tools/train/fetch_data.sh's data)
#   --force    recompile and re-verify even when the artifacts are up to date
#   --quick    evaluate on the first 1000 test examples only (a smoke run; writes
#              out/eval/results.quick.md instead of docs/results.md)
#   --no-curve skip the agreement-against-speed-up curve (one compile + verify per
#              --min-speedup target in CURVE_TARGETS, about a minute per teacher)
#   --only     evaluate only these teachers (vit6, vit5, text); the report keeps the
#              others' latest results from out/eval/NAME.eval.json
#   --threads  threads for asapc and torch (default 2)
# Environment: ASAPC (default build/asapc), PYTHON (default /usr/bin/python3),
# ASAP_TORCH_OP (the operator library; default found next to $ASAPC).
# Artifacts, verify JSON and logs go to out/eval/.
set -euo pipefail
cd "$(dirname "$0")/../.."
REPO=$(pwd)

ASAPC=${ASAPC:-build/asapc}
PYTHON=${PYTHON:-/usr/bin/python3}
OUT=out/eval
TRAIN=0 FORCE=0 QUICK=0 CURVE=1 THREADS=2 ONLY=""
# --min-speedup targets of the curve (1.25, the default, is the main artifact);
# "fidelity" = --objective fidelity; a "+ls" suffix adds --fit ls (LS coefficients
# without the default attention refit),
# a "+layer" suffix --budget layer (each layer on its own, the rule before the
# model budget), a "+nozero" suffix --no-zero-parameter (ASAP maps only: no
# plain Sinkhorn, no teacher on any layer), a "+compete" suffix
# --zero-parameter compete (plain Sinkhorn and the teacher as equals of the
# maps: the default rule until 2026-12-02)
CURVE_TARGETS=${CURVE_TARGETS:-"fidelity fidelity+ls 1.1 1.2 1.25+layer 1.25+nozero 1.25+compete 1.25+ls 1.33 1.5 2"}
while [ $# -gt 0 ]; do
  case "$1" in
    --train) TRAIN=1 ;;
    --force) FORCE=1 ;;
    --quick) QUICK=1 ;;
    --no-curve) CURVE=0 ;;
    --threads) THREADS=$2; shift ;;
    --only) ONLY=",$2,"; shift ;;
    -h|--help) sed -n '2,23p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "evaluate.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
  shift
done
if [ ! -x "$ASAPC" ]; then
  echo "evaluate.sh: $ASAPC not found; build first (tools/run_main.sh) or set ASAPC" >&2
  exit 2
fi
export ASAPC
mkdir -p "$OUT"

if [ "$TRAIN" = 1 ]; then
  mkdir -p out/teachers  # the logs below are written there before train_teachers.py creates it
  for which in vit5 text; do
    echo "== training $which (log: out/teachers/$which.log)"
    "$PYTHON" tools/train/train_teachers.py --which "$which" --out out/teachers > "out/teachers/$which.log" 2>&1 \
      || { echo "evaluate.sh: training $which failed, see out/teachers/$which.log" >&2; exit 1; }
    tail -1 "out/teachers/$which.log"
  done
fi

# name:base path (without .pt)
TEACHERS="vit6:calib_data/vit_mnist_t6 vit5:out/teachers/vit_mnist_t5 text:out/teachers/text_wordnet_t8"

# newer TARGET SOURCES...: true when TARGET is missing or older than a source
stale() {
  local t=$1; shift
  [ "$FORCE" = 1 ] && return 0
  [ -e "$t" ] || return 0
  local s
  for s in "$@"; do [ "$s" -nt "$t" ] && return 0; done
  return 1
}

RESULTS=() MISSING=()
for entry in $TEACHERS; do
  name=${entry%%:*} base=${entry#*:}
  stem=$(basename "$base")
  if [ -n "$ONLY" ] && [ "${ONLY#*,$name,}" = "$ONLY" ]; then
    if [ "$QUICK" = 0 ] && [ -e "$OUT/$name.eval.json" ]; then
      echo "== $name: not re-evaluated (--only); reporting $OUT/$name.eval.json"
      RESULTS+=("$OUT/$name.eval.json")
    fi
    continue
  fi
  files=("$base.pt" "$base.spec.json" "$base.calib.h5" "$base.heldout.h5")
  absent=""
  for f in "${files[@]}"; do [ -e "$f" ] || absent="$absent $f"; done
  if [ -n "$absent" ]; then
    echo "== $name: skipped, missing$absent (tools/train/evaluate.sh --train makes them)"
    MISSING+=("--missing" "$name: missing$absent")
    continue
  fi
  # the default artifact (asapc compile's own defaults: --fit attention) and --fit kl
  def_art="$OUT/$stem.asap.h5" kl_art="$OUT/$stem.kl.asap.h5" ver="$OUT/$stem.verify.json"
  for fit in default kl; do
    art=$def_art how=(); [ "$fit" = kl ] && art=$kl_art how=(--fit kl)
    if stale "$art" "${files[@]}" "$ASAPC"; then
      echo "== $name: compiling ($fit) -> $art"
      "$ASAPC" compile "$base.pt" --spec "$base.spec.json" --calib "$base.calib.h5" -o "$art" \
        "${how[@]}" --no-report -q --threads "$THREADS" | tee "$OUT/$stem.$fit.compile.log"
    fi
  done
  if stale "$ver" "$def_art"; then
    echo "== $name: asapc verify -> $ver"
    "$ASAPC" verify "$base.pt" --artifact "$def_art" --data "$base.heldout.h5" -q \
      --threads "$THREADS" --report "$OUT/$stem.verify.html" --json-out "$ver"
  fi
  extra=() res="$OUT/$name.eval.json" limit=()
  if [ "$QUICK" = 1 ]; then limit=(--max-examples 1000); res="$OUT/$name.quick.eval.json"; fi
  extra+=("${limit[@]}")
  if [ "$CURVE" = 1 ]; then
    points=("1.25=$def_art=$ver")
    for target in $CURVE_TARGETS; do
      art="$OUT/$stem.curve-$target.asap.h5" cver="$OUT/$stem.curve-$target.verify.json"
      goal=${target%+ls} how=()
      goal=${goal%+layer}
      goal=${goal%+nozero}
      goal=${goal%+compete}
      # the budget's own choice at each target: --guard 0 (the default's
      # fidelity guard would replace a choice far from the teacher)
      if [ "$goal" = fidelity ]; then how=(--objective fidelity); else how=(--min-speedup "$goal" --guard 0); fi
      case "$target" in *+ls) how+=(--fit ls) ;; esac
      case "$target" in *+layer) how+=(--budget layer) ;; esac
      case "$target" in *+nozero) how+=(--no-zero-parameter) ;; esac
      case "$target" in *+compete) how+=(--zero-parameter compete) ;; esac
      if stale "$art" "${files[@]}" "$ASAPC"; then
        echo "== $name: curve: compiling ${how[*]} -> $art"
        "$ASAPC" compile "$base.pt" --spec "$base.spec.json" --calib "$base.calib.h5" -o "$art" \
          "${how[@]}" --no-report -q --threads "$THREADS" > "$OUT/$stem.curve-$target.compile.log"
      fi
      if stale "$cver" "$art"; then
        "$ASAPC" verify "$base.pt" --artifact "$art" --data "$base.heldout.h5" -q --max-closures 1 \
          --threads "$THREADS" --report "$OUT/$stem.curve-$target.verify.html" --json-out "$cver" > /dev/null
      fi
      points+=("$target=$art=$cver")
    done
    echo "== $name: agreement against speed-up (${#points[@]} compile targets)"
    cjson="$OUT/$name.curve.json"; [ "$QUICK" = 1 ] && cjson="$OUT/$name.quick.curve.json"
    pargs=(); for pt in "${points[@]}"; do pargs+=(--point "$pt"); done
    "$PYTHON" tools/train/evaluate.py curve --name "$name" --teacher "$base.pt" "${pargs[@]}" \
      --threads "$THREADS" -o "$cjson" "${limit[@]}"
    extra+=(--curve-json "$cjson")
  fi
  echo "== $name: evaluating on the test split"
  "$PYTHON" tools/train/evaluate.py run --name "$name" --teacher "$base.pt" --artifact "$def_art" \
    --kl-artifact "$kl_art" --verify-json "$ver" --threads "$THREADS" -o "$res" "${extra[@]}"
  RESULTS+=("$res")
done

if [ ${#RESULTS[@]} -eq 0 ]; then
  echo "evaluate.sh: no teacher available" >&2
  exit 1
fi
REPORT=docs/results.md
[ "$QUICK" = 1 ] && REPORT=$OUT/results.quick.md      # a smoke run does not replace the real page
"$PYTHON" tools/train/evaluate.py report "${RESULTS[@]}" "${MISSING[@]}" -o "$REPORT"
echo "== wrote $REPORT"
