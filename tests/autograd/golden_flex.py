"""Golden files for tests/autograd/test_flex.cpp, from PyTorch 1.13 (float64), which has no FlexAttention: each
library mod is given to PyTorch as its dense equivalent (an additive bias, a tanh on the scores or a boolean mask).

Run with the Debian interpreter that has torch:  /usr/bin/python3 tests/autograd/golden_flex.py
Writes tests/data/autograd/flex_<case>.golden, each in float64 (config and doc_ids in int64):
  config        [B, H, L, d, prefix]
  q, k, v       (B, H, L, d)
  grad_output   the fixed upstream gradient (B, H, L, d)
  output, grad.q, grad.k, grad.v
  slopes        alibi cases: Press et al.'s slopes (their reference get_slopes)
  doc_ids       document cases: (B, L) sequence ids
  prefixes      prefix_lm_rows: (B) one prefix length per batch row
The *_rows cases (prefix_lm_mask(one length per row), document_mask of chosen documents) are also read with a block
mask of 4 x 4 blocks, some of them fully masked (skipped by the kernel).
"""
import math
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
from golden import write_golden  # noqa: E402

OUT = os.path.join(os.path.dirname(HERE), "data", "autograd")


def get_slopes(n):
    """ALiBi's reference slopes (github.com/ofirpress/attention_with_linear_biases)."""
    def pow2(n):
        start = 2 ** (-2 ** -(math.log2(n) - 3))
        return [start * start ** i for i in range(n)]
    if math.log2(n).is_integer():
        return pow2(n)
    c = 2 ** math.floor(math.log2(n))
    return pow2(c) + get_slopes(2 * c)[0::2][: n - c]


def case(name, B, H, L, d, kind, prefix=0, seed=0, prefixes=None, doc_lengths=None):
    torch.manual_seed(seed)
    q = torch.randn(B, H, L, d, dtype=torch.float64, requires_grad=True)
    k = torch.randn(B, H, L, d, dtype=torch.float64, requires_grad=True)
    v = torch.randn(B, H, L, d, dtype=torch.float64, requires_grad=True)
    go = torch.randn(B, H, L, d, dtype=torch.float64)
    s = q @ k.transpose(-1, -2) / d ** 0.5
    i = torch.arange(L).unsqueeze(1)
    j = torch.arange(L).unsqueeze(0)
    extra = {}
    if kind == "alibi":  # causal ALiBi: score + slope[h] * (j - i)
        slopes = torch.tensor(get_slopes(H), dtype=torch.float64)
        s = s + slopes.view(1, H, 1, 1) * (j - i).to(torch.float64)
        s = s.masked_fill(j > i, float("-inf"))
        extra["slopes"] = slopes
    elif kind == "softcap":  # cap tanh(s / cap), a small cap (2) so that it bends the scores
        s = 2.0 * torch.tanh(s / 2.0)
    elif kind == "prefix_lm":
        allowed = (j < prefix) | (j <= i)
        s = s.masked_fill(~allowed, float("-inf"))
    elif kind == "prefix_lm_rows":  # row b: q and kv both < prefixes[b] see each other, the rest is causal
        p = torch.tensor(prefixes, dtype=torch.int64).view(B, 1, 1)
        allowed = ((i < p) & (j < p)) | (j <= i)  # (B, L, L)
        s = s.masked_fill(~allowed.unsqueeze(1), float("-inf"))
        extra["prefixes"] = p.view(B)
    elif kind == "document":
        g = torch.Generator().manual_seed(seed + 1)
        if doc_lengths is not None:  # chosen documents per row
            lengths = torch.tensor([dl + [1] * L for dl in doc_lengths], dtype=torch.int64)
        else:
            lengths = torch.randint(1, L // 2, (B, L), generator=g)
        doc = torch.zeros(B, L, dtype=torch.int64)
        for b in range(B):  # packed sequences: cut the row into runs of the drawn lengths
            pos, idx = 0, 0
            while pos < L:
                n = int(lengths[b, idx])
                doc[b, pos : pos + n] = idx
                pos += n
                idx += 1
        allowed = (doc.unsqueeze(2) == doc.unsqueeze(1)) & (j <= i)
        s = s.masked_fill(~allowed.unsqueeze(1), float("-inf"))
        extra["doc_ids"] = doc
    out = torch.softmax(s, dim=-1) @ v
    out.backward(go)
    tensors = {
        "config": torch.tensor([B, H, L, d, prefix], dtype=torch.int64),
        "q": q.detach(), "k": k.detach(), "v": v.detach(), "grad_output": go,
        "output": out.detach(), "grad.q": q.grad, "grad.k": k.grad, "grad.v": v.grad,
    }
    tensors.update(extra)
    write_golden(os.path.join(OUT, f"flex_{name}.golden"), tensors)


if __name__ == "__main__":
    case("alibi_h4", 1, 4, 13, 4, "alibi", seed=1)
    case("alibi_h6", 1, 6, 9, 4, "alibi", seed=2)
    case("softcap", 1, 2, 15, 4, "softcap", seed=3)
    case("prefix_lm", 2, 1, 14, 4, "prefix_lm", prefix=5, seed=4)
    case("document", 2, 1, 18, 4, "document", seed=5)
    # Rows of different prefix lengths (none, part of the row, all of it) and chosen documents (a long first
    # document, so that 4 x 4 blocks below the diagonal are fully masked), two heads.
    case("prefix_lm_rows", 3, 2, 14, 4, "prefix_lm_rows", seed=6, prefixes=[0, 5, 14])
    case("document_rows", 2, 2, 18, 4, "document", seed=7, doc_lengths=[[6, 2, 10], [1, 9, 8]])
