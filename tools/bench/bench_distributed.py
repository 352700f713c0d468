#!/usr/bin/env python3
"""Scaling of the distributed compile (issue 17): 1 and N processes on the
bundled teacher (n = 17) and the long-sequence case (n = 256,
tools/bench/make_throughput_case.py), measured in the same run.

    /usr/bin/python3 tools/bench/bench_distributed.py [--procs 2] [--reps 2] [--md docs/distributed.md]

One process uses every core (--threads = cores); N processes on one machine
share them (--threads = cores / N each). Ranks are started with explicit
--dist-init flags over loopback. Each compile runs with --no-report, the
default objective replaced by --objective fidelity so that every run does
the same work (the measured latency phase is timed separately by
`asapc compile`; with the default objective it runs on rank 0 only). The
best of --reps runs is kept. Writes docs/bench_distributed.json and, with
--md, the table between the BENCH-DISTRIBUTED markers of that file.
"""
import argparse
import datetime
import json
import os
import platform
import socket
import subprocess
import sys
import tempfile
import time

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
ASAPC = os.environ.get("ASAPC", os.path.join(ROOT, "build", "asapc"))
PY = sys.executable


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_compile(case, procs, threads, out):
    argv = [ASAPC, "compile", case["ckpt"], "--spec", case["spec"], "--calib", case["calib"], "-o", out,
            "--objective", "fidelity", "--no-report", "-q", "--json", "--threads", str(threads)]
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")}
    t0 = time.time()
    if procs == 1:
        p = subprocess.run(argv, capture_output=True, text=True, env=env)
        assert p.returncode == 0, p.stderr
        summary = json.loads(p.stdout)
    else:
        port = free_port()
        ps = [subprocess.Popen(argv + ["--dist-init", "tcp://127.0.0.1:%d" % port, "--rank", str(r),
                                       "--world-size", str(procs)],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
              for r in range(procs)]
        outs = [p.communicate() for p in ps]
        for r, p in enumerate(ps):
            assert p.returncode == 0, "rank %d: %s" % (r, outs[r][1])
        summary = json.loads(outs[0][0])
    wall = time.time() - t0
    d = summary["distributed"]
    return {"wall_s": wall, "compile_s": summary["total_time_s"],
            "communication_s": d.get("communication_s_mean", 0.0),
            "bytes_reduced": d.get("bytes_reduced", 0), "reductions": d.get("reductions", 0),
            "calibration_bytes_read": d["calibration_bytes_read"],
            "examples": summary["layers"][0]["examples"], "layers": len(summary["layers"]),
            "n": None, "phase_times_s": phases_of(summary)}


def phases_of(summary):
    """Rank 0's phase times, summed over layers (where a distributed compile spends its time)."""
    out = {}
    for L in summary["layers"]:
        for k, v in L.get("phase_times_s", {}).items():
            if isinstance(v, (int, float)):
                out[k] = round(out.get(k, 0.0) + v, 4)
    return out


def machine():
    cpu = "?"
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {"cpu": cpu, "cores": os.cpu_count(), "system": platform.platform()}


def table(res):
    rows = ["| case | processes | threads each | compile wall time | vs 1 process | communication share "
            "| bytes reduced | calibration bytes read | reduced / read |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for case in res["cases"]:
        base = case["runs"][0]["wall_s"]
        for r in case["runs"]:
            rows.append("| %s | %d | %d | %.2f s | %.2fx | %.1f%% | %.2f MB | %.1f MB | %.3f |" % (
                case["title"], r["procs"], r["threads"], r["wall_s"], base / r["wall_s"],
                100 * r["communication_s"] / r["compile_s"] if r["procs"] > 1 else 0.0,
                r["bytes_reduced"] / 1e6, r["calibration_bytes_read"] / 1e6,
                r["bytes_reduced"] / max(r["calibration_bytes_read"], 1)))
    m = res["machine"]
    rows.append("")
    rows.append("Measured %s on %s (%d cores), best of %d runs each: `/usr/bin/python3 tools/bench/bench_distributed.py "
                "--md docs/distributed.md`. \"vs 1 process\" is the 1-process wall time over this row's, so above "
                "1 is faster. The communication share is the mean over ranks of the time inside reductions "
                "(waiting for the slowest rank included) over the compile time; bytes are those of the float64 "
                "sums each rank contributes." % (res["date"], m["cpu"], m["cores"], res["reps"]))
    return "\n".join(rows)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--procs", type=int, default=2)
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--md", help="rewrite the table between the BENCH-DISTRIBUTED markers of this file")
    ap.add_argument("--json", default=os.path.join(ROOT, "docs", "bench_distributed.json"))
    a = ap.parse_args(argv)
    cores = os.cpu_count() or 2
    tmp = tempfile.mkdtemp(prefix="asapc-benchdist-")
    print("== the n = 256 case (tools/bench/make_throughput_case.py)", file=sys.stderr)
    subprocess.run([PY, os.path.join(ROOT, "tools", "bench", "make_throughput_case.py"), "--n", "256", "--examples", "256",
                    "--out", os.path.join(tmp, "tp")], check=True, stdout=subprocess.DEVNULL)
    b = os.path.join(ROOT, "calib_data", "vit_mnist_t6")
    t = os.path.join(tmp, "tp", "throughput")
    cases = [{"title": "bundled ViT, n = 17, 512 examples", "ckpt": b + ".pt", "spec": b + ".spec.json",
              "calib": b + ".calib.h5"},
             {"title": "long sequences, n = 256, 256 examples", "ckpt": t + ".pt", "spec": t + ".spec.json",
              "calib": t + ".calib.h5"}]
    res = {"date": datetime.date.today().isoformat(), "machine": machine(), "reps": a.reps, "cases": []}
    for case in cases:
        runs = []
        for procs in (1, a.procs):
            threads = max(1, cores // procs)
            best = None
            for rep in range(a.reps):
                print("== %s: %d process(es) x %d threads, run %d" % (case["title"], procs, threads, rep + 1),
                      file=sys.stderr)
                r = run_compile(case, procs, threads, os.path.join(tmp, "a.asap.h5"))
                if best is None or r["wall_s"] < best["wall_s"]:
                    best = r
            best.update({"procs": procs, "threads": threads})
            runs.append(best)
        res["cases"].append({"title": case["title"], "runs": runs})
    with open(a.json, "w") as f:
        json.dump(res, f, indent=1)
    md = table(res)
    print(md)
    if a.md:
        text = open(a.md).read()
        start, end = "<!-- BENCH-DISTRIBUTED -->", "<!-- /BENCH-DISTRIBUTED -->"
        i, j = text.index(start) + len(start), text.index(end)
        open(a.md, "w").write(text[:i] + "\n" + md + "\n" + text[j:])
    return 0


if __name__ == "__main__":
    sys.exit(main())
