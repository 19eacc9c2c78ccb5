"""Generates tests/data/nn/mla.golden and mla_noq.golden for tests/nn/test_mla.cpp with PyTorch 1.13 (float64).

Run from anywhere with the Python that has torch:  /usr/bin/python3 tests/nn/golden_mla.py

The reference is DeepSeek-V3's inference/model.py class MLA ("naive" path, one process, no cache), rewritten
without its distributed/fp8 parts: the same parameter names and layout (wq or wq_a/q_norm/wq_b, wkv_a, kv_norm,
wkv_b, wo; no biases), RMSNorm on the latents, interleaved RoPE through complex numbers (view_as_complex), causal
softmax attention with scale 1/sqrt(qk_nope_head_dim + qk_rope_head_dim).

Each file holds: param.<i>.<name> (named_parameters() order), input (B, L, D), output, grad_output,
grad_input, grad.<i>.<name>.
"""
import math
import os
import sys

import torch
import torch.nn as nn

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))  # tests/, for golden.py
from golden import write_golden  # noqa: E402

OUT = os.path.join(os.path.dirname(HERE), "data", "nn")


class RMSNorm(nn.Module):
    def __init__(self, dim, eps=1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def precompute_freqs_cis(dim, seqlen, base):
    freqs = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim))
    t = torch.arange(seqlen, dtype=torch.float64)
    freqs = torch.outer(t, freqs)
    return torch.polar(torch.ones_like(freqs), freqs)  # (L, dim / 2) complex128


def apply_rotary_emb(x, freqs_cis):
    # x (B, L, H, d): pairs (2i, 2i+1) as complex numbers, as DeepSeek-V3 (interleaved).
    xc = torch.view_as_complex(x.contiguous().reshape(*x.shape[:-1], -1, 2))
    freqs_cis = freqs_cis.view(1, xc.size(1), 1, xc.size(-1))
    return torch.view_as_real(xc * freqs_cis).flatten(3)


class MLA(nn.Module):
    def __init__(self, dim, n_heads, q_lora_rank, kv_lora_rank, qk_nope_head_dim, qk_rope_head_dim, v_head_dim,
                 rope_base=10000.0):
        super().__init__()
        self.n_heads, self.q_lora_rank, self.kv_lora_rank = n_heads, q_lora_rank, kv_lora_rank
        self.qk_nope_head_dim, self.qk_rope_head_dim, self.v_head_dim = qk_nope_head_dim, qk_rope_head_dim, v_head_dim
        self.qk_head_dim = qk_nope_head_dim + qk_rope_head_dim
        self.rope_base = rope_base
        if q_lora_rank == 0:
            self.wq = nn.Linear(dim, n_heads * self.qk_head_dim, bias=False)
        else:
            self.wq_a = nn.Linear(dim, q_lora_rank, bias=False)
            self.q_norm = RMSNorm(q_lora_rank)
            self.wq_b = nn.Linear(q_lora_rank, n_heads * self.qk_head_dim, bias=False)
        self.wkv_a = nn.Linear(dim, kv_lora_rank + qk_rope_head_dim, bias=False)
        self.kv_norm = RMSNorm(kv_lora_rank)
        self.wkv_b = nn.Linear(kv_lora_rank, n_heads * (qk_nope_head_dim + v_head_dim), bias=False)
        self.wo = nn.Linear(n_heads * v_head_dim, dim, bias=False)
        self.softmax_scale = self.qk_head_dim ** -0.5

    def forward(self, x):
        bsz, seqlen, _ = x.size()
        freqs_cis = precompute_freqs_cis(self.qk_rope_head_dim, seqlen, self.rope_base)
        q = self.wq(x) if self.q_lora_rank == 0 else self.wq_b(self.q_norm(self.wq_a(x)))
        q = q.view(bsz, seqlen, self.n_heads, self.qk_head_dim)
        q_nope, q_pe = torch.split(q, [self.qk_nope_head_dim, self.qk_rope_head_dim], dim=-1)
        q_pe = apply_rotary_emb(q_pe, freqs_cis)
        kv = self.wkv_a(x)
        kv, k_pe = torch.split(kv, [self.kv_lora_rank, self.qk_rope_head_dim], dim=-1)
        k_pe = apply_rotary_emb(k_pe.unsqueeze(2), freqs_cis)
        q = torch.cat([q_nope, q_pe], dim=-1)
        kv = self.wkv_b(self.kv_norm(kv)).view(bsz, seqlen, self.n_heads, self.qk_nope_head_dim + self.v_head_dim)
        k_nope, v = torch.split(kv, [self.qk_nope_head_dim, self.v_head_dim], dim=-1)
        k = torch.cat([k_nope, k_pe.expand(-1, -1, self.n_heads, -1)], dim=-1)
        scores = torch.einsum("bshd,bthd->bsht", q, k) * self.softmax_scale
        mask = torch.full((seqlen, seqlen), float("-inf")).triu_(1)
        scores = (scores + mask.unsqueeze(1)).softmax(dim=-1)
        out = torch.einsum("bsht,bthd->bshd", scores, v)
        return self.wo(out.flatten(2))


def dump(filename, module, x):
    x = x.clone().requires_grad_(True)
    out = module(x)
    g = torch.randn(out.shape, dtype=torch.float64)
    out.backward(g)
    t = {}
    for i, (n, p) in enumerate(module.named_parameters()):
        t["param.%d.%s" % (i, n)] = p
    t["input"], t["output"], t["grad_output"], t["grad_input"] = x, out, g, x.grad
    for i, (n, p) in enumerate(module.named_parameters()):
        t["grad.%d.%s" % (i, n)] = p.grad
    write_golden(os.path.join(OUT, filename), t)


def main():
    torch.manual_seed(16)
    torch.set_default_dtype(torch.float64)
    for filename, q_lora_rank in [("mla.golden", 6), ("mla_noq.golden", 0)]:
        m = MLA(dim=12, n_heads=3, q_lora_rank=q_lora_rank, kv_lora_rank=5, qk_nope_head_dim=4, qk_rope_head_dim=4,
                v_head_dim=3, rope_base=100.0)
        with torch.no_grad():  # norms away from ones, so that their gradients and values are exercised
            for n, p in m.named_parameters():
                if n.endswith("norm.weight"):
                    p.uniform_(0.5, 1.5)
        dump(filename, m, torch.randn(2, 7, 12))


if __name__ == "__main__":
    main()
