#pragma once
// Internal: scalar math the kernels and the ops share. Always inlined: a kernel set's copy never stands in for
// another's at link time.

#include <bit>
#include <cmath>
#include <cstdint>

namespace attograd::detail {

/// e^v for v <= 0 (also correct up to v ~ 88), for kernels. float: the Cephes expf polynomial on
/// r = v - m ln2 times 2^m built from exponent bits, so that loops over it vectorise (relative error
/// ~1e-7); v < -87.3 (and -inf) gives exactly 0, NaN gives NaN. double: std::exp.
[[gnu::always_inline]] inline float exp_le0(float v) {
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
[[gnu::always_inline]] inline double exp_le0(double v) { return std::exp(v); }

}  // namespace attograd::detail
