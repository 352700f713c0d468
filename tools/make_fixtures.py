#!/usr/bin/env python3
"""Write the Sinkformer test fixtures into tests/data/fixtures/.

    ${PYTHON:-/usr/bin/python3} tools/make_fixtures.py [--out DIR]

Two small seeded teachers with the released Sinkformer layouts
(tools/sinkformer_models.py):

* vit:  16x16x1 images, patch 4 (n = 17 tokens), dim 32, depth 2, 2 heads of
        16, T = 6 (column-ending), eps = 1; saved as a plain state dict, a
        training checkpoint dict (with Adam state), a DataParallel-style state
        dict ('module.' prefix) and a whole-model pickle.
* text: vocab 50, n = 12, d_model 32, 2 layers, 4 heads of 8, T = 5
        (row-ending), eps = 1, padded batch (pad id 0, lengths 12..1); saved
        as a plain state dict, a whole-model pickle, a DataParallel-wrapped
        whole-model pickle (what the released text trainer saves) and a
        hand-written .safetensors file.

fixtures.h5 holds each attention layer's input activations, attention
matrices, per-head outputs and layer outputs; fixtures.json describes it
all (see docs/recording-calibration.md, "Fixtures"). Deterministic:
rerunning rewrites identical files.
"""
import argparse
import json
import os
import sys

import numpy as np
import torch
import h5py

TOOLS_DIR = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, TOOLS_DIR)
import sinkformer_models as sm  # noqa: E402
from record_calib import record, check_calib  # noqa: E402

REPO = os.path.dirname(TOOLS_DIR)
SHARPEN = 2.5   # q/k weights are scaled so that the Sinkhorn loop matters


def write_safetensors(state_dict, path):
    """Hand-written safetensors: u64 LE header size, JSON header, raw bytes."""
    header, blobs, offset = {"__metadata__": {"format": "pt"}}, [], 0
    for name in sorted(state_dict):
        t = state_dict[name].detach().to(torch.float32).contiguous()
        raw = t.numpy().astype("<f4").tobytes()
        header[name] = {"dtype": "F32", "shape": list(t.shape),
                        "data_offsets": [offset, offset + len(raw)]}
        blobs.append(raw)
        offset += len(raw)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as fh:
        fh.write(len(text).to_bytes(8, "little"))
        fh.write(text)
        for raw in blobs:
            fh.write(raw)


def run_recorded(model, inputs):
    """Forward once; per attention layer: x, attn, head_out, out (+ key mask)."""
    mods = sm.attention_modules(model)
    rec = {name: {} for name, _ in mods}
    hooks = []
    for name, m in mods:
        def pre(module, args, name=name):
            rec[name]["x"] = args[0].detach().clone()
            if len(args) > 3:   # text mha(Q, K, V, attn_mask): True at padded keys
                rec[name]["key_pad"] = args[3][:, 0, :].clone()
        def post(module, args, output, name=name):
            rec[name]["out"] = output[0].detach().clone()
        hooks += [m.register_forward_pre_hook(pre), m.register_forward_hook(post)]
    with torch.no_grad(), sm.keep_details(model) as kd:
        result = model(inputs)[0]
        for name, m in mods:
            rec[name]["attn"] = m.saved["attn"]
            rec[name]["head_out"] = m.saved["head_out"]
        kd.clear()
    for h in hooks:
        h.remove()
    return result, rec


