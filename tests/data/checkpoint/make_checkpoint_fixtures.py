#!/usr/bin/python3
"""Writes the checkpoint-reader fixtures and their expected values.

Run with Debian's python, which has torch 1.13:
    /usr/bin/python3 tests/data/checkpoint/make_checkpoint_fixtures.py
Every file is a few KB. expected.json maps fixture -> kind, stripped prefix,
sha256 and, per tensor (in file order): shape, dtype, sum and the first
values (row-major), which tests/test_checkpoint.cpp asserts against.
"""
import collections
import hashlib
import io
import json
import os
import struct
import zipfile

import torch
import torch.nn as nn

HERE = os.path.dirname(os.path.abspath(__file__))
torch.manual_seed(0)


def path(name):
    return os.path.join(HERE, name)


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(3, 2, bias=False)  # registers bias = None
        self.norm = nn.LayerNorm(2)
        self.register_buffer("scale", torch.tensor([0.5, 2.0]))
        self.register_buffer("cache", torch.zeros(2), persistent=False)


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Linear(4, 3)
        self.blocks = nn.Sequential(Block(), nn.ReLU(), Block())
        self.head = nn.Linear(2, 1)
        self.register_buffer("steps", torch.tensor(7, dtype=torch.int64))
        self.register_buffer("unused", None)


def dtype_name(t):
    return str(t.dtype).replace("torch.", "")


def describe(tensors):
    out = []
    for name, t in tensors.items():
        t = t.detach().contiguous()
        flat = t.reshape(-1).double()
        out.append({
            "name": name,
            "shape": list(t.shape),
            "dtype": dtype_name(t),
            "sum": float(flat.sum()),
            "first": [float(v) for v in flat[:6]],
        })
    return out


expected = {}


def record(file, kind, tensors, stripped=""):
    with open(path(file), "rb") as f:
        digest = hashlib.sha256(f.read()).hexdigest()
    expected[file] = {"kind": kind, "stripped_prefix": stripped, "sha256": digest, "tensors": describe(tensors)}


# 1. A plain state dict with every supported dtype and an nn.Parameter value.
sd = collections.OrderedDict()
sd["w_f32"] = torch.randn(3, 4)
sd["w_f64"] = torch.randn(5, dtype=torch.float64)
sd["idx_i64"] = torch.tensor([[1, -2, 3], [2**40, 0, -7]], dtype=torch.int64)
sd["mask_bool"] = torch.tensor([True, False, True, True])
sd["h_f16"] = torch.tensor([1.5, -0.25, 65504.0], dtype=torch.float16)
sd["b_bf16"] = torch.tensor([1.0, -3.5, 0.0078125], dtype=torch.bfloat16)
sd["i32"] = torch.tensor([-5, 6], dtype=torch.int32)
sd["i16"] = torch.tensor([-300, 300], dtype=torch.int16)
sd["i8"] = torch.tensor([-128, 127], dtype=torch.int8)
sd["u8"] = torch.tensor([0, 255, 17], dtype=torch.uint8)
sd["scalar"] = torch.tensor(3.25)
sd["empty"] = torch.zeros(0, 3)
sd["param"] = nn.Parameter(torch.arange(6, dtype=torch.float32).reshape(2, 3))
torch.save(sd, path("state_dict.pt"))
record("state_dict.pt", "state_dict", sd)

# 2. The same dict with pickle protocol 4 (FRAME, SHORT_BINUNICODE, MEMOIZE...).
torch.save(sd, path("state_dict_p4.pt"), pickle_protocol=4)
record("state_dict_p4.pt", "state_dict", sd)

# 3. Views sharing one storage: slices, a transpose, a strided slice.
base = torch.arange(12, dtype=torch.float32)
views = collections.OrderedDict()
views["full"] = base
views["head"] = base[:5]
views["tail"] = base[5:]
views["transposed"] = base.view(3, 4).t()
views["every_other"] = base[1::2]
views["tied"] = base  # the same tensor twice, like tied embeddings
torch.save(views, path("views.pt"))
record("views.pt", "state_dict", views)

