"""compile, verify and inspect from Python: the asapc command line run as a
subprocess, with its options, defaults and one-sentence errors.

    art, summary = asap_torch.compile(model, "calib.h5", "model.asap.h5")     # spec from the modules
    report = asap_torch.verify(model, art, "heldout.h5", report="verify.html")
    spec = asap_torch.inspect("model.pt", T=6, heads=4)                        # a checkpoint without code

Keyword options are asapc's flags with '-' written '_' (min_speedup=1.05 is
--min-speedup 1.05, fit="kl" is --fit kl; True adds a bare flag such as
no_report=True; a list is joined with commas, except compare=[...], whose files are separate arguments; None and False are left out).
asapc refusing its input (exit 2) raises AsapcInputError, a ValueError, with
asapc's one sentence; any other failure raises CompileError (compile) or
AsapcError. asapc draws its progress bar on stderr when stderr is a terminal,
as on the command line (progress=False turns it off).
"""
import glob
import io
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import warnings

import torch

from . import _library
from .module import CompiledArtifact, load_artifact
from .patch import module_kind, teacher_conventions
from .record import sinkhorn_layers

__all__ = ["compile", "verify", "inspect", "spec_from_model", "AsapcError", "AsapcInputError",
           "CompileError", "AsapcWarning"]

SPEC_FORMAT = "asapc-teacher-spec"
EXIT_BAD_INPUT = 2
_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
# options whose values asapc takes as separate arguments (the others are comma lists)
_SPACE_LISTS = {"compare"}


class AsapcError(RuntimeError):
    """asapc failed for another reason than bad input (an internal error,
    a failed rank, a crash). Attributes: command, returncode, stderr."""

    def __init__(self, message, command=None, returncode=None, stderr=""):
        super().__init__(message)
        self.command, self.returncode, self.stderr = command, returncode, stderr


class CompileError(AsapcError):
    """asapc compile failed (not because of bad input: that is AsapcInputError)."""


class AsapcInputError(ValueError):
    """asapc refused its input (exit 2); the message is its one sentence."""


class AsapcWarning(UserWarning):
    """A warning asapc printed (when its stderr is not shown on a terminal)."""


# --------------------------------------------------------------------------
# running asapc
# --------------------------------------------------------------------------

def _stderr_tty():
    try:
        return os.isatty(sys.stderr.fileno())
    except (AttributeError, OSError, ValueError):
        return False


def _run_on_pty(cmd):
    """Runs cmd with stderr on a pseudo-terminal (so asapc draws its progress
    bar), relayed to sys.stderr; returns (stdout, stderr text, exit code)."""
    import pty
    master, slave = pty.openpty()
    try:
        import fcntl
        import termios
        fcntl.ioctl(slave, termios.TIOCSWINSZ, fcntl.ioctl(sys.stderr.fileno(), termios.TIOCGWINSZ,
                                                           b"\0" * 8))
    except OSError:
        pass
    try:
        p = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=slave)
    finally:
        os.close(slave)
    chunks = []

    def pump():
        while True:
            try:
                data = os.read(master, 4096)
            except OSError:            # EIO: the child closed its end
                break
            if not data:
                break
            chunks.append(data)
            try:
                sys.stderr.write(data.decode("utf-8", "replace"))
                sys.stderr.flush()
            except (OSError, ValueError):
                pass
    t = threading.Thread(target=pump, daemon=True)
    t.start()
    try:
        out = p.stdout.read()
        p.wait()
    except BaseException:
        p.kill()
        p.wait()
        raise
    finally:
        t.join(5)
        os.close(master)
    return out.decode("utf-8", "replace"), b"".join(chunks).decode("utf-8", "replace"), p.returncode


