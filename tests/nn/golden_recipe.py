"""Golden files for tests/nn/test_recipe_golden.cpp: CausalLM built from an ArchitectureSpec (nn/sequence_model.h)
against a PyTorch reference written from nanoGPT's model.py (Karpathy, github.com/karpathy/nanoGPT), float64.

Run with the Debian interpreter that has torch:  /usr/bin/python3 tests/nn/golden_recipe.py
Writes tests/data/nn/recipe_<case>.golden.

The reference is nanoGPT's GPT with its own module names (transformer.wte / wpe / h.<i>.ln_1 / attn.c_attn /
attn.c_proj / ln_2 / mlp.c_fc / mlp.c_proj / ln_f, lm_head tied to wte), written out below from model.py's
semantics:
  x = wte(idx) * s + wpe(pos)          (s = 1 in nanoGPT; sqrt(D) for embed_scale "sqrt"; no wpe without learned
                                        positions)
  per block (pre-LN):  x = x + c_proj(attention(ln_1(x)));  x = x + mlp(ln_2(x))
  attention: q, k, v = c_attn(x).split(D, dim=2) (c_attn.weight (3D, D), as attograd's in_proj_weight = [q; k; v]),
             heads (B, H, L, D/H), softmax(q k^T / sqrt(D/H) + causal mask) v, heads merged, c_proj
  mlp: c_proj(gelu(c_fc(x))) (gelu exact, or approximate="tanh" for "gelu-tanh");
       swiglu (LLaMA's FeedForward: w2(silu(w1 x) * w3 x)) as c_proj(silu(c_fc(x)) * c_fc3(x))
  LayerNorm(D, bias) is nanoGPT's: F.layer_norm(x, (D,), weight, bias-or-None, eps)
  logits = ln_f(x) wte.weight^T (tied), or lm_head(ln_f(x)) untied
  loss = cross_entropy(logits.view(-1, V), targets.view(-1)) (mean over every next-token position)
Generalised beyond nanoGPT with: RMSNorm (x / sqrt(mean(x^2) + eps) * weight, LLaMA's), RoPE on q and k of every
head with the INTERLEAVED pairing of attograd (autograd/rope.h, tests/autograd/golden_rope.py: features (2i, 2i+1)
rotated by p * 10000^(-2i / head_dim), llama's apply_rotary_emb through view_as_complex), no positions at all.

Parameters are drawn away from their init (weights N(0, 1/fan_in)-ish, norm weights U(0.7, 1.3), biases
U(-0.5, 0.5)) so that every path and gradient is visible. Dropout 0.

Each file holds, in float64 (tokens and targets int64):
  config            int64 [vocab, d_model, n_head, d_ff, n_layers, max_len]
  param.<i>.<name>  every parameter under attograd's CausalLM name (NAME_MAP below), <i> = attograd's order
  tokens (B, L), targets (B, L) = the next tokens
  logits (B, L, V), loss (), grad.<i>.<name> = d loss / d parameter
The architecture of each case is in CASES below and, as ArchitectureSpec fields, in tests/nn/test_recipe_golden.cpp.
"""
import math
import os
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
from golden import write_golden  # noqa: E402

OUT = os.path.join(os.path.dirname(HERE), "data", "nn")


class LayerNorm(nn.Module):
    """nanoGPT's LayerNorm with an optional bias (PyTorch 1.13's nn.LayerNorm has no bias=False)."""

    def __init__(self, d, bias, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d))
        self.bias = nn.Parameter(torch.zeros(d)) if bias else None
        self.eps = eps

    def forward(self, x):
        return F.layer_norm(x, self.weight.shape, self.weight, self.bias, self.eps)


class RMSNorm(nn.Module):
    def __init__(self, d, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d))
        self.eps = eps

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def make_norm(cfg):
    if cfg["norm"] == "rmsnorm":
        return RMSNorm(cfg["d"], cfg["eps"])
    return LayerNorm(cfg["d"], cfg["bias"], cfg["eps"])


