#!/usr/bin/env python3
"""Tests of the benchmark tools (no pytest needed): the report's target
checks and compile section (tools/bench/bench_report.py) on known timings, the
long-sequence compile case (tools/bench/make_throughput_case.py), the slice
families' floor (tools/experiments/slice_floor.py), what slices buy on the
bundled teacher (tools/experiments/slice_errors.sh), and the alternating timers
(tools/experiments/build_ab.sh, pair_ratios.sh) on fake benches, and the
scaling-domain prototype (tools/experiments/scaling_domain.sh), the heads-in-lanes
prototype (tools/experiments/heads_in_lanes.sh) and the score range
(tools/experiments/score_range.py).

    ${PYTHON:-/usr/bin/python3} tests/python/test_bench_tools.py [-k SUBSTRING]
"""
import json
import math
import os
import subprocess
import sys
import tempfile

import h5py

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TOOLS = os.path.join(REPO, "tools")
sys.path[:0] = [TOOLS, os.path.join(TOOLS, "bench")]
import bench_report  # noqa: E402

from harness import run, test  # noqa: E402


def row(op, param, n, t, B=4, H=4, mem=None):
    r = {"op": op, "param": param, "n": n, "B": B, "H": H, "d": 64, "median_s": t, "min_s": t,
         "cpu_median_s": t, "times_s": [t]}
    if mem is not None:
        r["peak_extra_bytes"] = mem
    return r


def synthetic():
    """Timings with known ratios at n = 1024 and 4096, B·H = 16."""
    rows = []
    for n, s in ((1024, 1.0), (4096, 16.0)):
        rows += [row("softmax", 0, n, 0.100 * s), row("teacher_fast", 10, n, 0.070 * s),
                 row("teacher_fast", 20, n, 0.120 * s), row("pytorch_loop", 10, n, 1.40 * s),
                 row("pytorch_loop", 6, n, 1.0 * s), row("pytorch_loop", 20, n, 2.8 * s),
                 row("teacher_fast", 6, n, 0.050 * s)]
        for k in range(1, 6):
            rows += [row("sinkhorn", k, n, (0.030 + 0.005 * k) * s),
                     row("asap", k, n, (0.040 + 0.005 * k) * s, mem=100 << 20),
                     row("asap_sm", k, n, (0.045 + 0.005 * k) * s),
                     row("asap_s3", k, n, (0.060 + 0.005 * k) * s, mem=200 << 20)]
    return {"machine": {"date": "today", "cpu": "test cpu", "cores": 2, "threads": 2, "isa": "avx2",
                        "load_before": "0", "load_after": "0"},
            "settings": {"d": 64, "slices": 64, "reps": 1}, "results": rows}


@test
def targets_are_the_measured_ratios():
    R = bench_report.Results(synthetic())
    got = {name: (val, ok) for name, val, ok in bench_report.targets(R)}
    # default ASAP (sinkhorn3 family, k = 1) against T = 20 at n = 1024: 0.120 / 0.065.
    key = [k for k in got if k.startswith("default ASAP L64+alpha+softmax+sinkhorn3 (k=1) ≥ 4×")]
    assert len(key) == 1, list(got)
    assert got[key[0]][0].startswith("%.2f×" % (0.120 / 0.065)) and not got[key[0]][1], got[key[0]]
    # PyTorch loop over the fast teacher at T = 10: 1.40 / 0.070 = 20x, met.
    key = [k for k in got if "PyTorch" in k and "T=10" in k]
    assert got[key[0]] == ("20.0× (worst, B·H=16)", True), got[key[0]]
    # ASAP k vs the k-closure normalizer, worst over n >= 512 and k: k = 1 at n = 1024 or 4096 (same ratio).
    key = [k for k in got if k.startswith("ASAP L64+alpha with k closures")]
    assert got[key[0]][0].startswith("%.2f×" % (0.045 / 0.035)) and not got[key[0]][1], got[key[0]]
    # Memory at n = 4096, B·H = 16: 100 MiB, met.
    key = [k for k in got if "memory" in k and k.startswith("ASAP L64+alpha (k=3)")]
    assert got[key[0]] == ("100 MiB", True), got[key[0]]


