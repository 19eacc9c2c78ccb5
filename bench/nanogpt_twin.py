#!/usr/bin/python3
"""bench/nanogpt_twin.py: a nanoGPT-style PyTorch twin of `attograd train --text FILE --recipe nanogpt`.

Run with /usr/bin/python3 (PyTorch 1.13). Written from nanoGPT's model.py and train.py semantics (karpathy/nanoGPT;
see /work/shared/REFERENCE.md): token embedding `wte` plus learned positions `wpe`, no embedding scale; pre-LN
blocks `x = x + attn(ln_1(x)); x = x + mlp(ln_2(x))` with LayerNorm(bias=False, eps 1e-5); CausalSelfAttention with
`c_attn` (q, k, v in that order), a causal mask (PyTorch 1.13 has no flash attention: the masked_fill path) and
`c_proj`; MLP `c_fc` -> nn.GELU() (erf) -> `c_proj`; final `ln_f`; `lm_head` tied to `wte`; no biases
(bias=False); dropout 0. Init as `_init_weights`: Linear and Embedding weights N(0, 0.02), every `c_proj.weight`
N(0, 0.02/sqrt(2 n_layer)). AdamW with two groups as `configure_optimizers` (weight decay on parameters of 2+
dimensions only), nanoGPT's `get_lr` (lr (it+1)/(warmup+1) while it < warmup, cosine to min_lr at lr_decay_iters,
min_lr after), gradient clipping at 1.0, batches of random windows as `get_batch` (the global generator, seeded
once with --seed, draws the init and the batches, as nanoGPT's torch.manual_seed(1337 + seed_offset)).

Data, exactly as attograd's `train --text` (train/data/text.cpp, TextDataset):
  - the file is read as UTF-8, CRLF becomes LF; the vocabulary is attograd's: ids 0-3 are its reserved
    <pad> <bos> <eos> <sep> (never in the text, but rows of the embedding and the tied head: V = 4 + distinct),
    then the file's distinct code points in code-point order (ids 4, 5, ...);
  - the held-out split is the last int(n * val_fraction) characters (contiguous, at the end), the rest trains;
  - a training window is a random start in [0, n_train - context) (get_batch), inputs the first `context`
    characters, targets the next character at every position;
  - the validation loss is attograd's: the mean cross-entropy over every target of the first --eval-size held-out
    windows, which are the windows of context + 1 characters starting at n_train, n_train + context, ... (the
    last one shorter); with --eval-size larger than their number, all of them;
  - at each evaluation, as attograd (and nanoGPT's estimate_loss, which measures both splits), also a training
    loss on a fixed set of as many training windows (drawn once from a separate generator; attograd draws its own
    set from its data stream, so this number is comparable in cost, not window for window).

Evaluations at step 0 and every --eval-every steps (step k = after k updates, attograd's numbering; nanoGPT's
eval at iter_num k also comes after k updates). Each prints one line, flushed:
    eval @ step K: val loss X, train loss Y
and the end prints one JSON line with the curve, vocabulary and split sizes, and the process CPU seconds at each
evaluation (time.process_time(); bench/nanogpt_side_by_side measures the process from outside as well).

    /usr/bin/python3 bench/nanogpt_twin.py --text runs/fortunes.txt --seed 1
    /usr/bin/python3 bench/nanogpt_twin.py --text runs/fortunes.txt --dump-split   # vocabulary and split only
"""

import argparse
import json
import math
import os
import sys
import time

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_malloc import keep_freed_memory  # noqa: E402

keep_freed_memory()  # before torch allocates: freed tensors stay mapped (bench/torch_malloc.py)

RESERVED = 4  # attograd's <pad> <bos> <eos> <sep>


