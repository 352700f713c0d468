#!/usr/bin/env python3
"""Two `perf record` profiles of the same number of calls (say Sinkhorn T' = 3
and the `alpha` map with k = 3, each asap_bench run with --only one operator):
samples per symbol in each and their difference, largest first, then the
samples on and right after integer division instructions (div, idiv: the
sample lands on the instruction after a long one) per symbol of each
profile. docs/performance.md, "Integer divisions per head".

    perf record -o A.data -e cpu-clock build/tools/asap_bench ... --only sinkhorn_3
    perf record -o B.data -e cpu-clock build/tools/asap_bench ... --only asap_3
    tools/experiments/perf_diff.py A.data B.data [ROWS=25]
"""
import re
import subprocess
import sys


def symbols(data):
    out = subprocess.run(["perf", "report", "-i", data, "--stdio", "-n", "--sort", "symbol"],
                         capture_output=True, text=True, check=True).stdout
    rows = {}
    for line in out.splitlines():
        m = re.match(r"\s+([\d.]+)%\s+(\d+)\s+\[.\]\s+(.*)$", line)
        if m:
            name = re.sub(r"\s+-\s+-\s*$", "", m.group(3)).strip()
            rows[name] = rows.get(name, 0) + int(m.group(2))
    return rows


def short(name):
    return re.sub(r"asap::fast::(isa_\w+::|sort_\w+::)?(\(anonymous namespace\)::)?", "", name)[:100]


def division_samples(data, rows, top=60):
    """Samples on an integer division or the instruction after it, per symbol."""
    found = {}
    for name, n in sorted(rows.items(), key=lambda kv: -kv[1])[:top]:
        if n < 20:
            continue
        ann = subprocess.run(["perf", "annotate", "-i", data, "--stdio", "-s", name],
                             capture_output=True, text=True).stdout.splitlines()
        ins = [l for l in ann if re.match(r"\s+[\d.]+\s+:\s+[0-9a-f]+:", l)]
        pct = 0.0
        for i, l in enumerate(ins):
            if re.search(r":\s+i?div[lqwb]?\s", l) and i + 1 < len(ins):
                pct += float(l.split(":")[0]) + float(ins[i + 1].split(":")[0])
        if pct > 0:
            found[name] = pct / 100.0 * n
    return found


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    for f in sys.argv[1:3]:
        try:
            open(f, "rb").close()
        except OSError as e:
            sys.exit("perf_diff.py: expected a perf.data file at '%s', found none (%s)" % (f, e.strerror))
    a, b = symbols(sys.argv[1]), symbols(sys.argv[2])
    top = int(sys.argv[3]) if len(sys.argv) > 3 else 25
    print("samples: %d (%s), %d (%s)" % (sum(a.values()), sys.argv[1], sum(b.values()), sys.argv[2]))
    print("%7s %7s %7s  symbol" % ("first", "second", "diff"))
    for k in sorted(set(a) | set(b), key=lambda k: -abs(b.get(k, 0) - a.get(k, 0)))[:top]:
        print("%7d %7d %+7d  %s" % (a.get(k, 0), b.get(k, 0), b.get(k, 0) - a.get(k, 0), short(k)))
    for data, rows in ((sys.argv[1], a), (sys.argv[2], b)):
        div = division_samples(data, rows)
        print("\nsamples on or right after an integer division in %s: %.0f" % (data, sum(div.values())))
        for name, s in sorted(div.items(), key=lambda kv: -kv[1])[:8]:
            print("  %6.0f  %s" % (s, short(name)))


if __name__ == "__main__":
    main()
