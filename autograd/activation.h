#pragma once
// Pointwise math and activation functions, each with its closed-form backward.
// All take a float32 or float64 tensor of any shape and return one of the same shape and dtype.

#include <string_view>

#include "autograd/tensor.h"

namespace attograd {

/// e^x.
Tensor exp(const Tensor& x);
/// Natural logarithm (log(0) = -inf, log of a negative number = nan, as in PyTorch).
Tensor log(const Tensor& x);
/// Square root.
Tensor sqrt(const Tensor& x);
/// |x|; its gradient at 0 is 0 (sign(0) = 0, as in PyTorch).
Tensor abs(const Tensor& x);
/// x^exponent elementwise; the gradient is zero everywhere when exponent == 0 (as in PyTorch).
Tensor pow(const Tensor& x, double exponent);
/// Hyperbolic tangent.
Tensor tanh(const Tensor& x);
/// Logistic sigmoid 1 / (1 + e^-x), computed without overflow for any x.
Tensor sigmoid(const Tensor& x);
/// max(x, 0); its gradient at 0 is 0.
Tensor relu(const Tensor& x);
/// GELU: x * Phi(x) with the exact erf form ("none") or PyTorch's tanh approximation ("tanh").
Tensor gelu(const Tensor& x, std::string_view approximate = "none");

}  // namespace attograd
