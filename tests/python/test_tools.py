#!/usr/bin/env python3
"""Self-checking tests of the Python tools (no pytest needed).

    ${PYTHON:-/usr/bin/python3} tests/python/test_tools.py [-k SUBSTRING]

Prints one line per test and 'N passed, M failed' at the end; exits 1 when
any test failed.
"""
import io
import json
import math
import os
import subprocess
import sys
import tempfile

import numpy as np
import torch
import h5py

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TOOLS = os.path.join(REPO, "tools")
FIXTURES = os.path.join(REPO, "tests", "data", "fixtures")
sys.path.insert(0, TOOLS)
import sinkformer_models as sm  # noqa: E402
import record_calib as rc  # noqa: E402

torch.set_num_threads(1)
from harness import run, test  # noqa: E402


def close(got, want, tol, what):
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    assert got.shape == want.shape, "%s: shape %s, expected %s" % (what, got.shape, want.shape)
    err = float(np.max(np.abs(got - want))) if got.size else 0.0
    assert err <= tol, "%s: max abs error %.3g > %.3g" % (what, err, tol)


# --------------------------------------------------------------------------
# reference teacher: asap-math.md section 1, float64, -inf masking
# --------------------------------------------------------------------------

def lse(x, axis):
    m = np.max(x, axis=axis, keepdims=True)
    m = np.where(np.isfinite(m), m, 0.0)
    with np.errstate(divide="ignore"):
        return np.squeeze(m, axis) + np.log(np.sum(np.exp(x - m), axis=axis))


def ref_attention(S, T, eps=1.0, mask=None):
    """A = n * plan(f, g) after T alternating closures (odd t: row, even t: col)."""
    n = S.shape[0]
    J = np.ones(n, bool) if mask is None else np.asarray(mask, bool)
    log_a = np.full(n, math.log(1.0 / n))
    log_b = np.full(n, math.log(1.0 / n))
    Sm = np.where(J[None, :], S, -np.inf)

    def row(g):
        return eps * log_a - eps * lse((Sm + g[None, :]) / eps, axis=1)

    def col(f):
        g = eps * log_b - eps * lse((S + f[:, None]) / eps, axis=0)
        return np.where(J, g, 0.0)

    f, g = np.zeros(n), np.zeros(n)
    for t in range(1, T + 1):
        if t % 2:
            f = row(g)
        else:
            g = col(f)
    return n * np.exp((f[:, None] + g[None, :] + Sm) / eps)


def random_scores(shape, seed, scale=2.0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=g) * scale


@test
def sinkhorn_matches_reference_vit_convention():
    dots = random_scores((3, 2, 9, 9), 0)
    for T in range(1, 9):
        for eps in (1.0, 0.5):
            A = sm.sinkhorn_attention(dots, eps, T, text_mode=False).numpy()
            for b in range(3):
                for h in range(2):
                    ref = ref_attention(dots[b, h].double().numpy(), T, eps)
                    close(A[b, h], ref, 1e-5, "T=%d eps=%g b=%d h=%d" % (T, eps, b, h))


@test
def sinkhorn_matches_reference_text_convention():
    torch.manual_seed(1)
    lengths = [12, 9, 5, 1]
    key_pad = torch.zeros(4, 12, dtype=torch.bool)
    for i, L in enumerate(lengths):
        key_pad[i, L:] = True
    dots = random_scores((4, 3, 12, 12), 2)
    for T in range(1, 9):
        A = sm.sinkhorn_attention(dots, 1.0, T, text_mode=True,
                                  key_pad=key_pad[:, None, None, :]).numpy()
        for b, L in enumerate(lengths):
            for h in range(3):
                ref = ref_attention(dots[b, h].double().numpy(), T, 1.0,
                                    mask=~key_pad[b].numpy())
                close(A[b, h], ref, 1e-5, "T=%d b=%d h=%d" % (T, b, h))
                assert np.all(A[b, h][:, L:] == 0), "padded key columns carry mass"


