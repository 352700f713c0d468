#!/usr/bin/env python3
"""Small checkpoints in the layouts `asapc inspect` detects besides the
Sinkformer ones, plus reference per-head projections for
nn.MultiheadAttention. Run with ${PYTHON:-/usr/bin/python3}; deterministic."""
import json, os, torch
from torch import nn

torch.manual_seed(0)
torch.set_num_threads(1)
here = os.path.dirname(os.path.abspath(__file__))

class MAB(nn.Module):  # set-transformer block layout
    def __init__(self, d):
        super().__init__()
        self.fc_q, self.fc_k, self.fc_v, self.fc_o = (nn.Linear(d, d) for _ in range(4))

class SetT(nn.Module):
    def __init__(self):
        super().__init__()
        self.enc = nn.Sequential(MAB(8), MAB(8))

class HFAttn(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.q_proj, self.k_proj, self.v_proj, self.o_proj = (nn.Linear(d, d, bias=False) for _ in range(4))

class HF(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList([nn.ModuleDict({'self_attn': HFAttn(12)}) for _ in range(3)])

enc = nn.TransformerEncoder(nn.TransformerEncoderLayer(d_model=12, nhead=3, dim_feedforward=16), num_layers=2)
torch.save(SetT().state_dict(), os.path.join(here, 'set_transformer.pt'))
torch.save(enc.state_dict(), os.path.join(here, 'torch_mha.pt'))
torch.save({'model': HF().state_dict()}, os.path.join(here, 'hf_qkv.pt'))
torch.save({'just': torch.zeros(3), 'numbers': torch.ones(2, 2)}, os.path.join(here, 'no_attention.pt'))

# Reference projections of the first nn.MultiheadAttention: x [2, 5, 12] -> q, k, v [2, 3, 5, 4].
mha = enc.layers[0].self_attn
x = torch.randn(2, 5, 12)
E, H = 12, 3
W, b = mha.in_proj_weight, mha.in_proj_bias
def heads(t):
    return t.view(2, 5, H, E // H).transpose(1, 2)
with torch.no_grad():
    q, k, v = (heads(x @ W[i * E:(i + 1) * E].T + b[i * E:(i + 1) * E]) for i in range(3))
json.dump({'x': x.tolist(), 'q': q.tolist(), 'k': k.tolist(), 'v': v.tolist()},
          open(os.path.join(here, 'torch_mha_proj.json'), 'w'))
