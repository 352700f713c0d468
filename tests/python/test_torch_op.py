#!/usr/bin/env python3
"""Tests of the TorchScript operator library (libasap_torch_op.so) and the
asap_torch package (no pytest needed).

    ASAPC=build/asapc ${PYTHON:-/usr/bin/python3} tests/python/test_torch_op.py [-k SUBSTRING]

Compiles two small artifacts from the fixtures with $ASAPC (default
build/asapc), then checks the custom operator against the pure-PyTorch
operator, patched models against running the model with the operator by
hand, TorchScript, errors, the cache and threads; the operator kinds of
format_version 3 ('sinkhorn', 'teacher' layers, written with h5py from the
compiled artifacts) against the teacher's loop with T' or T half-steps; and
the exact teacher without an artifact (torch.ops.asap.teacher,
patch_model(exact=True)) against the unpatched Sinkformer-style models; and
the score_stats feature columns (format_version 5) against a direct
computation and across both backends. The library is found as
asap_torch finds it ($ASAP_TORCH_OP, next to $ASAPC, build/src/torch_op/).
A missing library fails the run unless ASAP_ALLOW_NO_TORCH_OP=1 (then the
tests that need it are skipped and the fallback is still tested).

Prints one line per test and 'N passed, M failed' at the end; exits 1 when
any test failed.
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading

import numpy as np
import torch
import h5py

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TOOLS = os.path.join(REPO, "tools")
PYPKG = os.path.join(REPO, "python")          # the asap_torch package, from the source tree
FIXTURES = os.path.join(REPO, "tests", "data", "fixtures")
sys.path[:0] = [TOOLS, os.path.join(TOOLS, "bench"), PYPKG]
import sinkformer_models as sm  # noqa: E402
import asap_torch  # noqa: E402
from asap_torch import reference  # noqa: E402
import harness  # noqa: E402
from harness import Skip, test  # noqa: E402

PYTHON = os.environ.get("PYTHON", sys.executable)
ASAPC = os.environ.get("ASAPC") or os.path.join(REPO, "build", "asapc")
ALLOW_NO_OP = os.environ.get("ASAP_ALLOW_NO_TORCH_OP") == "1"
VIT = ["transformer.layers.0.0.fn", "transformer.layers.1.0.fn"]
TEXT = ["layers.0.mha", "layers.1.mha"]
TOL = 1e-5

torch.set_num_threads(1)
OP = asap_torch.op_available()


def need_op():
    if not OP:
        raise Skip("libasap_torch_op.so not available (ASAP_ALLOW_NO_TORCH_OP=1)")


def close(got, want, what, tol=TOL):
    """max |got - want| <= tol * max(1, max |want|), NaN/Inf equal in place."""
    got = got.detach().double().cpu().numpy() if torch.is_tensor(got) else np.asarray(got)
    want = want.detach().double().cpu().numpy() if torch.is_tensor(want) else np.asarray(want)
    assert got.shape == want.shape, "%s: shape %s, expected %s" % (what, got.shape, want.shape)
    fin = np.isfinite(want)
    assert np.array_equal(fin, np.isfinite(got)), "%s: non-finite entries differ" % what
    if not fin.any():
        return 0.0
    err = float(np.max(np.abs(got[fin] - want[fin])))
    scale = max(1.0, float(np.max(np.abs(want[fin]))))
    assert err <= tol * scale, "%s: max abs error %.3g > %.3g" % (what, err, tol * scale)
    return err


def run(cmd, **kw):
    r = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, **kw)
    assert r.returncode == 0, "%s failed (%d):\n%s%s" % (" ".join(cmd), r.returncode, r.stdout,
                                                        r.stderr)
    return r


# --------------------------------------------------------------------------
# artifacts, compiled once
# --------------------------------------------------------------------------

WORK = tempfile.mkdtemp(prefix="asap_torch_op_test_")
_art = {}


def asap_only_flags():
    """compile flags that keep every layer an ASAP map (the tests below
    assume closures): --objective fidelity chooses by accuracy alone, with no
    timing, where this asapc can store plain Sinkhorn or the teacher."""
    r = subprocess.run([ASAPC, "compile", "--help"], capture_output=True, text=True)
    return ["--objective", "fidelity"] if "fidelity" in r.stdout + r.stderr else []


def artifacts():
    """{'vit': path, 'text': path, 'vit_calib': path, 'text_calib': path}"""
    if _art:
        return _art
    assert os.path.isfile(ASAPC), "asapc not found at %s (set ASAPC)" % ASAPC
    flags = asap_only_flags()
    rec = os.path.join(TOOLS, "record_calib.py")
    vit_calib = os.path.join(WORK, "vit_calib.h5")
    text_calib = os.path.join(WORK, "text_calib.h5")
    run([PYTHON, rec, "--demo", "vit", "--demo-n", "64", "-o", vit_calib, "--quiet"])
    run([PYTHON, rec, "--demo", "text", "--demo-n", "64", "-o", text_calib, "--quiet"])
    vit = os.path.join(WORK, "vit.asap.h5")
    run([ASAPC, "compile", os.path.join(FIXTURES, "vit_checkpoint.pt"), "--spec",
         os.path.join(FIXTURES, "vit.spec.json"), "--calib", vit_calib, "-o", vit, "--no-report",
         "-q", "--threads", "1"] + flags)
    spec = os.path.join(WORK, "text.spec.json")
    run([ASAPC, "inspect", os.path.join(FIXTURES, "text_state_dict.pt"), "--T", "5", "--heads",
         "4", "-o", spec])
    text = os.path.join(WORK, "text.asap.h5")
    run([ASAPC, "compile", os.path.join(FIXTURES, "text_state_dict.pt"), "--spec", spec,
         "--calib", text_calib, "-o", text, "--no-report", "-q", "--threads", "1"] + flags)
    _art.update(vit=vit, text=text, vit_calib=vit_calib, text_calib=text_calib)
    return _art


def _family_artifacts(tag, vit_features, text_features):
    """{'vit': path, 'text': path}: the fixtures compiled with only the given
    families, whatever asapc would choose by default (cached under tag)."""
    a = artifacts()
    if "vit_" + tag not in _art:
        flags = asap_only_flags() + ["--no-report", "-q", "--threads", "1"]
        for kind, ckpt, spec, calib, feats in (
                ("vit", "vit_checkpoint.pt", os.path.join(FIXTURES, "vit.spec.json"), a["vit_calib"], vit_features),
                ("text", "text_state_dict.pt", os.path.join(WORK, "text.spec.json"), a["text_calib"], text_features)):
            out = os.path.join(WORK, "%s_%s.asap.h5" % (kind, tag))
            run([ASAPC, "compile", os.path.join(FIXTURES, ckpt), "--spec", spec, "--calib", calib, "-o", out,
                 "--features", feats] + flags)
            _art[kind + "_" + tag] = out
    return {"vit": _art["vit_" + tag], "text": _art["text_" + tag]}


def stats_artifacts():
    """The fixtures with the score_stats columns (vit: L+alpha+softmax+sinkhorn3+stats, text: alpha+stats)."""
    return _family_artifacts("stats", "slices+alpha+softmax+sinkhorn3+stats", "alpha+stats")


def cstats_artifacts():
    """The fixtures with the centered_stats columns (vit: all = L+alpha+softmax+sinkhorn3+cstats, text: alpha+cstats)."""
    return _family_artifacts("cstats", "all", "alpha+cstats")


def vit_model():
    model = sm.fixture_vit()
    sd = torch.load(os.path.join(FIXTURES, "vit_checkpoint.pt"), map_location="cpu")
    model.load_state_dict(sd["model_state_dict"] if "model_state_dict" in sd else sd)
    return model.eval()


def text_model():
    model = sm.fixture_text()
    model.load_state_dict(torch.load(os.path.join(FIXTURES, "text_state_dict.pt"),
                                     map_location="cpu"))
    return model.eval()


def projected(art_path, calib_path, layer, count=12, dtype=torch.float32):
    """Per-head q, k, v [B, H, n, d] and key mask of recorded activations,
    projected with the artifact's weights."""
    with h5py.File(calib_path, "r") as f:
        g = f["layers"][layer] if "layers" in f else f[layer]
        x = torch.from_numpy(g["x"][:count]).to(dtype)
        mask = g["mask"] if "mask" in g else f["mask"] if "mask" in f else None
        mask = None if mask is None else torch.from_numpy(mask[:count]).bool()
    p = asap_torch.read_artifact(art_path)[1]
    p = {q.name: q for q in p}[layer]
    w = {k: torch.from_numpy(v).to(dtype) for k, v in p.weights.items()}

    def proj(wk, bk, dh):
        y = x @ w[wk].T + (w[bk] if bk in w else 0)
        return y.view(x.shape[0], x.shape[1], p.heads, dh).transpose(1, 2)
    return (proj("wq", "bq", p.head_dim), proj("wk", "bk", p.head_dim),
            proj("wv", "bv", p.value_dim), mask)