@test
def sinkhorn_parity_ends_on_row_or_column():
    dots = random_scores((2, 10, 10), 3)
    pad = torch.zeros(2, 1, 10, dtype=torch.bool)
    pad[1, 0, 6:] = True
    for T in range(1, 8):
        A = sm.sinkhorn_attention(dots.double(), 1.0, T, text_mode=True, key_pad=pad).numpy()
        for b, m in ((0, 10), (1, 6)):
            rows, cols = A[b].sum(1), A[b].sum(0)[:m]
            # the marginals 1/n are float32 in the reference (n * fl32(1/n) != 1)
            if T % 2:      # row-ending: every row sums to 1
                close(rows, np.ones(10), 1e-7, "T=%d rows" % T)
            else:          # column-ending: every active column sums to 1
                close(cols, np.ones(m), 1e-7, "T=%d cols" % T)


@test
def sinkhorn_t1_is_softmax():
    dots = random_scores((2, 7, 7), 4)
    close(sm.sinkhorn_attention(dots, 1.0, 1), torch.softmax(dots, -1), 1e-6, "T=1")


# --------------------------------------------------------------------------
# models against the reference and the manifest's parameter names
# --------------------------------------------------------------------------

def ref_layer(x, sd, layer, heads, dim_head, T, eps, scale, mask=None):
    """Attention layer from the state dict and the manifest's names, in float64."""
    def proj(spec):
        w = sd[spec["weight"]].double().numpy()
        r0, r1 = spec["rows"]
        y = x @ w[r0:r1].T
        if spec["bias"]:
            y = y + sd[spec["bias"]].double().numpy()[r0:r1]
        B, n, _ = y.shape
        return y.reshape(B, n, heads, -1).transpose(0, 2, 1, 3)
    q, k, v = proj(layer["q"]), proj(layer["k"]), proj(layer["v"])
    B, n = x.shape[:2]
    A = np.zeros((B, heads, n, n))
    for b in range(B):
        for h in range(heads):
            A[b, h] = ref_attention(scale * q[b, h] @ k[b, h].T, T, eps,
                                    None if mask is None else mask[b])
    ho = A @ v
    merged = ho.transpose(0, 2, 1, 3).reshape(B, n, -1)
    out = merged @ sd[layer["out"]["weight"]].double().numpy().T
    out = out + sd[layer["out"]["bias"]].double().numpy()
    return A, ho, out


def manifest():
    with open(os.path.join(FIXTURES, "fixtures.json")) as fh:
        return json.load(fh)


@test
def fixtures_reproduce_from_weights_and_manifest():
    man = manifest()
    with h5py.File(os.path.join(FIXTURES, man["h5"]), "r") as f:
        for key, mm in man["models"].items():
            sd = torch.load(os.path.join(FIXTURES, mm["files"]["state_dict"]))
            assert sorted(sd) == sorted(mm["params"]), key
            mask = f[key]["mask"][()] if mm["masked"] else None
            for layer in mm["layers"]:
                g = f[layer["h5_group"]]
                x = g["x"][()].astype(np.float64)
                assert x.shape == (mm["batch"], mm["n"], mm["d_model"])
                A, ho, out = ref_layer(x, sd, layer, mm["heads"], mm["dim_head"], mm["T"],
                                       mm["eps"], mm["score_scale"], mask)
                what = "%s %s" % (key, layer["name"])
                close(g["attn"][()], A, 2e-5, what + " attn")
                close(g["head_out"][()], ho, 2e-5, what + " head_out")
                close(g["out"][()], out, 2e-5, what + " out")
                if mask is not None:
                    assert np.array_equal(g["mask"][()], mask)


@test
def fixture_files_load_to_the_same_weights():
    man = manifest()
    for key, mm in man["models"].items():
        ref = torch.load(os.path.join(FIXTURES, mm["files"]["state_dict"]))
        for kind, fname in mm["files"].items():
            if kind in ("checkpoint_key", "calib", "state_dict"):
                continue
            got = rc.load_state_dict(os.path.join(FIXTURES, fname))
            assert sorted(got) == sorted(ref), "%s: keys differ" % fname
            for k in ref:
                assert torch.equal(got[k], ref[k]), "%s: %s differs" % (fname, k)
    ck = torch.load(os.path.join(FIXTURES, man["models"]["vit"]["files"]["checkpoint"]))
    assert set(ck) >= {"epoch", "model_state_dict", "optimizer_state_dict"}
    dp = torch.load(os.path.join(FIXTURES, man["models"]["vit"]["files"]["dataparallel"]))
    assert all(k.startswith("module.transformer.") or k.startswith("module.") for k in dp)
    with open(os.path.join(FIXTURES, man["models"]["text"]["files"]["safetensors"]), "rb") as fh:
        size = int.from_bytes(fh.read(8), "little")
        header = json.loads(fh.read(size))
        assert size % 8 == 0
    assert header["layers.0.mha.WQ.weight"]["dtype"] == "F32"