def _run(args, what, progress=None):
    """Runs `asapc ARGS`; returns (stdout, stderr lines, exit code 0 or 1)."""
    cmd = [_library.asapc_path()] + [os.fspath(a) for a in args]
    tty = _stderr_tty() if progress is None else bool(progress) and _stderr_tty()
    if tty:
        out, err, code = _run_on_pty(cmd)
    else:
        p = subprocess.run(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE)
        out, err, code = (p.stdout.decode("utf-8", "replace"), p.stderr.decode("utf-8", "replace"),
                          p.returncode)
    lines = [s.strip() for s in _ANSI.sub("", err).replace("\r", "\n").split("\n") if s.strip()]
    errors = [s.split("error: ", 1)[1] for s in lines if s.startswith(("asapc: error: ",
                                                                      "asapc: internal error: "))]
    if code == EXIT_BAD_INPUT:
        raise AsapcInputError(errors[-1] if errors else "asapc %s refused its input (exit 2): %s"
                              % (what, " / ".join(lines[-3:]) or "no message"))
    if code not in (0, 1):
        why = errors[-1] if errors else (" / ".join(lines[-3:]) or "no message")
        how = ("killed by signal %d" % -code) if code < 0 else ("exit %d" % code)
        cls = CompileError if what == "compile" else AsapcError
        raise cls("asapc %s failed (%s): %s" % (what, how, why), cmd, code, err)
    if not tty:
        for s in lines:
            if s.startswith("asapc: warning: "):
                warnings.warn(s[len("asapc: warning: "):], AsapcWarning, stacklevel=3)
    return out, lines, code


def _flags(options, reserved, what):
    args = []
    for key, value in options.items():
        if key in reserved:
            raise ValueError("asap_torch.%s sets %s itself; pass it as %s" % (what, "--" + key.replace(
                "_", "-"), reserved[key]))
        if value is None or value is False:
            continue
        flag = "--" + key.replace("_", "-")
        if value is True:
            args.append(flag)
        elif isinstance(value, (list, tuple)) and key in _SPACE_LISTS:
            args += [flag] + [os.fspath(v) if isinstance(v, os.PathLike) else str(v) for v in value]
        elif isinstance(value, (list, tuple)):
            args += [flag, ",".join(str(v) for v in value)]
        else:
            args += [flag, str(value)]
    return args


def _files(spec, what):
    """Files of one path, a glob or a list of them; ValueError when none exists."""
    items = [spec] if isinstance(spec, (str, os.PathLike)) else list(spec)
    out = []
    for item in items:
        item = os.fspath(item)
        found = sorted(glob.glob(item)) if any(c in item for c in "*?[") else [item]
        if not found or not all(os.path.isfile(f) for f in found):
            raise ValueError("%s file '%s' does not exist" % (what, item))
        out += found
    if not out:
        raise ValueError("no %s file given" % what)
    return out


# --------------------------------------------------------------------------
# the teacher as asapc reads it: checkpoint and spec
# --------------------------------------------------------------------------

def _save_state_dict(model, path):
    """The model's state_dict as a torch.save zip; the same weights always
    give the same bytes (asapc verify compares the checkpoint's digest)."""
    sd = {k: v.detach().cpu() for k, v in model.state_dict().items() if torch.is_tensor(v)}
    buf = io.BytesIO()
    torch.save(sd, buf)
    with open(path, "wb") as fh:
        fh.write(buf.getvalue())


