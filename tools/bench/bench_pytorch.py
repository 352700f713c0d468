#!/usr/bin/env python3
"""The PyTorch Sinkformer loop, timed for asap_bench (docs/performance.md).

A straightforward PyTorch implementation of Sinkformer attention as the
official code computes it (michaelsdr/sinkformers, ``SinkhornDistance``):
scores, then ``max_iter`` = T log-domain half-steps alternating the row dual
u and the column dual v with ``torch.logsumexp``, the plan times n, and the
head output plan @ v. Run with Debian's interpreter and LibTorch, at the same
sizes and thread count as the C++ benchmark:

    /usr/bin/python3 tools/bench/bench_pytorch.py --n 512,1024 --bh 1x4,4x4 --T 6,10,20 \\
        --d 64 --threads 2 --reps 3 --json out.json

With --exact it instead times, in one process on the same threads and
round-robin (medians), a Sinkformer attention module's own PyTorch loop
against the same module patched with ``asap_torch.patch_model(model,
exact=True)`` (asapc's fused teacher, torch.ops.asap.teacher), at the
Sinkformer shapes and one long shape, once per runtime setting (--settings:
OpenMP's wait policy PASSIVE, as asap_bench runs, by default; also unset,
as a plain Python process runs, or ACTIVE; each in its own child process,
OpenMP and OpenBLAS pinned to --threads), and prints the table with the ratios (``tools/bench/bench.sh
--exact`` runs it; ``--md docs/python.md`` rewrites the table between the
``<!-- exact:begin -->`` and ``<!-- exact:end -->`` markers):

    /usr/bin/python3 tools/bench/bench_pytorch.py --exact --threads 2 --md docs/python.md
"""
import argparse
import copy
import ctypes
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
TOOLS = os.path.dirname(HERE)  # sinkformer_models
REPO = os.path.dirname(TOOLS)


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


# --------------------------------------------------------------------------
# --exact: the fused exact teacher (patch_model(exact=True)) vs the PyTorch loop
# --------------------------------------------------------------------------

# kind:n:BxH:d:T. The Sinkformer shapes (MNIST ViT, patch 4: n = 50; the
# text teacher: n = 32, padded) and one long sequence.
EXACT_SHAPES = "vit:50:16x4:16:6,text:32:16x4:16:8,vit:1024:1x4:64:6"
BEGIN_EXACT, END_EXACT = "<!-- exact:begin -->", "<!-- exact:end -->"


def _openblas_core():
    """The OpenBLAS core selected at load time ('' when not found)."""
    libs = set()
    try:
        with open("/proc/self/maps") as f:
            for line in f:
                parts = line.split()
                if len(parts) >= 6 and "openblas" in parts[-1] and ".so" in parts[-1]:
                    libs.add(parts[-1])
    except OSError:
        return ""
    for lib in sorted(libs):
        try:
            fn = ctypes.CDLL(lib).openblas_get_corename
        except (OSError, AttributeError):
            continue
        fn.restype = ctypes.c_char_p
        return fn().decode()
    return ""


# Runtime settings of --exact, each measured in its own child process:
# OMP_WAIT_POLICY (None = unset: GNU OpenMP spins a little, then sleeps).
SETTINGS = {"default": None, "passive": "PASSIVE", "active": "ACTIVE"}
SETTING_NOTE = {"default": "`OMP_WAIT_POLICY` unset (what a Python user gets)",
                "passive": "`OMP_WAIT_POLICY=PASSIVE` (as asap_bench)",
                "active": "`OMP_WAIT_POLICY=ACTIVE`"}


