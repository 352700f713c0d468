#!/usr/bin/env python3
"""The released Sinkformer MNIST configuration (michaelsdr/sinkformers,
vit-pytorch/one_expe_mnist.py: ViT_only_Att, dim 128, depth 1, heads 1 of
64, mlp 128, patch 7 so n = 17, n_it = 5, eps 1), the same with patch 4
(n = 50, released4), or the issue's n = 50 ViT (p4: patch 4, our 2 layers of
4 heads of 16), trained here with
tools/train/train_teachers.py, and the test-split agreement of compiled
artifacts with it.

    released_vit.py train OUT [--T 5] [--epochs 12] [--config released|released4|p4]
        -> OUT/released_t5.{pt,spec.json,calib.h5,heldout.h5}
    released_vit.py agree TEACHER.pt ARTIFACT [ARTIFACT ...] [--config ...]
        -> per artifact: test accuracy and agreement with the teacher

Run with Debian's interpreter (${PYTHON:-/usr/bin/python3}); the MNIST
data from tools/train/fetch_data.sh. tools/experiments/released_vit.sh runs
both around asapc (docs/decisions.md, "The fidelity guard").
"""
import argparse
import copy
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
for d in (os.path.join(ROOT, "tools", "train"), os.path.join(ROOT, "tools"), os.path.join(ROOT, "python")):
    if d not in sys.path:
        sys.path.insert(0, d)

CONFIGS = {
    # one_expe_mnist.py's model: ViT_only_Att(image_size=28, patch_size=7, dim=128, depth=1, heads=1,
    # mlp_dim=128) with vit-pytorch's default dim_head 64
    "released": dict(dim=128, depth=1, heads=1, dim_head=64, mlp_dim=128, attn_only=True),
    # the same with --ps 4 (n = 50), one of the patch sizes of run_expe_mnist.py
    "released4": dict(dim=128, depth=1, heads=1, dim_head=64, mlp_dim=128, attn_only=True, patch_size=4),
    "p4": dict(patch_size=4),
}


def setup(config):
    import train_teachers as tt
    if config not in CONFIGS:
        raise SystemExit("released_vit.py: --config expects one of %s, found %r" % (", ".join(CONFIGS), config))
    tt.VIT_CONFIG.update(CONFIGS[config])
    return tt


def train(a):
    tt = setup(a.config)
    name = "%s_t%d" % (a.config, a.T)
    tt.TEACHERS[name] = (name, "vit", a.T, a.epochs, a.lr)
    return tt.main(["--which", name, "--out", a.out, "--threads", "1", "--epochs", str(a.epochs)])


def attention_errors(a, ref):
    """Mean over examples and heads of ||A - A*||_F / ||A*||_F for [N, H, n, n]
    attention, whole and on the class token's row alone (row 0: the only row
    a class-token classifier reads from the last layer)."""
    def rel(x, y):
        return float(((x - y).norm(dim=-1) / y.norm(dim=-1)).mean())
    return rel(a.flatten(-2), ref.flatten(-2)), rel(a[..., 0, :], ref[..., 0, :])


def agree(a):
    import torch
    import asap_torch
    tt = setup(a.config)
    for p in [a.teacher] + a.artifacts:
        if not os.path.exists(p):
            print("released_vit.py agree: expected the file '%s', found none" % p, file=sys.stderr)
            return 2
    torch.set_num_threads(2)
    model, cfg = tt.load_teacher(a.teacher)
    x, y = tt.teacher_data(cfg, "test")

    def preds(m):
        # predictions and the last layer's attention [N, H, n, n]
        outs, attn = [], []
        with torch.no_grad():
            for s in range(0, len(x), 1000):
                logits, weights = m(x[s:s + 1000])
                outs.append(logits.argmax(-1))
                attn.append(torch.as_tensor(weights[-1]))
        return torch.cat(outs), torch.cat(attn)

    pt, at = preds(model)
    print("teacher: accuracy %.2f%% on %d test examples" % (100 * float((pt == y).float().mean()), len(y)))
    for art in a.artifacts:
        m = copy.deepcopy(model)
        asap_torch.patch_model(m, art)
        p, am = preds(m)
        full, cls = attention_errors(am, at)
        print("%s: accuracy %.2f%%, agreement with the teacher %.2f%% (last layer's attention error %.3f, "
              "class-token row %.3f)" % (art, 100 * float((p == y).float().mean()), 100 * float((p == pt).float().mean()),
                                        full, cls))
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    t = sub.add_parser("train")
    t.add_argument("out")
    t.add_argument("--T", type=int, default=5)
    t.add_argument("--epochs", type=int, default=12)
    t.add_argument("--lr", type=float, default=1e-3)
    t.add_argument("--config", default="released")
    g = sub.add_parser("agree")
    g.add_argument("teacher")
    g.add_argument("artifacts", nargs="+")
    g.add_argument("--config", default="released")
    a = ap.parse_args()
    return train(a) if a.cmd == "train" else agree(a)


if __name__ == "__main__":
    sys.exit(main())