# 4. A training checkpoint dict, written to a buffer (top folder "archive").
model = nn.Sequential(nn.Linear(2, 3), nn.Tanh(), nn.Linear(3, 1))
opt = torch.optim.Adam(model.parameters(), lr=0.1)
model(torch.ones(4, 2)).sum().backward()
opt.step()
buf = io.BytesIO()
torch.save({"epoch": 3, "model_state_dict": model.state_dict(), "optimizer_state_dict": opt.state_dict(),
            "loss": 0.125}, buf)
with open(path("checkpoint_dict.pt"), "wb") as f:
    f.write(buf.getvalue())
record("checkpoint_dict.pt", "checkpoint dict['model_state_dict']", model.state_dict())

# 5. A tensor dict under an unusual key: found as the single nested tensor dict.
torch.save({"step": 10, "my_weights": model.state_dict(), "note": "hi"}, path("nested_dict.pt"))
record("nested_dict.pt", "checkpoint dict['my_weights']", model.state_dict())

# 6. DataParallel adds "module." to every name.
dp = nn.DataParallel(model)
torch.save(dp.state_dict(), path("dataparallel.pt"))
record("dataparallel.pt", "state_dict", model.state_dict(), stripped="module.")

# 7. A whole pickled module (classes __main__.Net / __main__.Block).
net = Net()
torch.save(net, path("module.pt"))
record("module.pt", "pickled module (__main__.Net)", net.state_dict())

# 8. A checkpoint dict holding a whole module under 'model'.
torch.save({"model": net, "epoch": 1}, path("checkpoint_module.pt"))
record("checkpoint_module.pt", "checkpoint dict['model'], pickled module (__main__.Net)", net.state_dict())

# 9. safetensors, written by hand (Debian has no safetensors package).
st = collections.OrderedDict()
st["a.weight"] = torch.randn(2, 3)
st["a.bias"] = torch.tensor([1.0, 2.0], dtype=torch.float64)
st["counts"] = torch.tensor([3, 1, 4], dtype=torch.int64)
st["half"] = torch.tensor([0.5, -1.0], dtype=torch.float16)
st["flags"] = torch.tensor([False, True])
codes = {torch.float32: "F32", torch.float64: "F64", torch.int64: "I64", torch.float16: "F16", torch.bool: "BOOL"}
header, blobs, offset = {"__metadata__": {"format": "pt"}}, [], 0
for name, t in st.items():
    raw = t.contiguous().numpy().tobytes()
    header[name] = {"dtype": codes[t.dtype], "shape": list(t.shape), "data_offsets": [offset, offset + len(raw)]}
    blobs.append(raw)
    offset += len(raw)
text = json.dumps(header).encode()
text += b" " * (-len(text) % 8)  # safetensors pads the header to 8 bytes
with open(path("tensors.safetensors"), "wb") as f:
    f.write(struct.pack("<Q", len(text)) + text + b"".join(blobs))
record("tensors.safetensors", "safetensors", st)

# --- files the reader must refuse ---
# Legacy (pre-1.6) non-zip format.
torch.save(collections.OrderedDict(w=torch.ones(2)), path("legacy.pt"), _use_new_zipfile_serialization=False)
# A torch.save archive re-zipped with deflate by another tool.
with zipfile.ZipFile(path("state_dict.pt")) as src, \
        zipfile.ZipFile(path("compressed.pt"), "w", compression=zipfile.ZIP_DEFLATED) as dst:
    for info in src.infolist():
        dst.writestr(info.filename, src.read(info.filename))
# Nothing tensor-like at all.
torch.save([1, 2.5, "three"], path("no_tensors.pt"))

with open(path("expected.json"), "w") as f:
    json.dump(expected, f, indent=1)
    f.write("\n")
for name in sorted(os.listdir(HERE)):
    print(f"{os.path.getsize(path(name)):7d}  {name}")
