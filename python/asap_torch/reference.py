"""The compiled operator in plain PyTorch (asap-math.md sections 1-5, 6b, 6c).

This mirrors the C++ reference path (src/lib/reference/{teacher,features,
operator}.cpp) operation by operation, so that it agrees with the custom
operator to rounding. asap_torch uses it only when libasap_torch_op.so is
not available (or when asked with backend="torch"): for ASAP layers
(attend), for the 'sinkhorn' and 'teacher' layer kinds (attend, the loop
with T' or T half-steps) and for the exact teacher without an artifact
(teacher, as torch.ops.asap.teacher).

Tensors: q, k [B, H, n, d], v [B, H, n, dv]; key_mask [B, n] bool (True =
token) or None; duals [B, H, n].
"""
import math

import torch

INF = float("inf")


class Marginals:
    """Log marginals in coupling units, broadcastable to [B, H, n]."""

    def __init__(self, key_mask, B, n, drop_queries, dtype, device):
        log_n = -math.log(float(n))
        if key_mask is None:
            self.log_a = torch.full((B, 1, n), log_n, dtype=dtype, device=device)
            self.log_b = self.log_a
            self.row_active = torch.ones((B, 1, n), dtype=torch.bool, device=device)
            self.key_active = self.row_active
            return
        if key_mask.dim() != 2 or tuple(key_mask.shape) != (B, n):
            raise ValueError("key-padding mask: expected shape [%d, %d], found %s"
                             % (B, n, list(key_mask.shape)))
        active = key_mask.to(device=device, dtype=torch.bool).unsqueeze(1)
        if not bool(active.any(-1).all()):
            raise ValueError("key-padding mask: every sequence needs at least one token")
        self.key_active = active
        self.log_b = torch.full((B, 1, n), log_n, dtype=dtype, device=device) \
            .masked_fill(~active, -INF)
        if drop_queries:
            self.row_active = active
            self.log_a = self.log_b
        else:
            self.row_active = torch.ones((B, 1, n), dtype=torch.bool, device=device)
            self.log_a = torch.full((B, 1, n), log_n, dtype=dtype, device=device)


def scores(q, k, scale):
    return torch.matmul(q, k.transpose(-1, -2)) * scale


def col_closure(S, f, m, eps):
    lse = torch.logsumexp((S + f.unsqueeze(-1)) / eps, dim=-2)
    return eps * (m.log_b - lse)


def row_closure(S, g, m, eps):
    lse = torch.logsumexp((S + g.unsqueeze(-2)) / eps, dim=-1)
    return eps * (m.log_a - lse)


def plan_attention(S, f, g, eps, multiply_by_n):
    P = torch.exp((S + f.unsqueeze(-1) + g.unsqueeze(-2)) / eps)
    if multiply_by_n:
        P = P * float(S.shape[-1])
    return P


def cost_alpha(q, scale):
    return 0.5 * scale * q.pow(2).sum(-1)


def center_rows(x, m, fill=0.0):
    active = m.row_active.expand_as(x)
    xs = torch.where(active, x, torch.zeros_like(x))
    count = active.sum(-1, keepdim=True).to(x.dtype)
    mean = xs.sum(-1, keepdim=True) / count
    return torch.where(active, x - mean, torch.full_like(x, fill))


def sinkhorn(q, k, v, key_mask=None, scale=None, eps=1.0, T=1, drop_queries=False,
             multiply_by_n=True):
    """The finite teacher with budget T (odd t: row closure, even t: column
    closure), -inf masking; returns (head outputs, attention)."""
    B, H, n, d = q.shape
    scale = d ** -0.5 if scale is None else scale
    m = Marginals(key_mask, B, n, drop_queries, q.dtype, q.device)
    S = scores(q, k, scale)
    g = torch.zeros((B, H, n), dtype=q.dtype, device=q.device).masked_fill(~m.key_active, -INF)
    f = torch.zeros_like(g)
    for t in range(1, T + 1):
        if t % 2 == 1:
            f = row_closure(S, g, m, eps)
        else:
            g = col_closure(S, f, m, eps)
    A = plan_attention(S, f, g, eps, multiply_by_n)
    return torch.matmul(A, v.to(q.dtype)), A


