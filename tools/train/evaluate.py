#!/usr/bin/env python3
"""Test accuracy of a Sinkformer teacher with its attention replaced by
compiled ASAP operators and by cheaper Sinkhorn normalizers.

Run with Debian's interpreter (${PYTHON:-/usr/bin/python3}); tools/train/evaluate.sh
runs the whole evaluation and writes docs/results.md.

    # one teacher -> JSON
    evaluate.py run --name vit6 --teacher calib_data/vit_mnist_t6.pt \
        --artifact out/eval/vit_mnist_t6.asap.h5 --kl-artifact out/eval/vit_mnist_t6.kl.asap.h5 \
        --verify-json out/eval/vit_mnist_t6.verify.json -o out/eval/vit6.eval.json
    # JSON files -> Markdown report with a plot
    evaluate.py report out/eval/vit6.eval.json ... -o docs/results.md

Variants, each over the teacher's whole test split (tools/train/train_teachers.py
teacher_data), each with its test accuracy and its agreement with the
teacher (share of test examples with the teacher's predicted class):

* the teacher itself (Sinkhorn budget T);
* ASAP with k = 1 .. max(--max-closures, default) closures (k = 1 is ASAP-0;
  the compiled default is marked), through asap_torch.patch_model (the custom operator, or
  the pure-PyTorch fallback when the library is absent);
* ASAP-KL: an artifact compiled with --fit kl, at its default k;
* the teacher's Sinkhorn loop with reduced budgets T' = 1 .. T-1 (T' = 1 is
  plain softmax attention).

With --verify-json (asapc verify --json of the default artifact) the JSON also
holds, per layer, the attention relative error and latency of ASAP and of
each reduced budget, for the "closer than Sinkhorn at equal latency" table.
"""
import argparse
import contextlib
import datetime
import json
import math
import os
import platform
import subprocess
import sys
import time

TRAIN_DIR = os.path.dirname(os.path.abspath(__file__))
TOOLS_DIR = os.path.dirname(TRAIN_DIR)
REPO = os.path.dirname(TOOLS_DIR)
for _d in (TRAIN_DIR, TOOLS_DIR, os.path.join(REPO, "python")):   # tools/: sinkformer_models; python/: asap_torch
    if _d not in sys.path:
        sys.path.insert(0, _d)

# Targets of issues 13 and 25 (points of accuracy, share of agreement), and
# from asapc verify: the model (the sum of its layers' latencies) at least
# MIN_SPEEDUP times faster than the teachers, and each layer's default
# operator closer to its teacher than every Sinkhorn budget of no higher
# latency.
TARGETS = {
    "vit": {"max_drop": 0.3, "min_agreement": 99.0},
    "text": {"max_drop": 0.5, "min_agreement": 95.0},
}
MIN_SPEEDUP = 1.25


def log(msg):
    print(msg, file=sys.stderr, flush=True)


# --------------------------------------------------------------------------
# running variants
# --------------------------------------------------------------------------

def budget_attr(mod):
    """Name of the attribute holding a Sinkformer attention module's budget T."""
    return "max_iter" if hasattr(mod, "max_iter") else "n_it"


@contextlib.contextmanager
def sinkhorn_budget(model, T):
    import sinkformer_models as sm
    mods = [m for _, m in sm.attention_modules(model)]
    saved = [getattr(m, budget_attr(m)) for m in mods]
    try:
        for m in mods:
            setattr(m, budget_attr(m), int(T))
        yield
    finally:
        for m, t in zip(mods, saved):
            setattr(m, budget_attr(m), t)


@contextlib.contextmanager
def patched(model, artifact, closures):
    import asap_torch
    asap_torch.patch_model(model, artifact, closures=closures, return_attention=False)
    try:
        yield
    finally:
        asap_torch.unpatch_model(model)


def predict(model, x, batch_size):
    import torch
    preds = []
    with torch.no_grad():
        for s in range(0, len(x), batch_size):
            preds.append(model(x[s:s + batch_size])[0].argmax(-1))
    return torch.cat(preds)


def artifact_summary(art):
    return {"path": os.path.relpath(art.path, REPO) if art.path.startswith(REPO) else art.path,
            "backend": art.backend,
            "layers": [{"name": p.name, "family": p.family_name, "per_head": p.per_head,
                        "default_closures": p.default_closures,
                        "feature_passes": p.feature_passes,
                        "operator": getattr(p, "operator", "asap"),
                        "describe": getattr(p, "describe", p.family_name),
                        "lse_passes": getattr(p, "lse_passes",
                                              p.feature_passes + p.default_closures),
                        "fit": p.fit.get("fit", ""),
                        "heldout_attention_error": p.fit.get("chosen", {}).get(
                            "heldout_attention_error")}
                       for p in (art.layer(n) for n in art.layer_names)]}


def passes_of(art, k=None):
    """Log-sum-exp passes per layer (features + closures), as a display string."""
    def passes(p):
        if k:
            return p.feature_passes + k
        return getattr(p, "lse_passes", p.feature_passes + p.default_closures)
    vals = sorted({passes(art.layer(n)) for n in art.layer_names})
    return "/".join(str(v) for v in vals)


