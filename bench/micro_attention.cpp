// Microbenchmarks of the fused causal attention (scaled_dot_product_attention, is_causal, dropout 0.1) at every
// benchmark configuration's (B, H, L, d_k): forward alone (no grad) and forward + backward. FLOPs count Q K^T and
// P V over the causal pairs (x3 with the backward), as the model FLOPs of train/tools/bench.h.

#include "micro_common.h"

namespace attograd::micro {
namespace {

void register_all() {
  for (const auto& [cname, c] : configs()) {
    const int64_t B = c.B, H = c.H, L = c.L, dk = c.D / c.H;
    const double flops = 2.0 * 2.0 * static_cast<double>(B * H * dk) * static_cast<double>(L * (L + 1) / 2);
    const std::string base = "attention/" + cname + "/B" + std::to_string(B) + "_H" + std::to_string(H) + "_L" +
                             std::to_string(L) + "_d" + std::to_string(dk);
    benchmark::RegisterBenchmark((base + "/forward").c_str(), [=](benchmark::State& state) {
      Generator gen(1), drop(2);
      Tensor q = leaf({B, H, L, dk}, gen, false), k = leaf({B, H, L, dk}, gen, false),
             v = leaf({B, H, L, dk}, gen, false);
      NoGradGuard no_grad;
      for (auto _ : state) {
        AttentionResult r =
            scaled_dot_product_attention(q, k, v, {.is_causal = true, .dropout_p = 0.1, .generator = &drop});
        benchmark::DoNotOptimize(r.output.raw_data());
      }
      set_flops(state, flops);
    });
    benchmark::RegisterBenchmark((base + "/forward_backward").c_str(), [=](benchmark::State& state) {
      Generator gen(3), drop(4);
      Tensor q = leaf({B, H, L, dk}, gen, true), k = leaf({B, H, L, dk}, gen, true), v = leaf({B, H, L, dk}, gen, true);
      Tensor g = leaf({B, H, L, dk}, gen, false);
      for (auto _ : state) {
        clear_grads({q, k, v});
        AttentionResult r =
            scaled_dot_product_attention(q, k, v, {.is_causal = true, .dropout_p = 0.1, .generator = &drop});
        r.output.backward(g);
        benchmark::DoNotOptimize(q.grad().raw_data());
      }
      set_flops(state, 3 * flops);
    });
  }
}

}  // namespace
}  // namespace attograd::micro

int main(int argc, char** argv) { return attograd::micro::run_main(argc, argv, attograd::micro::register_all); }
