"""Golden files for tests/nn/test_transformer.cpp and tests/nn/test_models.cpp, from PyTorch 1.13.

Run with the Debian interpreter that has torch:  /usr/bin/python3 tests/nn/golden_transformer.py
Writes, under tests/data/nn/:
  transformer_encoder_post.golden   nn.TransformerEncoderLayer(batch_first=True), post-LN, relu,
                                    causal src_mask + src_key_padding_mask
  transformer_encoder_pre.golden    same with norm_first=True, gelu
  transformer_decoder_post.golden   nn.TransformerDecoderLayer(batch_first=True), post-LN, relu,
                                    causal tgt_mask + memory_key_padding_mask
  transformer_decoder_pre.golden    same with norm_first=True, gelu, plus a tgt_key_padding_mask
  causal_lm.golden                  the CausalLM of nn/models.h, re-implemented below with the same
                                    parameter names, with mask_padding on
  encoder_tagger.golden             the EncoderTagger of nn/encoder_tagger.h, built below from
                                    nn.TransformerEncoderLayer(norm_first=True) with the same parameter names,
                                    right padding as a key padding mask

All in eval mode (dropout off). Inputs require grad, which also keeps PyTorch 1.13's fast path for
encoder layers off, so the reference is the standard math path. Each file holds, in float32:
  param.<i>.<name>     every parameter, <i> = its position in named_parameters() (PyTorch's order);
                       biases and LayerNorm weights are perturbed away from PyTorch's 0 / 1 init so that
                       their effects and gradients are visible
  config               int64: layers [d_model, nhead, dim_feedforward, norm_first, gelu];
                       causal_lm [vocab, d_model, n_head, d_ff, n_layers, max_len, pad_idx, mask_padding]
                       encoder_tagger [vocab, d_model, n_head, d_ff, n_layers, max_len, pad_idx]
  src / tgt, memory / tokens               the inputs
  src_mask, src_key_padding_mask, tgt_mask, tgt_key_padding_mask, memory_key_padding_mask
                       Bool masks (True = blocked), when present
  grad_output          the fixed upstream gradient of the output
  output               the forward result
  grad.src / grad.tgt, grad.memory, grad.<i>.<name>   the gradients
"""
import math
import os
import sys

import torch
import torch.nn as nn

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
from golden import write_golden  # noqa: E402

OUT = os.path.join(os.path.dirname(HERE), "data", "nn")


def causal(n):
    return torch.triu(torch.ones(n, n, dtype=torch.bool), diagonal=1)


def right_padding(lengths, n):
    """(B, n) Bool, True at positions >= lengths[b]."""
    return torch.arange(n)[None, :] >= torch.tensor(lengths)[:, None]


def perturb(module):
    with torch.no_grad():
        for n, p in module.named_parameters():
            if n.endswith("bias"):
                p.uniform_(-0.5, 0.5)
            elif "norm" in n and n.endswith("weight"):
                p.uniform_(0.7, 1.3)


def params_and_grads(module):
    t, g = {}, {}
    for i, (n, p) in enumerate(module.named_parameters()):
        t["param.%d.%s" % (i, n)] = p
        g["grad.%d.%s" % (i, n)] = p.grad
    return t, g


def encoder_case(name, norm_first, activation, B=2, L=5, D=4, H=2, F=8, seed=0):
    torch.manual_seed(seed)
    m = nn.TransformerEncoderLayer(D, H, dim_feedforward=F, dropout=0.1, activation=activation,
                                   batch_first=True, norm_first=norm_first)
    perturb(m)
    m.eval()
    src = torch.randn(B, L, D, requires_grad=True)
    src_mask = causal(L)
    kpm = right_padding([L, L - 2], L)
    out = m(src, src_mask=src_mask, src_key_padding_mask=kpm)
    assert torch.isfinite(out).all(), name
    g = torch.randn(out.shape)
    out.backward(g)
    t, grads = params_and_grads(m)
    t["config"] = torch.tensor([D, H, F, int(norm_first), int(activation == "gelu")])
    t["src"] = src
    t["src_mask"] = src_mask
    t["src_key_padding_mask"] = kpm
    t["grad_output"] = g
    t["output"] = out
    t["grad.src"] = src.grad
    t.update(grads)
    write_golden(os.path.join(OUT, name + ".golden"), t)


