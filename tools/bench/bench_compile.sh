#!/bin/sh
# Compile throughput and memory (issue 9), written to docs/bench_compile.json
# and rendered into docs/performance.md by tools/bench/bench.sh (or directly:
# tools/bench/bench_report.py docs/bench.json --md docs/performance.md
# --compile-json docs/bench_compile.json).
#
#   tools/bench/bench_compile.sh [--reps 3]
#
# Cases: the bundled MNIST teacher (n = 17, 512 examples, 2 layers) and the
# same trained attention weights at n = 256 (tools/bench/make_throughput_case.py,
# 256 examples). Per case asap_bench_compile times the teacher-only pass,
# the default compile and a compile with the operator fixed in advance.
# Peak RSS of `asapc compile` at 64 and 512 examples (8x apart).
set -eu
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
B=${ASAP_BUILD:-$ROOT/build}
PY=${PYTHON:-/usr/bin/python3}
REPS=3
[ "${1:-}" = "--reps" ] && REPS=$2
for x in "$B/tools/asap_bench_compile" "$B/asapc"; do
  [ -x "$x" ] || { echo "bench_compile.sh: $x not built (tools/setup.sh builds it)" >&2; exit 1; }
done
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
echo "== the n = 256 case (tools/bench/make_throughput_case.py)" >&2
"$PY" "$ROOT/tools/bench/make_throughput_case.py" --n 256 --examples 256 --out "$tmp/tp" >&2
C=$ROOT/calib_data/vit_mnist_t6
echo "== compile throughput: bundled teacher, n = 17" >&2
"$B/tools/asap_bench_compile" "$C.pt" "$C.spec.json" "$C.calib.h5" --reps "$REPS" --json "$tmp/bundled.json"
echo "== compile throughput: n = 256" >&2
"$B/tools/asap_bench_compile" "$tmp/tp/throughput.pt" "$tmp/tp/throughput.spec.json" "$tmp/tp/throughput.calib.h5" \
  --reps "$REPS" --json "$tmp/n256.json"
echo "== peak RSS at 64 and 512 examples" >&2
for n in 64 512; do
  /usr/bin/time -v "$B/asapc" compile "$C.pt" --spec "$C.spec.json" --calib "$C.calib.h5" --max-examples "$n" \
    -o "$tmp/a.h5" --no-report -q > /dev/null 2> "$tmp/time.txt"
  awk -F': ' -v n="$n" '/Maximum resident set size/ {print n, $2}' "$tmp/time.txt" >> "$tmp/rss.txt"
done
"$PY" - "$tmp" "$ROOT/docs/bench_compile.json" <<'PYEOF'
import json, os, subprocess, sys, datetime
tmp, out = sys.argv[1], sys.argv[2]
cpu = subprocess.run("lscpu | sed -n 's/^Model name:[ ]*//p' | head -1", shell=True, capture_output=True, text=True).stdout.strip()
cases = []
for name, n, f in (("bundled MNIST ViT", 17, "bundled.json"), ("same weights, longer sequences", 256, "n256.json")):
    r = json.load(open(os.path.join(tmp, f)))
    cases.append({"name": name, "n": n, "result": r})
rss = [{"examples": int(a), "peak_rss_kb": int(b)} for a, b in (l.split() for l in open(os.path.join(tmp, "rss.txt")))]
doc = {"date": datetime.date.today().isoformat(), "cpu": "%s, %d cores" % (cpu, os.cpu_count()),
       "threads": cases[0]["result"]["threads"], "cases": cases, "rss": rss}
with open(out + ".tmp", "w") as fh:
    json.dump(doc, fh, indent=1)
os.replace(out + ".tmp", out)
print("wrote", out, file=sys.stderr)
PYEOF
