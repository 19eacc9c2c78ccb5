"""Golden files for tests/nn/test_autocast_golden.cpp: CausalLM's forward in float32 and under mixed precision
against PyTorch 1.13's torch.autocast("cpu", dtype=torch.bfloat16), on the nanoGPT reference of golden_recipe.py
(imported, not copied) built in float32.

Run with the Debian interpreter that has torch:  /usr/bin/python3 tests/nn/golden_autocast.py
Writes tests/data/nn/autocast_<case>.golden.

Cases (golden_recipe.py's CASES; it has no case for attograd's default recipe, sinusoidal positions, so the second
is its LLaMA one):
  nanogpt  learned positions, GELU, LayerNorm, no bias, tied head
  llama    RoPE, SwiGLU, RMSNorm, no bias, tied head
at a size where the 8-bit mantissa of bfloat16 shows (a bf16 rounding is a relative error up to 2^-9, float32's
2^-24): vocab 32, d_model 32, 4 heads, d_ff 64 (nanogpt) / 48 (llama's SwiGLU, about 2/3 of the other's 3 weights),
2 layers, B 2, L 16. (d_model 64 / d_ff 256 would make a file of ~1.3 MB; these stay under 200 KB.)

Parameters are drawn as golden_recipe.py draws them (draw_params) and then rounded to 4 significant decimal digits,
so that they are written in a few characters; the float32 of those decimals is exactly what the reference runs on
(checked below), and the test loads the same float32 values.

PyTorch's CPU autocast (1.13) casts the inputs of linear, matmul, mm, bmm, ... to bfloat16 and returns bfloat16:
q, k, v, the attention scores, softmax (run on the bf16 scores, bf16 result), P V, the MLP's hidden activations and
the tied head's logits are bfloat16 values; the residual stream stays float32 (float32 + bf16 promotes to float32),
so do LayerNorm / RMSNorm of it; cross_entropy is on its float32 list (bf16 logits cast up). golden_recipe's rope
runs in float64 (complex128 angles); here it is wrapped, as LLaMA's apply_rotary_emb is (xq.float() ...
.type_as(xq)), to return its input's dtype: a float32 model stays float32, and under autocast the rotated q and k
are rounded back to bfloat16 (without it a float64 q would meet a bf16 v in att @ v).

Each file holds:
  config            int64 [vocab, d_model, n_head, d_ff, n_layers, max_len]
  param.<i>.<name>  float32, attograd's CausalLM names and order (golden_recipe.attograd_name / attograd_order)
  tokens (B, L), targets (B, L) int64
  logits_fp32 (B, L, V) float32: the float32 forward, no autocast; loss_fp32 ()
  logits_autocast (B, L, V): the forward under torch.autocast("cpu", dtype=torch.bfloat16) (bf16), cast to float32
  loss_autocast (): cross_entropy of those logits under the autocast (float32)
  logits_emulated (B, L, V) float32: attograd's autocast emulated on the float32 reference (attograd_bf16() below):
                    every linear and matmul on operands rounded to bf16, float32 results; P V with float32
                    probabilities (attograd rounds q, k, v on entry to the attention, not the scores or softmax)
"""
import contextlib
import os
import sys

import torch
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))
import golden_recipe  # noqa: E402
from golden import write_golden  # noqa: E402

OUT = os.path.join(os.path.dirname(HERE), "data", "nn")
PARAM_FMT = "%.4g"  # the parameters' decimals (see above)

_rope64 = golden_recipe.rope


def rope_typed(x, base=10000.0):
    """golden_recipe's rope (float64 angles) returning x's dtype, as LLaMA's apply_rotary_emb's type_as(xq)."""
    return _rope64(x.double(), base).to(x.dtype)


golden_recipe.rope = rope_typed  # CausalSelfAttention.forward looks it up in golden_recipe's namespace


