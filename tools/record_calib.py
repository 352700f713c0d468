#!/usr/bin/env python3
"""Record an asapc calibration file (docs/calibration-format.md) from a
PyTorch model.

Run with Debian's interpreter (it has torch and h5py):

    ${PYTHON:-/usr/bin/python3} tools/record_calib.py --demo vit -o calib.h5
    ${PYTHON:-/usr/bin/python3} tools/record_calib.py --model-file model.pt \
        --layers layers.0.mha,layers.1.mha --data tokens.npy -o calib.h5
    ${PYTHON:-/usr/bin/python3} tools/record_calib.py --model-file model.pt --list-modules

The recording is the asap_torch package's (python/asap_torch/record.py):
this script is its command line, plus the loaders of models and data it
needs. From Python, call the package directly:

    import asap_torch
    asap_torch.record(model, batches, "calib.h5", layers=["transformer.layers.0.0.fn"])

Run from a clone, it imports the package from python/ (installed or not).
See docs/recording-calibration.md.
"""
import argparse
import importlib
import json
import os
import sys

try:
    import numpy as np
    import torch
    import h5py
except ImportError as exc:  # pragma: no cover - depends on the interpreter
    sys.stderr.write("record_calib.py: %s\nrun it with Debian's interpreter: "
                     "${PYTHON:-/usr/bin/python3} tools/record_calib.py ...\n" % exc)
    sys.exit(2)

TOOLS_DIR = os.path.dirname(os.path.abspath(__file__))
PYTHON_DIR = os.path.join(os.path.dirname(TOOLS_DIR), "python")   # the asap_torch package
for _d in (TOOLS_DIR, PYTHON_DIR):
    if _d not in sys.path:
        sys.path.insert(0, _d)

import asap_torch  # noqa: E402
from asap_torch.record import (ATTENTION_HINTS, FORMAT, VERSION, Progress, RecordError,  # noqa: E402,F401
                               attention_candidates, check_calib, default_mask, fixed_str, is_vlen_str_attr,
                               resolve_layers)


def record(model, layer_names, batches, out_path, mask_fn=None, chunk=64, **kw):
    """asap_torch.record with this script's historical argument order
    (layer names before the batches); returns the number of examples."""
    if not layer_names:
        raise RecordError("no layer to record")
    return asap_torch.record(model, batches, out_path, layers=layer_names, mask_fn=mask_fn,
                             chunk=chunk, **kw)



# --------------------------------------------------------------------------
# loading models and data (shared with the other tools)
# --------------------------------------------------------------------------

STATE_KEYS = ("model_state_dict", "state_dict", "net", "model", "model_state")


def unwrap(model):
    """The inner module of DataParallel / DistributedDataParallel wrappers."""
    while isinstance(model, (torch.nn.DataParallel, torch.nn.parallel.DistributedDataParallel)):
        model = model.module
    return model


def load_state_dict(path):
    """A plain {name: tensor} state dict from a state-dict file, a checkpoint
    dict (model under one of STATE_KEYS), a whole pickled module or a
    .safetensors file; DataParallel's 'module.' prefix removed."""
    if str(path).endswith(".safetensors"):
        sd = read_safetensors(path)
    else:
        obj = torch.load(path, map_location="cpu")
        if isinstance(obj, torch.nn.Module):
            sd = unwrap(obj).state_dict()
        elif isinstance(obj, dict) and obj and all(torch.is_tensor(v) for v in obj.values()):
            sd = obj
        elif isinstance(obj, dict):
            for key in STATE_KEYS:
                if key in obj:
                    inner = obj[key]
                    sd = unwrap(inner).state_dict() if isinstance(inner, torch.nn.Module) else inner
                    break
            else:
                raise RecordError("%s: a dict without model weights: no key among %s (keys: %s)"
                                  % (path, ", ".join(STATE_KEYS), ", ".join(map(str, obj))))
        else:
            raise RecordError("%s: holds a %s, not a model or a state dict"
                              % (path, type(obj).__name__))
    if sd and all(k.startswith("module.") for k in sd):
        sd = {k[len("module."):]: v for k, v in sd.items()}
    return dict(sd)