def spec_from_model(model, layers=None, description=None):
    """The teacher spec (docs/teacher-spec.md) of the model's Sinkformer
    attention modules, read from the modules: heads, widths, score scale,
    eps, T and the state_dict names of the projections. layers: module
    names (default: every Sinkformer attention module). ValueError naming
    the module when one is not a Sinkformer attention module or does not say
    its T."""
    mods = dict(model.named_modules())
    pnames = {}
    for n, p in model.named_parameters():
        pnames.setdefault(id(p), n)
    names = list(layers) if layers is not None else sinkhorn_layers(model)
    if not names:
        raise ValueError("%s has no Sinkformer attention module (ViT Attention with to_qkv, to_out, "
                         "heads or text MultiHeadAttention with WQ, WK, WV, linear, n_heads)"
                         % type(model).__name__)

    def lin(m):
        return {"weight": pnames.get(id(m.weight)),
                "bias": pnames.get(id(m.bias)) if m.bias is not None else None}
    out = []
    for name in names:
        mod = mods.get(name) if name else None
        if mod is None:
            raise ValueError("%s has no module named '%s'; its Sinkformer attention modules: %s"
                             % (type(model).__name__, name, ", ".join(sinkhorn_layers(model)) or "none"))
        kind = module_kind(mod)
        if kind is None:
            raise ValueError("module '%s' of %s is not a Sinkformer attention module (ViT Attention "
                             "with to_qkv, to_out, heads or text MultiHeadAttention with WQ, WK, WV, "
                             "linear, n_heads); its Sinkformer attention modules: %s"
                             % (name, type(model).__name__, ", ".join(sinkhorn_layers(model)) or "none"))
        c = teacher_conventions(mod, kind)
        if c["T"] is None:
            raise ValueError("module '%s' does not say its Sinkhorn budget T (no %s attribute): pass "
                             "spec= to compile" % (name, "max_iter or sink.max_iter" if kind == "vit"
                                                   else "n_it"))
        heads, dh = c["heads"], c["head_dim"]
        if kind == "vit":
            entry = {"layout": "fused", "qkv": lin(mod.to_qkv), "qkv_order": "qkv"}
            o = mod.to_out[0] if isinstance(mod.to_out, torch.nn.Sequential) else mod.to_out
            d_model, dv = mod.to_qkv.in_features, dh
        else:
            entry = {"layout": "separate", "q": lin(mod.WQ), "k": lin(mod.WK), "v": lin(mod.WV)}
            o = mod.linear
            d_model, dv = mod.WQ.in_features, mod.WV.out_features // heads
        entry = dict({"name": name}, **entry)
        entry["head_layout"] = "(h d)"
        entry["out"] = lin(o) if isinstance(o, torch.nn.Linear) else None
        entry.update(d_model=int(d_model), heads=heads, head_dim=dh, value_dim=int(dv),
                     score_scale=c["scale"], eps=c["eps"], T=c["T"], mask="keep_queries",
                     multiply_by_n=True)
        out.append(entry)
    return {"format": SPEC_FORMAT, "version": 1,
            "model": description or "%s (asap_torch.spec_from_model)" % type(model).__name__,
            "layers": out}


def _calib_layers(files):
    from .record import _h5py
    with _h5py().File(files[0], "r") as f:
        return list(f["layers"].keys()) if "layers" in f else None


def _teacher(model_or_checkpoint, tmp, spec=None, calib_files=None, what="compile"):
    """(checkpoint path, spec path or None) for asapc."""
    if isinstance(model_or_checkpoint, torch.nn.Module):
        model = model_or_checkpoint
        ckpt = os.path.join(tmp, "teacher.pt")
        _save_state_dict(model, ckpt)
        if calib_files is not None and spec is None:
            layers = _calib_layers(calib_files)
            spec = spec_from_model(model, layers=layers or None)
    elif isinstance(model_or_checkpoint, (str, os.PathLike)):
        ckpt = os.fspath(model_or_checkpoint)
        if not os.path.isfile(ckpt):
            raise ValueError("checkpoint '%s' does not exist" % ckpt)
        if calib_files is not None and spec is None:
            raise ValueError("asap_torch.%s of a checkpoint file needs spec= (a teacher spec file "
                             "or dict; asap_torch.inspect('%s', T=..., heads=...) makes one), or "
                             "pass the model itself" % (what, ckpt))
    else:
        raise ValueError("asap_torch.%s takes a torch.nn.Module or a checkpoint path, found %s"
                         % (what, type(model_or_checkpoint).__name__))
    if isinstance(spec, dict):
        path = os.path.join(tmp, "teacher.spec.json")
        with open(path, "w") as fh:
            json.dump(spec, fh, indent=2)
        spec = path
    elif spec is not None:
        spec = os.fspath(spec)
    return ckpt, spec


# --------------------------------------------------------------------------
# the three commands
# --------------------------------------------------------------------------

