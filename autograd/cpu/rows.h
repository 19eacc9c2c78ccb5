#pragma once
// Internal, for the kernel files (autograd/cpu/*.cpp) only: row reductions inlined into the kernels' row loops
// (the row_max kernel exports the same function to the ops).

#include <cstdint>
#include <limits>
#include <type_traits>

#include "autograd/cpu/simd.h"

namespace attograd::cpu::ATTOGRAD_CPU_ISA {

/// The maximum of x[0..n): -inf when n == 0; NaN entries are ignored, and of +0 and -0 the first stays.
template <class T>
[[gnu::always_inline]] inline T max_in_row(const T* x, int64_t n) {
#if ATTOGRAD_AVX512
  if constexpr (std::is_same_v<T, float>) {
    // Whole vectors and a masked tail; max(v, acc) returns acc when v is NaN or both are zeros, as x > acc ? x : acc.
    const __m512 ninf = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
    __m512 acc = ninf;
    for (int64_t j = 0; j < n; j += 16) acc = _mm512_max_ps(_mm512_mask_loadu_ps(ninf, first_lanes(n - j), x + j), acc);
    return _mm512_reduce_max_ps(acc);
  }
#endif
  constexpr int L = 64 / sizeof(T);  // independent lanes (one 512-bit register), so that the loop vectorises
  T acc[L];
  for (int k = 0; k < L; ++k) acc[k] = -std::numeric_limits<T>::infinity();
  int64_t i = 0;
  for (; i + L <= n; i += L)
    for (int k = 0; k < L; ++k) acc[k] = x[i + k] > acc[k] ? x[i + k] : acc[k];
  for (int k = 0; k < L && i + k < n; ++k) acc[k] = x[i + k] > acc[k] ? x[i + k] : acc[k];
  for (int w = L / 2; w > 0; w /= 2)
    for (int k = 0; k < w; ++k) acc[k] = acc[k + w] > acc[k] ? acc[k + w] : acc[k];
  return acc[0];
}

}  // namespace attograd::cpu::ATTOGRAD_CPU_ISA
