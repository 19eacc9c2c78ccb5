"""Goldens for tests/train/io/test_nanogpt_names.cpp: nanoGPT's state-dict names (train/io/nanogpt.h), from PyTorch 1.13.

GPT below is written from karpathy/nanoGPT's model.py (GPTConfig, LayerNorm with optional bias and eps 1e-5,
CausalSelfAttention with c_attn / c_proj and, as under PyTorch < 2.0 where there is no
scaled_dot_product_attention, the causal-mask buffer "bias" = tril(ones(block_size, block_size)).view(1, 1, bs, bs);
MLP c_fc / GELU (erf) / c_proj; Block = ln_1, attn, ln_2, mlp (pre-LN); GPT = transformer.wte / wpe / drop / h /
ln_f and lm_head tied to wte). Its forward returns the logits at EVERY position (nanoGPT's training path,
lm_head(x); its inference path keeps only the last position).

Run with /usr/bin/python3 (the python with torch) from anywhere:
    /usr/bin/python3 tests/train/io/golden_nanogpt_names.py
The `safetensors` package is not needed (written by hand, as in golden_safetensors.py). Writes, under
tests/data/train/:
  nanogpt_bias.safetensors / .golden      a GPT with biases (block 8, vocab 11, 2 layers, 2 heads, 8 wide), its
                                          GPTConfig in the metadata as "nanogpt_config"; golden: "tokens", "logits"
  nanogpt_nobias.safetensors / .golden    without biases (bias=False), 2 heads, 12 wide, and NO metadata (a bare
                                          state dict: the config is inferred from the shapes, n_head given)
  nanogpt_names.txt                       "name d0 d1 ..." per tensor of GPT(block 8, vocab 11, 2 layers, 2 heads,
                                          8 wide, bias).state_dict() in its order, and the same for bias=False after a
                                          line "bias=False": what attograd's export must write
Every parameter is drawn N(0, 0.3) (LayerNorm weights 1 + N(0, 0.3)) so that biases and norms matter.

    /usr/bin/python3 tests/train/io/golden_nanogpt_names.py --check FILE.safetensors FILE.golden
loads a file written by attograd's export_nanogpt into GPT(GPTConfig(**metadata["nanogpt_config"])) with
load_state_dict(strict=True) and checks that its logits on the golden's "tokens" equal the golden's "logits" (what
attograd computed) within 1e-5. test_nanogpt_names.cpp writes such a pair when ATTOGRAD_NANOGPT_OUT names a
directory:
    ATTOGRAD_NANOGPT_OUT=/tmp/ng build/tests/train_io_test_nanogpt_names
    /usr/bin/python3 tests/train/io/golden_nanogpt_names.py --check /tmp/ng/export_bias.safetensors /tmp/ng/export_bias.golden
    /usr/bin/python3 tests/train/io/golden_nanogpt_names.py --check /tmp/ng/export_nobias.safetensors /tmp/ng/export_nobias.golden
Recorded (2026-11-27, PyTorch 1.13.0a0, weights N(0, 0.3), logits of magnitude ~2): export_bias (31 tensors) and
export_nobias (18 tensors) load strictly; max |logits - attograd's| = 3.58e-07 and 1.79e-06. The other direction
(test_nanogpt_names.cpp, in CI): 9.83e-07 (nanogpt_bias) and 1.48e-06 (nanogpt_nobias).
"""
import json
import math
import os
import struct
import sys
from dataclasses import dataclass

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))
from golden import write_golden  # noqa: E402
from golden_safetensors import read_safetensors, write_safetensors  # noqa: E402

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
from torch.nn import functional as F  # noqa: E402

DATA = os.path.join(os.path.dirname(os.path.dirname(HERE)), "data", "train")


# ---------------------------------------------------------------------------------------------
# nanoGPT's model.py semantics


@dataclass
class GPTConfig:
    block_size: int = 1024
    vocab_size: int = 50304
    n_layer: int = 12
    n_head: int = 12
    n_embd: int = 768
    dropout: float = 0.0
    bias: bool = True


class LayerNorm(nn.Module):
    def __init__(self, ndim, bias):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(ndim))
        self.bias = nn.Parameter(torch.zeros(ndim)) if bias else None

    def forward(self, input):
        return F.layer_norm(input, self.weight.shape, self.weight, self.bias, 1e-5)


class CausalSelfAttention(nn.Module):
    def __init__(self, config):
        super().__init__()
        assert config.n_embd % config.n_head == 0
        self.c_attn = nn.Linear(config.n_embd, 3 * config.n_embd, bias=config.bias)
        self.c_proj = nn.Linear(config.n_embd, config.n_embd, bias=config.bias)
        self.attn_dropout = nn.Dropout(config.dropout)
        self.resid_dropout = nn.Dropout(config.dropout)
        self.n_head = config.n_head
        self.n_embd = config.n_embd
        self.dropout = config.dropout
        # PyTorch 1.13 has no scaled_dot_product_attention: nanoGPT's slow path, with the mask as a buffer.
        self.flash = hasattr(torch.nn.functional, "scaled_dot_product_attention")
        assert not self.flash, "this reference is nanoGPT under PyTorch < 2.0"
        self.register_buffer("bias", torch.tril(torch.ones(config.block_size, config.block_size))
                             .view(1, 1, config.block_size, config.block_size))

    def forward(self, x):
        B, T, C = x.size()
        q, k, v = self.c_attn(x).split(self.n_embd, dim=2)
        k = k.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        q = q.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        v = v.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
        att = att.masked_fill(self.bias[:, :, :T, :T] == 0, float("-inf"))
        att = F.softmax(att, dim=-1)
        att = self.attn_dropout(att)
        y = att @ v
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        return self.resid_dropout(self.c_proj(y))