# --------------------------------------------------------------------------
# the library
# --------------------------------------------------------------------------

@test
def test_library_found():
    if not OP and not ALLOW_NO_OP:
        raise AssertionError(
            "libasap_torch_op.so not found or not loadable: %s. Build it (cmake --build build "
            "--target asap_torch_op, needs ASAP_BUILD_TORCH_OP=ON) or point ASAP_TORCH_OP at it; "
            "ASAP_ALLOW_NO_TORCH_OP=1 runs the rest without it." % asap_torch.library_error())
    need_op()
    for op in ("load", "layers", "layer_info", "attend", "attend_with_attention", "attend_full",
               "forward", "path", "teacher"):
        assert callable(getattr(torch.ops.asap, op)), op
    print("     library: %s" % asap_torch.library_path())


@test
def test_load_cache_and_info():
    need_op()
    a = artifacts()
    h = torch.ops.asap.load(a["vit"])
    assert torch.ops.asap.load(a["vit"]) == h
    assert torch.ops.asap.load(os.path.join(WORK, ".", "vit.asap.h5")) == h   # canonical path
    assert list(torch.ops.asap.layers(h)) == VIT
    assert torch.ops.asap.path(h) == os.path.realpath(a["vit"])
    _, params = asap_torch.read_artifact(a["vit"])
    for p in params:
        info = json.loads(torch.ops.asap.layer_info(h, p.name))
        assert info["spec"]["name"] == p.name and info["spec"]["T"] == p.T == 6
        assert info["spec"]["heads"] == p.heads and info["default_closures"] == p.default_closures
        assert info["family"]["name"] == p.family_name, (info["family"], p.family_name)
        assert info["per_head"] == p.per_head
        assert info["coef_shape"] == list(p.coef.shape) and info["has_weights"]
        assert isinstance(info["fit"], dict)
    # a changed file is loaded again under a new handle; the old one stays valid
    copy = os.path.join(WORK, "vit_copy.asap.h5")
    with open(a["vit"], "rb") as src, open(copy, "wb") as dst:
        dst.write(src.read())
    h1 = torch.ops.asap.load(copy)
    assert h1 != h
    t = os.stat(copy).st_mtime + 5
    os.utime(copy, (t, t))
    h2 = torch.ops.asap.load(copy)
    assert h2 != h1 and torch.ops.asap.load(copy) == h2
    assert list(torch.ops.asap.layers(h1)) == VIT


def _compare_backends(kind, layers, dtype, masks, path=None):
    """Max |op - PyTorch| over layers, masks and k = 1..4 for the compiled
    artifact of kind ('vit' | 'text'; path: another artifact of that kind)."""
    a = artifacts()
    path = path or a[kind]
    op = asap_torch.load_artifact(path, backend="op")
    pt = asap_torch.load_artifact(path, backend="torch")
    assert op.backend == "op" and pt.backend == "torch"
    worst = 0.0
    for layer in layers:
        q, k, v, rec_mask = projected(path, a[kind + "_calib"], layer, dtype=dtype)
        B, H, n, _ = q.shape
        cases = {"none": None}
        if rec_mask is not None:
            cases["recorded"] = rec_mask
        if masks:
            m = torch.ones(B, n, dtype=torch.bool)
            for b in range(B):
                m[b, max(1, n - 1 - b):] = False         # lengths n-1 .. 1, padded at the end
            m[0, 0] = False                               # padding in front as well
            m[0, -1] = True
            cases["synthetic"] = m
        p = pt.layer(layer)
        for cname, mask in cases.items():
            for kk in (1, 2, 3, 4):
                o1, A1, f1 = op.attend(layer, q, k, v, mask, kk, True, True)
                o2, A2, f2 = pt.attend(layer, q, k, v, mask, kk, True, True)
                what = "%s %s %s mask=%s k=%d" % (kind, layer, dtype, cname, kk)
                assert o1.dtype == dtype and o1.shape == (B, H, n, p.value_dim), what
                worst = max(worst, close(o1, o2, what + " out"), close(A1, A2, what + " attention"),
                            close(f1, f2, what + " phi_hat"))
                # plain attend == attend_full's output; columns exact after an odd k
                close(op.attend(layer, q, k, v, mask, kk), o1, what + " attend()", tol=0)
                if kk % 2 == 1:
                    col = A1.sum(-2)
                    active = torch.ones(B, 1, n, dtype=torch.bool) if mask is None else \
                        mask.unsqueeze(1)
                    err = float((col - 1).abs().masked_fill(~active.expand_as(col), 0).max())
                    assert err < 1e-4, "%s: column sums off by %.3g" % (what, err)
    return worst


@test
def test_op_matches_fallback_vit():
    need_op()
    for dtype in (torch.float32, torch.float64):
        err = _compare_backends("vit", VIT, dtype, masks=True)
        print("     vit %s: max abs difference op vs PyTorch %.2g" % (dtype, err))


@test
def test_op_matches_fallback_text():
    need_op()
    for dtype in (torch.float32, torch.float64):
        err = _compare_backends("text", TEXT, dtype, masks=True)
        print("     text %s: max abs difference op vs PyTorch %.2g" % (dtype, err))


@test
def test_default_closures():
    # closures None / 0 = the compiled default; the fallback's teacher is
    # sinkformer_models' Sinkhorn
    a = artifacts()
    for backend in (("op", "torch") if OP else ("torch",)):
        art = asap_torch.load_artifact(a["vit"], backend=backend)
        q, k, v, _ = projected(a["vit"], a["vit_calib"], VIT[0], dtype=torch.float64)
        d = art.layer(VIT[0]).default_closures
        close(art.attend(VIT[0], q, k, v), art.attend(VIT[0], q, k, v, closures=d), "default k", 0)
        close(art.attend(VIT[0], q, k, v, closures=0), art.attend(VIT[0], q, k, v, closures=d),
              "k=0", 0)
    p = asap_torch.load_artifact(a["vit"], backend="torch").layer(VIT[0])
    _, A_teacher = reference.sinkhorn(q, k, v, scale=p.score_scale, eps=p.eps, T=p.T)
    A_sm = sm.sinkhorn_attention(torch.matmul(q, k.transpose(-1, -2)) * p.score_scale, p.eps, p.T)
    # sinkformer_models keeps log(1/n) in float32, as the reference code does
    close(A_teacher, A_sm, "reference teacher vs sinkformer_models", 1e-6)


# --------------------------------------------------------------------------
# patched models
# --------------------------------------------------------------------------

def vit_by_hand(model, art, x, closures):
    """The ViT forward written out, attention through torch.ops.asap.attend."""
    h = torch.ops.asap.load(art)
    t = model.to_patch_embedding(x)
    b, n, _ = t.shape
    t = torch.cat((model.cls_token.expand(b, -1, -1), t), dim=1) + model.pos_embedding[:, :n + 1]
    for i, (attn, ff) in enumerate(model.transformer.layers):
        name = "transformer.layers.%d.0.fn" % i
        mod = attn.fn
        y = attn.norm(t)
        q, k, v = (u.view(b, n + 1, mod.heads, -1).transpose(1, 2)
                   for u in mod.to_qkv(y).chunk(3, dim=-1))
        o = torch.ops.asap.attend(h, name, q, k, v, None, closures.get(name, 0))
        t = mod.to_out(o.transpose(1, 2).reshape(b, n + 1, -1)) + t
        if not model.transformer.attn_only:
            t = ff(t) + t
    t = t.mean(dim=1) if model.pool == "mean" else t[:, 0]
    return model.mlp_head(t)


