// model_variants_bench: the measurements of docs/ATTENTION.md's section "In the models" (float32, 1 thread):
//   model_variants_bench checkpoint [L B reps]   (defaults 512 16 3)
//     one training step (forward + backward, dropout 0.1) of CausalLM at the large preset's sizes (V=256 D=256 H=8
//     F=1024 N=4) with and without attention.checkpoint, sides alternating per repetition: the median step time
//     and the allocator's peak above the weights (autograd/memory.h: peak_allocated_bytes after empty_cache and
//     reset_peak_allocator_stats), one JSON line per side.
//   model_variants_bench decode [tokens reps]    (defaults 240 3)
//     greedy decoding of one row (prompt 16 tokens, then `tokens` more; max_len 256) through CausalLM's
//     begin_decode / decode_step with the key/value cache and by recomputing, for mha, gqa (H_kv = 2), mqa, rope,
//     local (window 64) and block-sparse (block 32) at D=256 H=8 F=1024 N=4: median tokens per second of each path
//     and the cache bytes per token (every block), one JSON line per variant.

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "autograd/loss.h"
#include "autograd/memory.h"
#include "autograd/reduce.h"
#include "autograd/shape.h"
#include "nn/models.h"

using namespace attograd;
using namespace attograd::nn;

namespace {

double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

void checkpoint_bench(int64_t L, int64_t B, int reps) {
  std::vector<double> ms[2];
  double peak_mb[2] = {0, 0};
  for (int r = 0; r < reps; ++r)
    for (int ck = 0; ck < 2; ++ck) {
      Generator gen(1);
      CausalLM m({.vocab = 256, .d_model = 256, .n_head = 8, .d_ff = 1024, .n_layers = 4, .dropout = 0.1,
                  .max_len = L, .attention = {.checkpoint = ck == 1}},
                 gen);
      m.train();
      Generator data(2);
      const Tensor t = randint(1, 256, {B, L}, data);
      for (int s = 0; s < 2; ++s) {  // a warm-up step, then the timed one
        for (Tensor& p : m.parameters()) p.zero_grad(true);
        empty_cache();
        reset_peak_allocator_stats();
        const size_t base = allocator_stats().allocated_bytes;
        const double t0 = now();
        Tensor logits = m.forward(t);  // (B, L, 256)
        cross_entropy(reshape(logits, {B * L, 256}), reshape(t, {B * L})).backward();
        if (s == 1) {
          ms[ck].push_back((now() - t0) * 1e3);
          peak_mb[ck] = static_cast<double>(allocator_stats().peak_allocated_bytes - base) / 1048576.0;
        }
      }
    }
  for (int ck = 0; ck < 2; ++ck)
    std::printf("{\"bench\": \"checkpoint\", \"checkpoint\": %s, \"L\": %ld, \"B\": %ld, \"median_step_ms\": %.1f, "
                "\"peak_mb\": %.1f}\n",
                ck ? "true" : "false", static_cast<long>(L), static_cast<long>(B), median(ms[ck]), peak_mb[ck]);
}

void decode_bench(int64_t tokens, int reps) {
  const std::vector<std::pair<std::string, AttentionSpec>> variants = {
      {"mha", {}},
      {"gqa kv_heads=2", {.kind = "gqa", .kv_heads = 2}},
      {"mqa", {.kind = "gqa", .kv_heads = 1}},
      {"rope", {.rope = true}},
      {"local window=64", {.kind = "local", .window = 64}},
      {"block-sparse block=32", {.kind = "block-sparse", .block = 32}}};
  for (const auto& [name, a] : variants) {
    Generator gen(1);
    CausalLM m({.vocab = 256, .d_model = 256, .n_head = 8, .d_ff = 1024, .n_layers = 4, .dropout = 0.0, .max_len = 256,
                .attention = a},
               gen);
    m.eval();
    NoGradGuard no_grad;
    std::vector<double> tps[2];
    for (int r = 0; r < reps; ++r)
      for (int cached = 1; cached >= 0; --cached) {
        std::vector<int64_t> prompt(16);
        for (int i = 0; i < 16; ++i) prompt[static_cast<size_t>(i)] = 5 + i;
        DecodeState st = m.begin_decode({prompt});
        st.use_cache = cached == 1;
        const double t0 = now();
        for (int64_t s = 0; s < tokens; ++s)
          st.decoded[0].push_back(static_cast<int64_t>(argmax(m.decode_step(st), 1).flat(0)));
        tps[cached].push_back(static_cast<double>(tokens) / (now() - t0));
      }
    const DecodeState st = m.begin_decode({{5}});
    double bytes = 0;
    for (const KVCache& c : st.cache)  // each layer's own state (AttentionCache), per position it holds
      bytes += static_cast<double>(c.layer->bytes()) / static_cast<double>(c.layer->capacity());
    std::printf("{\"bench\": \"decode\", \"attention\": \"%s\", \"cached_tokens_per_s\": %.0f, "
                "\"recompute_tokens_per_s\": %.0f, \"cache_bytes_per_token\": %.0f}\n",
                name.c_str(), median(tps[1]), median(tps[0]), bytes);
  }
}

}  // namespace

int main(int argc, char** argv) {
  const std::string what = argc > 1 ? argv[1] : "checkpoint";
  auto arg = [&](int i, long d) { return argc > i ? std::atol(argv[i]) : d; };
  if (what == "checkpoint") {
    checkpoint_bench(arg(2, 512), arg(3, 16), static_cast<int>(arg(4, 3)));
  } else if (what == "decode") {
    decode_bench(arg(2, 240), static_cast<int>(arg(3, 3)));
  } else {
    std::fprintf(stderr, "usage: model_variants_bench checkpoint [L B reps] | decode [tokens reps]\n");
    return 2;
  }
  return 0;
}