@test
def report_is_written_between_markers_with_the_compile_section():
    with tempfile.TemporaryDirectory() as d:
        bj = os.path.join(d, "bench.json")
        json.dump(synthetic(), open(bj, "w"))
        cj = os.path.join(d, "compile.json")
        jobs = [{"job": "teacher", "median_s": 1.0, "ratio": 1.0}, {"job": "compile", "median_s": 3.0, "ratio": 3.0},
                {"job": "compile-fixed", "median_s": 1.4, "ratio": 1.4}]
        json.dump({"date": "today", "cpu": "test cpu", "threads": 2,
                   "cases": [{"name": "case A", "n": 17, "result": {"jobs": jobs, "examples_over_layers": 10,
                                                                   "last_compile_phase_times_s": [{"read": 0.5}]}}],
                   "rss": [{"examples": 64, "peak_rss_kb": 1000}, {"examples": 512, "peak_rss_kb": 1300}]},
                  open(cj, "w"))
        md = os.path.join(d, "perf.md")
        open(md, "w").write("# Perf\nkept above\n%s\nold\n%s\nkept below\n" % (bench_report.BEGIN, bench_report.END))
        r = subprocess.run([sys.executable, os.path.join(TOOLS, "bench", "bench_report.py"), bj, "--md", md,
                            "--svg", os.path.join(d, "p.svg"), "--compile-json", cj], capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
        text = open(md).read()
        assert text.startswith("# Perf\nkept above\n") and text.endswith("kept below\n") and "\nold\n" not in text
        assert "| case A | 17 | 10 | 1.00 s | 3.00 s | 3.00× | 1.40 s | 1.40× | **no** |" in text, text
        assert "Change: +30.0% (target ±15%: **not met**)" in text, text
        assert os.path.getsize(os.path.join(d, "p.svg")) > 0


@test
def throughput_case_records_the_teacher_at_a_longer_n():
    with tempfile.TemporaryDirectory() as d:
        r = subprocess.run([sys.executable, os.path.join(TOOLS, "bench", "make_throughput_case.py"), "--n", "40",
                            "--examples", "3", "--out", d], capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
        spec = json.load(open(os.path.join(d, "throughput.spec.json")))
        names = [l["name"] for l in spec["layers"]]
        with h5py.File(os.path.join(d, "throughput.calib.h5"), "r") as f:
            for name in names:
                assert f["layers"][name]["x"].shape == (3, 40, 64), f["layers"][name]["x"].shape
        asapc = os.environ.get("ASAPC")
        if asapc:  # the checkpoint has no position embedding, so compile accepts n = 40
            out = os.path.join(d, "a.h5")
            r = subprocess.run([asapc, "compile", os.path.join(d, "throughput.pt"), "--spec",
                                os.path.join(d, "throughput.spec.json"), "--calib",
                                os.path.join(d, "throughput.calib.h5"), "-o", out, "--no-report", "-q"],
                               capture_output=True, text=True)
            assert r.returncode == 0, r.stderr
            assert os.path.exists(out)





@test
def slice_floor_is_the_projections_at_peak_over_the_measured_loop():
    # asap_s3 k = 1 (4 passes) against sinkhorn 4: the bounds differ by the
    # projections alone, 0.010 s, and the loop takes 0.050 s, so the floor is
    # 1 + 0.010 / 0.050 = 1.20; measured 0.075 / 0.050 = 1.50. alpha k = 1
    # against sinkhorn 1: 1 + 0.010 / 0.020 = 1.50, above 1.25 (marked).
    # With the teacher (sinkhorn 6) at 0.066 s, the best speed-ups at the
    # floors are 0.066 / (1.20 * 0.050) = 1.10 (below 1.25: starred) and
    # 0.066 / (1.50 * 0.020) = 2.20.
    def r(op, param, t, b):
        return {"op": op, "param": param, "n": 17, "B": 16, "H": 4, "median_s": t, "bound_s": b}
    blocks = [{"policy": "active", "d": 16, "slices": 0, "results": [r("sinkhorn", 1, 0.02, 0.004)]},
              {"policy": "active", "d": 16, "slices": 16, "machine": {"cpu": "test cpu", "threads": 2},
               "results": [r("sinkhorn", 4, 0.050, 0.010), r("asap_s3", 1, 0.075, 0.020),
                           r("sinkhorn", 1, 0.020, 0.004), r("asap", 1, 0.040, 0.014),
                           r("sinkhorn", 6, 0.066, 0.014)]}]
    tool = os.path.join(TOOLS, "experiments", "slice_floor.py")
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "overhead.json")
        with open(path, "w") as f:
            json.dump(blocks, f)
        out = subprocess.run([sys.executable, tool, path], capture_output=True, text=True, check=True).stdout
        assert "asap_s3_1 1.50/1.20 (1.10x*)" in out, out
        assert "asap_1 2.00/1.50! (2.20x)" in out, out
        assert "best speed-up over T = 6" in out, out
        # Without the teacher's loop in the run, the cells carry no speed-up.
        no_teacher = os.path.join(d, "no_teacher.json")
        with open(no_teacher, "w") as f:
            json.dump([dict(blocks[1], results=blocks[1]["results"][:4])], f)
        out = subprocess.run([sys.executable, tool, no_teacher], capture_output=True, text=True, check=True).stdout
        assert "asap_s3_1 1.50/1.20 " in out + " " and "x*" not in out, out
        assert "d = 16, 16 slices (test cpu, 2 threads)" in out, out
        bad = os.path.join(d, "bad.json")
        with open(bad, "w") as f:
            json.dump({"results": []}, f)
        e = subprocess.run([sys.executable, tool, bad], capture_output=True, text=True)
        assert e.returncode != 0 and "expected a list of blocks" in e.stderr and "bad.json" in e.stderr, e.stderr
        e = subprocess.run([sys.executable, tool, os.path.join(d, "missing.json")], capture_output=True, text=True)
        assert e.returncode != 0 and "cannot read" in e.stderr and "missing.json" in e.stderr, e.stderr


@test
def slice_errors_prints_every_fitted_prefix_per_layer_and_target():
    # On the bundled ViT, with a bank of 16: both layers, the closure-ready
    # fits with an error per k (k = 1..3 within the 4-pass budget of T = 6),
    # the k-matched ones with their own k only, and the slice-free prefix.
    asapc = os.environ.get("ASAPC") or os.path.join(REPO, "build", "asapc")
    assert os.path.exists(asapc), f"no asapc at {asapc} (set ASAPC)"
    tool = os.path.join(TOOLS, "experiments", "slice_errors.sh")
    env = dict(os.environ, ASAPC=asapc)
    r = subprocess.run([tool, os.path.join(REPO, "calib_data", "vit_mnist_t6"), "slices+alpha+softmax", "16"],
                       capture_output=True, text=True, env=env)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].startswith("slices+alpha+softmax: held-out attention error by slice count"), lines[0]
    layers = [l for l in lines if not l.startswith(" ") and l != lines[0]]
    assert layers == ["transformer.layers.0.0.fn", "transformer.layers.1.0.fn"], layers
    ready = [l for l in lines if "closure-ready per-head L =   0:" in l]
    matched = [l for l in lines if l.strip().startswith("k-matched") and "L =  16:" in l]
    assert len(ready) == 2 and all(l.count("k=") == 3 and "k=3" in l and "[4]" in l for l in ready), ready
    assert matched and all(l.count("k=") == 1 for l in matched), matched
    errors = [float(c.split()[1]) for l in ready for c in l.split("k=")[1:]]
    assert all(0 < e < 1 for e in errors), errors
    e = subprocess.run([tool, os.path.join(REPO, "calib_data", "no_such_teacher")], capture_output=True, text=True,
                       env=env)
    assert e.returncode != 0 and "no_such_teacher.pt" in e.stderr and "found none" in e.stderr, e.stderr


def printed_ratio_agrees(ratio, num, den, half_ulp_values=0.05, half_ulp_ratio=0.005):
    """Whether a printed ratio is num / den for some values that round to the
    printed num and den (to 0.1 us by default) and itself rounds to the printed
    ratio: at times of about 10 us the rounding of the times alone moves num / den
    by more than 0.01."""
    lo = (num - half_ulp_values) / (den + half_ulp_values) - half_ulp_ratio
    hi = (num + half_ulp_values) / (den - half_ulp_values) + half_ulp_ratio
    return lo <= ratio <= hi


def fake_bench(directory, medians):
    """A build directory whose tools/asap_bench prints the given median (seconds) per --only operator, and
    half of it as the run's fastest call (min_s)."""
    os.makedirs(os.path.join(directory, "tools"), exist_ok=True)
    with open(os.path.join(directory, "libasap.so.0"), "w") as f:
        f.write("a stand-in for the library\n")
    path = os.path.join(directory, "tools", "asap_bench")
    table = " ".join(f"{op}={t}" for op, t in medians.items())
    with open(path, "w") as f:
        f.write(f"#!/bin/sh\necho \"$*\" >> '{directory}/args.log'\n"
                f"echo \"${{LD_LIBRARY_PATH%%:*}}\" >> '{directory}/libdirs.log'\n"
                "op=''\nwhile [ $# -gt 0 ]; do [ \"$1\" = --only ] && op=$2; shift; done\n"
                f"for kv in {table}; do [ \"${{kv%%=*}}\" = \"$op\" ] && "
                "printf '{\"results\": [{\"median_s\": %s, \"min_s\": %s}]}\\n' \"${kv#*=}\" "
                "\"$(echo \"${kv#*=}\" | awk '{print $1 / 2}')\"; done\nexit 0\n")
    os.chmod(path, 0o755)


