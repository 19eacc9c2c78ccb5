#pragma once
// Fused normalisations with closed-form backwards: softmax, log_softmax and layer_norm.
// Each is one op (one graph node); the backward is written under the forward in norm.cpp.

#include <bit>
#include <cmath>
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

namespace detail {

/// e^v for v <= 0 (also correct up to v ~ 88), for kernels. float: the Cephes expf polynomial on
/// r = v - m ln2 times 2^m built from exponent bits, so that loops over it vectorise (relative error
/// ~1e-7); v < -87.3 (and -inf) gives exactly 0, NaN gives NaN. double: std::exp.
inline float exp_le0(float v) {
  constexpr float lo = -87.33654f;
  const float x = v < lo ? lo : v;
  const float k = x * 1.44269504088896341f + 12582912.0f;  // 1.5 * 2^23: k's low bits hold round(x / ln2)
  const float m = k - 12582912.0f;
  float r = x - m * 0.693359375f;  // ln2 split in two parts so that r is exact
  r = r + m * 2.12194440e-4f;
  const float r2 = r * r;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r2 + r + 1.0f;
  const int32_t e = std::bit_cast<int32_t>(k) - 0x4B400000 + 127;  // biased exponent of 2^m
  const float res = p * std::bit_cast<float>(e << 23);
  return v < lo ? 0.0f : res;
}
/// double is the gradient-checking type: the library exp.
inline double exp_le0(double v) { return std::exp(v); }

/// Row kernel shared with loss.cpp: writes exp(x[i] - shift) to out[i] (shift >= max x; -inf
/// entries give exactly 0) and returns their sum, accumulated in double. T is float or double.
template <class T>
double exp_shifted_sum(const T* x, T shift, T* out, int64_t n);

/// Row kernel shared with loss.cpp: the sum of exp(x[i] - shift) in double, without storing.
template <class T>
double sum_exp_shifted(const T* x, T shift, int64_t n);

/// Row kernel shared with loss.cpp: the maximum of x[0..n) (-inf when n == 0; NaN entries ignored).
template <class T>
T row_max(const T* x, int64_t n);

/// Row kernel shared with loss.cpp: the sum of x[0..n) accumulated in double.
template <class T>
double row_sum(const T* x, int64_t n);

}  // namespace detail

}  // namespace attograd
