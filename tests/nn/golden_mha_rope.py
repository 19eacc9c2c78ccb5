"""Golden files for tests/nn/test_attention_rope.cpp: MultiheadAttention with RoPE (and grouped-query heads), float64.

Run with the Debian interpreter that has torch:  /usr/bin/python3 tests/nn/golden_mha_rope.py
Writes tests/data/nn/mha_rope_<case>.golden. The reference is written out below in plain PyTorch (1.13 has no
RoPE and no grouped-query MHA): in-projection x W^T + b split into q (H heads), k, v (H_kv heads each); RoPE with
the INTERLEAVED pairing of RoFormer and Meta's llama (features (2i, 2i+1) of each head rotated by the angle
p * base^(-2i / d), p = offset + position), applied as llama's apply_rotary_emb does (view_as_complex times
polar(1, angle)); k and v repeated with repeat_interleave(H / H_kv, dim=1) (PyTorch SDPA's enable_gqa semantics);
softmax(q k^T / sqrt(d) + causal mask) v; heads merged; out_proj.

Each file holds, in float64:
  config                 int64 [E, H, H_kv, is_causal, offset]
  in_proj_weight ((H + 2 H_kv) d, E), in_proj_bias, out_proj.weight, out_proj.bias
  x (B, L, E), grad_output (B, L, E), output (B, L, E)
  grad.x, grad.in_proj_weight, grad.in_proj_bias, grad.out_proj.weight, grad.out_proj.bias
"""
import math
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
from golden import write_golden  # noqa: E402

OUT = os.path.join(os.path.dirname(HERE), "data", "nn")


def rope(x, offset, base=10000.0):
    """x (B, L, n, d) -> rotated, interleaved pairs, positions offset .. offset + L - 1 (llama's apply_rotary_emb)."""
    B, L, n, d = x.shape
    freqs = 1.0 / (base ** (torch.arange(0, d, 2, dtype=torch.float64) / d))
    t = torch.arange(offset, offset + L, dtype=torch.float64)
    cis = torch.polar(torch.ones(L, d // 2, dtype=torch.float64), torch.outer(t, freqs))  # (L, d/2)
    xc = torch.view_as_complex(x.reshape(B, L, n, d // 2, 2).contiguous())
    return torch.view_as_real(xc * cis.view(1, L, 1, d // 2)).reshape(B, L, n, d)


def mha_rope(x, w, b, wo, bo, H, Hkv, is_causal, offset):
    B, L, E = x.shape
    d = E // H
    qkv = x @ w.t() + b
    q, k, v = qkv.split([H * d, Hkv * d, Hkv * d], dim=-1)
    q = rope(q.reshape(B, L, H, d), offset).transpose(1, 2)  # (B, H, L, d)
    k = rope(k.reshape(B, L, Hkv, d), offset).transpose(1, 2)  # (B, H_kv, L, d)
    v = v.reshape(B, L, Hkv, d).transpose(1, 2)
    k = k.repeat_interleave(H // Hkv, dim=1)
    v = v.repeat_interleave(H // Hkv, dim=1)
    s = q @ k.transpose(-1, -2) / math.sqrt(d)
    if is_causal:
        s = s.masked_fill(torch.triu(torch.ones(L, L, dtype=torch.bool), diagonal=1), float("-inf"))
    a = torch.softmax(s, dim=-1) @ v  # (B, H, L, d)
    return a.transpose(1, 2).reshape(B, L, E) @ wo.t() + bo


def case(name, E, H, Hkv, B, L, is_causal, offset, seed):
    torch.manual_seed(seed)
    d = E // H
    w = torch.empty((H + 2 * Hkv) * d, E, dtype=torch.float64)
    torch.nn.init.xavier_uniform_(w)
    b = torch.empty((H + 2 * Hkv) * d, dtype=torch.float64).uniform_(-0.5, 0.5)
    wo = torch.empty(E, E, dtype=torch.float64).uniform_(-0.5, 0.5)
    bo = torch.empty(E, dtype=torch.float64).uniform_(-0.5, 0.5)
    x = torch.randn(B, L, E, dtype=torch.float64)
    g = torch.randn(B, L, E, dtype=torch.float64)
    leaves = [t.clone().requires_grad_(True) for t in (x, w, b, wo, bo)]
    out = mha_rope(*leaves, H, Hkv, is_causal, offset)
    out.backward(g)
    t = {
        "config": torch.tensor([E, H, Hkv, int(is_causal), offset], dtype=torch.int64),
        "in_proj_weight": w,
        "in_proj_bias": b,
        "out_proj.weight": wo,
        "out_proj.bias": bo,
        "x": x,
        "grad_output": g,
        "output": out.detach(),
        "grad.x": leaves[0].grad,
        "grad.in_proj_weight": leaves[1].grad,
        "grad.in_proj_bias": leaves[2].grad,
        "grad.out_proj.weight": leaves[3].grad,
        "grad.out_proj.bias": leaves[4].grad,
    }
    write_golden(os.path.join(OUT, "mha_rope_%s.golden" % name), t)


def main():
    case("gqa_causal", E=16, H=4, Hkv=2, B=2, L=6, is_causal=True, offset=0, seed=1)
    case("mha_offset", E=12, H=2, Hkv=2, B=2, L=5, is_causal=False, offset=7, seed=2)
    case("mqa_causal", E=16, H=4, Hkv=1, B=1, L=7, is_causal=True, offset=3, seed=3)


if __name__ == "__main__":
    main()