def read_safetensors(path):
    """{name: tensor} from a .safetensors file (F32/F64/F16/I64/I32 only)."""
    dtypes = {"F32": np.float32, "F64": np.float64, "F16": np.float16,
              "I64": np.int64, "I32": np.int32}
    with open(path, "rb") as fh:
        size = int.from_bytes(fh.read(8), "little")
        header = json.loads(fh.read(size))
        blob = fh.read()
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        b, e = info["data_offsets"]
        arr = np.frombuffer(blob[b:e], dtype=np.dtype(dtypes[info["dtype"]]).newbyteorder("<"))
        out[name] = torch.from_numpy(arr.reshape(info["shape"]).copy())
    return out


def load_model_file(path):
    """A whole pickled module (torch.save(model)); wrappers removed."""
    try:
        obj = torch.load(path, map_location="cpu")
    except (ModuleNotFoundError, AttributeError) as e:
        raise RecordError("%s: unpickling the model needs the code that defined it (%s); add "
                          "its folder with --path" % (path, e))
    if isinstance(obj, dict):
        for key in ("model",):
            if isinstance(obj.get(key), torch.nn.Module):
                obj = obj[key]
                break
    if not isinstance(obj, torch.nn.Module):
        raise RecordError("%s holds a %s, not a whole model: use --checkpoint with --builder"
                          % (path, type(obj).__name__))
    return unwrap(obj)


def build_model(spec, kwargs=None):
    """Call 'module:function' (module importable from sys.path) with kwargs."""
    if ":" not in spec:
        raise RecordError("--builder expects module:function, got '%s'" % spec)
    mod_name, fn_name = spec.split(":", 1)
    fn = getattr(importlib.import_module(mod_name), fn_name, None)
    if fn is None:
        raise RecordError("module %s has no function %s" % (mod_name, fn_name))
    return fn(**(kwargs or {}))


def load_data(spec):
    """A tensor of examples (one per row) from .npy, .pt/.pth or file.h5:dataset."""
    if ".h5:" in spec or ".hdf5:" in spec:
        path, key = spec.rsplit(":", 1)
        with h5py.File(path, "r") as f:
            if key not in f:
                raise RecordError("%s has no dataset '%s' (it has: %s)"
                                  % (path, key, ", ".join(f.keys())))
            return torch.from_numpy(f[key][()])
    if spec.endswith(".npy"):
        return torch.from_numpy(np.load(spec))
    obj = torch.load(spec, map_location="cpu")
    if isinstance(obj, (tuple, list)):
        obj = obj[0]
    elif isinstance(obj, dict):
        for key in ("inputs", "input", "x", "data", "tokens", "images"):
            if key in obj:
                obj = obj[key]
                break
    if not torch.is_tensor(obj):
        raise RecordError("%s: expected a tensor of examples, found %s" % (spec, type(obj).__name__))
    return obj


class TensorBatches:
    """Batches of rows of a tensor; len() and batch_size give the progress total."""

    def __init__(self, data, batch_size):
        self.data, self.batch_size = data, batch_size

    def __len__(self):
        return (len(self.data) + self.batch_size - 1) // self.batch_size

    def __iter__(self):
        for s in range(0, len(self.data), self.batch_size):
            yield self.data[s:s + self.batch_size]


# --------------------------------------------------------------------------
# command line
# --------------------------------------------------------------------------

def _demo(family, count, seed):
    import sinkformer_models as sm
    if family == "vit":
        return sm.fixture_vit(), sm.synthetic_images(count, seed=seed)
    return sm.fixture_text(), sm.synthetic_tokens(count, seed=seed)


