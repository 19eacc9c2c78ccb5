"""Generates tests/data/autograd/rope.golden for tests/autograd/test_rope.cpp with PyTorch 1.13 (float64).

Run from anywhere with the Python that has torch:  /usr/bin/python3 tests/autograd/golden_rope.py

The reference is a plain torch implementation of RoPE with the INTERLEAVED pairing of RoFormer and Meta's llama
(apply_rotary_emb there, through torch.view_as_complex on pairs (2i, 2i+1)): features (2i, 2i+1) at position p are
rotated by p * base^(-2i/d). Holds x (B, H, L, d), offset, base, out, a fixed upstream weight w and
grad_x = d sum(out * w) / dx.
"""
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))  # tests/, for golden.py
from golden import write_golden  # noqa: E402

OUT = os.path.join(os.path.dirname(HERE), "data", "autograd")


def rope_interleaved(x, offset, base):
    d = x.shape[-1]
    L = x.shape[-2]
    theta = base ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)           # (d/2)
    pos = torch.arange(offset, offset + L, dtype=torch.float64)                  # (L)
    angle = torch.outer(pos, theta)                                             # (L, d/2)
    freqs = torch.polar(torch.ones_like(angle), angle)                          # llama's freqs_cis
    xc = torch.view_as_complex(x.reshape(*x.shape[:-1], d // 2, 2).contiguous())  # pairs (2i, 2i+1)
    return torch.view_as_real(xc * freqs).flatten(-2)


def main():
    torch.manual_seed(0)
    os.makedirs(OUT, exist_ok=True)
    x = torch.randn(2, 3, 6, 8, dtype=torch.float64, requires_grad=True)
    offset, base = 5, 10000.0
    out = rope_interleaved(x, offset, base)
    # Cross-check against the explicit real formula.
    d = x.shape[-1]
    theta = base ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
    ang = torch.outer(torch.arange(offset, offset + x.shape[-2], dtype=torch.float64), theta)
    x0, x1 = x[..., 0::2], x[..., 1::2]
    ref = torch.stack([x0 * ang.cos() - x1 * ang.sin(), x0 * ang.sin() + x1 * ang.cos()], dim=-1).flatten(-2)
    assert torch.allclose(out, ref, atol=1e-14)
    w = torch.randn_like(out)
    (out * w).sum().backward()
    write_golden(os.path.join(OUT, "rope.golden"), {
        "x": x, "offset": torch.tensor(float(offset), dtype=torch.float64),
        "base": torch.tensor(base, dtype=torch.float64), "out": out, "w": w, "grad_x": x.grad,
    })


if __name__ == "__main__":
    main()
