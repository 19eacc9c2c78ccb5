// Microbenchmarks of the linear layers of every benchmark configuration, forward alone (no grad) and
// forward + backward: qkv (D -> 3D), out (D -> D), ff1 (D -> F), ff2 (F -> D) with bias over T = B*L rows, and the
// tied output projection logits (D -> V, no bias).

#include "micro_common.h"

namespace attograd::micro {
namespace {

struct LinearShape {
  const char* name;
  int64_t in, out;
  bool bias;
};

void register_all() {
  for (const auto& [cname, c] : configs()) {
    const int64_t T = c.B * c.L;
    const LinearShape shapes[] = {
        {"qkv", c.D, 3 * c.D, true}, {"out", c.D, c.D, true},     {"ff1", c.D, c.F, true},
        {"ff2", c.F, c.D, true},     {"logits", c.D, c.V, false},
    };
    for (const LinearShape& s : shapes) {
      const double flops = 2.0 * static_cast<double>(T * s.in * s.out);
      const std::string base = "linear/" + cname + "/" + s.name + "/" + std::to_string(T) + "x" + std::to_string(s.in) +
                               "->" + std::to_string(s.out);
      benchmark::RegisterBenchmark((base + "/forward").c_str(), [=](benchmark::State& state) {
        Generator gen(1);
        Tensor x = leaf({T, s.in}, gen, false), w = leaf({s.out, s.in}, gen, false);
        Tensor b = s.bias ? leaf({s.out}, gen, false) : Tensor();
        NoGradGuard no_grad;
        for (auto _ : state) {
          Tensor y = linear(x, w, b);
          benchmark::DoNotOptimize(y.raw_data());
        }
        set_flops(state, flops);
      });
      benchmark::RegisterBenchmark((base + "/forward_backward").c_str(), [=](benchmark::State& state) {
        Generator gen(2);
        Tensor x = leaf({T, s.in}, gen, true), w = leaf({s.out, s.in}, gen, true);
        Tensor b = s.bias ? leaf({s.out}, gen, true) : Tensor();
        Tensor g = leaf({T, s.out}, gen, false);
        for (auto _ : state) {
          clear_grads({x, w, b});
          Tensor y = linear(x, w, b);
          y.backward(g);
          benchmark::DoNotOptimize(x.grad().raw_data());
        }
        set_flops(state, 3 * flops);
      });
    }
  }
}

}  // namespace
}  // namespace attograd::micro

int main(int argc, char** argv) { return attograd::micro::run_main(argc, argv, attograd::micro::register_all); }
