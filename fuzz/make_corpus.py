#!/usr/bin/env python3
"""Writes the fuzz seed corpus, fuzz/corpus/<target>/ (docs/reliability.md).

Small valid files copied from tests/data, plus small hostile files made here
(the shapes of what the test suites refuse, and the reproducers of issue 16,
items 8 and 9). Needs Debian's python3-h5py and python3-numpy:

    /usr/bin/python3 fuzz/make_corpus.py

Rerunning rewrites the files it makes and leaves others (e.g. inputs that
libFuzzer added with -merge) alone. Keep the corpus small (< 2 MB).
"""
import json
import os
import shutil
import struct
import sys

import h5py
import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CORPUS = os.path.join(ROOT, "fuzz", "corpus")
DATA = os.path.join(ROOT, "tests", "data")


def fs(v, vlen=False):
    """A string attribute value: fixed-length (what asapc writes since artifact
    format 4 / calibration version 2), or h5py's variable-length str."""
    if vlen:
        return v
    b = v.encode()
    return np.array(b, dtype="S%d" % max(1, len(b)))


def fs_list(vs, vlen=False):
    if vlen:
        return list(vs)
    w = max([1] + [len(v.encode()) for v in vs])
    return np.array([v.encode() for v in vs], dtype="S%d" % w)


def out(target, name):
    d = os.path.join(CORPUS, target)
    os.makedirs(d, exist_ok=True)
    return os.path.join(d, name)


def copy(target, src, name=None):
    shutil.copyfile(src, out(target, name or os.path.basename(src)))


def write(target, name, data):
    with open(out(target, name), "wb") as f:
        f.write(data)


def truncated(src, frac=0.5):
    with open(src, "rb") as f:
        b = f.read()
    return b[: int(len(b) * frac)]


# ---- checkpoint (zip + unpickler) ----------------------------------------------
for n in ["state_dict.pt", "state_dict_p4.pt", "checkpoint_dict.pt", "checkpoint_module.pt", "module.pt",
          "dataparallel.pt", "nested_dict.pt", "no_tensors.pt", "views.pt", "legacy.pt", "compressed.pt"]:
    copy("checkpoint", os.path.join(DATA, "checkpoint", n))
for n in ["no_attention.pt", "set_transformer.pt"]:
    copy("checkpoint", os.path.join(DATA, "layouts", n))
write("checkpoint", "truncated_state_dict.pt", truncated(os.path.join(DATA, "checkpoint", "state_dict.pt")))
with open(os.path.join(DATA, "checkpoint", "state_dict.pt"), "rb") as f:
    sd = bytearray(f.read())
# No end-of-central-directory record.
write("checkpoint", "no_eocd.pt", bytes(sd[: sd.rfind(b"PK\x05\x06")]))
copy("checkpoint", os.path.join(DATA, "checkpoint", "tensors.safetensors"))

# ---- safetensors ------------------------------------------------------------------


def safetensors(header, data=b""):
    h = json.dumps(header).encode()
    return struct.pack("<Q", len(h)) + h + data


copy("safetensors", os.path.join(DATA, "checkpoint", "tensors.safetensors"))
write("safetensors", "two.safetensors",
      safetensors({"__metadata__": {"format": "pt"},
                   "a": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 16]},
                   "b": {"dtype": "BF16", "shape": [3], "data_offsets": [16, 22]}}, bytes(22)))