def load_text(path, val_fraction):
    """attograd's TextDataset: (token ids, vocabulary size, chars, n_train)."""
    with open(path, "rb") as f:
        raw = f.read()
    text = raw.decode("utf-8", errors="strict").replace("\r\n", "\n")
    chars = sorted(set(text))  # code-point order (= UTF-8 byte order), as attograd's std::set<char32_t>
    index = {c: RESERVED + i for i, c in enumerate(chars)}
    ids = [index[c] for c in text]
    n = len(ids)
    n_val = int(float(n) * val_fraction)  # static_cast<int64_t>(double(n) * val_fraction)
    return ids, RESERVED + len(chars), chars, n - n_val


def heldout_windows(ids, n_train, context, count):
    """attograd's TextDataset::heldout(count): windows of context + 1 starting every `context` from n_train."""
    out, total, s = [], len(ids), n_train
    while s + 1 < total and len(out) < count:
        e = min(total, s + context + 1)
        out.append(ids[s:e])
        s += context
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0], epilog=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--text", required=True)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--steps", type=int, default=2000, help="max_iters")
    ap.add_argument("--context", type=int, default=64, help="block_size")
    ap.add_argument("--batch", type=int, default=12, help="batch_size")
    ap.add_argument("--layers", type=int, default=4, help="n_layer")
    ap.add_argument("--heads", type=int, default=4, help="n_head")
    ap.add_argument("--d-model", type=int, default=128, help="n_embd (the MLP is 4 n_embd wide, as nanoGPT)")
    ap.add_argument("--lr", type=float, default=1e-3, help="learning_rate")
    ap.add_argument("--min-lr", type=float, default=1e-4)
    ap.add_argument("--beta1", type=float, default=0.9)
    ap.add_argument("--beta2", type=float, default=0.99)
    ap.add_argument("--weight-decay", type=float, default=0.1)
    ap.add_argument("--warmup", type=int, default=100, help="warmup_iters")
    ap.add_argument("--decay-steps", type=int, default=2000, help="lr_decay_iters")
    ap.add_argument("--clip", type=float, default=1.0, help="grad_clip")
    ap.add_argument("--eval-every", type=int, default=250, help="eval_interval")
    ap.add_argument("--eval-size", type=int, default=1000, help="held-out windows per evaluation (attograd's)")
    ap.add_argument("--val-fraction", type=float, default=0.1)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--dump-split", action="store_true", help="print the vocabulary and split as JSON and stop")
    a = ap.parse_args()

    ids, V, chars, n_train = load_text(a.text, a.val_fraction)
    C = a.context
    val_rows = heldout_windows(ids, n_train, C, a.eval_size)
    if a.dump_split:
        print(json.dumps({"chars": len(ids), "train_chars": n_train, "val_chars": len(ids) - n_train, "vocab": V,
                          "distinct": len(chars), "first_chars": [ord(c) for c in chars[:8]],
                          "heldout_windows": len(val_rows),
                          "heldout_targets": sum(len(r) - 1 for r in val_rows)}))
        return 0

    import torch
    import torch.nn as nn
    from torch.nn import functional as F

    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)

    class LayerNorm(nn.Module):  # nanoGPT's: LayerNorm with an optional bias (here none)
        def __init__(self, ndim, bias):
            super().__init__()
            self.weight = nn.Parameter(torch.ones(ndim))
            self.bias = nn.Parameter(torch.zeros(ndim)) if bias else None

        def forward(self, x):
            return F.layer_norm(x, self.weight.shape, self.weight, self.bias, 1e-5)

    class CausalSelfAttention(nn.Module):
        def __init__(self, n_embd, n_head, block_size, bias, dropout):
            super().__init__()
            self.c_attn = nn.Linear(n_embd, 3 * n_embd, bias=bias)
            self.c_proj = nn.Linear(n_embd, n_embd, bias=bias)
            self.attn_dropout = nn.Dropout(dropout)
            self.resid_dropout = nn.Dropout(dropout)
            self.n_head, self.n_embd = n_head, n_embd
            # no flash attention in PyTorch 1.13: nanoGPT's slow path with its causal mask buffer
            self.register_buffer("bias", torch.tril(torch.ones(block_size, block_size))
                                 .view(1, 1, block_size, block_size))

        def forward(self, x):
            B, T, Cm = x.size()
            q, k, v = self.c_attn(x).split(self.n_embd, dim=2)
            k = k.view(B, T, self.n_head, Cm // self.n_head).transpose(1, 2)  # (B, nh, T, hs)
            q = q.view(B, T, self.n_head, Cm // self.n_head).transpose(1, 2)
            v = v.view(B, T, self.n_head, Cm // self.n_head).transpose(1, 2)
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
            att = att.masked_fill(self.bias[:, :, :T, :T] == 0, float("-inf"))
            att = F.softmax(att, dim=-1)
            att = self.attn_dropout(att)
            y = att @ v  # (B, nh, T, hs)
            y = y.transpose(1, 2).contiguous().view(B, T, Cm)
            return self.resid_dropout(self.c_proj(y))

    class MLP(nn.Module):
        def __init__(self, n_embd, bias, dropout):
            super().__init__()
            self.c_fc = nn.Linear(n_embd, 4 * n_embd, bias=bias)
            self.gelu = nn.GELU()
            self.c_proj = nn.Linear(4 * n_embd, n_embd, bias=bias)
            self.dropout = nn.Dropout(dropout)

        def forward(self, x):
            return self.dropout(self.c_proj(self.gelu(self.c_fc(x))))

    class Block(nn.Module):
        def __init__(self, n_embd, n_head, block_size, bias, dropout):
            super().__init__()
            self.ln_1 = LayerNorm(n_embd, bias)
            self.attn = CausalSelfAttention(n_embd, n_head, block_size, bias, dropout)
            self.ln_2 = LayerNorm(n_embd, bias)
            self.mlp = MLP(n_embd, bias, dropout)

        def forward(self, x):
            x = x + self.attn(self.ln_1(x))
            return x + self.mlp(self.ln_2(x))

    class GPT(nn.Module):
        def __init__(self, vocab_size, block_size, n_layer, n_head, n_embd, bias=False, dropout=0.0):
            super().__init__()
            self.block_size = block_size
            self.transformer = nn.ModuleDict(dict(
                wte=nn.Embedding(vocab_size, n_embd),
                wpe=nn.Embedding(block_size, n_embd),
                drop=nn.Dropout(dropout),
                h=nn.ModuleList([Block(n_embd, n_head, block_size, bias, dropout) for _ in range(n_layer)]),
                ln_f=LayerNorm(n_embd, bias),
            ))
            self.lm_head = nn.Linear(n_embd, vocab_size, bias=False)
            self.transformer.wte.weight = self.lm_head.weight  # weight tying
            self.apply(self._init_weights)
            for pn, p in self.named_parameters():
                if pn.endswith("c_proj.weight"):
                    torch.nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * n_layer))

        @staticmethod
        def _init_weights(module):
            if isinstance(module, nn.Linear):
                torch.nn.init.normal_(module.weight, mean=0.0, std=0.02)
                if module.bias is not None:
                    torch.nn.init.zeros_(module.bias)
            elif isinstance(module, nn.Embedding):
                torch.nn.init.normal_(module.weight, mean=0.0, std=0.02)

        def forward(self, idx, targets=None, reduction="mean"):
            b, t = idx.size()
            pos = torch.arange(0, t, dtype=torch.long)
            x = self.transformer.drop(self.transformer.wte(idx) + self.transformer.wpe(pos))
            for block in self.transformer.h:
                x = block(x)
            x = self.transformer.ln_f(x)
            logits = self.lm_head(x)
            if targets is None:
                return logits, None
            loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.reshape(-1), ignore_index=-1,
                                   reduction=reduction)
            return logits, loss

        def configure_optimizers(self, weight_decay, learning_rate, betas):
            param_dict = {pn: p for pn, p in self.named_parameters() if p.requires_grad}
            decay = [p for n, p in param_dict.items() if p.dim() >= 2]
            nodecay = [p for n, p in param_dict.items() if p.dim() < 2]
            groups = [{"params": decay, "weight_decay": weight_decay}, {"params": nodecay, "weight_decay": 0.0}]
            return torch.optim.AdamW(groups, lr=learning_rate, betas=betas)  # eps 1e-8; fused is CUDA only

    model = GPT(V, C, a.layers, a.heads, a.d_model)
    optimizer = model.configure_optimizers(a.weight_decay, a.lr, (a.beta1, a.beta2))
    params = sum(p.numel() for p in model.parameters())

    data = torch.tensor(ids, dtype=torch.long)
    train_data = data[:n_train]

    def get_batch(generator=None):  # nanoGPT's get_batch('train')
        ix = torch.randint(len(train_data) - C, (a.batch,), generator=generator)
        x = torch.stack([train_data[i:i + C] for i in ix])
        y = torch.stack([train_data[i + 1:i + 1 + C] for i in ix])
        return x, y

    def get_lr(it):  # nanoGPT's
        if it < a.warmup:
            return a.lr * (it + 1) / (a.warmup + 1)
        if it > a.decay_steps:
            return a.min_lr
        ratio = (it - a.warmup) / (a.decay_steps - a.warmup)
        coeff = 0.5 * (1.0 + math.cos(math.pi * ratio))
        return a.min_lr + coeff * (a.lr - a.min_lr)

    # Held-out rows as attograd's; the fixed training rows for the train-loss estimate (as many, full windows).
    full = [r for r in val_rows if len(r) == C + 1]
    short = [r for r in val_rows if len(r) < C + 1]
    val_full = torch.tensor(full, dtype=torch.long) if full else None
    val_short = [torch.tensor([r], dtype=torch.long) for r in short]
    g = torch.Generator().manual_seed(10_000 + a.seed)
    ix = torch.randint(len(train_data) - C, (len(val_rows),), generator=g)
    train_rows = torch.stack([train_data[i:i + C + 1] for i in ix])
    eval_batch = max(1, min(a.batch, 250))  # attograd evaluates in batches of the training batch (at most 250)

    @torch.no_grad()
    def mean_loss(groups):
        total, count = 0.0, 0
        for rows in groups:
            for i in range(0, rows.size(0), eval_batch):
                r = rows[i:i + eval_batch]
                _, loss = model(r[:, :-1], r[:, 1:], reduction="sum")
                total += loss.item()
                count += r[:, 1:].numel()
        return total / count

    def evaluate():
        model.eval()
        vl = mean_loss(([val_full] if val_full is not None else []) + val_short)
        tl = mean_loss([train_rows])
        model.train()
        return vl, tl

    curve = []

    def record(step):
        vl, tl = evaluate()
        cpu = time.process_time()
        curve.append({"step": step, "val_loss": vl, "train_loss": tl, "cpu_s": cpu})
        print(f"eval @ step {step}: val loss {vl:.4f}, train loss {tl:.4f} (process CPU {cpu:.2f} s)", flush=True)

    model.train()
    train_s, train_cpu = 0.0, 0.0
    last_loss = float("nan")
    record(0)
    for it in range(a.steps):
        t0, c0 = time.perf_counter(), time.process_time()
        lr = get_lr(it)
        for group in optimizer.param_groups:
            group["lr"] = lr
        X, Y = get_batch()
        _, loss = model(X, Y)
        loss.backward()
        if a.clip != 0.0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), a.clip)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        last_loss = loss.item()
        train_s += time.perf_counter() - t0
        train_cpu += time.process_time() - c0
        step = it + 1
        if step == a.steps or (a.eval_every > 0 and step % a.eval_every == 0):
            record(step)
    print(json.dumps({"impl": "nanogpt-twin", "torch": torch.__version__, "threads": torch.get_num_threads(),
                      "seed": a.seed, "vocab": V, "chars": len(ids), "train_chars": n_train,
                      "val_chars": len(ids) - n_train, "heldout_windows": len(val_rows), "params": params,
                      "final_loss": last_loss, "val_loss": curve[-1]["val_loss"], "train_seconds": train_s,
                      "train_cpu_seconds": train_cpu,
                      "curve": curve}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
