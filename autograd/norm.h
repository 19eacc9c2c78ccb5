#pragma once
// Fused normalisations with closed-form backwards: softmax, log_softmax and layer_norm.
// Each is one op (one graph node); the backward is written under the forward in norm.cpp.

#include <cstdint>

#include "autograd/tensor.h"

namespace attograd {

/// exp(x - max) / sum(exp(x - max)) along `dim` (negative counts from the end). A slice that is
/// entirely -inf gives zeros and a zero gradient (never NaN); huge finite logits stay finite.
/// Backward: dx = y * (g - sum(g * y)).
Tensor softmax(const Tensor& x, int64_t dim);

/// x - max - log(sum(exp(x - max))) along `dim`. A slice that is entirely -inf gives -inf values
/// and a zero gradient. Backward: dx = g - exp(y) * sum(g).
Tensor log_softmax(const Tensor& x, int64_t dim);

/// Layer normalisation over the trailing dims `normalized_shape` of x (..., *normalized_shape):
/// (x - mean) / sqrt(var + eps) * weight + bias, with the biased variance computed in two passes
/// (in double for float32 inputs). weight and bias (shape normalized_shape) are optional.
/// Saves only the mean and 1/sqrt(var + eps) per row; a constant row gives bias (finite gradients).
Tensor layer_norm(const Tensor& x, const Shape& normalized_shape, const Tensor& weight = Tensor(),
                  const Tensor& bias = Tensor(), double eps = 1e-5);

}  // namespace attograd
