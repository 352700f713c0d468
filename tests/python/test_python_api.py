#!/usr/bin/env python3
"""The asap_torch workflow functions (record, compile, verify, inspect,
spec_from_model) from the source tree (python/ on sys.path, asapc from
$ASAPC or build/): what they return, and their error paths, each one
exception with one sentence. The installed package is
test_pip_package.py's.
"""
import json
import os
import pty
import shutil
import subprocess
import sys
import tempfile

import numpy as np
import torch

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TOOLS = os.path.join(REPO, "tools")
PYPKG = os.path.join(REPO, "python")
FIXTURES = os.path.join(REPO, "tests", "data", "fixtures")
CALIB_DATA = os.path.join(REPO, "calib_data")
sys.path[:0] = [TOOLS, PYPKG]
import asap_torch  # noqa: E402
import harness  # noqa: E402
import sinkformer_models as sm  # noqa: E402
from harness import Skip, test  # noqa: E402

WORK = tempfile.mkdtemp(prefix="asap_api_test_")
VIT = ["transformer.layers.0.0.fn", "transformer.layers.1.0.fn"]
FAST = dict(slices=8, no_report=True, objective="fidelity", threads=1)   # no timing in the choice


def need_asapc():
    try:
        asap_torch.asapc_path()
    except RuntimeError as e:
        raise Skip(str(e))


def fixture_vit():
    model = sm.fixture_vit()
    model.load_state_dict(torch.load(os.path.join(FIXTURES, "vit_checkpoint.pt"))["model_state_dict"])
    return model.eval()


def teacher():
    ckpt = torch.load(os.path.join(CALIB_DATA, "vit_mnist_t6.pt"))
    cfg = dict(ckpt["config"]["model"])
    cfg["max_iter"] = cfg.pop("T")
    model = sm.ViT(**cfg).eval()
    model.load_state_dict(ckpt["model_state_dict"])
    return model


def one_sentence(e, *parts):
    """The exception's message is one line that contains every part."""
    msg = str(e)
    assert msg and "\n" not in msg and "Traceback" not in msg, repr(msg)
    for p in parts:
        assert p in msg, (p, msg)
    return msg


def raises(cls, fn, *parts):
    try:
        fn()
    except cls as e:
        return one_sentence(e, *parts)
    except Exception as e:     # noqa: BLE001 - report which
        raise AssertionError("expected %s, got %s: %s" % (cls.__name__, type(e).__name__, e))
    raise AssertionError("expected %s, nothing raised" % cls.__name__)


# --------------------------------------------------------------------------
# record
# --------------------------------------------------------------------------

@test
def test_record_defaults_to_sinkhorn_layers_and_matches_bundled_file():
    # one tensor of images, no layers=: every Sinkformer attention module;
    # the bundled images reproduce the bundled held-out file
    model = teacher()
    images = np.load(os.path.join(CALIB_DATA, "vit_mnist_t6.images.npz"))
    x = (torch.from_numpy(images["heldout_images"]).float().div(255).unsqueeze(1) - 0.1307) / 0.3081
    out = os.path.join(WORK, "heldout.h5")
    assert asap_torch.record(model, x, out, quiet=True) == 256
    import h5py
    with h5py.File(out, "r") as got, h5py.File(os.path.join(CALIB_DATA,
                                                          "vit_mnist_t6.heldout.h5"), "r") as want:
        assert sorted(got["layers"]) == VIT
        for name in VIT:
            a, b = got["layers"][name]["x"][()], want["layers"][name]["x"][()]
            assert a.shape == b.shape == (256, 17, 64)
            assert float(np.abs(a - b).max()) <= 1e-4, float(np.abs(a - b).max())
    assert asap_torch.check_calib(out) == {n: (256, 17) for n in VIT}


@test
def test_record_errors():
    out = os.path.join(WORK, "err.h5")
    plain = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU())
    raises(ValueError, lambda: asap_torch.record(plain, [torch.zeros(2, 3, 4)], out, quiet=True),
           "Sequential has no Sinkformer attention module", "layers=")
    model = fixture_vit()
    raises(ValueError, lambda: asap_torch.record(model, iter([]), out, quiet=True),
           "no example was recorded", "empty")
    raises(ValueError, lambda: asap_torch.record(model, [torch.zeros(2, 1, 16, 16)], out,
                                                 layers=["transformer.layers.0.fn"], quiet=True),
           "no module named 'transformer.layers.0.fn'", VIT[0])
    raises(asap_torch.RecordError, lambda: asap_torch.record(model, [torch.zeros(2, 1, 16, 16)],
                                                             out, layers=[], quiet=True),
           "no layer to record")
    assert not os.path.exists(out)
    assert [f for f in os.listdir(WORK) if ".tmp-" in f] == []      # no temporary file left


# --------------------------------------------------------------------------
# spec, compile, verify, inspect
# --------------------------------------------------------------------------

