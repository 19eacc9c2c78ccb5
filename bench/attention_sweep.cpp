// Long-sequence sweep of the fused attention (docs/ATTENTION.md): forward + backward time and peak memory of dense,
// sliding-window (local) and block-sparse (BigBird) causal attention at one sequence length, float32, one thread by
// default. One configuration per process, so that the peak resident set belongs to it:
//   attention_sweep --mode dense|local|block --L 4096 [--window 128] [--block 64] [--B 1] [--H 4] [--d 64]
//                   [--reps 3] [--threads 1]
// prints one line: mode L median_ms min_ms peak_tensor_MiB peak_rss_MiB.

#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "autograd/allocator.h"
#include "autograd/attention.h"
#include "autograd/parallel.h"
#include "autograd/random.h"
#include "autograd/tensor.h"

using namespace attograd;

int main(int argc, char** argv) {
  std::string mode = "local";
  int64_t L = 4096, window = 128, block = 64, B = 1, H = 4, d = 64, reps = 3, threads = 1;
  for (int a = 1; a + 1 < argc; a += 2) {
    const std::string k = argv[a];
    const char* v = argv[a + 1];
    if (k == "--mode") mode = v;
    else if (k == "--L") L = std::atoll(v);
    else if (k == "--window") window = std::atoll(v);
    else if (k == "--block") block = std::atoll(v);
    else if (k == "--B") B = std::atoll(v);
    else if (k == "--H") H = std::atoll(v);
    else if (k == "--d") d = std::atoll(v);
    else if (k == "--reps") reps = std::atoll(v);
    else if (k == "--threads") threads = std::atoll(v);
    else {
      std::fprintf(stderr, "attention_sweep: unknown option %s\n", k.c_str());
      return 2;
    }
  }
  if (mode != "dense" && mode != "local" && mode != "block") {
    std::fprintf(stderr, "attention_sweep: --mode must be dense, local or block, got %s\n", mode.c_str());
    return 2;
  }
  set_num_threads(static_cast<int>(threads));
  Generator gen(1);
  Tensor q = randn({B, H, L, d}, gen).requires_grad_(), k = randn({B, H, L, d}, gen).requires_grad_(),
         v = randn({B, H, L, d}, gen).requires_grad_();
  Tensor g = randn({B, H, L, d}, gen);
  AttentionOptions o{.is_causal = true};
  if (mode == "local") o.window = window;
  if (mode == "block") {  // BigBird: the block's own and previous key block, one global and one random block
    const int64_t nb = (L + block - 1) / block;
    o.block_size = block;
    o.block_layout =
        bigbird_block_layout({.q_blocks = nb, .k_blocks = nb, .local_blocks = 1, .global_blocks = 1,
                              .random_blocks = 1, .seed = 5});
  }
  std::vector<double> ms;
  size_t peak = 0;
  for (int64_t r = 0; r <= reps; ++r) {  // the first run warms up
    q.zero_grad(true), k.zero_grad(true), v.zero_grad(true);
    reset_peak_allocator_stats();
    const size_t before = allocator_stats().allocated_bytes;
    const auto t0 = std::chrono::steady_clock::now();
    scaled_dot_product_attention(q, k, v, o).output.backward(g);
    const auto t1 = std::chrono::steady_clock::now();
    peak = std::max(peak, allocator_stats().peak_allocated_bytes - before);
    if (r > 0) ms.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
  }
  std::sort(ms.begin(), ms.end());
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  std::printf("%s %lld %.2f %.2f %.2f %.1f\n", mode.c_str(), static_cast<long long>(L), ms[ms.size() / 2], ms[0],
              static_cast<double>(peak) / (1 << 20), static_cast<double>(ru.ru_maxrss) / 1024.0);
  return 0;
}
