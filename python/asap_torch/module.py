"""CompiledArtifact (load_artifact), AsapAttention, and the exact teacher
without an artifact (teacher, TeacherAttention)."""
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


def resolve_backend(backend, what):
    """'op' or 'torch' for a requested backend (None: $ASAP_TORCH_BACKEND or
    'auto'); 'auto' falls back to PyTorch with a one-time warning, 'op'
    without the library raises. `what` names the caller in the error."""
    backend = backend or _default_backend()
    if backend not in BACKENDS:
        raise ValueError("backend must be one of %s, found %r" % (", ".join(BACKENDS), backend))
    if backend in ("auto", "op") and _library.available():
        return "op"
    if backend == "op":
        raise RuntimeError("asap_torch: backend 'op' asked for %s but %s is not available: %s"
                           % (what, _library.LIB_NAME, _library.library_error()))
    if backend == "auto":
        _library.warn_fallback_once()
    return "torch"


def _bool_mask(key_mask):
    if key_mask is None:
        return None
    if key_mask.is_floating_point() or key_mask.is_complex():
        raise ValueError("key_mask must be bool [B, n] (True = token), found %s" % key_mask.dtype)
    return key_mask.to(torch.bool)


class CompiledArtifact:
    """An asapc artifact opened for inference.

    backend: 'op' (libasap_torch_op.so, required), 'torch' (the pure-PyTorch
    operator) or 'auto' (the library when it loads, else the fallback with a
    one-time warning). Default: $ASAP_TORCH_BACKEND or 'auto'.
    """

    def __init__(self, path, backend=None):
        if backend is not None and backend not in BACKENDS:
            raise ValueError("backend must be one of %s, found %r" % (", ".join(BACKENDS), backend))
        self.path = os.path.abspath(path)
        self.root, layers = read_artifact(self.path)
        self.params = {p.name: p for p in layers}
        self.layer_names = [p.name for p in layers]
        self.backend = resolve_backend(backend, "for '%s'" % self.path)
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
                           "score_stats": p.score_stats, "centered_stats": p.centered_stats,
                           "columns": p.num_columns, "feature_passes": p.feature_passes},
                "operator": p.operator, "sinkhorn_steps": p.sinkhorn_steps,
                "lse_passes": p.lse_passes, "describe": p.describe,
                "per_head": p.per_head, "default_closures": p.default_closures,
                "coef_shape": list(p.coef.shape), "theta_shape": list(p.theta.shape),
                "has_weights": p.weights is not None,
                "has_output_projection": p.weights is not None and "wo" in p.weights,
                "fit": p.fit}

    def attend(self, layer, q, k, v, key_mask=None, closures=None, return_attention=False,
               return_phi=False):
        """Head outputs [B, H, n, dv] of a compiled layer for per-head q, k, v.

        key_mask: [B, n] bool (True = token) or None. closures: k >= 1, or
        None / 0 for the layer's compiled default ('sinkhorn' and 'teacher'
        layers have none: None / 0 only). With return_attention and/or
        return_phi, returns a tuple (out, attention?, phi_hat?); phi_hat is
        empty for the 'sinkhorn' and 'teacher' kinds.
        """
        k_cl = int(closures or 0)
        if k_cl < 0:
            raise ValueError("closures must be >= 0 (0 or None = the layer's default), found %d"
                             % k_cl)
        key_mask = _bool_mask(key_mask)
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
        -> projections -> attend -> merged heads and the output projection
        [B, n, d_out]."""
        key_mask = _bool_mask(key_mask)
        if self.backend == "op":
            return torch.ops.asap.forward(self.handle, layer, x, key_mask, int(closures or 0))
        p = self.layer(layer)
        if p.weights is None:
            raise ValueError("artifact '%s' layer '%s' carries no projection weights (it was "
                             "compiled from per-head q, k, v): call attend() instead"
                             % (self.path, layer))
        if x.dim() != 3 or x.shape[2] != p.d_model:
            raise ValueError("layer '%s': activations must be [B, n, %d], found %s"
                             % (layer, p.d_model, list(x.shape)))
        w = {k: torch.from_numpy(v).to(x.dtype) for k, v in p.weights.items()}
        B, n = x.shape[0], x.shape[1]

        def split(wk, bk, per_head):
            y = torch.nn.functional.linear(x, w[wk], w.get(bk))
            return y.view(B, n, p.heads, per_head).transpose(1, 2).contiguous()
        with torch.no_grad():
            q, k, v = (split("wq", "bq", p.head_dim), split("wk", "bk", p.head_dim),
                       split("wv", "bv", p.value_dim))
            o = self.attend(layer, q, k, v, key_mask, closures)
            merged = o.transpose(1, 2).reshape(B, n, p.heads * o.shape[3])
            if "wo" not in w:
                return merged
            return torch.nn.functional.linear(merged, w["wo"], w.get("bo"))

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
        if closures is not None and not self.params.is_asap:
            raise ValueError("layer '%s' runs %s, which has no closures to set: pass closures = "
                             "None" % (layer, self.params.describe))
        self.closures = None if closures is None else int(closures)

    @property
    def backend(self):
        return self.artifact.backend

    @property
    def operator(self):
        """'asap', 'sinkhorn' or 'teacher' (the layer's compiled kind)."""
        return self.params.operator

    @property
    def effective_closures(self):
        """k of an ASAP layer; None for the 'sinkhorn' and 'teacher' kinds."""
        if not self.params.is_asap:
            return None
        return self.closures or self.params.default_closures

    def forward(self, q, k, v, key_mask=None, return_attention=False):
        return self.artifact.attend(self.layer, q, k, v, key_mask, self.closures, return_attention)

    def extra_repr(self):
        p = self.params
        if not p.is_asap:
            return "layer=%r, %s, backend=%s" % (self.layer, p.describe, self.backend)
        return "layer=%r, family=%s%s, closures=%d%s, backend=%s" % (
            self.layer, p.family_name, "/per-head" if p.per_head else "/pooled",
            self.effective_closures, "" if self.closures else " (default)", self.backend)


def teacher(q, k, v, key_mask=None, scale=None, T=None, eps=1.0, drop_padded_queries=False,
            multiply_by_n=True, return_attention=False, backend=None):
    """The exact finite Sinkhorn loop, no artifact: head outputs [B, H, n, dv]
    (and the attention [B, H, n, n] with return_attention=True).

    q, k [B, H, n, d], v [B, H, n, dv] float32/float64; key_mask [B, n] bool
    (True = token) or None; scale: the score scale (default d ** -0.5); T:
    half-steps (odd t normalises rows, even t columns); eps: the entropy;
    drop_padded_queries: padded query rows carry no mass (else 1/n);
    multiply_by_n: attention = n * plan (Sinkformer). Runs
    torch.ops.asap.teacher (asapc's fused kernels) or, without the library,
    the same loop in PyTorch (asap_torch.reference.teacher).
    """
    if T is None:
        raise ValueError("asap_torch.teacher: T (Sinkhorn half-steps) is required")
    scale = q.shape[-1] ** -0.5 if scale is None else float(scale)
    return _teacher_on(resolve_backend(backend, "for the exact teacher"), q, k, v, key_mask, scale,
                       int(T), float(eps), bool(drop_padded_queries), bool(multiply_by_n),
                       bool(return_attention))


def _teacher_on(backend, q, k, v, key_mask, scale, T, eps, drop, mult, return_attention):
    key_mask = _bool_mask(key_mask)
    run = torch.ops.asap.teacher if backend == "op" else reference.teacher
    out, A = run(q, k, v, key_mask, scale, T, eps, drop, mult, return_attention)
    return (out, A) if return_attention else out


class TeacherAttention(nn.Module):
    """The exact finite Sinkhorn loop as a parameter-free module, for
    patch_model(model, exact=True): forward(q, k, v, key_mask=None,
    return_attention=False) -> head outputs (and the attention).

    scale, T, eps, drop_padded_queries, multiply_by_n: the teacher's
    conventions (read from the patched module); backend as for
    load_artifact. Inference only: no gradient flows through it.
    """

    def __init__(self, scale, T, eps=1.0, drop_padded_queries=False, multiply_by_n=True,
                 backend=None, name=""):
        super().__init__()
        T = int(T)
        reference.check_teacher_args(torch.zeros(1, 1, 1, 1), torch.zeros(1, 1, 1, 1),
                                     torch.zeros(1, 1, 1, 1), float(scale), T, float(eps))
        self.scale, self.T, self.eps = float(scale), T, float(eps)
        self.drop_padded_queries, self.multiply_by_n = bool(drop_padded_queries), bool(multiply_by_n)
        self.name = name
        self.backend = resolve_backend(backend, "for the exact teacher")

    @property
    def operator(self):
        return "teacher"

    def forward(self, q, k, v, key_mask=None, return_attention=False):
        return _teacher_on(self.backend, q, k, v, key_mask, self.scale, self.T, self.eps,
                           self.drop_padded_queries, self.multiply_by_n, bool(return_attention))

    def extra_repr(self):
        return "exact teacher T=%d, eps=%g, scale=%g, backend=%s" % (self.T, self.eps, self.scale,
                                                                   self.backend)
