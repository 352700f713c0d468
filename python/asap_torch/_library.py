"""Finding and loading libasap_torch_op.so (the torch.ops.asap.* operators)
and the asapc executable.

Search order of the library:
  1. $ASAP_TORCH_OP: the library file, or a folder holding it (when set,
     nothing else is tried);
  2. the installed package's own copy, asap_torch/_native/ (pip install);
     when it is there, nothing else is tried;
  3. (source checkout only: python/asap_torch imported from the repository)
     next to the asapc binary named by $ASAPC: <its dir>/src/torch_op/;
  4. (source checkout only) <repo>/build/src/torch_op/ (what tools/setup.sh builds).
"""
import os
import shutil
import threading
import warnings

import torch

LIB_NAME = "libasap_torch_op.so"
HERE = os.path.dirname(os.path.abspath(__file__))
NATIVE_DIR = os.path.join(HERE, "_native")
REPO = os.path.dirname(os.path.dirname(HERE))
# python/asap_torch inside a clone of the repository (not an installed copy)
IN_SOURCE_TREE = os.path.isfile(os.path.join(REPO, "CMakeLists.txt")) and \
    os.path.isdir(os.path.join(REPO, "src", "torch_op"))

_lock = threading.Lock()
_state = {"tried": False, "path": None, "error": None, "warned": False}


def candidates():
    """Paths searched for the library, in order."""
    out = []
    env = os.environ.get("ASAP_TORCH_OP")
    if env:
        return [os.path.join(env, LIB_NAME) if os.path.isdir(env) else env]
    if os.path.isfile(os.path.join(NATIVE_DIR, LIB_NAME)):
        return [os.path.join(NATIVE_DIR, LIB_NAME)]
    if not IN_SOURCE_TREE:
        return [os.path.join(NATIVE_DIR, LIB_NAME)]
    asapc = os.environ.get("ASAPC")
    if asapc:
        out.append(os.path.join(os.path.dirname(os.path.abspath(asapc)), "src", "torch_op",
                                LIB_NAME))
    out.append(os.path.join(REPO, "build", "src", "torch_op", LIB_NAME))
    return out


def _registered():
    try:
        torch.ops.asap.attend  # noqa: B018 - raises when the namespace is empty
        return True
    except (AttributeError, RuntimeError):
        return False


def load_library(path=None):
    """Loads the operator library once; returns its path, or None when it is
    not found or fails to load (library_error() then says why). An explicit
    `path` that cannot be loaded raises."""
    with _lock:
        if path is not None:
            torch.ops.load_library(path)
            _state.update(tried=True, path=os.path.abspath(path), error=None)
            return _state["path"]
        if _state["tried"]:
            return _state["path"]
        _state["tried"] = True
        if _registered():        # loaded by the caller already
            _state["path"] = "(already loaded)"
            return _state["path"]
        errors = []
        for cand in candidates():
            if not os.path.isfile(cand):
                errors.append("%s: not found" % cand)
                continue
            try:
                torch.ops.load_library(cand)
                _state["path"] = os.path.abspath(cand)
                return _state["path"]
            except (OSError, RuntimeError) as e:
                errors.append("%s: %s" % (cand, e))
        _state["error"] = "; ".join(errors)
        return None


def available():
    """True when torch.ops.asap.* can be called."""
    return load_library() is not None


def library_path():
    return load_library()


def library_error():
    load_library()
    return _state["error"]


def warn_fallback_once():
    """The one-time warning when the pure-PyTorch fallback is used."""
    with _lock:
        if _state["warned"]:
            return
        _state["warned"] = True
    warnings.warn("asap_torch: %s not available (%s); using the pure-PyTorch fallback, which is "
                  "slower. Reinstall the package (pip install --no-build-isolation .), build it "
                  "(cmake --build build --target asap_torch_op) or set ASAP_TORCH_OP to its "
                  "path." % (LIB_NAME, _state["error"]), RuntimeWarning,
                  stacklevel=3)


def asapc_candidates(use_path=True):
    """Paths searched for the asapc executable, in order: the package's own
    (asap_torch/_native/asapc); then $ASAPC; then, in a source checkout,
    <repo>/build/asapc; then asapc on PATH."""
    out = [os.path.join(NATIVE_DIR, "asapc")]
    if os.environ.get("ASAPC"):
        out.append(os.path.abspath(os.environ["ASAPC"]))
    if IN_SOURCE_TREE:
        out.append(os.path.join(REPO, "build", "asapc"))
    if use_path and shutil.which("asapc"):
        out.append(shutil.which("asapc"))
    return out


def asapc_path(use_path=True):
    """The asapc executable the workflow functions run; RuntimeError naming
    the places searched when there is none. (The package's `asapc` console
    script passes use_path=False: it must not find itself.)"""
    cands = asapc_candidates(use_path)
    for c in cands:
        if os.path.isfile(c) and os.access(c, os.X_OK):
            return c
    raise RuntimeError("asap_torch: no asapc executable found (looked at %s): reinstall the "
                       "package with pip, or set ASAPC to the asapc binary" % ", ".join(cands))