@test
def build_ab_and_pair_ratios_print_the_least_medians_and_their_ratio():
    with tempfile.TemporaryDirectory() as d:
        old, new = os.path.join(d, "old"), os.path.join(d, "new")
        fake_bench(old, {"asap_1": 2e-4, "sinkhorn_1": 1e-4})
        fake_bench(new, {"asap_1": 1.5e-4, "sinkhorn_1": 1e-4})
        env = dict(os.environ, ROUNDS="2")
        ab = os.path.join(TOOLS, "experiments", "build_ab.sh")
        r = subprocess.run([ab, old, new, "17", "16", "1", "16", "asap_1"], capture_output=True, text=True, env=env)
        assert r.returncode == 0, r.stderr
        assert "old     200.0 us" in r.stdout and "new     150.0 us" in r.stdout and "new/old 0.750" in r.stdout, r.stdout
        # STAT=min: the least of each run's fastest call instead of its median.
        r = subprocess.run([ab, old, new, "17", "16", "1", "16", "asap_1"], capture_output=True, text=True,
                           env=dict(env, STAT="min"))
        assert r.returncode == 0, r.stderr
        assert "least min" in r.stdout and "old     100.0 us" in r.stdout and "new      75.0 us" in r.stdout, r.stdout
        r = subprocess.run([ab, old, new, "17", "16", "1", "16", "asap_1"], capture_output=True, text=True,
                           env=dict(env, STAT="max"))
        assert r.returncode == 2 and "expected STAT median or min, found 'max'" in r.stderr, r.stderr
        r = subprocess.run([ab, os.path.join(d, "none"), new, "17", "16", "1", "16", "asap_1"], capture_output=True,
                           text=True, env=env)
        assert r.returncode != 0 and "expected an asap_bench at" in r.stderr and "none" in r.stderr, r.stderr
        pr = os.path.join(TOOLS, "experiments", "pair_ratios.sh")
        r = subprocess.run([pr, "17", "16", "1", "0", "sinkhorn_1:asap_1"], capture_output=True, text=True,
                           env=dict(env, BENCH=os.path.join(old, "tools", "asap_bench")))
        assert r.returncode == 0, r.stderr
        assert "ratio 2.000" in r.stdout, r.stdout
        r = subprocess.run([pr, "17", "16", "1", "0", "bad"], capture_output=True, text=True, env=env)
        assert r.returncode == 2 and "expected A:B, found 'bad'" in r.stderr, r.stderr
        # BENCH_ARGS reaches every asap_bench call of both tools (a padded batch: --lengths).
        for f in ("old", "new"):
            open(os.path.join(d, f, "args.log"), "w").close()
        r = subprocess.run([ab, old, new, "17", "16", "1", "16", "asap_1"], capture_output=True, text=True,
                           env=dict(env, BENCH_ARGS="--lengths 5,11"))
        assert r.returncode == 0, r.stderr
        r = subprocess.run([pr, "17", "16", "1", "0", "sinkhorn_1:asap_1"], capture_output=True, text=True,
                           env=dict(env, BENCH=os.path.join(old, "tools", "asap_bench"), BENCH_ARGS="--lengths 5,11"))
        assert r.returncode == 0, r.stderr
        calls = {f: open(os.path.join(d, f, "args.log")).read().splitlines() for f in ("old", "new")}
        assert len(calls["old"]) == 2 + 4 and len(calls["new"]) == 2, calls
        assert all("--lengths 5,11" in c for f in calls for c in calls[f]), calls
        # Each round loads a fresh copy of each build's library (COPY=1, the
        # default), the build directory's own with COPY=0.
        for f in ("old", "new"):
            open(os.path.join(d, f, "libdirs.log"), "w").close()
        r = subprocess.run([ab, old, new, "17", "16", "1", "16", "asap_1"], capture_output=True, text=True, env=env)
        assert r.returncode == 0 and "median of the rounds' ratios 0.750" in r.stdout, r.stdout + r.stderr
        dirs = open(os.path.join(d, "new", "libdirs.log")).read().split()
        assert len(set(dirs)) == 2 and new not in dirs, dirs
        open(os.path.join(d, "new", "libdirs.log"), "w").close()
        r = subprocess.run([ab, old, new, "17", "16", "1", "16", "asap_1"], capture_output=True, text=True,
                           env=dict(env, COPY="0"))
        assert r.returncode == 0, r.stderr
        assert open(os.path.join(d, "new", "libdirs.log")).read().split() == [new, new]
        os.remove(os.path.join(new, "libasap.so.0"))
        r = subprocess.run([ab, old, new, "17", "16", "1", "16", "asap_1"], capture_output=True, text=True, env=env)
        assert r.returncode == 2 and "expected the library at" in r.stderr and new in r.stderr, r.stderr


