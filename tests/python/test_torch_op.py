#!/usr/bin/env python3
"""Tests of the TorchScript operator library (libasap_torch_op.so) and the
asap_torch package (no pytest needed).

    ASAPC=build/asapc ${PYTHON:-/usr/bin/python3} tests/python/test_torch_op.py [-k SUBSTRING]

Compiles two small artifacts from the fixtures with $ASAPC (default
build/asapc), then checks the custom operator against the pure-PyTorch
operator, patched models against running the model with the operator by
hand, TorchScript, errors, the cache and threads. The library is found as
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
FIXTURES = os.path.join(REPO, "tests", "data", "fixtures")
sys.path.insert(0, TOOLS)
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


def artifacts():
    """{'vit': path, 'text': path, 'vit_calib': path, 'text_calib': path}"""
    if _art:
        return _art
    assert os.path.isfile(ASAPC), "asapc not found at %s (set ASAPC)" % ASAPC
    rec = os.path.join(TOOLS, "record_calib.py")
    vit_calib = os.path.join(WORK, "vit_calib.h5")
    text_calib = os.path.join(WORK, "text_calib.h5")
    run([PYTHON, rec, "--demo", "vit", "--demo-n", "64", "-o", vit_calib, "--quiet"])
    run([PYTHON, rec, "--demo", "text", "--demo-n", "64", "-o", text_calib, "--quiet"])
    vit = os.path.join(WORK, "vit.asap.h5")
    run([ASAPC, "compile", os.path.join(FIXTURES, "vit_checkpoint.pt"), "--spec",
         os.path.join(FIXTURES, "vit.spec.json"), "--calib", vit_calib, "-o", vit, "--no-report",
         "-q", "--threads", "1"])
    spec = os.path.join(WORK, "text.spec.json")
    run([ASAPC, "inspect", os.path.join(FIXTURES, "text_state_dict.pt"), "--T", "5", "--heads",
         "4", "-o", spec])
    text = os.path.join(WORK, "text.asap.h5")
    run([ASAPC, "compile", os.path.join(FIXTURES, "text_state_dict.pt"), "--spec", spec,
         "--calib", text_calib, "-o", text, "--no-report", "-q", "--threads", "1"])
    _art.update(vit=vit, text=text, vit_calib=vit_calib, text_calib=text_calib)
    return _art


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
               "forward", "path"):
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


def _compare_backends(kind, layers, dtype, masks):
    a = artifacts()
    op = asap_torch.load_artifact(a[kind], backend="op")
    pt = asap_torch.load_artifact(a[kind], backend="torch")
    assert op.backend == "op" and pt.backend == "torch"
    worst = 0.0
    for layer in layers:
        q, k, v, rec_mask = projected(a[kind], a[kind + "_calib"], layer, dtype=dtype)
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
    # integer masks are accepted (nonzero = token)
    m = torch.ones(2, 17, dtype=torch.int64)
    close(torch.ops.asap.attend(h, VIT[0], q, q, q, m, 1),
          torch.ops.asap.attend(h, VIT[0], q, q, q, None, 1), "int mask", 0)
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
sys.path.insert(0, %r)
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
msgs = [str(x.message) for x in w if "pure-PyTorch fallback" in str(x.message)]
assert art.backend == "torch" and len(msgs) == 1, msgs
torch.save(y, %r)
print("ok")
""" % (TOOLS, a["vit"], a["vit"], os.path.join(FIXTURES, "vit_checkpoint.pt"),
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
            "    print('refused' if 'not available' in str(e) else e)\n" % (TOOLS, a["vit"])
    r = subprocess.run([PYTHON, "-c", code2], capture_output=True, text=True, env=env, cwd=REPO)
    assert r.stdout.strip() == "refused", r.stdout + r.stderr


def main(argv):
    try:
        return harness.run(argv, ignore_user_warnings=True)
    finally:
        if not os.environ.get("ASAP_KEEP_TEST_FILES"):
            shutil.rmtree(WORK, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
