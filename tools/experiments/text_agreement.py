#!/usr/bin/env python3
"""Issue 15 research prototype: which directions raise the agreement of the
compiled text teacher (WordNet glosses, T = 8, n = 32, heavy padding) with
the teacher's own predictions, at a budget of about 5-6 log-sum-exp passes.

Python only; nothing here is used by asapc. Run with Debian's interpreter:

    nice -n 19 /usr/bin/python3 tools/experiments/text_agreement.py \
        --out tools/experiments/text_agreement.json     # all groups (~1 h on 1 core)
    /usr/bin/python3 tools/experiments/text_agreement.py --report \
        --out tools/experiments/text_agreement.json     # the Markdown table

--only GROUP[,GROUP] runs some of: sinkhorn base iter pos inter e2e e2e2
layers calib side lift; a run skips the rows already in --out, so groups can
run one after another into the same file (never two processes on one file).

Everything runs in float64 on one thread (torch.set_num_threads(1)). What it
does, per layer and per head (asap-math.md conventions):

* calibration: the first N examples of the training split in the order of
  train_teachers.pick (seed 1; N = 512 gives the examples of
  out/teachers/text_wordnet_t8.calib.h5), teacher-forced layer inputs; a
  fixed validation set (512 further training examples of the same
  permutation) chooses the ridge by dual MSE; sufficient statistics of the
  widest feature set, narrower families are sub-blocks (as asapc compile).
* features: per-token columns [B, H, n, c] (`blocks`), centered over the
  rows that carry mass; the target is the teacher's dual f^(j) in cost
  coordinates (f + alpha, centered). Two target conventions: `closure-ready`
  (f^7, what asapc fits today, then k closures) and `k-matched`
  (f^(T-k): the dual that k closures turn into exactly the teacher's plan).
* metrics: held-out attention relative error (the 256 test-split examples of
  text_wordnet_t8.heldout.h5, teacher-forced, mean over example x head x
  layer) and end-to-end agreement / accuracy on the whole test split (8263
  examples) with both attention layers replaced.
"""
import argparse
import json
import math
import os
import sys
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
TOOLS = os.path.dirname(HERE)
REPO = os.path.dirname(TOOLS)
sys.path[:0] = [TOOLS, os.path.join(TOOLS, "train"), os.path.join(REPO, "python")]   # python/: the asap_torch package

import train_teachers  # noqa: E402

INF = float("inf")
DT = torch.float64
T_TEACHER = 8
N = 32
H = 4
DK = 16
SCALE = 0.25
LOG_N = -math.log(N)


def log(*a):
    print(*a, file=sys.stderr, flush=True)


# --------------------------------------------------------------------------
# model, data, teacher-forced layer inputs
# --------------------------------------------------------------------------

class Ctx:
    def __init__(self):
        self.model, self.cfg = train_teachers.load_teacher(
            os.path.join(REPO, "out/teachers/text_wordnet_t8.pt"))
        self.model.eval()
        self.train_x, self.train_y = train_teachers.teacher_data(self.cfg, "train")
        self.test_x, self.test_y = train_teachers.teacher_data(self.cfg, "test")
        self.perm = torch.randperm(len(self.train_x),
                                   generator=torch.Generator().manual_seed(1))
        self.held_idx = train_teachers.pick(256, len(self.test_x), 2)
        self.mods = [self.model.layers[i].mha for i in range(2)]
        with torch.no_grad():
            self.teacher_pred = self.predict(None)

    def calib_idx(self, n):
        return torch.sort(self.perm[:n]).values

    def val_idx(self):
        return torch.sort(self.perm[8192:8192 + 512]).values

    def layer_inputs(self, tokens, bs=512):
        """[(X [B, n, 64] float32 input of each mha, key_mask [B, n] True = token)]."""
        got = {0: [], 1: []}
        hooks = []
        for i, m in enumerate(self.mods):
            hooks.append(m.register_forward_pre_hook(
                lambda mod, args, i=i: got[i].append(args[0].detach())))
        try:
            with torch.no_grad():
                for s in range(0, len(tokens), bs):
                    self.model(tokens[s:s + bs])
        finally:
            for h in hooks:
                h.remove()
        mask = tokens.ne(0)
        return [torch.cat(got[i]) for i in range(2)], mask

    def predict(self, op, bs=1024):
        """argmax predictions on the test split with both mha layers running
        `op(layer, q, k, v, key_mask) -> out [B, H, n, dv]` (None: teacher)."""
        saved = []
        if op is not None:
            for li, m in enumerate(self.mods):
                saved.append(m.forward)
                m.forward = make_forward(m, li, op)
        try:
            preds = []
            with torch.no_grad():
                for s in range(0, len(self.test_x), bs):
                    preds.append(self.model(self.test_x[s:s + bs])[0].argmax(-1))
            return torch.cat(preds)
        finally:
            for m, f in zip(self.mods, saved):
                m.forward = f

    def score(self, op):
        pred = self.predict(op)
        return {"agreement": 100.0 * float((pred == self.teacher_pred).double().mean()),
                "accuracy": 100.0 * float((pred == self.test_y).double().mean()),
                "teacher_accuracy": 100.0 * float((self.teacher_pred == self.test_y)
                                                  .double().mean())}


def qkv(mod, X):
    b = X.shape[0]
    f = lambda lin: lin(X).view(b, -1, H, DK).transpose(1, 2).to(DT)  # noqa: E731
    return f(mod.WQ), f(mod.WK), f(mod.WV)


