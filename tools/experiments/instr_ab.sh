#!/usr/bin/env bash
# Counts the instructions one fused operator executes in two builds (say,
# before and after a change), per function, under valgrind's cachegrind: a
# deterministic complement to build_ab.sh's timings on a machine whose
# timings are noisy. Instructions are not time (a spill and a multiply-add
# count alike), so read it next to build_ab.sh, not instead of it.
#
#   tools/experiments/instr_ab.sh OLD_BUILD NEW_BUILD N D SLICES OP [PATTERN]
#   e.g. tools/experiments/instr_ab.sh /tmp/old/build build 17 16 16 asap_1 'sort_|slice'
# Each build directory holds tools/asap_bench and libasap.so.0 (as for
# build_ab.sh). Prints the instructions per head of every function whose name
# matches PATTERN (an extended regex; default: the whole fast path), old, new
# and new / old. BH: batch x heads (default 4x4); REPS (default 51); BENCH_ARGS:
# more asap_bench flags (e.g. --lengths 5,11,5,8 for a padded batch); OLD_OP:
# the operator the old side runs (default OP), to compare two operators of
# one build, e.g. OLD_OP=sinkhorn_3 tools/experiments/instr_ab.sh build build 17 16 0 asap_3.
# Needs valgrind (Debian package valgrind). About 3 minutes per build: the
# benchmark's start-up and peak probes run under valgrind too.
set -euo pipefail
cd "$(dirname "$0")/../.."
[ $# -ge 6 ] || { sed -n '2,18p' "$0" >&2; exit 2; }
old=$1 new=$2 n=$3 d=$4 L=$5 op=$6 pattern=${7:-'asap::fast::'}
BH=${BH:-4x4}
REPS=${REPS:-51}
old_op=${OLD_OP:-$op}
command -v valgrind > /dev/null || { echo "instr_ab.sh: expected valgrind on PATH, found none (apt-get install valgrind)" >&2; exit 2; }
for b in "$old" "$new"; do
  [ -x "$b/tools/asap_bench" ] || { echo "instr_ab.sh: expected an asap_bench at '$b/tools/asap_bench', found none" >&2; exit 2; }
done
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
for side in old new; do
  dir=$old side_op=$old_op
  [ "$side" = new ] && dir=$new side_op=$op
  # ASAP_BENCH_REEXEC: asap_bench re-executes itself to pin its runtime,
  # which valgrind cannot follow; the environment it would set is set here.
  if ! ASAP_BENCH_REEXEC=1 OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 OMP_WAIT_POLICY=ACTIVE \
      LD_LIBRARY_PATH="$dir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" \
      valgrind --tool=cachegrind --cache-sim=no --cachegrind-out-file="$tmp/$side.out" \
      "$dir/tools/asap_bench" --n "$n" --bh "$BH" --d "$d" --slices "$L" --T 6,8 --k 1,2,3,4,5,6 \
      --threads 1 --wait-policy active --reps "$REPS" --no-mem ${BENCH_ARGS:-} --only "$side_op" > "$tmp/$side.json" 2> "$tmp/$side.err"; then
    tail -5 "$tmp/$side.err" >&2
    echo "instr_ab.sh: asap_bench under valgrind failed for the $side build ($dir)" >&2
    exit 1
  fi
  cg_annotate --threshold=0 "$tmp/$side.out" > "$tmp/$side.txt"
done
/usr/bin/python3 - "$tmp" "$BH" "$REPS" "$pattern" "$op" "$old_op" <<'EOF'
import json, re, sys
tmp, bh, reps, pattern, op, old_op = sys.argv[1:7]
b, h = (int(x) for x in bh.split('x'))
calls = None
counts = {}
for side in ('old', 'new'):
    res = json.load(open(f'{tmp}/{side}.json'))['results']
    if not res:
        sys.exit(f'instr_ab.sh: asap_bench ran no operator named {old_op if side == "old" else op}')
    # The operator runs its timed repetitions plus one warm-up call.
    calls = (int(reps) + 1) * b * h
    for line in open(f'{tmp}/{side}.txt'):
        m = re.match(r'\s*([\d,]+)\s+\([\s\d.]+%\)\s+\S*?:(.*)$', line)
        if m and re.search(pattern, m.group(2)):
            name = re.sub(r'\(anonymous namespace\)::|asap::fast::', '', m.group(2))
            name = re.sub(r'\(.*$', '', name)[-70:]
            counts.setdefault(name, {})[side] = int(m.group(1).replace(',', ''))
if not counts:
    sys.exit(f'instr_ab.sh: no function matches {pattern!r}')
what = op if old_op == op else f'{old_op} (old) against {op} (new)'
print(f'instructions per head ({what}, {reps} reps, B x H = {bh}); old, new, new / old')
tot = {'old': 0, 'new': 0}
for name, c in sorted(counts.items(), key=lambda kv: -max(kv[1].values())):
    o, w = c.get('old', 0), c.get('new', 0)
    tot['old'] += o
    tot['new'] += w
    r = f'{w / o:.3f}' if o else '-'
    print(f'{name:72s} {o / calls:10.0f} {w / calls:10.0f}  {r}')
print(f'{"total of the functions above":72s} {tot["old"] / calls:10.0f} {tot["new"] / calls:10.0f}  {tot["new"] / max(tot["old"], 1):.3f}')
EOF