# --------------------------------------------------------------------------
# features (section 4, 6b and 6c)
# --------------------------------------------------------------------------

def sliced_potentials(q, k, m, theta, L, scale):
    """[B, H, n, L] sliced Kantorovich potentials, centered over rows carrying
    mass (0 elsewhere); padded rows carrying mass get the extension.

    theta: float64 tensor [d, >= L]. Stable sorts (ties by token index) on
    the active tokens; the piecewise-linear u and the potentials are built in
    float64 from the projections computed in q's dtype, as in C++.
    """
    B, H, n, _ = q.shape
    th = theta[:, :L].to(dtype=q.dtype, device=q.device) * math.sqrt(scale)
    X = torch.matmul(q, th).transpose(-1, -2).to(torch.float64)     # [B, H, L, n]
    Y = torch.matmul(k, th).transpose(-1, -2).to(torch.float64)
    key = m.key_active.unsqueeze(-2).expand(B, H, L, n)               # [B, H, L, n]
    row = m.row_active.unsqueeze(-2).expand(B, H, L, n)
    count_m = key.sum(-1, keepdim=True)                               # active tokens
    # Padded keys sort last (+inf); stable sorts keep ties in token order.
    Xk = torch.where(key, X, torch.full_like(X, INF))
    Yk = torch.where(key, Y, torch.full_like(Y, INF))
    xs, ix = torch.sort(Xk, dim=-1, stable=True)
    ys, _ = torch.sort(Yk, dim=-1, stable=True)
    ranks = torch.arange(n, device=q.device).expand(B, H, L, n)
    valid = ranks < count_m                                           # sorted slots in use
    xs0 = torch.where(valid, xs, torch.zeros_like(xs))
    ys0 = torch.where(valid, ys, torch.zeros_like(ys))
    # u_(1) = 0, u_(r+1) = u_(r) + ys_(r) (xs_(r+1) - xs_(r)) for r + 1 < m
    step = ys0[..., :-1] * (xs0[..., 1:] - xs0[..., :-1])
    step = torch.where(valid[..., 1:], step, torch.zeros_like(step))
    u = torch.cat([torch.zeros_like(xs0[..., :1]), torch.cumsum(step, -1)], -1)
    # cumsum runs left to right like C++'s loop, so u matches it to rounding
    phi_sorted = 0.5 * xs0 * xs0 - u
    out = torch.zeros_like(X)
    out.scatter_(-1, ix, torch.where(valid, phi_sorted, torch.zeros_like(phi_sorted)))
    # Padded query rows that carry mass: phi(p) = p^2/2 - u(p), u extended by its rays.
    ext = row & ~key
    if bool(ext.any()):
        r = torch.searchsorted(xs.contiguous(), X.contiguous(), right=True) - 1   # last xs <= p
        rc = r.clamp(min=0)
        u_r = torch.gather(u, -1, rc)
        x_r = torch.gather(xs0, -1, rc)
        y_r = torch.gather(ys0, -1, rc)
        up = torch.where(r >= 0, u_r + y_r * (X - x_r), ys0[..., :1] * (X - xs0[..., :1]))
        out = torch.where(ext, 0.5 * X * X - up, out)
    # stored in q's dtype, then centered in float64 over the rows carrying mass
    out = out.to(q.dtype).to(torch.float64)
    out = torch.where(row, out, torch.zeros_like(out))
    mean = out.sum(-1, keepdim=True) / row.sum(-1, keepdim=True).to(torch.float64)
    out = torch.where(row, out - mean, torch.zeros_like(out)).to(q.dtype)
    return out.transpose(-1, -2)                                      # [B, H, n, L]