@test
def test_spec_from_model_equals_bundled_spec():
    with open(os.path.join(CALIB_DATA, "vit_mnist_t6.spec.json")) as f:
        want = json.load(f)
    got = asap_torch.spec_from_model(teacher())
    assert got["format"] == want["format"] and got["version"] == want["version"]
    assert got["layers"] == want["layers"], json.dumps(got["layers"][0], indent=1)
    # text layout: separate projections with biases, T = n_it
    spec = asap_torch.spec_from_model(sm.fixture_text(n_it=7), layers=["layers.1.mha"])
    (layer,) = spec["layers"]
    assert layer["layout"] == "separate" and layer["T"] == 7
    assert layer["q"] == {"weight": "layers.1.mha.WQ.weight", "bias": "layers.1.mha.WQ.bias"}
    assert layer["out"] == {"weight": "layers.1.mha.linear.weight", "bias": "layers.1.mha.linear.bias"}
    raises(ValueError, lambda: asap_torch.spec_from_model(torch.nn.Linear(2, 2)),
           "Linear has no Sinkformer attention module")
    raises(ValueError, lambda: asap_torch.spec_from_model(fixture_vit(), layers=["to_patch_embedding"]),
           "module 'to_patch_embedding'", "not a Sinkformer attention module")
    raises(ValueError, lambda: asap_torch.spec_from_model(fixture_vit(), layers=["nope"]),
           "ViT has no module named 'nope'", VIT[0])


@test
def test_compile_verify_from_model():
    need_asapc()
    model = fixture_vit()
    calib = os.path.join(FIXTURES, "vit_calib.h5")
    out = os.path.join(WORK, "vit.asap.h5")
    art, summary = asap_torch.compile(model, calib, out, progress=False, **FAST)
    assert isinstance(art, asap_torch.CompiledArtifact) and art.path == out
    assert art.layer_names == VIT
    assert [l["layer"] for l in summary["layers"]] == VIT and summary["artifact"] == out
    # what the CLI makes from the fixture's own spec file, with the same options
    want = os.path.join(WORK, "cli.asap.h5")
    subprocess.run([asap_torch.asapc_path(), "compile", os.path.join(FIXTURES, "vit_checkpoint.pt"),
                    "--spec", os.path.join(FIXTURES, "vit.spec.json"), "--calib", calib, "-o", want,
                    "-q", "--slices", "8", "--no-report", "--objective", "fidelity", "--threads", "1"],
                   check=True, capture_output=True)
    ref = asap_torch.load_artifact(want, backend="torch")
    # and from the checkpoint file with the spec as a dict (a checkpoint without code)
    with open(os.path.join(FIXTURES, "vit.spec.json")) as f:
        spec = json.load(f)
    art2, _ = asap_torch.compile(os.path.join(FIXTURES, "vit_checkpoint.pt"), [calib],
                                 os.path.join(WORK, "ckpt.asap.h5"), spec=spec, progress=False, **FAST)
    for name in VIT:
        for other in (ref, art2):
            a, b = art.layer(name), other.layer(name)
            assert a.describe == b.describe, (a.describe, b.describe)
            assert np.allclose(a.coef, b.coef, rtol=1e-6, atol=1e-9)
    # verify from the same model: the digest of its saved state_dict agrees
    html = os.path.join(WORK, "vit.verify.html")
    v = asap_torch.verify(model, art, calib, report=html, no_timing=True, max_closures=2,
                          max_attention_error=1e-9, progress=False)
    assert [l["name"] for l in v["layers"]] == VIT
    assert os.path.isfile(html)
    assert v["thresholds"]["passed"] is False
    assert len(v["thresholds"]["failures"]) == 2 and all(
        "exceeds --max-attention-error" in f for f in v["thresholds"]["failures"])
    v2 = asap_torch.verify(model, out, calib, no_timing=True, max_closures=1, progress=False,
                           compare=[art2.path], force=True)   # art2: the fixture file, same weights
    assert v2["thresholds"] == {"passed": True, "failures": []}
    assert len(v2["compare"]) == 1 and [l["name"] for l in v2["compare"][0]["layers"]] == VIT
    assert not os.path.exists(out + ".verify.html")        # no report unless asked
    # another model's weights: asapc's digest check, as a ValueError
    other = sm.fixture_vit(seed=3).eval()
    raises(asap_torch.AsapcInputError, lambda: asap_torch.verify(other, art, calib, no_timing=True,
                                                                 progress=False), "SHA-256")


