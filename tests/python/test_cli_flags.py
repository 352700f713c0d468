"""The verify thresholds, verify --compare, and compile flags that change the
choice (--max-passes, --heads-mode, --features, --ridge-grid), run as a user
would, on the bundled teacher (issue 16, item 12)."""
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
TMP = tempfile.mkdtemp(prefix="asapc-flags-")
BASE = ["--spec", NAME + ".spec.json", "--calib", NAME + ".calib.h5", "--max-examples", "192", "--objective",
        "fidelity", "--no-report", "-q", "--json", "--slices", "16"]


def compile_json(out, *extra):
    p = subprocess.run([ASAPC, "compile", NAME + ".pt", "-o", out, *BASE, *extra], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout)


_art = {}


def artifact():
    if "a" not in _art:
        _art["a"] = os.path.join(TMP, "a.asap.h5")
        compile_json(_art["a"])
    return _art["a"]


def verify(*extra):
    argv = [ASAPC, "verify", NAME + ".pt", "--artifact", artifact(), "--data", NAME + ".heldout.h5",
            "--max-examples", "48", "--no-timing", "-q", "--json-out", os.path.join(TMP, "v.json"),
            "--report", os.path.join(TMP, "v.html"), *extra]
    return subprocess.run(argv, capture_output=True, text=True)


def default_metrics(report):
    out = []
    for layer in report["layers"]:
        for o in layer["operators"]:
            if o["default"]:
                out.append((layer["name"], o["metrics"]))
    return out


@test
def verify_thresholds_gate_the_exit_code():
    p = verify("--json")
    assert p.returncode == 0, p.stderr
    metrics = default_metrics(json.loads(p.stdout))
    for flag, key in (("--max-attention-error", "attention_rel_error"), ("--max-output-rmse", "head_output_rmse"),
                      ("--max-col-marginal-error", "col_marginal_error"), ("--max-kl", "teacher_plan_kl")):
        worst = max(m[key] for _, m in metrics)
        assert worst > 0, (key, worst)
        below = verify(flag, repr(worst * 0.5))
        assert below.returncode == 1, (flag, below.returncode, below.stderr)
        assert key in below.stderr and flag in below.stderr and "exceeds" in below.stderr, below.stderr
        above = verify(flag, repr(worst * 2))
        assert above.returncode == 0, (flag, above.returncode, above.stderr)


@test
def verify_table_shows_the_papers_map():
    # The "compiled:" line puts the stored map next to the paper's plain map
    # (sliced potentials, pooled) at the same k, from compile's record.
    p = verify()
    assert p.returncode == 0, p.stderr
    s = compile_json(os.path.join(TMP, "again.asap.h5"))  # same flags and seed: the same record
    lines = [l for l in p.stdout.splitlines() if l.strip().startswith("compiled:")]
    assert len(lines) == len(s["layers"]), p.stdout[-2000:]
    shown = 0
    for line, layer in zip(lines, s["layers"]):
        k = layer["chosen"].get("closures")
        paper = [c for c in layer["candidates"]
                 if c["features"] == "slices" and not c["per_head"] and c["target"] == "closure-ready"]
        assert len(paper) == 1, [c["candidate"] for c in layer["candidates"]]
        if k is None:
            continue
        err = paper[0]["heldout_attention_error_by_k"][k - 1]
        assert "paper's map (slices, pooled) at k=%d: " % k in line, line
        assert abs(float(line.rsplit(": ", 1)[1]) - err) <= 1e-3 * err + 1e-4, (line, err)
        shown += 1
    assert shown > 0, lines


@test
def verify_compare_shows_both_artifacts():
    other = os.path.join(TMP, "other.asap.h5")
    compile_json(other, "--seed", "7")
    p = verify("--compare", other)
    assert p.returncode == 0, p.stderr
    assert "side by side" in p.stdout, p.stdout[-1500:]
    assert artifact() in p.stdout and other in p.stdout
    j = json.load(open(os.path.join(TMP, "v.json")))
    assert len(j["compare"]) == 1 and j["compare"][0]["artifact"] == other


def operator_errors(layer):
    """(held-out attention error, log-sum-exp passes) of every ASAP operator
    the choice could pick: each fit at each k it was evaluated with (a
    k-matched fit only at its k)."""
    out = []
    for c in layer["candidates"]:
        for k, (err, passes) in enumerate(zip(c["heldout_attention_error_by_k"], c["lse_passes_by_k"]), start=1):
            if err is not None and (c["target"] == "closure-ready" or k == c["target_closures"]):
                out.append((err, passes))
    return out


