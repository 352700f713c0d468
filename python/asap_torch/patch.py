"""patch_model: run a Sinkformer-style model with its Sinkhorn attention
replaced by compiled ASAP operators, or by asapc's fused exact teacher.

Each patched attention module keeps its own projections (q, k, v and the
output projection) and its return convention; only the Sinkhorn step
(scores -> T alternating closures -> attention . V) is swapped for the
compiled operator of the same name in the artifact (an ASAP map, or a
'sinkhorn' / 'teacher' layer of format_version 3), or, with exact=True and
no artifact, for the same finite loop on asapc's fused kernels
(TeacherAttention: T, eps and the score scale read from the module). Two
module layouts are recognised (tools/sinkformer_models.py and the released
Sinkformer code):

* ViT ``Attention`` (vit-pytorch): owns ``to_qkv`` and ``to_out``, attributes
  ``heads``, ``scale``, and T = ``max_iter``, eps = ``eps`` (the released
  code keeps both in ``sink``, its SinkhornDistance(eps, max_iter), which
  is read first); forward(x) -> (to_out(out), attention).
* text ``MultiHeadAttention`` (nlp-tutorial): owns ``WQ``, ``WK``, ``WV`` and
  ``linear``, attributes ``n_heads`` and T = ``n_it`` (eps = ``eps``, 1
  when absent as in the released code; scale 1/sqrt(d_k) of
  ``scaled_dot_product_attn``); forward(Q, K, V, attn_mask [B, n, n], True
  = padded key) -> (linear(out), attention). Padded keys get no mass,
  padded queries keep 1/n, attention = n * plan.

The patch sets an instance ``forward`` and a parameter-free submodule
``asap`` (AsapAttention or TeacherAttention) on each module; the state_dict
is unchanged and ``unpatch_model`` restores the teacher. Patching is an in-memory change:
save the state_dict, not the patched module object.
"""
import numpy as np
import torch
import types

from .module import AsapAttention, CompiledArtifact, TeacherAttention, load_artifact

__all__ = ["patch_model", "unpatch_model", "patched_layers", "module_kind",
           "teacher_conventions"]

_PATCH_TYPES = (AsapAttention, TeacherAttention)


def module_kind(mod):
    """'vit', 'text' or None."""
    if hasattr(mod, "to_qkv") and hasattr(mod, "heads") and hasattr(mod, "to_out"):
        return "vit"
    if all(hasattr(mod, a) for a in ("WQ", "WK", "WV", "linear", "n_heads")):
        return "text"
    return None


