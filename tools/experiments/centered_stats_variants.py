#!/usr/bin/env python3
"""Which column-side row statistics to add to score_stats (docs/decisions.md, "The column-centered
row statistics"): the variants tried before centered_stats was chosen, as ridge LS maps per head
(the method of score_stats_maps.py), each with k = 1 and k = 3 closures; held-out attention error.

Columns beyond score_stats_maps.py's: var = sd^2; top2 = the second largest score; *c = the row
statistics of S_ij - c_j (c_j the column mean over the rows with mass; muc, varc, mxc, sdc); *x =
of S_ij - max_i S_ij; *g = of S_ij + g_j with g a Gaussian (mean + variance / 2) column closure;
*3 = of S_ij + g_j with g from such a closure of f0 = -(mu + var / 2).

  /usr/bin/python3 tools/experiments/centered_stats_variants.py calib_data/vit_mnist_t6 [NF]
"""
import json
import os
import sys

import h5py
import torch

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
sys.path.insert(0, os.path.join(ROOT, "python"))
from asap_torch import reference as R  # noqa: E402

torch.set_default_dtype(torch.float64)
INF = float("inf")
base = sys.argv[1]
NF = int(sys.argv[2]) if len(sys.argv) > 2 else 400
spec = json.load(open(base + ".spec.json"))
ck = torch.load(base + ".pt", map_location="cpu")
ck = ck.get("model_state_dict", ck)
calib = h5py.File(base + ".calib.h5", "r")
mask = torch.from_numpy(calib["mask"][()]).bool() if "mask" in calib else None


def proj(x, part):
    y = x @ ck[part["weight"]].double().T
    return y + ck[part["bias"]].double() if part.get("bias") else y


