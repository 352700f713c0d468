#!/usr/bin/env python3
"""A longer-sequence compile case for the throughput benchmark (issue 9).

The bundled MNIST teacher has n = 17 tokens, where everything but the
Sinkhorn loop dominates a compile. This writes a case with the same trained
attention weights at a longer n:

* ``throughput.pt``: the bundled teacher's ``transformer.*`` weights only (no
  patch or position embedding, so any n is valid), as a plain state dict;
* ``throughput.spec.json``: the bundled spec (same layer names, T, eps);
* ``throughput.calib.h5``: calibration activations recorded by
  ``record_calib.record`` from the teacher's own transformer run on
  sequences of n tokens drawn at random from the bundled calibration
  activations of layer 0 (real token statistics, no extra data needed).

    /usr/bin/python3 tools/bench/make_throughput_case.py --n 256 --examples 512 --out out/throughput
"""
import argparse
import json
import os
import shutil
import sys

import h5py
import numpy as np
import torch
from torch import nn

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))  # tools/: sinkformer_models
import sinkformer_models as sm  # noqa: E402
from record_calib import record  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(HERE))
BUNDLED = os.path.join(ROOT, "calib_data", "vit_mnist_t6")


class Wrapper(nn.Module):
    def __init__(self, T):
        super().__init__()
        self.transformer = sm.Transformer(dim=64, depth=2, heads=4, dim_head=16, mlp_dim=128,
                                          max_iter=T, eps=1)

    def forward(self, x):
        return self.transformer(x)[0]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=256, help="tokens per example")
    ap.add_argument("--examples", type=int, default=512, help="calibration examples")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", required=True, help="output directory")
    a = ap.parse_args(argv)
    if a.n < 2 or a.examples < 1:
        ap.error("--n must be at least 2 and --examples at least 1")
    os.makedirs(a.out, exist_ok=True)
    ck = torch.load(BUNDLED + ".pt", map_location="cpu")
    T = int(ck["config"]["model"].get("T", 6))
    model = Wrapper(T)
    sd = {k: v for k, v in ck["model_state_dict"].items() if k.startswith("transformer.")}
    model.load_state_dict(sd)
    model.eval()
    torch.save(model.state_dict(), os.path.join(a.out, "throughput.pt"))
    shutil.copyfile(BUNDLED + ".spec.json", os.path.join(a.out, "throughput.spec.json"))
    with open(os.path.join(a.out, "throughput.spec.json")) as f:
        spec = json.load(f)
    names = [l["name"] for l in spec["layers"]]
    with h5py.File(BUNDLED + ".calib.h5", "r") as f:
        tokens = np.asarray(f["layers"][names[0]]["x"]).reshape(-1, 64)
    rng = np.random.default_rng(a.seed)
    chunk = 32

    def batches():
        for s in range(0, a.examples, chunk):
            b = min(chunk, a.examples - s)
            idx = rng.integers(0, tokens.shape[0], size=(b, a.n))
            yield torch.from_numpy(tokens[idx]).float()

    record(model, names, batches(), os.path.join(a.out, "throughput.calib.h5"), total=a.examples, quiet=True)
    print(f"wrote {a.out}/throughput.{{pt,spec.json,calib.h5}}: n = {a.n}, {a.examples} examples, T = {T}")


if __name__ == "__main__":
    main()
