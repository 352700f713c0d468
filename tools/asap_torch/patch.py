"""patch_model: run a Sinkformer-style model with its Sinkhorn attention
replaced by compiled ASAP operators.

Each patched attention module keeps its own projections (q, k, v and the
output projection) and its return convention; only the Sinkhorn step
(scores -> T alternating closures -> attention . V) is swapped for the
compiled operator of the same name in the artifact. Two module layouts are
recognised (tools/sinkformer_models.py and the released Sinkformer code):

* ViT ``Attention`` (vit-pytorch): owns ``to_qkv`` and ``to_out``, attribute
  ``heads``; forward(x) -> (to_out(out), attention).
* text ``MultiHeadAttention`` (nlp-tutorial): owns ``WQ``, ``WK``, ``WV`` and
  ``linear``, attribute ``n_heads``; forward(Q, K, V, attn_mask [B, n, n],
  True = padded key) -> (linear(out), attention).

The patch sets an instance ``forward`` and a parameter-free submodule
``asap`` (AsapAttention) on each module; the state_dict is unchanged and
``unpatch_model`` restores the teacher. Patching is an in-memory change:
save the state_dict, not the patched module object.
"""
import numpy as np
import torch
import types

from .module import AsapAttention, CompiledArtifact, load_artifact

__all__ = ["patch_model", "unpatch_model", "patched_layers", "module_kind"]


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


def _check(name, mod, kind, p):
    """ValueError when the module does not run the teacher the layer was
    compiled from (heads, dims, scale, eps, T, weights)."""
    problems = []
    if kind == "vit":
        heads, scale = int(mod.heads), float(mod.scale)
        eps, T = float(getattr(mod, "eps", 1.0)), getattr(mod, "max_iter", None)
        inner = mod.to_qkv.out_features // 3
    else:
        heads = int(mod.n_heads)
        inner = mod.WQ.out_features
        scale = (inner // heads) ** -0.5
        sdpa = getattr(mod, "scaled_dot_product_attn", None)
        if sdpa is not None and hasattr(sdpa, "d_k"):
            scale = float(sdpa.d_k) ** -0.5
        eps, T = float(getattr(mod, "eps", 1.0)), getattr(mod, "n_it", None)
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


def patch_model(model, artifact, closures=None, layers=None, check=True, return_attention=True,
                backend=None):
    """Replaces the Sinkhorn attention of every compiled layer of `model`
    (in place; returns the model).

    artifact: path or CompiledArtifact. closures: None (each layer's compiled
    default), an int k for every layer, or {layer name: k}. layers: names to
    patch (default: every layer in the artifact; each must exist in the
    model). check: refuse modules whose heads, scale, eps, T or projection
    weights differ from the compiled layer's. return_attention: keep
    returning the [B, H, n, n] attention like the teacher (False returns an
    empty tensor in its place and skips materialising it where possible).
    """
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
        mod = modules.get(name)
        if mod is None:
            cands = [n for n, m in modules.items() if module_kind(m)]
            raise ValueError("the model has no module named '%s' (compiled layer of '%s'); its "
                             "attention modules: %s" % (name, art.path, ", ".join(cands) or "none"))
        kind = module_kind(mod)
        if kind is None:
            raise ValueError("module '%s' (%s) is not a Sinkformer ViT Attention (to_qkv, to_out, "
                             "heads) or text MultiHeadAttention (WQ, WK, WV, linear, n_heads)"
                             % (name, type(mod).__name__))
        if check:
            _check(name, mod, kind, p)
        k = closures.get(name) if isinstance(closures, dict) else closures
        todo.append((name, mod, kind, k))
    for name, mod, kind, k in todo:        # all checks passed: patch
        _unpatch_module(mod)
        mod.asap = AsapAttention(art, name, closures=k)
        mod._asap_return_attention = bool(return_attention)
        mod.forward = types.MethodType(_vit_forward if kind == "vit" else _text_forward, mod)
    return model


def _unpatch_module(mod):
    if "forward" in mod.__dict__:
        del mod.__dict__["forward"]
    if "asap" in mod._modules:
        del mod._modules["asap"]
    mod.__dict__.pop("_asap_return_attention", None)


def unpatch_model(model):
    """Restores the teacher's Sinkhorn attention in every patched module."""
    for _, mod in model.named_modules():
        if isinstance(mod._modules.get("asap"), AsapAttention):
            _unpatch_module(mod)
    return model


def patched_layers(model):
    """{module name: AsapAttention} of the patched modules."""
    return {name: mod._modules["asap"] for name, mod in model.named_modules()
            if isinstance(mod._modules.get("asap"), AsapAttention)}