@test
def max_passes_bounds_the_choice():
    binding = 0
    for budget in (1, 2, 3):
        s = compile_json(os.path.join(TMP, "p%d.asap.h5" % budget), "--max-passes", str(budget))
        for layer in s["layers"]:
            assert layer["pass_budget"] == budget
            chosen = layer["chosen"]
            assert chosen["lse_passes"] <= budget, (budget, chosen)
            ops = operator_errors(layer)
            within = [e for e, p in ops if p <= budget]
            assert within and chosen["heldout_attention_error"] == min(within), (budget, chosen, min(within or [0]))
            # The budget decides: a more accurate operator needs more passes.
            binding += any(e < chosen["heldout_attention_error"] for e, p in ops if p > budget)
    assert binding > 0, "no budget excluded a more accurate operator, so none was tested"


@test
def heads_mode_and_features_restrict_the_candidates():
    s = compile_json(os.path.join(TMP, "h.asap.h5"), "--heads-mode", "pooled", "--features", "alpha+softmax,slices")
    for layer in s["layers"]:
        cands = layer["candidates"]
        assert cands and all(not c["per_head"] for c in cands), [c["candidate"] for c in cands]
        assert {c["features"] for c in cands} <= {"alpha+softmax", "slices"}, [c["candidate"] for c in cands]
        assert layer["chosen"]["per_head"] is False
    s = compile_json(os.path.join(TMP, "h2.asap.h5"), "--heads-mode", "per-head", "--features", "all")
    for layer in s["layers"]:
        assert all(c["per_head"] and c["features"] == "slices+alpha+softmax+sinkhorn3+cstats"
                   for c in layer["candidates"])


@test
def stats_families_are_default_candidates_and_refused_without_alpha():
    """The score_stats families (docs/asap-math.md 6c) are among compile's
    default candidates; --features takes +stats after a family with alpha
    only, and a map that stores them reads back with its columns."""
    s = compile_json(os.path.join(TMP, "st.asap.h5"), "--features", "alpha+stats", "--heads-mode", "per-head",
                     "--no-zero-parameter")
    for layer in s["layers"]:
        assert {c["features"] for c in layer["candidates"]} == {"alpha+stats"}, layer["candidates"]
        assert layer["chosen"]["family"] == "alpha+stats", layer["chosen"]
    p = subprocess.run([ASAPC, "inspect", os.path.join(TMP, "st.asap.h5")], capture_output=True, text=True)
    assert p.returncode == 0 and "alpha+stats" in p.stdout, (p.stdout, p.stderr)
    default = compile_json(os.path.join(TMP, "d.asap.h5"), "--heads-mode", "pooled", "--fit", "ls")
    for layer in default["layers"]:
        fams = {c["features"] for c in layer["candidates"]}
        assert {"slices+alpha+stats", "slices+alpha+softmax+sinkhorn3+stats", "slices+alpha+cstats",
                "slices+alpha+softmax+sinkhorn3+cstats"} <= fams, fams
    # +cstats: the centered statistics too (docs/asap-math.md 6d), written as format version 6.
    s = compile_json(os.path.join(TMP, "cst.asap.h5"), "--features", "alpha+cstats", "--heads-mode", "per-head",
                     "--no-zero-parameter")
    for layer in s["layers"]:
        assert layer["chosen"]["family"] == "alpha+cstats", layer["chosen"]
    p = subprocess.run([ASAPC, "inspect", os.path.join(TMP, "cst.asap.h5")], capture_output=True, text=True)
    assert p.returncode == 0 and "alpha+cstats" in p.stdout, (p.stdout, p.stderr)
    for bad in ("slices+stats", "stats", "alpha+stats+stats", "alpha+softmax+stats+sinkhorn3", "cstats",
                "alpha+stats+cstats", "alpha+cstats+stats"):
        p = subprocess.run([ASAPC, "compile", NAME + ".pt", "-o", os.path.join(TMP, "bad.asap.h5"), *BASE,
                            "--features", bad], capture_output=True, text=True)
        assert p.returncode == 2, (bad, p.returncode, p.stderr)
        assert "--features" in p.stderr and "'%s'" % bad in p.stderr, (bad, p.stderr)
        assert not os.path.exists(os.path.join(TMP, "bad.asap.h5")), bad