def main(argv=None):
    p = argparse.ArgumentParser(
        prog="record_calib.py",
        description="Record an asapc calibration file (docs/calibration-format.md) from a "
                    "PyTorch model. Run with ${PYTHON:-/usr/bin/python3}.")
    src = p.add_argument_group("model (one of)")
    src.add_argument("--model-file", help="whole pickled model (torch.save(model)); "
                     "DataParallel wrappers are removed")
    src.add_argument("--checkpoint", help="state dict / checkpoint dict / .safetensors, "
                     "loaded into the model made by --builder")
    src.add_argument("--builder", help="module:function returning the model (with --checkpoint)")
    src.add_argument("--builder-kwargs", default="{}", help="JSON object of builder arguments")
    src.add_argument("--demo", choices=("vit", "text"),
                     help="fixture-sized Sinkformer model with synthetic inputs")
    p.add_argument("--path", action="append", default=[],
                   help="folder added to sys.path (for unpickling or --builder); repeatable")
    p.add_argument("--layers", help="comma-separated module names (default: every module "
                   "that owns to_qkv / WQ / in_proj_weight / q_proj / fc_q)")
    p.add_argument("--data", help="examples, one per row: file.npy, file.pt or file.h5:dataset "
                   "(images [N, C, H, W] or token ids [N, n])")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--max-examples", type=int)
    p.add_argument("--demo-n", type=int, default=64, help="number of synthetic examples (--demo)")
    p.add_argument("--seed", type=int, default=0, help="seed of the synthetic examples (--demo)")
    p.add_argument("--chunk", type=int, default=64, help="HDF5 chunk length along N")
    p.add_argument("--list-modules", action="store_true",
                   help="print the candidate attention module names and exit")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.add_argument("-o", "--output", help="calibration file to write")
    a = p.parse_args(argv)

    try:
        for d in a.path:
            sys.path.insert(0, os.path.abspath(d))
        n_sources = sum(x is not None for x in (a.model_file, a.checkpoint, a.demo))
        if n_sources != 1:
            raise RecordError("give exactly one of --model-file, --checkpoint (with --builder) "
                              "or --demo")
        data = None
        if a.demo:
            model, data = _demo(a.demo, a.demo_n, a.seed)
        elif a.model_file:
            model = load_model_file(a.model_file)
        else:
            if not a.builder:
                raise RecordError("--checkpoint needs --builder module:function to make the model")
            model = unwrap(build_model(a.builder, json.loads(a.builder_kwargs)))
            try:
                model.load_state_dict(load_state_dict(a.checkpoint))
            except RuntimeError as e:
                raise RecordError("%s does not fit the model made by %s: %s"
                                  % (a.checkpoint, a.builder, str(e).strip()))

        if a.list_modules:
            cands = attention_candidates(model)
            if not cands:
                print("no module owns to_qkv / WQ / in_proj_weight / q_proj / fc_q; all modules:",
                      file=sys.stderr)
                cands = [n for n, _ in model.named_modules() if n]
            for name in cands:
                print(name)
            return 0

        layers = [s for s in (a.layers or "").split(",") if s] or attention_candidates(model)
        if not layers:
            raise RecordError("no attention module found: name them with --layers "
                              "(see --list-modules)")
        if not a.output:
            raise RecordError("missing -o/--output")
        if a.data:
            data = load_data(a.data)
        if data is None:
            raise RecordError("missing --data")
        if a.batch_size < 1:
            raise RecordError("--batch-size must be >= 1")
        n = record(model, layers, TensorBatches(data, a.batch_size), a.output, chunk=a.chunk,
                   total=len(data), max_examples=a.max_examples, quiet=a.quiet)
        if not a.quiet:
            print("wrote %s: %d examples, layers %s" % (a.output, n, ", ".join(layers)),
                  file=sys.stderr)
        return 0
    except RecordError as e:
        print("record_calib.py: error: %s" % e, file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