def text_by_hand(model, art, tokens, closures):
    h = torch.ops.asap.load(art)
    b, n = tokens.shape
    pos = (torch.arange(n).repeat(b, 1) + 1).masked_fill(tokens.eq(model.pad_id), 0)
    x = model.embedding(tokens) + model.pos_embedding(pos)
    key_mask = tokens.ne(model.pad_id)
    for i, layer in enumerate(model.layers):
        name = "layers.%d.mha" % i
        mha = layer.mha
        q, k, v = (w(x).view(b, n, mha.n_heads, -1).transpose(1, 2)
                   for w in (mha.WQ, mha.WK, mha.WV))
        o = torch.ops.asap.attend(h, name, q, k, v, key_mask, closures.get(name, 0))
        a = mha.linear(o.transpose(1, 2).reshape(b, n, -1))
        a = layer.layernorm1(x + a)
        x = layer.layernorm2(a + layer.ffn(a))
    x, _ = torch.max(x, dim=1)
    return model.softmax(model.linear(x))


@test
def test_patched_vit_equals_by_hand():
    need_op()
    a = artifacts()
    model = vit_model()
    x = sm.synthetic_images(9, seed=5)
    with torch.no_grad():
        teacher, teacher_attn = model(x)
        for closures in (None, 1, {VIT[0]: 2, VIT[1]: 4}):
            asap_torch.patch_model(model, a["vit"], closures=closures)
            assert sorted(asap_torch.patched_layers(model)) == VIT
            got, attn = model(x)
            cl = closures if isinstance(closures, dict) else \
                {n: closures or 0 for n in VIT}
            want = vit_by_hand(model, a["vit"], x, cl)
            close(got, want, "patched ViT logits, closures=%s" % (closures,), 1e-6)
            assert len(attn) == 2 and attn[0].shape == teacher_attn[0].shape
            assert not np.allclose(attn[0], teacher_attn[0])        # not the teacher any more
        # the compiled model predicts like its teacher on most inputs, and unpatching restores it
        agree = float((got.argmax(-1) == teacher.argmax(-1)).float().mean())
        asap_torch.unpatch_model(model)
        assert asap_torch.patched_layers(model) == {}
        close(model(x)[0], teacher, "unpatched ViT", 0)
    assert agree >= 0.5, agree
    # patching does not touch the state dict
    assert set(model.state_dict()) == set(vit_model().state_dict())


@test
def test_patched_text_equals_by_hand():
    need_op()
    a = artifacts()
    model = text_model()
    tokens = sm.synthetic_tokens(10, seed=11)
    assert bool(tokens.eq(0).any())                        # padded batch
    with torch.no_grad():
        teacher = model(tokens)[0]
        for closures in (None, 1, 3):
            asap_torch.patch_model(model, a["text"], closures=closures)
            got, attn = model(tokens)
            want = text_by_hand(model, a["text"], tokens, {n: closures or 0 for n in TEXT})
            close(got, want, "patched text output, closures=%s" % closures, 1e-6)
            assert attn[0].shape == (10, 4, 12, 12)
        asap_torch.patch_model(model, a["text"], return_attention=False)
        got2, attn2 = model(tokens)
        close(got2, text_by_hand(model, a["text"], tokens, {}), "return_attention=False", 1e-6)
        assert attn2[0].numel() == 0
        # keep_details still records attention and head outputs
        with sm.keep_details(model):
            model(tokens)
            assert model.layers[0].mha.saved["attn"].shape == (10, 4, 12, 12)
        asap_torch.unpatch_model(model)
        close(model(tokens)[0], teacher, "unpatched text model", 0)


@test
def test_forward_op_matches_patched_module():
    # torch.ops.asap.forward uses the artifact's projections; the patched
    # module its own (the same weights): equal to rounding
    need_op()
    a = artifacts()
    h = torch.ops.asap.load(a["text"])
    model = text_model()
    asap_torch.patch_model(model, a["text"])
    tokens = sm.synthetic_tokens(6, seed=2)
    x = model.embedding(tokens) + model.pos_embedding(
        (torch.arange(12).repeat(6, 1) + 1).masked_fill(tokens.eq(0), 0))
    pad = model.get_attention_padding_mask(tokens, tokens, 0)
    with torch.no_grad():
        want = model.layers[0].mha(x, x, x, pad)[0]
        got = torch.ops.asap.forward(h, TEXT[0], x, tokens.ne(0), 0)
    close(got, want, "asap::forward vs patched module", 1e-5)


@test
def test_patch_refuses_mismatch():
    a = artifacts()
    backend = "op" if OP else "torch"
    # a text artifact on the ViT: no such modules
    try:
        asap_torch.patch_model(vit_model(), a["text"], backend=backend)
        raise AssertionError("patching the ViT with the text artifact did not fail")
    except ValueError as e:
        assert "no module named 'layers.0.mha'" in str(e) and "transformer.layers.0.0.fn" in str(e)
    # another T
    try:
        asap_torch.patch_model(sm.fixture_vit(max_iter=5), a["vit"], backend=backend)
        raise AssertionError("a T = 5 model accepted a T = 6 artifact")
    except ValueError as e:
        assert "T = 5" in str(e) and "T = 6" in str(e), e
    # other weights
    try:
        asap_torch.patch_model(sm.fixture_vit(seed=3), a["vit"], backend=backend)
        raise AssertionError("other weights accepted")
    except ValueError as e:
        assert "to_qkv.weight differs" in str(e), e
    m = sm.fixture_vit(seed=3)
    asap_torch.patch_model(m, a["vit"], check=False, backend=backend)   # on request
    assert sorted(asap_torch.patched_layers(m)) == VIT
    try:
        asap_torch.patch_model(vit_model(), a["vit"], closures={"nope": 1}, backend=backend)
        raise AssertionError("unknown closures key accepted")
    except ValueError as e:
        assert "nope" in str(e)


# --------------------------------------------------------------------------
# TorchScript, errors, threads, fallback
# --------------------------------------------------------------------------

@test
def test_torchscript():
    need_op()
    a = artifacts()

    @torch.jit.script
    def scripted(h: int, name: str, q, k, v, mask: torch.Tensor, closures: int):
        out = torch.ops.asap.attend(h, name, q, k, v, mask, closures)
        both = torch.ops.asap.attend_with_attention(h, name, q, k, v, mask, closures)
        return out, both[1]
    h = torch.ops.asap.load(a["text"])
    q, k, v, mask = projected(a["text"], a["text_calib"], TEXT[1], count=5)
    out, attn = scripted(h, TEXT[1], q, k, v, mask, 2)
    close(out, torch.ops.asap.attend(h, TEXT[1], q, k, v, mask, 2), "scripted", 0)
    assert attn.shape == (5, 4, 12, 12)
    assert "asap::attend" in str(scripted.graph)


@test
def test_errors_are_value_errors():
    need_op()
    a = artifacts()
    h = torch.ops.asap.load(a["vit"])
    q = torch.randn(2, 2, 17, 16)
    cases = [
        (lambda: torch.ops.asap.load(os.path.join(WORK, "missing.h5")), "does not exist"),
        (lambda: torch.ops.asap.load(a["vit_calib"]), "vit_calib.h5"),
        (lambda: torch.ops.asap.attend(h, "nope", q, q, q, None, 0), "has no layer 'nope'"),
        (lambda: torch.ops.asap.attend(h, VIT[0], q[:, :1], q, q, None, 0), "q must be [B, 2, n, 16]"),
        (lambda: torch.ops.asap.attend(h, VIT[0], q, q, q, torch.ones(2, 5, dtype=torch.bool), 0),
         "mask"),
        (lambda: torch.ops.asap.attend(h, VIT[0], q, q, q, torch.zeros(2, 17, dtype=torch.bool), 0),
         "at least one token"),
        (lambda: torch.ops.asap.attend(h, VIT[0], q, q, q, torch.ones(2, 17), 0), "bool or integer"),
        (lambda: torch.ops.asap.attend(h, VIT[0], q, q, q, None, -1), "closures must be >= 0"),
        (lambda: torch.ops.asap.attend(12345, VIT[0], q, q, q, None, 0), "unknown artifact handle"),
        (lambda: torch.ops.asap.layer_info(h, "nope"), "has no layer"),
    ]
    for fn, text in cases:
        try:
            fn()
        except ValueError as e:
            assert text in str(e), "expected %r in: %s" % (text, e)
        else:
            raise AssertionError("no error; expected one containing %r" % text)
    # integer masks are accepted (nonzero = token): the same bits as the bool
    # mask. (Against no mask at all only up to rounding: with a mask the
    # slice columns take the per-sequence path.)
    m = torch.ones(2, 17, dtype=torch.int64)
    m[1, 13:] = 0
    m[0, 5] = 7
    close(torch.ops.asap.attend(h, VIT[0], q, q, q, m, 1),
          torch.ops.asap.attend(h, VIT[0], q, q, q, m != 0, 1), "int mask", 0)
    close(torch.ops.asap.attend(h, VIT[0], q, q, q, torch.ones(2, 17, dtype=torch.int32), 1),
          torch.ops.asap.attend(h, VIT[0], q, q, q, None, 1), "all-token int mask", 1e-5)
    # inputs that require grad: works, warns that no gradient flows
    qg = q.clone().requires_grad_()
    out = torch.ops.asap.attend(h, VIT[0], qg, q, q, None, 1)
    assert not out.requires_grad