@test
def zero_parameter_takes_three_rules_and_refuses_others():
    """--zero-parameter fallback|compete|never (docs/decisions.md, "ASAP maps
    first"): an unknown rule, or --no-zero-parameter with it, is refused in
    one sentence, and nothing is written."""
    out = os.path.join(TMP, "zp.asap.h5")
    for extra, words in ((["--zero-parameter", "sometimes"], ["--zero-parameter", "'sometimes'", "fallback"]),
                         (["--zero-parameter", "compete", "--no-zero-parameter"],
                          ["--zero-parameter", "--no-zero-parameter"])):
        p = subprocess.run([ASAPC, "compile", NAME + ".pt", "-o", out, *BASE, *extra], capture_output=True, text=True)
        assert p.returncode == 2, (extra, p.returncode, p.stderr)
        assert all(w in p.stderr for w in words), (extra, p.stderr)
        assert len(p.stderr.strip().splitlines()) == 1, p.stderr
        assert not os.path.exists(out), extra


@test
def ridge_grid_is_the_set_chosen_from():
    s = compile_json(os.path.join(TMP, "r.asap.h5"), "--ridge-grid", "0.5,2")
    for layer in s["layers"]:
        for c in layer["candidates"]:
            assert c["ridge"] in (0.5, 2.0), c
        assert layer["slice_selection"]
        for t in layer["slice_selection"]:
            assert t["prefixes"], t
            for row in t["prefixes"]:
                assert row["ridge_grid"] == [0.5, 2.0] and row["ridge"] in (0.5, 2.0), row
                assert len(row["ridge_grid_mse"]) == 2, row


@test
def the_default_fit_is_the_attention_refit_and_fit_ls_skips_it():
    """Without --fit, compile refits the chosen map on the attention error
    (the record's attention_fit, which says what stopped it); --fit ls keeps
    the LS coefficients of the same choice and records no refit."""
    layer = ["--layers", "transformer.layers.1.0.fn"]
    d = compile_json(os.path.join(TMP, "fit-default.asap.h5"), *layer)["layers"][0]
    ls = compile_json(os.path.join(TMP, "fit-ls.asap.h5"), "--fit", "ls", *layer)["layers"][0]
    assert d["fit"] == "attention" and ls["fit"] == "ls", (d["fit"], ls["fit"])
    af = d["attention_fit"]
    assert af["stopped"], af
    assert 1 <= af["iterations"] <= 60, af
    assert af["heldout_attention_error_refit"] <= af["heldout_attention_error_ls"] or af["fell_back_to_ls"], af
    assert "attention_fit" not in ls, sorted(ls)
    assert d["chosen"]["candidate"] == ls["chosen"]["candidate"], (d["chosen"], ls["chosen"])
    assert d["chosen"]["closures"] == ls["chosen"]["closures"]
    # Patience counts held-out checks (one every 5 iterations) after the best one:
    # the default's 3, and --attention-patience 1.
    if af["stopped"].startswith("no better"):
        assert "in 3 checks" in af["stopped"] and af["iterations"] == af["best_iteration"] + 15, af
    # verify names the stored coefficients' own held-out error (the refit's), not only LS's.
    for art, want in (("fit-default.asap.h5", True), ("fit-ls.asap.h5", False)):
        p = subprocess.run([ASAPC, "verify", NAME + ".pt", "--artifact", os.path.join(TMP, art), "--data",
                            NAME + ".heldout.h5", "--max-examples", "8", "--no-timing",
                            "--report", os.path.join(TMP, art + ".html")],
                           capture_output=True, text=True)
        assert p.returncode == 0, p.stderr
        line = [x for x in p.stdout.splitlines() if "compiled:" in x]
        kept = want and not af["fell_back_to_ls"]
        refit = "%.4f after the attention refit" % af["heldout_attention_error_refit"]
        assert line and ((refit in line[0]) if kept else ("after the" not in line[0])), (art, line, refit)
    p1 = compile_json(os.path.join(TMP, "fit-p1.asap.h5"), "--attention-patience", "1", *layer)["layers"][0]
    a1 = p1["attention_fit"]
    assert a1["stopped"] == "no better held-out objective in 1 checks (5 iterations)", a1
    assert a1["iterations"] == a1["best_iteration"] + 5 and a1["iterations"] <= af["iterations"], (a1, af)


if __name__ == "__main__":
    try:
        sys.exit(run(sys.argv[1:]))
    finally:
        shutil.rmtree(TMP, ignore_errors=True)