def runtime_env(threads, setting, blas_threads=None):
    """The environment of one --exact child: OpenMP threads = `threads`,
    OpenBLAS threads = `blas_threads` (default: the same), the wait policy
    of `setting` and, as asap_bench does, the core type the CPU has when
    OpenBLAS fell back to its SSE3 'Prescott' kernels on a CPU it does not
    know (else every LibTorch matmul of the PyTorch loop is ~8x slower)."""
    env = dict(os.environ, ASAP_BENCH_REEXEC="1", OMP_NUM_THREADS=str(threads),
               OPENBLAS_NUM_THREADS=str(blas_threads or threads))
    env.pop("OMP_WAIT_POLICY", None)
    if SETTINGS[setting]:
        env["OMP_WAIT_POLICY"] = SETTINGS[setting]
    if "OPENBLAS_CORETYPE" not in env and _openblas_core() == "Prescott":
        flags = open("/proc/cpuinfo").read()
        core = "SkylakeX" if " avx512f" in flags else "Haswell" if " avx2" in flags else ""
        if core:
            env["OPENBLAS_CORETYPE"] = core
    return env


def _cpu_name():
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
        for line in out.splitlines():
            if line.startswith("Model name:"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def _exact_case(kind, n, B, H, d, T, seed=1):
    """(module, inputs): a Sinkformer attention module (tools/sinkformer_models.py)
    and its inputs; text batches are padded (lengths n/2..n)."""
    sys.path.insert(0, TOOLS)
    import sinkformer_models as sm
    torch.manual_seed(seed)
    g = torch.Generator().manual_seed(seed)
    if kind == "vit":
        mod = sm.Attention(H * d, heads=H, dim_head=d, max_iter=T).eval()
        return mod, (torch.randn(B, n, H * d, generator=g),)
    mod = sm.MultiHeadAttention(H * d, H, n_it=T).eval()
    x = torch.randn(B, n, H * d, generator=g)
    lengths = torch.randint(n // 2, n + 1, (B,), generator=g)
    pad = torch.arange(n).unsqueeze(0) >= lengths.unsqueeze(1)          # [B, n] True = padded
    return mod, (x, x, x, pad.unsqueeze(1).expand(B, n, n))


def _time_round_robin(fns, reps, min_sample_s=0.05):
    """Median seconds per call of each fn, timed round-robin: every repeat
    runs each fn once (a sample of `inner` calls when one call is short)."""
    inner = []
    for fn in fns:                       # warm-up, and calls per sample
        fn()
        t0 = time.perf_counter()
        fn()
        dt = max(time.perf_counter() - t0, 1e-6)
        inner.append(max(1, min(1000, int(math.ceil(min_sample_s / dt)))))
    times = [[] for _ in fns]
    for _ in range(reps):
        for i, fn in enumerate(fns):
            t0 = time.perf_counter()
            for _ in range(inner[i]):
                fn()
            times[i].append((time.perf_counter() - t0) / inner[i])
    return [statistics.median(t) for t in times], times


def measure_exact(a):
    """One child of --exact: the rows of every shape, in this process's
    runtime settings."""
    sys.path[:0] = [TOOLS, os.path.join(REPO, "python")]   # python/: asap_torch
    import asap_torch
    if not asap_torch.op_available():
        raise SystemExit("bench_pytorch.py --exact: %s is not available (%s); build the target "
                         "asap_torch_op or set ASAP_TORCH_OP" % (asap_torch.LIB_NAME,
                                                                 asap_torch.library_error()))
    rows = []
    with torch.no_grad():
        for spec in [x for x in a.shapes.split(",") if x]:
            kind, n, bh, d, T = spec.split(":")
            n, d, T = int(n), int(d), int(T)
            B, H = (int(y) for y in bh.split("x"))
            teacher, inputs = _exact_case(kind, n, B, H, d, T)
            exact = asap_torch.patch_model(copy.deepcopy(teacher), exact=True, backend="op")
            exact_na = asap_torch.patch_model(copy.deepcopy(teacher), exact=True, backend="op",
                                              return_attention=False)
            # the drop-in gives the teacher's numbers
            (y0, A0), (y1, A1) = teacher(*inputs), exact(*inputs)
            err = max(float((y0 - y1).abs().max()), float((A0 - A1).abs().max()))
            # head level: the official SinkhornDistance loop vs torch.ops.asap.teacher
            g = torch.Generator().manual_seed(2)
            q, k, v = (torch.randn(B, H, n, d, generator=g) for _ in range(3))
            scale = d ** -0.5
            fns = [lambda: teacher(*inputs), lambda: exact(*inputs), lambda: exact_na(*inputs),
                   lambda: sinkformer_attention(q, k, v, scale, T),
                   lambda: torch.ops.asap.teacher(q, k, v, None, scale, T, 1.0, False, True, False)]
            med, times = _time_round_robin(fns, a.reps)
            r = {"setting": a.child, "kind": kind, "n": n, "B": B, "H": H, "d": d, "T": T,
                 "max_abs_diff": err, "module_pytorch_s": med[0], "module_exact_s": med[1],
                 "module_exact_noattn_s": med[2], "head_pytorch_s": med[3],
                 "head_exact_s": med[4], "times_s": times}
            rows.append(r)
            print("%-7s %-4s n=%4d BxH=%dx%d d=%d T=%d  module: loop %.3f ms, exact %.3f ms "
                  "(%.2fx), exact no attention %.3f ms (%.2fx); heads: loop %.3f ms, "
                  "asap::teacher %.3f ms (%.2fx); max |diff| %.1e"
                  % (a.child, kind, n, B, H, d, T, 1e3 * med[0], 1e3 * med[1], med[0] / med[1],
                     1e3 * med[2], med[0] / med[2], 1e3 * med[3], 1e3 * med[4], med[3] / med[4],
                     err), file=sys.stderr)
    info = {"torch": torch.__version__, "threads": torch.get_num_threads(), "reps": a.reps,
            "openblas_core": _openblas_core(),
            "openblas_coretype_env": os.environ.get("OPENBLAS_CORETYPE", ""),
            "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY", ""),
            "openblas_threads": os.environ.get("OPENBLAS_NUM_THREADS", "")}
    with open(a.json, "w") as f:
        json.dump({"info": info, "results": rows}, f)


def run_exact(a, threads):
    """--exact: one child process per runtime setting (same shapes, threads
    and repeats), then the table."""
    import tempfile
    settings = [x for x in a.settings.split(",") if x]
    bad = [x for x in settings if x not in SETTINGS]
    if bad or not settings:
        raise SystemExit("bench_pytorch.py: --settings takes %s, found %r"
                         % (", ".join(SETTINGS), a.settings))
    rows, infos = [], {}
    with tempfile.TemporaryDirectory() as tmp:
        for st in settings:
            out = os.path.join(tmp, st + ".json")
            cmd = [sys.executable, os.path.abspath(__file__), "--exact", "--child", st,
                   "--threads", str(threads), "--reps", str(a.reps), "--shapes", a.shapes,
                   "--json", out]
            r = subprocess.run(cmd, env=runtime_env(threads, st, a.blas_threads or None))
            if r.returncode != 0:
                raise SystemExit("bench_pytorch.py --exact: the '%s' run failed (%d)"
                                 % (st, r.returncode))
            with open(out) as f:
                d = json.load(f)
            rows += d["results"]
            infos[st] = d["info"]
    first = infos[settings[0]]
    info = {"torch": first["torch"], "threads": first["threads"], "reps": a.reps,
            "cpu": _cpu_name(), "settings": infos,
            "command": " ".join(["tools/bench/bench.sh --exact"] + _user_args(sys.argv[1:]))}
    table = exact_table(rows, info)
    print(table)
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"info": info, "results": rows}, f, indent=1)
    if a.md:
        with open(a.md) as f:
            doc = f.read()
        if BEGIN_EXACT not in doc or END_EXACT not in doc:
            raise SystemExit("%s has no %s ... %s markers" % (a.md, BEGIN_EXACT, END_EXACT))
        head, rest = doc.split(BEGIN_EXACT, 1)
        tail = rest.split(END_EXACT, 1)[1]
        with open(a.md, "w") as f:
            f.write(head + BEGIN_EXACT + "\n" + table + END_EXACT + tail)


