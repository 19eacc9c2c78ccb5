#!/usr/bin/python3
"""PyTorch side of the issue-7 benchmark: exactly `attograd bench` (train/tools/bench.h) in PyTorch 1.13.

Same model (decoder-only pre-LN causal LM: token embedding * sqrt(D) + sinusoidal positions, dropout 0.1; N blocks
x + Dropout(MHA(LN(x))) with causal mask and q, k, v, o projections with bias, attention-probability dropout,
x + Dropout(FFN(LN(x))) with FFN = Linear(D, F), ReLU, Dropout, Linear(F, D); LayerNorm eps 1e-6; final LayerNorm;
output projection tied to the embedding), same data (src(L/2) SEP reversed-src, payload tokens uniform over
[5, V), loss only on the L/2 target positions), same step (zero_grad + forward + cross_entropy + backward +
Adam(lr 1e-3) step + loss.item()), same flags and the same JSON on the last line of stdout.

Run with /usr/bin/python3 (Debian's python3-torch). The thread count goes into OMP_NUM_THREADS,
OPENBLAS_NUM_THREADS and MKL_NUM_THREADS before torch is imported, and into torch.set_num_threads.
OMP_WAIT_POLICY is set to PASSIVE unless --omp-wait-policy says otherwise (idle OpenMP workers spinning on a
2-core machine make 2 threads far slower than 1). OPENBLAS_CORETYPE is left to the caller: bench/compare unsets
it for this process (an AVX2 core type halves OpenBLAS's sgemm speed on this machine). Torch must be on OpenBLAS
(Debian: apt-get install libopenblas0-pthread); on the reference libblas3 every matmul is ~30x slower.

    /usr/bin/python3 bench/torch_reference.py --preset small --threads 1
    /usr/bin/python3 bench/torch_reference.py --probe-sgemm 1024     # single-thread sgemm GFLOP/s (the ceiling)
    /usr/bin/python3 bench/torch_reference.py --generate --threads 1  # issue 15: cached generation, as
                                                                      # `attograd bench --generate`
    /usr/bin/python3 bench/torch_reference.py --preset large --precision bf16  # bfloat16 mixed precision

--precision bf16 runs the training step's forward and loss under torch.autocast("cpu", dtype=torch.bfloat16) (the
backward outside it, as PyTorch recommends), and with --generate every forward (the prefill and each token's step);
the parameters, the optimizer and the gradients stay float32. The JSON line then has "precision": "bf16" (as
attograd's bench JSON; absent under fp32).
"""

import argparse
import json
import math
import os
import resource
import statistics
import sys
import time

PRESETS = {  # (V, D, H, F, N, L, B), as train/tools/bench.cpp
    "small": (16, 64, 4, 256, 2, 32, 32),
    "medium": (64, 128, 4, 512, 2, 64, 32),
    "large": (256, 256, 8, 1024, 4, 128, 16),
    "long": (64, 128, 4, 512, 2, 1024, 4),
}
FIRST_SYMBOL = 5  # specials: pad 0, bos 1, eos 2, sep 3, plus 4 (train/data/tasks.h)
SEP = 3
IGNORE = -100


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--preset", default="small", help="small|medium|large|long (explicit sizes override it)")
    for flag, name in [("-V", "vocab"), ("-D", "d_model"), ("-H", "heads"), ("-F", "d_ff"), ("-N", "layers"),
                       ("-L", "seq_len"), ("-B", "batch")]:
        p.add_argument(flag, "--" + name.replace("_", "-"), dest=flag[1], type=int, default=None)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--foreach", choices=["auto", "on", "off"], default="on",
                   help="Adam's multi-tensor (foreach) implementation; on is the faster here")
    p.add_argument("--omp-wait-policy", choices=["passive", "active", "inherit"], default="passive",
                   help="OMP_WAIT_POLICY for libgomp (inherit: leave the environment's); passive stops idle OpenMP "
                        "workers spinning, which otherwise makes 2 threads many times slower on a busy 2-core machine")
    p.add_argument("--precision", choices=["fp32", "bf16"], default="fp32",
                   help="bf16: the forward and loss under torch.autocast(\"cpu\", dtype=torch.bfloat16), as "
                        "`attograd bench --precision bf16` (backward outside it; parameters stay float32)")
    p.add_argument("--probe-sgemm", type=int, default=0, metavar="N",
                   help="instead: time an N x N x N fp32 torch.mm on --threads threads and print its GFLOP/s "
                        "(with --precision bf16: a bfloat16 torch.mm)")
    p.add_argument("--generate", action="store_true",
                   help="instead: greedy generation with keys and values cached by hand, as `attograd bench "
                        "--generate` (defaults V=256 D=256 H=4 F=1024 N=4 B=1; the presets do not apply)")
    p.add_argument("--prompt", type=int, default=16, help="with --generate: prompt tokens")
    p.add_argument("--tokens", type=int, default=256, help="with --generate: tokens generated")
    p.add_argument("--rounds", type=int, default=3, help="with --generate: timed rounds")
    a = p.parse_args(argv)
    if a.preset not in PRESETS:
        p.error(f"unknown preset '{a.preset}' (valid: {', '.join(PRESETS)})")
    return a