def rope(x, base=10000.0):
    """x (B, H, L, d) -> rotated at positions 0 .. L-1, interleaved pairs (2i, 2i+1) (llama's apply_rotary_emb)."""
    B, H, L, d = x.shape
    freqs = 1.0 / (base ** (torch.arange(0, d, 2, dtype=torch.float64) / d))
    angle = torch.outer(torch.arange(L, dtype=torch.float64), freqs)  # (L, d/2)
    cis = torch.polar(torch.ones_like(angle), angle)
    xc = torch.view_as_complex(x.reshape(B, H, L, d // 2, 2).contiguous())
    return torch.view_as_real(xc * cis).reshape(B, H, L, d)


class CausalSelfAttention(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        d = cfg["d"]
        self.c_attn = nn.Linear(d, 3 * d, bias=cfg["bias"])
        self.c_proj = nn.Linear(d, d, bias=cfg["bias"])
        self.n_head, self.n_embd, self.rope = cfg["h"], d, cfg["positions"] == "rope"

    def forward(self, x):
        B, T, C = x.size()
        q, k, v = self.c_attn(x).split(self.n_embd, dim=2)
        k = k.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)  # (B, nh, T, hs)
        q = q.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        v = v.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        if self.rope:
            q, k = rope(q), rope(k)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
        att = att.masked_fill(torch.triu(torch.ones(T, T, dtype=torch.bool), diagonal=1), float("-inf"))
        att = F.softmax(att, dim=-1)
        y = (att @ v).transpose(1, 2).contiguous().view(B, T, C)
        return self.c_proj(y)


class MLP(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        d, f, b = cfg["d"], cfg["f"], cfg["bias"]
        self.act = cfg["activation"]
        self.c_fc = nn.Linear(d, f, bias=b)
        if self.act == "swiglu":
            self.c_fc3 = nn.Linear(d, f, bias=b)
        self.c_proj = nn.Linear(f, d, bias=b)

    def forward(self, x):
        if self.act == "swiglu":
            h = F.silu(self.c_fc(x)) * self.c_fc3(x)
        elif self.act == "gelu-tanh":
            h = F.gelu(self.c_fc(x), approximate="tanh")
        elif self.act == "gelu":
            h = F.gelu(self.c_fc(x))
        else:
            h = F.relu(self.c_fc(x))
        return self.c_proj(h)


class Block(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.ln_1 = make_norm(cfg)
        self.attn = CausalSelfAttention(cfg)
        self.ln_2 = make_norm(cfg)
        self.mlp = MLP(cfg)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        t = dict(wte=nn.Embedding(cfg["V"], cfg["d"]))
        if cfg["positions"] == "learned":
            t["wpe"] = nn.Embedding(cfg["max_len"], cfg["d"])
        t["h"] = nn.ModuleList([Block(cfg) for _ in range(cfg["layers"])])
        t["ln_f"] = make_norm(cfg)
        self.transformer = nn.ModuleDict(t)
        if cfg["head"] == "untied":
            self.lm_head = nn.Linear(cfg["d"], cfg["V"], bias=cfg["bias"])

    def forward(self, idx, targets):
        B, T = idx.size()
        scale = math.sqrt(self.cfg["d"]) if self.cfg["embed_scale"] == "sqrt" else 1.0
        x = self.transformer.wte(idx) * scale
        if self.cfg["positions"] == "learned":
            x = x + self.transformer.wpe(torch.arange(0, T, dtype=torch.long))
        if self.cfg["positions"] == "sinusoidal":
            raise ValueError("not a case here")
        for block in self.transformer.h:
            x = block(x)
        x = self.transformer.ln_f(x)
        if self.cfg["head"] == "untied":
            logits = self.lm_head(x)
        else:
            logits = x @ self.transformer.wte.weight.t()  # nanoGPT's weight tying
        loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))
        return logits, loss


def attograd_name(n):
    """nanoGPT's parameter name -> attograd's CausalLM name."""
    n = n.replace("transformer.wte.", "embed.").replace("transformer.wpe.", "pos_embed.")
    n = n.replace("transformer.ln_f.", "norm.").replace("lm_head.", "head.").replace("transformer.h.", "blocks.")
    for a, b in [(".ln_1.", ".norm1."), (".ln_2.", ".norm2."), (".attn.c_attn.weight", ".self_attn.in_proj_weight"),
                 (".attn.c_attn.bias", ".self_attn.in_proj_bias"), (".attn.c_proj.", ".self_attn.out_proj."),
                 (".mlp.c_fc.", ".ff.linear1."), (".mlp.c_fc3.", ".ff.linear3."), (".mlp.c_proj.", ".ff.linear2.")]:
        n = n.replace(a, b)
    return n


def attograd_order(name):
    """attograd's registration order: embed, pos_embed, blocks (norm1, self_attn, norm2, ff: linear1, linear3,
    linear2), norm, head; weight before bias."""
    top = ["embed.", "pos_embed.", "blocks.", "norm.", "head."]
    i = next(k for k, p in enumerate(top) if name.startswith(p))
    block, inner = 0, 0
    if name.startswith("blocks."):
        parts = name.split(".")
        block = int(parts[1])
        order = ["norm1.weight", "norm1.bias", "self_attn.in_proj_weight", "self_attn.in_proj_bias",
                 "self_attn.out_proj.weight", "self_attn.out_proj.bias", "norm2.weight", "norm2.bias",
                 "ff.linear1.weight", "ff.linear1.bias", "ff.linear3.weight", "ff.linear3.bias", "ff.linear2.weight",
                 "ff.linear2.bias"]
        inner = order.index(".".join(parts[2:]))
    else:
        inner = 0 if name.endswith("weight") else 1
    return (i, block, inner)


def draw_params(m):
    """Every parameter of m drawn away from its init: biases U(-0.5, 0.5), norm weights U(0.7, 1.3), embeddings
    N(0, 0.5), the other weights N(0, 1/fan_in)."""
    with torch.no_grad():
        for n, p in m.named_parameters():
            if n.endswith("bias"):
                p.uniform_(-0.5, 0.5)
            elif "ln_" in n or "ln_f" in n:
                p.uniform_(0.7, 1.3)
            elif p.dim() == 2 and ("wte" in n or "wpe" in n):
                p.normal_(0.0, 0.5)
            else:
                p.normal_(0.0, 1.0 / math.sqrt(p.shape[1]))


def case(name, cfg, seed):
    torch.manual_seed(seed)
    m = GPT(cfg).double()
    draw_params(m)
    B, L, V = 2, 5, cfg["V"]
    seq = torch.randint(0, V, (B, L + 1))
    tokens, targets = seq[:, :-1].contiguous(), seq[:, 1:].contiguous()
    logits, loss = m(tokens, targets)
    loss.backward()
    named = sorted(((attograd_name(n), p) for n, p in m.named_parameters()), key=lambda np_: attograd_order(np_[0]))
    t = {"config": torch.tensor([V, cfg["d"], cfg["h"], cfg["f"], cfg["layers"], cfg["max_len"]])}
    for i, (n, p) in enumerate(named):
        t["param.%d.%s" % (i, n)] = p
    t["tokens"] = tokens
    t["targets"] = targets
    t["logits"] = logits
    t["loss"] = loss
    for i, (n, p) in enumerate(named):
        t["grad.%d.%s" % (i, n)] = p.grad
    write_golden(os.path.join(OUT, "recipe_%s.golden" % name), t)


SIZES = dict(V=11, d=8, h=2, f=16, layers=2, max_len=8)

CASES = {
    # `--recipe nanogpt`: positions learned, gelu, no bias, LayerNorm eps 1e-5, embed_scale none, head tied (init
    # gpt2 only changes the starting values, which the golden replaces).
    "nanogpt": dict(positions="learned", activation="gelu", norm="layernorm", eps=1e-5, bias=False,
                    embed_scale="none", head="tied"),
    # LLaMA's pieces: RMSNorm, SwiGLU, RoPE, no bias anywhere, no embedding scale.
    "llama": dict(positions="rope", activation="swiglu", norm="rmsnorm", eps=1e-6, bias=False, embed_scale="none",
                  head="tied"),
    # The rest of the options: GPT-2's tanh GELU, biases kept (LayerNorm and every Linear, the untied head's too),
    # no positions at all, the sqrt(D) embedding scale, an untied head.
    "gelu_tanh_untied": dict(positions="none", activation="gelu-tanh", norm="layernorm", eps=1e-5, bias=True,
                             embed_scale="sqrt", head="untied"),
}


def main():
    os.makedirs(OUT, exist_ok=True)
    for seed, (name, arch) in enumerate(CASES.items()):
        cfg = dict(SIZES)
        cfg.update(arch)
        case(name, cfg, seed=10 + seed)


if __name__ == "__main__":
    main()
