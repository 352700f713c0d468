#!/bin/sh
# Runs the performance benchmark (C++ operators and the PyTorch Sinkformer
# loop, same sizes and threads) and renders docs/performance.md and
# docs/performance.svg from it (with the compile section from
# docs/bench_compile.json when tools/bench/bench_compile.sh has written it).
#
#   tools/bench/bench.sh [asap_bench options...]     e.g. tools/bench/bench.sh --quick
#   tools/bench/bench.sh --features [asap_bench options...]
#
# --features: the sliced features alone against one closure pass (issue 14),
# nothing rendered: fast::build_features with the default sort path
# ("features": sorting networks for short sequences) and with the scalar
# sorts forced ("features_scalar", the path before), and the fused Sinkhorn
# normalizer T' = 1 as "one pass", in one run, at n = 50, B x H = 16 x 4,
# d = 16, L = 16 and at n = 1024, B x H = 4 x 4, d = 64, L = 64. Prints the
# ratios (target: features / one pass <= 1.0); raw results to $OUT.n50 and
# $OUT.n1024 when OUT is set.
#
#   tools/bench/bench.sh --bound [asap_bench options...]
#
# --bound: short sequences against the FLOP/exp bound (issue 14, item 3),
# nothing rendered: the fused teacher T = 6, Sinkhorn T' = 1 and 4 and the
# default ASAP family at n = 64, B x H = 16 x 1, d = 64 (64 slices) and at
# the bundled ViT's n = 17, B x H = 16 x 4, d = 16 (16 slices), once with
# OpenMP's ACTIVE and once with its PASSIVE wait policy. Prints each time
# with "Nx bound" (target: the teacher at n = 64 within 2x).
#
#   tools/bench/bench.sh --overhead [--quick] [asap_bench options...]
#
# --overhead: what an ASAP map costs against the Sinkhorn loop of the same
# log-sum-exp passes (the fused ASAP call), nothing rendered: every family
# with p passes -- alpha (k closures: p = k), alpha+softmax (p = 1 + k),
# alpha+softmax+sinkhorn3 (p = 3 + k), and alpha+stats (p = k: its score
# sweep has no exponential; also against T' = k + 1), k = 1 and 3 -- against Sinkhorn
# T' = p, timed round-robin in the same run, at n = 17, 32, 50, 64, 128,
# B x H = 16 x 4, d = 16 and 64, slice-free and with 16 slices, under
# OpenMP's ACTIVE and PASSIVE wait policies. Prints one table per setting,
# the largest ratio per setting over n = 17-64 (targets: slice-free within
# 1.05x, 16 slices within 1.25x), the n = 50 4-pass call against its
# FLOP/exp bound, and (slice-free) the loop ladder: Sinkhorn T' = 1..6
# against the fused teacher T = 6, about the most a p-pass operator gains
# over it at that shape (tools/bench/overhead_report.py). --quick: n = 17 and 50,
# d = 16, ACTIVE only. The timings (median per operator) to $OUT when OUT is
# set (docs/bench_overhead.json). COPIES (default 3; 1 with --quick): each
# setting is run once per fresh copy of the libasap that asap_bench loads
# (through LD_LIBRARY_PATH), back to back; each operator's time is the
# median over the copies and each ratio the median over the copies of the
# ratio within each: where a library file's pages land in memory moves some
# operators by 2.5-4% for as long as that file is cached, the same bytes in
# another file by as much the other way (docs/performance.md, "Where the
# library's pages land").
#
#   tools/bench/bench.sh --exact [--threads N] [--reps R] [--shapes ...] [--settings passive,default,active]
#
# --exact times only the exact fused teacher from Python: a Sinkformer
# attention module's own PyTorch loop against the same module under
# asap_torch.patch_model(model, exact=True), in one process on the same
# threads, round-robin, medians, once per OpenMP wait-policy setting
# (tools/bench/bench_pytorch.py --exact), prints the
# table with the speed-ups and writes it into docs/python.md (and the raw
# timings to $OUT when set). It needs libasap_torch_op.so (ASAP_TORCH_OP,
# next to $ASAPC, or build/src/torch_op/).
#
# ASAP_BENCH=path/to/asap_bench picks the binary (default: the first of
# build/tools, build-perf/tools, build-perf/tools-standalone); OUT=file.json
# where the raw results go (default docs/bench.json).
set -eu
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
PY=${PYTHON:-/usr/bin/python3}
if [ "${1:-}" = "--exact" ]; then
  shift
  echo "machine: $(lscpu | sed -n 's/^Model name:[ ]*//p' | head -1), $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg)" >&2
  if [ -n "${OUT:-}" ]; then set -- --json "$OUT" "$@"; fi
  exec "$PY" "$ROOT/tools/bench/bench_pytorch.py" --exact --md "$ROOT/docs/python.md" "$@"
fi
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
if [ "${1:-}" = "--bound" ]; then
  shift
  echo "machine: $(lscpu | sed -n 's/^Model name:[ ]*//p' | head -1), $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg)" >&2
  TMPJ=$(mktemp)
  trap 'rm -f "$TMPJ"' EXIT
  for policy in active passive; do
    echo "OMP_WAIT_POLICY=$policy"
    for shape in "--n 64 --bh 16x1 --d 64 --slices 64" "--n 17 --bh 16x4 --d 16 --slices 16"; do
      # shellcheck disable=SC2086
      "$BENCH" --wait-policy $policy $shape --T 6 --k 1,4 --only teacher_fast,sinkhorn,asap_s3_1 --reps 201 \
        --no-mem --json "$TMPJ" "$@" 2>/dev/null
      "$PY" - "$TMPJ" <<'PYEOF'