def verify_layers(path):
    """Per-layer fidelity of the default artifact from `asapc verify --json`."""
    with open(path) as fh:
        d = json.load(fh)
    out = []
    for L in d["layers"]:
        ops = L["operators"]
        asap = [o for o in ops if o["kind"] == "asap"]
        default = next(o for o in ops if o.get("default"))
        teacher = next(o for o in ops if o["kind"] == "teacher")
        sk = [o for o in ops if o["kind"] == "sinkhorn"]
        row = {
            "name": L["name"], "T": L["T"], "default_closures": L["default_closures"],
            "family": L["fit"].get("chosen", {}).get("family", ""),
            "per_head": L["fit"].get("chosen", {}).get("per_head"),
            "default_operator": L.get("default_operator", ""),
            "asap": {"kind": default["kind"], "k": default["steps"], "passes": default["lse_passes"],
                     "error": default["metrics"]["attention_rel_error"],
                     "kl": default["metrics"].get("teacher_plan_kl"),
                     "latency_s": default["latency_s"]},
            "asap_by_k": [{"k": o["steps"], "passes": o["lse_passes"],
                           "error": o["metrics"]["attention_rel_error"],
                           "latency_s": o["latency_s"]} for o in asap],
            "teacher_latency_s": teacher["latency_s"],
            "sinkhorn": [{"T": o["steps"], "passes": o["lse_passes"],
                          "error": o["metrics"]["attention_rel_error"],
                          "latency_s": o["latency_s"], "teacher_ending": o["teacher_ending"]}
                         for o in sk],
            "examples": L.get("examples"),
        }
        lat, pas = row["asap"]["latency_s"], row["asap"]["passes"]
        # Rivals: every Sinkhorn budget no slower (fewer passes) than the
        # default, the default itself excluded when it is a Sinkhorn budget.
        by_lat = [s for s in sk if s["latency_s"] <= lat and s is not default]
        by_pass = [s for s in sk if s["lse_passes"] <= pas and s is not default]
        row["speedup"] = teacher["latency_s"] / lat if lat and lat > 0 else None

        def best(c):
            if not c:
                return None
            b = min(c, key=lambda s: s["metrics"]["attention_rel_error"])
            return {"T": b["steps"], "error": b["metrics"]["attention_rel_error"],
                    "latency_s": b["latency_s"]}
        row["best_sinkhorn_within_latency"] = best(by_lat)
        row["best_sinkhorn_within_passes"] = best(by_pass)
        out.append(row)
    t = [l["teacher_latency_s"] for l in out]
    o = [l["asap"]["latency_s"] for l in out]
    model = sum(t) / sum(o) if out and all(x and x > 0 for x in t + o) else None
    return {"file": path, "data": d.get("data"), "layers": out, "model_speedup": model}


def run(a):
    import torch
    import asap_torch
    import train_teachers

    torch.set_num_threads(a.threads)
    model, cfg = train_teachers.load_teacher(a.teacher)
    family, T = cfg["family"], int(cfg["T"])
    x, y = train_teachers.teacher_data(cfg, "test")
    if a.max_examples:
        x, y = x[:a.max_examples], y[:a.max_examples]
    art = asap_torch.load_artifact(a.artifact, backend=a.backend)
    kl = asap_torch.load_artifact(a.kl_artifact, backend=a.backend) if a.kl_artifact else None
    log("%s: %s teacher T = %d, %d test examples, backend %s"
        % (a.name, family, T, len(x), art.backend))

    variants = []
    teacher_pred = None

    def add(label, kind, make, **extra):
        nonlocal teacher_pred
        t0 = time.perf_counter()
        with make():
            pred = predict(model, x, a.batch_size)
        secs = time.perf_counter() - t0
        if teacher_pred is None:
            teacher_pred = pred
        v = dict(label=label, kind=kind, correct=int((pred == y).sum()),
                 accuracy=100.0 * float((pred == y).float().mean()),
                 agree=int((pred == teacher_pred).sum()),
                 agreement=100.0 * float((pred == teacher_pred).float().mean()),
                 seconds=round(secs, 3), **extra)
        variants.append(v)
        log("  %-28s acc %6.2f%%  agreement %6.2f%%  %6.1f s"
            % (label, v["accuracy"], v["agreement"], secs))

    add("teacher (T = %d)" % T, "teacher", contextlib.nullcontext, T=T, passes=str(T))
    all_asap = all(getattr(art.layer(n), "is_asap", True) for n in art.layer_names)
    if not all_asap:
        # Some layers store plain Sinkhorn or the teacher: the compiled model
        # is each layer's stored operator; the k sweep applies to ASAP maps only.
        add("compiled (%s) (default)" % ", ".join(art.layer(n).describe for n in art.layer_names),
            "compiled", lambda: patched(model, art, None), k=0, default=True,
            passes=passes_of(art), fit="ls")
    defaults = sorted({art.layer(n).default_closures for n in art.layer_names}) if all_asap else []
    for k in range(1, max([a.max_closures] + defaults) + 1) if all_asap else []:
        is_default = defaults == [k]
        label = "ASAP k = %d%s%s" % (k, " (ASAP-0)" if k == 1 else "",
                                     " (default)" if is_default else "")
        add(label, "asap", lambda k=k: patched(model, art, k), k=k, default=is_default,
            passes=passes_of(art, k), fit="ls")
    if defaults and len(defaults) > 1:   # layers with different defaults
        add("ASAP default (k = %s)" % "/".join(map(str, defaults)), "asap",
            lambda: patched(model, art, None), k=0, default=True, passes=passes_of(art),
            fit="ls")
    if kl is not None:
        kd = "/".join(sorted({getattr(kl.layer(n), "describe", str(kl.layer(n).default_closures))
                              for n in kl.layer_names}))
        add("ASAP-KL (default: %s)" % kd, "asap-kl", lambda: patched(model, kl, None),
            k=0, default=True, passes=passes_of(kl), fit="kl")
    for Tp in range(1, T):
        label = "softmax (T' = 1)" if Tp == 1 else "Sinkhorn T' = %d" % Tp
        if Tp % 2 != T % 2:
            label += " *"
        add(label, "sinkhorn", lambda Tp=Tp: sinkhorn_budget(model, Tp), T=Tp, passes=str(Tp),
            other_ending=(Tp % 2 != T % 2))

    res = {
        "name": a.name, "family": family, "T": T, "teacher": a.teacher,
        "teacher_recorded_accuracy": cfg.get("test_acc"),
        "teacher_description": cfg.get("data", ""),
        "test_examples": len(x), "batch_size": a.batch_size, "threads": a.threads,
        "backend": art.backend,
        "op_library": asap_torch.library_path() if art.backend == "op" else None,
        "artifact": artifact_summary(art),
        "kl_artifact": artifact_summary(kl) if kl is not None else None,
        "variants": variants,
        "verify": verify_layers(a.verify_json) if a.verify_json else None,
        "curve": json.load(open(a.curve_json)) if a.curve_json else None,
        "date_utc": datetime.datetime.utcnow().strftime("%Y-%m-%dT%H:%M:%SZ"),
        "machine": machine(),
        "torch": torch.__version__,
    }
    os.makedirs(os.path.dirname(os.path.abspath(a.output)), exist_ok=True)
    with open(a.output, "w") as fh:
        json.dump(res, fh, indent=1)
        fh.write("\n")
    log("wrote %s" % a.output)
    return 0


