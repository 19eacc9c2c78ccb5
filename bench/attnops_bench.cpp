// attnops_bench: measurements of docs/ATTENTION.md.
//   attnops_bench checkpoint [B L D H F N reps]   a stack of N CausalLMBlocks (default: the large preset's sizes,
//        D=256 H=8 F=1024 N=4 B=16, at L=512, dropout 0.1), forward + backward without and with nn::Checkpointed on
//        every block, and with nn::Checkpointed on every block but the last; prints per side the allocator peak above
//        the step's starting point (activation memory: parameters, their gradient buffers and the input are allocated
//        before) and the median step time, the order of the sides rotating.
//   attnops_bench linear [d reps L...]   one thread, B=1 H=1, causal: linear_attention vs the fused dense
//        scaled_dot_product_attention, forward + backward time (median) and allocator peak per L.
// Prints one JSON line per measurement.

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <string>
#include <vector>

#include "autograd/allocator.h"
#include "autograd/attention.h"
#include "autograd/elementwise.h"
#include "autograd/linear_attention.h"
#include "autograd/parallel.h"
#include "autograd/reduce.h"
#include "nn/checkpointed.h"
#include "nn/models.h"

using namespace attograd;

namespace {

double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// CPU time of the process: with one thread, the work itself, less disturbed than wall time on a loaded machine.
double cpu_now() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

struct Measure {
  double seconds;
  double cpu_seconds;
  double peak_mib;
};

// Runs step() once with the allocator's peak reset: time and peak above the allocation at the start.
template <class F>
Measure measure(F&& step) {
  reset_peak_allocator_stats();
  const size_t base = allocator_stats().allocated_bytes;
  const double t0 = now(), c0 = cpu_now();
  step();
  const double t = now() - t0, c = cpu_now() - c0;
  return {t, c, static_cast<double>(allocator_stats().peak_allocated_bytes - base) / (1024.0 * 1024.0)};
}

int checkpoint_mode(int argc, char** argv) {
  auto arg = [&](int i, int64_t def) { return argc > i ? std::atoll(argv[i]) : def; };
  const int64_t B = arg(2, 16), L = arg(3, 512), D = arg(4, 256), H = arg(5, 8), F = arg(6, 1024), N = arg(7, 4),
                reps = arg(8, 3);
  Generator gen(1);
  const nn::CausalLMOptions o{
      .vocab = 256, .d_model = D, .n_head = H, .d_ff = F, .n_layers = N, .dropout = 0.1, .max_len = L};
  std::vector<std::shared_ptr<nn::CausalLMBlock>> blocks;
  std::vector<std::shared_ptr<nn::Checkpointed<nn::CausalLMBlock>>> wrapped;
  for (int64_t i = 0; i < N; ++i) {
    blocks.push_back(std::make_shared<nn::CausalLMBlock>(o, gen));
    wrapped.push_back(std::make_shared<nn::Checkpointed<nn::CausalLMBlock>>(blocks.back()));
  }
  Tensor x = rand({B, L, D}, gen).requires_grad_(true);
  Tensor w = rand({B, L, D}, gen);
  // mode 0: plain blocks; 1: every block checkpointed; 2: every block but the last (whose recomputation would
  // follow its forward at once: keeping its activations costs no more than recomputing one block).
  auto step = [&](int mode) {
    manual_seed(7);
    Tensor h = mul(x, 1.0);  // a non-leaf input, as the embedding's output in a model
    for (int64_t i = 0; i < N; ++i) {
      const bool ckpt = mode == 1 || (mode == 2 && i + 1 < N);
      h = ckpt ? wrapped[static_cast<size_t>(i)]->forward(h) : blocks[static_cast<size_t>(i)]->forward(h);
    }
    Tensor loss = mean(mul(h, w));
    h = Tensor();
    loss.backward();
  };
  auto zero = [&] {
    x.zero_grad();
    for (auto& b : blocks) b->zero_grad();  // keeps the gradient buffers: they are not activations
  };
  for (int mode : {0, 1, 2}) {  // warm-up: gradient buffers and the allocator's cache
    step(mode);
    zero();
  }
  std::vector<double> t[3], cpu[3], m[3];
  for (int64_t r = 0; r < reps; ++r)
    for (int k = 0; k < 3; ++k) {
      const int mode = static_cast<int>((k + r) % 3);  // rotate which side goes first
      const Measure me = measure([&] { step(mode); });
      zero();
      t[mode].push_back(me.seconds);
      cpu[mode].push_back(me.cpu_seconds);
      m[mode].push_back(me.peak_mib);
    }
  const char* names[3] = {"none", "all", "all_but_last"};
  for (int s : {0, 1, 2})
    std::printf(
        "{\"bench\":\"checkpoint\",\"checkpointed\":\"%s\",\"B\":%lld,\"L\":%lld,\"D\":%lld,\"H\":%lld,\"F\":%lld,"
        "\"N\":%lld,\"threads\":%d,\"reps\":%lld,\"median_step_s\":%.4f,\"median_cpu_s\":%.4f,"
        "\"activation_peak_mib\":%.1f,\"memory_ratio\":%.2f,\"time_ratio\":%.3f,\"cpu_ratio\":%.3f}\n",
        names[s], static_cast<long long>(B), static_cast<long long>(L), static_cast<long long>(D),
        static_cast<long long>(H), static_cast<long long>(F), static_cast<long long>(N), get_num_threads(),
        static_cast<long long>(reps), median(t[s]), median(cpu[s]), median(m[s]), median(m[0]) / median(m[s]),
        median(t[s]) / median(t[0]), median(cpu[s]) / median(cpu[0]));
  return 0;
}

int linear_mode(int argc, char** argv) {
  set_num_threads(1);
  const int64_t d = argc > 2 ? std::atoll(argv[2]) : 64, reps = argc > 3 ? std::atoll(argv[3]) : 3;
  std::vector<int64_t> lens;
  for (int i = 4; i < argc; ++i) lens.push_back(std::atoll(argv[i]));
  if (lens.empty()) lens = {1024, 2048, 4096, 8192, 16384};
  Generator gen(2);
  for (int64_t L : lens) {
    Tensor q = rand({1, 1, L, d}, gen).requires_grad_(true), k = rand({1, 1, L, d}, gen).requires_grad_(true),
           v = rand({1, 1, L, d}, gen).requires_grad_(true), w = rand({1, 1, L, d}, gen);
    auto run = [&](bool linear) {
      Tensor o =
          linear ? linear_attention(q, k, v, true) : scaled_dot_product_attention(q, k, v, {.is_causal = true}).output;
      Tensor loss = sum(mul(o, w));
      o = Tensor();
      loss.backward();
      q.zero_grad(true);
      k.zero_grad(true);
      v.zero_grad(true);
    };
    for (int kind : {1, 0}) {
      run(kind == 1);  // warm-up
      std::vector<double> t, c, m;
      for (int64_t r = 0; r < reps; ++r) {
        const Measure me = measure([&] { run(kind == 1); });
        t.push_back(me.seconds);
        c.push_back(me.cpu_seconds);
        m.push_back(me.peak_mib);
      }
      std::printf(
          "{\"bench\":\"linear\",\"op\":\"%s\",\"L\":%lld,\"d\":%lld,\"threads\":1,\"reps\":%lld,"
          "\"median_s\":%.5f,\"median_cpu_s\":%.5f,\"peak_mib\":%.2f}\n",
          kind ? "linear_attention" : "sdpa_dense", static_cast<long long>(L), static_cast<long long>(d),
          static_cast<long long>(reps), median(t), median(c), median(m));
      std::fflush(stdout);
    }
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "";
  try {
    if (mode == "checkpoint") return checkpoint_mode(argc, argv);
    if (mode == "linear") return linear_mode(argc, argv);
  } catch (const Error& e) {
    std::fprintf(stderr, "attnops_bench: %s\n", e.what());
    return 2;
  }
  std::fprintf(stderr, "usage: attnops_bench checkpoint [B L D H F N reps] | linear [d reps L...]\n");
  return 2;
}