@test
def test_threads():
    need_op()
    a = artifacts()
    h = torch.ops.asap.load(a["vit"])
    q, k, v, _ = projected(a["vit"], a["vit_calib"], VIT[1], count=8)
    want = torch.ops.asap.attend(h, VIT[1], q, k, v, None, 3)
    results, errors = [None] * 4, []

    def work(i):
        try:
            h2 = torch.ops.asap.load(a["vit"])           # concurrent cache lookups too
            for _ in range(10):
                results[i] = torch.ops.asap.attend(h2, VIT[1], q, k, v, None, 3)
        except Exception as e:  # pragma: no cover - reported below
            errors.append(e)
    ts = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert not errors, errors
    for r in results:
        close(r, want, "thread result", 0)


@test
def test_fallback_without_library():
    # in a fresh interpreter with the library hidden: one warning, same numbers
    a = artifacts()
    code = r"""
import sys, warnings, torch
sys.path[:0] = [%r, %r]
import asap_torch, sinkformer_models as sm
with warnings.catch_warnings(record=True) as w:
    warnings.simplefilter("always")
    art = asap_torch.load_artifact(%r)
    art2 = asap_torch.load_artifact(%r)
    model = sm.fixture_vit()
    model.load_state_dict(torch.load(%r)["model_state_dict"])
    asap_torch.patch_model(model.eval(), art)
    with torch.no_grad():
        y = model(sm.synthetic_images(4, seed=5))[0]
    # the exact teacher falls back too (the same one warning)
    tm, tok = sm.fixture_text(), sm.synthetic_tokens(6, seed=11)
    with torch.no_grad():
        want = tm(tok)
        asap_torch.patch_model(tm, exact=True)
        assert all(m.backend == "torch" for m in asap_torch.patched_layers(tm).values())
        got = tm(tok)
    assert float((got[0] - want[0]).abs().max()) <= 1e-5
    assert max(float((a - b).abs().max()) for a, b in zip(got[1], want[1])) <= 1e-5
msgs = [str(x.message) for x in w if "pure-PyTorch fallback" in str(x.message)]
assert art.backend == "torch" and len(msgs) == 1, msgs
torch.save(y, %r)
print("ok")
""" % (TOOLS, PYPKG, a["vit"], a["vit"], os.path.join(FIXTURES, "vit_checkpoint.pt"),
       os.path.join(WORK, "fallback_logits.pt"))
    env = dict(os.environ, ASAP_TORCH_OP=os.path.join(WORK, "no_such_lib.so"))
    r = subprocess.run([PYTHON, "-c", code], capture_output=True, text=True, env=env, cwd=REPO)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stdout + r.stderr
    y = torch.load(os.path.join(WORK, "fallback_logits.pt"))
    if OP:
        model = vit_model()
        asap_torch.patch_model(model, a["vit"], backend="op")
        with torch.no_grad():
            close(model(sm.synthetic_images(4, seed=5))[0], y, "op vs fallback logits", 1e-5)
    # backend="op" without the library is an error, not a silent fallback
    code2 = "import sys; sys.path.insert(0, %r)\nimport asap_torch\ntry:\n" \
            "    asap_torch.load_artifact(%r, backend='op')\nexcept RuntimeError as e:\n" \
            "    print('refused' if 'not available' in str(e) else e)\n" % (PYPKG, a["vit"])
    r = subprocess.run([PYTHON, "-c", code2], capture_output=True, text=True, env=env, cwd=REPO)
    assert r.stdout.strip() == "refused", r.stdout + r.stderr


# --------------------------------------------------------------------------
# the exact teacher without an artifact: torch.ops.asap.teacher, exact=True
# --------------------------------------------------------------------------

BACKENDS = ("op", "torch") if OP else ("torch",)


class OfficialAttention(torch.nn.Module):
    """The released Sinkformer ViT Attention (vit-pytorch/vit_pytorch/vit.py):
    T and eps live in `sink`, a SinkhornDistance; no `eps` attribute."""

    def __init__(self, dim, heads, dim_head, max_iter, eps):
        super().__init__()
        import bench_pytorch
        inner = dim_head * heads
        self.heads, self.scale, self.max_iter = heads, dim_head ** -0.5, max_iter
        self.sink = bench_pytorch.SinkhornDistance(eps=eps, max_iter=max_iter)
        self.to_qkv = torch.nn.Linear(dim, inner * 3, bias=False)
        self.to_out = torch.nn.Sequential(torch.nn.Linear(inner, dim), torch.nn.Dropout(0.0))

    def forward(self, x):
        q, k, v = (t.view(x.shape[0], x.shape[1], self.heads, -1).transpose(1, 2)
                   for t in self.to_qkv(x).chunk(3, dim=-1))
        dots = torch.matmul(q, k.transpose(-1, -2)) * self.scale
        shape = dots.shape
        attn = self.sink(dots.view(-1, shape[2], shape[3]))[0]
        attn = (attn * attn.shape[-1]).view(shape)
        out = torch.matmul(attn, v).transpose(1, 2).reshape(x.shape[0], x.shape[1], -1)
        return self.to_out(out), attn


def _exact_cases():
    """(what, model, inputs, attention modules) of Sinkformer-style models."""
    torch.manual_seed(7)
    off = OfficialAttention(32, 2, 16, max_iter=7, eps=0.7).eval()
    return [("ViT fixture T=6", vit_model(), (sm.synthetic_images(7, seed=5),)),
            ("ViT T=5 eps=0.5", sm.fixture_vit(max_iter=5, eps=0.5), (sm.synthetic_images(5, seed=6),)),
            ("text fixture T=5, padded", text_model(), (sm.synthetic_tokens(9, seed=11),)),
            ("text T=8, padded", sm.fixture_text(n_it=8), (sm.synthetic_tokens(8, seed=3),)),
            ("official ViT Attention T=7 eps=0.7", off, (torch.randn(4, 17, 32),))]


def _outputs(model, inputs):
    y, attn = model(*inputs)
    attn = [torch.as_tensor(a) for a in attn] if isinstance(attn, list) else [attn]
    return y, attn


@test
def test_exact_patch_matches_models():
    for what, model, inputs in _exact_cases():
        if "text" in what:
            assert bool(inputs[0].eq(0).any()), what + ": the batch should be padded"
        mods = [n for n, m in model.named_modules() if asap_torch.module_kind(m)]
        for dtype in (torch.float32, torch.float64):
            model = model.to(dtype)
            xs = tuple(x.to(dtype) if x.is_floating_point() else x for x in inputs)
            with torch.no_grad():
                y0, a0 = _outputs(model, xs)
                for backend in BACKENDS:
                    asap_torch.patch_model(model, exact=True, backend=backend)
                    patched = asap_torch.patched_layers(model)
                    assert sorted(patched) == sorted(mods), (what, sorted(patched))
                    assert all(isinstance(m, asap_torch.TeacherAttention) and m.backend == backend
                               for m in patched.values())
                    y1, a1 = _outputs(model, xs)
                    tag = "%s %s %s" % (what, dtype, backend)
                    assert y1.dtype == dtype, tag
                    close(y1, y0, tag + " output")
                    assert len(a1) == len(a0)
                    for i, (a, b) in enumerate(zip(a1, a0)):
                        close(a, b, tag + " attention %d" % i)
                    # return_attention=False: same output, empty attention
                    asap_torch.patch_model(model, exact=True, backend=backend,
                                           return_attention=False)
                    y2, a2 = _outputs(model, xs)
                    close(y2, y0, tag + " return_attention=False")
                    assert all(a.numel() == 0 for a in a2), tag
                    asap_torch.unpatch_model(model)
                    assert asap_torch.patched_layers(model) == {}
                    y3, a3 = _outputs(model, xs)
                    close(y3, y0, tag + " unpatched", 0)
        print("     %s: outputs and attention match (%s)" % (what, ", ".join(BACKENDS)))


