#!/usr/bin/env bash
# Issue 14, item 2: Highway vqsort (libhwy-dev 1.0.3) vs asapc's stable argsort
# (src/lib/fast/sort.h). Installs nothing. Usage:
#   tools/experiments/vqsort_bench.sh [build_dir=/tmp/vqsort_bench_build] [runs=3] [reps=41]
# Builds -O2 (as the library) and -O2 -march=native, runs each `runs` times
# (pinned to CPU 1 with taskset when available) and prints, per table, the
# median over runs of each cell (each cell = median over `reps` heads).
set -euo pipefail
if [ ! -f /usr/include/hwy/contrib/sort/vqsort.h ]; then
  echo "Highway's vqsort header is missing: run 'apt-get install libhwy-dev' first." >&2
  exit 1
fi
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
out="${1:-/tmp/vqsort_bench_build}"
runs="${2:-3}"
reps="${3:-41}"
mkdir -p "$out"
cflags="$(pkg-config --cflags libhwy libhwy-contrib 2>/dev/null || echo -DHWY_SHARED_DEFINE)"
libs="$(pkg-config --libs libhwy libhwy-contrib 2>/dev/null || echo -lhwy -lhwy_contrib)"
g++ -O2 -std=c++17 -I"$root/src/lib" $cflags "$here/vqsort_bench.cpp" -o "$out/vqsort_bench" $libs
g++ -O2 -march=native -std=c++17 -I"$root/src/lib" $cflags "$here/vqsort_bench.cpp" -o "$out/vqsort_bench_native" $libs

pin=()
if command -v taskset >/dev/null 2>&1; then pin=(taskset -c 1); fi

echo "# $(date -u +%FT%TZ)  $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')  g++ $(g++ -dumpfullversion)"
for bin in vqsort_bench vqsort_bench_native; do
  echo
  echo "## $bin ($([ $bin = vqsort_bench ] && echo '-O2' || echo '-O2 -march=native')), median of $runs runs"
  for ((i = 1; i <= runs; ++i)); do
    echo "# run $i: load average $(uptime | sed 's/.*load average: //')" >&2
    "${pin[@]}" "$out/$bin" "$reps" > "$out/$bin.run$i.txt"
  done
  echo "load average after: $(uptime | sed 's/.*load average: //')"
  grep -h -e '^correctness' -e '^getrandom' "$out/$bin.run1.txt"
  # Median over runs of every numeric cell, per (table, m).
  awk -v runs="$runs" '
    function med(s,   a, n, i, j, t) {
      n = split(s, a, " ")
      for (i = 2; i <= n; ++i) { t = a[i]; for (j = i - 1; j >= 1 && a[j] + 0 > t + 0; --j) a[j + 1] = a[j]; a[j + 1] = t }
      return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2
    }
    /^ +m / { colhdr = $0; next }
    /^float/ { if (!($0 in seen)) { seen[$0] = 1; order[++no] = "H" $0 }; tab = $0; next }
    /^ *[0-9]+ / {
      key = tab SUBSEP $1
      if (!(key in cells)) { cells[key] = 1; order[++no] = "R" key }
      for (c = 2; c <= NF; ++c) v[key, c] = v[key, c] " " $c
      nf[key] = NF
    }
    END {
      for (i = 1; i <= no; ++i) {
        e = order[i]
        if (substr(e, 1, 1) == "H") { h = substr(e, 2); print ""; print h; print colhdr; continue }
        key = substr(e, 2); split(key, kk, SUBSEP)
        line = sprintf("%6s", kk[2])
        for (c = 2; c <= nf[key]; ++c) line = line sprintf(c < 6 ? " %9.2f" : " %10.2f", med(v[key, c]))
        print line
      }
    }' "$out/$bin".run*.txt
done
