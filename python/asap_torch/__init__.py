"""asap_torch: compile the Sinkhorn attention of a PyTorch Sinkformer model
with asapc and run the compiled operators from PyTorch.

    pip install --no-build-isolation .          # from a clone (docs/python.md)

    import asap_torch
    asap_torch.record(model, batches, "calib.h5")                       # forward hooks
    art, summary = asap_torch.compile(model, "calib.h5", "model.asap.h5")
    report = asap_torch.verify(model, art, "heldout.h5", report="verify.html")
    asap_torch.patch_model(model, art)                                 # the compiled operators
    asap_torch.patch_model(model, exact=True)        # the exact teacher, fused, no artifact
    art.attend("transformer.layers.0.0.fn", q, k, v)                    # one layer, [B, H, n, dv]

The compiled operators run in libasap_torch_op.so (torch.ops.asap.*, also
callable from TorchScript), which the installed package carries in
asap_torch/_native beside the asapc executable that compile, verify and
inspect run. `python -m asap_torch` says what was found. Without the
library a pure-PyTorch implementation of the same math is used, with a
one-time warning. See docs/python.md.
"""
from ._library import LIB_NAME, asapc_path, available as op_available, library_error, \
    library_path, load_library
from .artifact import ArtifactError, LayerParams, read_artifact
from .module import AsapAttention, CompiledArtifact, TeacherAttention, load_artifact, teacher
from .patch import key_mask_from_attn_mask, module_kind, patch_model, patched_layers, \
    teacher_conventions, unpatch_model
from .record import RecordError, check_calib, record, sinkhorn_layers
from .workflow import AsapcError, AsapcInputError, AsapcWarning, CompileError, compile, inspect, \
    spec_from_model, verify
from . import reference

__all__ = ["record", "compile", "verify", "inspect", "spec_from_model", "patch_model",
           "unpatch_model", "patched_layers", "load_artifact", "CompiledArtifact",
           "AsapAttention", "TeacherAttention", "teacher", "module_kind", "teacher_conventions",
           "key_mask_from_attn_mask", "sinkhorn_layers", "check_calib", "op_available",
           "load_library", "library_path", "library_error", "asapc_path", "read_artifact",
           "LayerParams", "ArtifactError", "RecordError", "AsapcError", "AsapcInputError",
           "CompileError", "AsapcWarning", "reference", "LIB_NAME", "machine"]
__version__ = "0.1.0"


def machine():
    """What the compiled operators run on, from the operator library:
    {"isa", "available_isas", "threads", "parallel_build"}; None without
    the library."""
    if not op_available():
        return None
    import json
    import torch
    return json.loads(torch.ops.asap.machine())