@test
def model_layout_names():
    vit, text = sm.fixture_vit(), sm.fixture_text()
    vk, tk = set(vit.state_dict()), set(text.state_dict())
    for k in ("to_patch_embedding.1.weight", "pos_embedding", "cls_token",
              "transformer.layers.0.0.norm.weight", "transformer.layers.0.0.fn.to_qkv.weight",
              "transformer.layers.0.0.fn.to_out.0.weight", "transformer.layers.1.1.fn.net.0.weight",
              "transformer.layers.1.1.fn.net.3.bias", "mlp_head.0.weight", "mlp_head.1.bias"):
        assert k in vk, k
    assert "transformer.layers.0.0.fn.to_qkv.bias" not in vk
    for k in ("embedding.weight", "pos_embedding.weight", "layers.0.mha.WQ.bias",
              "layers.0.mha.linear.weight", "layers.1.layernorm1.weight", "layers.1.ffn.linear2.bias",
              "linear.weight"):
        assert k in tk, k
    assert text.layers[0].layernorm1.eps == 1e-6


@test
def models_return_per_layer_attention():
    vit, text = sm.fixture_vit(), sm.fixture_text()
    with torch.no_grad():
        logits, attn = vit(sm.synthetic_images(3))
        probs, tattn = text(sm.synthetic_tokens(3, lengths=[12, 5, 1]))
    assert logits.shape == (3, 10) and len(attn) == 2 and attn[0].shape == (3, 2, 17, 17)
    assert probs.shape == (3, 2) and len(tattn) == 2 and tattn[1].shape == (3, 4, 12, 12)
    assert torch.all(tattn[0][2, :, :, 1:] == 0)


# --------------------------------------------------------------------------
# record_calib
# --------------------------------------------------------------------------

def direct_vit_inputs(model, img):
    """Each attention layer's input, computed by hand (pre-norm)."""
    x = model.to_patch_embedding(img)
    x = torch.cat((model.cls_token.expand(x.shape[0], -1, -1), x), 1) + model.pos_embedding
    outs = []
    for attn, ff in model.transformer.layers:
        h = attn.norm(x)
        outs.append(h)
        x = x + attn.fn(h)[0]
        x = x + ff(x)
    return outs


def direct_text_inputs(model, tokens):
    pos = torch.arange(1, tokens.shape[1] + 1).repeat(tokens.shape[0], 1)
    pos = pos.masked_fill(tokens == 0, 0)
    x = model.embedding(tokens) + model.pos_embedding(pos)
    pad = (tokens == 0).unsqueeze(1).repeat(1, tokens.shape[1], 1)
    outs = []
    for layer in model.layers:
        outs.append(x)
        x = layer(x, pad)[0]
    return outs


@test
def record_vit_equals_direct_forward():
    model = sm.fixture_vit()
    imgs = sm.synthetic_images(11, seed=5)
    batches = [imgs[0:4], imgs[4:5], imgs[5:11]]
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "c.h5")
        names = ["transformer.layers.0.0.fn", "transformer.layers.1.0.fn"]
        n = rc.record(model, names, batches, path, chunk=4, quiet=True)
        assert n == 11
        assert os.listdir(d) == ["c.h5"], os.listdir(d)
        assert rc.check_calib(path) == {k: (11, 17) for k in names}
        with torch.no_grad():
            want = direct_vit_inputs(model, imgs)
        with h5py.File(path, "r") as f:
            # fixed-length strings (version 2): h5py reads them as bytes
            assert f.attrs["format"] == b"asapc-calib" and int(f.attrs["version"]) == 2
            assert not rc.is_vlen_str_attr(f, "format")
            for name in names:
                assert not rc.is_vlen_str_attr(f["layers"][name], "module_class")
            assert "mask" not in f
            for name, w in zip(names, want):
                ds = f["layers"][name]["x"]
                assert ds.dtype == np.float32 and ds.chunks == (4, 17, 32)
                assert "mask" not in f["layers"][name]
                close(ds[()], w.numpy(), 1e-6, name)