def layer_table(L):
    H, DH, s, eps, T = L["heads"], L["head_dim"], L["score_scale"], L["eps"], L["T"]
    x = torch.from_numpy(calib["layers/%s/x" % L["name"]][()]).double()
    if L["layout"] == "fused":
        q, k, _ = proj(x, L["qkv"]).chunk(3, -1)
    else:
        q, k = proj(x, L["q"]), proj(x, L["k"])
    B, n, _ = q.shape
    q, k = (t.view(B, n, H, DH).transpose(1, 2) for t in (q, k))
    m = R.Marginals(mask, B, n, L["mask"] == "drop_queries", q.dtype, q.device)
    key = m.key_active.unsqueeze(-2)                       # [B, 1, 1, n]
    S = R.scores(q, k, s).masked_fill(~key, -INF)

    def col(f):  # a column closure with padded keys at -inf (not NaN)
        return R.col_closure(S, f, m, eps).masked_fill(~m.key_active.expand(B, H, n), -INF)

    g0 = torch.zeros((B, H, n)).masked_fill(~m.key_active, -INF)

    def loop(steps, f=None, first_col=False):
        g = g0
        for t in range(steps):
            if (t % 2 == 0) == first_col:
                g = col(f)
            else:
                f = R.row_closure(S, g, m, eps)
        return f, g

    fT, gT = loop(T)
    At = R.plan_attention(S, fT, gT, eps, True)
    live = (m.row_active.unsqueeze(-1) & key).expand_as(At)[NF:]

    def err(A):
        d = torch.where(live, (A - At)[NF:], torch.zeros(()))
        t = torch.where(live, At[NF:], torch.zeros(()))
        return ((d ** 2).sum() / (t ** 2).sum()).sqrt().item()

    alpha = R.cost_alpha(q, s)
    cnt = key.sum(-1).double()
    mu = torch.where(key, S, torch.zeros(())).sum(-1) / cnt
    sd = (torch.where(key, (S - mu.unsqueeze(-1)) ** 2, torch.zeros(())).sum(-1) / cnt).sqrt()
    f1 = R.row_closure(S, g0, m, eps)
    eps_ = eps
    Sk = torch.where(key, S, torch.zeros(()))
    var = sd**2
    # second max
    top2 = S.topk(2, -1).values[..., 1] if n > 1 else S.amax(-1)
    mx = S.amax(-1)
    # column stats over active rows
    ract = m.row_active.unsqueeze(-1)
    Sr = torch.where(ract & key, S, torch.zeros(()))
    rcnt = m.row_active.sum(-1, keepdim=True).double().unsqueeze(-1)
    cmu = Sr.sum(-2, keepdim=True) / rcnt
    cvar = torch.where(ract & key, (S - cmu)**2, torch.zeros(())).sum(-2, keepdim=True) / rcnt
    # gaussian approx of a column closure from f0 = -(mu + var/2eps): g_j ~ -colLSE(S+f0)
    f0 = -(mu + var/(2*eps_))
    Sf = S + f0.unsqueeze(-1)
    cm2 = torch.where(ract & key, Sf, torch.zeros(())).sum(-2, keepdim=True) / rcnt
    cv2 = torch.where(ract & key, (Sf - cm2)**2, torch.zeros(())).sum(-2, keepdim=True) / rcnt
    gA = -(cm2 + cv2/(2*eps_))
    Sg = torch.where(key, S + gA, torch.zeros(()))
    mu3 = Sg.sum(-1)/cnt
    var3 = (torch.where(key, (S + gA - mu3.unsqueeze(-1))**2, torch.zeros(())).sum(-1)/cnt)
    mx3 = torch.where(key, S + gA, torch.full((), -INF)).amax(-1)
    Sc = S - cmu
    muc = torch.where(key, Sc, torch.zeros(())).sum(-1)/cnt
    varc = torch.where(key, (Sc-muc.unsqueeze(-1))**2, torch.zeros(())).sum(-1)/cnt
    mxc = torch.where(key, Sc, torch.full((), -INF)).amax(-1)
    f1 = R.row_closure(S, g0, m, eps)
    cols = {"alpha": alpha, "f1": f1 + alpha, "f3": R.row_closure(S, col(f1), m, eps) + alpha,
            "mx": mx, "mu": mu, "sd": sd, "var": var, "top2": top2, "mx2": mx**2, "mxsd": mx*sd,
            "mu3": mu3, "var3": var3, "mx3": mx3, "muc": muc, "varc": varc, "mxc": mxc, "sdc": varc.sqrt(),
            "sd3": var3.sqrt(), "sd3c": var3*var3}
    target = R.center_rows(fT + alpha, m)
    act = m.row_active.expand(B, H, n)

    def row_map(names, k_closures):
        Psi = torch.stack([R.center_rows(cols[c], m) for c in names], -1)
        pred = torch.zeros((B, H, n))
        for h in range(H):
            X, y = Psi[:NF, h][act[:NF, h]], target[:NF, h][act[:NF, h]]
            G = X.T @ X
            b = torch.linalg.solve(G + 1e-6 * G.diagonal().mean() * torch.eye(len(names)), X.T @ y)
            pred[:, h] = Psi[:, h] @ b
        f, g = loop(k_closures, pred - alpha, first_col=True)
        return err(R.plan_attention(S, f, g, eps, True))

    print(L["name"])
    for Tp in range(2, T):
        print("Sinkhorn T'=%d %.4f" % (Tp, err(R.plan_attention(S, *loop(Tp), eps, True))))
    cmx = torch.where(ract & key, S, torch.full((), -INF)).amax(-2, keepdim=True)
    Sx = S - cmx
    cols["mxx"] = torch.where(key, Sx, torch.full((), -INF)).amax(-1)
    mux = torch.where(key, Sx, torch.zeros(())).sum(-1)/cnt
    cols["mux"] = mux
    cols["sdx"] = (torch.where(key, (Sx-mux.unsqueeze(-1))**2, torch.zeros(())).sum(-1)/cnt).sqrt()
    Sgc = S - cmu - cvar/(2*eps_)
    mug = torch.where(key, Sgc, torch.zeros(())).sum(-1)/cnt
    cols["mug"] = mug
    cols["mxg"] = torch.where(key, Sgc, torch.full((), -INF)).amax(-1)
    cols["sdg"] = (torch.where(key, (Sgc-mug.unsqueeze(-1))**2, torch.zeros(())).sum(-1)/cnt).sqrt()
    base = ["alpha", "mx", "mu", "sd"]
    sets = [base, base+["var"], base+["top2"], base+["mxc","sdc"], base+["mxc","varc"], base+["mxc","sdc","varc"], base+["mxx","mux","sdx"], base+["mxg","mug","sdg"], base+["mu3","var3","mx3"]]
    for names in sets:
        print("%-50s k1 %.4f  k3 %.4f" % ("+".join(names), row_map(names, 1), row_map(names, 3)))
    for names in (["alpha","f1"]+base[1:], ["alpha","f1"]+base[1:]+["mxc","sdc"], ["alpha","f1","f3"]+base[1:]+["mxc","sdc"]):
        print("%-50s k1 %.4f  k3 %.4f" % ("+".join(names), row_map(names, 1), row_map(names, 3)))
    print()


for L in spec["layers"]:
    layer_table(L)