def curve(a):
    """Agreement against speed-up: one compiled artifact per --min-speedup
    target (each with its own `asapc verify --json`), evaluated on the test
    split, and the teacher's Sinkhorn loop cut to T' < T with the speed-ups
    of the first verify run."""
    if not os.path.exists(a.teacher):
        log("evaluate.py curve: teacher checkpoint '%s' does not exist" % a.teacher)
        return 2
    for spec in a.point:
        parts = spec.split("=", 2)
        if len(parts) != 3 or not all(parts):
            log("evaluate.py curve: --point expects LABEL=ARTIFACT=VERIFY_JSON, found %r" % spec)
            return 2
        for what, path in (("artifact", parts[1]), ("verify JSON", parts[2])):
            if not os.path.exists(path):
                log("evaluate.py curve: --point %s: %s '%s' does not exist" % (parts[0], what, path))
                return 2
    import torch
    import asap_torch
    import train_teachers

    torch.set_num_threads(a.threads)
    model, cfg = train_teachers.load_teacher(a.teacher)
    T = int(cfg["T"])
    x, y = train_teachers.teacher_data(cfg, "test")
    if a.max_examples:
        x, y = x[:a.max_examples], y[:a.max_examples]
    teacher_pred = predict(model, x, a.batch_size)

    def scores(pred):
        return (100.0 * float((pred == y).float().mean()),
                100.0 * float((pred == teacher_pred).float().mean()))

    def speedups(layers, pick):
        out = []
        for l in layers:
            lat = pick(l)
            out.append(l["teacher_latency_s"] / lat if lat and l["teacher_latency_s"] else None)
        return out

    points = []
    first_verify = None
    for spec in a.point:
        label, art_path, ver_path = spec.split("=", 2)
        ver = verify_layers(ver_path)
        first_verify = first_verify or ver
        art = asap_torch.load_artifact(art_path, backend=a.backend)
        with patched(model, art, None):
            acc, agree = scores(predict(model, x, a.batch_size))
        sp = speedups(ver["layers"], lambda l: l["asap"]["latency_s"])
        teacher_total = sum(l["teacher_latency_s"] or 0 for l in ver["layers"])
        op_total = sum(l["asap"]["latency_s"] or 0 for l in ver["layers"])
        pt = {"target": label, "artifact": art_path, "accuracy": acc, "agreement": agree,
              "layers": [{"name": l["name"], "operator": l["default_operator"],
                          "error": l["asap"]["error"], "speedup": v}
                         for l, v in zip(ver["layers"], sp)],
              "min_speedup": min(v for v in sp if v) if all(sp) else None,
              "attention_speedup": teacher_total / op_total if op_total > 0 else None}
        points.append(pt)
        log("  %-16s acc %6.2f%%  agreement %6.2f%%  speed-up %s"
            % (label, acc, agree, ", ".join("%.2fx" % v if v else "untimed" for v in sp)))
    sinkhorn = []
    for Tp in range(1, T):
        with sinkhorn_budget(model, Tp):
            acc, agree = scores(predict(model, x, a.batch_size))
        sp = []
        for l in first_verify["layers"]:
            row = next((s for s in l["sinkhorn"] if s["T"] == Tp), None)
            sp.append(l["teacher_latency_s"] / row["latency_s"] if row and row["latency_s"] else None)
        sinkhorn.append({"T": Tp, "other_ending": Tp % 2 != T % 2, "accuracy": acc, "agreement": agree,
                         "min_speedup": min(v for v in sp if v) if all(sp) else None})
    res = {"name": a.name, "teacher": a.teacher, "test_examples": len(x), "points": points,
           "sinkhorn": sinkhorn, "sinkhorn_speedups_from": first_verify["file"] if first_verify else None,
           "date_utc": datetime.datetime.utcnow().strftime("%Y-%m-%dT%H:%M:%SZ")}
    with open(a.output, "w") as fh:
        json.dump(res, fh, indent=1)
        fh.write("\n")
    log("wrote %s" % a.output)
    return 0


