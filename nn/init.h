#pragma once
// Parameter initialisers as free functions with an explicit generator (torch.nn.init). Each fills
// the tensor in place without recording history and returns it.

#include "autograd/autograd.h"

namespace attograd::nn::init {

/// (fan_in, fan_out) of a weight: for (out, in) fan_in = in, fan_out = out; extra dims multiply both.
std::pair<int64_t, int64_t> calculate_fan_in_and_fan_out(const Tensor& w);
/// PyTorch's recommended gain for a nonlinearity ("linear", "relu", "tanh", "sigmoid", "leaky_relu").
double calculate_gain(const std::string& nonlinearity, double param = 0.01);
/// U(a, b).
Tensor uniform_(Tensor w, double a, double b, Generator& gen = default_generator());
/// N(mean, std^2).
Tensor normal_(Tensor w, double mean = 0.0, double std = 1.0, Generator& gen = default_generator());
/// All `value`.
Tensor constant_(Tensor w, double value);
/// All zeros.
Tensor zeros_(Tensor w);
/// All ones.
Tensor ones_(Tensor w);
/// U(-a, a) with a = gain * sqrt(6 / (fan_in + fan_out)).
Tensor xavier_uniform_(Tensor w, double gain = 1.0, Generator& gen = default_generator());
/// N(0, std^2) with std = gain * sqrt(2 / (fan_in + fan_out)).
Tensor xavier_normal_(Tensor w, double gain = 1.0, Generator& gen = default_generator());
/// U(-b, b) with b = gain * sqrt(3 / fan), gain = sqrt(2 / (1 + a^2)) (leaky_relu), fan = fan_in or fan_out.
Tensor kaiming_uniform_(Tensor w, double a = 0.0, const std::string& mode = "fan_in",
                        Generator& gen = default_generator());

}  // namespace attograd::nn::init