def decoder_case(name, norm_first, activation, tgt_padding, B=2, T=4, S=6, D=4, H=2, F=8, seed=1):
    torch.manual_seed(seed)
    m = nn.TransformerDecoderLayer(D, H, dim_feedforward=F, dropout=0.1, activation=activation,
                                   batch_first=True, norm_first=norm_first)
    perturb(m)
    m.eval()
    tgt = torch.randn(B, T, D, requires_grad=True)
    memory = torch.randn(B, S, D, requires_grad=True)
    tgt_mask = causal(T)
    mkpm = right_padding([S - 1, S - 3], S)
    tkpm = right_padding([T, T - 1], T) if tgt_padding else None
    out = m(tgt, memory, tgt_mask=tgt_mask, tgt_key_padding_mask=tkpm, memory_key_padding_mask=mkpm)
    assert torch.isfinite(out).all(), name
    g = torch.randn(out.shape)
    out.backward(g)
    t, grads = params_and_grads(m)
    t["config"] = torch.tensor([D, H, F, int(norm_first), int(activation == "gelu")])
    t["tgt"] = tgt
    t["memory"] = memory
    t["tgt_mask"] = tgt_mask
    if tkpm is not None:
        t["tgt_key_padding_mask"] = tkpm
    t["memory_key_padding_mask"] = mkpm
    t["grad_output"] = g
    t["output"] = out
    t["grad.tgt"] = tgt.grad
    t["grad.memory"] = memory.grad
    t.update(grads)
    write_golden(os.path.join(OUT, name + ".golden"), t)


# ---------------------------------------------------------------------------------------------
# CausalLM (nn/models.h), written out with the same parameter names


