#!/usr/bin/env python3
"""Sinkformer-style teacher models, written for asapc.

Run with Debian's interpreter: ${PYTHON:-/usr/bin/python3} (needs torch).

Two model families with the module layout, parameter names and forward
semantics of the released Sinkformer code (michaelsdr/sinkformers), so that
their checkpoints load here and ours load there:

* ``ViT`` (vit-pytorch/vit_pytorch/vit.py): pre-norm encoder; attention
  modules live at ``transformer.layers.<i>.0.fn`` and receive the
  LayerNorm-ed input. ``attn_only=True`` reproduces ``ViT_only_Att`` (the
  MNIST experiments), whose feed-forward blocks exist but are skipped.
* ``TransformerEncoder`` (nlp-tutorial/text-classification-transformer/
  model.py): post-norm text encoder; attention modules live at
  ``layers.<i>.mha`` and receive ``(Q, K, V, attn_mask)`` with
  ``attn_mask`` [B, n, n] True at padded key columns.

Both return ``(output, [attention matrix per layer])`` like the originals
(ViT gives numpy arrays there, as the original does; the text model gives
tensors). Every attention module also keeps its last attention matrix and
per-head output in ``module.saved`` when ``module.keep = True``
(see ``keep_details``).

The Sinkhorn normalisation is ``sinkhorn_attention`` below (asap-math.md
section 1, written the way SinkhornDistance computes it).
"""
import math

import torch
from torch import nn

__all__ = ["sinkhorn_plan", "sinkhorn_attention", "ViT", "TransformerEncoder",
           "keep_details", "attention_modules"]

PAD_SCORE = -1e9        # the text model's masked_fill value
V_RESET = 9e8           # the text model resets column duals above this to 0


# --------------------------------------------------------------------------
# Sinkhorn
# --------------------------------------------------------------------------

def sinkhorn_plan(dots, eps=1.0, max_iter=1, text_mode=False):
    """SinkhornDistance(eps, max_iter) applied to C = -dots.

    dots: [..., n, m] scores (already scaled, already masked). Returns
    (plan, u, v): plan = exp((dots + u_i + v_j) / eps), u [..., n], v [..., m].
    ``max_iter`` counts half-steps (= T of asap-math.md): even steps (0, 2,
    ...) update the row dual u, odd steps the column dual v. In text mode,
    after every v step, entries of v above 9e8 (padded key columns whose
    scores were filled with -1e9) are reset to 0 and v is detached from the
    autograd graph, exactly as the text model does.

    The reference's convergence test (stop when the u update is < 1e-12) is
    not reproduced: it only fires once the iteration has converged.
    """
    n, m = dots.shape[-2], dots.shape[-1]
    # the reference keeps mu, nu in float32 and takes log in float32
    log_mu = torch.log(torch.tensor(1.0 / n, dtype=torch.float32))
    log_nu = torch.log(torch.tensor(1.0 / m, dtype=torch.float32))
    u = torch.zeros(dots.shape[:-1], dtype=dots.dtype, device=dots.device)
    v = torch.zeros(dots.shape[:-2] + (m,), dtype=dots.dtype, device=dots.device)

    def scaled(u, v):               # M(C, u, v) with C = -dots
        return (dots + u.unsqueeze(-1) + v.unsqueeze(-2)) / eps

    for i in range(max_iter):
        if i % 2 == 0:
            u = eps * (log_mu - torch.logsumexp(scaled(u, v), dim=-1)) + u
        else:
            v = eps * (log_nu - torch.logsumexp(scaled(u, v).transpose(-2, -1), dim=-1)) + v
            if text_mode:
                v = v.detach()
                v = torch.where(v > V_RESET, torch.zeros_like(v), v)
    return torch.exp(scaled(u, v)), u, v


def sinkhorn_attention(dots, eps=1.0, max_iter=1, text_mode=False, key_pad=None):
    """Sinkformer attention matrix A = n * plan for a batch of score matrices.

    dots: [..., n, n] scaled scores q.k * scale. key_pad: optional bool
    tensor broadcastable to dots, True where the KEY is padding (the text
    model's attn_mask); those scores are filled with -1e9 first, as the text
    model does (text_mode should then be True so that the column duals of
    padded keys are reset).
    """
    if key_pad is not None:
        dots = dots.masked_fill(key_pad, PAD_SCORE)
    plan = sinkhorn_plan(dots, eps, max_iter, text_mode)[0]
    return plan * plan.shape[-1]


# --------------------------------------------------------------------------
# ViT (vit-pytorch layout)
# --------------------------------------------------------------------------

