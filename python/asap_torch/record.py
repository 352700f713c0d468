"""record: an asapc calibration file (docs/calibration-format.md) from a
PyTorch model, with forward pre-hooks on its attention modules.

    asap_torch.record(model, batches, "calib.h5")              # every Sinkformer attention module
    asap_torch.record(model, batches, "calib.h5", layers=["layers.0.mha"])

Forward pre-hooks on the named modules capture what each attention module's
forward receives (its first positional argument, [B, n, d_model]) and, for
masked models, the key-padding mask; everything streams to a temporary HDF5
file in chunks along N and is renamed to the output path at the end.
tools/record_calib.py is the command-line front end. See
docs/recording-calibration.md.
"""
import difflib
import os
import sys
import time

import numpy as np
import torch

from .patch import module_kind

FORMAT = "asapc-calib"
# 2: every string attribute is a fixed-length HDF5 string (docs/calibration-format.md)
VERSION = 2
# a module that owns one of these (child module or parameter) is an attention module
ATTENTION_HINTS = ("to_qkv", "WQ", "in_proj_weight", "q_proj", "fc_q")
DEFAULT_BATCH = 64

__all__ = ["record", "check_calib", "RecordError", "attention_candidates", "sinkhorn_layers",
           "resolve_layers", "default_mask", "Progress"]


def _h5py():
    try:
        import h5py
    except ImportError as e:
        raise ImportError("asap_torch needs h5py to read and write HDF5 files (Debian: apt-get "
                          "install python3-h5py; %s)" % e) from None
    return h5py


class RecordError(ValueError):
    """Bad user input: a message meant for a person, no traceback needed."""


# --------------------------------------------------------------------------
# module names
# --------------------------------------------------------------------------

def attention_candidates(model):
    """Names of modules that look like attention (own to_qkv, WQ, in_proj_weight, ...)."""
    out = []
    for name, m in model.named_modules():
        if any(h in m._modules or h in m._parameters for h in ATTENTION_HINTS):
            out.append(name)
    return out


def sinkhorn_layers(model):
    """Names of the model's Sinkformer attention modules (what patch_model
    and compile handle), in module order."""
    return [name for name, m in model.named_modules() if name and module_kind(m)]


def resolve_layers(model, layer_names):
    """{name: module} for each requested name; RecordError for unknown names."""
    modules = dict(model.named_modules())
    found = {}
    for name in layer_names:
        if name in modules and name != "":
            found[name] = modules[name]
            continue
        close = difflib.get_close_matches(name, [k for k in modules if k], n=5, cutoff=0.6)
        cands = attention_candidates(model)
        msg = "the model has no module named '%s'" % name
        if close:
            msg += "; close names: " + ", ".join(close)
        if cands:
            msg += "; attention modules: " + ", ".join(cands)
        else:
            msg += "; no module owns to_qkv / WQ / in_proj_weight / q_proj / fc_q " \
                   "(model.named_modules() lists every module; record_calib.py: --list-modules)"
        raise RecordError(msg)
    if len(set(layer_names)) != len(layer_names):
        raise RecordError("a layer is named twice in %s" % ", ".join(layer_names))
    return found


# --------------------------------------------------------------------------
# masks
# --------------------------------------------------------------------------

def _key_pad_from(t, x):
    """Key-padding [B, n] bool (True = pad) from one mask-like argument, or None."""
    b, n = x.shape[0], x.shape[1]
    if (not torch.is_tensor(t) or t.dim() < 2 or t.shape[0] != b or t.shape[-1] != n
            or (t.is_floating_point() and t.shape == x.shape)):   # K, V activations
        return None
    if t.dtype == torch.bool:
        pad = t
    elif t.is_floating_point():
        if ((t == 0) | (t <= -1e4)).all():      # additive mask: 0 keeps, -inf/-1e9 removes
            pad = t <= -1e4
        elif ((t == 0) | (t == 1)).all():
            raise RecordError("the attention mask argument is a 0/1 float tensor (which value "
                              "is padding?); pass mask_fn to say")
        else:
            return None
    else:
        return None
    while pad.dim() > 2:                 # [B, n, n] -> row 0; [B, H, n, n] -> head 0, row 0
        pad = pad[:, 0]
    return pad