def machine():
    model, cores = platform.processor() or "unknown", os.cpu_count()
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
        for line in out.splitlines():
            k, _, v = line.partition(":")
            if k.strip() == "Model name":
                model = v.strip()
            elif k.strip() == "CPU(s)":
                cores = int(v.strip())
    except (OSError, ValueError):
        pass
    return {"cpu": model, "cores": cores, "system": platform.platform()}


# --------------------------------------------------------------------------
# report
# --------------------------------------------------------------------------

TITLES = {"vit": "ViT on MNIST", "text": "text encoder on WordNet noun glosses"}


def teacher_title(r):
    return "%s, T = %d (%s)" % (TITLES.get(r["family"], r["family"]), r["T"],
                                os.path.basename(r["teacher"]))


def compiled_variant(r):
    """The compiled model the targets are about: every layer's stored operator (the default fit)."""
    return next(v for v in r["variants"] if v["kind"] in ("asap", "compiled") and v.get("default"))


def targets(r):
    t = TARGETS.get(r["family"], TARGETS["text"])
    teacher = r["variants"][0]
    v = compiled_variant(r)
    drop = teacher["accuracy"] - v["accuracy"]
    lines, ok = [], True
    met = drop <= t["max_drop"]
    ok &= met
    lines.append("accuracy within %.1f point%s of the teacher: **%s** (%.2f%% vs %.2f%%, %s%.2f)"
                 % (t["max_drop"], "" if t["max_drop"] == 1 else "s", "met" if met else "missed",
                    v["accuracy"], teacher["accuracy"], "−" if drop >= 0 else "+", abs(drop)))
    if t["min_agreement"] is not None:
        met = v["agreement"] >= t["min_agreement"]
        ok &= met
        lines.append("agreement with the teacher ≥ %.0f%%: **%s** (%.2f%%, %d of %d differ)"
                     % (t["min_agreement"], "met" if met else "missed", v["agreement"],
                        r["test_examples"] - v["agree"], r["test_examples"]))
    else:
        lines.append("agreement with the teacher (no target): %.2f%% (%d of %d differ)"
                     % (v["agreement"], r["test_examples"] - v["agree"], r["test_examples"]))
    ver = r.get("verify")
    if ver:
        model = ver.get("model_speedup")
        met = bool(model) and model >= MIN_SPEEDUP
        ok &= met
        lines.append("the model at least %.2fx faster than the teachers, measured by asapc verify as the "
                     "sum of its layers' latencies: **%s** (%s; per layer %s)"
                     % (MIN_SPEEDUP, "met" if met else "missed", "%.2fx" % model if model else "untimed",
                        ", ".join("%.2fx" % l["speedup"] if l.get("speedup") else "untimed"
                                  for l in ver["layers"])))
        beaten = [l["name"] for l in ver["layers"] if l["best_sinkhorn_within_latency"] is not None
                  and l["best_sinkhorn_within_latency"]["error"] <= l["asap"]["error"]]
        met = not beaten
        ok &= met
        lines.append("closer to the teacher than every Sinkhorn T' of no higher latency on every "
                     "layer: **%s**%s" % ("met" if met else "missed",
                                          "" if met else " (not on %s)" % ", ".join(
                                              "`%s`" % b for b in beaten)))
    c = r.get("curve")
    fast = [q for q in (c["points"] if c else [])
            if q.get("attention_speedup") and q["attention_speedup"] >= MIN_SPEEDUP]
    if fast:
        b = max(fast, key=lambda q: q["agreement"])
        lines.append("best agreement over the compile targets of the curve below with the model at least "
                     "%.2fx faster (asapc verify): %.2f%% (`%s`, %.2fx, accuracy %.2f%%)"
                     % (MIN_SPEEDUP, b["agreement"], b["target"], b["attention_speedup"], b["accuracy"]))
    p = max(int(x) for x in v["passes"].split("/"))
    same = next((s for s in r["variants"] if s["kind"] == "sinkhorn" and s["T"] == p), None)
    if same is not None:
        lines.append("for comparison, Sinkhorn cut to the same %d log-sum-exp passes (T' = %d): "
                     "%.2f%% accuracy, %.2f%% agreement" % (p, p, same["accuracy"],
                                                            same["agreement"]))
    return ok, v, lines


def fmt_ms(s):
    return "%.2f" % (1e3 * s)


def variant_table(r):
    teacher = r["variants"][0]
    rows = ["| variant | LSE passes / layer | test accuracy | Δ vs teacher (points) | "
            "agreement with teacher | test-set time (s) |",
            "|---|---|---|---|---|---|"]
    for v in r["variants"]:
        d = v["accuracy"] - teacher["accuracy"]
        label = v["label"]
        if v.get("default"):
            label = "**%s**" % label
        rows.append("| %s | %s | %.2f%% | %s | %.2f%% | %.1f |"
                    % (label, v["passes"], v["accuracy"],
                       "—" if v["kind"] == "teacher" else "%+.2f" % d, v["agreement"],
                       v["seconds"]))
    return rows