def make_forward(mod, li, op):
    def forward(Q, K, V, attn_mask):
        b = Q.size(0)
        q, k, v = qkv(mod, Q)
        key_mask = ~attn_mask[:, 0, :]
        out = op(li, q, k, v, key_mask).to(Q.dtype)
        out = out.transpose(1, 2).contiguous().view(b, -1, H * DK)
        return mod.linear(out), None
    return forward


# --------------------------------------------------------------------------
# Sinkhorn in score coordinates, -inf masking (asap-math.md section 1)
# --------------------------------------------------------------------------

class M:
    """Marginals of a batch: every query row carries 1/n, active keys 1/n."""

    def __init__(self, key_mask):
        self.key = key_mask.unsqueeze(1)                      # [B, 1, n]
        self.log_b = torch.full(self.key.shape, LOG_N, dtype=DT).masked_fill(~self.key, -INF)


def scores(q, k):
    return torch.matmul(q, k.transpose(-1, -2)) * SCALE


def col(S, f, m):
    return m.log_b - torch.logsumexp(S + f.unsqueeze(-1), dim=-2)


def row(S, g):
    return LOG_N - torch.logsumexp(S + g.unsqueeze(-2), dim=-1)


def chain(S, m, upto):
    """{'f1': .., 'g2': .., 'f3': ..}: the teacher's duals after t half-steps."""
    out = {}
    g = torch.zeros(S.shape[:-1], dtype=DT).masked_fill(~m.key, -INF)
    f = None
    for t in range(1, upto + 1):
        if t % 2:
            f = row(S, g)
            out["f%d" % t] = f
        else:
            g = col(S, f, m)
            out["g%d" % t] = g
    return out


def plan_attn(S, f, g):
    return torch.exp(S + f.unsqueeze(-1) + g.unsqueeze(-2)) * N


def closures_from_f(S, f, m, k):
    """k closures col, row, col, ... from a source dual f; returns (f, g)."""
    g = None
    for t in range(1, k + 1):
        if t % 2:
            g = col(S, f, m)
        else:
            f = row(S, g)
    return f, g


def closures_from_g(S, g, m, k):
    """k closures row, col, row, ... from a key dual g; returns (f, g)."""
    f = None
    for t in range(1, k + 1):
        if t % 2:
            f = row(S, g)
        else:
            g = col(S, f, m)
    return f, g


# --------------------------------------------------------------------------
# features
# --------------------------------------------------------------------------

def center(x, rows):
    """x [B, H, n] centered over rows [B, 1|H, n] (bool); 0 elsewhere."""
    rows = rows.expand_as(x)
    xs = torch.where(rows, x, torch.zeros_like(x))
    mean = xs.sum(-1, keepdim=True) / rows.sum(-1, keepdim=True)
    return torch.where(rows, x - mean, torch.zeros_like(x))


def sliced(q, k, key, theta):
    """[B, H, n, L] sliced potentials of the sources q against targets k
    (sorted matching on the active tokens `key`, ray extension elsewhere),
    asap-math.md section 4; uncentered."""
    B, Hh, n, _ = q.shape
    L = theta.shape[1]
    th = theta * math.sqrt(SCALE)
    X = torch.matmul(q, th).transpose(-1, -2)                   # [B, H, L, n]
    Y = torch.matmul(k, th).transpose(-1, -2)
    keyL = key.unsqueeze(-2).expand(B, Hh, L, n)
    cnt = keyL.sum(-1, keepdim=True)
    xs, ix = torch.sort(torch.where(keyL, X, torch.full_like(X, INF)), dim=-1, stable=True)
    ys, _ = torch.sort(torch.where(keyL, Y, torch.full_like(Y, INF)), dim=-1, stable=True)
    valid = torch.arange(n).expand(B, Hh, L, n) < cnt
    xs0 = torch.where(valid, xs, torch.zeros_like(xs))
    ys0 = torch.where(valid, ys, torch.zeros_like(ys))
    step = ys0[..., :-1] * (xs0[..., 1:] - xs0[..., :-1])
    step = torch.where(valid[..., 1:], step, torch.zeros_like(step))
    u = torch.cat([torch.zeros_like(xs0[..., :1]), torch.cumsum(step, -1)], -1)
    phi_sorted = 0.5 * xs0 * xs0 - u
    out = torch.zeros_like(X)
    out.scatter_(-1, ix, torch.where(valid, phi_sorted, torch.zeros_like(phi_sorted)))
    ext = ~keyL
    r = torch.searchsorted(xs.contiguous(), X.contiguous(), right=True) - 1
    rc = r.clamp(min=0)
    up = torch.where(r >= 0, torch.gather(u, -1, rc) + torch.gather(ys0, -1, rc)
                     * (X - torch.gather(xs0, -1, rc)), ys0[..., :1] * (X - xs0[..., :1]))
    out = torch.where(ext, 0.5 * X * X - up, out)
    return out.transpose(-1, -2)


THETA = None


def theta_bank(L=64, seed=0):
    global THETA
    if THETA is None:
        g = torch.Generator().manual_seed(seed)
        th = torch.randn(DK, L, generator=g, dtype=DT)
        THETA = th / th.norm(dim=0, keepdim=True)
    return THETA


# block name -> (columns, pass cost as the iterate it needs, description)
BLOCKS = {
    "slices": 64, "alpha": 1, "f1": 1, "f3": 1, "f5": 1, "g2": 1, "g4": 1,
    "aitken": 3, "pad": 1, "pos": N, "padlen": 1,
}
# passes a block needs (the Sinkhorn iterate it reads)
BLOCK_PASSES = {"f1": 1, "g2": 2, "f3": 3, "g4": 4, "f5": 5, "aitken": 5}


