// The cost of expressing attention patterns as mask_mods (autograd/flex.h, docs/ATTENTION.md "Score and mask
// functions"): causal, sliding-window and BigBird block-sparse attention through their dedicated options and through
// the equal mask_mod, forward + backward, float32, alternating the two runs so that both see the same machine load:
//   flex_bench [--L 4096] [--B 1] [--H 4] [--d 64] [--window 128] [--block 64] [--reps 5] [--threads 1]
// prints per pattern: the medians of the dedicated and the mask_mod runs (ms), their ratio, and the one-off time of
// building the block mask (the mask_mod's first call, cached afterwards); then the same for score_mods (alibi,
// softcap) against plain causal attention.

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "autograd/attention.h"
#include "autograd/flex.h"
#include "autograd/parallel.h"
#include "autograd/random.h"
#include "autograd/tensor.h"

using namespace attograd;

namespace {

double run_ms(Tensor q, Tensor k, Tensor v, const Tensor& g, const AttentionOptions& o) {
  q.zero_grad(true), k.zero_grad(true), v.zero_grad(true);
  const auto t0 = std::chrono::steady_clock::now();
  scaled_dot_product_attention(q, k, v, o).output.backward(g);
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

double median(std::vector<double> x) {
  std::sort(x.begin(), x.end());
  return x[x.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  int64_t L = 4096, B = 1, H = 4, d = 64, window = 128, block = 64, reps = 5, threads = 1;
  for (int a = 1; a + 1 < argc; a += 2) {
    const std::string k = argv[a];
    const int64_t v = std::atoll(argv[a + 1]);
    if (k == "--L") L = v;
    else if (k == "--B") B = v;
    else if (k == "--H") H = v;
    else if (k == "--d") d = v;
    else if (k == "--window") window = v;
    else if (k == "--block") block = v;
    else if (k == "--reps") reps = v;
    else if (k == "--threads") threads = v;
    else {
      std::fprintf(stderr, "flex_bench: unknown option %s\n", k.c_str());
      return 2;
    }
  }
  set_num_threads(static_cast<int>(threads));
  Generator gen(1);
  Tensor q = randn({B, H, L, d}, gen).requires_grad_(), k = randn({B, H, L, d}, gen).requires_grad_(),
         v = randn({B, H, L, d}, gen).requires_grad_();
  Tensor g = randn({B, H, L, d}, gen);
  const int64_t nb = (L + block - 1) / block;
  const Tensor layout = bigbird_block_layout(
      {.q_blocks = nb, .k_blocks = nb, .local_blocks = 1, .global_blocks = 1, .random_blocks = 1, .seed = 5});
  struct Pair {
    const char* name;
    AttentionOptions dedicated, flex;
  };
  const std::vector<Pair> pairs = {
      {"causal", {.is_causal = true}, {.mask_mod = causal_mask()}},
      {"local", {.is_causal = true, .window = window}, {.mask_mod = sliding_window_mask(window, true)}},
      {"block", {.is_causal = true, .block_size = block, .block_layout = layout},
       {.mask_mod = and_masks(causal_mask(), block_layout_mask(layout, block))}},
      {"alibi", {.is_causal = true}, {.is_causal = true, .score_mod = alibi(H)}},
      {"softcap", {.is_causal = true}, {.is_causal = true, .score_mod = softcap(30.0)}},
  };
  std::printf("L=%lld B=%lld H=%lld d=%lld threads=%lld reps=%lld float32 forward+backward\n",
              static_cast<long long>(L), static_cast<long long>(B), static_cast<long long>(H),
              static_cast<long long>(d), static_cast<long long>(threads), static_cast<long long>(reps));
  std::printf("%-8s %12s %12s %7s %14s\n", "pattern", "dedicated_ms", "mod_ms", "ratio", "first_call_ms");
  for (const Pair& p : pairs) {
    const double first = run_ms(q, k, v, g, p.flex);  // builds and caches the block mask
    run_ms(q, k, v, g, p.dedicated);                  // warm-up
    std::vector<double> a, b;
    for (int64_t r = 0; r < reps; ++r) {
      a.push_back(run_ms(q, k, v, g, p.dedicated));
      b.push_back(run_ms(q, k, v, g, p.flex));
    }
    const double ma = median(a), mb = median(b);
    std::printf("%-8s %12.1f %12.1f %7.3f %14.1f\n", p.name, ma, mb, mb / ma, first);
    std::fflush(stdout);
  }
  return 0;
}
