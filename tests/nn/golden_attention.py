"""Golden files for tests/nn/test_attention.cpp, from PyTorch 1.13.

Run with the Debian interpreter that has torch:  /usr/bin/python3 tests/nn/golden_attention.py
Writes tests/data/nn/mha_<case>.golden (torch.nn.MultiheadAttention, batch_first=True, eval mode) and
tests/data/nn/seed_mha_<case>.golden (the seed's MultiHeadAttention, written out below).

Each file holds, in float32:
  param.<i>.<name>        every parameter, <i> = its position in named_parameters() (PyTorch's order)
  query, key, value       the inputs (key/value absent when self-attention passes query three times)
  key_padding_mask, attn_mask, mask   the masks given to PyTorch (bool or float), when present
  causal_mask             (int64 1) when the case is causal: PyTorch gets the explicit causal attn_mask,
                          attograd gets is_causal = true and attn_mask = the non-causal part (if any)
  config                  int64 [E, H, kdim, vdim, bias, add_bias_kv, add_zero_attn, average_attn_weights,
                          is_causal, self_attention]   (seed files: [n_head, d_model, d_k, d_v])
  grad_output             the fixed upstream gradient of the output
  output, weights         the forward results
  grad.query, grad.key, grad.value, grad.<i>.<name>   the gradients
"""
import os
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
from golden import write_golden  # noqa: E402

OUT = os.path.join(os.path.dirname(HERE), "data", "nn")


def causal(lq, lk):
    return torch.triu(torch.ones(lq, lk, dtype=torch.bool), diagonal=1)


def mha_case(name, E=4, H=2, B=2, Lq=3, Lk=5, kdim=None, vdim=None, bias=True, add_bias_kv=False,
             add_zero_attn=False, average=True, self_attention=False, kpm=None, attn_mask=None,
             is_causal=False, seed=0):
    torch.manual_seed(seed)
    m = nn.MultiheadAttention(E, H, bias=bias, add_bias_kv=add_bias_kv, add_zero_attn=add_zero_attn,
                              kdim=kdim, vdim=vdim, batch_first=True)
    # Non-zero biases, so that their gradients and effects are visible (PyTorch zeros them at init).
    with torch.no_grad():
        for n, p in m.named_parameters():
            if "bias" in n:
                p.uniform_(-0.5, 0.5)
    m.eval()
    if self_attention:
        Lk = Lq
    q = torch.randn(B, Lq, E, requires_grad=True)
    k = torch.randn(B, Lk, kdim or E, requires_grad=True)
    v = torch.randn(B, Lk, vdim or E, requires_grad=True)
    key_padding_mask = kpm(B, Lk) if kpm else None
    mask = attn_mask(B, H, Lq, Lk) if attn_mask else None
    torch_mask = mask
    if is_causal:
        c = causal(Lq, Lk)
        if mask is None:
            torch_mask = c
        elif mask.dtype == torch.bool:
            torch_mask = mask | c
        else:
            torch_mask = mask.masked_fill(c, float("-inf"))
    if self_attention:
        out, w = m(q, q, q, key_padding_mask=key_padding_mask, attn_mask=torch_mask,
                   average_attn_weights=average)
    else:
        out, w = m(q, k, v, key_padding_mask=key_padding_mask, attn_mask=torch_mask,
                   average_attn_weights=average)
    assert torch.isfinite(out).all() and torch.isfinite(w).all(), name
    g = torch.randn(out.shape)
    out.backward(g)

    t = {}
    params = list(m.named_parameters())
    for i, (n, p) in enumerate(params):
        t["param.%d.%s" % (i, n)] = p
    t["query"] = q
    if not self_attention:
        t["key"] = k
        t["value"] = v
    if key_padding_mask is not None:
        t["key_padding_mask"] = key_padding_mask
    if mask is not None:
        t["attn_mask"] = mask
    t["config"] = torch.tensor([E, H, kdim or 0, vdim or 0, int(bias), int(add_bias_kv), int(add_zero_attn),
                                int(average), int(is_causal), int(self_attention)])
    t["grad_output"] = g
    t["output"] = out
    t["weights"] = w
    t["grad.query"] = q.grad
    if not self_attention:
        t["grad.key"] = k.grad
        t["grad.value"] = v.grad
    for i, (n, p) in enumerate(params):
        t["grad.%d.%s" % (i, n)] = p.grad
    write_golden(os.path.join(OUT, "mha_%s.golden" % name), t)