def projections(name, fused, d_model, inner):
    """q/k/v/out parameter names of one attention layer for the manifest."""
    if fused:   # ViT: to_qkv [3*inner, d_model], chunk order q, k, v; no bias
        w = name + ".to_qkv.weight"
        qkv = {key: {"weight": w, "bias": None, "rows": [i * inner, (i + 1) * inner]}
               for i, key in enumerate(("q", "k", "v"))}
        out = {"weight": name + ".to_out.0.weight", "bias": name + ".to_out.0.bias"}
        norm = {"weight": name[:-len(".fn")] + ".norm.weight",
                "bias": name[:-len(".fn")] + ".norm.bias", "eps": 1e-5, "where": "pre"}
    else:       # text: WQ/WK/WV [d_model, d_model] with bias
        qkv = {key: {"weight": "%s.%s.weight" % (name, w), "bias": "%s.%s.bias" % (name, w),
                     "rows": [0, inner]} for key, w in (("q", "WQ"), ("k", "WK"), ("v", "WV"))}
        out = {"weight": name + ".linear.weight", "bias": name + ".linear.bias"}
        base = name[:-len(".mha")]
        norm = {"weight": base + ".layernorm1.weight", "bias": base + ".layernorm1.bias",
                "eps": 1e-6, "where": "post"}
    return dict(qkv, out=out, norm=norm)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default=os.path.join(REPO, "tests", "data", "fixtures"))
    a = p.parse_args(argv)
    os.makedirs(a.out, exist_ok=True)
    torch.set_num_threads(1)   # bitwise-reproducible reductions
    out = lambda f: os.path.join(a.out, f)  # noqa: E731

    # ---- ViT ---------------------------------------------------------------
    vit = sm.fixture_vit(seed=0)
    cfg_vit = dict(sm.VIT_FIXTURE)
    inner = cfg_vit["heads"] * cfg_vit["dim_head"]
    with torch.no_grad():
        for _, m in sm.attention_modules(vit):
            m.to_qkv.weight[:2 * inner] *= SHARPEN
    # one Adam step so the checkpoint carries a realistic optimizer state
    opt = torch.optim.Adam(vit.parameters(), lr=1e-3)
    vit.train()
    train_x = sm.synthetic_images(8, seed=100)
    train_y = torch.arange(8) % cfg_vit["num_classes"]
    loss = torch.nn.functional.cross_entropy(vit(train_x)[0], train_y)
    opt.zero_grad()
    loss.backward()
    opt.step()
    vit.eval()
    vit_in = sm.synthetic_images(4, seed=10)
    vit_logits, vit_rec = run_recorded(vit, vit_in)

    sd = vit.state_dict()
    torch.save(sd, out("vit_state_dict.pt"))
    torch.save({"epoch": 1, "model_state_dict": sd, "optimizer_state_dict": opt.state_dict(),
                "loss": float(loss)}, out("vit_checkpoint.pt"))
    torch.save({"module." + k: v for k, v in sd.items()}, out("vit_dataparallel.pt"))
    torch.save(vit, out("vit_model.pt"))

    # ---- text --------------------------------------------------------------
    text = sm.fixture_text(seed=1)
    cfg_text = dict(sm.TEXT_FIXTURE)
    with torch.no_grad():
        for _, m in sm.attention_modules(text):
            m.WQ.weight *= SHARPEN
            m.WK.weight *= SHARPEN
    lengths = [12, 9, 7, 4, 2, 1]
    tokens = sm.synthetic_tokens(len(lengths), seed=11, seq_len=cfg_text["seq_len"],
                                 vocab_size=cfg_text["vocab_size"], lengths=lengths)
    text_probs, text_rec = run_recorded(text, tokens)
    tsd = text.state_dict()
    torch.save(tsd, out("text_state_dict.pt"))
    torch.save(text, out("text_model.pt"))
    torch.save(torch.nn.DataParallel(text), out("text_model_dataparallel.pt"))
    write_safetensors(tsd, out("text.safetensors"))

    # ---- fixtures.h5 -------------------------------------------------------
    def f32(t):
        return t.detach().cpu().numpy().astype(np.float32)

    with h5py.File(out("fixtures.h5"), "w") as f:
        f.attrs["generator"] = "tools/make_fixtures.py"
        g = f.create_group("vit")
        g["input"] = f32(vit_in)
        g["logits"] = f32(vit_logits)
        for name, r in vit_rec.items():
            lg = g.create_group("layers/" + name)
            for key in ("x", "attn", "head_out", "out"):
                lg[key] = f32(r[key])
        g = f.create_group("text")
        g["input"] = tokens.numpy().astype(np.int64)
        g["mask"] = (tokens != cfg_text["pad_id"]).numpy().astype(np.uint8)
        g["probs"] = f32(text_probs)
        for name, r in text_rec.items():
            lg = g.create_group("layers/" + name)
            for key in ("x", "attn", "head_out", "out"):
                lg[key] = f32(r[key])
            lg["mask"] = (~r["key_pad"]).numpy().astype(np.uint8)

    # ---- calibration files (record_calib on the same inputs) ----------------
    record(vit, [n for n, _ in sm.attention_modules(vit)], [vit_in], out("vit_calib.h5"),
           quiet=True)
    record(text, [n for n, _ in sm.attention_modules(text)], [tokens], out("text_calib.h5"),
           quiet=True)
    check_calib(out("vit_calib.h5"))
    check_calib(out("text_calib.h5"))

    # ---- fixtures.json -----------------------------------------------------
    def entry(family, model, cfg, files, T, eps, heads, dim_head, d_model, n, batch, extra):
        fused = family == "vit"
        layers = [dict(name=name, h5_group="%s/layers/%s" % (family, name),
                       **projections(name, fused, d_model, heads * dim_head))
                  for name, _ in sm.attention_modules(model)]
        d = dict(family=family, files=files, config=cfg, T=T, eps=float(eps),
                 ending="column" if T % 2 == 0 else "row", heads=heads, dim_head=dim_head,
                 dv=dim_head, d_model=d_model, n=n, batch=batch,
                 score_scale=float(dim_head ** -0.5), head_split="b n (h d) -> b h n d",
                 layers=layers,
                 params={k: list(v.shape) for k, v in model.state_dict().items()})
        d.update(extra)
        return d

    manifest = {
        "format": "asapc-fixtures", "version": 1, "generator": "tools/make_fixtures.py",
        "h5": "fixtures.h5",
        "h5_datasets": {
            "<model>/input": "model input: vit images [B,1,16,16] float32; text token ids [B,n] int64",
            "<model>/logits|probs": "model output (vit logits [B,10]; text class probabilities [B,2])",
            "text/mask": "[B,n] uint8, 1 = token, 0 = padding",
            "<model>/layers/<layer>/x": "[B,n,d_model] what the attention module's forward receives",
            "<model>/layers/<layer>/attn": "[B,H,n,n] teacher attention A = n * plan",
            "<model>/layers/<layer>/head_out": "[B,H,n,dv] A @ V per head",
            "<model>/layers/<layer>/out": "[B,n,d_model] after the output projection",
            "text/layers/<layer>/mask": "[B,n] uint8 key mask seen by that layer",
        },
        "models": {
            "vit": entry("vit", vit, cfg_vit,
                         {"state_dict": "vit_state_dict.pt", "checkpoint": "vit_checkpoint.pt",
                          "checkpoint_key": "model_state_dict",
                          "dataparallel": "vit_dataparallel.pt", "pickle": "vit_model.pt",
                          "calib": "vit_calib.h5"},
                         cfg_vit["max_iter"], cfg_vit["eps"], cfg_vit["heads"],
                         cfg_vit["dim_head"], cfg_vit["dim"], vit_rec[next(iter(vit_rec))]["x"].shape[1],
                         vit_in.shape[0],
                         {"masked": False, "pickle_class": "sinkformer_models.ViT",
                          "prenorm": True}),
            "text": entry("text", text, cfg_text,
                          {"state_dict": "text_state_dict.pt", "pickle": "text_model.pt",
                           "pickle_dataparallel": "text_model_dataparallel.pt",
                           "safetensors": "text.safetensors", "calib": "text_calib.h5"},
                          cfg_text["n_it"], 1.0, cfg_text["n_heads"],
                          cfg_text["d_model"] // cfg_text["n_heads"], cfg_text["d_model"],
                          cfg_text["seq_len"], tokens.shape[0],
                          {"masked": True, "pad_id": cfg_text["pad_id"], "lengths": lengths,
                           "mask_convention": "padded keys -1e9, v > 9e8 reset to 0; "
                                              "all query rows kept",
                           "pickle_class": "sinkformer_models.TransformerEncoder",
                           "prenorm": False}),
        },
    }
    with open(out("fixtures.json"), "w") as fh:
        json.dump(manifest, fh, indent=1, sort_keys=False)
        fh.write("\n")

    # ---- self-check: every saved form reloads to the same weights ----------
    from record_calib import load_state_dict, load_model_file
    for fname in ("vit_state_dict.pt", "vit_checkpoint.pt", "vit_dataparallel.pt", "vit_model.pt"):
        got = load_state_dict(out(fname))
        assert got.keys() == sd.keys() and all(torch.equal(got[k], sd[k]) for k in sd), fname
    for fname in ("text_state_dict.pt", "text_model.pt", "text_model_dataparallel.pt",
                  "text.safetensors"):
        got = load_state_dict(out(fname))
        assert got.keys() == tsd.keys() and all(torch.equal(got[k], tsd[k]) for k in tsd), fname
    with torch.no_grad():
        assert torch.equal(load_model_file(out("vit_model.pt"))(vit_in)[0], vit_logits)
        assert torch.equal(load_model_file(out("text_model_dataparallel.pt"))(tokens)[0],
                           text_probs)
    total = sum(os.path.getsize(out(x)) for x in os.listdir(a.out))
    print("wrote %s (%d files, %.0f KiB)" % (a.out, len(os.listdir(a.out)), total / 1024))
    return 0


if __name__ == "__main__":
    sys.exit(main())