def compile(model_or_checkpoint, calib, out, spec=None, backend=None, progress=None, **options):
    """asapc compile: returns (CompiledArtifact of `out`, the summary dict
    that --json prints).

    model_or_checkpoint: the model (its state_dict is saved for asapc, and
    the spec is read from its modules: spec_from_model, restricted to the
    layers of the calibration file), or a checkpoint file, which needs
    spec=. calib: a calibration file (asap_torch.record writes one), a glob
    or a list of files. out: the artifact to write (asapc also writes its
    report beside it unless no_report=True). spec: a teacher spec (path or
    dict) instead of the one read from the modules. backend: of the returned
    artifact (load_artifact). options: asapc compile's flags, e.g.
    min_speedup=1.05, objective="max-error", max_error=0.05, fit="kl",
    threads=2, no_report=True.
    """
    reserved = {"spec": "spec=", "calib": "calib", "output": "out", "o": "out",
                "json": "the return value"}
    flags = _flags(options, reserved, "compile")
    calib_files = _files(calib, "calibration")
    out = os.fspath(out)
    with tempfile.TemporaryDirectory(prefix="asap_torch_") as tmp:
        ckpt, spec_path = _teacher(model_or_checkpoint, tmp, spec, calib_files, "compile")
        args = ["compile", ckpt, "--spec", spec_path, "-o", out, "--json"] + flags + \
            ["--calib"] + calib_files
        stdout, _, _ = _run(args, "compile", progress)
    try:
        summary = json.loads(stdout)
    except ValueError:
        raise CompileError("asapc compile printed no JSON summary: %r" % stdout[:200])
    return load_artifact(out, backend=backend), summary


def verify(model_or_checkpoint, artifact, data, report=None, progress=None, **options):
    """asapc verify: returns its JSON (what --json prints) as a dict, plus
    "thresholds": {"passed": bool, "failures": [asapc's sentences]} for the
    max_attention_error= / max_output_rmse= / max_col_marginal_error= /
    max_kl= options.

    model_or_checkpoint: the model the artifact was compiled from (its
    state_dict is saved the same way as compile does, so the digests agree)
    or its checkpoint file. artifact: path or CompiledArtifact. data: a
    held-out file in the calibration format (a glob or a list). report: write
    the HTML report there (default: none); json_out= also keeps the JSON
    file. options: asapc verify's flags, e.g. max_closures=3, no_timing=True.
    """
    reserved = {"artifact": "artifact", "data": "data", "json": "the return value"}
    json_out = options.pop("json_out", None)
    flags = _flags(options, reserved, "verify")
    art = artifact.path if isinstance(artifact, CompiledArtifact) else os.fspath(artifact)
    if not os.path.isfile(art):
        raise ValueError("artifact '%s' does not exist" % art)
    data_files = _files(data, "held-out data")
    with tempfile.TemporaryDirectory(prefix="asap_torch_") as tmp:
        ckpt, _ = _teacher(model_or_checkpoint, tmp, what="verify")
        args = ["verify", ckpt, "--artifact", art, "--json",
                "--report", os.fspath(report) if report else os.path.join(tmp, "verify.html"),
                "--json-out", os.fspath(json_out) if json_out else os.path.join(tmp, "verify.json")]
        stdout, lines, code = _run(args + flags + ["--data"] + data_files, "verify", progress)
    result = json.loads(stdout)
    result["thresholds"] = {"passed": code == 0,
                            "failures": [s[len("asapc: verify: "):] for s in lines
                                         if s.startswith("asapc: verify: ")]}
    return result


def inspect(checkpoint, **options):
    """asapc inspect on a checkpoint without code: the detected teacher spec
    as a dict. options: T=, heads=, eps=, score_scale=, mask= (what the
    state_dict does not say); a value the checkpoint does not say and no
    option gives raises AsapcInputError."""
    flags = _flags(options, {"output": "the return value", "o": "the return value"}, "inspect")
    if not os.path.isfile(os.fspath(checkpoint)):
        raise ValueError("checkpoint '%s' does not exist" % os.fspath(checkpoint))
    with tempfile.TemporaryDirectory(prefix="asap_torch_") as tmp:
        path = os.path.join(tmp, "spec.json")
        _run(["inspect", os.fspath(checkpoint), "-o", path] + flags, "inspect", False)
        with open(path) as fh:
            return json.load(fh)