@test
def test_exact_reads_module_conventions():
    c = asap_torch.teacher_conventions(OfficialAttention(32, 2, 16, max_iter=7, eps=0.7))
    assert c == {"heads": 2, "head_dim": 16, "scale": 0.25, "eps": 0.7, "T": 7}, c
    c = asap_torch.teacher_conventions(sm.fixture_text(n_it=8).layers[0].mha)
    assert c == {"heads": 4, "head_dim": 8, "scale": 8 ** -0.5, "eps": 1.0, "T": 8}, c
    model = sm.fixture_vit(max_iter=5, eps=0.5)
    asap_torch.patch_model(model, exact=True, backend=BACKENDS[0])
    op = asap_torch.patched_layers(model)[VIT[0]]
    assert (op.T, op.eps, op.scale) == (5, 0.5, 0.25), op
    assert "exact teacher T=5" in repr(model)
    # patch only some layers
    model = sm.fixture_text()
    asap_torch.patch_model(model, exact=True, layers=[TEXT[1]], backend=BACKENDS[0])
    assert list(asap_torch.patched_layers(model)) == [TEXT[1]]


@test
def test_exact_patch_refusals():
    a = artifacts()
    cases = [
        (lambda: asap_torch.patch_model(vit_model(), a["vit"], exact=True), "pass artifact=None"),
        (lambda: asap_torch.patch_model(vit_model(), exact=True, closures=2), "no closures"),
        (lambda: asap_torch.patch_model(vit_model()), "needs an artifact"),
        (lambda: asap_torch.patch_model(vit_model(), exact=True, layers=["nope"]),
         "no module named 'nope'"),
        (lambda: asap_torch.patch_model(torch.nn.Linear(2, 2), exact=True),
         "no Sinkformer attention module"),
    ]
    m = sm.fixture_vit()
    for mod in (m.transformer.layers[0][0].fn, m.transformer.layers[1][0].fn):
        del mod.max_iter
    cases.append((lambda: asap_torch.patch_model(m, exact=True),
                  "does not say its Sinkhorn budget T (no max_iter or sink.max_iter attribute)"))
    for fn, text in cases:
        try:
            fn()
        except ValueError as e:
            assert text in str(e), "expected %r in: %s" % (text, e)
        else:
            raise AssertionError("no error; expected one containing %r" % text)
    assert asap_torch.patched_layers(m) == {}          # nothing patched on refusal


@test
def test_teacher_op():
    # torch.ops.asap.teacher (and asap_torch.teacher on each backend) against
    # the PyTorch loop: sinkformer_models' Sinkhorn and reference.sinkhorn
    g = torch.Generator().manual_seed(3)
    B, H, n, d, dv = 3, 2, 11, 8, 5
    mask = torch.ones(B, n, dtype=torch.bool)
    mask[1, 7:] = False
    mask[2, 0] = False
    mask[2, 3:] = False
    for dtype in (torch.float32, torch.float64):
        q, k = (torch.randn(B, H, n, d, generator=g, dtype=dtype) for _ in range(2))
        v = torch.randn(B, H, n, dv, generator=g, dtype=dtype)
        for T in (1, 2, 3, 6, 7):
            for eps in (1.0, 0.6):
                dots = torch.matmul(q, k.transpose(-1, -2)) * 0.3
                want_nomask = sm.sinkhorn_attention(dots, eps, T)
                pad = ~mask[:, None, None, :].expand(B, H, n, n)
                want_mask = sm.sinkhorn_attention(dots, eps, T, text_mode=True, key_pad=pad)
                for backend in BACKENDS:
                    for km, want in ((None, want_nomask), (mask, want_mask)):
                        tag = "%s T=%d eps=%g %s mask=%s" % (dtype, T, eps, backend, km is not None)
                        out, A = asap_torch.teacher(q, k, v, km, 0.3, T, eps, return_attention=True,
                                                    backend=backend)
                        close(A, want, tag + " attention")
                        close(out, torch.matmul(want, v), tag + " output")
                        o2 = asap_torch.teacher(q, k, v, km, 0.3, T, eps, backend=backend)
                        close(o2, out, tag + " without attention", 0 if backend == "torch" else TOL)
                    # the other conventions: dropped padded queries, the plan itself
                    for drop in (False, True):
                        out, A = asap_torch.teacher(q, k, v, mask, 0.3, T, eps, drop, False, True,
                                                    backend=backend)
                        o_ref, A_ref = reference.sinkhorn(q, k, v, mask, 0.3, eps, T, drop, False)
                        close(A, A_ref, "%s drop=%s plan" % (tag, drop))
                        close(out, o_ref, "%s drop=%s output" % (tag, drop))
    if OP:
        out, A = torch.ops.asap.teacher(q, k, v, None, 0.3, 3)        # defaults: eps 1, n*plan
        assert A.numel() == 0
        close(out, reference.teacher(q, k, v, None, 0.3, 3)[0], "op defaults")

        @torch.jit.script
        def scripted(q, k, v, mask: torch.Tensor, T: int):
            return torch.ops.asap.teacher(q, k, v, mask, 0.3, T, 1.0, False, True, True)
        o, a2 = scripted(q, k, v, mask, 4)
        close(o, asap_torch.teacher(q, k, v, mask, 0.3, 4), "scripted teacher", 0)
        assert "asap::teacher" in str(scripted.graph)


@test
def test_released_outputs_stay_what_python_saw():
    """The fused calls hand a released output tensor out again (docs/serving.md,
    "Output tensors") but never one that was handed to Python: PyTorch keeps a
    released tensor's Python object alive with it, so a weakref or an attribute
    set on the old output would otherwise see the next call's values."""
    if not OP:
        return
    import weakref
    torch.manual_seed(5)
    q, k, v = (torch.randn(1, 2, 17, 16) for _ in range(3))
    q2 = torch.randn(1, 2, 17, 16)
    first = torch.ops.asap.teacher(q, k, v, None, 0.3, 3)[0]
    want = first.clone()
    weak = weakref.ref(first)
    first.tag = "first"
    del first
    second = torch.ops.asap.teacher(q2, k, v, None, 0.3, 3)[0]
    close(second, reference.teacher(q2, k, v, None, 0.3, 3)[0], "the next call", TOL)
    assert not hasattr(second, "tag"), "the next call returned the released output's Python object"
    old = weak()
    assert old is None or torch.equal(old, want), "a weakref to a released output saw the next call's values"


@test
def test_teacher_op_errors():
    q = torch.randn(2, 2, 5, 4)
    cases = [
        ((q, q, q, None, 0.5, 0), "T (Sinkhorn half-steps) must be >= 1, found 0"),
        ((q, q, q, None, 0.5, 2, 0.0), "eps must be a finite number > 0, found 0"),
        ((q, q, q, None, 0.5, 2, float("nan")), "eps must be a finite number > 0"),
        ((q, q, q, None, -1.0, 2), "scale must be a finite number > 0, found -1"),
        ((q[0], q[0], q[0], None, 0.5, 2), "q must be [B, H, n, d], found [2, 5, 4]"),
        ((q, q[:, :, :3], q, None, 0.5, 2), "k must have q's shape [2, 2, 5, 4], found [2, 2, 3, 4]"),
        ((q, q, q[:, :1], None, 0.5, 2), "v must be [2, 2, 5, dv], found [2, 1, 5, 4]"),
        ((q.half(), q, q, None, 0.5, 2), "q must be float32 or float64"),
        ((q, q, q, torch.ones(2, 4, dtype=torch.bool), 0.5, 2), "key-padding mask: expected shape [2, 5]"),
        ((q, q, q, torch.zeros(2, 5, dtype=torch.bool), 0.5, 2), "every sequence needs at least one token"),
        ((q, q, q, torch.ones(2, 5), 0.5, 2), "must be bool"),
    ]
    for backend in BACKENDS:
        for args, text in cases:
            try:
                asap_torch.teacher(*args, backend=backend)
            except ValueError as e:
                assert text in str(e), "%s: expected %r in: %s" % (backend, text, e)
            else:
                raise AssertionError("%s: no error; expected one containing %r" % (backend, text))
    if OP:
        try:
            torch.ops.asap.teacher(q, q, q, None, 0.5, 0)
            raise AssertionError("T = 0 accepted")
        except ValueError as e:
            assert str(e).startswith("asap::teacher: T (Sinkhorn half-steps) must be >= 1"), e


# --------------------------------------------------------------------------
# operator kinds in the artifact (format_version 3)
# --------------------------------------------------------------------------

def _features(g):
    """The 'features' attribute of a layer group as a list of str."""
    return [x.decode() if isinstance(x, bytes) else str(x) for x in np.atleast_1d(g.attrs["features"])]