@contextlib.contextmanager
def attograd_bf16():
    """attograd's autocast (autograd/autocast.h) on golden_recipe's float32 GPT: nn.Linear and the `@` products take
    operands rounded to bfloat16 (RNE) and return float32; the left operand of P V (softmax's output, tagged) is
    not rounded; everything else is the float32 reference."""
    bf = lambda t: t.to(torch.bfloat16).to(torch.float32)  # noqa: E731
    linear, matmul, softmax = torch.nn.Linear.forward, torch.Tensor.__matmul__, golden_recipe.F.softmax

    def probs(*args, **kwargs):
        p = softmax(*args, **kwargs)
        p._attograd_probs = True
        return p

    torch.nn.Linear.forward = lambda self, x: F.linear(bf(x), bf(self.weight), self.bias)
    torch.Tensor.__matmul__ = lambda a, b: matmul(a if getattr(a, "_attograd_probs", False) else bf(a), bf(b))
    golden_recipe.F.softmax = probs
    try:
        yield
    finally:
        torch.nn.Linear.forward, torch.Tensor.__matmul__, golden_recipe.F.softmax = linear, matmul, softmax


SIZES = dict(V=32, d=32, h=4, layers=2, max_len=16)
FF = {"nanogpt": 64, "llama": 48}
B, L = 2, 16


def short(p):
    """p rounded to PARAM_FMT's decimals, as float32 (double -> float32, as attograd's load_golden does)."""
    flat = [float(PARAM_FMT % v) for v in p.detach().reshape(-1).tolist()]
    return torch.tensor(flat, dtype=torch.float64).to(torch.float32).reshape(p.shape)


def case(name, seed):
    cfg = dict(SIZES, f=FF[name])
    cfg.update(golden_recipe.CASES[name])
    torch.manual_seed(seed)
    m = golden_recipe.GPT(cfg)  # float32
    golden_recipe.draw_params(m)
    with torch.no_grad():
        for _, p in m.named_parameters():
            p.copy_(short(p))
    for _, p in m.named_parameters():  # the decimals written read back as exactly these float32 values
        assert torch.equal(short(p), p)
    V = cfg["V"]
    seq = torch.randint(0, V, (B, L + 1))
    tokens, targets = seq[:, :-1].contiguous(), seq[:, 1:].contiguous()
    with torch.no_grad():
        logits32, loss32 = m(tokens, targets)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            logits_ac, loss_ac = m(tokens, targets)
        with attograd_bf16():
            logits_em, _ = m(tokens, targets)
    assert logits_em.dtype == torch.float32 and not torch.equal(logits_em, logits32)
    assert logits32.dtype == torch.float32 and loss32.dtype == torch.float32
    assert logits_ac.dtype == torch.bfloat16 and loss_ac.dtype == torch.float32, (logits_ac.dtype, loss_ac.dtype)
    logits_ac = logits_ac.float()
    assert torch.equal(loss_ac, F.cross_entropy(logits_ac.view(-1, V), targets.view(-1)))
    named = sorted(((golden_recipe.attograd_name(n), p) for n, p in m.named_parameters()),
                   key=lambda np_: golden_recipe.attograd_order(np_[0]))
    t = {"config": torch.tensor([V, cfg["d"], cfg["h"], cfg["f"], cfg["layers"], cfg["max_len"]])}
    formats = {}
    for i, (n, p) in enumerate(named):
        key = "param.%d.%s" % (i, n)
        t[key] = p
        formats[key] = PARAM_FMT
    t["tokens"] = tokens
    t["targets"] = targets
    t["logits_fp32"] = logits32
    t["loss_fp32"] = loss32
    t["logits_autocast"] = logits_ac
    t["loss_autocast"] = loss_ac
    t["logits_emulated"] = logits_em
    path = os.path.join(OUT, "autocast_%s.golden" % name)
    write_golden(path, t, formats)
    d, e = (logits_ac - logits32).abs(), (logits_em - logits_ac).abs()
    print("%s: %d params, logits max |.| %.3f, max |fp32 - autocast| %.4g (mean %.3g), max |emulated - autocast| %.4g"
          " (mean %.3g), loss fp32 %.6f autocast %.6f, %d bytes"
          % (name, sum(p.numel() for _, p in named), logits32.abs().max().item(), d.max().item(), d.mean().item(),
             e.max().item(), e.mean().item(), loss32.item(), loss_ac.item(), os.path.getsize(path)))


def main():
    os.makedirs(OUT, exist_ok=True)
    case("nanogpt", seed=40)
    case("llama", seed=41)


if __name__ == "__main__":
    main()
