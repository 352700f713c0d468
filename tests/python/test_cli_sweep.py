"""CLI sweep (issue 16): every numeric or list flag of compile, verify and
inspect gets 0, -1, a huge value, NaN, an empty and a malformed value. The
result must be exit 2 with one sentence on stderr. It must never be a
signal, a hang, an internal error (exit 3), or exit 0 for a value the flag
documents as invalid.

Values a flag documents as valid (e.g. --selection-examples 0 = all) are
listed in VALID: they must exit 0. Runs are kept cheap: 24 calibration
examples, 4 slices, no report, and two runs at a time.
"""
import concurrent.futures
import json
import os
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(__file__))
from harness import run, test  # noqa: E402

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
ASAPC = os.environ.get("ASAPC", os.path.join(ROOT, "build", "asapc"))
NAME = os.path.join(ROOT, "calib_data", "vit_mnist_t6")
TMP = tempfile.mkdtemp(prefix="asapc-sweep-")
VALUES = ["0", "-1", "99999999999999", "1e300", "nan", "", "abc"]

COMPILE = [ASAPC, "compile", NAME + ".pt", "--spec", NAME + ".spec.json", "--calib", NAME + ".calib.h5",
           "-o", os.path.join(TMP, "c.asap.h5"), "--max-examples", "24", "--slices", "4", "--no-report", "-q",
           "--objective", "fidelity"]
COMPILE_FLAGS = ["--slices", "--slice-counts", "--fixed-slices", "--features", "--heads-mode", "--ridge",
                 "--ridge-grid", "--kl-ridge", "--kl-iters", "--kl-cache-mb", "--closures", "--max-passes",
                 "--max-closures", "--deploy-batch", "--selection-examples", "--batch-size", "--heldout-fraction",
                 "--seed", "--max-examples", "--threads", "--layers", "--fit", "--dist-timeout", "--latency-table",
                 "--attention-iters", "--attention-patience", "--deploy-threads", "--guard"]
VERIFY = [ASAPC, "verify", NAME + ".pt", "--artifact", os.path.join(TMP, "a.asap.h5"), "--data",
          NAME + ".heldout.h5", "--max-examples", "8", "--no-timing", "-q", "--json-out", os.path.join(TMP, "v.json"),
          "--report", os.path.join(TMP, "v.html")]
VERIFY_FLAGS = ["--max-closures", "--batch-size", "--max-examples", "--repeats", "--split", "--layers", "--threads",
                "--max-attention-error", "--max-output-rmse", "--max-col-marginal-error", "--max-kl"]
INSPECT = [ASAPC, "inspect", NAME + ".pt", "-o", os.path.join(TMP, "s.json"), "--T", "6", "--heads", "4"]
INSPECT_FLAGS = ["--T", "--eps", "--heads", "--score-scale", "--mask"]

# (flag, value) pairs that are valid by the flag's documentation: exit 0.
VALID = {
    ("--slice-counts", "0"), ("--seed", "0"), ("--seed", "99999999999999"), ("--ridge", "0"), ("--kl-ridge", "0"),
    ("--ridge-grid", "0"), ("--selection-examples", "0"), ("--heldout-fraction", "0"), ("--max-examples", "0"),
    ("--threads", "0"), ("--deploy-threads", "0"), ("--max-passes", "0"), ("--closures", "0"), ("--fixed-slices", "0"),
    ("--max-examples", "99999999999999"), ("--selection-examples", "99999999999999"), ("--kl-cache-mb", "0"),
    ("--kl-cache-mb", "99999999999999"), ("--kl-cache-mb", "1e300"), ("--kl-iters", "0"),
    ("--kl-ridge", "99999999999999"), ("--kl-ridge", "1e300"),
    ("--ridge", "99999999999999"), ("--ridge", "1e300"), ("--ridge-grid", "99999999999999"), ("--ridge-grid", "1e300"),
    ("--deploy-batch", "99999999999999"),
    ("--guard", "0"), ("--guard", "99999999999999"), ("--guard", "1e300"), ("--attention-patience", "0"),
    ("--batch-size", "99999999999999"),
    # verify
    ("--repeats", "0"), ("--max-attention-error", "99999999999999"),
    ("--max-attention-error", "1e300"), ("--max-output-rmse", "99999999999999"), ("--max-output-rmse", "1e300"),
    ("--max-col-marginal-error", "99999999999999"), ("--max-col-marginal-error", "1e300"),
    ("--max-kl", "99999999999999"), ("--max-kl", "1e300"),
    # inspect
    ("--eps", "99999999999999"), ("--eps", "1e300"), ("--score-scale", "99999999999999"), ("--score-scale", "1e300"),
    ("--T", "10000"),
}
# Thresholds below the measured value exit 1 (the gate did its job).
GATES = {"--max-attention-error", "--max-output-rmse", "--max-col-marginal-error", "--max-kl"}


