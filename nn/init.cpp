#include "nn/init.h"

#include <cmath>

namespace attograd::nn::init {

std::pair<int64_t, int64_t> calculate_fan_in_and_fan_out(const Tensor& w) {
  ATTO_CHECK(w.dim() >= 2, "init", "fan in and fan out need a tensor with at least 2 dimensions, got shape ",
             w.shape());
  int64_t receptive = 1;
  for (int64_t d = 2; d < w.dim(); ++d) receptive *= w.size(d);
  return {w.size(1) * receptive, w.size(0) * receptive};
}

double calculate_gain(const std::string& nl, double param) {
  if (nl == "linear" || nl == "sigmoid" || nl == "identity") return 1.0;
  if (nl == "tanh") return 5.0 / 3.0;
  if (nl == "relu") return std::sqrt(2.0);
  if (nl == "leaky_relu") return std::sqrt(2.0 / (1.0 + param * param));
  throw Error("calculate_gain", "unsupported nonlinearity '" + nl + "'");
}

namespace {
template <class F>
Tensor fill_with(Tensor w, const char* op, F draw) {
  ATTO_CHECK(w.defined(), op, "undefined tensor");
  const int64_t n = w.numel();
  dispatch_float(w.dtype(), op, [&]<typename T>() {
    T* p = w.data<T>();
    for (int64_t i = 0; i < n; ++i) p[i] = static_cast<T>(draw());
  });
  return w;
}
}  // namespace

Tensor uniform_(Tensor w, double a, double b, Generator& gen) {
  ATTO_CHECK(a <= b, "uniform_", "lower bound ", a, " above upper bound ", b);
  return fill_with(w, "uniform_", [&] { return gen.uniform(a, b); });
}

Tensor normal_(Tensor w, double mean, double std, Generator& gen) {
  ATTO_CHECK(std >= 0, "normal_", "std must be non-negative, got ", std);
  return fill_with(w, "normal_", [&] { return gen.normal(mean, std); });
}

Tensor constant_(Tensor w, double value) { return fill_with(w, "constant_", [value] { return value; }); }
Tensor zeros_(Tensor w) { return constant_(w, 0.0); }
Tensor ones_(Tensor w) { return constant_(w, 1.0); }

Tensor xavier_uniform_(Tensor w, double gain, Generator& gen) {
  auto [fan_in, fan_out] = calculate_fan_in_and_fan_out(w);
  double a = gain * std::sqrt(6.0 / static_cast<double>(fan_in + fan_out));
  return uniform_(w, -a, a, gen);
}

Tensor xavier_normal_(Tensor w, double gain, Generator& gen) {
  auto [fan_in, fan_out] = calculate_fan_in_and_fan_out(w);
  double std = gain * std::sqrt(2.0 / static_cast<double>(fan_in + fan_out));
  return normal_(w, 0.0, std, gen);
}

Tensor kaiming_uniform_(Tensor w, double a, const std::string& mode, Generator& gen) {
  ATTO_CHECK(mode == "fan_in" || mode == "fan_out", "kaiming_uniform_", "mode must be fan_in or fan_out, got '",
             mode, "'");
  auto [fan_in, fan_out] = calculate_fan_in_and_fan_out(w);
  double fan = static_cast<double>(mode == "fan_in" ? fan_in : fan_out);
  double bound = calculate_gain("leaky_relu", a) * std::sqrt(3.0 / fan);
  return uniform_(w, -bound, bound, gen);
}

}  // namespace attograd::nn::init