@test
def test_compile_errors():
    need_asapc()
    model = fixture_vit()
    calib = os.path.join(FIXTURES, "vit_calib.h5")
    out = os.path.join(WORK, "bad.asap.h5")
    c = lambda m=model, **kw: asap_torch.compile(m, calib, out, progress=False, **kw)  # noqa: E731
    # options the CLI refuses: asapc's own sentence, as a ValueError
    raises(asap_torch.AsapcInputError, lambda: c(min_speedup=-1), "--min-speedup")
    raises(ValueError, lambda: c(no_such_option=3), "--no-such-option")
    raises(ValueError, lambda: c(objective="max-error"), "--objective max-error needs --max-error")
    raises(ValueError, lambda: c(fit="nope"), "--fit")
    # what the wrapper sets itself, a model without Sinkhorn attention, missing files
    raises(ValueError, lambda: c(output="x.h5"), "sets --output itself")
    raises(ValueError, lambda: c(torch.nn.Sequential(torch.nn.Linear(2, 2))),
           "module 'layers.0.0.fn'" if False else "transformer.layers.0.0.fn")
    raises(ValueError, lambda: asap_torch.compile(model, os.path.join(WORK, "none.h5"), out),
           "calibration file", "does not exist")
    raises(ValueError, lambda: asap_torch.compile(os.path.join(FIXTURES, "vit_checkpoint.pt"),
                                                  calib, out), "needs spec=")
    # a calibration file of another model: asapc refuses it
    raises(ValueError, lambda: asap_torch.compile(teacher(), calib, out, progress=False),
           "d_model")
    assert not os.path.exists(out)


@test
def test_compile_failure_is_compile_error():
    # asapc dying (not refusing input) is a CompileError naming the signal
    need_asapc()
    fake = os.path.join(WORK, "asapc_crash")
    with open(fake, "w") as f:
        f.write("#!/bin/sh\necho 'asapc: something' >&2\nkill -SEGV $$\n")
    os.chmod(fake, 0o755)
    code = ("import sys; sys.path[:0] = [%r, %r]\nimport asap_torch, sinkformer_models as sm, torch\n"
            "asap_torch._library.asapc_candidates = lambda use_path=True: [%r]\n"
            "try:\n    asap_torch.compile(sm.fixture_vit(), %r, %r, progress=False)\n"
            "except asap_torch.CompileError as e:\n    print(type(e).__name__, e.returncode, '|', e)\n"
            % (TOOLS, PYPKG, fake, os.path.join(FIXTURES, "vit_calib.h5"),
               os.path.join(WORK, "crash.h5")))
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.stdout.startswith("CompileError -11 | asapc compile failed (killed by signal 11)"), \
        r.stdout + r.stderr
    assert issubclass(asap_torch.CompileError, RuntimeError)
    assert not issubclass(asap_torch.CompileError, ValueError)


@test
def test_inspect():
    need_asapc()
    spec = asap_torch.inspect(os.path.join(CALIB_DATA, "vit_mnist_t6.pt"), T=6, heads=4)
    with open(os.path.join(CALIB_DATA, "vit_mnist_t6.spec.json")) as f:
        want = json.load(f)
    assert [l["name"] for l in spec["layers"]] == [l["name"] for l in want["layers"]]
    assert all(l["T"] == 6 and l["heads"] == 4 for l in spec["layers"])
    # without T the checkpoint does not say it: one sentence
    raises(ValueError, lambda: asap_torch.inspect(os.path.join(CALIB_DATA, "vit_mnist_t6.pt")), "T")


@test
def test_progress_bar_on_a_terminal_only():
    # compile's progress bar reaches stderr when it is a terminal (relayed
    # from asapc's pseudo-terminal), and not when stderr is a pipe
    need_asapc()
    code = ("import sys; sys.path[:0] = [%r, %r]\nimport asap_torch, sinkformer_models as sm, torch\n"
            "m = sm.fixture_vit()\n"
            "m.load_state_dict(torch.load(%r)['model_state_dict'])\n"
            "asap_torch.compile(m, %r, %r, slices=8, no_report=True, objective='fidelity', "
            "threads=1)\nprint('done', file=sys.stderr)\n"
            % (TOOLS, PYPKG, os.path.join(FIXTURES, "vit_checkpoint.pt"),
               os.path.join(FIXTURES, "vit_calib.h5"), os.path.join(WORK, "bar.asap.h5")))
    master, slave = pty.openpty()
    p = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.DEVNULL,
                         stdout=subprocess.DEVNULL, stderr=slave)
    os.close(slave)
    chunks = []
    while True:
        try:
            data = os.read(master, 4096)
        except OSError:
            break
        if not data:
            break
        chunks.append(data)
    p.wait()
    os.close(master)
    tty = b"".join(chunks).decode("utf-8", "replace")
    assert p.returncode == 0, tty
    assert "\r" in tty and "[####" in tty and "done" in tty, tty[-500:]
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert "[####" not in r.stderr and r.stderr.strip().endswith("done"), r.stderr


if __name__ == "__main__":
    try:
        code = harness.run(sys.argv[1:])
    finally:
        shutil.rmtree(WORK, ignore_errors=True)
    sys.exit(code)
