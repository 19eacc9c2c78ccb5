"""Generates the golden files of tests/nn/test_layers.cpp and tests/nn/test_feedforward.cpp with PyTorch 1.13.

Run from anywhere with the Python that has torch:  /usr/bin/python3 tests/nn/golden_layers.py
It writes small text files under tests/data/nn/ (kept in the tree: CI has no torch).

Each file holds, for one module in float32:
  param.<name>        every parameter, by PyTorch's name (the C++ test copies them into its module)
  input               the input (indices for Embedding)
  output              module(input)
  grad_output         a fixed random upstream gradient; backward is output.backward(grad_output)
  grad_input          d/d input (not for Embedding)
  grad.<name>         d/d every parameter
"""
import os
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))  # tests/, for golden.py
from golden import write_golden  # noqa: E402

OUT = os.path.join(os.path.dirname(HERE), "data", "nn")


def dump(filename, module, x, float_input=True):
    """Runs module(x), back-propagates a fixed random grad_output and writes everything."""
    if float_input:
        x = x.clone().requires_grad_(True)
    out = module(x)
    g = torch.randn(out.shape)
    out.backward(g)
    t = {}
    for name, p in module.named_parameters():
        t["param." + name] = p
    t["input"] = x
    t["output"] = out
    t["grad_output"] = g
    if float_input:
        t["grad_input"] = x.grad
    for name, p in module.named_parameters():
        t["grad." + name] = p.grad
    write_golden(os.path.join(OUT, filename), t)


class SeedPositionwiseFeedForward(nn.Module):
    """The seed's (attention-is-all-you-need-pytorch) PositionwiseFeedForward, verbatim."""

    def __init__(self, d_in, d_hid, dropout=0.1):
        super().__init__()
        self.w_1 = nn.Linear(d_in, d_hid)
        self.w_2 = nn.Linear(d_hid, d_in)
        self.layer_norm = nn.LayerNorm(d_in, eps=1e-6)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x):
        residual = x
        x = self.w_2(F.relu(self.w_1(x)))
        x = self.dropout(x)
        x += residual
        x = self.layer_norm(x)
        return x


class TorchFeedForward(nn.Module):
    """TransformerEncoderLayer's feed-forward block: linear2(dropout(activation(linear1(x))))."""

    def __init__(self, d_model, d_ff, dropout=0.1, activation="relu"):
        super().__init__()
        self.linear1 = nn.Linear(d_model, d_ff)
        self.dropout = nn.Dropout(dropout)
        self.linear2 = nn.Linear(d_ff, d_model)
        self.activation = F.relu if activation == "relu" else F.gelu

    def forward(self, x):
        return self.linear2(self.dropout(self.activation(self.linear1(x))))


def randomize_affine(ln):
    with torch.no_grad():
        ln.weight.copy_(1.0 + 0.3 * torch.randn(ln.weight.shape))
        ln.bias.copy_(0.2 * torch.randn(ln.bias.shape))


def main():
    os.makedirs(OUT, exist_ok=True)
    torch.manual_seed(20240601)

    dump("linear.golden", nn.Linear(4, 3), torch.randn(2, 3, 4))
    dump("linear_nobias.golden", nn.Linear(5, 2, bias=False), torch.randn(3, 5))

    ln = nn.LayerNorm(5)
    randomize_affine(ln)
    x = torch.randn(3, 4, 5)
    x[1, 2, :] = 0.7  # a constant row: normalises to the bias, finite gradients
    dump("layer_norm_1d.golden", ln, x)

    ln2 = nn.LayerNorm((3, 4))
    randomize_affine(ln2)
    x = torch.randn(2, 3, 3, 4)
    x[1, 0] = -1.25  # a constant (3, 4) block
    dump("layer_norm_2d.golden", ln2, x)

    emb = nn.Embedding(10, 3, padding_idx=0)
    idx = torch.tensor([[1, 0, 4, 4], [9, 2, 0, 1]], dtype=torch.int64)
    dump("embedding.golden", emb, idx, float_input=False)

    ff = TorchFeedForward(4, 8, dropout=0.1).eval()
    dump("feedforward.golden", ff, torch.randn(2, 3, 4))

    ff_gelu = TorchFeedForward(4, 6, dropout=0.1, activation="gelu").eval()
    dump("feedforward_gelu.golden", ff_gelu, torch.randn(2, 3, 4))

    seed = SeedPositionwiseFeedForward(4, 8, dropout=0.1).eval()
    randomize_affine(seed.layer_norm)
    dump("feedforward_seed.golden", seed, torch.randn(2, 3, 4))

    # Tables for PositionalEncoding (the seed's numpy formula) and padding / causal masks.
    import numpy as np

    def seed_table(n_position, d_hid):
        def angles(position):
            return [position / np.power(10000, 2 * (hid_j // 2) / d_hid) for hid_j in range(d_hid)]
        table = np.array([angles(p) for p in range(n_position)])
        table[:, 0::2] = np.sin(table[:, 0::2])
        table[:, 1::2] = np.cos(table[:, 1::2])
        return torch.FloatTensor(table).unsqueeze(0)

    write_golden(os.path.join(OUT, "positional.golden"),
                 {"pe_50_8": seed_table(50, 8), "pe_20_7": seed_table(20, 7)})


if __name__ == "__main__":
    main()