@test
def record_text_equals_direct_forward_with_mask():
    model = sm.fixture_text()
    model.train()               # record() must switch dropout off and restore the mode
    tokens = sm.synthetic_tokens(9, seed=6)
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "c.h5")
        names = ["layers.1.mha", "layers.0.mha"]
        n = rc.record(model, names, [tokens[:5], tokens[5:]], path, chunk=64, quiet=True)
        assert n == 9 and model.training
        rc.check_calib(path)
        model.eval()
        with torch.no_grad():
            want = direct_text_inputs(model, tokens)
        with h5py.File(path, "r") as f:
            assert np.array_equal(f["mask"][()], (tokens != 0).numpy().astype(np.uint8))
            assert f["mask"].dtype == np.uint8
            for name, w in zip(["layers.0.mha", "layers.1.mha"], want):
                close(f["layers"][name]["x"][()], w.numpy(), 1e-6, name)
                assert "mask" not in f["layers"][name]


@test
def record_mask_fn_and_max_examples():
    model = sm.fixture_text()
    tokens = sm.synthetic_tokens(10, seed=7)
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "c.h5")
        seen = []

        def mask_fn(args, batch):
            seen.append(batch.shape[0])
            return batch != 0
        n = rc.record(model, ["layers.0.mha"], [tokens[:4], tokens[4:]], path,
                      mask_fn=mask_fn, max_examples=6, quiet=True)
        assert n == 6 and seen == [4, 2], seen
        with h5py.File(path, "r") as f:
            assert f["layers/layers.0.mha/x"].shape == (6, 12, 32)
            assert np.array_equal(f["mask"][()], (tokens[:6] != 0).numpy())


@test
def default_mask_reads_mask_arguments_only():
    x = torch.randn(2, 5, 5)                 # n == d_model: K, V must not pass for masks
    pad = torch.tensor([[0, 0, 0, 1, 1], [0, 0, 0, 0, 0]], dtype=torch.bool)
    want = (~pad).to(torch.uint8)
    assert rc.default_mask((x, x.clone(), x.clone())) is None
    assert torch.equal(rc.default_mask((x, x, x, pad.unsqueeze(1).repeat(1, 5, 1))), want)
    assert torch.equal(rc.default_mask((x, pad)), want)
    assert torch.equal(rc.default_mask((x, pad[:, None, None, :].repeat(1, 3, 5, 1))), want)
    additive = torch.zeros(2, 1, 1, 5).masked_fill(pad[:, None, None, :], float("-inf"))
    assert torch.equal(rc.default_mask((x, additive)), want)
    try:
        rc.default_mask((x, (~pad).float()))
    except rc.RecordError as e:
        assert "mask_fn" in str(e)
    else:
        raise AssertionError("ambiguous 0/1 float mask accepted")


@test
def record_refuses_unknown_layer_with_close_names():
    model = sm.fixture_vit()
    with tempfile.TemporaryDirectory() as d:
        try:
            rc.record(model, ["transformer.layers.0.fn"], [sm.synthetic_images(2)],
                      os.path.join(d, "c.h5"), quiet=True)
        except rc.RecordError as e:
            msg = str(e)
        else:
            raise AssertionError("unknown layer accepted")
        assert "no module named 'transformer.layers.0.fn'" in msg, msg
        assert "transformer.layers.0.0.fn" in msg, msg
        assert os.listdir(d) == []


@test
def record_failure_leaves_no_file():
    model = sm.fixture_vit()
    bad = sm.synthetic_images(3)
    bad[1, 0, 0, 0] = float("nan")
    with tempfile.TemporaryDirectory() as d:
        try:
            rc.record(model, ["transformer.layers.0.0.fn"], [sm.synthetic_images(2), bad],
                      os.path.join(d, "c.h5"), quiet=True)
        except rc.RecordError as e:
            assert "example 3" in str(e), str(e)
        else:
            raise AssertionError("NaN input accepted")
        assert os.listdir(d) == [], os.listdir(d)