def sinusoidal_table(n, d):
    """The seed's table: pos / 10000^(2 (j // 2) / d), sin on even j, cos on odd j; double, then float32."""
    pos = torch.arange(n, dtype=torch.float64)[:, None]
    j = torch.arange(d)
    angle = pos / torch.pow(torch.tensor(10000.0, dtype=torch.float64), (2 * (j // 2)).double() / d)
    table = torch.where(j % 2 == 0, torch.sin(angle), torch.cos(angle))
    return table.float()


class FeedForward(nn.Module):
    def __init__(self, d, f, p):
        super().__init__()
        self.linear1 = nn.Linear(d, f)
        self.dropout = nn.Dropout(p)
        self.linear2 = nn.Linear(f, d)

    def forward(self, x):
        return self.linear2(self.dropout(torch.relu(self.linear1(x))))


class CausalLMBlock(nn.Module):
    def __init__(self, d, h, f, p):
        super().__init__()
        self.norm1 = nn.LayerNorm(d, eps=1e-6)
        self.self_attn = nn.MultiheadAttention(d, h, dropout=p, batch_first=True)
        self.dropout1 = nn.Dropout(p)
        self.norm2 = nn.LayerNorm(d, eps=1e-6)
        self.ff = FeedForward(d, f, p)
        self.dropout2 = nn.Dropout(p)

    def forward(self, x, key_padding_mask):
        h = self.norm1(x)
        a = self.self_attn(h, h, h, attn_mask=causal(x.size(1)), key_padding_mask=key_padding_mask,
                           need_weights=False)[0]
        x = x + self.dropout1(a)
        return x + self.dropout2(self.ff(self.norm2(x)))


class CausalLM(nn.Module):
    def __init__(self, vocab, d, h, f, n_layers, p, max_len, pad_idx):
        super().__init__()
        self.d, self.pad_idx = d, pad_idx
        self.embed = nn.Embedding(vocab, d)
        self.register_buffer("pe", sinusoidal_table(max_len, d))
        self.dropout = nn.Dropout(p)
        self.blocks = nn.ModuleList([CausalLMBlock(d, h, f, p) for _ in range(n_layers)])
        self.norm = nn.LayerNorm(d, eps=1e-6)

    def forward(self, tokens, mask_padding):
        L = tokens.size(1)
        x = self.dropout(self.embed(tokens) * math.sqrt(self.d) + self.pe[:L])
        kpm = tokens == self.pad_idx if mask_padding else None
        for b in self.blocks:
            x = b(x, kpm)
        return self.norm(x) @ self.embed.weight.t()


def causal_lm_case(name, V=7, D=4, H=2, F=8, n_layers=2, max_len=8, pad_idx=0, seed=2):
    torch.manual_seed(seed)
    m = CausalLM(V, D, H, F, n_layers, 0.1, max_len, pad_idx)
    perturb(m)
    with torch.no_grad():
        m.embed.weight.mul_(D ** -0.5)
    m.eval()
    tokens = torch.tensor([[3, 1, 4, 1, 5], [2, 6, 5, 0, 0]])
    out = m(tokens, True)
    g = torch.randn(out.shape)
    out.backward(g)
    t, grads = params_and_grads(m)
    t["config"] = torch.tensor([V, D, H, F, n_layers, max_len, pad_idx, 1])
    t["tokens"] = tokens
    t["grad_output"] = g
    t["output"] = out
    t.update(grads)
    write_golden(os.path.join(OUT, name + ".golden"), t)


# ---------------------------------------------------------------------------------------------
# EncoderTagger (nn/encoder_tagger.h), with the same parameter names


class Pos(nn.Module):
    def __init__(self, d, max_len, p):
        super().__init__()
        self.register_buffer("pe", sinusoidal_table(max_len, d)[None])
        self.dropout = nn.Dropout(p)

    def forward(self, x):
        return self.dropout(x + self.pe[:, : x.shape[1]])


class EncoderTagger(nn.Module):
    def __init__(self, vocab, d, h, f, n_layers, p, max_len, pad_idx):
        super().__init__()
        self.d, self.pad_idx = d, pad_idx
        self.embed = nn.Embedding(vocab, d)
        self.pos = Pos(d, max_len, p)
        self.layers = nn.ModuleList([nn.TransformerEncoderLayer(d, h, dim_feedforward=f, dropout=p, batch_first=True,
                                                                norm_first=True) for _ in range(n_layers)])
        self.norm = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab)

    def forward(self, tokens):
        x = self.pos(self.embed(tokens) * math.sqrt(self.d))
        kpm = tokens == self.pad_idx
        for layer in self.layers:
            x = layer(x, src_key_padding_mask=kpm)
        return self.head(self.norm(x))


def encoder_tagger_case(name, V=9, D=4, H=2, F=8, n_layers=2, max_len=6, pad_idx=0, seed=3):
    torch.manual_seed(seed)
    m = EncoderTagger(V, D, H, F, n_layers, 0.1, max_len, pad_idx)
    perturb(m)
    m.eval()
    tokens = torch.tensor([[5, 6, 7, 8, 3], [6, 5, 3, 0, 0]])  # src SEP, right-padded
    out = m(tokens)
    g = torch.randn(out.shape)
    out.backward(g)
    t, grads = params_and_grads(m)
    t["config"] = torch.tensor([V, D, H, F, n_layers, max_len, pad_idx])
    t["tokens"] = tokens
    t["grad_output"] = g
    t["output"] = out
    t.update(grads)
    write_golden(os.path.join(OUT, name + ".golden"), t)


def main():
    os.makedirs(OUT, exist_ok=True)
    encoder_case("transformer_encoder_post", norm_first=False, activation="relu")
    encoder_case("transformer_encoder_pre", norm_first=True, activation="gelu")
    decoder_case("transformer_decoder_post", norm_first=False, activation="relu", tgt_padding=False)
    decoder_case("transformer_decoder_pre", norm_first=True, activation="gelu", tgt_padding=True)
    causal_lm_case("causal_lm")
    encoder_tagger_case("encoder_tagger")


if __name__ == "__main__":
    main()