def layer_table(r):
    ver = r.get("verify")
    if not ver:
        return ["(no `asapc verify --json` data)"]
    rows = ["| layer | default operator (passes) | attn. rel. error | latency (ms) | "
            "teacher latency (ms) | speed-up | best Sinkhorn with latency ≤ default's: T', error | "
            "closer? | best Sinkhorn with passes ≤ default's: T', error | closer? |",
            "|---|---|---|---|---|---|---|---|---|---|"]
    for L in ver["layers"]:
        a = L["asap"]

        def cmp(b):
            if b is None:
                return "none", "yes (no such budget)"
            return ("T' = %d: %.4f" % (b["T"], b["error"]),
                    "**yes**" if a["error"] < b["error"] else "**no**")
        c1, v1 = cmp(L["best_sinkhorn_within_latency"])
        c2, v2 = cmp(L["best_sinkhorn_within_passes"])
        if a.get("kind", "asap") == "asap":
            what = "%s%s, k = %d" % (L["family"], "/head" if L.get("per_head") else "/pool", a["k"])
        else:
            what = L.get("default_operator") or a["kind"]
        rows.append("| `%s` | %s (%d passes) | %.4f | %s | %s | %s | %s | %s | %s | %s |"
                    % (L["name"], what, a["passes"], a["error"], fmt_ms(a["latency_s"]),
                       fmt_ms(L["teacher_latency_s"]),
                       "%.2fx" % L["speedup"] if L.get("speedup") else "—", c1, v1, c2, v2))
    t = sum(L["teacher_latency_s"] or 0 for L in ver["layers"])
    o = sum(L["asap"]["latency_s"] or 0 for L in ver["layers"])
    rows.append("| **the model** (sum) | | | %s | %s | **%s** | | | | |"
                % (fmt_ms(o), fmt_ms(t), "%.2fx" % ver["model_speedup"] if ver.get("model_speedup") else "—"))
    rows.append("")
    rows.append("All reduced budgets (attention relative error / latency in ms; * = ends on the "
                "other marginal):")
    rows.append("")
    Ts = sorted({s["T"] for L in ver["layers"] for s in L["sinkhorn"]})
    rows.append("| layer | " + " | ".join("T' = %d" % t for t in Ts) + " | default |")
    rows.append("|---|" + "---|" * (len(Ts) + 1))
    for L in ver["layers"]:
        cells = []
        for t in Ts:
            s = next((s for s in L["sinkhorn"] if s["T"] == t), None)
            cells.append("—" if s is None else "%.4f / %s%s" % (
                s["error"], fmt_ms(s["latency_s"]), "" if s["teacher_ending"] else " *"))
        rows.append("| `%s` | %s | %.4f / %s |" % (L["name"], " | ".join(cells), L["asap"]["error"],
                                                  fmt_ms(L["asap"]["latency_s"])))
    return rows


def _n_of(r):
    return {"vit": "17", "text": "32"}.get(r["family"], "?")


def pyplot():
    """matplotlib.pyplot on the file-only Agg backend (Debian's python3-matplotlib,
    which tools/setup.sh installs)."""
    try:
        import matplotlib
    except ImportError:
        raise SystemExit("evaluate.py: matplotlib is not installed: apt-get install python3-matplotlib "
                         "(tools/setup.sh installs it)")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def finite_points(points):
    """The tuples of `points` whose first two entries (x, y) are finite
    numbers: an untimed speed-up (None) has no place on a speed axis."""
    return [p for p in points
            if all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in p[:2])]


def fit_limits(ax, xs, ys, pad=0.06):
    """Axis limits that hold every value of xs and ys, with a margin."""
    for values, setter in ((xs, ax.set_xlim), (ys, ax.set_ylim)):
        lo, hi = min(values), max(values)
        m = pad * (hi - lo) if hi > lo else max(abs(hi) * 0.05, 0.5)
        setter(lo - m, hi + m)