def row_blocks(q, k, m, S, ch, names):
    """dict name -> [B, H, n, c] float64, every column centered over all rows
    (all rows carry mass). `ch` holds the iterates needed."""
    B = q.shape[0]
    allrows = torch.ones((B, 1, N), dtype=torch.bool)
    alpha = 0.5 * SCALE * q.pow(2).sum(-1)
    beta = 0.5 * SCALE * k.pow(2).sum(-1)
    key = m.key.expand(B, H, N)
    out = {}
    c = lambda x: center(x, allrows).unsqueeze(-1)  # noqa: E731
    for nm in names:
        if nm == "slices":
            P = sliced(q, k, key, theta_bank())
            P = P - P.mean(-2, keepdim=True)
            out[nm] = P
        elif nm == "alpha":
            out[nm] = c(alpha)
        elif nm in ("f1", "f3", "f5"):
            out[nm] = c(ch[nm] + alpha)
        elif nm in ("g2", "g4"):
            g = torch.where(key, ch[nm] + beta, torch.zeros_like(beta))
            out[nm] = c(g)
        elif nm == "aitken":
            d1 = center(ch["f3"] - ch["f1"], allrows)
            d2 = center(ch["f5"] - ch["f3"], allrows)
            # per-(example, head) contraction ratio of the last step
            r = ((d2 * d1).sum(-1, keepdim=True) / (d1 * d1).sum(-1, keepdim=True).clamp_min(1e-12))
            r = r.clamp(0.0, 0.95)
            # elementwise Aitken delta^2 towards the limit, guarded
            den = d2 - d1
            ok = den.abs() > 1e-6
            ait = torch.where(ok, -d2 * d2 / torch.where(ok, den, torch.ones_like(den)),
                              torch.zeros_like(den)).clamp(-50, 50)
            out[nm] = torch.stack([c(r * d2)[..., 0], c(r / (1 - r) * d2)[..., 0], c(ait)[..., 0]],
                                  -1)
        elif nm == "pad":
            out[nm] = c((~key).to(DT))
        elif nm == "padlen":
            frac = key.to(DT).mean(-1, keepdim=True)
            out[nm] = c((~key).to(DT) * frac)
        elif nm == "pos":
            eye = torch.eye(N, dtype=DT).expand(B, H, N, N)
            out[nm] = eye - eye.mean(-2, keepdim=True)
        else:
            raise KeyError(nm)
    return out


def key_blocks(q, k, m, S, ch, names):
    """Key-side features for predicting a column dual g: on active keys only
    (0 on padded keys), centered over the active keys."""
    B = q.shape[0]
    key = m.key.expand(B, H, N)
    alpha = 0.5 * SCALE * q.pow(2).sum(-1)
    beta = 0.5 * SCALE * k.pow(2).sum(-1)
    c = lambda x: center(torch.where(key, x, torch.zeros_like(x)), key).unsqueeze(-1)  # noqa
    out = {}
    for nm in names:
        if nm == "kslices":
            P = sliced(k, q, key, theta_bank())
            P = torch.where(key.unsqueeze(-1), P, torch.zeros_like(P))
            cnt = key.sum(-1, keepdim=True).unsqueeze(-1)
            P = torch.where(key.unsqueeze(-1), P - P.sum(-2, keepdim=True) / cnt,
                            torch.zeros_like(P))
            out[nm] = P
        elif nm == "kbeta":
            out[nm] = c(beta)
        elif nm == "kg0":            # column softmax dual col(0): 1 pass
            g0 = col(S, torch.zeros_like(alpha), m)
            out[nm] = c(g0 + beta)
        elif nm in ("g2", "g4"):
            out[nm] = c(ch[nm] + beta)
        elif nm in ("f1", "f3"):     # the same token's row dual
            out[nm] = c(ch[nm] + alpha)
        elif nm == "pos":
            eye = torch.eye(N, dtype=DT).expand(B, H, N, N)
            E = torch.where(key.unsqueeze(-1), eye, torch.zeros_like(eye))
            cnt = key.sum(-1, keepdim=True).unsqueeze(-1)
            out[nm] = torch.where(key.unsqueeze(-1), E - E.sum(-2, keepdim=True) / cnt,
                                  torch.zeros_like(E))
        else:
            raise KeyError(nm)
    return out


def block_passes(names, side="f"):
    p = max([BLOCK_PASSES.get(n, 0) for n in names] + [0])
    if side == "g" and "kg0" in names:     # col(0) is a pass of its own
        p += 1
    return p


# --------------------------------------------------------------------------
# random lift (seeded), applied to standardized base columns
# --------------------------------------------------------------------------

class Lift:
    def __init__(self, kind, D, P, scale_cols, seed=0, gamma=1.0):
        g = torch.Generator().manual_seed(seed)
        self.kind, self.D = kind, D
        self.W = torch.randn(P, D, generator=g, dtype=DT) / math.sqrt(P) * gamma
        self.b = (torch.rand(D, generator=g, dtype=DT) * 2 * math.pi if kind == "fourier"
                  else torch.randn(D, generator=g, dtype=DT) * 0.5)
        self.scale = scale_cols                      # [H, P]

    def __call__(self, Psi, key=None):               # [B, H, n, P] -> [B, H, n, P + D]
        Z = (Psi / self.scale.unsqueeze(0).unsqueeze(2)) @ self.W + self.b
        Z = torch.relu(Z) if self.kind == "relu" else torch.cos(Z)
        return torch.cat([Psi, Z - Z.mean(-2, keepdim=True)], -1)