import json, sys
d = json.load(open(sys.argv[1]))
p = d["machine"]["peak"]
print("  peak (larger of before/after): %.0f GFLOP/s, %.2f G exp/s" % (p["flops_per_s"] * 1e-9, p["exps_per_s"] * 1e-9))
for r in d["results"]:
    print("  n=%4d B*H=%3d d=%2d %-16s %8.4f ms  %5.2fx bound (%.4f ms)" % (
        r["n"], r["B"] * r["H"], r["d"], "%s_%d" % (r["op"], r["param"]), 1e3 * r["median_s"],
        r.get("bound_ratio", 0), 1e3 * r.get("bound_s", 0)))
PYEOF
    done
  done
  exit 0
fi
if [ "${1:-}" = "--overhead" ]; then
  shift
  NS="17,32,50,64,128" DS="16 64" POLICIES="active passive"
  COPIES=${COPIES:-3}
  if [ "${1:-}" = "--quick" ]; then shift; NS="17,50" DS="16" POLICIES="active" COPIES=${COPIES_QUICK:-1}; fi
  case $COPIES in '' | *[!0-9]* | 0) echo "bench.sh: expected COPIES a whole number >= 1, found '$COPIES'" >&2; exit 2 ;; esac
  echo "machine: $(lscpu | sed -n 's/^Model name:[ ]*//p' | head -1), $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg)" >&2
  TMPD=$(mktemp -d)
  trap 'rm -rf "$TMPD"' EXIT
  # The libasap asap_bench loads (its soname's file, symlinks resolved),
  # copied once per copy into a directory of its own.
  LIB=$(ldd "$BENCH" | sed -n 's/^[[:space:]]*\(libasap\.so[^ ]*\) => \([^ ]*\) .*/\1 \2/p' | head -1)
  [ -n "$LIB" ] || { echo "bench.sh: expected $BENCH to load a libasap.so, ldd lists none" >&2; exit 1; }
  c=1
  while [ "$c" -le "$COPIES" ]; do
    mkdir -p "$TMPD/lib$c"
    cp "$(readlink -f "${LIB#* }")" "$TMPD/lib$c/${LIB%% *}"
    c=$((c + 1))
  done
  OPS=teacher_fast_6,sinkhorn_1,sinkhorn_2,sinkhorn_3,sinkhorn_4,sinkhorn_5,sinkhorn_6
  OPS=$OPS,asap_1,asap_3,asap_st_1,asap_st_3,asap_cst_1,asap_cst_3
  OPS=$OPS,asap_sm_1,asap_sm_3
  OPS=$OPS,asap_s3_1,asap_s3_3,asap_s3c_1,asap_s3c_3
  i=0
  for policy in $POLICIES; do
    for d in $DS; do
      for slices in 0 16; do
        i=$((i + 1))
        line="$policy $d $slices"
        c=1
        while [ "$c" -le "$COPIES" ]; do
          echo "  running: OMP_WAIT_POLICY=$policy d=$d slices=$slices n=$NS (library copy $c of $COPIES)" >&2
          # shellcheck disable=SC2086
          LD_LIBRARY_PATH="$TMPD/lib$c${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" "$BENCH" --wait-policy $policy --n "$NS" \
            --bh 16x4 --d "$d" --slices "$slices" --T 6 --k 1,2,3,4,5,6 --only "$OPS" --reps 201 --no-mem \
            --json "$TMPD/$i.$c.json" "$@" > /dev/null 2>&1 \
            || { echo "bench.sh: asap_bench failed (policy $policy, d $d, slices $slices)" >&2; exit 1; }
          line="$line $TMPD/$i.$c.json"
          c=$((c + 1))
        done
        echo "$line" >> "$TMPD/index"
      done
    done
  done
  "$PY" "$ROOT/tools/bench/overhead_report.py" "$TMPD/index" "${OUT:-}"
  exit 0
fi
if [ "${1:-}" = "--features" ]; then
  shift
  echo "machine: $(lscpu | sed -n 's/^Model name:[ ]*//p' | head -1), $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg)" >&2
  J50=/dev/null J1024=/dev/null
  if [ -n "${OUT:-}" ]; then J50=$OUT.n50 J1024=$OUT.n1024; fi
  "$BENCH" --n 50 --bh 16x4 --d 16 --features 16 --k 1 --only sinkhorn_1,features,features_scalar \
    --reps 300 --no-mem --json "$J50" "$@" 2>&1 | grep '^n='
  "$BENCH" --n 1024 --bh 4x4 --d 64 --features 64 --k 1 --only sinkhorn_1,features,features_scalar \
    --reps 15 --no-mem --json "$J1024" "$@" 2>&1 | grep '^n='
  exit 0
fi
OUT=${OUT:-$ROOT/docs/bench.json}
echo "machine: $(lscpu | sed -n 's/^Model name:[ ]*//p' | head -1), $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg)" >&2
"$BENCH" --pytorch --json "$OUT" "$@"
"$PY" "$ROOT/tools/bench/bench_report.py" "$OUT" --md "$ROOT/docs/performance.md" --svg "$ROOT/docs/performance.svg" \
  --compile-json "$ROOT/docs/bench_compile.json"
echo "wrote $OUT, docs/performance.md, docs/performance.svg" >&2