def without(base, flag):
    """The base command without `flag` and its value (the sweep sets it)."""
    out, skip = [], False
    for a in base:
        if skip:
            skip = False
        elif a == flag:
            skip = True
        else:
            out.append(a)
    return out


def attempt(base, flag, value, timeout=120):
    argv = without(base, flag) + [flag, value]
    try:
        p = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return flag, value, "hang (> %d s)" % timeout
    errs = [l for l in p.stderr.splitlines() if l.startswith("asapc: error") or "internal error" in l]
    if p.returncode < 0:
        return flag, value, "signal %d" % -p.returncode
    if value == "" and p.returncode == 2 and "was given an empty value" in p.stderr:
        return flag, value, None
    if (flag, value) in VALID:
        return flag, value, None if p.returncode == 0 else "exit %d for a valid value: %s" % (
            p.returncode, p.stderr.strip()[-300:])
    if flag in GATES and p.returncode in (0, 1) and value in ("0", "-1"):
        return flag, value, None if p.returncode == 1 or value == "-1" else "exit %d" % p.returncode
    if p.returncode != 2:
        return flag, value, "exit %d (expected 2): %s" % (p.returncode, p.stderr.strip()[-300:])
    if len(p.stderr.strip().splitlines()) != 1 or len(errs) != 1:
        return flag, value, "not one sentence: %r" % p.stderr[-400:]
    return flag, value, None


def sweep(base, flags):
    jobs = [(base, f, v) for f in flags for v in VALUES]
    with concurrent.futures.ThreadPoolExecutor(max_workers=2) as ex:
        results = list(ex.map(lambda j: attempt(*j), jobs))
    bad = ["%s %r: %s" % (f, v, why) for f, v, why in results if why]
    assert not bad, "\n".join(bad)


@test
def compile_flags():
    sweep(COMPILE, COMPILE_FLAGS)


@test
def verify_flags():
    p = subprocess.run(COMPILE[:7] + ["-o", os.path.join(TMP, "a.asap.h5")] + COMPILE[9:], capture_output=True,
                       text=True)
    assert p.returncode == 0, p.stderr
    sweep(VERIFY, VERIFY_FLAGS)


@test
def inspect_flags():
    sweep(INSPECT, INSPECT_FLAGS)


def one_sentence(p):
    lines = p.stderr.strip().splitlines()
    assert p.returncode == 2, (p.returncode, p.stderr[-500:])
    assert len(lines) == 1 and lines[0].startswith("asapc: error: "), p.stderr[-500:]
    return lines[0]


@test
def dist_timeout_is_at_most_a_week():
    base = without(COMPILE, "--dist-timeout")
    ok = subprocess.run(base + ["--dist-timeout", "604800"], capture_output=True, text=True, timeout=300)
    assert ok.returncode == 0, ok.stderr
    for value in ("604801", "1e300"):
        p = subprocess.run(base + ["--dist-timeout", value], capture_output=True, text=True, timeout=300)
        line = one_sentence(p)
        assert "--dist-timeout takes a number of seconds > 0 and at most 604800 (one week), found '%s'" % value \
            in line, line


