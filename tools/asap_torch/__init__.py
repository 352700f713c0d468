"""asap_torch: run asapc-compiled ASAP attention from PyTorch.

    import sys; sys.path.insert(0, "tools")
    import asap_torch
    art = asap_torch.load_artifact("model.asap.h5")
    out = art.attend("transformer.layers.0.0.fn", q, k, v)          # [B, H, n, dv]
    attn = asap_torch.AsapAttention(art, "transformer.layers.0.0.fn", closures=1)
    asap_torch.patch_model(model, art)                               # the whole model
    asap_torch.patch_model(model, exact=True)        # the exact teacher, fused, no artifact

The compiled operators run in libasap_torch_op.so (torch.ops.asap.*, also
callable from TorchScript), found at $ASAP_TORCH_OP, next to $ASAPC
(<build>/src/torch_op/) or in build/src/torch_op/. Without it a
pure-PyTorch implementation of the same math is used, with a one-time
warning. See docs/python.md.
"""
from ._library import LIB_NAME, available as op_available, library_error, library_path, \
    load_library
from .artifact import ArtifactError, LayerParams, read_artifact
from .module import AsapAttention, CompiledArtifact, TeacherAttention, load_artifact, teacher
from .patch import key_mask_from_attn_mask, module_kind, patch_model, patched_layers, \
    teacher_conventions, unpatch_model
from . import reference

__all__ = ["load_artifact", "CompiledArtifact", "AsapAttention", "TeacherAttention", "teacher",
           "patch_model", "unpatch_model", "patched_layers", "module_kind", "teacher_conventions",
           "key_mask_from_attn_mask", "op_available",
           "load_library", "library_path", "library_error", "read_artifact", "LayerParams",
           "ArtifactError", "reference", "LIB_NAME"]
__version__ = "0.1.0"
