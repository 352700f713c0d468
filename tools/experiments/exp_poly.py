#!/usr/bin/env python3
"""The float32 exponential's polynomial (src/lib/fast/kernels_impl.h, exp_f32):
where its coefficients come from, and how accurate it is with float32 rounding.

  exp_poly.py fit DEG          fit exp(r) = 1 + c1 r + ... + cDEG r^DEG on |r| <= ln2/2
                               for relative error and print the coefficients and the
                               largest relative error over [-87, 88] of the whole
                               float32 exponential built on them
  exp_poly.py check [FILE]     read the coefficients of exp_f32 from FILE (default:
                               the repo's kernels_impl.h) and print that error, next
                               to Cephes' expf (the polynomial before 2026-11-28)
  exp_poly.py patch DEG FILE   rewrite exp_f32 in FILE (a copy of kernels_impl.h) as
                               a coarser exponential, 2^f = 2^(x log2 e - n) with a
                               degree-DEG polynomial and a one-step reduction: the
                               throw-away builds of docs/performance.md ("A shorter
                               exponential"); see exp_variant.sh

The fit is iteratively reweighted least squares towards the minimax polynomial (Lawson's
algorithm) with exp(0) = 1 exact. The error is computed by emulating the kernel step by
step in float32 (one rounding per multiply-add, as the vector FMA does), against exp in
float64. Needs numpy.
"""
import os
import re
import sys

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
KERNELS = os.path.join(REPO, "src", "lib", "fast", "kernels_impl.h")
F32 = np.float32
CEPHES = [5.0000001201e-1, 1.6666665459e-1, 4.1665795894e-2, 8.3334519073e-3, 1.3981999507e-3, 1.9875691500e-4]


def lawson(basis, target, nodes, iters=300):
    """Coefficients of sum c_k basis_k(x) close to target(x) in relative error (near minimax)."""
    a = np.stack([b(nodes) for b in basis], 1)
    y, scale = target(nodes)
    w = np.ones_like(nodes)
    for _ in range(iters):
        c, *_ = np.linalg.lstsq(a * (w / scale)[:, None], y * w / scale, rcond=None)
        err = (a @ c - y) / scale
        w = w * np.sqrt(np.abs(err)) + 1e-300
        w /= w.max()
    return c


def fit(deg):
    """exp(r) - 1 = sum_{k=1..deg} c_k r^k on |r| <= ln2 / 2."""
    r = np.cos(np.linspace(0, np.pi, 8001)) * np.log(2) / 2
    return lawson([lambda x, k=k: x ** k for k in range(1, deg + 1)], lambda x: (np.exp(x) - 1, np.exp(x)), r)


def fit_exp2(deg):
    """2^f - 1 = sum_{k=1..deg} c_k f^k on |f| <= 1/2 (the coarse variants)."""
    f = np.cos(np.linspace(0, np.pi, 8001)) / 2
    return lawson([lambda x, k=k: x ** k for k in range(1, deg + 1)], lambda x: (2 ** x - 1, 2 ** x), f)


def fma(a, b, c):
    return (a.astype(np.float64) * np.float64(b) + np.float64(c)).astype(F32)


def emulate(x, coef, cephes=False):
    """exp_f32 step by step in float32: clamps, Cody-Waite reduction, the polynomial, 2^n."""
    x = np.maximum(np.minimum(x.astype(F32), F32(88.3762626647949)), F32(-87.33654475))
    shifter = F32(12582912.0)
    t = fma(x, F32(1.44269504088896341), shifter)
    n = (t - shifter).astype(F32)
    r = (x.astype(np.float64) - n.astype(np.float64) * np.float64(F32(0.693359375))).astype(F32)
    r = (r.astype(np.float64) - n.astype(np.float64) * np.float64(F32(-2.12194440e-4))).astype(F32)
    c = [F32(v) for v in coef]
    p = np.full_like(r, c[-1])
    for v in reversed(c[:-1]):
        p = (p.astype(np.float64) * r.astype(np.float64) + np.float64(v)).astype(F32)
    if cephes:  # y = p (r r) + r + 1
        rr = (r * r).astype(F32)
        y = ((p.astype(np.float64) * rr.astype(np.float64) + r.astype(np.float64)).astype(F32) + F32(1)).astype(F32)
    else:  # one more multiply-add to the constant 1
        y = (p.astype(np.float64) * r.astype(np.float64) + 1.0).astype(F32)
    return (y.astype(np.float64) * np.ldexp(1.0, n.astype(np.int64))).astype(F32)