@test
def tuning_environment_variables_refuse_bad_values():
    """The fast kernels' environment variables (docs/performance.md) are read
    strictly: a value they do not take is one sentence naming the variable,
    exit 2, not a silent default (ASAP_FAST_WORKSPACE_MB=abc once meant a
    budget of 0). The sort variables are read where slices are sorted, which
    asap_bench's 16-slice map does."""
    art = os.path.join(TMP, "env.asap.h5")
    p = subprocess.run(without(COMPILE[:7] + ["-o", art] + COMPILE[9:], "--fit") + ["--fit", "ls"],
                       capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    verify = [a if a != os.path.join(TMP, "a.asap.h5") else art for a in VERIFY]
    for name, value, expected in (("ASAP_FAST_WORKSPACE_MB", "abc", "expected a number of MiB, 0 or more"),
                                  ("ASAP_FAST_WORKSPACE_MB", "-1", "expected a number of MiB, 0 or more"),
                                  ("ASAP_FAST_ISA", "sse9", "instruction set 'sse9' is not available here")):
        env = dict(os.environ, **{name: value})
        line = one_sentence(subprocess.run(verify, capture_output=True, text=True, env=env))
        assert "environment variable %s: %s" % (name, expected) in line and value in line, line
    ok = subprocess.run(verify, capture_output=True, text=True, env=dict(os.environ, ASAP_FAST_WORKSPACE_MB="0.5"))
    assert ok.returncode == 0, ok.stderr
    bench = [os.path.join(os.path.dirname(ASAPC), "tools", "asap_bench"), "--n", "64", "--bh", "1x1", "--slices", "16",
             "--k", "1", "--reps", "1", "--no-mem", "--only", "asap"]
    for name, value, expected in (("ASAP_FAST_SORT", "fast", "expected auto, scalar or network, found 'fast'"),
                                  ("ASAP_FAST_SORT_NETWORK_MAX", "1.5", "expected a whole number of keys, 0 or more")):
        r = subprocess.run(bench, capture_output=True, text=True, timeout=300,
                           env=dict(os.environ, ASAP_BENCH_REEXEC="1", **{name: value}))
        assert r.returncode != 0 and "environment variable %s: %s" % (name, expected) in r.stderr, (r.returncode,
                                                                                                  r.stderr[-400:])


def alpha_table(asap_extra):
    """A --latency-table for --features alpha --heads-mode pooled (T = 6):
    the teacher 6 s, Sinkhorn T' T' s, the alpha map with k closures k + extra."""
    path = os.path.join(TMP, "alpha%g.json" % asap_extra)
    t = {"teacher": 6.0}
    t.update({"sinkhorn-%d" % p: float(p) for p in range(1, 6)})
    t.update({"asap-alpha-k%d" % k: k + asap_extra for k in range(1, 6)})
    with open(path, "w") as f:
        json.dump({"*": t}, f)
    return path


@test
def no_zero_parameter_finds_a_map_or_names_the_bar():
    # 96 examples: enough held-out ones (19) for a choice on data.
    base = [a for a in without(without(COMPILE, "--objective"), "--max-examples") if a != "fidelity"] + [
        "--max-examples", "96", "--features", "alpha", "--heads-mode", "pooled", "--no-zero-parameter", "--json"]
    p = subprocess.run(base + ["--latency-table", alpha_table(0.3)], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    for layer in json.loads(p.stdout)["layers"]:
        assert layer["chosen"]["operator"] == "asap" and layer["target_met"], layer["chosen"]
    # No map is faster than the teacher (a map of k passes takes k + 10 s).
    p = subprocess.run(base + ["--latency-table", alpha_table(10)], capture_output=True, text=True, timeout=300)
    line = one_sentence(p)
    assert "no ASAP map reaches 1.25x the teacher's speed (--min-speedup), nor is any faster than the teacher" \
        in line and "--no-zero-parameter rules out plain Sinkhorn and the teacher" in line, line
    # No map within the error bound.
    p = subprocess.run(base + ["--latency-table", alpha_table(0.3), "--objective", "max-error", "--max-error",
                               "1e-9"], capture_output=True, text=True, timeout=300)
    line = one_sentence(p)
    assert "no ASAP map reaches held-out attention error 1e-09 (--max-error;" in line, line


if __name__ == "__main__":
    try:
        sys.exit(run(sys.argv[1:]))
    finally:
        shutil.rmtree(TMP, ignore_errors=True)