def build_features(q, k, m, p, S=None):
    """Psi [B, H, n, P] of layer p (LayerParams), columns [slices | alpha |
    softmax | sinkhorn3 | stats (row max, row mean, row standard deviation) |
    centered stats (row max and variance of S_ij - c_j, c_j the column mean)]."""
    cols = []
    theta = p.theta if torch.is_tensor(p.theta) else torch.from_numpy(p.theta)
    if p.slices > 0:
        cols.append(sliced_potentials(q, k, m, theta, p.slices, p.score_scale))
    alpha = None
    if p.alpha or p.softmax_dual or p.sinkhorn_dual3:
        alpha = cost_alpha(q, p.score_scale)
    if p.alpha:
        cols.append(center_rows(alpha, m).unsqueeze(-1))
    if p.softmax_dual or p.sinkhorn_dual3:
        Sx = S if S is not None else scores(q, k, p.score_scale)
        B, H, n = q.shape[0], q.shape[1], q.shape[2]
        g0 = torch.zeros((B, H, n), dtype=q.dtype, device=q.device).masked_fill(~m.key_active, -INF)
        f1 = row_closure(Sx, g0, m, p.eps)

        def column(f):
            return center_rows(torch.where(m.row_active, f + alpha, torch.zeros_like(f)),
                               m).unsqueeze(-1)
        if p.softmax_dual:
            cols.append(column(f1))
        if p.sinkhorn_dual3:
            cols.append(column(row_closure(Sx, col_closure(Sx, f1, m, p.eps), m, p.eps)))
    if p.score_stats:
        # Each query row's scores over the active keys (section 6c): max, mean
        # and the standard deviation about the mean (two passes, 1/|J|).
        Sx = S if S is not None else scores(q, k, p.score_scale)
        key = m.key_active.unsqueeze(-2)                                  # [B, 1, 1, n]
        count = m.key_active.sum(-1, keepdim=True).to(Sx.dtype)          # [B, 1, 1]
        zero = torch.zeros((), dtype=Sx.dtype, device=Sx.device)
        mx = Sx.masked_fill(~key, -INF).amax(-1)
        mean = torch.where(key, Sx, zero).sum(-1) / count
        dev = torch.where(key, Sx - mean.unsqueeze(-1), zero)
        sd = ((dev * dev).sum(-1) / count).sqrt()
        cols += [center_rows(c, m).unsqueeze(-1) for c in (mx, mean, sd)]
        if getattr(p, "centered_stats", False):
            # The same rows less each key's mean over the rows that carry mass
            # (section 6d): the max and the variance of S_ij - c_j.
            rows = m.row_active.unsqueeze(-1)                             # [B, 1, n, 1]
            nrows = m.row_active.sum(-1, keepdim=True).unsqueeze(-1).to(Sx.dtype)
            c = torch.where(rows, Sx, zero).sum(-2, keepdim=True) / nrows  # [B, H, 1, n]
            Sc = Sx - c
            mxc = Sc.masked_fill(~key, -INF).amax(-1)
            meanc = torch.where(key, Sc, zero).sum(-1) / count
            devc = torch.where(key, Sc - meanc.unsqueeze(-1), zero)
            varc = (devc * devc).sum(-1) / count
            cols += [center_rows(c, m).unsqueeze(-1) for c in (mxc, varc)]
    if not cols:
        raise ValueError("layer '%s': the feature family has no columns" % p.name)
    return cols[0].contiguous() if len(cols) == 1 else torch.cat(cols, -1)


def predict_phi(Psi, coef):
    c = (coef if torch.is_tensor(coef) else torch.from_numpy(coef)).to(Psi.dtype).to(Psi.device)
    return (Psi * c.unsqueeze(1)).sum(-1)


def _check_layer_inputs(p, q, k, v):
    if q.dim() != 4 or q.shape[1] != p.heads or q.shape[3] != p.head_dim:
        raise ValueError("layer '%s': q must be [B, %d, n, %d], found %s"
                         % (p.name, p.heads, p.head_dim, list(q.shape)))
    if k.shape != q.shape:
        raise ValueError("layer '%s': k must have q's shape %s, found %s"
                         % (p.name, list(q.shape), list(k.shape)))
    if v.dim() != 4 or v.shape[:3] != q.shape[:3]:
        raise ValueError("layer '%s': v must be [%d, %d, %d, dv], found %s"
                         % (p.name, q.shape[0], p.heads, q.shape[2], list(v.shape)))
    if q.dtype not in (torch.float32, torch.float64):
        raise ValueError("layer '%s': q, k, v must be float32 or float64, found %s"
                         % (p.name, q.dtype))


