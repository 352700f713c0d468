"""CompiledArtifact (load_artifact) and AsapAttention."""
import json
import os

import torch
from torch import nn

from . import _library, reference
from .artifact import read_artifact

BACKENDS = ("auto", "op", "torch")


def _default_backend():
    b = os.environ.get("ASAP_TORCH_BACKEND", "auto")
    if b not in BACKENDS:
        raise ValueError("ASAP_TORCH_BACKEND must be one of %s, found %r" % (", ".join(BACKENDS), b))
    return b


class CompiledArtifact:
    """An asapc artifact opened for inference.

    backend: 'op' (libasap_torch_op.so, required), 'torch' (the pure-PyTorch
    operator) or 'auto' (the library when it loads, else the fallback with a
    one-time warning). Default: $ASAP_TORCH_BACKEND or 'auto'.
    """

    def __init__(self, path, backend=None):
        backend = backend or _default_backend()
        if backend not in BACKENDS:
            raise ValueError("backend must be one of %s, found %r" % (", ".join(BACKENDS), backend))
        self.path = os.path.abspath(path)
        self.root, layers = read_artifact(self.path)
        self.params = {p.name: p for p in layers}
        self.layer_names = [p.name for p in layers]
        if backend in ("auto", "op") and _library.available():
            self.backend = "op"
        elif backend == "op":
            raise RuntimeError("asap_torch: backend 'op' asked for but %s is not available: %s"
                               % (_library.LIB_NAME, _library.library_error()))
        else:
            if backend == "auto":
                _library.warn_fallback_once()
            self.backend = "torch"
        self._handle = None

    # pickling drops the operator handle (it is per process)
    def __getstate__(self):
        d = dict(self.__dict__)
        d["_handle"] = None
        return d

    @property
    def handle(self):
        """The torch.ops.asap handle of this file (backend 'op' only)."""
        if self.backend != "op":
            raise RuntimeError("asap_torch: artifact '%s' runs on the pure-PyTorch backend; it has "
                               "no operator handle" % self.path)
        if self._handle is None:
            if not _library.available():        # e.g. unpickled in a fresh process
                raise RuntimeError("asap_torch: %s is not available: %s"
                                   % (_library.LIB_NAME, _library.library_error()))
            self._handle = int(torch.ops.asap.load(self.path))
        return self._handle

    def layer(self, name):
        """LayerParams of a compiled layer; ValueError naming the layers present."""
        p = self.params.get(name)
        if p is None:
            raise ValueError("artifact '%s' has no layer '%s' (it has %s)"
                             % (self.path, name, ", ".join("'%s'" % n for n in self.layer_names)))
        return p

    def info(self, name):
        """The layer's spec, family and defaults as a dict (from the operator
        library when loaded, else from the file)."""
        if self.backend == "op":
            return json.loads(torch.ops.asap.layer_info(self.handle, name))
        p = self.layer(name)
        return {"artifact": self.path, "spec": {k: getattr(p, k) for k in (
                    "name", "layout", "heads", "head_dim", "value_dim", "d_model", "score_scale",
                    "eps", "T", "mask", "multiply_by_n", "head_layout")},
                "family": {"name": p.family_name, "slices": p.slices, "alpha": p.alpha,
                           "softmax_dual": p.softmax_dual, "sinkhorn_dual3": p.sinkhorn_dual3,
                           "columns": p.num_columns, "feature_passes": p.feature_passes},
                "per_head": p.per_head, "default_closures": p.default_closures,
                "has_weights": p.weights is not None, "fit": p.fit}

    def attend(self, layer, q, k, v, key_mask=None, closures=None, return_attention=False,
               return_phi=False):
        """Head outputs [B, H, n, dv] of a compiled layer for per-head q, k, v.

        key_mask: [B, n] bool (True = token) or None. closures: k >= 1, or
        None / 0 for the layer's compiled default. With return_attention
        and/or return_phi, returns a tuple (out, attention?, phi_hat?).
        """
        k_cl = int(closures or 0)
        if k_cl < 0:
            raise ValueError("closures must be >= 0 (0 or None = the layer's default), found %d"
                             % k_cl)
        if key_mask is not None:
            if key_mask.is_floating_point():
                raise ValueError("key_mask must be bool [B, n] (True = token), found %s"
                                 % key_mask.dtype)
            key_mask = key_mask.to(torch.bool)
        if self.backend == "op":
            if return_phi:
                out, attn, phi = torch.ops.asap.attend_full(self.handle, layer, q, k, v, key_mask,
                                                            k_cl)
            elif return_attention:
                out, attn = torch.ops.asap.attend_with_attention(self.handle, layer, q, k, v,
                                                                 key_mask, k_cl)
                phi = None
            else:
                out = torch.ops.asap.attend(self.handle, layer, q, k, v, key_mask, k_cl)
                attn = phi = None
        else:
            with torch.no_grad():
                out, attn, phi = reference.attend(self.layer(layer), q, k, v, key_mask, k_cl or None,
                                                  return_attention)
        if not (return_attention or return_phi):
            return out
        res = (out,)
        if return_attention:
            res += (attn,)
        if return_phi:
            res += (phi,)
        return res

    def forward(self, layer, x, key_mask=None, closures=None):
        """Whole layer with the artifact's own projections: x [B, n, d_model]
        -> [B, n, d_out] (operator backend only)."""
        if self.backend != "op":
            raise RuntimeError("CompiledArtifact.forward needs the operator library; use a "
                               "patched model or attend() on the pure-PyTorch backend")
        if key_mask is not None:
            key_mask = key_mask.to(torch.bool)
        return torch.ops.asap.forward(self.handle, layer, x, key_mask, int(closures or 0))

    def module(self, layer, closures=None):
        return AsapAttention(self, layer, closures=closures)

    def __repr__(self):
        return "CompiledArtifact(%r, backend=%r, layers=%s)" % (self.path, self.backend,
                                                               self.layer_names)


def load_artifact(path, backend=None):
    """Opens an asapc artifact: CompiledArtifact (see its backend argument)."""
    return CompiledArtifact(path, backend=backend)


class AsapAttention(nn.Module):
    """One compiled layer as a module: forward(q, k, v, key_mask=None) ->
    head outputs [B, H, n, dv] (plus the attention [B, H, n, n] when
    return_attention=True).

    artifact: a CompiledArtifact or a path; closures: k (None = the layer's
    compiled default). Inference only: no gradient flows through it. The
    module holds no parameters, so adding it to a model leaves its
    state_dict unchanged.
    """

    def __init__(self, artifact, layer, closures=None, backend=None):
        super().__init__()
        if not isinstance(artifact, CompiledArtifact):
            artifact = load_artifact(artifact, backend=backend)
        self.artifact = artifact
        self.layer = layer
        self.params = artifact.layer(layer)      # validates the name
        if closures is not None and int(closures) < 1:
            raise ValueError("closures must be >= 1 (or None for the default), found %r" % closures)
        self.closures = None if closures is None else int(closures)

    @property
    def backend(self):
        return self.artifact.backend

    @property
    def effective_closures(self):
        return self.closures or self.params.default_closures

    def forward(self, q, k, v, key_mask=None, return_attention=False):
        return self.artifact.attend(self.layer, q, k, v, key_mask, self.closures, return_attention)

    def extra_repr(self):
        p = self.params
        return "layer=%r, family=%s%s, closures=%d%s, backend=%s" % (
            self.layer, p.family_name, "/per-head" if p.per_head else "/pooled",
            self.effective_closures, "" if self.closures else " (default)", self.backend)