def _written_version(params):
    """The format_version asapc writes for these layers: 6 when an ASAP layer
    has the centered_stats columns, else 5 when one has the score_stats
    columns, else 4."""
    if any(p.is_asap and p.centered_stats for p in params):
        return 6
    return 5 if any(p.is_asap and p.score_stats for p in params) else 4


def kind_artifact(src, name, kinds, version=None):
    """A copy of the compiled artifact `src` whose layer i is kinds[i]:
    'asap' (unchanged), 'teacher', or an int T' (a 'sinkhorn' layer),
    written with h5py as docs/artifact-format.md says (format_version: as
    asapc would write the result, unless given)."""
    dst = os.path.join(WORK, name)
    shutil.copyfile(src, dst)
    stats = cstats = False
    with h5py.File(dst, "r+") as f:
        for key, kind in zip(sorted(f["layers"], key=int), kinds):
            if kind == "asap":
                stats |= "score_stats" in _features(f["layers"][key])
                cstats |= "centered_stats" in _features(f["layers"][key])
                continue
            g = f["layers"][key]
            # fixed-length strings, as asapc writes (format_version 4)
            g.attrs["operator"] = np.bytes_(b"teacher" if kind == "teacher" else b"sinkhorn")
            if kind != "teacher":
                g.attrs["sinkhorn_steps"] = np.int64(kind)
            # an empty list of fixed-length strings (the format accepts both kinds)
            g.attrs["features"] = np.array([], dtype="S1")
            for attr, val in (("slices", 0), ("per_head", 0), ("default_closures", 1)):
                g.attrs[attr] = np.int64(val)
            hd = int(g.attrs["head_dim"])
            del g["theta"], g["coef"]
            g["theta"] = np.zeros((hd, 0))
            g["coef"] = np.zeros((1, 0))
        f.attrs["format_version"] = np.int64(version or (6 if cstats else 5 if stats else 4))
    return dst


_kinds = {}


def kind_artifacts():
    """{name: (path, source kind, [kind per layer])}: every kind, alone and mixed."""
    if _kinds:
        return _kinds
    a = artifacts()
    for name, src, kinds in (("vit_asap", "vit", ["asap", "asap"]),
                             ("vit_sinkhorn", "vit", [3, 5]),
                             ("vit_teacher", "vit", ["teacher", "teacher"]),
                             ("vit_mixed", "vit", [1, "teacher"]),
                             ("text_sinkhorn", "text", [2, 4]),
                             ("text_teacher", "text", ["teacher", "teacher"]),
                             ("text_mixed", "text", [4, "asap"])):
        _kinds[name] = (kind_artifact(a[src], name + ".asap.h5", kinds), src, kinds)
    return _kinds


def recorded_x(calib_path, layer, count, dtype):
    with h5py.File(calib_path, "r") as f:
        g = f["layers"][layer] if "layers" in f else f[layer]
        return torch.from_numpy(g["x"][:count]).to(dtype)


def _project(x, w, p):
    """Per-head q, k, v of x [B, n, d_model] with the artifact's weights w."""
    def one(wk, bk, dh):
        y = x @ w[wk].T + (w[bk] if bk in w else 0)
        return y.view(x.shape[0], x.shape[1], p.heads, dh).transpose(1, 2)
    return one("wq", "bq", p.head_dim), one("wk", "bk", p.head_dim), one("wv", "bv", p.value_dim)


def _steps(kind, T):
    return None if kind == "asap" else T if kind == "teacher" else kind


@test
def test_kinds_read_and_info():
    for name, (path, src, kinds) in kind_artifacts().items():
        root, params = asap_torch.read_artifact(path)
        assert root["format_version"] == _written_version(params), (name, root["format_version"])
        for p, kind in zip(params, kinds):
            want_op = kind if kind in ("asap", "teacher") else "sinkhorn"
            assert p.operator == want_op, (name, p.name, p.operator)
            assert p.sinkhorn_steps == (kind if want_op == "sinkhorn" else 0)
            if want_op == "sinkhorn":
                assert p.describe == "sinkhorn T'=%d" % kind and p.lse_passes == kind
            elif want_op == "teacher":
                assert p.describe == "teacher T=%d" % p.T and p.lse_passes == p.T
                assert p.num_columns == 0 and p.coef.shape == (1, 0)
            for backend in BACKENDS:
                info = asap_torch.load_artifact(path, backend=backend).info(p.name)
                got = {k: info[k] for k in ("operator", "sinkhorn_steps", "lse_passes", "describe")}
                want = {"operator": p.operator, "sinkhorn_steps": p.sinkhorn_steps,
                        "lse_passes": p.lse_passes, "describe": p.describe}
                assert got == want, (name, backend, got, want)
    # an operator kind in an older file is refused by both readers
    bad = kind_artifact(artifacts()["vit"], "old_version.asap.h5", ["teacher", "asap"], version=2)
    try:
        asap_torch.read_artifact(bad)
        raise AssertionError("operator 'teacher' accepted in format_version 2")
    except asap_torch.ArtifactError as e:
        assert "needs format_version 3" in str(e), e
    if OP:
        try:
            torch.ops.asap.load(bad)
            raise AssertionError("the C++ reader accepted operator 'teacher' in format_version 2")
        except ValueError as e:
            assert "needs format_version 3" in str(e), e


def _text_mask(B, n):
    m = torch.ones(B, n, dtype=torch.bool)
    for b in range(B):
        m[b, max(1, n - 1 - b):] = False
    return m


@test
def test_kinds_attend_and_forward():
    # each layer, each backend: attend / forward equal the teacher's loop with
    # T' (sinkhorn) or T (teacher) half-steps, or the ASAP operator (asap)
    a = artifacts()
    for name, (path, src, kinds) in kind_artifacts().items():
        arts = {b: asap_torch.load_artifact(path, backend=b) for b in BACKENDS}
        asap_ref = asap_torch.load_artifact(a[src], backend="torch")
        for layer, kind in zip(VIT if src == "vit" else TEXT, kinds):
            p = arts[BACKENDS[0]].layer(layer)
            for dtype in (torch.float32, torch.float64):
                q, k, v, rec = projected(path, a[src + "_calib"], layer, count=6, dtype=dtype)
                masks = [None, rec if rec is not None else _text_mask(q.shape[0], q.shape[2])]
                x = recorded_x(a[src + "_calib"], layer, 6, dtype)
                w = {kk: torch.from_numpy(vv).to(dtype) for kk, vv in p.weights.items()}
                for mask in masks:
                    tag = "%s %s %s mask=%s" % (name, layer, dtype, mask is not None)
                    steps = _steps(kind, p.T)

                    def want(q, k, v):
                        if steps is None:
                            return reference.attend(asap_ref.layer(layer), q, k, v, mask, None,
                                                    True)[:2]
                        return reference.sinkhorn(q, k, v, mask, p.score_scale, p.eps, steps,
                                                  False, True)
                    o_want, A_want = want(q, k, v)
                    # forward: the artifact's projections, the operator, the output projection
                    ox = want(*_project(x, w, p))[0]
                    merged = ox.transpose(1, 2).reshape(x.shape[0], x.shape[1], -1)
                    y_want = merged @ w["wo"].T + (w["bo"] if "bo" in w else 0)
                    for backend, art in arts.items():
                        out, A, phi = art.attend(layer, q, k, v, mask, None, True, True)
                        close(out, o_want, tag + " %s out" % backend)
                        close(A, A_want, tag + " %s attention" % backend)
                        assert (phi.numel() == 0) == (steps is not None), tag
                        close(art.attend(layer, q, k, v, mask), out, tag + " attend()", 0)
                        close(art.forward(layer, x, mask), y_want, tag + " %s forward" % backend)
                        if steps is not None:      # no closures to set
                            try:
                                art.attend(layer, q, k, v, mask, 2)
                                raise AssertionError(tag + ": closures accepted")
                            except ValueError as e:
                                assert "has no closures to set" in str(e), e
        print("     %s: %s" % (name, ", ".join(arts[BACKENDS[0]].layer(n).describe
                                               for n in arts[BACKENDS[0]].layer_names)))


def _with_budgets(model, budgets):
    """The unpatched model with each attention module's T set to budgets[name]."""
    for name, mod in model.named_modules():
        if name in budgets:
            if hasattr(mod, "max_iter"):
                mod.max_iter = budgets[name]
            else:
                mod.n_it = budgets[name]
    return model