class Interact:
    """Separate coefficients per token type and/or sequence-length bucket:
    the base columns times indicator columns (real / padded row; active-key
    count in `edges` buckets), each product re-centered over the rows. Linear
    in the coefficients; at run time a row just picks its coefficient set."""

    def __init__(self, by_pad, edges=()):
        self.by_pad, self.edges = by_pad, list(edges)

    def groups(self, key):                           # key [B, H, n] -> list of [B, H, n] 0/1
        ind = [torch.ones_like(key, dtype=DT)]
        if self.by_pad:
            ind = [key.to(DT), (~key).to(DT)]
        if self.edges:
            m = key.sum(-1, keepdim=True).expand_as(key)
            bounds = [0] + self.edges + [N + 1]
            lens = [((m > lo) & (m <= hi)).to(DT) for lo, hi in zip(bounds[:-1], bounds[1:])]
            ind = [a * b for a in ind for b in lens]
        return ind

    def __call__(self, Psi, key):
        cols = []
        for w in self.groups(key):
            X = Psi * w.unsqueeze(-1)
            cols.append(X - X.mean(-2, keepdim=True))
        return torch.cat(cols, -1)


# --------------------------------------------------------------------------
# statistics and ridge
# --------------------------------------------------------------------------

def iter_batches(X, mask, bs=256):
    for s in range(0, len(X), bs):
        yield X[s:s + bs], mask[s:s + bs]


class Stats:
    """Per head: G = sum Psi^T Psi, h[t] = sum Psi^T y_t, c[t], R."""

    def __init__(self, P, targets):
        self.G = torch.zeros(H, P, P, dtype=DT)
        self.h = {t: torch.zeros(H, P, dtype=DT) for t in targets}
        self.c = {t: torch.zeros(H, dtype=DT) for t in targets}
        self.R = torch.zeros(H, dtype=DT)

    def add(self, Psi, ys, rows):                    # Psi [B, H, n, P], rows [B, H, n]
        w = rows.to(DT).unsqueeze(-1)
        Pw = Psi * w
        self.G += torch.einsum("bhnp,bhnq->hpq", Pw, Psi)
        for t, y in ys.items():
            y = torch.where(rows, y, torch.zeros_like(y))
            self.h[t] += torch.einsum("bhnp,bhn->hp", Pw, y)
            self.c[t] += (y * y).sum((0, 2))
        self.R += rows.to(DT).sum((0, 2))


RIDGES = [0.0, 1e-8, 1e-6, 1e-5, 1e-4, 1e-3, 1e-2, 1e-1]


def solve(tr, va, cols, target):
    """Per-head ridge LS on columns `cols` (index list); the ridge acts on the
    standardized Gram; chosen by validation dual MSE. Returns (coef [H, P_sub]
    in original units, chosen ridges, val RMSE)."""
    idx = torch.tensor(cols)
    coefs, lams, rmses = [], [], []
    for h in range(H):
        G = tr.G[h][idx][:, idx] / tr.R[h]
        b = tr.h[target][h][idx] / tr.R[h]
        d = torch.sqrt(torch.diag(G)).clamp_min(1e-12)
        Gs = G / d[:, None] / d[None, :]
        bs = b / d
        e, V = torch.linalg.eigh(Gs)
        Gv = va.G[h][idx][:, idx]
        hv = va.h[target][h][idx]
        best = None
        for lam in RIDGES:
            inv = torch.where(e + lam > 1e-11 * e.max(), 1.0 / (e + lam), torch.zeros_like(e))
            beta = (V * inv) @ (V.T @ bs) / d
            mse = float((beta @ Gv @ beta - 2 * beta @ hv + va.c[target][h]) / va.R[h])
            if best is None or mse < best[0] - 1e-12:
                best = (mse, lam, beta)
        coefs.append(best[2])
        lams.append(best[1])
        rmses.append(math.sqrt(max(best[0], 0.0)))
    return torch.stack(coefs), lams, rmses


# --------------------------------------------------------------------------
# experiment driver
# --------------------------------------------------------------------------

ROW_ALL = ["slices", "alpha", "f1", "f3", "f5", "g2", "g4", "aitken", "pad", "padlen", "pos"]
KEY_ALL = ["kslices", "kbeta", "kg0", "f1", "g2", "f3", "g4", "pos"]


def row_targets(ch, alpha):
    allrows = torch.ones((ch["f1"].shape[0], 1, N), dtype=torch.bool)
    return {t: center(ch[t] + alpha, allrows) for t in ("f3", "f5", "f7")}


def key_targets(ch, beta, key):
    return {t: center(torch.where(key, ch[t] + beta, torch.zeros_like(beta)), key)
            for t in ("g4", "g6")}


def layer_data(ctx, idx):
    X, mask = ctx.layer_inputs(ctx.train_x[idx])
    return X, mask


def collect(ctx, idx, side, lift=None, base_cols=None, tag=""):
    """Stats for both layers on train examples idx: side 'f' (rows) or 'g'."""
    names = ROW_ALL if side == "f" else KEY_ALL
    Xs, mask = layer_data(ctx, idx)
    out = []
    for li in range(2):
        st = None
        for X, km in iter_batches(Xs[li], mask):
            q, k, _ = qkv(ctx.mods[li], X)
            m = M(km)
            S = scores(q, k)
            ch = chain(S, m, T_TEACHER - 1)
            if side == "f":
                blk = row_blocks(q, k, m, S, ch, names)
                alpha = 0.5 * SCALE * q.pow(2).sum(-1)
                ys = row_targets(ch, alpha)
                rows = torch.ones_like(alpha, dtype=torch.bool)
            else:
                blk = key_blocks(q, k, m, S, ch, names)
                beta = 0.5 * SCALE * k.pow(2).sum(-1)
                key = m.key.expand_as(beta)
                ys = key_targets(ch, beta, key)
                rows = key
            Psi = torch.cat([blk[nm] for nm in names], -1)
            if lift is not None:
                Psi = lift[li](Psi[..., base_cols[li]], m.key.expand(Psi.shape[:3]))
            if st is None:
                st = Stats(Psi.shape[-1], list(ys))
            st.add(Psi, ys, rows)
        out.append(st)
    return out


