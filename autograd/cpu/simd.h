#pragma once
// Internal, for the kernel files (autograd/cpu/*.cpp) only: ATTOGRAD_AVX512 is 1 in the avx512 set (the AVX-512
// intrinsics are available), and the helpers the AVX-512 kernels share.

#include <cstdint>

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512DQ__) && defined(__AVX512VL__)
#define ATTOGRAD_AVX512 1
#include <immintrin.h>

namespace attograd::cpu::ATTOGRAD_CPU_ISA {

/// The mask of the first `count` of 16 lanes (all 16 from count >= 16, none at count <= 0): a row's tail.
[[gnu::always_inline]] inline __mmask16 first_lanes(int64_t count) {
  return static_cast<__mmask16>(count >= 16 ? 0xffffu : count <= 0 ? 0u : (1u << count) - 1u);
}

/// Stores the lanes of v that k selects at p: a plain store when k is all 16 lanes, a masked one only for a tail.
/// AMD cores do not forward a masked store to a load that reads the same bytes soon after (measured: a fifth of the
/// attention backward was that stall), and the kernels read back what they store (a row, a C tile, dweight sums).
[[gnu::always_inline]] inline void store_first_lanes(float* p, __mmask16 k, __m512 v) {
  if (k == static_cast<__mmask16>(0xffff))
    _mm512_storeu_ps(p, v);
  else
    _mm512_mask_storeu_ps(p, k, v);
}

}  // namespace attograd::cpu::ATTOGRAD_CPU_ISA
#else
#define ATTOGRAD_AVX512 0
#endif