@test
def test_kinds_patch_model():
    # a patched model with 'sinkhorn' / 'teacher' layers is the teacher model
    # with those layers' loops cut to T' (or left at T)
    kinds = kind_artifacts()
    for name in ("vit_sinkhorn", "vit_teacher", "vit_mixed", "text_sinkhorn", "text_teacher"):
        path, src, ks = kinds[name]
        names = VIT if src == "vit" else TEXT
        make = vit_model if src == "vit" else text_model
        inputs = (sm.synthetic_images(6, seed=5) if src == "vit" else sm.synthetic_tokens(8, seed=11),)
        T = 6 if src == "vit" else 5
        budgets = {n: _steps(k, T) for n, k in zip(names, ks)}
        with torch.no_grad():
            y_want, a_want = _outputs(_with_budgets(make(), budgets), inputs)
            for backend in BACKENDS:
                for closures in (None, 2):          # an int is for ASAP layers only
                    model = make()
                    asap_torch.patch_model(model, path, closures=closures, backend=backend)
                    mods = asap_torch.patched_layers(model)
                    assert sorted(mods) == names and all(
                        m.operator == ("teacher" if k == "teacher" else "sinkhorn") and
                        m.effective_closures is None for m, k in zip(mods.values(), ks)), mods
                    y, att = _outputs(model, inputs)
                    tag = "%s %s closures=%s" % (name, backend, closures)
                    close(y, y_want, tag + " output")
                    for i, (u, w) in enumerate(zip(att, a_want)):
                        close(u, w, tag + " attention %d" % i)
                    asap_torch.unpatch_model(model)
                    close(_outputs(model, inputs)[0], _outputs(make(), inputs)[0],
                          tag + " unpatched", 0)
        try:
            asap_torch.patch_model(make(), path, closures={names[0]: 2}, backend=BACKENDS[0])
            raise AssertionError("closures for a '%s' layer accepted" % ks[0])
        except ValueError as e:
            assert "has no closures" in str(e), e
    # mixed: a 'sinkhorn' layer and an ASAP layer with its own k
    if OP:
        path = kinds["text_mixed"][0]
        model = text_model()
        tokens = sm.synthetic_tokens(10, seed=11)
        with torch.no_grad():
            asap_torch.patch_model(model, path, closures={TEXT[1]: 3}, backend="op")
            got = model(tokens)[0]
            assert asap_torch.patched_layers(model)[TEXT[0]].operator == "sinkhorn"
            close(got, text_by_hand(model, path, tokens, {TEXT[1]: 3}), "text_mixed by hand", 1e-6)
            pt = text_model()
            asap_torch.patch_model(pt, path, closures={TEXT[1]: 3}, backend="torch")
            close(pt(tokens)[0], got, "text_mixed op vs fallback")


@test
def test_compiled_sinkhorn_artifact_runs_everywhere():
    # asapc compile itself stores plain Sinkhorn when no ASAP map is fast
    # enough (latencies from a table, so no timing enters the test); the op,
    # the fallback and patch_model then run each layer's T' loop.
    a = artifacts()
    table = os.path.join(WORK, "latency.json")
    lat = {"teacher": 6.0}
    lat.update({"sinkhorn-%d" % t: float(t) for t in range(1, 6)})
    lat.update({"asap-alpha-k%d" % k: 100.0 for k in range(1, 6)})
    with open(table, "w") as fh:
        json.dump({"*": lat}, fh)
    path = os.path.join(WORK, "vit_compiled_sinkhorn.asap.h5")
    r = run([ASAPC, "compile", os.path.join(FIXTURES, "vit_checkpoint.pt"), "--spec",
             os.path.join(FIXTURES, "vit.spec.json"), "--calib", a["vit_calib"], "-o", path,
             "--no-report", "--threads", "1", "--features", "alpha", "--heads-mode", "pooled",
             "--latency-table", table])
    assert "no ASAP map runs as fast here" in r.stdout, r.stdout
    assert asap_torch.read_artifact(path)[0]["format_version"] == 4   # no score_stats layer
    art = asap_torch.load_artifact(path, backend=BACKENDS[0])
    steps = {n: art.layer(n).sinkhorn_steps for n in art.layer_names}
    assert all(art.layer(n).operator == "sinkhorn" and 1 <= steps[n] <= 4 for n in steps), steps
    inputs = (sm.synthetic_images(6, seed=7),)
    with torch.no_grad():
        y_want, a_want = _outputs(_with_budgets(vit_model(), steps), inputs)
        for backend in BACKENDS:
            model = vit_model()
            asap_torch.patch_model(model, path, backend=backend)
            y, att = _outputs(model, inputs)
            close(y, y_want, "compiled sinkhorn %s output" % backend)
            for i, (u, w) in enumerate(zip(att, a_want)):
                close(u, w, "compiled sinkhorn %s attention %d" % (backend, i))


# --------------------------------------------------------------------------
# the score_stats feature columns (format_version 5)
# --------------------------------------------------------------------------

def _stats_by_hand(q, k, key_mask, scale, drop_queries):
    """[B, H, n, 3] row max, mean and standard deviation (1/|J|) of the
    scores over the active keys J, centered over the rows carrying mass (0
    on the others), by loops over python floats."""
    B, H, n, _ = q.shape
    out = np.zeros((B, H, n, 3))
    for b in range(B):
        J = [j for j in range(n) if key_mask is None or bool(key_mask[b, j])]
        rows = J if drop_queries else list(range(n))
        for h in range(H):
            for i in range(n):
                s = [scale * float(sum(q[b, h, i, c] * k[b, h, j, c] for c in range(q.shape[3])))
                     for j in J]
                mu = sum(s) / len(s)
                out[b, h, i] = (max(s), mu, (sum((x - mu) ** 2 for x in s) / len(s)) ** 0.5)
            centered = out[b, h, rows] - out[b, h, rows].mean(0)
            out[b, h] = 0
            out[b, h, rows] = centered
    return out


def _stats_case(seed):
    """q, k [3, 2, 7, 4] (float64) and a key mask padding sequence 0 in front,
    1 at the end and 2 in every other token; key 0 large (padded in sequence 0)."""
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(3, 2, 7, 4, generator=gen, dtype=torch.float64)
    k = torch.randn(3, 2, 7, 4, generator=gen, dtype=torch.float64) * 2
    k[:, :, 0] *= 3
    mask = torch.ones(3, 7, dtype=torch.bool)
    mask[0, :2] = False
    mask[1, 4:] = False
    mask[2, 1::2] = False
    return q, k, mask


@test
def test_score_stats_columns():
    # the Python reference's three columns against loops, with padded keys
    # (in front and at the end), padded queries kept or dropped, and no mask
    q, k, mask = _stats_case(3)
    B, H, n, d = q.shape
    for key_mask, mode in ((mask, "keep_queries"), (mask, "drop_queries"), (None, "keep_queries")):
        p = asap_torch.artifact.LayerParams(
            name="stats", slices=0, alpha=True, softmax_dual=False, sinkhorn_dual3=False,
            score_stats=True, score_scale=0.6, eps=1.0, theta=np.zeros((d, 0)), mask=mode)
        assert (p.family_name, p.num_columns, p.feature_passes) == ("alpha+stats", 4, 0)
        m = reference.Marginals(key_mask, B, n, p.drop_queries, q.dtype, q.device)
        want = _stats_by_hand(q, k, key_mask, 0.6, p.drop_queries)
        tag = "mask=%s %s" % (key_mask is not None, mode)
        for S in (None, reference.scores(q, k, 0.6)):
            Psi = reference.build_features(q, k, m, p, S)
            assert Psi.shape == (B, H, n, 4) and Psi.dtype == torch.float64, (tag, Psi.shape)
            close(Psi[..., 0], reference.center_rows(reference.cost_alpha(q, 0.6), m), tag + " alpha", 0)
            for c, what in enumerate(("max", "mean", "sd")):
                close(Psi[..., 1 + c], want[..., c], "%s %s" % (tag, what), 1e-12)
        # float32 stays in q's dtype
        Psi32 = reference.build_features(q.float(), k.float(), reference.Marginals(
            key_mask, B, n, p.drop_queries, torch.float32, q.device), p)
        assert Psi32.dtype == torch.float32
        close(Psi32[..., 1:], want, tag + " float32", 1e-5)
    # the family without the group (the default) has no such columns
    p = asap_torch.artifact.LayerParams(name="alpha", slices=0, alpha=True, softmax_dual=False,
                                        sinkhorn_dual3=False, score_scale=0.6, theta=np.zeros((d, 0)))
    assert (p.score_stats, p.family_name, p.num_columns) == (False, "alpha", 1)
    assert reference.build_features(q, k, reference.Marginals(None, B, n, False, q.dtype, q.device),
                                    p).shape == (B, H, n, 1)