# --- masks (none of them blocks every key of a query: PyTorch 1.13 gives NaN there) ---------------
def kpm_bool(B, Lk):
    m = torch.zeros(B, Lk, dtype=torch.bool)
    m[0, -2:] = True
    m[1, 0] = True
    return m


def kpm_tail(B, Lk):  # blocks only trailing keys: safe with a causal mask
    m = torch.zeros(B, Lk, dtype=torch.bool)
    m[0, -2:] = True
    return m


def kpm_float(B, Lk):
    m = torch.randn(B, Lk)
    m[0, -1] = float("-inf")
    return m


def mask2d_bool(B, H, Lq, Lk):
    m = torch.zeros(Lq, Lk, dtype=torch.bool)
    m[0, 1] = m[1, 2] = m[2, 0] = m[2, 4] = True
    return m


def mask2d_float(B, H, Lq, Lk):
    m = torch.randn(Lq, Lk)
    m[1, 3] = float("-inf")
    return m


def mask3d_bool(B, H, Lq, Lk):
    m = torch.rand(B * H, Lq, Lk) < 0.3
    m[:, :, 2] = False  # key 2 is never blocked here, nor by kpm_bool: no row is fully blocked
    return m


def mask3d_float(B, H, Lq, Lk):
    return torch.randn(B * H, Lq, Lk)


# --- the seed's formulation (attention-is-all-you-need-pytorch, transformer/SubLayers.py) ------------
class ScaledDotProductAttention(nn.Module):
    def __init__(self, temperature, attn_dropout=0.1):
        super().__init__()
        self.temperature = temperature
        self.dropout = nn.Dropout(attn_dropout)

    def forward(self, q, k, v, mask=None):
        attn = torch.matmul(q / self.temperature, k.transpose(2, 3))
        if mask is not None:
            attn = attn.masked_fill(mask == 0, -1e9)
        attn = self.dropout(F.softmax(attn, dim=-1))
        output = torch.matmul(attn, v)
        return output, attn


class SeedMultiHeadAttention(nn.Module):
    def __init__(self, n_head, d_model, d_k, d_v, dropout=0.1):
        super().__init__()
        self.n_head, self.d_k, self.d_v = n_head, d_k, d_v
        self.w_qs = nn.Linear(d_model, n_head * d_k, bias=False)
        self.w_ks = nn.Linear(d_model, n_head * d_k, bias=False)
        self.w_vs = nn.Linear(d_model, n_head * d_v, bias=False)
        self.fc = nn.Linear(n_head * d_v, d_model, bias=False)
        self.attention = ScaledDotProductAttention(temperature=d_k ** 0.5)
        self.dropout = nn.Dropout(dropout)
        self.layer_norm = nn.LayerNorm(d_model, eps=1e-6)

    def forward(self, q, k, v, mask=None):
        d_k, d_v, n_head = self.d_k, self.d_v, self.n_head
        sz_b, len_q, len_k, len_v = q.size(0), q.size(1), k.size(1), v.size(1)
        residual = q
        q = self.w_qs(q).view(sz_b, len_q, n_head, d_k)
        k = self.w_ks(k).view(sz_b, len_k, n_head, d_k)
        v = self.w_vs(v).view(sz_b, len_v, n_head, d_v)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        if mask is not None:
            mask = mask.unsqueeze(1)  # For head axis broadcasting.
        q, attn = self.attention(q, k, v, mask=mask)
        q = q.transpose(1, 2).contiguous().view(sz_b, len_q, -1)
        q = self.dropout(self.fc(q))
        q += residual
        q = self.layer_norm(q)
        return q, attn