@test
def check_calib_rejects_bad_files():
    with tempfile.TemporaryDirectory() as d:
        def make(fmt="asapc-calib", version=2, both=False, mask=None, vlen=False):
            p = os.path.join(d, "bad.h5")
            with h5py.File(p, "w") as f:
                f.attrs["format"] = fmt if vlen else rc.fixed_str(fmt)
                f.attrs["version"] = version
                g = f.create_group("layers/a")
                g["x"] = np.zeros((2, 3, 4), np.float32)
                if both:
                    g["q"] = g["k"] = np.zeros((2, 1, 3, 4), np.float32)
                if mask is not None:
                    f["mask"] = mask
            return p

        def refused(p, text):
            try:
                rc.check_calib(p)
            except rc.RecordError as e:
                assert text in str(e), str(e)
            else:
                raise AssertionError("accepted: " + text)
        assert rc.check_calib(make()) == {"a": (2, 3)}
        refused(make(fmt="other"), "format")
        refused(make(version=1), "version")
        refused(make(version=3), "version")
        refused(make(vlen=True), "variable-length")
        refused(make(both=True), "either x or q+k")
        refused(make(mask=np.ones((2, 4), np.uint8)), "mask shape")
        refused(make(mask=np.array([[1, 1, 0], [0, 0, 0]], np.uint8)), "example 1 has no token")


class FakeTTY(io.StringIO):
    def isatty(self):
        return True


@test
def progress_bar_tty_only():
    tty, pipe = FakeTTY(), io.StringIO()
    for stream in (tty, pipe):
        p = rc.Progress(total=10, stream=stream)
        p.update(4)
        p.update(6)
        p.close()
    out = tty.getvalue()
    assert "10/10 examples" in out and "/s" in out and "ETA" in out, out
    assert pipe.getvalue() == ""
    q = FakeTTY()
    p = rc.Progress(total=3, stream=q, enabled=False)
    p.update(3)
    p.close()
    assert q.getvalue() == ""


def run_cli(*args):
    return subprocess.run([sys.executable, os.path.join(TOOLS, "record_calib.py")] + list(args),
                          capture_output=True, text=True, timeout=120)


@test
def cli_demo_list_modules_and_errors():
    with tempfile.TemporaryDirectory() as d:
        r = run_cli("--demo", "text", "--list-modules")
        assert r.returncode == 0 and r.stdout.split() == ["layers.0.mha", "layers.1.mha"], r
        out = os.path.join(d, "t.h5")
        r = run_cli("--demo", "text", "--demo-n", "20", "--batch-size", "6", "-o", out, "--quiet")
        assert r.returncode == 0 and r.stderr == "", r.stderr
        assert rc.check_calib(out) == {"layers.0.mha": (20, 12), "layers.1.mha": (20, 12)}
        r = run_cli("--demo", "vit", "--layers", "transformer.layers.0.fn", "-o", out)
        assert r.returncode == 2 and "close names" in r.stderr, r.stderr
        # a saved whole model + data file
        model = os.path.join(FIXTURES, "text_model_dataparallel.pt")
        np.save(os.path.join(d, "tok.npy"), sm.synthetic_tokens(7, seed=3).numpy())
        r = run_cli("--model-file", model, "--data", os.path.join(d, "tok.npy"),
                    "--layers", "layers.1.mha", "-o", out, "--quiet")
        assert r.returncode == 0, r.stderr
        assert rc.check_calib(out) == {"layers.1.mha": (7, 12)}
        r = run_cli("--checkpoint", os.path.join(FIXTURES, "vit_checkpoint.pt"), "--builder",
                    "sinkformer_models:fixture_vit", "--demo-n", "3", "--list-modules")
        assert r.returncode == 0 and "transformer.layers.1.0.fn" in r.stdout, r.stderr




if __name__ == "__main__":
    sys.exit(run(sys.argv[1:]))