def autocast_context(torch, precision):
    """torch.autocast("cpu", dtype=torch.bfloat16) under --precision bf16, else a context that does nothing."""
    import contextlib
    if precision == "bf16":
        return torch.autocast("cpu", dtype=torch.bfloat16)
    return contextlib.nullcontext()


def model_flops_per_step(V, D, H, F, N, L, B):
    """As train/tools/bench.cpp: 3 x the forward's matmul FLOPs, attention over the L(L+1)/2 causal pairs."""
    T = B * L
    projections = 2 * T * D * (4 * D)
    ffn = 2 * T * D * F * 2
    attention = 2 * (2 * B * D * L * (L + 1) / 2)
    output = 2 * T * D * V
    return 3 * (N * (projections + ffn + attention) + output)


def loaded_blas():
    """The BLAS library this process has mapped (Debian's libblas.so.3 alternative: OpenBLAS or reference BLAS)."""
    try:
        with open("/proc/self/maps") as f:
            libs = {line.split()[-1] for line in f if ".so" in line}
    except OSError:
        return None
    found = sorted(os.path.realpath(lib) for lib in libs if "blas" in os.path.basename(lib))
    return ",".join(sorted(set(found))) or None


def make_causal_lm(V, D, H, F, N, max_len, p_drop):
    """attograd's CausalLM (nn/models.h) in PyTorch, with its initialisation (embedding N(0, 1/D), q/k/v as one
    Linear with xavier_uniform_ and zero biases as nn.MultiheadAttention, the other Linears PyTorch's default,
    LayerNorm eps 1e-6, tied output projection). forward(tokens (B, L) int64, L <= max_len) -> logits (B, L, V).
    Right padding needs no mask (the causal mask keeps it out of earlier positions). Used by this benchmark,
    bench/time_to_accuracy and bench/text_compare; import torch before calling it."""
    import torch
    import torch.nn as nn
    import torch.nn.functional as Fn

    dk = D // H

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.norm1 = nn.LayerNorm(D, eps=1e-6)
            self.qkv = nn.Linear(D, 3 * D)  # q, k and v projections with bias, as one matrix (same parameters)
            self.out = nn.Linear(D, D)
            self.norm2 = nn.LayerNorm(D, eps=1e-6)
            self.linear1 = nn.Linear(D, F)
            self.linear2 = nn.Linear(F, D)
            nn.init.xavier_uniform_(self.qkv.weight)  # nn.MultiheadAttention's initialisation
            nn.init.zeros_(self.qkv.bias)
            nn.init.zeros_(self.out.bias)

        def forward(self, x, mask):  # x (B, L, D), mask (L, L) additive -inf above the diagonal
            B, L, _ = x.shape
            h = self.norm1(x)
            qkv = self.qkv(h).view(B, L, 3, H, dk).permute(2, 0, 3, 1, 4).reshape(3, B * H, L, dk)
            q, k, v = qkv[0], qkv[1], qkv[2]  # (B*H, L, dk)
            # nn.MultiheadAttention's training path (F.multi_head_attention_forward): baddbmm, softmax, dropout, bmm
            scores = torch.baddbmm(mask, q, k.transpose(1, 2), alpha=1.0 / math.sqrt(dk))  # (B*H, L, L)
            attn = Fn.dropout(torch.softmax(scores, dim=-1), p_drop, self.training)
            ctx = torch.bmm(attn, v).view(B, H, L, dk).transpose(1, 2).reshape(B, L, D)
            x = x + Fn.dropout(self.out(ctx), p_drop, self.training)
            f = self.linear2(Fn.dropout(torch.relu(self.linear1(self.norm2(x))), p_drop, self.training))
            return x + Fn.dropout(f, p_drop, self.training)

    class CausalLM(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = nn.Embedding(V, D)
            nn.init.normal_(self.embed.weight, 0.0, 1.0 / math.sqrt(D))
            pos = torch.arange(max_len, dtype=torch.float64).unsqueeze(1)
            j = torch.arange(D)
            angle = pos / torch.pow(10000.0, 2.0 * (j // 2).to(torch.float64) / D)
            pe = torch.where(j % 2 == 0, torch.sin(angle), torch.cos(angle)).to(torch.float32)
            self.register_buffer("pe", pe)  # (max_len, D)
            self.register_buffer("mask", torch.full((max_len, max_len), -math.inf).triu(1))  # (max_len, max_len)
            self.blocks = nn.ModuleList(Block() for _ in range(N))
            self.norm = nn.LayerNorm(D, eps=1e-6)
            self.scale = math.sqrt(D)

        def forward(self, tokens):  # (B, L) int64 -> (B, L, V)
            L = tokens.shape[1]
            mask = self.mask if L == self.mask.shape[0] else self.mask[:L, :L]
            pe = self.pe if L == self.pe.shape[0] else self.pe[:L]
            x = Fn.dropout(self.embed(tokens) * self.scale + pe, p_drop, self.training)
            for blk in self.blocks:
                x = blk(x, mask)
            return Fn.linear(self.norm(x), self.embed.weight)  # tied output projection

    return CausalLM()


def main(argv):
    a = parse_args(argv)
    threads = str(a.threads)
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[var] = threads
    if a.omp_wait_policy != "inherit":
        os.environ["OMP_WAIT_POLICY"] = a.omp_wait_policy.upper()
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from torch_malloc import keep_freed_memory
    malloc_note = keep_freed_memory()  # before torch allocates: freed tensors stay mapped (bench/torch_malloc.py)
    import torch  # after the thread variables, so OpenMP and OpenBLAS read them
    import torch.nn as nn
    import torch.nn.functional as Fn

    torch.set_num_threads(a.threads)

    if a.probe_sgemm:
        n = a.probe_sgemm
        dtype = torch.bfloat16 if a.precision == "bf16" else torch.float32  # bf16: oneDNN's matmul, when built in
        x, y, out = torch.randn(n, n, dtype=dtype), torch.randn(n, n, dtype=dtype), torch.empty(n, n, dtype=dtype)
        for _ in range(3):
            torch.mm(x, y, out=out)
        best = math.inf
        for _ in range(10):
            t0 = time.perf_counter()
            torch.mm(x, y, out=out)
            best = min(best, time.perf_counter() - t0)
        print(json.dumps({"impl": "torch.mm", "n": n, "threads": a.threads, "best_ms": round(best * 1e3, 4),
                          "gflops": round(2 * n ** 3 / best / 1e9, 3),
                          "openblas_coretype": os.environ.get("OPENBLAS_CORETYPE"), "blas": loaded_blas()}
                         | ({"precision": a.precision} if a.precision != "fp32" else {})))
        return 0

    if a.generate:
        return generate_main(a, torch, nn, Fn)

    V, D, H, F, N, L, B = PRESETS[a.preset]
    explicit = {"V": a.V, "D": a.D, "H": a.H, "F": a.F, "N": a.N, "L": a.L, "B": a.B}
    sizes = dict(V=V, D=D, H=H, F=F, N=N, L=L, B=B)
    name = a.preset
    for k, v in explicit.items():
        if v is not None and v != sizes[k]:
            sizes[k] = v
            name = "custom"
    V, D, H, F, N, L, B = (sizes[k] for k in "VDHFNLB")
    checks = [(V > FIRST_SYMBOL + 1, f"V must be at least {FIRST_SYMBOL + 2}, got V={V}"),
              (D > 0 and H > 0 and D % H == 0, f"D must be a positive multiple of H, got D={D}, H={H}"),
              (F > 0 and N >= 0 and B > 0, f"F, B must be positive and N non-negative, got F={F}, N={N}, B={B}"),
              (L >= 2 and L % 2 == 0, f"L must be even and at least 2, got L={L}"),
              (a.steps >= 1 and a.warmup >= 0 and a.threads >= 1, "steps >= 1, warmup >= 0, threads >= 1")]
    for ok, msg in checks:
        if not ok:
            print(f"torch_reference: error: {msg}", file=sys.stderr)
            return 2

    torch.manual_seed(a.seed)
    model = make_causal_lm(V, D, H, F, N, L, 0.1)
    model.train()
    params = sum(p.numel() for p in model.parameters())
    foreach = {"auto": None, "on": True, "off": False}[a.foreach]
    opt = torch.optim.Adam(model.parameters(), lr=1e-3, foreach=foreach)

    gen = torch.Generator().manual_seed(a.seed + 2)
    total = a.warmup + a.steps
    batches = []
    half = L // 2
    for _ in range(total):
        src = torch.randint(FIRST_SYMBOL, V, (B, half), generator=gen)
        seq = torch.cat([src, torch.full((B, 1), SEP, dtype=torch.int64), src.flip(1)], dim=1)  # (B, L + 1)
        target = seq[:, 1:].clone()
        target[:, :half] = IGNORE  # only the L/2 positions whose next token is a target token count
        batches.append((seq[:, :L].contiguous(), target.reshape(-1)))

    def step(inp, tgt):
        opt.zero_grad(set_to_none=True)
        # the logits (B, L, V) are not kept past the loss, as on attograd's side
        with autocast_context(torch, a.precision):  # forward and loss only; the backward outside it
            loss = Fn.cross_entropy(model(inp).view(B * L, V), tgt, ignore_index=IGNORE)
        loss.backward()
        opt.step()
        return loss.item()

    step_ms = []
    first_loss = final_loss = None
    for i, (inp, tgt) in enumerate(batches):
        t0 = time.perf_counter()
        loss = step(inp, tgt)
        t1 = time.perf_counter()
        if i == 0:
            first_loss = loss
        if i >= a.warmup:
            step_ms.append((t1 - t0) * 1e3)
        final_loss = loss

    med = statistics.median(step_ms)
    flops = model_flops_per_step(V, D, H, F, N, L, B)
    rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
    result = {
        "impl": "pytorch", "preset": name, "V": V, "D": D, "H": H, "F": F, "N": N, "L": L, "B": B,
        "steps": a.steps, "warmup": a.warmup, "threads": a.threads, "seed": a.seed, "params": params,
        "median_step_ms": round(med, 4), "min_step_ms": round(min(step_ms), 4),
        "tokens_per_s": round(B * L / (med / 1e3), 1), "peak_rss_mb": round(rss_mb, 1),
        "first_loss": round(first_loss, 6), "final_loss": round(final_loss, 6),
        "flops_per_step": round(flops), "gflops": round(flops / (med / 1e3) / 1e9, 3),
        "torch": torch.__version__, "torch_threads": torch.get_num_threads(),
        "openblas_coretype": os.environ.get("OPENBLAS_CORETYPE"), "blas": loaded_blas(),
        "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY"), "malloc": malloc_note, "adam_foreach": a.foreach,
    }
    if a.precision != "fp32":
        result["precision"] = a.precision
    print(f"pytorch bench: {name} (V={V} D={D} H={H} F={F} N={N} L={L} B={B}), {a.threads} thread(s), "
          f"{a.steps} steps after {a.warmup} warm-up" + (f", {a.precision}" if a.precision != "fp32" else ""))
    print(f"  parameters  {params:,}")
    print(f"  step        {med:.3f} ms median (min {min(step_ms):.3f} ms)")
    print(f"  throughput  {B * L / (med / 1e3):,.0f} tokens/s, {result['gflops']:.2f} model GFLOP/s")
    print(f"  peak RSS    {rss_mb:.1f} MB")
    print(f"  loss        {first_loss:.4f} (first step) -> {final_loss:.4f} (last step)")
    print(json.dumps(result))
    return 0


def generate_main(a, torch, nn, Fn):
    """Issue 15: the same model shape as the training benchmark in eval mode, generating a.tokens greedy tokens
    after a random prompt of a.prompt tokens + SEP, with each layer's keys and values cached by hand in tensors
    preallocated to the whole length (the loop a PyTorch user writes): a prefill over the prompt, then one token per
    step attending to the cache. Times a.rounds continuations after one untimed one; prints a JSON line last."""
    V = a.V or 256
    D = a.D or 256
    H = a.H or 4
    F = a.F or 1024
    N = a.N if a.N is not None else 4
    B = a.B or 1
    P, T = a.prompt, a.tokens
    if D % H or V <= FIRST_SYMBOL + 1 or P < 1 or T < 1 or a.rounds < 1:
        print("torch_reference: error: --generate needs H | D, V > 6, prompt, tokens, rounds >= 1", file=sys.stderr)
        return 2
    L = P + 1 + T  # the position table: prompt, SEP, continuation
    dk = D // H

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.norm1 = nn.LayerNorm(D, eps=1e-6)
            self.qkv = nn.Linear(D, 3 * D)
            self.out = nn.Linear(D, D)
            self.norm2 = nn.LayerNorm(D, eps=1e-6)
            self.linear1 = nn.Linear(D, F)
            self.linear2 = nn.Linear(F, D)
            nn.init.xavier_uniform_(self.qkv.weight)
            nn.init.zeros_(self.qkv.bias)
            nn.init.zeros_(self.out.bias)

        def forward(self, x, kc, vc, pos):  # x (B, n, D) at positions pos .. pos+n-1; kc, vc (B, H, L, dk)
            n = x.shape[1]
            q, k, v = self.qkv(self.norm1(x)).view(B, n, 3, H, dk).permute(2, 0, 3, 1, 4)  # each (B, H, n, dk)
            kc[:, :, pos:pos + n] = k
            vc[:, :, pos:pos + n] = v
            keys, values = kc[:, :, :pos + n], vc[:, :, :pos + n]  # (B, H, pos+n, dk)
            scores = torch.matmul(q, keys.transpose(-1, -2)) * (1.0 / math.sqrt(dk))  # (B, H, n, pos+n)
            if n > 1:  # the prefill: causal within the new positions
                scores = scores + torch.full((n, pos + n), -math.inf).triu(pos + 1)
            ctx = torch.matmul(torch.softmax(scores, dim=-1), values).transpose(1, 2).reshape(B, n, D)
            x = x + self.out(ctx)
            return x + self.linear2(torch.relu(self.linear1(self.norm2(x))))

    class CausalLM(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = nn.Embedding(V, D)
            nn.init.normal_(self.embed.weight, 0.0, 1.0 / math.sqrt(D))
            pos = torch.arange(L, dtype=torch.float64).unsqueeze(1)
            j = torch.arange(D)
            angle = pos / torch.pow(10000.0, 2.0 * (j // 2).to(torch.float64) / D)
            self.register_buffer("pe", torch.where(j % 2 == 0, torch.sin(angle), torch.cos(angle)).to(torch.float32))
            self.blocks = nn.ModuleList(Block() for _ in range(N))
            self.norm = nn.LayerNorm(D, eps=1e-6)
            self.scale = math.sqrt(D)

        def step(self, tokens, caches, pos):  # tokens (B, n) -> logits of the last position (B, V)
            x = self.embed(tokens) * self.scale + self.pe[pos:pos + tokens.shape[1]]
            for blk, (kc, vc) in zip(self.blocks, caches):
                x = blk(x, kc, vc, pos)
            return Fn.linear(self.norm(x[:, -1]), self.embed.weight)

    torch.manual_seed(a.seed)
    model = CausalLM().eval()
    params = sum(p.numel() for p in model.parameters())
    gen = torch.Generator().manual_seed(a.seed + 2)
    prompt = torch.cat([torch.randint(FIRST_SYMBOL, V, (B, P), generator=gen),
                        torch.full((B, 1), SEP, dtype=torch.int64)], dim=1)  # (B, P + 1)

    def generate():
        with torch.inference_mode(), autocast_context(torch, a.precision):
            caches = [(torch.empty(B, H, L, dk), torch.empty(B, H, L, dk)) for _ in range(N)]
            logits = model.step(prompt, caches, 0)
            pos = P + 1
            out = []
            for t in range(T):
                nxt = logits.argmax(dim=-1, keepdim=True)  # (B, 1)
                out.append(nxt)
                if t + 1 < T:
                    logits = model.step(nxt, caches, pos)
                    pos += 1
            return torch.cat(out, dim=1)

    generate()  # warm-up
    ms, cpu = [], []
    for _ in range(a.rounds):
        t0, c0 = time.perf_counter(), time.process_time()
        generate()
        ms.append((time.perf_counter() - t0) * 1e3)
        cpu.append((time.process_time() - c0) * 1e3)  # the CPU time the scheduler gave this process
    med = statistics.median(ms)
    cpu_med = statistics.median(cpu)
    result = {"impl": "pytorch", "mode": "generate", "V": V, "D": D, "H": H, "F": F, "N": N, "prompt": P,
              "tokens": T, "B": B, "rounds": a.rounds, "threads": a.threads, "seed": a.seed, "params": params,
              "cached_ms": round(med, 4), "cached_tokens_per_s": round(B * T / (med / 1e3), 4),
              "cached_cpu_tokens_per_s": round(B * T / (cpu_med / 1e3), 4),
              "torch": torch.__version__, "torch_threads": torch.get_num_threads(),
              "openblas_coretype": os.environ.get("OPENBLAS_CORETYPE"), "blas": loaded_blas()}
    if a.precision != "fp32":
        result["precision"] = a.precision
    print(f"pytorch bench --generate: V={V} D={D} H={H} F={F} N={N}, B={B}, prompt {P} + {T} tokens, "
          f"{a.threads} thread(s), {a.rounds} rounds" + (f", {a.precision}" if a.precision != "fp32" else ""))
    print(f"  parameters  {params:,}")
    print(f"  cached      {B * T / (med / 1e3):,.0f} tokens/s ({B * T / (cpu_med / 1e3):,.0f} per CPU second)")
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