def seed_case(name, n_head=2, d_model=6, d_k=3, d_v=2, B=2, Lq=4, Lk=5, keep_mask=None, seed=0):
    """keep_mask(B, Lq, Lk) -> the seed's mask (B, 1 or Lq, Lk) with 1 = attend; attograd gets its negation."""
    torch.manual_seed(seed)
    m = SeedMultiHeadAttention(n_head, d_model, d_k, d_v)
    with torch.no_grad():
        m.layer_norm.weight.uniform_(0.5, 1.5)
        m.layer_norm.bias.uniform_(-0.5, 0.5)
    m.eval()
    q = torch.randn(B, Lq, d_model, requires_grad=True)
    k = torch.randn(B, Lk, d_model, requires_grad=True)
    v = torch.randn(B, Lk, d_model, requires_grad=True)
    mask = keep_mask(B, Lq, Lk) if keep_mask else None
    out, attn = m(q, k, v, mask)
    g = torch.randn(out.shape)
    out.backward(g)
    t = {}
    params = list(m.named_parameters())
    for i, (n, p) in enumerate(params):
        t["param.%d.%s" % (i, n)] = p
    t["query"], t["key"], t["value"] = q, k, v
    if mask is not None:
        t["mask"] = mask  # the seed's convention: true = attend
    t["config"] = torch.tensor([n_head, d_model, d_k, d_v])
    t["grad_output"] = g
    t["output"] = out
    t["weights"] = attn
    t["grad.query"], t["grad.key"], t["grad.value"] = q.grad, k.grad, v.grad
    for i, (n, p) in enumerate(params):
        t["grad.%d.%s" % (i, n)] = p.grad
    write_golden(os.path.join(OUT, "seed_mha_%s.golden" % name), t)


def seed_pad_mask(B, Lq, Lk):  # (B, 1, Lk), like the seed's get_pad_mask
    m = torch.ones(B, 1, Lk, dtype=torch.bool)
    m[0, 0, -2:] = False
    return m


def seed_pad_and_subsequent(B, Lq, Lk):  # (B, Lq, Lk), like get_pad_mask & get_subsequent_mask
    return seed_pad_mask(B, Lq, Lk) & ~causal(Lq, Lk)


def main():
    os.makedirs(OUT, exist_ok=True)
    mha_case("nomask", seed=1)
    mha_case("self", self_attention=True, Lq=4, seed=2)
    mha_case("kpm_bool", kpm=kpm_bool, average=False, seed=3)
    mha_case("kpm_float", kpm=kpm_float, seed=4)
    mha_case("mask2d_bool", attn_mask=mask2d_bool, seed=5)
    mha_case("mask2d_float", attn_mask=mask2d_float, average=False, seed=6)
    mha_case("mask3d_bool_kpm", attn_mask=mask3d_bool, kpm=kpm_bool, average=False, seed=7)
    mha_case("mask3d_float", attn_mask=mask3d_float, seed=8)
    mha_case("causal", self_attention=True, Lq=5, is_causal=True, kpm=kpm_tail, average=False, seed=9)
    mha_case("causal_cross", Lq=5, Lk=5, is_causal=True, attn_mask=mask2d_float, seed=10)
    mha_case("kdim_vdim", kdim=6, vdim=5, Lq=4, Lk=3, kpm=kpm_bool, seed=11)
    mha_case("bias_kv", add_bias_kv=True, kpm=kpm_bool, attn_mask=mask2d_bool, average=False, seed=12)
    mha_case("zero_attn", add_zero_attn=True, attn_mask=mask2d_float, seed=13)
    mha_case("bias_kv_zero_attn", add_bias_kv=True, add_zero_attn=True, kdim=6, vdim=7, kpm=kpm_bool,
             attn_mask=mask3d_bool, average=False, seed=14)
    mha_case("causal_bias_kv", self_attention=True, Lq=4, is_causal=True, add_bias_kv=True, add_zero_attn=True,
             seed=15)
    mha_case("no_bias", bias=False, E=6, H=3, Lq=2, Lk=4, seed=16)
    seed_case("nomask", seed=21)
    seed_case("pad", keep_mask=seed_pad_mask, seed=22)
    seed_case("pad_causal", Lq=5, Lk=5, keep_mask=seed_pad_and_subsequent, seed=23)


if __name__ == "__main__":
    main()