class MLP(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.c_fc = nn.Linear(config.n_embd, 4 * config.n_embd, bias=config.bias)
        self.gelu = nn.GELU()
        self.c_proj = nn.Linear(4 * config.n_embd, config.n_embd, bias=config.bias)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x):
        return self.dropout(self.c_proj(self.gelu(self.c_fc(x))))


class Block(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.ln_1 = LayerNorm(config.n_embd, bias=config.bias)
        self.attn = CausalSelfAttention(config)
        self.ln_2 = LayerNorm(config.n_embd, bias=config.bias)
        self.mlp = MLP(config)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.config = config
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(config.vocab_size, config.n_embd),
            wpe=nn.Embedding(config.block_size, config.n_embd),
            drop=nn.Dropout(config.dropout),
            h=nn.ModuleList([Block(config) for _ in range(config.n_layer)]),
            ln_f=LayerNorm(config.n_embd, bias=config.bias),
        ))
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        self.transformer.wte.weight = self.lm_head.weight  # weight tying

    def forward(self, idx):
        b, t = idx.size()
        assert t <= self.config.block_size
        pos = torch.arange(0, t, dtype=torch.long, device=idx.device)
        x = self.transformer.drop(self.transformer.wte(idx) + self.transformer.wpe(pos))
        for block in self.transformer.h:
            x = block(x)
        x = self.transformer.ln_f(x)
        return self.lm_head(x)  # (B, T, vocab): every position (nanoGPT's training path)


# ---------------------------------------------------------------------------------------------

CONFIGS = {
    "nanogpt_bias": GPTConfig(block_size=8, vocab_size=11, n_layer=2, n_head=2, n_embd=8, dropout=0.0, bias=True),
    "nanogpt_nobias": GPTConfig(block_size=8, vocab_size=11, n_layer=2, n_head=2, n_embd=12, dropout=0.0, bias=False),
}


def config_json(c):
    return json.dumps({"block_size": c.block_size, "vocab_size": c.vocab_size, "n_layer": c.n_layer,
                       "n_head": c.n_head, "n_embd": c.n_embd, "dropout": c.dropout, "bias": c.bias})


def reference(stem, seed, with_metadata):
    config = CONFIGS[stem]
    torch.manual_seed(seed)
    model = GPT(config).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():  # lm_head.weight is wte's: drawn once
            p.copy_(torch.randn_like(p) * 0.3 + (1.0 if ".ln_" in name and name.endswith("weight") else 0.0))
    tokens = torch.randint(0, config.vocab_size, (2, config.block_size))
    with torch.no_grad():
        logits = model(tokens)
    sd = model.state_dict()
    assert torch.equal(sd["lm_head.weight"], sd["transformer.wte.weight"])
    meta = {"format": "pt", "source": "tests/train/io/golden_nanogpt_names.py"}
    if with_metadata:
        meta["nanogpt_config"] = config_json(config)
    write_safetensors(os.path.join(DATA, stem + ".safetensors"), sd, meta)
    write_golden(os.path.join(DATA, stem + ".golden"), {"tokens": tokens, "logits": logits})


def names():
    with open(os.path.join(DATA, "nanogpt_names.txt"), "w") as f:
        for stem in ("nanogpt_bias", "nanogpt_nobias"):
            config = CONFIGS[stem]
            f.write("config %s\n" % config_json(config))
            for name, t in GPT(config).state_dict().items():
                f.write("%s %s\n" % (name, " ".join(str(d) for d in t.shape)))


def check(path, golden_path):
    state, metadata = read_safetensors(path)
    config = GPTConfig(**json.loads(metadata["nanogpt_config"]))
    model = GPT(config).eval()
    model.load_state_dict(state, strict=True)
    golden = read_golden(golden_path)
    with torch.no_grad():
        logits = model(golden["tokens"])
    err = (logits - golden["logits"]).abs().max().item()
    print("%s: %d tensors, GPTConfig %s, loaded strictly; max |logits - attograd's| = %.3g"
          % (path, len(state), metadata["nanogpt_config"], err))
    assert err < 1e-5
    print("OK")


def read_golden(path):
    dtypes = {"float32": torch.float32, "float64": torch.float64, "int64": torch.int64}
    out = {}
    with open(path) as f:
        assert f.readline().split() == ["attograd-golden", "1"]
        while True:
            head = f.readline().split()
            if not head:
                break
            name, dt, ndim = head[1], head[2], int(head[3])
            shape = [int(d) for d in head[4:4 + ndim]]
            values = f.readline().split()
            conv = int if dt == "int64" else float
            out[name] = torch.tensor([conv(v) for v in values], dtype=dtypes[dt]).reshape(shape)
    return out


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "--check":
        check(sys.argv[2], sys.argv[3])
        sys.exit(0)
    os.makedirs(DATA, exist_ok=True)
    reference("nanogpt_bias", 0, True)
    reference("nanogpt_nobias", 1, False)
    names()