def col_index(names, family):
    idx, s = [], 0
    for nm in names:
        w = BLOCKS.get(nm, {"kslices": 64, "kbeta": 1, "kg0": 1, "pos": N}.get(nm, 1))
        if nm == "pos":
            w = N
        if nm in family:
            idx += list(range(s, s + w))
        s += w
    return idx


# ---- operators ------------------------------------------------------------

class RowMap:
    """Predict a source dual from row features, then k closures col, row, ..."""

    def __init__(self, family, coefs, k, lift=None, base_cols=None):
        self.family, self.coefs, self.k = family, coefs, k
        self.lift, self.base_cols = lift, base_cols
        self.fp = block_passes(family)

    def duals(self, li, q, k, key_mask):
        m = M(key_mask)
        S = scores(q, k)
        # an expanded family reads its base columns out of every block (ROW_ALL
        # needs f5); the extra iterates do not enter the prediction
        ch = chain(S, m, max(self.fp, 1) if self.lift is None else 5)
        if self.lift is None:
            blk = row_blocks(q, k, m, S, ch, self.family)
            Psi = torch.cat([blk[nm] for nm in self.family], -1)
        else:
            blk = row_blocks(q, k, m, S, ch, ROW_ALL)
            base = torch.cat([blk[nm] for nm in ROW_ALL], -1)[..., self.base_cols[li]]
            Psi = self.lift[li](base, m.key.expand(base.shape[:3]))
        phi = (Psi * self.coefs[li].unsqueeze(0).unsqueeze(2)).sum(-1)
        f = phi - 0.5 * SCALE * q.pow(2).sum(-1)
        f, g = closures_from_f(S, f, m, self.k)
        return S, f, g

    def __call__(self, li, q, k, v, key_mask):
        S, f, g = self.duals(li, q, k, key_mask)
        return plan_attn(S, f, g) @ v


class KeyMap:
    """Predict a key dual g from key features, then k closures row, col, ..."""

    def __init__(self, family, coefs, k):
        self.family, self.coefs, self.k = family, coefs, k
        self.fp = block_passes(family, "g")

    def duals(self, li, q, k, key_mask):
        m = M(key_mask)
        S = scores(q, k)
        ch = chain(S, m, max(self.fp, 1))
        blk = key_blocks(q, k, m, S, ch, self.family)
        Psi = torch.cat([blk[nm] for nm in self.family], -1)
        psi = (Psi * self.coefs[li].unsqueeze(0).unsqueeze(2)).sum(-1)
        g = (psi - 0.5 * SCALE * k.pow(2).sum(-1)).masked_fill(~m.key.expand_as(psi), -INF)
        f, g = closures_from_g(S, g, m, self.k)
        return S, f, g

    def __call__(self, li, q, k, v, key_mask):
        S, f, g = self.duals(li, q, k, key_mask)
        return plan_attn(S, f, g) @ v


class OneLayer:
    """`op` on layer `li` only, the exact teacher on the other layer."""

    def __init__(self, op, li):
        self.op, self.li, self.teacher = op, li, Sinkhorn(T_TEACHER)

    def duals(self, li, q, k, key_mask):
        return (self.op if li == self.li else self.teacher).duals(li, q, k, key_mask)

    def __call__(self, li, q, k, v, key_mask):
        return (self.op if li == self.li else self.teacher)(li, q, k, v, key_mask)


class Sinkhorn:
    def __init__(self, T):
        self.T = T

    def duals(self, li, q, k, key_mask):
        m = M(key_mask)
        S = scores(q, k)
        ch = chain(S, m, self.T)
        fT = max(t for t in range(1, self.T + 1, 2))
        f = ch["f%d" % fT]
        g = ch.get("g%d" % (fT - 1 if self.T % 2 else self.T),
                   torch.zeros_like(f).masked_fill(~m.key.expand_as(f), -INF))
        if self.T == 1:
            g = torch.zeros_like(f).masked_fill(~m.key.expand_as(f), -INF)
        return S, f, g

    def __call__(self, li, q, k, v, key_mask):
        S, f, g = self.duals(li, q, k, key_mask)
        return plan_attn(S, f, g) @ v


def heldout_error(ctx, op, held):
    """Mean attention relative error over layers x examples x heads, and per layer."""
    per = []
    for li in range(2):
        X, km = held[0][li], held[1]
        q, k, _ = qkv(ctx.mods[li], X)
        m = M(km)
        S = scores(q, k)
        ch = chain(S, m, T_TEACHER)
        A_t = plan_attn(S, ch["f7"], ch["g8"])
        _, f, g = op.duals(li, q, k, km)
        A = plan_attn(S, f, g)
        err = (A - A_t).flatten(-2).norm(dim=-1) / A_t.flatten(-2).norm(dim=-1)
        per.append(float(err.mean()))
    return sum(per) / 2, per


# ---- end-to-end fit: the attention error after the closures ---------------

