#pragma once
// Internal: small AVX-512 helpers shared by the kernels. Include only from .cpp files.

#include <cstdint>

#if defined(__AVX512F__)
#include <immintrin.h>

namespace attograd::detail {

/// The mask of the first `count` of 16 lanes (all 16 from count >= 16, none at count <= 0): a row's tail.
inline __mmask16 first_lanes(int64_t count) {
  return static_cast<__mmask16>(count >= 16 ? 0xffffu : count <= 0 ? 0u : (1u << count) - 1u);
}

}  // namespace attograd::detail
#endif