def _split_heads(t, heads):            # 'b n (h d) -> b h n d'
    b, n, hd = t.shape
    return t.view(b, n, heads, hd // heads).transpose(1, 2)


def _merge_heads(t):                   # 'b h n d -> b n (h d)'
    b, h, n, d = t.shape
    return t.transpose(1, 2).reshape(b, n, h * d)


def _attention_placeholder(q):
    return q.new_zeros((0,))


def _vit_forward(self, x):
    q, k, v = (_split_heads(t, self.heads) for t in self.to_qkv(x).chunk(3, dim=-1))
    if self._asap_return_attention or getattr(self, "keep", False):
        out, attn = self.asap(q, k, v, None, return_attention=True)
    else:
        out, attn = self.asap(q, k, v, None), _attention_placeholder(q)
    if getattr(self, "keep", False):
        self.saved = {"attn": attn.detach(), "head_out": out.detach()}
    return self.to_out(_merge_heads(out)), attn


def key_mask_from_attn_mask(attn_mask):
    """[B, n] bool, True = token, from the text model's attn_mask (True =
    padded key; [B, n], [B, n, n] or [B, H, n, n]: the first query row)."""
    pad = attn_mask
    while pad.dim() > 2:
        pad = pad[:, 0]
    return ~pad.to(torch.bool)


def _text_forward(self, Q, K, V, attn_mask):
    b = Q.size(0)
    d_k = self.WQ.out_features // self.n_heads
    d_v = self.WV.out_features // self.n_heads
    q = self.WQ(Q).view(b, -1, self.n_heads, d_k).transpose(1, 2)
    k = self.WK(K).view(b, -1, self.n_heads, d_k).transpose(1, 2)
    v = self.WV(V).view(b, -1, self.n_heads, d_v).transpose(1, 2)
    key_mask = None if attn_mask is None else key_mask_from_attn_mask(attn_mask)
    if self._asap_return_attention or getattr(self, "keep", False):
        out, attn = self.asap(q, k, v, key_mask, return_attention=True)
    else:
        out, attn = self.asap(q, k, v, key_mask), _attention_placeholder(q)
    if getattr(self, "keep", False):
        self.saved = {"attn": attn.detach(), "head_out": out.detach()}
    out = out.transpose(1, 2).contiguous().view(b, -1, self.n_heads * d_v)
    return self.linear(out), attn


def _compare(name, what, got, want, problems):
    if want is None:
        return
    got = got.detach().cpu().double().numpy()
    want = np.asarray(want, np.float64)
    if got.shape != want.shape:
        problems.append("%s has shape %s, the artifact's %s" % (what, list(got.shape),
                                                                list(want.shape)))
        return
    err = float(np.max(np.abs(got - want))) if got.size else 0.0
    tol = 1e-6 * max(1.0, float(np.max(np.abs(want))) if want.size else 1.0)
    if err > tol:
        problems.append("%s differs from the artifact's (max abs difference %.3g)" % (what, err))


def teacher_conventions(mod, kind=None):
    """What a Sinkformer attention module runs: {'heads', 'head_dim',
    'scale', 'eps', 'T'} (T None when the module does not say).

    ViT: heads, scale, and T, eps from ``sink`` (the released code's
    SinkhornDistance) when present, else ``max_iter``, ``eps`` (default 1).
    Text: n_heads, T = n_it, eps (default 1: the released code hard-codes
    it), scale = d_k ** -0.5 of scaled_dot_product_attn (else head_dim ** -0.5).
    """
    kind = kind or module_kind(mod)
    if kind == "vit":
        sink = getattr(mod, "sink", None)
        heads, scale = int(mod.heads), float(mod.scale)
        inner = mod.to_qkv.out_features // 3
        T = getattr(sink, "max_iter", None)
        if T is None:
            T = getattr(mod, "max_iter", None)
        eps = getattr(sink, "eps", None)
        if eps is None:
            eps = getattr(mod, "eps", 1.0)
    elif kind == "text":
        heads = int(mod.n_heads)
        inner = mod.WQ.out_features
        scale = (inner // heads) ** -0.5
        sdpa = getattr(mod, "scaled_dot_product_attn", None)
        if sdpa is not None and hasattr(sdpa, "d_k"):
            scale = float(sdpa.d_k) ** -0.5
        T, eps = getattr(mod, "n_it", None), getattr(mod, "eps", 1.0)
    else:
        raise ValueError("%s is not a Sinkformer ViT Attention (to_qkv, to_out, heads) or text "
                         "MultiHeadAttention (WQ, WK, WV, linear, n_heads)" % type(mod).__name__)
    return {"heads": heads, "head_dim": inner // heads, "scale": scale, "eps": float(eps),
            "T": None if T is None else int(T)}


def _check(name, mod, kind, p):
    """ValueError when the module does not run the teacher the layer was
    compiled from (heads, dims, scale, eps, T, weights)."""
    problems = []
    c = teacher_conventions(mod, kind)
    heads, scale, eps, T = c["heads"], c["scale"], c["eps"], c["T"]
    inner = heads * c["head_dim"]
    if heads != p.heads:
        problems.append("it has %d heads, the compiled layer %d" % (heads, p.heads))
    elif inner // heads != p.head_dim:
        problems.append("its head dim is %d, the compiled layer's %d" % (inner // heads, p.head_dim))
    if abs(scale - p.score_scale) > 1e-9 * max(1.0, abs(p.score_scale)):
        problems.append("its score scale is %g, the compiled layer's %g" % (scale, p.score_scale))
    if abs(eps - p.eps) > 1e-12 * max(1.0, p.eps):
        problems.append("its eps is %g, the compiled layer's %g" % (eps, p.eps))
    if T is not None and int(T) != p.T:
        problems.append("it runs T = %d Sinkhorn half-steps, the layer was compiled for T = %d"
                        % (int(T), p.T))
    if p.mask != "keep_queries":
        problems.append("the layer was compiled for mask '%s'; these modules keep padded "
                        "queries" % p.mask)
    w = p.weights
    if not problems and w is not None:
        if kind == "vit":
            order = getattr(p, "qkv_order", "qkv")
            parts = {"q": w.get("wq"), "k": w.get("wk"), "v": w.get("wv")}
            if all(parts[c] is not None for c in "qkv"):
                _compare(name, "to_qkv.weight", mod.to_qkv.weight,
                         np.concatenate([parts[c] for c in order]), problems)
            out = mod.to_out[0] if isinstance(mod.to_out, torch.nn.Sequential) else mod.to_out
            if "wo" in w and isinstance(out, torch.nn.Linear):
                _compare(name, "to_out.weight", out.weight, w["wo"], problems)
        else:
            for lin, wk, bk in (("WQ", "wq", "bq"), ("WK", "wk", "bk"), ("WV", "wv", "bv"),
                                ("linear", "wo", "bo")):
                m = getattr(mod, lin)
                _compare(name, lin + ".weight", m.weight, w.get(wk), problems)
                if m.bias is not None:
                    _compare(name, lin + ".bias", m.bias, w.get(bk), problems)
    if problems:
        raise ValueError("module '%s' does not match the compiled layer in '%s': %s (was the "
                         "artifact compiled from this model?)" % (name, p.artifact_path, "; ".join(problems)))


def _find_module(modules, name, source):
    mod = modules.get(name)
    if mod is None:
        cands = [n for n, m in modules.items() if module_kind(m)]
        raise ValueError("the model has no module named '%s' (%s); its attention modules: %s"
                         % (name, source, ", ".join(cands) or "none"))
    kind = module_kind(mod)
    if kind is None:
        raise ValueError("module '%s' (%s) is not a Sinkformer ViT Attention (to_qkv, to_out, "
                         "heads) or text MultiHeadAttention (WQ, WK, WV, linear, n_heads)"
                         % (name, type(mod).__name__))
    return mod, kind


def _install(mod, kind, op, return_attention):
    _unpatch_module(mod)
    mod.asap = op
    mod._asap_return_attention = bool(return_attention)
    mod.forward = types.MethodType(_vit_forward if kind == "vit" else _text_forward, mod)


def _patch_exact(model, layers, closures, return_attention, backend):
    if closures is not None:
        raise ValueError("exact=True runs the teacher's own loop, which has no closures: leave "
                         "closures = None")
    modules = dict(model.named_modules())
    if layers is None:
        names = [n for n, m in modules.items() if module_kind(m)]
        if not names:
            raise ValueError("the model has no Sinkformer attention module (ViT Attention with "
                             "to_qkv, to_out, heads or text MultiHeadAttention with WQ, WK, WV, "
                             "linear, n_heads) to patch")
    else:
        names = list(layers)
    todo = []
    for name in names:
        mod, kind = _find_module(modules, name, "asked for with exact=True")
        c = teacher_conventions(mod, kind)
        if c["T"] is None:
            raise ValueError("module '%s' does not say its Sinkhorn budget T (no %s attribute), "
                             "so exact=True cannot run its loop" % (
                                 name, "max_iter or sink.max_iter" if kind == "vit" else "n_it"))
        todo.append((name, mod, kind, c))
    for name, mod, kind, c in todo:        # all read: patch
        op = TeacherAttention(c["scale"], c["T"], c["eps"], drop_padded_queries=False,
                              multiply_by_n=True, backend=backend, name=name)
        _install(mod, kind, op, return_attention)
    return model


def patch_model(model, artifact=None, closures=None, layers=None, check=True, return_attention=True,
                backend=None, exact=False):
    """Replaces the Sinkhorn attention of every compiled layer of `model`
    (in place; returns the model).

    artifact: path or CompiledArtifact. closures: None (each layer's compiled
    default), an int k for every ASAP layer ('sinkhorn' and 'teacher' layers
    have no closures and ignore it), or {layer name: k} (ASAP layers only).
    layers: names to patch (default: every layer in the artifact; each must
    exist in the model). check: refuse modules whose heads, scale, eps, T or
    projection weights differ from the compiled layer's. return_attention:
    keep returning the [B, H, n, n] attention like the teacher (False
    returns an empty tensor in its place and skips materialising it where
    possible).

    exact=True (no artifact): every Sinkformer attention module (or those
    named in `layers`) runs its own exact finite Sinkhorn loop on asapc's
    fused kernels (torch.ops.asap.teacher; the PyTorch loop without the
    library), with T, eps and the score scale read from the module.
    """
    if exact:
        if artifact is not None:
            raise ValueError("exact=True runs the teacher without an artifact: pass artifact=None "
                             "(or exact=False to run the artifact's operators)")
        return _patch_exact(model, layers, closures, return_attention, backend)
    if artifact is None:
        raise ValueError("patch_model needs an artifact (path or CompiledArtifact), or "
                         "exact=True for the exact teacher")
    art = artifact if isinstance(artifact, CompiledArtifact) else load_artifact(artifact, backend)
    names = list(layers) if layers is not None else list(art.layer_names)
    modules = dict(model.named_modules())
    if isinstance(closures, dict):
        unknown = sorted(set(closures) - set(names))
        if unknown:
            raise ValueError("closures names layers that are not patched: %s" % ", ".join(unknown))
    todo = []
    for name in names:
        p = art.layer(name)
        mod, kind = _find_module(modules, name, "compiled layer of '%s'" % art.path)
        if check:
            _check(name, mod, kind, p)
        k = closures.get(name) if isinstance(closures, dict) else closures
        if not p.is_asap:
            if isinstance(closures, dict) and k is not None:
                raise ValueError("closures names layer '%s', which runs %s and has no closures"
                                 % (name, p.describe))
            k = None
        todo.append((name, mod, kind, k))
    ops = [AsapAttention(art, name, closures=k) for name, _, _, k in todo]   # validates k
    for (name, mod, kind, k), op in zip(todo, ops):        # all checks passed: patch
        _install(mod, kind, op, return_attention)
    return model


def _unpatch_module(mod):
    if "forward" in mod.__dict__:
        del mod.__dict__["forward"]
    if "asap" in mod._modules:
        del mod._modules["asap"]
    mod.__dict__.pop("_asap_return_attention", None)


def unpatch_model(model):
    """Restores the teacher's Sinkhorn attention in every patched module."""
    for _, mod in list(model.named_modules()):
        if isinstance(mod._modules.get("asap"), _PATCH_TYPES):
            _unpatch_module(mod)
    return model


def patched_layers(model):
    """{module name: AsapAttention or TeacherAttention} of the patched modules."""
    return {name: mod._modules["asap"] for name, mod in model.named_modules()
            if isinstance(mod._modules.get("asap"), _PATCH_TYPES)}