def _user_args(argv):
    """The command-line options that change the measurement (not --exact,
    --json, --md)."""
    out, skip = [], False
    for x in argv:
        if skip:
            skip = False
        elif x in ("--json", "--md"):
            skip = True
        elif x != "--exact" and not x.startswith(("--json=", "--md=")):
            out.append(x)
    return out


def exact_table(rows, info):
    """The markdown table of run_exact's rows (milliseconds, medians), one
    block of rows per runtime setting."""
    def ms(t):
        x = 1e3 * t
        return "%.1f" % x if x >= 10 else "%.2f" % x if x >= 1 else "%.3f" % x

    settings = list(dict.fromkeys(r["setting"] for r in rows))
    blas = {st: info["settings"][st]["openblas_threads"] for st in settings}
    lines = ["Median ms per call, float32, %d threads (OpenMP and OpenBLAS), %d round-robin "
             "repeats per setting; %s; torch %s. Settings: %s."
             % (info["threads"], info["reps"], info["cpu"], info["torch"],
                "; ".join("**%s**: %s%s" % (st, SETTING_NOTE[st],
                                            "" if blas[st] == str(info["threads"])
                                            else ", OpenBLAS %s threads" % blas[st])
                          for st in settings)), "",
             "| setting | module (shape) | PyTorch loop | exact patch | speed-up | exact, "
             "`return_attention=False` | speed-up | heads only: PyTorch loop | `asap::teacher` "
             "| speed-up |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        what = "%s n=%d, B=%d, H=%d, d=%d, T=%d%s" % (
            "ViT" if r["kind"] == "vit" else "text", r["n"], r["B"], r["H"], r["d"], r["T"],
            ", padded" if r["kind"] == "text" else "")
        lines.append("| %s | %s | %s | %s | **%.1f×** | %s | %.1f× | %s | %s | %.1f× |" % (
            r["setting"], what, ms(r["module_pytorch_s"]), ms(r["module_exact_s"]),
            r["module_pytorch_s"] / r["module_exact_s"], ms(r["module_exact_noattn_s"]),
            r["module_pytorch_s"] / r["module_exact_noattn_s"], ms(r["head_pytorch_s"]),
            ms(r["head_exact_s"]), r["head_pytorch_s"] / r["head_exact_s"]))
    lines += ["", "Command: `%s` (machine: `lscpu | grep 'Model name'` = %s). Largest difference "
              "between the patched and the unpatched module's outputs and attention: %.1e."
              % (info["command"], info["cpu"], max(r["max_abs_diff"] for r in rows)), ""]
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", default="128,256,512,1024")
    ap.add_argument("--bh", default="1x4,4x4")
    ap.add_argument("--T", default="6,10,20")
    ap.add_argument("--d", type=int, default=64)
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--reps", type=int, default=None, help="repeats (default 3; 15 with --exact)")
    ap.add_argument("--json")
    ap.add_argument("--exact", action="store_true",
                    help="time patch_model(exact=True) against the module's PyTorch loop")
    ap.add_argument("--shapes", default=EXACT_SHAPES, help="--exact shapes, kind:n:BxH:d:T,...")
    ap.add_argument("--md", help="--exact: rewrite the table between the exact markers of this file")
    ap.add_argument("--settings", default="passive",
                    help="--exact: runtime settings, each in its own process: default "
                    "(OMP_WAIT_POLICY unset), passive (as asap_bench), active")
    ap.add_argument("--blas-threads", type=int, default=0,
                    help="--exact: OPENBLAS_NUM_THREADS (default: --threads)")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.exact:
        a.reps = a.reps or 15
        threads = a.threads if a.threads > 0 else os.cpu_count() or 1
        torch.set_num_threads(threads)
        if a.child:
            return measure_exact(a)
        return run_exact(a, threads)
    a.reps = a.reps or 3
    if not a.json:
        ap.error("--json is required (except with --exact)")
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
