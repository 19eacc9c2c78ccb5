// Microbenchmarks of the other hot pieces of a training step at every benchmark configuration's shapes:
// layer_norm over (T, D), cross_entropy over (T, V) logits with half the targets ignored, dropout(0.1) on the FFN
// hidden (T, F), each forward alone and forward + backward (T = B * L); and one Adam step over all the
// parameters of the configuration's CausalLM (gradients filled once).

#include <memory>

#include "micro_common.h"
#include "nn/models.h"
#include "train/optim/optimizers.h"

namespace attograd::micro {
namespace {

void register_all() {
  for (const auto& [cname, c] : configs()) {
    const int64_t T = c.B * c.L, D = c.D, V = c.V, F = c.F;
    const std::string sz = "/" + cname + "/";

    benchmark::RegisterBenchmark(("layer_norm" + sz + "forward").c_str(), [=](benchmark::State& state) {
      Generator gen(1);
      Tensor x = leaf({T, D}, gen, false), w = leaf({D}, gen, false), b = leaf({D}, gen, false);
      NoGradGuard no_grad;
      for (auto _ : state) {
        Tensor y = layer_norm(x, {D}, w, b, 1e-6);
        benchmark::DoNotOptimize(y.raw_data());
      }
      state.SetBytesProcessed(state.iterations() * T * D * 2 * 4);
    });
    benchmark::RegisterBenchmark(("layer_norm" + sz + "forward_backward").c_str(), [=](benchmark::State& state) {
      Generator gen(2);
      Tensor x = leaf({T, D}, gen, true), w = leaf({D}, gen, true), b = leaf({D}, gen, true);
      Tensor g = leaf({T, D}, gen, false);
      for (auto _ : state) {
        clear_grads({x, w, b});
        Tensor y = layer_norm(x, {D}, w, b, 1e-6);
        y.backward(g);
        benchmark::DoNotOptimize(x.grad().raw_data());
      }
    });

    // Targets: the benchmark's pattern, the first half of every sequence ignored.
    auto targets = [=](Generator& gen) {
      Tensor t = empty({T}, {.dtype = kInt64});
      int64_t* p = t.data<int64_t>();
      for (int64_t i = 0; i < T; ++i)
        p[i] = (i % c.L) < c.L / 2 ? -100 : static_cast<int64_t>(gen.randint(static_cast<uint64_t>(V)));
      return t;
    };
    benchmark::RegisterBenchmark(("cross_entropy" + sz + "forward").c_str(), [=](benchmark::State& state) {
      Generator gen(3);
      Tensor x = leaf({T, V}, gen, false), t = targets(gen);
      NoGradGuard no_grad;
      for (auto _ : state) {
        Tensor loss = cross_entropy(x, t);
        benchmark::DoNotOptimize(loss.item());
      }
    });
    benchmark::RegisterBenchmark(("cross_entropy" + sz + "forward_backward").c_str(), [=](benchmark::State& state) {
      Generator gen(4);
      Tensor x = leaf({T, V}, gen, true), t = targets(gen);
      for (auto _ : state) {
        clear_grads({x});
        Tensor loss = cross_entropy(x, t);
        loss.backward();
        benchmark::DoNotOptimize(x.grad().raw_data());
      }
    });

    benchmark::RegisterBenchmark(("dropout" + sz + "forward").c_str(), [=](benchmark::State& state) {
      Generator gen(5), drop(6);
      Tensor x = leaf({T, F}, gen, false);
      NoGradGuard no_grad;
      for (auto _ : state) {
        Tensor y = dropout(x, 0.1, true, drop);
        benchmark::DoNotOptimize(y.raw_data());
      }
      state.SetItemsProcessed(state.iterations() * T * F);
    });
    benchmark::RegisterBenchmark(("dropout" + sz + "forward_backward").c_str(), [=](benchmark::State& state) {
      Generator gen(7), drop(8);
      Tensor x = leaf({T, F}, gen, true), g = leaf({T, F}, gen, false);
      for (auto _ : state) {
        clear_grads({x});
        Tensor y = dropout(x, 0.1, true, drop);
        y.backward(g);
        benchmark::DoNotOptimize(x.grad().raw_data());
      }
      state.SetItemsProcessed(state.iterations() * T * F);
    });

    benchmark::RegisterBenchmark(("adam_step" + sz + "all_params").c_str(), [=](benchmark::State& state) {
      Generator gen(9);
      auto model = std::make_shared<nn::CausalLM>(
          nn::CausalLMOptions{.vocab = V, .d_model = D, .n_head = c.H, .d_ff = F, .n_layers = c.N, .max_len = c.L},
          gen);
      for (Tensor& p : model->parameters()) p.set_grad(leaf(p.shape(), gen, false));
      optim::Adam adam(model->named_parameters(), {.lr = 1e-3});
      for (auto _ : state) adam.step();
      state.SetItemsProcessed(state.iterations() * model->num_parameters());
    });
  }
}

}  // namespace
}  // namespace attograd::micro

int main(int argc, char** argv) { return attograd::micro::run_main(argc, argv, attograd::micro::register_all); }
