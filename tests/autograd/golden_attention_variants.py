"""Golden files for tests/autograd/test_attention_variants.cpp, from PyTorch 1.13 (float64).

Run with the Debian interpreter that has torch:  /usr/bin/python3 tests/autograd/golden_attention_variants.py
Writes tests/data/autograd/attention_<case>.golden: grouped-query / multi-query attention, PyTorch's reference
semantics being k.repeat_interleave(H // H_kv, dim=-3) (the same for v) followed by plain attention
softmax(q k^T / sqrt(d_k) + mask) v; the sliding-window cases give PyTorch the equivalent boolean mask.

Each file holds, in float64 (config in int64):
  config        [B, H, H_kv, Lq, Lk, d_k, d_v, is_causal, window]
  q, k, v       (B, H, Lq, d_k), (B, H_kv, Lk, d_k), (B, H_kv, Lk, d_v)
  grad_output   the fixed upstream gradient (B, H, Lq, d_v)
  output        the forward result
  grad.q, grad.k, grad.v   the gradients (of the shared heads: summed over their query heads)
"""
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
from golden import write_golden  # noqa: E402

OUT = os.path.join(os.path.dirname(HERE), "data", "autograd")


def blocked(lq, lk, causal, window):
    """Bool (Lq, Lk), True = blocked: causal j > i; window: causal i - w < j <= i, else |i - j| <= w."""
    i = torch.arange(lq).unsqueeze(1)
    j = torch.arange(lk).unsqueeze(0)
    b = torch.zeros(lq, lk, dtype=torch.bool)
    if causal:
        b |= j > i
    if window > 0:
        b |= (j <= i - window) if causal else ((i - j).abs() > window)
    return b


def case(name, B, H, Hkv, Lq, Lk, dk, dv, causal=False, window=0, seed=0):
    torch.manual_seed(seed)
    q = torch.randn(B, H, Lq, dk, dtype=torch.float64, requires_grad=True)
    k = torch.randn(B, Hkv, Lk, dk, dtype=torch.float64, requires_grad=True)
    v = torch.randn(B, Hkv, Lk, dv, dtype=torch.float64, requires_grad=True)
    go = torch.randn(B, H, Lq, dv, dtype=torch.float64)
    kr = k.repeat_interleave(H // Hkv, dim=-3)
    vr = v.repeat_interleave(H // Hkv, dim=-3)
    s = q @ kr.transpose(-1, -2) / dk ** 0.5
    s = s.masked_fill(blocked(Lq, Lk, causal, window), float("-inf"))
    out = torch.softmax(s, dim=-1) @ vr
    out.backward(go)
    write_golden(os.path.join(OUT, "attention_%s.golden" % name), {
        "config": torch.tensor([B, H, Hkv, Lq, Lk, dk, dv, int(causal), window], dtype=torch.int64),
        "q": q, "k": k, "v": v, "grad_output": go, "output": out,
        "grad.q": q.grad, "grad.k": k.grad, "grad.v": v.grad,
    })


if __name__ == "__main__":
    os.makedirs(OUT, exist_ok=True)
    case("gqa", B=2, H=4, Hkv=2, Lq=5, Lk=7, dk=3, dv=4, seed=1)
    case("mqa_causal", B=1, H=3, Hkv=1, Lq=6, Lk=6, dk=4, dv=2, causal=True, seed=2)
    case("gqa_window_causal", B=2, H=4, Hkv=2, Lq=9, Lk=9, dk=3, dv=3, causal=True, window=3, seed=3)
    case("gqa_window", B=1, H=2, Hkv=1, Lq=7, Lk=10, dk=3, dv=2, window=2, seed=4)
