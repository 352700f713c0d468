#!/usr/bin/env python3
"""How close the slice families can come to the loop of their passes.

Reads the JSON that `tools/bench/bench.sh --overhead` writes (OUT=...) and,
for every ASAP family with slices and every n, prints its measured time
against Sinkhorn T' = p (the same log-sum-exp passes) and a floor for that
ratio: the slice projections alone (4 n d L flops a head, one GEMM on each
side) run at the machine's measured FMA peak, and sorting, potentials and
everything else about the slices cost nothing:

    floor = 1 + (bound_asap - bound_sinkhorn) / measured_sinkhorn

(bench.cpp's bound_s differs between the two only by those flops). Where
the floor is above a target, no implementation of the same arithmetic meets
it on that machine; where it is below, the gap is what sorting and the
potentials may cost.

With the teacher's loop in the same run (Sinkhorn T' = --teacher, 6 by
default, as bench.sh runs it), each cell also shows the best speed-up over
that teacher the family could have at that floor:

    best = measured_teacher / (floor * measured_sinkhorn)

Where it is below --speedup (compile's default budget, 1.25), no
implementation of the slice columns lets compile choose that map against
such a teacher at that shape, whatever sorting and potentials cost.

    tools/experiments/slice_floor.py docs/bench_overhead.json [--target 1.25] [--teacher 6] [--speedup 1.25]
"""
import argparse
import json
import sys

EXTRA_PASSES = {"asap": 0, "asap_sm": 1, "asap_s3": 3}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("json", help="bench.sh --overhead output (OUT=...)")
    ap.add_argument("--target", type=float, default=1.25, help="ratio to compare against (default 1.25)")
    ap.add_argument("--max-n", type=int, default=64, help="largest n shown (default 64)")
    ap.add_argument("--teacher", type=int, default=6, help="the teacher's T: Sinkhorn T' = T in the same run (default 6)")
    ap.add_argument("--speedup", type=float, default=1.25, help="speed-up over the teacher to compare against (default 1.25)")
    a = ap.parse_args()
    try:
        with open(a.json) as f:
            blocks = json.load(f)
    except (OSError, ValueError) as e:
        sys.exit(f"slice_floor.py: cannot read '{a.json}': {e}")
    if not isinstance(blocks, list) or not all(isinstance(b, dict) and "results" in b for b in blocks):
        sys.exit(f"slice_floor.py: '{a.json}': expected a list of blocks with 'results', as bench.sh --overhead writes")
    shown = 0
    for b in blocks:
        if b.get("slices", 0) <= 0:
            continue
        res = b["results"]
        sink = {(r["n"], r["param"]): r for r in res if r["op"] == "sinkhorn"}
        print(f"{b.get('policy', '?')} wait, d = {b['d']}, {b['slices']} slices "
              f"({b.get('machine', {}).get('cpu', '?')}, {b.get('machine', {}).get('threads', '?')} threads): "
              f"measured ratio / floor (best speed-up over T = {a.teacher} at the floor)")
        for n in sorted({r["n"] for r in res if r["n"] <= a.max_n}):
            cells = []
            for r in res:
                if r["n"] != n or r["op"] not in EXTRA_PASSES or "bound_s" not in r:
                    continue
                s = sink.get((n, r["param"] + EXTRA_PASSES[r["op"]]))
                if not s or "bound_s" not in s:
                    continue
                floor = 1 + (r["bound_s"] - s["bound_s"]) / s["median_s"]
                mark = "!" if floor > a.target else ""
                cell = f"{r['op']}_{r['param']} {r['median_s'] / s['median_s']:.2f}/{floor:.2f}{mark}"
                t = sink.get((n, a.teacher))
                if t:
                    best = t["median_s"] / (floor * s["median_s"])
                    cell += f" ({best:.2f}x{'*' if best < a.speedup else ''})"
                cells.append(cell)
                shown += 1
            if cells:
                print(f"  n = {n:4d}: " + "  ".join(cells))
    if not shown:
        sys.exit(f"slice_floor.py: '{a.json}' has no slice family with its Sinkhorn loop and bounds")
    print(f"(! : the floor alone is above {a.target:g}x; * : even at the floor, below {a.speedup:g}x the teacher's speed)")


if __name__ == "__main__":
    main()