def max_rel_error(coef, cephes=False):
    x = np.linspace(-87, 88, 2000001).astype(F32)
    return float(np.max(np.abs(emulate(x, coef, cephes).astype(np.float64) / np.exp(x.astype(np.float64)) - 1)))


def exp_f32_source(text):
    start = text.find("inline V exp_f32(V x) {")
    if start < 0:
        sys.exit("exp_poly.py: expected 'inline V exp_f32(V x) {' in the kernels file, found none")
    end = text.find("\n}\n", start)
    return start, end + 3


def kernel_coefficients(path):
    try:
        text = open(path).read()
    except OSError as e:
        sys.exit("exp_poly.py: expected the kernels file '%s', found none (%s)" % (path, e.strerror))
    s, e = exp_f32_source(text)
    body = text[s:e]
    lead = re.search(r"V p = V\{\} \+ ([-+0-9.eE]+)f;", body)
    steps = re.findall(r"p = p \* r \+ ([-+0-9.eE]+)f;", body)
    if not lead or not steps:
        sys.exit("exp_poly.py: expected exp_f32's Horner steps 'p = p * r + c' in '%s', found none" % path)
    horner = [float(lead.group(1))] + [float(v) for v in steps]  # highest degree first
    if horner[-1] != 1.0:
        sys.exit("exp_poly.py: expected exp_f32's last Horner step to add 1.0, found %r" % horner[-1])
    return list(reversed(horner[:-1]))  # c1 .. cDEG


def patch(deg, path):
    c = fit_exp2(deg)
    text = open(path).read()
    s, e = exp_f32_source(text)
    horner = "  V p = V{} + %.10ef;\n" % c[-1]
    for v in reversed(c[:-1]):
        horner += "  p = p * f + %.10ef;\n" % v
    horner += "  p = p * f + 1.0f;\n"
    body = ("inline V exp_f32(V x) {\n"
            "  x = vmin(x, V{} + 88.3762626647949f);\n"
            "  x = vmax(x, V{} + -87.33654475f);\n"
            "  const V shifter = V{} + 12582912.0f;  // 1.5 * 2^23\n"
            "  const V t = x * 1.44269504088896341f + shifter;\n"
            "  const V n = t - shifter;\n"
            "  const V f = x * 1.44269504088896341f - n;  // degree-%d throw-away variant (exp_poly.py)\n"
            "%s"
            "  const U e = (bits_as<U>(t) << 23) + (127u << 23);\n"
            "  return p * bits_as<V>(e);\n"
            "}\n") % (deg, horner)
    with open(path, "w") as fh:
        fh.write(text[:s] + body + text[e:])
    x = np.linspace(-0.5, 0.5, 200001)
    p = 1 + sum(v * x ** (k + 1) for k, v in enumerate(c))
    print("patched %s: degree-%d 2^f, polynomial error %.2g relative on |f| <= 1/2" %
          (path, deg, np.max(np.abs(p / 2 ** x - 1))))


def degree(arg):
    if not arg.isdigit() or not 2 <= int(arg) <= 8:
        sys.exit("exp_poly.py: expected DEG an integer from 2 to 8, found '%s'" % arg)
    return int(arg)


def main(argv):
    if len(argv) >= 2 and argv[0] == "fit":
        c = fit(degree(argv[1]))
        print("degree %d: %s" % (len(c), " ".join("%.10e" % v for v in c)))
        print("largest relative error over [-87, 88] with float32 rounding: %.3g" % max_rel_error(c))
    elif argv and argv[0] == "check":
        c = kernel_coefficients(argv[1] if len(argv) > 1 else KERNELS)
        print("kernel exp_f32, degree %d: largest relative error over [-87, 88] with float32 rounding: %.3g"
              % (len(c), max_rel_error(c)))
        print("Cephes expf (1 + r + r^2 p(r), p of degree 5): %.3g" % max_rel_error(CEPHES, cephes=True))
    elif len(argv) == 3 and argv[0] == "patch":
        patch(degree(argv[1]), argv[2])
    else:
        sys.exit(__doc__.split("\n\n")[1])


if __name__ == "__main__":
    main(sys.argv[1:])