def passes_figure(results):
    """Agreement with the teacher against log-sum-exp passes per layer, one
    panel per teacher."""
    plt = pyplot()
    fig, axes = plt.subplots(1, len(results), figsize=(4.6 * len(results), 3.8), squeeze=False)
    for ax, r in zip(axes[0], results):
        xs_all, ys_all = [r["T"]], [100.0]
        for kind, style, name in (("sinkhorn", "o-", "Sinkhorn T'"), ("asap", "s-", "ASAP (default fit), k"),
                                  ("asap-kl", "D", "ASAP-KL"), ("compiled", "P", "compiled default")):
            pts = finite_points([(max(int(p) for p in v["passes"].split("/")), v["agreement"], v)
                                 for v in r["variants"] if v["kind"] == kind])
            if not pts:
                continue
            xs, ys = [p[0] for p in pts], [p[1] for p in pts]
            xs_all += xs
            ys_all += ys
            ax.plot(xs, ys, style, label=name, markersize=5)
            if kind == "asap":
                for x, y, v in pts:
                    ax.annotate("k=%d" % v["k"], (x, y), textcoords="offset points", xytext=(4, -10), fontsize=7)
        ax.axvline(r["T"], color="grey", lw=0.8, ls=":")
        ax.plot([r["T"]], [100.0], "k*", markersize=9, label="teacher (T = %d)" % r["T"])
        fit_limits(ax, xs_all, ys_all)
        ax.set_title("%s, T = %d" % (TITLES.get(r["family"], r["family"]), r["T"]), fontsize=9)
        ax.set_xlabel("log-sum-exp passes per layer")
        ax.set_ylabel("agreement with teacher (%)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    return fig


def speedup_figure(r):
    """Agreement against the slowest layer's speed-up: the compiled models
    per --min-speedup target, and Sinkhorn T' (filled: same ending as the
    teacher; hollow: the other ending). None without a curve or a timed
    point. The x axis spans every point, the teacher's speed (1x) and the
    1.25x target."""
    c = r.get("curve")
    if not c:
        return None
    compiled = sorted(finite_points([(p["min_speedup"], p["agreement"], p["target"]) for p in c["points"]]))
    same = sorted(finite_points([(s["min_speedup"], s["agreement"], "T'=%d" % s["T"])
                                 for s in c["sinkhorn"] if not s["other_ending"]]))
    other = sorted(finite_points([(s["min_speedup"], s["agreement"], "T'=%d" % s["T"])
                                  for s in c["sinkhorn"] if s["other_ending"]]))
    if not (compiled or same or other):
        return None
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    ax.axvline(1.0, color="grey", lw=0.8, ls=":", label="the teacher's speed")
    ax.axvline(MIN_SPEEDUP, color="grey", lw=0.8, ls="--", label="%.2fx target" % MIN_SPEEDUP)
    for pts, style, kw, name in ((compiled, "o-", {"color": "#d62728"}, "compiled (--min-speedup targets)"),
                                 (same, "s-", {"color": "#1f77b4"}, "Sinkhorn T' (same ending)"),
                                 (other, "s", {"color": "#1f77b4", "markerfacecolor": "none"},
                                  "Sinkhorn T' (other ending)")):
        if not pts:
            continue
        ax.plot([p[0] for p in pts], [p[1] for p in pts], style, label=name, markersize=5, **kw)
        for x, y, lab in pts:
            ax.annotate(lab, (x, y), textcoords="offset points", xytext=(4, 4), fontsize=6)
    pts = compiled + same + other
    fit_limits(ax, [p[0] for p in pts] + [1.0, MIN_SPEEDUP], [p[1] for p in pts] + [100.0])
    ax.set_title("%s: agreement against speed-up" % teacher_title(r), fontsize=9)
    ax.set_xlabel("speed-up over the teacher (slowest layer, asapc verify)")
    ax.set_ylabel("agreement with teacher (%)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="lower left")
    fig.tight_layout()
    return fig


def points_outside_axes(fig):
    """Every data point the figure draws (line vertices and markers, scatter
    offsets) that falls outside its axes' plotting area, as (axes title, x,
    y); [] when the figure shows all its data. Reference lines that span
    the axes (axvline) are not data points."""
    import numpy as np
    fig.canvas.draw()
    out = []
    for ax in fig.axes:
        box = ax.get_window_extent()

        def check(xy_data, xy_display):
            for (x, y), (u, v) in zip(xy_data, xy_display):
                if not (np.isfinite(u) and np.isfinite(v)):
                    if np.isfinite(x) and np.isfinite(y):
                        out.append((ax.get_title(), float(x), float(y)))
                    continue
                if not (box.x0 - 0.5 <= u <= box.x1 + 0.5 and box.y0 - 0.5 <= v <= box.y1 + 0.5):
                    out.append((ax.get_title(), float(x), float(y)))

        for line in ax.get_lines():
            if line.get_transform() != ax.transData:  # axvline / axhline: x or y in axes units
                continue
            xy = np.asarray(line.get_xydata(), dtype=float)
            check(xy, line.get_transform().transform(xy))
        for coll in ax.collections:
            xy = np.asarray(coll.get_offsets(), dtype=float)
            if len(xy):
                check(xy, coll.get_offset_transform().transform(xy))
    return out


def save_figure(fig, path):
    """Writes the figure as a PNG (to a temporary file, then renamed); refuses
    a figure that draws a point outside its axes."""
    bad = points_outside_axes(fig)
    if bad:
        raise RuntimeError("evaluate.py: the plot for %s would hide %d point(s) outside its axes, e.g. %r"
                           % (path, len(bad), bad[0]))
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = path + ".tmp.png"
    fig.savefig(tmp, dpi=110)
    os.replace(tmp, path)
    pyplot().close(fig)
    return path


def curve_section(r, image=None):
    """The agreement-against-speed-up section; `image`: the plot's path
    relative to the page."""
    c = r.get("curve")
    if not c:
        return []
    L = ["### Agreement against speed-up", "",
         "One artifact per `asapc compile --min-speedup S --guard 0` (the budget's own choice, "
         "however far from the teacher; `1.25` is the default artifact above, fidelity guard "
         "included) and `--objective fidelity` (the most "
         "accurate map within T − 2 passes whatever its speed), with compile's default attention "
         "refit (`+ls`: `--fit ls`, its LS coefficients without the refit; `+layer`: `--budget layer`, each "
         "layer at the target on its own; `+nozero`: `--no-zero-parameter`, ASAP maps only; `+compete`: "
         "`--zero-parameter compete`, plain Sinkhorn and the teacher as equals of the maps, the default rule "
         "until 2026-12-02), each verified by "
         "`asapc verify` on "
         "the held-out file; the compiled model (each layer's stored operator) evaluated on the "
         "%d test examples. *Speed-up* is the slowest layer's, teacher latency over the stored "
         "operator's in the same verify run. Sinkhorn T' rows take their speed-ups from the first "
         "verify run." % c["test_examples"], ""]
    if image:
        L += ["![%s: agreement against speed-up](%s)" % (teacher_title(r), image), ""]
    L += ["| compile target | stored operators | speed-up (slowest layer) | agreement | accuracy |",
          "|---|---|---:|---:|---:|"]
    for p in c["points"]:
        L.append("| %s | %s | %s | %.2f%% | %.2f%% |"
                 % (p["target"], "; ".join("%s" % l["operator"] for l in p["layers"]),
                    "%.2fx" % p["min_speedup"] if p["min_speedup"] else "untimed",
                    p["agreement"], p["accuracy"]))
    for sk in c["sinkhorn"]:
        L.append("| Sinkhorn T' = %d%s | — | %s | %.2f%% | %.2f%% |"
                 % (sk["T"], " *" if sk["other_ending"] else "",
                    "%.2fx" % sk["min_speedup"] if sk["min_speedup"] else "untimed",
                    sk["agreement"], sk["accuracy"]))
    fast = [p for p in c["points"] if p["min_speedup"] and p["min_speedup"] >= MIN_SPEEDUP]
    if fast:
        b = max(fast, key=lambda p: p["agreement"])
        L += ["", "Best point at %.2fx or more on every layer: `%s`, %.2f%% agreement at %.2fx."
              % (MIN_SPEEDUP, b["target"], b["agreement"], b["min_speedup"])]
        top = max(c["points"], key=lambda p: p["agreement"])
        if top["agreement"] > b["agreement"] + 0.05:
            L.append("The highest agreement of the sweep, %.2f%% (`%s`), runs at %s: the closer operators cost "
                     "more (log-sum-exp passes, slices) than one %.2fx faster than the teacher may at this "
                     "shape (docs/decisions.md, \"Attention refit and the 97%% goal\")."
                     % (top["agreement"], top["target"],
                        "%.2fx" % top["min_speedup"] if top["min_speedup"] else "an untimed speed",
                        MIN_SPEEDUP))
    return L + [""]


def report(a):
    results = []
    for p in a.results:
        with open(p) as fh:
            results.append(json.load(fh))
    if not results:
        log("evaluate.py report: no result files")
        return 2
    out_dir = os.path.dirname(os.path.abspath(a.output))
    # The plots: PNGs under images/ beside the page (docs/images/ for docs/results.md).
    images = []
    png = save_figure(passes_figure(results), os.path.join(out_dir, "images", a.plot_name))
    images.append(png)
    curve_png = {}
    for r in results:
        fig = speedup_figure(r)
        if fig is not None:
            curve_png[r["name"]] = save_figure(fig, os.path.join(out_dir, "images",
                                                                 "results_speedup_%s.png" % r["name"]))
            images.append(curve_png[r["name"]])
    m = results[0]["machine"]
    dates = sorted(r["date_utc"].replace("T", " ").rstrip("Z") for r in results)
    when = dates[0] if dates[0][:10] == dates[-1][:10] and len(dates) == 1 else \
        "%s to %s" % (dates[0], dates[-1])
    L = ["# Results: accuracy of compiled teachers",
         "",
         "Generated by `tools/train/evaluate.sh` (`tools/train/evaluate.py`): evaluations run %s UTC on %s "
         "(%s logical cores, %s; torch %s, %d thread%s). Every number below comes from those "
         "runs; rerun `tools/train/evaluate.sh` to regenerate this page."
         % (when, m["cpu"], m["cores"], m["system"], results[0]["torch"],
            results[0]["threads"], "" if results[0]["threads"] == 1 else "s"),
         "",
         "Each teacher's attention layers are replaced, in the full model, by: the compiled model "
         "(each layer's stored operator, chosen by `asapc compile` with its defaults under one "
         "latency budget for "
         "the model: the layers' summed latency at least 1.25x below the fused teachers' on this "
         "machine, the error spent where it costs least; an ASAP map, or plain Sinkhorn T' where "
         "no map beats it); when every layer stores an ASAP map, the ASAP "
         "operator with k closures (`asap_torch.patch_model`, which runs the TorchScript custom "
         "operator `libasap_torch_op.so`; ASAP-0 is k = 1, **bold** = the compiled default); an "
         "artifact compiled with `--fit kl` at its default k; and the teacher's own Sinkhorn "
         "loop cut to T' < T half-steps (T' = 1 is plain softmax attention; * = ends on the other "
         "marginal than the teacher). Agreement = share of test examples whose predicted class "
         "equals the teacher's. LSE passes = log-sum-exp passes over the n×n scores per layer "
         "(ASAP: feature passes + k closures; the teacher: T); ASAP's sliced features cost "
         "O(nLd + L·n log n) on top, which pass counts do not show. Test-set times and "
         "latencies are wall-clock times on a shared 2-core machine that was running other "
         "work at times, so they are noisy; test-set times include the Python model, so "
         "they are not the operator's speed (docs/performance.md has that).",
         "",
         "## Targets", ""]
    for r in results:
        ok, v, lines = targets(r)
        L.append("- **%s** — compiled model = %s (%s):" % (teacher_title(r), v["label"],
                                                          "all targets met" if ok
                                                          else "target missed"))
        L += ["  - " + x for x in lines]
    for miss in a.missing:
        L.append("- not evaluated: %s" % miss)
    L.append("")
    L.append("Targets are checked on the compiled default operator of the default artifact "
             "(what `asapc compile` picks); the other rows show the alternatives.")
    L.append("")
    L += ["![agreement with the teacher vs log-sum-exp passes](images/%s)" % os.path.basename(png), ""]
    for r in results:
        L += ["## %s" % teacher_title(r), ""]
        rec = r.get("teacher_recorded_accuracy")
        L.append("%d test examples%s. Artifact `%s`%s; backend `%s`."
                 % (r["test_examples"],
                    "; accuracy recorded at training: %.2f%%" % rec if rec is not None else "",
                    r["artifact"]["path"],
                    ", KL artifact `%s`" % r["kl_artifact"]["path"] if r.get("kl_artifact") else "",
                    r["backend"]))
        L.append("")
        def stored(l):
            if l.get("operator", "asap") != "asap":
                return "`%s` %s" % (l["name"], l["describe"])
            return "`%s` %s%s, default k = %d" % (l["name"], l["family"],
                                                  "/head" if l["per_head"] else "/pool",
                                                  l["default_closures"])
        L.append("Compiled layers (default, `--fit attention`): "
                 + "; ".join(stored(l) for l in r["artifact"]["layers"]) + ".")
        if r.get("kl_artifact"):
            L.append("KL: " + "; ".join(stored(l) for l in r["kl_artifact"]["layers"]) + ".")
        L.append("")
        L += variant_table(r)
        L.append("")
        ver = r.get("verify")
        L.append("### Per layer: faster than the teacher, closer than Sinkhorn of the same speed?")
        L.append("")
        if ver:
            L.append("From `asapc verify --json` on `%s` (%s examples per layer; latency = median "
                     "per batch of %s). *Speed-up* is the teacher's latency over the default "
                     "operator's, in the same run. *Closer?* compares the default operator's attention "
                     "relative error with the best reduced-budget Sinkhorn normalizer whose "
                     "measured latency (first pair) or log-sum-exp pass count (second pair) is "
                     "equal or lower."
                     % (ver.get("data"), ver["layers"][0].get("examples"), "16 examples"))
            L.append("")
        L += layer_table(r)
        L.append("")
        L += curve_section(r, "images/" + os.path.basename(curve_png[r["name"]]) if r["name"] in curve_png else None)
        if ver:
            model = ver.get("model_speedup")
            if not model or model < MIN_SPEEDUP:
                L.append("On this run the model is less than %.2fx faster than the teachers (%s, n = %s). "
                         "Compile chose its operators on its own timing of the same kernels, and may "
                         "exceed the budget by its measured timing noise when that brings the model "
                         "at least twice as close to the teachers (docs/decisions.md); the two runs "
                         "also differ by timing noise (each layer's fit record has compile's latency "
                         "table and the model's budget)."
                         % (MIN_SPEEDUP, "%.2fx" % model if model else "untimed", _n_of(r)))
                L.append("")
    L += ["## Reproducing", "",
          "```sh",
          "tools/train/evaluate.sh            # compile what is missing, evaluate, write docs/results.md",
          "tools/train/evaluate.sh --train    # retrain the T = 5 and text teachers first",
          "```", ""]
    text = "\n".join(L)
    with open(a.output, "w") as fh:
        fh.write(text)
    log("wrote %s and %s" % (a.output, ", ".join(images)))
    return 0


def main(argv=None):
    p = argparse.ArgumentParser(prog="evaluate.py", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="evaluate one teacher -> JSON")
    r.add_argument("--name", required=True)
    r.add_argument("--teacher", required=True, help="checkpoint written by train_teachers.py")
    r.add_argument("--artifact", required=True, help="the default artifact (asapc compile without --fit)")
    r.add_argument("--kl-artifact", help="artifact compiled with --fit kl")
    r.add_argument("--verify-json", help="asapc verify --json output of the default artifact")
    r.add_argument("--curve-json", help="output of `evaluate.py curve` to include")
    r.add_argument("--max-closures", type=int, default=4,
                   help="ASAP with k = 1..N closures (and the compiled default k in any case)")
    r.add_argument("--max-examples", type=int)
    r.add_argument("--batch-size", type=int, default=500)
    r.add_argument("--threads", type=int, default=1)
    r.add_argument("--backend", default=None, choices=("auto", "op", "torch"))
    r.add_argument("-o", "--output", required=True)
    c = sub.add_parser("curve", help="agreement against speed-up over --min-speedup targets -> JSON")
    c.add_argument("--name", required=True)
    c.add_argument("--teacher", required=True)
    c.add_argument("--point", action="append", required=True,
                   help="LABEL=ARTIFACT=VERIFY_JSON, one per compile target (repeatable)")
    c.add_argument("--max-examples", type=int)
    c.add_argument("--batch-size", type=int, default=500)
    c.add_argument("--threads", type=int, default=1)
    c.add_argument("--backend", default=None, choices=("auto", "op", "torch"))
    c.add_argument("-o", "--output", required=True)
    g = sub.add_parser("report", help="result JSON files -> Markdown")
    g.add_argument("results", nargs="+")
    g.add_argument("-o", "--output", required=True)
    g.add_argument("--plot-name", default="results_agreement.png",
                   help="file name of the agreement-against-passes plot, under images/ beside the output")
    g.add_argument("--missing", action="append", default=[],
                   help="a teacher that was not evaluated and why (repeatable)")
    a = p.parse_args(argv)
    return {"run": run, "curve": curve, "report": report}[a.cmd](a)


if __name__ == "__main__":
    sys.exit(main())
