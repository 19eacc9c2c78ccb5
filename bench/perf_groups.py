#!/usr/bin/env python3
"""bench/perf_groups.py: where a training step's time goes, grouped by kind of kernel (the table in RESULTS.md).

    perf record -F 2999 -g -o small.data build/examples/attograd_bench --preset small --steps 400 --warmup 3
    perf record -F 2999 -g -o large.data build/examples/attograd_bench --preset large --steps 8 --warmup 3
    bench/perf_groups.py small small.data large large.data

Reads `perf report --no-children --sort symbol` of each recording and prints a Markdown table of the share of
samples per group (the first group whose pattern matches a symbol takes it).
"""
import collections
import re
import subprocess
import sys

cats = [
 ("GEMM micro-kernels", r"micro_kernel"),
 ("GEMM packing (B panels, A^T blocks, transposes)", r"pack_b|pack_a|transpose16|packed_gemm_any|pack_gemm_b|prepacked_gemm|gemm_packed"),
 ("attention kernel (outside its GEMMs)", r"attention_|block_scores|exp_shifted|dropout_row|run_attention|HeadOperand"),
 ("dropout mask draws (incl. fused relu/residual)", r"draw_keep|apply_keep|apply_block|for_keep_blocks|relu_dropout|dropout_add|dropout"),
 ("layer_norm forward + backward", r"layer_norm|backward_row"),
 ("softmax / cross_entropy", r"cross_entropy|softmax|sum_exp|log"),
 ("Adam update", r"Adam|optim"),
 ("kernel: page faults, scheduling", r"^\[k\]"),
 ("malloc / free / allocator", r"malloc|free|storage_alloc|CachingAllocator|_int_"),
 ("memcpy / memset", r"memcpy|memset|memmove"),
]
def run(path):
    out = subprocess.run(["perf","report","-i",path,"--no-children","--sort","symbol","--stdio"],capture_output=True,text=True).stdout
    tot = collections.Counter()
    for line in out.splitlines():
        m = re.match(r"\s+([\d.]+)%\s+(\[[.k]\])\s+(.*)", line)
        if not m: continue
        pct, kind, sym = float(m.group(1)), m.group(2), m.group(3)
        key = "engine, elementwise and the rest"
        for name, rx in cats:
            if rx.startswith("^\\[k") :
                if kind == "[k]": key = name; break
                continue
            if re.search(rx, sym): key = name; break
        tot[key] += pct
    return tot
res = {p: run(f) for p, f in zip(sys.argv[1::2], sys.argv[2::2])}
names = [c for c,_ in cats] + ["engine, elementwise and the rest"]
print("| share of samples | " + " | ".join(res) + " |")
print("|---|" + "---|"*len(res))
for n in names:
    print(f"| {n} | " + " | ".join(f"{res[p][n]:.1f}%" for p in res) + " |")