def attend(p, q, k, v, key_mask=None, closures=None, return_attention=False):
    """The compiled operator of layer p (LayerParams).

    ASAP layers: features, prediction, k closures col, row, col, ...
    (default: p.default_closures). 'sinkhorn' and 'teacher' layers: the
    teacher's loop with T' or T half-steps (closures must be None or 0).

    Returns (out [B, H, n, dv], attention or None, phi_hat [B, H, n]; an
    empty tensor for the loop kinds, which predict no dual).
    """
    _check_layer_inputs(p, q, k, v)
    if not p.is_asap:
        if closures:
            raise ValueError("layer '%s' runs %s, which has no closures to set: pass closures = 0"
                             % (p.name, p.describe))
        out, A = sinkhorn(q, k.to(q.dtype), v, key_mask, p.score_scale, p.eps, p.loop_steps,
                          p.drop_queries, p.multiply_by_n)
        return out, (A if return_attention else None), q.new_zeros((0,))
    k_closures = int(closures) if closures else p.default_closures
    if k_closures < 1:
        raise ValueError("number of closures must be at least 1, found %d" % k_closures)
    k = k.to(q.dtype)
    B, H, n, _ = q.shape
    m = Marginals(key_mask, B, n, p.drop_queries, q.dtype, q.device)
    S = scores(q, k, p.score_scale)
    Psi = build_features(q, k, m, p, S)
    phi_hat = predict_phi(Psi, p.coef)
    f = (phi_hat - cost_alpha(q, p.score_scale)).masked_fill(~m.row_active, -INF)
    g = None
    for t in range(1, k_closures + 1):
        if t % 2 == 1:
            g = col_closure(S, f, m, p.eps)
        else:
            f = row_closure(S, g, m, p.eps)
    A = plan_attention(S, f, g, p.eps, p.multiply_by_n)
    out = torch.matmul(A, v.to(q.dtype))
    return out, (A if return_attention else None), phi_hat


def check_teacher_args(q, k, v, scale, T, eps):
    """The argument checks of torch.ops.asap.teacher, with its sentences."""
    if not (isinstance(T, int) and 1 <= T <= 1000000000):
        raise ValueError("asap::teacher: T (Sinkhorn half-steps) must be >= 1, found %s" % (T,))
    if not (math.isfinite(eps) and eps > 0):
        raise ValueError("asap::teacher: eps must be a finite number > 0, found %s" % (eps,))
    if not (math.isfinite(scale) and scale > 0):
        raise ValueError("asap::teacher: scale must be a finite number > 0, found %s" % (scale,))
    if q.dim() != 4:
        raise ValueError("asap::teacher: q must be [B, H, n, d], found %s" % list(q.shape))
    if q.dtype not in (torch.float32, torch.float64):
        raise ValueError("asap::teacher: q must be float32 or float64, found %s" % q.dtype)
    if k.shape != q.shape:
        raise ValueError("asap::teacher: k must have q's shape %s, found %s"
                         % (list(q.shape), list(k.shape)))
    if v.dim() != 4 or v.shape[:3] != q.shape[:3]:
        raise ValueError("asap::teacher: v must be [%d, %d, %d, dv], found %s"
                         % (q.shape[0], q.shape[1], q.shape[2], list(v.shape)))
    if not (k.is_floating_point() and v.is_floating_point()):
        raise ValueError("asap::teacher: k and v must be floating point, found %s and %s"
                         % (k.dtype, v.dtype))


def teacher(q, k, v, key_mask=None, scale=None, T=1, eps=1.0, drop_padded_queries=False,
            multiply_by_n=True, return_attention=False):
    """torch.ops.asap.teacher in plain PyTorch: (out [B, H, n, dv], attention
    [B, H, n, n], or an empty tensor unless return_attention)."""
    scale = q.shape[-1] ** -0.5 if scale is None else float(scale)
    check_teacher_args(q, k, v, scale, T, float(eps))
    with torch.no_grad():
        out, A = sinkhorn(q, k.to(q.dtype), v, key_mask, scale, float(eps), T,
                          drop_padded_queries, multiply_by_n)
    return out, (A if return_attention else q.new_zeros((0,)))
