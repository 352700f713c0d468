#!/usr/bin/env python3
"""The PyTorch Sinkformer loop, timed for asap_bench (docs/performance.md).

A straightforward PyTorch implementation of Sinkformer attention as the
official code computes it (michaelsdr/sinkformers, ``SinkhornDistance``):
scores, then ``max_iter`` = T log-domain half-steps alternating the row dual
u and the column dual v with ``torch.logsumexp``, the plan times n, and the
head output plan @ v. Run with Debian's interpreter and LibTorch, at the same
sizes and thread count as the C++ benchmark:

    /usr/bin/python3 tools/bench_pytorch.py --n 512,1024 --bh 1x4,4x4 --T 6,10,20 \\
        --d 64 --threads 2 --reps 3 --json out.json
"""
import argparse
import json
import math
import os
import statistics
import sys
import time

import torch


class SinkhornDistance(torch.nn.Module):
    """The official SinkhornDistance forward (log domain, eps, max_iter half-steps)."""

    def __init__(self, eps, max_iter):
        super().__init__()
        self.eps = eps
        self.max_iter = max_iter

    def forward(self, c):
        C = -c
        x_points = C.shape[-2]
        y_points = C.shape[-1]
        batch_size = C.shape[0]
        mu = torch.empty(batch_size, x_points, dtype=C.dtype, device=C.device).fill_(1.0 / x_points).squeeze()
        nu = torch.empty(batch_size, y_points, dtype=C.dtype, device=C.device).fill_(1.0 / y_points).squeeze()
        u = torch.zeros_like(mu)
        v = torch.zeros_like(nu)
        for i in range(self.max_iter):
            if i % 2 == 0:
                u = self.eps * (torch.log(mu) - torch.logsumexp(self.M(C, u, v), dim=-1)) + u
            else:
                v = self.eps * (torch.log(nu) - torch.logsumexp(self.M(C, u, v).transpose(-2, -1), dim=-1)) + v
        pi = torch.exp(self.M(C, u, v))
        return pi, C, u, v

    def M(self, C, u, v):
        return (-C + u.unsqueeze(-1) + v.unsqueeze(-2)) / self.eps


def sinkformer_attention(q, k, v, scale, T):
    """Sinkformer head outputs: batch dims B*H flattened as the official code does."""
    B, H, n, d = q.shape
    dots = torch.matmul(q, k.transpose(-1, -2)) * scale
    sink = SinkhornDistance(eps=1.0, max_iter=T)
    pi = sink(dots.reshape(B * H, n, n))[0].reshape(B, H, n, n)
    attn = pi * n
    return torch.matmul(attn, v)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", default="128,256,512,1024")
    ap.add_argument("--bh", default="1x4,4x4")
    ap.add_argument("--T", default="6,10,20")
    ap.add_argument("--d", type=int, default=64)
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--json", required=True)
    a = ap.parse_args()
    if a.threads > 0:
        torch.set_num_threads(a.threads)
    ns = [int(x) for x in a.n.split(",") if x]
    bhs = [tuple(int(y) for y in x.split("x")) for x in a.bh.split(",") if x]
    Ts = [int(x) for x in a.T.split(",") if x]
    results = []
    with torch.no_grad():
        for n in ns:
            for (B, H) in bhs:
                g = torch.Generator().manual_seed(1)
                q = torch.randn(B, H, n, a.d, generator=g)
                k = torch.randn(B, H, n, a.d, generator=g)
                v = torch.randn(B, H, n, a.d, generator=g)
                scale = 1.0 / math.sqrt(a.d)
                for T in Ts:
                    t0 = time.perf_counter()
                    sinkformer_attention(q, k, v, scale, T)  # warm-up
                    warm = time.perf_counter() - t0
                    reps = a.reps if warm < 5.0 else 1
                    times, cpu = [], []
                    for _ in range(reps):
                        c0, t0 = time.process_time(), time.perf_counter()
                        sinkformer_attention(q, k, v, scale, T)
                        times.append(time.perf_counter() - t0)
                        cpu.append(time.process_time() - c0)
                    r = {"op": "pytorch_loop", "param": T, "n": n, "B": B, "H": H, "d": a.d,
                         "median_s": statistics.median(times), "min_s": min(times),
                         "cpu_median_s": statistics.median(cpu), "times_s": times}
                    print("n=%5d BxH=%dx%d pytorch_loop_%d median %10.4f ms" % (n, B, H, T, 1e3 * r["median_s"]),
                          file=sys.stderr)
                    results.append(r)
    info = {"torch": torch.__version__, "threads": torch.get_num_threads(),
            "openblas_coretype_env": os.environ.get("OPENBLAS_CORETYPE", ""),
            "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY", "")}
    with open(a.json, "w") as f:
        json.dump({"info": info, "results": results}, f, indent=1)


if __name__ == "__main__":
    main()
