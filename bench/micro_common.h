#pragma once
// Shapes shared by the microbenchmarks: the benchmark configurations of train/tools/bench.h, and helpers that turn
// a lambda into a Google Benchmark with a FLOP-rate counter.

#include <benchmark/benchmark.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "autograd/autograd.h"
#include "train/tools/bench.h"

namespace attograd::micro {

/// The presets as (name, config), in size order.
inline std::vector<std::pair<std::string, bench::BenchConfig>> configs() {
  std::vector<std::pair<std::string, bench::BenchConfig>> out;
  for (const std::string& name : bench::preset_names()) out.emplace_back(name, bench::preset(name));
  return out;
}

/// A float32 leaf (shape) with values uniform in [-1, 1), requiring grad when asked.
inline Tensor leaf(const Shape& shape, Generator& gen, bool requires_grad) {
  Tensor t = rand(shape, gen);
  float* p = t.data<float>();
  for (int64_t i = 0; i < t.numel(); ++i) p[i] = 2.0f * p[i] - 1.0f;
  if (requires_grad) t.requires_grad_(true);
  return t;
}

/// Drops the gradients of `leaves` (so that the next backward assigns instead of accumulating).
inline void clear_grads(std::initializer_list<Tensor> leaves) {
  for (const Tensor& t : leaves)
    if (t.defined()) t.impl()->grad.reset();
}

/// Adds a "FLOP/s" rate counter for `flops` per iteration.
inline void set_flops(benchmark::State& state, double flops) {
  state.counters["FLOP/s"] =
      benchmark::Counter(flops, benchmark::Counter::kIsIterationInvariantRate, benchmark::Counter::kIs1000);
}

/// The body of each microbenchmark executable's main: registers its benchmarks, then runs Google Benchmark.
inline int run_main(int argc, char** argv, void (*register_benchmarks)()) {
  register_benchmarks();
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}

}  // namespace attograd::micro