@test
def asap_bench_lengths_time_a_padded_batch_and_bad_lists_are_refused():
    bench = os.environ.get("ASAP_BENCH") or os.path.join(REPO, "build", "tools", "asap_bench")
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "b.json")
        r = subprocess.run([bench, "--n", "8", "--bh", "2x1", "--d", "4", "--T", "2", "--k", "1", "--slices", "0",
                            "--reps", "1", "--no-mem", "--threads", "1", "--lengths", "3,8",
                            "--only", "teacher_fast_2,sinkhorn_1", "--json", out], capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
        j = json.load(open(out))
        assert j["settings"]["lengths"] == [3, 8], j["settings"]
        assert sorted(x["op"] for x in j["results"]) == ["sinkhorn", "teacher_fast"], j["results"]
    # The mask reaches the operators: on the same seeded inputs, with and
    # without --lengths, every asapc operator's output changes and the ATen
    # softmax baseline's (which ignores the mask) does not.
    ops = "softmax,teacher_fast_2,layer_teacher_2,sinkhorn_1,layer_sinkhorn_1,asap_1,asap_sm_1,asap_s3_1,layer_s3_1"

    def sums(*extra):
        with tempfile.TemporaryDirectory() as d:
            out = os.path.join(d, "b.json")
            r = subprocess.run([bench, "--n", "8", "--bh", "2x2", "--d", "4", "--T", "2", "--k", "1", "--slices", "0",
                                "--reps", "1", "--no-mem", "--threads", "1", "--only", ops, "--json", out] + list(extra),
                               capture_output=True, text=True)
            assert r.returncode == 0, r.stderr
            return {x["op"] + "_%d" % x["param"]: x["output_sum"] for x in json.load(open(out))["results"]}

    plain, padded = sums(), sums("--lengths", "3,8")
    assert sorted(plain) == sorted(padded) and len(plain) == 9, (plain, padded)
    # Sinkhorn T' through run_layer (as compile and verify time it) is the
    # fused normalizer's T' (the same kernels, so the same sums).
    for s in (plain, padded):
        assert abs(s["layer_sinkhorn_1"] - s["sinkhorn_1"]) <= 1e-6 * (1 + abs(s["sinkhorn_1"])), s
    for op in plain:
        assert math.isfinite(plain[op]) and math.isfinite(padded[op]), (op, plain[op], padded[op])
        if op == "softmax_0":
            assert plain[op] == padded[op], (op, plain[op], padded[op])
        else:
            assert abs(plain[op] - padded[op]) > 1e-6 * (1 + abs(plain[op])), (op, plain[op], padded[op])
    for args, msg in ((["--lengths", "x"], "--lengths: expected a comma-separated list of integers, found 'x'"),
                      (["--lengths", "3,,4"], "--lengths: expected a comma-separated list of integers, found '3,,4'"),
                      (["--lengths", "0"], "--lengths: expected lengths of 1 or more, found 0"),
                      (["--n", "1x7"], "--n: expected a comma-separated list of integers, found '1x7'")):
        r = subprocess.run([bench] + args + ["--only", "sinkhorn_1"], capture_output=True, text=True)
        assert r.returncode != 0 and msg in r.stderr, (args, r.returncode, r.stderr)
    # An --only that names no operator of the run (sinkhorn_4 needs 4 in --k)
    # is refused in one sentence; it used to crash on an empty operator list.
    r = subprocess.run([bench, "--n", "8", "--bh", "2x1", "--d", "4", "--T", "2", "--k", "1", "--slices", "0",
                        "--reps", "1", "--no-mem", "--threads", "1", "--only", "sinkhorn_4"],
                       capture_output=True, text=True)
    assert r.returncode == 1 and "--only: expected operators of this run at n = 8 (" in r.stderr \
        and "sinkhorn_1" in r.stderr and "found 'sinkhorn_4'" in r.stderr, (r.returncode, r.stderr)


@test
def released_vit_refuses_missing_files_and_unknown_configs():
    # tools/experiments/released_vit.{py,sh}: the files they need are named
    # when missing, an unknown --config is refused, and nothing is trained.
    py = os.path.join(TOOLS, "experiments", "released_vit.py")
    with tempfile.TemporaryDirectory() as d:
        missing = os.path.join(d, "nope.pt")
        r = subprocess.run([sys.executable, py, "agree", missing, os.path.join(d, "a.asap.h5")],
                           capture_output=True, text=True)
        assert r.returncode == 2 and "expected the file '%s'" % missing in r.stderr, (r.returncode, r.stderr)
        r = subprocess.run([sys.executable, py, "agree", missing, "x", "--config", "vit9"], capture_output=True,
                           text=True)
        assert r.returncode != 0 and "--config expects one of released, released4, p4, found 'vit9'" in r.stderr, r.stderr
        sh = os.path.join(TOOLS, "experiments", "released_vit.sh")
        r = subprocess.run([sh, d], capture_output=True, text=True,
                           env=dict(os.environ, ASAPC=os.path.join(d, "no-asapc")))
        assert r.returncode == 2 and "expected the asapc binary" in r.stderr, r.stderr
        assert os.listdir(d) == [], os.listdir(d)

@test
def released_vit_row0_error_reads_the_class_token_row():
    # released_vit.py's attention_errors: the second number is the class
    # token's row (row 0) alone, the first the whole matrix, each relative to
    # the reference and averaged over examples and heads.
    import importlib.util
    import torch
    spec = importlib.util.spec_from_file_location("released_vit", os.path.join(TOOLS, "experiments", "released_vit.py"))
    rv = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(rv)
    g = torch.Generator().manual_seed(3)
    ref = torch.rand(4, 2, 5, 5, generator=g, dtype=torch.float64) + 0.1
    other = ref.clone()
    other[..., 1, :] *= 1.5  # a row other than the class token's
    whole, row0 = rv.attention_errors(other, ref)
    want = float(((0.5 * ref[..., 1, :]).norm(dim=-1) / ref.flatten(-2).norm(dim=-1)).mean())
    assert row0 == 0.0 and abs(whole - want) < 1e-12, (whole, row0, want)
    cls = ref.clone()
    cls[..., 0, :] *= 1.5
    whole, row0 = rv.attention_errors(cls, ref)
    assert abs(row0 - 0.5) < 1e-12 and 0 < whole < 0.5, (whole, row0)


@test
def scaling_domain_prototype_matches_the_log_domain_and_refuses_wide_scores():
    # tools/experiments/scaling_domain.{sh,cpp}: the scaling-domain loop gives
    # the log-domain plan to float32 rounding on ViT-like scores, its range
    # check refuses text-like ones, and the estimate is T'=1 plus T of the
    # prototype's passes (a fake asap_bench: T'=1 10 us, T'=T 20 us).
    import re
    sh = os.path.join(TOOLS, "experiments", "scaling_domain.sh")
    with tempfile.TemporaryDirectory() as d:
        bench = os.path.join(d, "asap_bench")
        with open(bench, "w") as f:
            f.write("#!/bin/sh\nT=1\nwhile [ $# -gt 0 ]; do [ \"$1\" = --T ] && T=$2; shift; done\n"
                    "printf '{\"results\": [{\"op\": \"sinkhorn\", \"param\": 1, \"median_s\": 1e-5}, "
                    "{\"op\": \"sinkhorn\", \"param\": %s, \"median_s\": 2e-5}]}\\n' $T\n")
        os.chmod(bench, 0o755)
        env = dict(os.environ, BENCH=bench, OUT=os.path.join(d, "proto"))
        r = subprocess.run([sh, "3"], capture_output=True, text=True, env=env)
        assert r.returncode == 0, r.stderr
        diffs = [float(x) for x in re.findall(r"largest \|plan difference\| (\S+);", r.stdout)]
        assert len(diffs) == 4 and max(diffs[:3]) < 1e-5 and diffs[3] > 1e-3, r.stdout
        assert r.stdout.count("scaling domain usable") == 3 and r.stdout.count("log domain needed") == 1, r.stdout
        passes = [float(x) for x in re.findall(r"the passes (\S+) us a pass a head", r.stdout)]
        est = [float(x) for x in re.findall(r"prototype's passes (\S+) us", r.stdout)]
        assert len(est) == 3 and abs(est[0] - (10 + 5 * passes[0] * 16)) < 0.06, (est, passes)
        assert abs(est[1] - (10 + 6 * passes[1] * 64)) < 0.06 and abs(est[2] - (10 + 6 * passes[2] * 64)) < 0.06, (est, passes)
        # the bundled teacher's scores: both layers in range
        assert r.stdout.count("(in range)") == 2, r.stdout
        r = subprocess.run([sh, "x"], capture_output=True, text=True, env=env)
        assert r.returncode == 2 and "expected REPS as a positive integer, found 'x'" in r.stderr, r.stderr


@test
def heads_in_lanes_prototype_matches_float64_and_fits_the_fused_line():
    # tools/experiments/heads_in_lanes.{sh,cpp}: the lanes loop gives the
    # float64 loop's output to float32 rounding, and F and p are the line
    # through T' = 2, 4, 6 (a fake asap_bench: 10 + 2 T' us, so F = 10,
    # p = 2 and (F + 6p) / (F + 4p) = 22 / 18); a head with an infinite value
    # comes out all NaN.
    import re
    sh = os.path.join(TOOLS, "experiments", "heads_in_lanes.sh")
    with tempfile.TemporaryDirectory() as d:
        bench = os.path.join(d, "asap_bench")
        with open(bench, "w") as f:
            f.write("#!/bin/sh\nprintf '{\"results\": [")
            f.write(", ".join('{\"op\": \"layer_sinkhorn\", \"param\": %d, \"median_s\": %g}' % (t, (10 + 2 * t) * 1e-6)
                              for t in (1, 2, 4, 6)))
            f.write("]}\\n'\n")
        os.chmod(bench, 0o755)
        env = dict(os.environ, BENCH=bench, OUT=os.path.join(d, "proto"))
        # d = 16: a multiple of the prototype's lane count with AVX2 (8) and AVX-512 (16)
        r = subprocess.run([sh, "1", "17:16 9:16"], capture_output=True, text=True, env=env)
        assert r.returncode == 0, r.stderr
        diffs = [float(x) for x in re.findall(r"max \|diff\| (\S+)\)", r.stdout)]
        assert len(diffs) == 2 and max(diffs) < 1e-5, r.stdout
        fused = re.findall(r"^fused: F = (\S+) us, p = (\S+) us a pass, F/p = (\S+), \(F \+ 6p\) / \(F \+ 4p\) = (\S+)$",
                           r.stdout, re.M)
        assert fused == [("10.0", "2.0", "5.00", "1.222")] * 2, r.stdout
        rows = re.findall(r"^\s+(\d)\s+(\S+)\s+(\S+)\s+(\S+)$", r.stdout, re.M)
        assert [x[0] for x in rows] == ["1", "2", "4", "6"] * 2, r.stdout
        for t, f_us, l_us, ratio in rows:
            assert float(f_us) == 10 + 2 * int(t) and float(l_us) > 0, rows
            assert printed_ratio_agrees(float(ratio), float(f_us), float(l_us)), rows
        assert r.stdout.count("lanes: F = ") == 2, r.stdout
        proto = subprocess.run([os.path.join(d, "proto"), "9", "16", "16", "1", "1,2"], capture_output=True, text=True)
        assert proto.returncode == 0, proto.stderr
        assert "its head's output all NaN yes, the other heads unchanged yes" in proto.stdout, proto.stdout
        for args, msg in ((["x"], "expected ROUNDS as a positive integer, found 'x'"),
                          (["1", "17:x"], "expected N:D, found '17:x'"),
                          (["1", "17:12"], "expected D a multiple of ")):
            r = subprocess.run([sh] + args, capture_output=True, text=True, env=env)
            assert r.returncode == 2 and msg in r.stderr, (args, r.returncode, r.stderr)


def write_runs(d, runs):
    """asap_bench --json runs of made-up results, one file per name, in directory d."""
    for name, results in runs.items():
        with open(os.path.join(d, name), "w") as f:
            json.dump({"machine": {"cpu": "test cpu", "threads": 2}, "results": results}, f)


@test
def overhead_report_gives_the_pass_families_and_alpha_stats_apart():
    # tools/bench/overhead_report.py (bench.sh --overhead's summary) on two
    # made-up runs, ratios by hand. Slice-free, n = 17: T' = 1, 3, 4 take 10,
    # 20, 25; alpha k = 1 10.4 (1.04x of T' = 1), alpha k = 3 21.2 (1.06x of
    # T' = 3: the pass families' largest, missed), alpha+stats k = 3 24 (1.20x
    # of T' = 3, 0.96x of T' = 4), alpha+cstats k = 3 26 (1.30x of T' = 3,
    # 1.04x of T' = 4: a line of its own, not in the pass families'), the
    # 4-pass alpha+softmax+sinkhorn3+cstats k = 1 28 (1.12x of T' = 4, 0.93x
    # of T' = 5, T' = 5 taking 30: its passes are k + 3). n = 128
    # (outside 17-64): alpha k = 1 at 3x must not count. 16 slices, n = 32:
    # alpha k = 1 12 against 10 (1.20x, met), no alpha+stats. OUT gets both
    # runs' timings.
    def res(op, param, n, ms, bound=None):
        return {"op": op, "param": param, "n": n, "B": 16, "H": 4, "median_s": ms * 1e-3, "bound_s": None,
                "bound_ratio": bound}
    runs = {"a.json": [res("sinkhorn", 1, 17, 10), res("sinkhorn", 3, 17, 20), res("sinkhorn", 4, 17, 25),
                       res("asap", 1, 17, 10.4), res("asap", 3, 17, 21.2), res("asap_st", 3, 17, 24),
                       res("asap_cst", 3, 17, 26), res("sinkhorn", 5, 17, 30), res("asap_s3c", 1, 17, 28),
                       res("sinkhorn", 1, 128, 10), res("asap", 1, 128, 30)],
            "b.json": [res("sinkhorn", 1, 32, 10), res("asap", 1, 32, 12)]}
    tool = os.path.join(TOOLS, "bench", "overhead_report.py")
    with tempfile.TemporaryDirectory() as d:
        write_runs(d, runs)
        index = os.path.join(d, "index")
        with open(index, "w") as f:
            f.write("active 16 0 %s\nactive 16 16 %s\n" % (os.path.join(d, "a.json"), os.path.join(d, "b.json")))
        out = os.path.join(d, "out.json")
        r = subprocess.run([sys.executable, tool, index, out], capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
        lines = [x.split() for x in r.stdout.splitlines() if x.startswith("  active")]
        assert [" ".join(x) for x in lines] == [
            "active d=16 slice-free 1.06x (alpha k=3 at n=17) MISSED (target 1.05x)",
            "active d=16 slice-free alpha+stats: 1.20x of T' = passes (k=3 at n=17), 0.96x of T' = passes + 1 "
            "(k=3 at n=17)",
            "active d=16 slice-free alpha+cstats: 1.30x of T' = passes (k=3 at n=17), 1.04x of T' = passes + 1 "
            "(k=3 at n=17)",
            "active d=16 slice-free alpha+softmax+sinkhorn3+cstats: 1.12x of T' = passes (k=1 at n=17), 0.93x of "
            "T' = passes + 1 (k=1 at n=17)",
            "active d=16 16 slices 1.20x (alpha k=1 at n=32) met"], r.stdout
        assert "| 128 | alpha | 1 | 1 | 30.0000 | 10.0000 | 3.00x |" in r.stdout, r.stdout
        blocks = json.load(open(out))
        assert [(b["slices"], len(b["results"])) for b in blocks] == [(0, 11), (16, 2)], blocks
        assert not os.path.exists(out + ".tmp")
        # Bad input: one sentence naming the file, exit 2, OUT untouched.
        with open(index, "w") as f:
            f.write("active 16 %s\n" % os.path.join(d, "a.json"))
        e = subprocess.run([sys.executable, tool, index, out + "2"], capture_output=True, text=True)
        assert e.returncode == 2 and "expected lines 'POLICY D SLICES PATH [PATH...]'" in e.stderr and index in e.stderr, e.stderr
        with open(index, "w") as f:
            f.write("active 16 0 %s\n" % os.path.join(d, "missing.json"))
        e = subprocess.run([sys.executable, tool, index, out + "2"], capture_output=True, text=True)
        assert e.returncode == 2 and "cannot read the asap_bench run" in e.stderr and "missing.json" in e.stderr, \
            e.stderr
        assert not os.path.exists(out + "2")


@test
def overhead_report_takes_each_operator_median_over_library_copies():
    # One setting timed in three runs (bench.sh: one per copy of libasap):
    # alpha k = 3 takes 22.0, 20.6 and 21.0 ms, T' = 3 19, 20 and 21 ms: the
    # times are the medians, 21.0 and 20.0, the ratio the median of the
    # runs' own ratios (1.158, 1.03, 1.0): 1.03x, met (the ratio of the
    # medians would be 1.05x, the first run alone 1.16x, the mean ratio
    # 1.06x). OUT keeps every run's time. A run without one of the
    # operators is refused.
    def res(op, param, ms, bound=None):
        return {"op": op, "param": param, "n": 17, "B": 16, "H": 4, "median_s": ms * 1e-3,
                "bound_s": bound and bound * 1e-3, "bound_ratio": bound and ms / bound}
    runs = {"c1.json": [res("sinkhorn", 3, 19), res("asap", 3, 22.0, 7.0)],
            "c2.json": [res("sinkhorn", 3, 20), res("asap", 3, 20.6, 7.0)],
            "c3.json": [res("sinkhorn", 3, 21), res("asap", 3, 21.0, 7.0)],
            "short.json": [res("sinkhorn", 3, 20)]}
    tool = os.path.join(TOOLS, "bench", "overhead_report.py")
    with tempfile.TemporaryDirectory() as d:
        write_runs(d, runs)
        index = os.path.join(d, "index")
        with open(index, "w") as f:
            f.write("active 16 0 %s\n" % " ".join(os.path.join(d, c) for c in ("c1.json", "c2.json", "c3.json")))
        out = os.path.join(d, "out.json")
        r = subprocess.run([sys.executable, tool, index, out], capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
        assert "| 17 | alpha | 3 | 3 | 21.0000 | 20.0000 | 1.03x |" in r.stdout, r.stdout
        assert "1.03x (alpha k=3 at n=17) met" in r.stdout, r.stdout
        block = json.load(open(out))[0]
        times = {(x["op"], x["param"]): x for x in block["results"]}
        assert times[("asap", 3)]["copies_median_s"] == [0.022, 0.0206, 0.021], times
        assert abs(times[("asap", 3)]["bound_ratio"] - 3.0) < 1e-9, times
        with open(index, "w") as f:
            f.write("active 16 0 %s %s\n" % (os.path.join(d, "c1.json"), os.path.join(d, "short.json")))
        e = subprocess.run([sys.executable, tool, index], capture_output=True, text=True)
        assert e.returncode == 2 and "do not all time asap_3 at n = 17" in e.stderr and "short.json" in e.stderr, \
            e.stderr


@test
def overhead_report_gives_the_loop_ladder_against_the_teacher():
    # The ladder of overhead_report.py on made-up runs, by hand. Slice-free,
    # n = 17: teacher T = 6 50 ms, T' = 1..6 26, 32, 36, 41, 46, 51: speed-ups
    # 1.92x 1.56x 1.39x 1.22x 1.09x 0.98x, a pass (51 - 26) / 5 = 5 ms, the
    # rest 26 - 5 = 21 ms (4.2 passes); T' <= 3 reach 1.25x. n = 128 (outside
    # 17-64) is in the table, not in the summary; n = 32 lacks T' = 5 and gets
    # no row; the 16-slice run, with the same timings, gets none either. The
    # summary's cases below: none, every T', exactly 1.25x, a noisy T'.
    def res(op, param, n, ms):
        return {"op": op, "param": param, "n": n, "B": 16, "H": 4, "median_s": ms * 1e-3, "bound_s": None,
                "bound_ratio": None}
    ladder = [26, 32, 36, 41, 46, 51]

    def shape(n, loops=ladder):
        return [res("teacher_fast", 6, n, 50)] + [res("sinkhorn", p, n, ms) for p, ms in loops]
    free = shape(17, enumerate(ladder, 1)) + shape(128, enumerate([10, 20, 30, 40, 50, 60], 1)) + \
        shape(32, [(p, ms) for p, ms in enumerate(ladder, 1) if p != 5])
    # n = 50: none at 1.25x (T' = 1 at 50 / 45). n = 64: T' = 2 at 1.25 exactly (0.625 / 0.5 s, binary
    # fractions: it counts). n = 60: T' = 4 at 50 / 39 is past a slower T' = 3 (50 / 42), so the
    # count stops at 2. n = 40: every T' <= 6 at 1.25x or more.
    free += shape(50, enumerate([45, 46, 47, 48, 49, 50], 1))
    free += [{"op": "teacher_fast", "param": 6, "n": 64, "B": 16, "H": 4, "median_s": 0.625, "bound_s": None,
              "bound_ratio": None}] + [{"op": "sinkhorn", "param": p, "n": 64, "B": 16, "H": 4, "median_s": x,
                                        "bound_s": None, "bound_ratio": None}
                                       for p, x in enumerate([0.25, 0.5, 0.5625, 0.55, 0.6, 0.625], 1)]
    free += shape(60, enumerate([10, 20, 42, 39, 45, 48], 1))
    free += shape(40, enumerate([10, 20, 30, 35, 38, 39], 1))
    tool = os.path.join(TOOLS, "bench", "overhead_report.py")
    with tempfile.TemporaryDirectory() as d:
        for name, results in (("free.json", free), ("sliced.json", shape(17, enumerate(ladder, 1)))):
            with open(os.path.join(d, name), "w") as f:
                json.dump({"machine": {"cpu": "test cpu", "threads": 2}, "results": results}, f)
        index = os.path.join(d, "index")
        with open(index, "w") as f:
            f.write("active 16 0 %s\nactive 16 16 %s\n" % (os.path.join(d, "free.json"), os.path.join(d, "sliced.json")))
        r = subprocess.run([sys.executable, tool, index], capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
        rows = [x for x in r.stdout.splitlines() if x.startswith("| active |")]
        assert rows[0] == ("| active | 16 | 17 | 50.0000 | 1.92x | 1.56x | 1.39x | 1.22x | 1.09x | 0.98x | 5.0000 | "
                           "21.0000 ms (4.2 passes) |"), r.stdout
        assert rows[-1] == ("| active | 16 | 128 | 50.0000 | 5.00x | 2.50x | 1.67x | 1.25x | 1.00x | 0.83x | 10.0000 | "
                            "0.0000 ms (0.0 passes) |"), r.stdout
        assert [x.split(" | ")[2] for x in rows] == ["17", "40", "50", "60", "64", "128"], rows
        head = "The most passes at 1.25x the teacher T = 6 or more, n = 17-64:"
        summary = [" ".join(x.split()) for x in r.stdout.split(head, 1)[1].splitlines() if x.strip()]
        assert summary == ["active d=16 n=17 T' <= 3 (T' = 4: 1.220x)",
                           "active d=16 n=40 T' <= 6 (every T' <= 6)",
                           "active d=16 n=50 none (T' = 1: 1.111x)",
                           "active d=16 n=60 T' <= 2 (T' = 3: 1.190x)",
                           "active d=16 n=64 T' <= 2 (T' = 3: 1.111x)"], r.stdout
        # no teacher timed: no ladder at all
        with open(os.path.join(d, "free.json"), "w") as f:
            json.dump({"machine": {"cpu": "test cpu", "threads": 2},
                       "results": [x for x in free if x["op"] != "teacher_fast"]}, f)
        r = subprocess.run([sys.executable, tool, index], capture_output=True, text=True)
        assert r.returncode == 0 and "loop ladder" not in r.stdout, r.stdout


@test
def fork_join_times_the_team_with_the_threads_asked_for():
    # tools/experiments/fork_join.{sh,cpp}: the two fork/join timings on the
    # thread count given (2 here; LibTorch's own default in Debian's build is
    # 1), then the spinning round trip and the system call for scale, and bad
    # arguments refused in one sentence.
    import re
    sh = os.path.join(TOOLS, "experiments", "fork_join.sh")
    r = subprocess.run([sh, "2", "active"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    rows = re.findall(r"^(.+?)\s+median (\S+) us \((\d+) threads\)$", r.stdout, re.M)
    assert [x[0].strip() for x in rows] == ["at::parallel_for(0, 64, 1)", "#pragma omp parallel",
                                            "spinning flag round trip", "one system call (getppid)"], r.stdout
    assert all(float(x[1]) > 0 and x[2] == "2" for x in rows), rows
    for args, msg in ((["0"], "expected THREADS as a positive integer, found '0'"),
                      (["2", "spin"], "expected WAIT_POLICY active or passive, found 'spin'")):
        r = subprocess.run([sh] + args, capture_output=True, text=True)
        assert r.returncode == 2 and msg in r.stderr, (args, r.returncode, r.stderr)


@test
def pass_costs_times_both_row_paths_and_they_agree():
    # tools/experiments/pass_costs.{sh,cpp}: a row of six positive times per
    # path (transposed row passes on and off), the derived line, and the two
    # paths' outputs equal to float32 rounding (n = 9 runs both: 9 rows are
    # past kTransposedMinRows); bad arguments refused in one sentence.
    import re
    sh = os.path.join(TOOLS, "experiments", "pass_costs.sh")
    env = dict(os.environ, ASAP_BUILD=os.environ.get("ASAP_BUILD_DIR") or os.path.join(REPO, "build"))
    r = subprocess.run([sh, "9", "8", "1", "2"], capture_output=True, text=True, env=env)
    assert r.returncode == 0, r.stderr
    rows = re.findall(r"^(transposed \(default\)|in place)\s+((?:\s*\S+){6})$", r.stdout, re.M)
    assert [x[0] for x in rows] == ["transposed (default)", "in place"], r.stdout
    assert all(float(t) > 0 for x in rows for t in x[1].split()), rows
    # the derived line, recomputed here from the printed times of the default path
    m = re.search(r"^transposed: a row and a column pass \(r \+ c\) (-?\d+\.\d) us; ending on a column pass costs "
                  r"(-?\d+\.\d) us more", r.stdout, re.M)
    assert m, r.stdout
    b = [None] + [float(t) for t in rows[0][1].split()]
    pair = ((b[3] - b[1]) + (b[5] - b[3]) + (b[4] - b[2]) + (b[6] - b[4])) / 4
    end = ((b[2] - b[1]) - (b[3] - b[2])) / 2
    assert abs(float(m.group(1)) - pair) < 0.15 and abs(float(m.group(2)) - end) < 0.15, (m.groups(), pair, end)
    diff = float(re.search(r"max relative difference (\S+)$", r.stdout, re.M).group(1))
    assert diff < 1e-5, r.stdout
    for args, msg in ((["0"], "expected N as a positive integer, found '0'"),
                      (["9", "8", "x"], "expected ROUNDS as a positive integer, found 'x'")):
        r = subprocess.run([sh] + args, capture_output=True, text=True, env=env)
        assert r.returncode == 2 and msg in r.stderr, (args, r.returncode, r.stderr)
    with tempfile.TemporaryDirectory() as d:
        r = subprocess.run([sh], capture_output=True, text=True, env=dict(env, ASAP_BUILD=d))
        assert r.returncode == 2 and "expected libasap.so in '%s'" % d in r.stderr, (r.returncode, r.stderr)


@test
def ftz_ab_times_both_modes_and_refuses_bad_input():
    # tools/experiments/ftz_ab.{sh,cpp}: one row per operator with positive times in
    # both modes (the tool exits 1 when a thread of the team does not read the MXCSR
    # bits back), their ratio as printed, and equal outputs: both modes time the same
    # operator on the same inputs (the bits only touch subnormals, and none reaches
    # an output of these calls); bad arguments and a build without libasap refused
    # in one sentence.
    import re
    import platform
    if platform.machine() != "x86_64":
        return
    sh = os.path.join(TOOLS, "experiments", "ftz_ab.sh")
    env = dict(os.environ, ASAP_BUILD=os.environ.get("ASAP_BUILD_DIR") or os.path.join(REPO, "build"))
    r = subprocess.run([sh, "9", "8", "2", "1", "3", "6"], capture_output=True, text=True, env=env)
    assert r.returncode == 0, r.stderr
    rows = re.findall(r"^(teacher T = 6|Sinkhorn T' = 4)\s+(\S+)\s+(\S+)\s+(\S+)$", r.stdout, re.M)
    assert [x[0] for x in rows] == ["teacher T = 6", "Sinkhorn T' = 4"], r.stdout
    for _, a, b, ratio in rows:
        assert float(a) > 0 and float(b) > 0, rows
        assert printed_ratio_agrees(float(ratio), float(b), float(a), half_ulp_ratio=0.0005), rows
    diff = float(re.search(r"max absolute difference (\S+)$", r.stdout, re.M).group(1))
    assert diff == 0, r.stdout
    for args, msg in ((["0"], "expected N as a positive integer, found '0'"),
                      (["9", "8", "2", "1", "3", "-1"], "expected QK_SCALE as a positive number, found '-1'")):
        r = subprocess.run([sh] + args, capture_output=True, text=True, env=env)
        assert r.returncode == 2 and msg in r.stderr, (args, r.returncode, r.stderr)
    with tempfile.TemporaryDirectory() as d:
        r = subprocess.run([sh], capture_output=True, text=True, env=dict(env, ASAP_BUILD=d))
        assert r.returncode == 2 and "expected libasap.so in '%s'" % d in r.stderr, (r.returncode, r.stderr)


@test
def thread_switch_times_both_modes_and_refuses_another():
    # tools/experiments/thread_switch.{sh,cpp}: one line per mode asked for, ending on
    # LibTorch's thread count after the switches (2); a mode other than 0 or 1 is
    # refused in one sentence (it used to run as mode 1).
    import re
    sh = os.path.join(TOOLS, "experiments", "thread_switch.sh")
    r = subprocess.run([sh, "0", "1", "x"], capture_output=True, text=True)
    rows = re.findall(r"^mode (\d): wall \S+ ms per pair, cpu \S+ ms per pair, get_num_threads (\d+)$", r.stdout, re.M)
    assert rows == [("0", "2"), ("1", "2")], r.stdout
    assert r.returncode == 2 and "expected one argument, 0 (at::set_num_threads) or 1 (omp_set_num_threads), found x" \
        in r.stderr, (r.returncode, r.stderr)

@test
def score_range_finds_the_column_far_below_every_row():
    # tools/experiments/score_range.py on a hand-made layer: one head of
    # width 1, queries 1, 2, 1, keys 20, 0, -140, score scale 2 and eps 4, so
    # S_ij = q_i k_j / 2: row i's maximum is 10 q_i, key 3's column sits
    # 80 q_i below it (worst over rows: -80), and the head's range is
    # (40 + 280) / 2 = 160: past float32's exponent, so the scaling domain
    # cannot run there.
    import torch
    sh = os.path.join(TOOLS, "experiments", "score_range.py")
    with tempfile.TemporaryDirectory() as d:
        pt, spec, calib = (os.path.join(d, f) for f in ("t.pt", "t.spec.json", "t.calib.h5"))
        torch.save({"w": torch.tensor([[1.0, 0.0], [0.0, 1.0], [0.0, 0.0]])}, pt)
        layer = {"name": "attn", "layout": "fused", "qkv": {"weight": "w", "bias": None}, "qkv_order": "qkv",
                 "head_layout": "(h d)", "heads": 1, "head_dim": 1, "score_scale": 2.0, "eps": 4.0}
        with open(spec, "w") as f:
            json.dump({"layers": [layer]}, f)
        with h5py.File(calib, "w") as f:
            f["layers/attn/x"] = [[[1.0, 20.0], [2.0, 0.0], [1.0, -140.0]]]
        r = subprocess.run([sys.executable, sh, pt, spec, calib], capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
        assert "median 160.0, largest 160.0; worst column -80.0 (underflows" in r.stdout, r.stdout
        with h5py.File(calib, "a") as f:
            f["layers/attn/x"][0, 2, 1] = -120.0  # 70 below: under -69
        r = subprocess.run([sys.executable, sh, pt, spec, calib], capture_output=True, text=True)
        assert "worst column -70.0 (underflows" in r.stdout, r.stdout
        with h5py.File(calib, "a") as f:
            f["layers/attn/x"][0, 2, 1] = -100.0
        r = subprocess.run([sys.executable, sh, pt, spec, calib], capture_output=True, text=True)
        assert "worst column -60.0 (in range)" in r.stdout, r.stdout
        r = subprocess.run([sys.executable, sh, pt, spec, os.path.join(d, "none.h5")], capture_output=True, text=True)
        assert r.returncode == 2 and "expected the file '%s'" % os.path.join(d, "none.h5") in r.stderr, r.stderr
        layer["layout"] = "separate"
        with open(spec, "w") as f:
            json.dump({"layers": [layer]}, f)
        r = subprocess.run([sys.executable, sh, pt, spec, calib], capture_output=True, text=True)
        assert r.returncode == 2 and "expected layout 'fused'" in r.stderr and "found 'separate'" in r.stderr, r.stderr
        layer["layout"], layer["name"] = "fused", "other"
        with open(spec, "w") as f:
            json.dump({"layers": [layer]}, f)
        r = subprocess.run([sys.executable, sh, pt, spec, calib], capture_output=True, text=True)
        assert r.returncode == 2 and "expected 'layers/other/x' in" in r.stderr and "found no 'layers/other/x'" in r.stderr, r.stderr



@test
def exp_poly_fits_the_kernels_coefficients_and_bounds_their_error():
    # tools/experiments/exp_poly.py: the coefficients in exp_f32 are the degree-5 fit
    # (to 1e-9), and the float32 emulation of the kernel stays under the 3e-7 that
    # tests/test_fast.cpp asks of the real kernel, against exp in float64.
    sys.path.insert(0, os.path.join(TOOLS, "experiments"))
    import exp_poly
    kernel = exp_poly.kernel_coefficients(exp_poly.KERNELS)
    fitted = exp_poly.fit(5)
    assert len(kernel) == 5 and all(abs(a - b) <= 1e-9 * abs(b) for a, b in zip(kernel, fitted)), (kernel, fitted)
    err = exp_poly.max_rel_error(kernel)
    assert 5e-8 < err < 3e-7, err
    # A one-term shorter polynomial is far off: the emulation sees the difference.
    assert exp_poly.max_rel_error(list(exp_poly.fit(4))) > 1e-6
    py = os.path.join(TOOLS, "experiments", "exp_poly.py")
    with tempfile.TemporaryDirectory() as d:
        copy = os.path.join(d, "k.h")
        with open(exp_poly.KERNELS) as src, open(copy, "w") as dst:
            dst.write(src.read())
        r = subprocess.run([sys.executable, py, "patch", "3", copy], capture_output=True, text=True)
        assert r.returncode == 0 and "degree-3 2^f" in r.stdout, r.stderr
        text = open(copy).read()
        s, e = exp_poly.exp_f32_source(text)
        assert text[s:e].count("p = p * f + ") == 3 and "p = p * r + " not in text[s:e], text[s:e]
        for args, msg in ((["fit", "x"], "expected DEG an integer from 2 to 8, found 'x'"),
                          (["check", os.path.join(d, "none.h")], "expected the kernels file '%s'" % os.path.join(d, "none.h")),
                          (["check", copy], "expected exp_f32's Horner steps 'p = p * r + c'")):
            r = subprocess.run([sys.executable, py] + args, capture_output=True, text=True)
            assert r.returncode != 0 and msg in r.stderr, (args, r.returncode, r.stderr)
        sh = os.path.join(TOOLS, "experiments", "exp_variant.sh")
        for args, msg in ((["9", os.path.join(d, "v")], "expected DEG an integer from 2 to 8, found '9'"),
                          (["3", d], "expected DIR not to exist yet, found '%s'" % d)):
            r = subprocess.run([sh] + args, capture_output=True, text=True)
            assert r.returncode == 2 and msg in r.stderr, (args, r.returncode, r.stderr)


if __name__ == "__main__":
    sys.exit(run(sys.argv[1:]))