def layer_tensors(ctx, tokens, family, expand=None, base_cols=None):
    """Per layer: Psi [B, H, n, P], S, key mask, alpha, teacher attention A*."""
    Xs, mask = ctx.layer_inputs(tokens)
    out = []
    for li in range(2):
        parts = {"Psi": [], "S": [], "key": [], "alpha": [], "A": []}
        for X, km in iter_batches(Xs[li], mask):
            q, k, _ = qkv(ctx.mods[li], X)
            m = M(km)
            S = scores(q, k)
            ch = chain(S, m, T_TEACHER)
            if expand is None:
                blk = row_blocks(q, k, m, S, ch, family)
                Psi = torch.cat([blk[nm] for nm in family], -1)
            else:
                blk = row_blocks(q, k, m, S, ch, ROW_ALL)
                base = torch.cat([blk[nm] for nm in ROW_ALL], -1)[..., base_cols]
                Psi = expand[li](base, m.key.expand(base.shape[:3]))
            parts["Psi"].append(Psi)
            parts["S"].append(S)
            parts["key"].append(km)
            parts["alpha"].append(0.5 * SCALE * q.pow(2).sum(-1))
            parts["A"].append(plan_attn(S, ch["f7"], ch["g8"]))
        out.append({kk: torch.cat(v) for kk, v in parts.items()})
    return out


def e2e_loss(beta, d, T, k):
    phi = (T["Psi"] * beta.unsqueeze(0).unsqueeze(2)).sum(-1)
    m = M(T["key"])
    f, g = closures_from_f(T["S"], phi - T["alpha"], m, k)
    A = plan_attn(T["S"], f, g)
    At = T["A"]
    return (((A - At) ** 2).sum((-1, -2)) / (At ** 2).sum((-1, -2))).mean()


def fit_e2e(tr, va, coefs0, k, rounds=15, log_every=True):
    """Minimise the mean squared relative attention error after k closures
    over the coefficients (per head), from the LS solution; L-BFGS in
    standardized units, the round with the lowest validation loss is kept."""
    out, info = [], []
    for li in range(2):
        T, V = tr[li], va[li]
        d = T["Psi"].pow(2).mean((0, 2)).sqrt().clamp_min(1e-9)      # [H, P]
        delta = torch.zeros_like(coefs0[li]).requires_grad_(True)
        opt = torch.optim.LBFGS([delta], lr=1.0, max_iter=10, history_size=20,
                                line_search_fn="strong_wolfe")

        def closure():
            with torch.enable_grad():
                opt.zero_grad()
                loss = e2e_loss(coefs0[li] + delta / d, d, T, k)
                loss.backward()
            return loss
        with torch.no_grad():
            v0 = float(e2e_loss(coefs0[li], d, V, k))
            t0 = float(e2e_loss(coefs0[li], d, T, k))
        best = (v0, coefs0[li].clone(), 0)
        hist = [(0, t0, v0)]
        for r in range(1, rounds + 1):
            opt.step(closure)
            with torch.no_grad():
                b = coefs0[li] + delta / d
                v = float(e2e_loss(b, d, V, k))
                t = float(e2e_loss(b, d, T, k))
            hist.append((r, t, v))
            if v < best[0]:
                best = (v, b.detach().clone(), r)
        log("  e2e layer %d: train %.4f -> %.4f, val %.4f -> %.4f (best round %d)"
            % (li, hist[0][1], hist[-1][1], hist[0][2], best[0], best[2]))
        out.append(best[1])
        info.append({"history": hist, "best_round": best[2]})
    return out, info


# ---- fitting helpers ------------------------------------------------------

def fit_rows(stats, family, target):
    tr, va = stats
    cols = col_index(ROW_ALL, family)
    coefs, lams, rm = [], [], []
    for li in range(2):
        c, l, r = solve(tr[li], va[li], cols, target)
        coefs.append(c)
        lams.append(l)
        rm.append(r)
    return coefs, lams, rm


def fit_keys(stats, family, target):
    tr, va = stats
    cols = col_index(KEY_ALL, family)
    coefs, lams = [], []
    for li in range(2):
        c, l, _ = solve(tr[li], va[li], cols, target)
        coefs.append(c)
        lams.append(l)
    return coefs, lams


