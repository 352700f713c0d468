#!/usr/bin/env python3
"""The attention scores' range per head on a teacher's calibration set, and
whether Sinkhorn's kernel K = exp(S - max_j S_ij) keeps every column in
float32's range (docs/performance.md, "Sinkhorn in the scaling domain").

    score_range.py CHECKPOINT SPEC CALIB

For layers with a fused qkv projection, order qkv, heads as (h d) (the
Sinkformer ViT's layout). Prints per layer the median and largest range
(max - min of the scaled scores S / eps) over examples and heads, and the
worst column: the least, over examples, heads and keys, of max_i (S_ij - max_j S_ij).
Under about -69 the column's sum underflows and the scaling domain cannot run.
Run with Debian's interpreter (/usr/bin/python3).
"""
import json
import os
import sys


def main(argv):
    if len(argv) != 3:
        print(__doc__.split("\n\n")[1].strip(), file=sys.stderr)
        return 2
    import h5py
    import torch
    pt, spec, calib = argv
    for p in argv:
        if not os.path.isfile(p):
            print("score_range.py: expected the file '%s', found none" % p, file=sys.stderr)
            return 2
    sd = torch.load(pt, map_location="cpu")
    sd = sd.get("model_state_dict", sd.get("state_dict", sd))
    with open(spec) as f:
        layers = json.load(f)["layers"]
    with h5py.File(calib, "r") as f:
        for L in layers:
            x_path = "layers/%s/x" % L["name"]
            if x_path not in f or L["qkv"]["weight"] not in sd:
                print("score_range.py: layer '%s': expected '%s' in %s and '%s' in %s, found %s"
                      % (L["name"], x_path, calib, L["qkv"]["weight"], pt,
                         "neither" if x_path not in f and L["qkv"]["weight"] not in sd
                         else "no '%s'" % (x_path if x_path not in f else L["qkv"]["weight"])), file=sys.stderr)
                return 2
            if L.get("layout") != "fused" or L.get("qkv_order") != "qkv" or L.get("head_layout") != "(h d)":
                print("score_range.py: %s: layer '%s': expected layout 'fused', qkv_order 'qkv', head_layout '(h d)', "
                      "found %r, %r, %r" % (spec, L["name"], L.get("layout"), L.get("qkv_order"), L.get("head_layout")),
                      file=sys.stderr)
                return 2
            x = torch.tensor(f[x_path][:]).float()
            q, k, _ = (x @ sd[L["qkv"]["weight"]].float().T).chunk(3, -1)
            h, dh = L["heads"], L["head_dim"]
            q = q.reshape(*q.shape[:2], h, dh).transpose(1, 2)
            k = k.reshape(*k.shape[:2], h, dh).transpose(1, 2)
            S = q @ k.transpose(-1, -2) * L["score_scale"] / L["eps"]
            rng = S.amax((-1, -2)) - S.amin((-1, -2))
            worst = float((S - S.amax(-1, keepdim=True)).amax(-2).amin())
            print("%s: score range per head median %.1f, largest %.1f; worst column %.1f (%s)"
                  % (L["name"], float(rng.median()), float(rng.max()), worst,
                     "in range" if worst > -69 else "underflows: log domain needed"))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
