#!/usr/bin/env python3
"""Do the row score statistics (score_stats) make cheaper maps as accurate as longer Sinkhorn?

For a teacher and its calibration file, fits per head by ridge least squares (plain PyTorch,
float64, python/asap_torch/reference.py) the closure-ready source dual from feature columns, on
the first NF calibration examples, and prints the held-out attention error against the teacher
(Frobenius, relative, over the rows that carry mass and the active keys) next to Sinkhorn T'.

Columns (centered per head over the rows that carry mass): alpha = (s/2)||q_i||^2; f1 = the
softmax dual row(0) + alpha; f3 = row(col(f1)) + alpha; mx, mu, sd = the max, mean and
standard deviation of row i's scores S_ij = s q_i.k_j over the active keys (docs/asap-math.md
section 6c); mxc, vc = the max and the variance of row i of S_ij - c_j, c_j the mean of key j's
scores over the rows that carry mass (section 6d; "+cstats"). The maps' closures alternate column,
row, ... from the predicted dual.

  /usr/bin/python3 tools/experiments/score_stats_maps.py calib_data/vit_mnist_t6 [NF] [--variants]
  /usr/bin/python3 tools/experiments/score_stats_maps.py out/teachers/text_wordnet_t8 [NF] [--variants]

--variants prints instead the column-side statistics tried before centered_stats was chosen
(docs/decisions.md, "The column-centered row statistics"), each added to alpha+mx+mu+sd, with
k = 1 and k = 3: var = sd^2; top2 = the second largest score; the row statistics (max, mean,
variance; sd its root) of S_ij - c_j (c), of S_ij - max_i S_ij (x), of S_ij + g_j with g a
Gaussian (mean + variance / 2) column closure of S (g) or of S + f0, f0 = -(mu + var / 2) (3).

(the argument is the path without .pt / .spec.json / .calib.h5; NF defaults to 400 of 512).
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
VARIANTS = "--variants" in sys.argv[1:]
args = [a for a in sys.argv[1:] if a != "--variants"]
base = args[0]
NF = int(args[1]) if len(args) > 1 else 400
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
    rows = m.row_active.unsqueeze(-1)
    c = torch.where(rows & key, S, torch.zeros(())).sum(-2, keepdim=True) / rows.sum(-2, keepdim=True)
    Sc = S - c
    muc = torch.where(key, Sc, torch.zeros(())).sum(-1) / cnt
    cols = {"alpha": alpha, "f1": f1 + alpha, "f3": R.row_closure(S, col(f1), m, eps) + alpha,
            "mx": S.amax(-1), "mu": mu, "sd": sd, "mxc": Sc.amax(-1),
            "vc": torch.where(key, (Sc - muc.unsqueeze(-1)) ** 2, torch.zeros(())).sum(-1) / cnt}
    if VARIANTS:
        cols.update(variant_columns(S, key, rows, cnt, mu, sd, eps))
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

    print("%s (T = %d, %s-ending; %d examples fitted, %d held out)"
          % (L["name"], T, "column" if T % 2 == 0 else "row", NF, B - NF))
    if VARIANTS:
        print("| columns | k = 1 | k = 3 |")
        print("|---|---:|---:|")
        base = ["alpha", "mx", "mu", "sd"]
        for extra in ([], ["var"], ["top2"], ["mxc", "sdc"], ["mxc", "vc"], ["mxc", "sdc", "vc"], ["mxx", "mux", "sdx"],
                      ["mxg", "mug", "sdg"], ["mx3", "mu3", "var3"]):
            names = base + extra
            print("| %s | %.4f | %.4f |" % ("+".join(names), row_map(names, 1), row_map(names, 3)))
        print()
        return
    print("| operator | passes | held-out attention error |")
    print("|---|---:|---:|")
    for Tp in range(2, T):
        print("| Sinkhorn T' = %d | %d | %.4f |" % (Tp, Tp, err(R.plan_attention(S, *loop(Tp), eps, True))))
    parity = 1 if T % 2 == 0 else 0  # the map's last closure ends on the teacher's marginal
    st, cst = ["mx", "mu", "sd"], ["mx", "mu", "sd", "mxc", "vc"]
    for names in (["alpha"], ["alpha"] + st, ["alpha"] + cst, ["alpha", "f1"], ["alpha", "f1"] + st,
                  ["alpha", "f1"] + cst, ["alpha", "f1", "f3"], ["alpha", "f1", "f3"] + st, ["alpha", "f1", "f3"] + cst):
        fp = 3 if "f3" in names else 1 if "f1" in names else 0
        for kc in range(1, T - fp + 1):
            if kc % 2 == parity:
                print("| map %s, k = %d | %d | %.4f |" % ("+".join(names), kc, fp + kc, row_map(names, kc)))
    print()


def variant_columns(S, key, rows, cnt, mu, sd, eps):
    """The --variants columns (see the module's docstring)."""
    live = rows & key
    nrows = rows.sum(-2, keepdim=True)

    def row_stats(X):  # max, mean, variance over the active keys
        mean = torch.where(key, X, torch.zeros(())).sum(-1) / cnt
        var = torch.where(key, (X - mean.unsqueeze(-1)) ** 2, torch.zeros(())).sum(-1) / cnt
        return torch.where(key, X, torch.full((), -INF)).amax(-1), mean, var

    def col_stats(X):  # mean, variance over the rows with mass
        mean = torch.where(live, X, torch.zeros(())).sum(-2, keepdim=True) / nrows
        return mean, torch.where(live, (X - mean) ** 2, torch.zeros(())).sum(-2, keepdim=True) / nrows

    out = {"var": sd ** 2, "top2": S.topk(2, -1).values[..., 1] if S.shape[-1] > 1 else S.amax(-1)}
    c, cv = col_stats(S)
    cmx = torch.where(live, S, torch.full((), -INF)).amax(-2, keepdim=True)
    f0 = -(mu + sd ** 2 / (2 * eps))
    c2, cv2 = col_stats(S + f0.unsqueeze(-1))
    for tag, X in (("c", S - c), ("x", S - cmx), ("g", S - c - cv / (2 * eps)), ("3", S - c2 - cv2 / (2 * eps))):
        mx, mean, var = row_stats(X)
        out.update({"mx" + tag: mx, "mu" + tag: mean, "sd" + tag: var.sqrt(), "var" + tag: var})
    return out


for L in spec["layers"]:
    layer_table(L)