def default_mask(args):
    """[B, n] uint8 (1 = token) from a module's positional args, or None.

    The first tensor argument after the input that is bool (True = padded key,
    PyTorch's convention: Sinkformer's attn_mask [B, n, n], key_padding_mask
    [B, n], or [B, H, n, n]) or an additive float mask; for a 3-D/4-D mask the
    key padding is read from its first query row (attn_mask[:, 0, :]).
    """
    x = args[0]
    for t in args[1:]:
        pad = _key_pad_from(t, x)
        if pad is not None:
            return (~pad).to(torch.uint8)
    return None


# --------------------------------------------------------------------------
# progress
# --------------------------------------------------------------------------

def _hms(seconds):
    seconds = int(round(seconds))
    h, rem = divmod(seconds, 3600)
    return ("%d:%02d:%02d" % (h, rem // 60, rem % 60)) if h else ("%d:%02d" % divmod(rem, 60))


class Progress:
    """One-line progress bar on stderr with rate and ETA.

    Silent when disabled or when the stream is not a terminal.
    """

    def __init__(self, total=None, unit="examples", label="recording", enabled=True,
                 stream=None, width=28):
        self.stream = stream or sys.stderr
        self.enabled = enabled and hasattr(self.stream, "isatty") and self.stream.isatty()
        self.total, self.unit, self.label, self.width = total, unit, label, width
        self.done, self.start, self.last = 0, time.monotonic(), 0.0

    def update(self, k):
        self.done += k
        now = time.monotonic()
        if self.enabled and (now - self.last >= 0.1 or self.done == self.total):
            self.last = now
            self._draw(now)

    def _draw(self, now):
        elapsed = max(now - self.start, 1e-9)
        rate = self.done / elapsed
        if self.total:
            frac = min(self.done / self.total, 1.0)
            fill = int(frac * self.width)
            eta = _hms((self.total - self.done) / rate) if rate > 0 else "?"
            line = "%s [%s%s] %d/%d %s  %.1f/s  ETA %s" % (
                self.label, "#" * fill, "." * (self.width - fill), self.done, self.total,
                self.unit, rate, eta)
        else:
            line = "%s %d %s  %.1f/s  %s" % (self.label, self.done, self.unit, rate, _hms(elapsed))
        self.stream.write("\r" + line + "\x1b[K")
        self.stream.flush()

    def close(self):
        if self.enabled:
            self._draw(time.monotonic())
            self.stream.write("\n")
            self.stream.flush()


# --------------------------------------------------------------------------
# recording
# --------------------------------------------------------------------------

def _default_call(model, batch):
    if isinstance(batch, dict):
        return model(**batch)
    if isinstance(batch, (tuple, list)):
        return model(*batch)
    return model(batch)


def _batch_len(batch):
    if torch.is_tensor(batch):
        return batch.shape[0]
    if isinstance(batch, dict):
        batch = list(batch.values())
    for t in batch:
        if torch.is_tensor(t):
            return t.shape[0]
    return None


def _take(batch, k):
    """The first k examples of a batch (tensor, tuple/list of tensors, or dict)."""
    if torch.is_tensor(batch):
        return batch[:k]
    if isinstance(batch, dict):
        return {key: _take(v, k) for key, v in batch.items()}
    if isinstance(batch, (tuple, list)):
        return type(batch)(_take(t, k) if torch.is_tensor(t) else t for t in batch)
    return batch


class _LayerSink:
    """Resizable chunked datasets of one layer in the open HDF5 file."""

    def __init__(self, group, chunk, compression=None):
        self.group, self.chunk = group, chunk
        # optional gzip (with the shuffle filter, which helps float32 compress)
        self.filters = dict(compression=compression, shuffle=True) if compression else {}
        self.x = self.mask = None
        self.shape = None

    def append(self, name, x, mask, start):
        b, n, d = x.shape
        if self.x is None:
            self.shape = (n, d)
            self.x = self.group.create_dataset(
                "x", shape=(0, n, d), maxshape=(None, n, d), dtype="float32",
                chunks=(self.chunk, n, d), **self.filters)
            if mask is not None:
                self.mask = self.group.create_dataset(
                    "mask", shape=(0, n), maxshape=(None, n), dtype="uint8",
                    chunks=(self.chunk, n), **self.filters)
        if (n, d) != self.shape:
            raise RecordError("layer '%s': example %d has input shape [n=%d, d=%d], earlier ones "
                              "[n=%d, d=%d]; a calibration file has one sequence length: pad "
                              "to a fixed length and give a mask" % ((name, start, n, d) + self.shape))
        if (mask is None) != (self.mask is None):
            raise RecordError("layer '%s': a key-padding mask was found for some batches and not "
                              "others (first change at example %d)" % (name, start))
        if not np.isfinite(x).all():
            bad = int(np.nonzero(~np.isfinite(x).reshape(b, -1).all(axis=1))[0][0])
            raise RecordError("layer '%s': non-finite input activation in example %d"
                              % (name, start + bad))
        self.x.resize(start + b, axis=0)
        self.x[start:start + b] = x
        if mask is not None:
            if mask.shape != (b, n):
                raise RecordError("layer '%s': mask has shape %s, expected [%d, %d]"
                                  % (name, list(mask.shape), b, n))
            if not np.isin(mask, (0, 1)).all():
                raise RecordError("layer '%s': mask values must be 0 or 1" % name)
            empty = np.nonzero(mask.sum(axis=1) == 0)[0]
            if len(empty):
                raise RecordError("layer '%s': example %d has no token (mask is all 0)"
                                  % (name, start + int(empty[0])))
            self.mask.resize(start + b, axis=0)
            self.mask[start:start + b] = mask



def fixed_str(s):
    """`s` as a fixed-length, NUL-padded HDF5 string (h5py writes a Python str
    as a variable-length one, which asapc refuses: docs/decisions.md)."""
    b = s.encode("utf-8")
    return np.array(b, dtype="S%d" % max(1, len(b)))


def is_vlen_str_attr(obj, key):
    """True when attribute `key` of `obj` is a variable-length string (type only,
    the data is not read)."""
    h5py = _h5py()
    t = obj.attrs.get_id(key).get_type()
    return t.get_class() == h5py.h5t.STRING and t.is_variable_str()


def _write_header(f, mods, attrs):
    """The file's attributes and one group per layer (all the HDF5 metadata
    record writes; the datasets are _LayerSink's): root format, version and
    the caller's attrs, /layers/<name> with its module_class. Returns
    {name: group}."""
    f.attrs["format"] = fixed_str(FORMAT)
    f.attrs["version"] = np.int64(VERSION)
    for key, value in (attrs or {}).items():
        f.attrs[key] = fixed_str(value) if isinstance(value, str) else value
    layers = f.create_group("layers")
    groups = {}
    for name, m in mods.items():
        groups[name] = layers.create_group(name)
        groups[name].attrs["module_class"] = fixed_str(type(m).__name__)
    return groups


def record(model, batches, out_path, layers=None, mask_fn=None, chunk=64, *, call=None,
           total=None, max_examples=None, quiet=False, attrs=None, compression=None):
    """Record a calibration file from `model` and return the number of examples.

    model:       a torch.nn.Module; it is put in eval mode for the recording
                 (and restored afterwards) and run under torch.no_grad().
    batches:     iterable of model inputs: a tensor (model(batch)), a tuple or
                 list (model(*batch)) or a dict (model(**batch)); or pass
                 call(model, batch) for anything else, e.g. a loader yielding
                 (inputs, labels): call=lambda m, b: m(b[0]). One tensor of
                 examples is split into batches of 64 along its first axis.
    out_path:    the HDF5 file to write; written to a temporary file beside it
                 and renamed at the end, so a failed run leaves nothing behind.
    layers:      module paths as in model.named_modules(), e.g.
                 "transformer.layers.0.0.fn" or "layers.0.mha" (a list, or one
                 comma-separated string); each group of the file is named
                 exactly so. Default: every Sinkformer attention module
                 (ViT Attention or text MultiHeadAttention; ValueError when
                 the model has none).
    mask_fn:     optional mask_fn(args, batch) -> [B, n] (1 = token, 0 =
                 padding) or None, where args are the attention module's
                 positional arguments; without it the mask is read from the
                 module's bool attention-mask argument (default_mask).
    chunk:       HDF5 chunk length along N (examples).
    total:       number of examples expected, for the progress bar (taken from
                 len(batches) * batch size when possible).
    max_examples: stop after this many examples.
    quiet:       no progress bar (it is also silent when stderr is not a TTY).
    attrs:       extra root attributes (str/int/float) to store.
    compression: optional HDF5 filter for the datasets, e.g. "gzip" (the
                 shuffle filter is then added too); None writes them plain.

    A mask is stored as /layers/<name>/mask, or once as /mask when every
    layer has one and they are all equal.
    """
    if layers is None:
        layer_names = sinkhorn_layers(model)
        if not layer_names:
            raise RecordError("%s has no Sinkformer attention module (ViT Attention with to_qkv, "
                              "to_out, heads or text MultiHeadAttention with WQ, WK, WV, linear, "
                              "n_heads): name the modules to record with layers=" % type(model).__name__)
    elif isinstance(layers, str):
        layer_names = [s for s in layers.split(",") if s]
    else:
        layer_names = list(layers)
    if not layer_names:
        raise RecordError("no layer to record (layers= is empty)")
    if torch.is_tensor(batches):
        batches = batches.split(DEFAULT_BATCH)
    if chunk < 1:
        raise RecordError("chunk must be >= 1 (got %d)" % chunk)
    h5py = _h5py()
    mods = resolve_layers(model, list(layer_names))
    call = call or _default_call
    out_path = os.fspath(out_path)
    out_dir = os.path.dirname(os.path.abspath(out_path))
    if not os.path.isdir(out_dir):
        raise RecordError("output folder %s does not exist" % out_dir)
    tmp_path = os.path.join(out_dir, ".%s.tmp-%d" % (os.path.basename(out_path), os.getpid()))

    captured = {name: [] for name in mods}
    current = {}

    def make_hook(name):
        def hook(module, args):
            if not args or not torch.is_tensor(args[0]) or args[0].dim() != 3:
                got = type(args[0]).__name__ if args else "no positional argument"
                if args and torch.is_tensor(args[0]):
                    got = "a tensor of shape %s" % list(args[0].shape)
                raise RecordError("layer '%s': expected its forward's first positional argument "
                                  "to be the input activations [B, n, d_model], got %s"
                                  % (name, got))
            x = args[0].detach().to("cpu", torch.float32).numpy()
            if mask_fn is not None:
                m = mask_fn(args, current.get("batch"))
            else:
                m = default_mask(args)
            if m is not None:
                m = (m.detach().cpu().numpy() if torch.is_tensor(m) else np.asarray(m))
                m = m.astype(np.uint8)
            captured[name].append((x, m))
        return hook

    if total is None and isinstance(batches, (list, tuple)):
        lens = [_batch_len(b) for b in batches]
        total = sum(lens) if None not in lens else None
    elif total is None:
        try:
            total = len(batches) * getattr(batches, "batch_size", 0) or None
        except TypeError:
            total = None
    if max_examples is not None:
        total = min(total, max_examples) if total else max_examples
    progress = Progress(total=total, unit="examples", enabled=not quiet)

    was_training = model.training
    handles = [mods[name].register_forward_pre_hook(make_hook(name)) for name in mods]
    done = 0
    try:
        with h5py.File(tmp_path, "w") as f:
            groups = _write_header(f, mods, attrs)
            # a small known total gets smaller chunks (HDF5 allocates whole chunks)
            chunk_n = max(1, min(chunk, total)) if total else chunk
            sinks = {name: _LayerSink(groups[name], chunk_n, compression) for name in mods}
            shared = True
            model.eval()
            with torch.no_grad():
                for batch in batches:
                    if max_examples is not None and done >= max_examples:
                        break
                    if max_examples is not None:
                        bl = _batch_len(batch)
                        if bl is not None and done + bl > max_examples:
                            batch = _take(batch, max_examples - done)
                    for v in captured.values():
                        v.clear()
                    current["batch"] = batch
                    call(model, batch)
                    b = None
                    first_mask = None
                    for i, name in enumerate(mods):
                        got = captured[name]
                        if len(got) != 1:
                            raise RecordError(
                                "layer '%s' ran %d times in one forward pass (expected once)"
                                % (name, len(got)) if got else
                                "layer '%s' did not run during the forward pass" % name)
                        x, m = got[0]
                        if b is None:
                            b = x.shape[0]
                        elif x.shape[0] != b:
                            raise RecordError("layer '%s' saw %d examples, '%s' saw %d"
                                              % (name, x.shape[0], next(iter(mods)), b))
                        sinks[name].append(name, x, m, done)
                        if m is None:
                            shared = False
                        elif i == 0:
                            first_mask = m
                        elif first_mask is None or not np.array_equal(m, first_mask):
                            shared = False
                    done += b
                    progress.update(b)
            if done == 0:
                raise RecordError("no example was recorded: the batches were empty")
            if shared:
                names = list(mods)
                f.move("layers/%s/mask" % names[0], "mask")
                for name in names[1:]:
                    del f["layers/%s/mask" % name]
        os.replace(tmp_path, out_path)
    except BaseException:
        if os.path.exists(tmp_path):
            os.remove(tmp_path)
        raise
    finally:
        for h in handles:
            h.remove()
        model.train(was_training)
        progress.close()
    return done



def check_calib(path):
    """Raise RecordError when `path` breaks docs/calibration-format.md; return
    {layer: (N, n)} otherwise."""
    def fail(what):
        raise RecordError("%s: %s" % (path, what))
    with _h5py().File(path, "r") as f:
        if "format" in f.attrs and is_vlen_str_attr(f, "format"):
            fail("attribute format: expected a fixed-length string, found a variable-length one")
        fmt = f.attrs.get("format")
        if isinstance(fmt, bytes):
            fmt = fmt.decode()
        if fmt != FORMAT:
            fail("attribute format: expected '%s', found %r" % (FORMAT, fmt))
        ver = f.attrs.get("version")
        if ver is None or int(ver) != VERSION:
            fail("attribute version: expected %d, found %r" % (VERSION, ver))
        if "layers" not in f or not len(f["layers"]):
            fail("no /layers group or no layer in it")
        root_mask = f["mask"][()] if "mask" in f else None
        out = {}
        for name, g in f["layers"].items():
            has_x, has_qk = "x" in g, ("q" in g or "k" in g)
            if has_x == has_qk:
                fail("layer '%s': expected either x or q+k, found %s" % (name, sorted(g.keys())))
            if has_x:
                x = g["x"]
                if x.ndim != 3:
                    fail("layers/%s/x: expected [N, n, d_model], found shape %s" % (name, x.shape))
                if x.dtype not in (np.float32, np.float64):
                    fail("layers/%s/x: expected float32/float64, found %s" % (name, x.dtype))
                N, n = x.shape[:2]
                data = [x]
            else:
                if "q" not in g or "k" not in g:
                    fail("layer '%s': q and k go together" % name)
                q, k = g["q"], g["k"]
                if q.ndim != 4 or k.shape[:3] != q.shape[:3]:
                    fail("layer '%s': q %s and k %s disagree" % (name, q.shape, k.shape))
                N, n = q.shape[0], q.shape[2]
                data = [q, k] + ([g["v"]] if "v" in g else [])
            if N < 1:
                fail("layer '%s': N = 0" % name)
            for ds in data:
                for s in range(0, N, 256):
                    block = ds[s:s + 256]
                    ok = np.isfinite(block).reshape(block.shape[0], -1).all(axis=1)
                    if not ok.all():
                        fail("%s: non-finite value in example %d"
                             % (ds.name, s + int(np.nonzero(~ok)[0][0])))
            mask = g["mask"][()] if "mask" in g else root_mask
            if mask is not None:
                if mask.shape != (N, n):
                    fail("layer '%s': mask shape %s, expected %s" % (name, mask.shape, (N, n)))
                if not np.isin(mask, (0, 1)).all():
                    fail("layer '%s': mask values must be 0/1" % name)
                if (mask.sum(axis=1) == 0).any():
                    fail("layer '%s': example %d has no token"
                         % (name, int(np.nonzero(mask.sum(axis=1) == 0)[0][0])))
            out[name] = (N, n)
        return out