def report(path):
    """Markdown table of a results JSON (in the order the runs were made)."""
    with open(path) as fh:
        res = json.load(fh)
    print("| group | direction | LSE passes | held-out attn. error (L0 / L1) | agreement | "
          "accuracy (teacher 44.20%) |")
    print("|---|---|---|---|---|---|")
    for r in res:
        print("| %s | %s | %d | %.4f (%.3f / %.3f) | %.2f%% | %.2f%% (%+.2f) |"
              % (r["group"], r["label"], r["passes"], r["attn_err"], r["attn_err_layers"][0],
                 r["attn_err_layers"][1], r["agreement"], r["accuracy"],
                 r["accuracy"] - r["teacher_accuracy"]))
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=os.path.join(HERE, "text_agreement.json"))
    ap.add_argument("--only", default="", help="comma list of experiment groups to run")
    ap.add_argument("--calib", type=int, default=512)
    ap.add_argument("--report", action="store_true", help="print the table of --out and stop")
    a = ap.parse_args()
    if a.report:
        return report(a.out)
    torch.set_num_threads(1)
    torch.set_grad_enabled(False)      # autograd only inside fit_e2e
    t0 = time.time()
    ctx = Ctx()
    log("teacher accuracy %.2f%%, %.0fs" % (100 * float((ctx.teacher_pred == ctx.test_y)
                                                        .double().mean()), time.time() - t0))
    groups = set(s for s in a.only.split(",") if s) or {
        "sinkhorn", "base", "iter", "pos", "inter", "e2e", "e2e2", "layers", "calib", "side",
        "lift"}
    held = ctx.layer_inputs(ctx.test_x[ctx.held_idx])
    results = []
    if os.path.exists(a.out):
        with open(a.out) as fh:
            results = json.load(fh)
    done = {r["key"] for r in results}

    def record(key, group, label, passes, op, extra=None):
        if key in done:
            return
        t1 = time.time()
        err, per = heldout_error(ctx, op, held)
        sc = ctx.score(op)
        r = dict(key=key, group=group, label=label, passes=passes, attn_err=err,
                 attn_err_layers=per, **sc, **(extra or {}), seconds=round(time.time() - t1, 1))
        results.append(r)
        done.add(key)
        log("%-8s %-62s p=%-2s err %.4f (%.4f %.4f) agree %6.2f acc %6.2f  %.0fs"
            % (group, label, passes, err, per[0], per[1], sc["agreement"], sc["accuracy"],
               r["seconds"]))
        with open(a.out, "w") as fh:
            json.dump(results, fh, indent=1)

    if "sinkhorn" in groups:
        for T in (2, 4, 6, 7, 8):
            record("sink%d" % T, "sinkhorn", "Sinkhorn T'=%d%s" % (T, " *" if T % 2 else ""),
                   T, Sinkhorn(T))

    stats_cache = {}

    def row_stats(n):
        if n not in stats_cache:
            t1 = time.time()
            tr = collect(ctx, ctx.calib_idx(n), "f")
            va = stats_cache.get("val") or collect(ctx, ctx.val_idx(), "f")
            stats_cache["val"] = va
            stats_cache[n] = (tr, va)
            log("row stats n=%d: %.0fs" % (n, time.time() - t1))
        return stats_cache[n]

    def run_row(group, family, k, target, n=a.calib, tag="", only_layer=None):
        fp = block_passes(family)
        if only_layer is not None:
            tag += " (layer %d only)" % only_layer
        key = "%s|%s|k%d|%s|n%d%s" % (group, "+".join(family), k, target, n, tag)
        if key in done:
            return
        coefs, lams, rm = fit_rows(row_stats(n), family, target)
        op = RowMap(family, coefs, k)
        if only_layer is not None:
            op = OneLayer(op, only_layer)
        record(key, group, "%s, k=%d, target %s, N=%d%s" % ("+".join(family), k, target, n, tag),
               fp + k, op, {"family": family, "k": k, "target": target, "calib": n,
                            "ridges": lams, "val_dual_rmse": rm})

    SL = ["slices", "alpha"]
    if "base" in groups:
        # closure-ready target f7 (what asapc fits) vs k-matched target f^(8-k)
        for fam, ks in ((SL + ["f1"], (1, 3, 5)), (SL + ["f1", "f3"], (1, 3)),
                        (["alpha", "f1"], (3, 5)), (["alpha", "f1", "f3"], (1, 3))):
            for kk in ks:
                run_row("base", fam, kk, "f7")
                if kk > 1:
                    run_row("base", fam, kk, "f%d" % (T_TEACHER - kk))
    if "iter" in groups:
        run_row("iter", SL + ["f1", "f3", "g2"], 1, "f7")
        run_row("iter", SL + ["f1", "f3", "g2"], 3, "f5")
        run_row("iter", SL + ["f1", "f3", "f5"], 1, "f7")
        run_row("iter", SL + ["f1", "f3", "f5", "g2", "g4"], 1, "f7")
        run_row("iter", SL + ["f1", "f3", "f5", "aitken"], 1, "f7")
        run_row("iter", SL + ["f1", "f3", "f5", "g2", "g4", "aitken"], 1, "f7")
        run_row("iter", ["alpha", "f1", "f3", "f5"], 1, "f7")
        run_row("iter", ["alpha", "f1", "f3", "f5", "aitken"], 1, "f7")
        run_row("iter", SL + ["f1", "g2", "f3", "g4"], 1, "f7")
        run_row("iter", SL + ["f1", "g2"], 3, "f5")
        run_row("iter", ["alpha", "f1", "g2"], 3, "f5")
        run_row("iter", SL + ["f1", "g2", "f3", "g4"], 3, "f5")
    if "pos" in groups:
        for fam, kk, tg in ((SL + ["f1"], 3, "f5"), (SL + ["f1", "f3"], 3, "f5"),
                            (SL + ["f1", "f3", "f5"], 1, "f7")):
            run_row("pos", fam + ["pad"], kk, tg)
            run_row("pos", fam + ["pad", "padlen"], kk, tg)
            run_row("pos", fam + ["pad", "padlen", "pos"], kk, tg)
    def run_e2e(family, k, target, n=a.calib, expand=None, tag="", rounds=15):
        key = "e2e|%s|k%d|%s|n%d%s" % ("+".join(family), k, target, n, tag)
        if key in done:
            return
        t1 = time.time()
        if expand is None:
            coefs, lams, rm = fit_rows(row_stats(n), family, target)
            bc = None
        else:
            bc = col_index(ROW_ALL, family)
            coefs, lams = fit_expanded(family, expand, target, n)
            rm = None
        tr = layer_tensors(ctx, ctx.train_x[ctx.calib_idx(n)], family, expand, bc)
        va = layer_tensors(ctx, ctx.train_x[ctx.val_idx()], family, expand, bc)
        coefs2, info = fit_e2e(tr, va, coefs, k, rounds=rounds)
        del tr, va
        log("  e2e fit %.0fs" % (time.time() - t1))
        op = RowMap(family, coefs2, k, lift=expand, base_cols=[bc, bc] if bc else None)
        record(key, "e2e", "%s, k=%d, LS(%s) then end-to-end attention fit, N=%d%s"
               % ("+".join(family), k, target, n, tag), block_passes(family) + k, op,
               {"family": family, "k": k, "target": target, "calib": n, "ridges": lams,
                "e2e": info})

    def fit_expanded(family, expand, target, n):
        cols = col_index(ROW_ALL, family)
        bc = [cols, cols]
        ltr = collect(ctx, ctx.calib_idx(n), "f", expand, bc)
        lva = collect(ctx, ctx.val_idx(), "f", expand, bc)
        P = ltr[0].G.shape[-1]
        coefs, lams = [], []
        for li in range(2):
            c, l, _ = solve(ltr[li], lva[li], list(range(P)), target)
            coefs.append(c)
            lams.append(l)
        return coefs, lams

    def run_expanded(group, family, k, target, expand, tag, n=a.calib):
        key = "%s|%s|k%d|%s|n%d|%s" % (group, "+".join(family), k, target, n, tag)
        if key in done:
            return
        coefs, lams = fit_expanded(family, expand, target, n)
        cols = col_index(ROW_ALL, family)
        op = RowMap(family, coefs, k, lift=expand, base_cols=[cols, cols])
        record(key, group, "%s x %s, k=%d, target %s, N=%d" % ("+".join(family), tag, k, target, n),
               block_passes(family) + k, op,
               {"family": family, "k": k, "target": target, "calib": n, "expand": tag,
                "ridges": lams})

    if "inter" in groups:
        for fam, kk, tg in ((SL + ["f1", "f3"], 3, "f5"),):
            ex = [Interact(True), Interact(True)]
            run_expanded("inter", fam, kk, tg, ex, "real/pad")
            ex = [Interact(False, [8, 12, 16]), Interact(False, [8, 12, 16])]
            run_expanded("inter", fam, kk, tg, ex, "length4")
            ex = [Interact(True, [8, 12, 16]), Interact(True, [8, 12, 16])]
            run_expanded("inter", fam, kk, tg, ex, "real/pad x length4")
    if "e2e" in groups:
        run_e2e(SL + ["f1", "f3"], 3, "f5")
        run_e2e(["alpha", "f1", "f3"], 3, "f5")
        run_e2e(SL + ["f1"], 3, "f7")
        run_e2e(SL + ["f1"], 5, "f3")
    if "e2e2" in groups:
        run_e2e(SL + ["f1", "f3"], 3, "f5", n=2048, rounds=20, tag=" (20 rounds)")
    if "layers" in groups:
        for li in (0, 1):
            run_row("layers", SL + ["f1", "f3"], 3, "f5", only_layer=li)
            record("layers|sink6|%d" % li, "layers", "Sinkhorn T'=6 (layer %d only)" % li, 6,
                   OneLayer(Sinkhorn(6), li))
    if "calib" in groups:
        for n in (2048, 8192):
            for fam, kk, tg in ((SL + ["f1"], 3, "f5"), (SL + ["f1", "f3"], 3, "f5"),
                                (SL + ["f1", "f3", "f5"], 1, "f7")):
                run_row("calib", fam, kk, tg, n=n)
            if n == 2048:
                run_row("calib", SL + ["f1", "f3", "pad", "padlen", "pos"], 3, "f5", n=n)
    if "side" in groups:
        ktr = collect(ctx, ctx.calib_idx(a.calib), "g")
        kva = collect(ctx, ctx.val_idx(), "g")
        for fam, kk, tg in ((["kslices", "kbeta", "kg0"], 2, "g6"),
                            (["kslices", "kbeta", "kg0"], 4, "g4"),
                            (["kslices", "kbeta", "kg0", "f1"], 2, "g6"),
                            (["kslices", "kbeta", "kg0", "f1"], 4, "g4"),
                            (["kslices", "kbeta", "f1", "g2"], 2, "g6"),
                            (["kslices", "kbeta", "f1", "g2"], 4, "g4"),
                            (["kslices", "kbeta", "f1", "g2", "f3"], 2, "g6"),
                            (["kslices", "kbeta", "f1", "g2", "f3", "g4"], 2, "g6"),
                            ):
            key = "side|%s|k%d|%s" % ("+".join(fam), kk, tg)
            if key in done:
                continue
            coefs, lams = fit_keys((ktr, kva), fam, tg)
            op = KeyMap(fam, coefs, kk)
            record(key, "side", "key side: %s, k=%d (row first), target %s"
                   % ("+".join(fam), kk, tg), op.fp + kk, op,
                   {"family": fam, "k": kk, "target": tg, "ridges": lams})
    if "lift" in groups:
        for base, kk, tg in ((SL + ["f1", "f3"], 3, "f5"),):
            tr, va = row_stats(a.calib)
            cols = col_index(ROW_ALL, base)
            for kind, D in (("relu", 256), ("fourier", 256)):
                key = "lift|%s|%s%d|k%d|%s" % ("+".join(base), kind, D, kk, tg)
                if key in done:
                    continue
                scale = [torch.sqrt(torch.stack([torch.diag(tr[li].G[h])[cols] / tr[li].R[h]
                                                 for h in range(H)])).clamp_min(1e-9)
                         for li in range(2)]
                lift = [Lift(kind, D, len(cols), scale[li], seed=li) for li in range(2)]
                bc = [cols, cols]
                ltr = collect(ctx, ctx.calib_idx(a.calib), "f", lift, bc)
                lva = collect(ctx, ctx.val_idx(), "f", lift, bc)
                P = len(cols) + D
                coefs = []
                lams = []
                for li in range(2):
                    c, l, _ = solve(ltr[li], lva[li], list(range(P)), tg)
                    coefs.append(c)
                    lams.append(l)
                op = RowMap(base, coefs, kk, lift=lift, base_cols=bc)
                record(key, "lift", "%s + %s lift D=%d, k=%d, target %s"
                       % ("+".join(base), kind, D, kk, tg), block_passes(base) + kk, op,
                       {"family": base, "k": kk, "target": tg, "lift": kind, "D": D,
                        "ridges": lams})
    log("total %.0fs" % (time.time() - t0))


if __name__ == "__main__":
    sys.exit(main())