def _check_stats_artifacts(paths, group, suffix, version, columns, stats_cols, min_coef):
    """asapc's artifacts whose layers end in the feature group `group` (family
    suffix `suffix`): written as format_version `version`, read alike by both
    readers, the coefficients of the last `stats_cols` columns in use, the
    operator agrees with the PyTorch fallback, and version - 1 is refused by
    both readers. columns: {'vit': n, 'text': n} columns past the slices."""
    for kind, path in paths.items():
        root, params = asap_torch.read_artifact(path)
        assert root["format_version"] == version, (kind, root["format_version"])
        with h5py.File(path, "r") as f:
            feats = [_features(f["layers"][key]) for key in sorted(f["layers"], key=int)]
        for p, fs in zip(params, feats):
            assert getattr(p, group) and p.family_name.endswith(suffix), (kind, p.describe)
            assert fs[-1] == group, fs                   # the last group
            assert p.coef.shape[1] == p.num_columns == p.slices + columns[kind], p.coef.shape
            assert np.abs(p.coef[:, -stats_cols:]).max() > min_coef, (kind, p.name, p.coef[:, -stats_cols:])
            infos = [asap_torch.load_artifact(path, backend=b).info(p.name)["family"] for b in BACKENDS]
            assert all(i == infos[0] for i in infos), infos
            assert infos[0][group] is True and infos[0]["columns"] == p.num_columns, infos
    if OP:
        for kind, path in paths.items():
            for dtype in (torch.float32, torch.float64):
                err = _compare_backends(kind, VIT if kind == "vit" else TEXT, dtype, True, path)
                print("     %s %s %s: max abs difference op vs PyTorch %.2g" % (kind, suffix, dtype, err))
    # the group in an older file is refused by both readers
    bad = os.path.join(WORK, "%s_v%d.asap.h5" % (group, version - 1))
    shutil.copyfile(paths["text"], bad)
    with h5py.File(bad, "r+") as f:
        f.attrs["format_version"] = np.int64(version - 1)
    want = "feature group '%s' needs format_version %d, but the file says %d" % (group, version, version - 1)
    try:
        asap_torch.read_artifact(bad)
        raise AssertionError("%s accepted in format_version %d" % (group, version - 1))
    except asap_torch.ArtifactError as e:
        assert want in str(e), e
    if OP:
        try:
            torch.ops.asap.load(bad)
            raise AssertionError("the C++ reader accepted %s in format_version %d" % (group, version - 1))
        except ValueError as e:
            assert want in str(e), e


@test
def test_score_stats_artifacts():
    # asapc's +stats families (score_stats after sinkhorn_dual3): format_version 5
    _check_stats_artifacts(stats_artifacts(), "score_stats", "+stats", 5, {"vit": 6, "text": 4}, 3, 1e-3)


def _cstats_by_hand(q, k, key_mask, scale, drop_queries):
    """[B, H, n, 2] row max and variance (1/|J|) of S_ij - c_j over the active
    keys J, c_j = the mean of key j's scores over the rows carrying mass,
    centered over those rows (0 on the others), by loops over python floats."""
    B, H, n, _ = q.shape
    out = np.zeros((B, H, n, 2))
    for b in range(B):
        J = [j for j in range(n) if key_mask is None or bool(key_mask[b, j])]
        rows = J if drop_queries else list(range(n))
        for h in range(H):
            S = [[scale * float(sum(q[b, h, i, c] * k[b, h, j, c] for c in range(q.shape[3]))) for j in J]
                 for i in range(n)]
            col = [sum(S[i][t] for i in rows) / len(rows) for t in range(len(J))]
            for i in range(n):
                x = [S[i][t] - col[t] for t in range(len(J))]
                mu = sum(x) / len(x)
                out[b, h, i] = (max(x), sum((v - mu) ** 2 for v in x) / len(x))
            centered = out[b, h, rows] - out[b, h, rows].mean(0)
            out[b, h] = 0
            out[b, h, rows] = centered
    return out


@test
def test_centered_stats_columns():
    # the Python reference's two centered_stats columns against loops, masks as above
    q, k, mask = _stats_case(5)
    B, H, n, d = q.shape
    for key_mask, mode in ((mask, "keep_queries"), (mask, "drop_queries"), (None, "keep_queries")):
        p = asap_torch.artifact.LayerParams(
            name="cstats", slices=0, alpha=True, softmax_dual=False, sinkhorn_dual3=False,
            score_stats=True, centered_stats=True, score_scale=0.6, eps=1.0, theta=np.zeros((d, 0)), mask=mode)
        assert (p.family_name, p.num_columns, p.feature_passes) == ("alpha+cstats", 6, 0)
        m = reference.Marginals(key_mask, B, n, p.drop_queries, q.dtype, q.device)
        tag = "mask=%s %s" % (key_mask is not None, mode)
        Psi = reference.build_features(q, k, m, p)
        assert Psi.shape == (B, H, n, 6), (tag, Psi.shape)
        close(Psi[..., 1:4], _stats_by_hand(q, k, key_mask, 0.6, p.drop_queries), tag + " stats", 1e-12)
        close(Psi[..., 4:], _cstats_by_hand(q, k, key_mask, 0.6, p.drop_queries), tag + " cstats", 1e-12)


@test
def test_centered_stats_artifacts():
    # asapc's +cstats families (centered_stats after score_stats): format_version 6
    paths = cstats_artifacts()
    _check_stats_artifacts(paths, "centered_stats", "+cstats", 6, {"vit": 8, "text": 6}, 2, 1e-4)
    # and without score_stats before it, refused by both readers
    bad = os.path.join(WORK, "cstats_alone.asap.h5")
    shutil.copyfile(paths["text"], bad)
    with h5py.File(bad, "r+") as f:
        g = f["layers"][sorted(f["layers"], key=int)[0]]
        g.attrs["features"] = np.array([x.encode() for x in _features(g) if x != "score_stats"], dtype="S16")
    want = "feature group 'centered_stats' needs 'score_stats' before it, which attribute 'features' omits"
    try:
        asap_torch.read_artifact(bad)
        raise AssertionError("centered_stats accepted without score_stats")
    except asap_torch.ArtifactError as e:
        assert want in str(e) and bad in str(e), e
    if OP:
        try:
            torch.ops.asap.load(bad)
            raise AssertionError("the C++ reader accepted centered_stats without score_stats")
        except ValueError as e:
            assert want in str(e), e


@test
def test_bench_exact_table():
    # tools/bench/bench_pytorch.py --exact on tiny shapes: one row per shape with
    # the ratios, written between the markers of a copy of the docs page
    need_op()
    md = os.path.join(WORK, "python.md")
    shutil.copyfile(os.path.join(REPO, "docs", "python.md"), md)
    out = os.path.join(WORK, "exact.json")
    env = dict(os.environ, ASAP_TORCH_OP=asap_torch.library_path())
    r = subprocess.run([PYTHON, os.path.join(TOOLS, "bench", "bench_pytorch.py"), "--exact", "--threads", "1",
                        "--reps", "1", "--shapes", "vit:9:2x2:4:3,text:8:2x2:4:2", "--settings",
                        "default", "--json", out, "--md", md],
                       capture_output=True, text=True, cwd=REPO, env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    with open(out) as f:
        rows = json.load(f)["results"]
    assert [(x["setting"], x["kind"], x["n"], x["T"]) for x in rows] == \
        [("default", "vit", 9, 3), ("default", "text", 8, 2)]
    assert all(x["max_abs_diff"] <= 1e-5 for x in rows), rows
    with open(md) as f:
        doc = f.read()
    table = doc.split("<!-- exact:begin -->")[1].split("<!-- exact:end -->")[0]
    assert "| default | ViT n=9, B=2, H=2, d=4, T=3 |" in table and "text n=8" in table, table
    assert "tools/bench/bench.sh --exact --threads 1 --reps 1 --shapes" in table, table
    assert "`OMP_WAIT_POLICY` unset" in table, table
    assert table.count("×") == 6, table


def main(argv):
    try:
        return harness.run(argv, ignore_user_warnings=True)
    finally:
        if not os.environ.get("ASAP_KEEP_TEST_FILES"):
            shutil.rmtree(WORK, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