write("safetensors", "offsets_past_end.safetensors",
      safetensors({"a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 1 << 40]}}, bytes(16)))
write("safetensors", "shape_overflow.safetensors",
      safetensors({"a": {"dtype": "F64", "shape": [1 << 62, 4], "data_offsets": [0, 0]}}))
write("safetensors", "header_length_huge.safetensors", struct.pack("<Q", 1 << 60) + b'{"a": 1}')
write("safetensors", "unknown_dtype.safetensors",
      safetensors({"a": {"dtype": "Q7", "shape": [1], "data_offsets": [0, 1]}}, bytes(1)))

# ---- teacher spec -----------------------------------------------------------------
copy("spec", os.path.join(DATA, "fixtures", "vit.spec.json"))
copy("spec", os.path.join(ROOT, "calib_data", "vit_mnist_t6.spec.json"))
with open(os.path.join(DATA, "fixtures", "vit.spec.json")) as f:
    spec = json.load(f)
one = dict(spec, layers=spec["layers"][:1])
bad = json.loads(json.dumps(one))
bad["layers"][0]["T"] = 2147483647
write("spec", "huge_T.json", json.dumps(bad).encode())
bad = json.loads(json.dumps(one))
bad["layers"][0]["heads"] = -1
bad["layers"][0]["head_dim"] = 1 << 62
write("spec", "bad_sizes.json", json.dumps(bad).encode())
sep = json.loads(json.dumps(one))
l0 = sep["layers"][0]
del l0["qkv"], l0["qkv_order"]
l0.update(layout="separate", q={"weight": "q.weight", "bias": "q.bias"}, k={"weight": "k.weight", "bias": None},
          v={"weight": "v.weight", "bias": None}, mask="drop_queries", head_layout="(d h)")
write("spec", "separate.json", json.dumps(sep).encode())
write("spec", "not_json.json", b'{"format": "asapc-teacher-spec", "layers": [ {')
write("spec", "deep.json", b"[" * 2000 + b"]" * 2000)

# ---- calibration files ------------------------------------------------------------
copy("calib", os.path.join(DATA, "fixtures", "vit_calib.h5"))
copy("calib", os.path.join(DATA, "fixtures", "text_calib.h5"))
rng = np.random.default_rng(3)


def calib(name, fill, fmt="asapc-calib", version=2, vlen=False):
    with h5py.File(out("calib", name), "w") as f:
        f.attrs["format"] = fs(fmt, vlen)
        f.attrs["version"] = version
        fill(f)


def projected(f):
    g = f.create_group("layers/enc.attn")
    for k in "qkv":
        g.create_dataset(k, data=rng.standard_normal((3, 2, 5, 4)).astype(np.float32), chunks=(2, 2, 5, 4),
                         compression="gzip", shuffle=True)
    m = np.ones((3, 5), np.uint8)
    m[1, 3:] = 0
    g.create_dataset("mask", data=m.astype(bool), chunks=(2, 5))


calib("projected_gzip.h5", projected)


def x_layer(f, x, **kw):
    g = f.create_group("layers/l0")
    g.create_dataset("x", data=x, **kw)


calib("x_float64_root_mask.h5",
      lambda f: (x_layer(f, rng.standard_normal((2, 3, 4))),
                 f.create_dataset("mask", data=np.array([[1, 1, 0], [1, 0, 0]], np.uint8))))
calib("nan_at_1.h5", lambda f: x_layer(f, np.array([[[0.0, 1.0]], [[np.nan, 0.0]]], np.float32)))
calib("bad_mask.h5",
      lambda f: (x_layer(f, np.zeros((2, 3, 4), np.float32)),
                 f["layers/l0"].create_dataset("mask", data=np.array([[2, 1, 0], [0, 0, 0]], np.uint8))))
calib("wrong_format.h5", lambda f: x_layer(f, np.zeros((1, 2, 2), np.float32)), fmt="asapc-artifact")
# Version 1 with h5py's variable-length 'format': refused before any string is read.
calib("legacy_vlen_v1.h5", lambda f: x_layer(f, np.zeros((1, 2, 2), np.float32)), version=1, vlen=True)


def unwritten(f):
    # Issue 16, item 9: 2^40 examples declared in chunks that were never written.
    g = f.create_group("layers/l0")
    g.create_dataset("x", shape=(1 << 40, 17, 32), maxshape=(None, 17, 32), chunks=(64, 17, 32), dtype=np.float32,
                     compression="gzip")


calib("unwritten_chunks.h5", unwritten)


def unwritten_contiguous(f):
    g = f.create_group("layers/l0")
    dcpl = h5py.h5p.create(h5py.h5p.DATASET_CREATE)
    dcpl.set_alloc_time(h5py.h5d.ALLOC_TIME_LATE)
    space = h5py.h5s.create_simple((1 << 20, 4, 4))
    h5py.h5d.create(g.id, b"x", h5py.h5t.IEEE_F32LE, space, dcpl=dcpl)


calib("unwritten_contiguous.h5", unwritten_contiguous)
write("calib", "truncated.h5", truncated(os.path.join(DATA, "fixtures", "vit_calib.h5")))

# ---- artifacts --------------------------------------------------------------------


def unit_columns(rows, cols):
    t = rng.standard_normal((rows, cols))
    return t / np.linalg.norm(t, axis=0, keepdims=True)


def layer(g, name, *, layout="none", heads=2, head_dim=3, value_dim=3, d_model=0, slices=0, features=("alpha",),
          per_head=0, theta=None, coef=None, weights=None, operator=None, sinkhorn_steps=None, T=4, vlen=False):
    s = dict(name=name, layout=layout, qkv_weight="", qkv_bias="", qkv_order="qkv", q_weight="", q_bias="",
             k_weight="", k_bias="", v_weight="", v_bias="", out_weight="", out_bias="", head_layout="(h d)",
             mask="keep_queries", ending="column" if T % 2 == 0 else "row")
    for k, v in s.items():
        g.attrs[k] = fs(v, vlen)
    for k, v in dict(d_model=d_model, heads=heads, head_dim=head_dim, value_dim=value_dim, T=T, multiply_by_n=1,
                     slices=slices, per_head=per_head, default_closures=1).items():
        g.attrs[k] = np.int64(v)
    g.attrs["score_scale"] = 1.0 / np.sqrt(head_dim)
    g.attrs["eps"] = 1.0
    g.attrs["features"] = fs_list(features, vlen)
    if operator:
        g.attrs["operator"] = fs(operator, vlen)
    if sinkhorn_steps:
        g.attrs["sinkhorn_steps"] = np.int64(sinkhorn_steps)
    cols = slices + sum(f != "sliced_potential" for f in features)
    g.create_dataset("theta", data=unit_columns(head_dim, max(slices, 2)) if theta is None else theta)
    g.create_dataset("coef", data=rng.standard_normal((heads if per_head else 1, cols)) if coef is None else coef)
    g["fit_json"] = fs('{"note": "fuzz seed"}', vlen)
    if weights:
        w = g.create_group("weights")
        for k, v in weights.items():
            w.create_dataset(k, data=v)


def artifact(name, fill, version=4, vlen=False):
    with h5py.File(out("artifact", name), "w") as f:
        f.attrs["format"] = fs("asapc-artifact", vlen)
        f.attrs["format_version"] = np.int64(version)
        f.attrs["asapc_version"] = fs("0.1.0", vlen)
        f.attrs["teacher_sha256"] = fs("a" * 64, vlen)
        f.attrs["teacher_file"] = fs("teacher.pt", vlen)
        f.attrs["created_utc"] = fs("2024-05-01T12:00:00Z", vlen)
        n = fill(f.create_group("layers", track_order=True))
        f.attrs["num_layers"] = np.int64(n)


def fused_weights(d, heads, hd, vd):
    r = lambda *s: rng.standard_normal(s).astype(np.float32)
    return dict(wq=r(heads * hd, d), bq=r(heads * hd), wk=r(heads * hd, d), bk=r(heads * hd), wv=r(heads * vd, d),
                bv=r(heads * vd), wo=r(d, heads * vd), bo=r(d))


def two_layers(f):
    layer(f.create_group("0000"), "blocks.0.attn", layout="fused", heads=2, head_dim=4, value_dim=4, d_model=8,
          slices=4, features=("sliced_potential", "alpha", "softmax_dual"), per_head=1,
          weights=fused_weights(8, 2, 4, 4), T=5)
    layer(f.create_group("0001"), "adapter.attn")
    return 2


artifact("two_layers.h5", two_layers)
# A format-3 file as asapc wrote it before version 4 (variable-length strings):
# refused before any string is read.
artifact("legacy_vlen_v3.h5", lambda f: (layer(f.create_group("0000"), "x", vlen=True), 1)[-1], version=3, vlen=True)
artifact("sinkhorn_teacher_v3.h5", lambda f: (
    layer(f.create_group("0"), "a", features=(), operator="sinkhorn", sinkhorn_steps=2, coef=np.zeros((1, 0))),
    layer(f.create_group("1"), "b", features=(), operator="teacher", coef=np.zeros((1, 0))), 2)[-1])
artifact("sinkhorn3_v2.h5", lambda f: (
    layer(f.create_group("0"), "a", slices=2, features=("sliced_potential", "sinkhorn_dual3")), 1)[-1], version=2)


def theta_unwritten(f):
    # Issue 16, item 8: theta declares 2^40 x 64 (never written).
    layer(f.create_group("0000"), "blocks.0.attn", slices=4, features=("sliced_potential",),
          theta=np.zeros((3, 4)))
    g = f["0000"]
    del g["theta"]
    g.create_dataset("theta", shape=(1 << 40, 64), dtype=np.float64, chunks=(1, 64))
    return 1


artifact("theta_2e40.h5", theta_unwritten)


def theta_huge_square(f):
    layer(f.create_group("0000"), "x")
    g = f["0000"]
    del g["theta"]
    g.create_dataset("theta", shape=(1 << 40, 1 << 40), dtype=np.float64, chunks=(1, 1))
    return 1


artifact("theta_2e40_square.h5", theta_huge_square)


def heads_overflow(f):
    layer(f.create_group("0000"), "x", layout="fused", d_model=8, weights=fused_weights(8, 2, 3, 3))
    f["0000"].attrs["heads"] = np.int64(1 << 62)
    f["0000"].attrs["per_head"] = np.int64(0)
    return 1


artifact("heads_overflow.h5", heads_overflow)


def coef_wrong(f):
    layer(f.create_group("0000"), "x", coef=np.full((1, 1), np.nan))
    return 1


artifact("coef_nan.h5", coef_wrong)
write("artifact", "truncated.h5", truncated(out("artifact", "two_layers.h5")))

total = 0
for d, _, files in os.walk(CORPUS):
    total += sum(os.path.getsize(os.path.join(d, f)) for f in files)
print(f"fuzz corpus: {total / 1e6:.2f} MB in {CORPUS}", file=sys.stderr)
