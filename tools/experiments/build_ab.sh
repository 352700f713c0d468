#!/usr/bin/env bash
# Times fused operators in two builds (say, before and after a change),
# alternately, and prints each operator's least median over ROUNDS runs per
# build and the ratio (new / old): the before/after numbers of
# docs/performance.md. One asap_bench process per build, operator and round.
#
#   tools/experiments/build_ab.sh OLD_BUILD NEW_BUILD N D THREADS SLICES OP [OP ...]
#   e.g. git worktree add /tmp/old 59d8a82 && cmake -S /tmp/old -B /tmp/old/build -DCMAKE_BUILD_TYPE=Release \
#          && make -C /tmp/old/build asap_bench
#        tools/experiments/build_ab.sh /tmp/old/build build 17 16 1 16 asap_1 asap_s3_1
# Each build directory holds tools/asap_bench and libasap.so.0 (found there
# first, through LD_LIBRARY_PATH). BH: batch x heads (default 16x4; 4x4 keeps q, k
# and v in L2 where a shared L3 is noisy). STAT: median (default) or min, the statistic of each run (the fastest call of a run is the least touched by a burst of load from another process). BENCH_ARGS: more asap_bench flags (e.g. --lengths 5,11,5,8 for a padded batch). ROUNDS (default 5), PYTHON (default /usr/bin/python3).
set -euo pipefail
cd "$(dirname "$0")/../.."
[ $# -ge 7 ] || { sed -n '2,13p' "$0" >&2; exit 2; }
old=$1 new=$2 n=$3 d=$4 th=$5 L=$6
shift 6
PYTHON=${PYTHON:-/usr/bin/python3}
ROUNDS=${ROUNDS:-5}
STAT=${STAT:-median}
[ "$STAT" = median ] || [ "$STAT" = min ] || { echo "build_ab.sh: expected STAT median or min, found '$STAT'" >&2; exit 2; }
for b in "$old" "$new"; do
  [ -x "$b/tools/asap_bench" ] || { echo "build_ab.sh: expected an asap_bench at '$b/tools/asap_bench', found none" >&2; exit 2; }
  [ "${COPY:-1}" = 0 ] || [ -e "$b/libasap.so.0" ] \
    || { echo "build_ab.sh: expected the library at '$b/libasap.so.0' (COPY=1 copies it each round), found none" >&2; exit 2; }
done
# COPY=1 (the default): each round loads a fresh copy of each build's
# libasap.so.0, so that where one file's pages happen to land in memory (2.5-4%
# on some operators, docs/performance.md, "Where the library's pages land")
# is not taken for the change; COPY=0 loads the build directories' own files.
COPY=${COPY:-1}
TMPL=$(mktemp -d)
trap 'rm -rf "$TMPL"' EXIT
for op in "$@"; do
  for round in $(seq 1 "$ROUNDS"); do
    for side in old new; do
      dir=$old
      [ "$side" = new ] && dir=$new
      libdir=$dir
      if [ "$COPY" = 1 ]; then
        libdir=$TMPL/$side.$op.$round
        mkdir -p "$libdir"
        cp "$(readlink -f "$dir/libasap.so.0")" "$libdir/libasap.so.0"
      fi
      LD_LIBRARY_PATH="$libdir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" "$dir/tools/asap_bench" --n "$n" --bh ${BH:-16x4} --d "$d" \
        --slices "$L" --T 6,8 --k 1,2,3,4,5,6 --threads "$th" --wait-policy active --reps 401 --no-mem ${BENCH_ARGS:-} --only "$op" \
        2>/dev/null | "$PYTHON" -c "import json,sys; [print('$side', '$op', r['${STAT}_s'] * 1e6) for r in json.load(sys.stdin)['results']]"
    done
  done
done | "$PYTHON" -c "
import sys
m = {}
for line in sys.stdin:
    side, op, t = line.split()
    m.setdefault(op, {}).setdefault(side, []).append(float(t))
if not m:
    sys.exit('build_ab.sh: no timings (unknown operator, or asap_bench failed)')
for op, v in m.items():
    if 'old' not in v or 'new' not in v:
        sys.exit(f'build_ab.sh: {op}: no timing from one of the builds')
    o, w = min(v['old']), min(v['new'])
    r = sorted(x / y for x, y in zip(v['new'], v['old']))
    mr = r[len(r) // 2] if len(r) % 2 else 0.5 * (r[len(r) // 2 - 1] + r[len(r) // 2])
    print(f'n = $n, d = $d, $th thread(s), $L slices, least $STAT  {op:12s} old {o:9.1f} us  new {w:9.1f} us  new/old {w / o:.3f}'
          f'  (median of the rounds\' ratios {mr:.3f})')
"