def _pair(t):
    return t if isinstance(t, tuple) else (t, t)


class Rearrange(nn.Module):
    """'b c (h p1) (w p2) -> b (h w) (p1 p2 c)' (einops' layer, no params)."""

    def __init__(self, p1, p2):
        super().__init__()
        self.p1, self.p2 = p1, p2

    def forward(self, img):
        b, c, hh, ww = img.shape
        h, w = hh // self.p1, ww // self.p2
        x = img.reshape(b, c, h, self.p1, w, self.p2)
        return x.permute(0, 2, 4, 3, 5, 1).reshape(b, h * w, self.p1 * self.p2 * c)


class PreNorm(nn.Module):
    def __init__(self, dim, fn):
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.fn = fn

    def forward(self, x, **kwargs):
        return self.fn(self.norm(x), **kwargs)


class FeedForward(nn.Module):
    def __init__(self, dim, hidden_dim, dropout=0.0):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(dim, hidden_dim), nn.GELU(), nn.Dropout(dropout),
                                 nn.Linear(hidden_dim, dim), nn.Dropout(dropout))

    def forward(self, x):
        return self.net(x)


def _split_heads(t, heads):         # 'b n (h d) -> b h n d'
    b, n, hd = t.shape
    return t.view(b, n, heads, hd // heads).transpose(1, 2)


def _merge_heads(t):                # 'b h n d -> b n (h d)'
    b, h, n, d = t.shape
    return t.transpose(1, 2).reshape(b, n, h * d)


class Attention(nn.Module):
    """ViT Sinkhorn attention. forward(x) -> (to_out(out), attn [B,H,n,n])."""

    def __init__(self, dim, heads=8, dim_head=64, dropout=0.0, max_iter=3, eps=1):
        super().__init__()
        inner_dim = dim_head * heads
        project_out = not (heads == 1 and dim_head == dim)
        self.heads = heads
        self.scale = dim_head ** -0.5
        self.max_iter = max_iter
        self.eps = eps
        self.to_qkv = nn.Linear(dim, inner_dim * 3, bias=False)
        self.to_out = (nn.Sequential(nn.Linear(inner_dim, dim), nn.Dropout(dropout))
                       if project_out else nn.Identity())
        self.keep = False
        self.saved = None

    def forward(self, x):
        q, k, v = (_split_heads(t, self.heads) for t in self.to_qkv(x).chunk(3, dim=-1))
        dots = torch.matmul(q, k.transpose(-1, -2)) * self.scale
        attn = sinkhorn_attention(dots, self.eps, self.max_iter, text_mode=False)
        out = torch.matmul(attn, v)
        if self.keep:
            self.saved = {"attn": attn.detach(), "head_out": out.detach()}
        return self.to_out(_merge_heads(out)), attn


class Transformer(nn.Module):
    def __init__(self, dim, depth, heads, dim_head, mlp_dim, dropout=0.0, max_iter=1, eps=1,
                 attn_only=False):
        super().__init__()
        self.attn_only = attn_only
        self.layers = nn.ModuleList([
            nn.ModuleList([
                PreNorm(dim, Attention(dim, heads=heads, dim_head=dim_head, dropout=dropout,
                                       max_iter=max_iter, eps=eps)),
                PreNorm(dim, FeedForward(dim, mlp_dim, dropout=dropout)),
            ]) for _ in range(depth)])

    def forward(self, x):
        attn_weights = []
        for attn, ff in self.layers:
            attn_x, attn_matrix = attn(x)
            x = attn_x + x
            if not self.attn_only:
                x = ff(x) + x
            attn_weights.append(attn_matrix.cpu().detach().numpy())
        return x, attn_weights


class ViT(nn.Module):
    """forward(img [B, C, H, W]) -> (logits [B, classes], [attn per layer])."""

    def __init__(self, *, image_size, patch_size, num_classes, dim, depth, heads, mlp_dim,
                 pool="cls", channels=3, dim_head=64, dropout=0.0, emb_dropout=0.0,
                 max_iter=1, eps=1, attn_only=False):
        super().__init__()
        ih, iw = _pair(image_size)
        ph, pw = _pair(patch_size)
        if ih % ph or iw % pw:
            raise ValueError("image dimensions must be divisible by the patch size")
        if pool not in ("cls", "mean"):
            raise ValueError("pool must be 'cls' or 'mean'")
        num_patches = (ih // ph) * (iw // pw)
        patch_dim = channels * ph * pw
        self.to_patch_embedding = nn.Sequential(Rearrange(ph, pw), nn.Linear(patch_dim, dim))
        self.pos_embedding = nn.Parameter(torch.randn(1, num_patches + 1, dim))
        self.cls_token = nn.Parameter(torch.randn(1, 1, dim))
        self.dropout = nn.Dropout(emb_dropout)
        self.transformer = Transformer(dim, depth, heads, dim_head, mlp_dim, dropout,
                                       max_iter=max_iter, eps=eps, attn_only=attn_only)
        self.pool = pool
        self.to_latent = nn.Identity()
        self.mlp_head = nn.Sequential(nn.LayerNorm(dim), nn.Linear(dim, num_classes))

    def forward(self, img):
        x = self.to_patch_embedding(img)
        b, n, _ = x.shape
        x = torch.cat((self.cls_token.expand(b, -1, -1), x), dim=1)
        x = x + self.pos_embedding[:, :n + 1]
        x = self.dropout(x)
        x, attn_weights = self.transformer(x)
        x = x.mean(dim=1) if self.pool == "mean" else x[:, 0]
        return self.mlp_head(self.to_latent(x)), attn_weights


# --------------------------------------------------------------------------
# Text encoder (nlp-tutorial layout)
# --------------------------------------------------------------------------

class ScaledDotProductAttention(nn.Module):
    def __init__(self, d_k):
        super().__init__()
        self.d_k = d_k

    def forward(self, q, k, v, attn_mask, n_it=1, eps=1.0):
        score = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(self.d_k)
        attn = sinkhorn_attention(score, eps, n_it, text_mode=True, key_pad=attn_mask)
        return torch.matmul(attn, v), attn


class MultiHeadAttention(nn.Module):
    """forward(Q, K, V, attn_mask [B, n, n] bool, True = padded key)."""

    def __init__(self, d_model, n_heads, n_it=1, eps=1.0):
        super().__init__()
        self.n_heads = n_heads
        self.d_k = self.d_v = d_model // n_heads
        self.n_it = n_it
        self.eps = eps
        self.WQ = nn.Linear(d_model, d_model)
        self.WK = nn.Linear(d_model, d_model)
        self.WV = nn.Linear(d_model, d_model)
        self.scaled_dot_product_attn = ScaledDotProductAttention(self.d_k)
        self.linear = nn.Linear(n_heads * self.d_v, d_model)
        self.keep = False
        self.saved = None

    def forward(self, Q, K, V, attn_mask):
        b = Q.size(0)
        q = self.WQ(Q).view(b, -1, self.n_heads, self.d_k).transpose(1, 2)
        k = self.WK(K).view(b, -1, self.n_heads, self.d_k).transpose(1, 2)
        v = self.WV(V).view(b, -1, self.n_heads, self.d_v).transpose(1, 2)
        mask = attn_mask.unsqueeze(1).repeat(1, self.n_heads, 1, 1)
        out, attn = self.scaled_dot_product_attn(q, k, v, mask, n_it=self.n_it, eps=self.eps)
        if self.keep:
            self.saved = {"attn": attn.detach(), "head_out": out.detach()}
        out = out.transpose(1, 2).contiguous().view(b, -1, self.n_heads * self.d_v)
        return self.linear(out), attn


class PositionWiseFeedForwardNetwork(nn.Module):
    def __init__(self, d_model, d_ff):
        super().__init__()
        self.linear1 = nn.Linear(d_model, d_ff)
        self.linear2 = nn.Linear(d_ff, d_model)
        self.relu = nn.ReLU()

    def forward(self, x):
        return self.linear2(self.relu(self.linear1(x)))


class EncoderLayer(nn.Module):
    def __init__(self, d_model, n_heads, p_drop, d_ff, n_it=1, eps=1.0):
        super().__init__()
        self.mha = MultiHeadAttention(d_model, n_heads, n_it=n_it, eps=eps)
        self.dropout1 = nn.Dropout(p_drop)
        self.layernorm1 = nn.LayerNorm(d_model, eps=1e-6)
        self.ffn = PositionWiseFeedForwardNetwork(d_model, d_ff)
        self.dropout2 = nn.Dropout(p_drop)
        self.layernorm2 = nn.LayerNorm(d_model, eps=1e-6)

    def forward(self, inputs, attn_mask):
        a, attn = self.mha(inputs, inputs, inputs, attn_mask)
        a = self.layernorm1(inputs + self.dropout1(a))
        f = self.layernorm2(a + self.dropout2(self.ffn(a)))
        return f, attn


def sinusoid_table(n_pos, d_model):
    """[n_pos, d_model]: sin on even, cos on odd features, float32."""
    pos = torch.arange(n_pos, dtype=torch.float64).unsqueeze(1)
    i = torch.arange(d_model)
    angle = pos / torch.pow(torch.tensor(10000.0, dtype=torch.float64),
                            (2 * (i // 2)).to(torch.float64) / d_model)
    table = torch.where(i % 2 == 0, torch.sin(angle), torch.cos(angle))
    return table.float()


class TransformerEncoder(nn.Module):
    """forward(tokens [B, n] long) -> (class probabilities [B, 2], [attn per layer]).

    ``eps`` is an asapc addition (the reference hard-codes 1).
    """

    def __init__(self, vocab_size, seq_len, d_model=512, n_layers=6, n_heads=8, p_drop=0.1,
                 d_ff=2048, pad_id=0, n_it=1, eps=1.0):
        super().__init__()
        self.pad_id = pad_id
        self.embedding = nn.Embedding(vocab_size, d_model)
        self.pos_embedding = nn.Embedding.from_pretrained(sinusoid_table(seq_len + 1, d_model),
                                                          freeze=True)
        self.layers = nn.ModuleList([EncoderLayer(d_model, n_heads, p_drop, d_ff, n_it=n_it, eps=eps)
                                     for _ in range(n_layers)])
        self.linear = nn.Linear(d_model, 2)
        self.softmax = nn.Softmax(dim=-1)

    def forward(self, inputs):
        b, n = inputs.shape
        positions = torch.arange(n, device=inputs.device, dtype=inputs.dtype).repeat(b, 1) + 1
        pad = inputs.eq(self.pad_id)
        positions = positions.masked_fill(pad, 0)
        x = self.embedding(inputs) + self.pos_embedding(positions)
        attn_mask = self.get_attention_padding_mask(inputs, inputs, self.pad_id)
        weights = []
        for layer in self.layers:
            x, w = layer(x, attn_mask)
            weights.append(w)
        x, _ = torch.max(x, dim=1)
        return self.softmax(self.linear(x)), weights

    @staticmethod
    def get_attention_padding_mask(q, k, pad_id):
        return k.eq(pad_id).unsqueeze(1).repeat(1, q.size(1), 1)


# --------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------

def attention_modules(model):
    """[(name, module)] of the Sinkhorn attention modules, in forward order."""
    return [(name, m) for name, m in model.named_modules()
            if isinstance(m, (Attention, MultiHeadAttention))]


class keep_details:
    """Context manager: attention modules store .saved = {attn, head_out}."""

    def __init__(self, model):
        self.mods = [m for _, m in attention_modules(model)]

    def __enter__(self):
        for m in self.mods:
            m.keep, m.saved = True, None
        return self

    def __exit__(self, *exc):
        for m in self.mods:
            m.keep = False
        return False

    def clear(self):
        for m in self.mods:
            m.saved = None


# --------------------------------------------------------------------------
# fixture-sized models and synthetic inputs (tests, --demo, make_fixtures)
# --------------------------------------------------------------------------

VIT_FIXTURE = dict(image_size=16, patch_size=4, num_classes=10, dim=32, depth=2, heads=2,
                   mlp_dim=32, channels=1, dim_head=16, max_iter=6, eps=1)
TEXT_FIXTURE = dict(vocab_size=50, seq_len=12, d_model=32, n_layers=2, n_heads=4, p_drop=0.1,
                    d_ff=32, pad_id=0, n_it=5)


def fixture_vit(seed=0, **overrides):
    """Seeded fixture-sized ViT (T = 6, column-ending), in eval mode."""
    torch.manual_seed(seed)
    return ViT(**dict(VIT_FIXTURE, **overrides)).eval()


def fixture_text(seed=1, **overrides):
    """Seeded fixture-sized text encoder (T = 5, row-ending), in eval mode."""
    torch.manual_seed(seed)
    return TransformerEncoder(**dict(TEXT_FIXTURE, **overrides)).eval()


def synthetic_images(count, seed=0, image_size=16, channels=1):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(count, channels, image_size, image_size, generator=g)


def synthetic_tokens(count, seed=0, seq_len=12, vocab_size=50, pad_id=0, lengths=None):
    """[count, seq_len] int64 token ids, each row padded at the end with pad_id.

    lengths: optional list of lengths (>= 1); random in [1, seq_len] otherwise.
    """
    g = torch.Generator().manual_seed(seed)
    if lengths is None:
        lengths = torch.randint(1, seq_len + 1, (count,), generator=g).tolist()
    tokens = torch.randint(1, vocab_size, (count, seq_len), generator=g)
    tokens[tokens == pad_id] = (pad_id + 1) % vocab_size or 1
    for row, length in enumerate(lengths):
        tokens[row, length:] = pad_id
    return tokens
