// Dropout kernels (autograd/dropout.cpp has the ops): the keep bits of a block of PCG32 draws, computed on 16
// interleaved LCG chains at once, and the masked products that apply them.

#include <cstring>
#include <type_traits>

#include "autograd/cpu/kernels.h"
#include "autograd/cpu/simd.h"

namespace attograd::cpu::ATTOGRAD_CPU_ISA {

namespace {

constexpr uint64_t kPcgMultiplier = 6364136223846793005ULL;  // PCG32's LCG: state = state * kPcgMultiplier + inc

inline uint32_t xsh_rr(uint64_t old) {
  const auto xorshifted = static_cast<uint32_t>(((old >> 18u) ^ old) >> 27u);
  const auto rot = static_cast<uint32_t>(old >> 59u);
  return (xorshifted >> rot) | (xorshifted << ((32u - rot) & 31u));
}

// Eight 64-bit lanes (one AVX-512 register; GCC/Clang vector extension, lowered on narrower machines).
typedef uint64_t U64x8 __attribute__((vector_size(64)));

#if ATTOGRAD_AVX512
// The keep bits of eight consecutive draws from eight LCG states: xsh_rr on whole vectors (the 32-bit rotate is one
// instruction once the lanes are narrowed), then an unsigned compare.
inline __mmask8 keep8(__m512i old, __m256i threshold) {
  const __m512i x = _mm512_srli_epi64(_mm512_xor_si512(_mm512_srli_epi64(old, 18), old), 27);
  const __m256i draw = _mm256_rorv_epi32(_mm512_cvtepi64_epi32(x), _mm512_cvtepi64_epi32(_mm512_srli_epi64(old, 59)));
  return _mm256_cmpge_epu32_mask(draw, threshold);
}
#endif

}  // namespace

// The serial LCG chain is split into 16 interleaved chains held in two vectors, each chain jumping 16 steps at once
// (s' = A s + C), so the draws run in SIMD instead of waiting on one multiply after another; the result is a bit
// mask that masked vector instructions apply directly.
uint64_t draw_keep_bits(uint64_t state, uint64_t inc, int64_t n, uint64_t threshold, uint16_t* words) {
  constexpr int kLanes = 8, kVecs = 2, kStep = kLanes * kVecs;
  uint64_t jump_mul = 1, jump_add = 0;  // s_{t + kStep} = jump_mul * s_t + jump_add
  for (int j = 0; j < kStep; ++j) {
    jump_add = jump_add * kPcgMultiplier + inc;
    jump_mul *= kPcgMultiplier;
  }
  U64x8 lanes[kVecs];  // lanes[v][j]: the state before draw i + v * kLanes + j
  uint64_t t = state;
  for (int v = 0; v < kVecs; ++v)
    for (int j = 0; j < kLanes; ++j) {
      lanes[v][j] = t;
      t = t * kPcgMultiplier + inc;
    }
  int64_t i = 0;
  uint64_t s = state;  // the state before draw i
  if (n >= kStep) {
#if ATTOGRAD_AVX512
    // threshold 2^32 (p rounds to 1) keeps nothing: the draws still advance the generator.
    const bool none = threshold > 0xffffffffu;
    const __m256i vt = _mm256_set1_epi32(static_cast<int>(static_cast<uint32_t>(none ? 0 : threshold)));
    const __m512i jm = _mm512_set1_epi64(static_cast<int64_t>(jump_mul)),
                  ja = _mm512_set1_epi64(static_cast<int64_t>(jump_add));
    __m512i l0, l1;
    std::memcpy(&l0, &lanes[0], sizeof(l0));
    std::memcpy(&l1, &lanes[1], sizeof(l1));
    for (; i + kStep <= n; i += kStep) {
      const unsigned w = keep8(l0, vt) | (static_cast<unsigned>(keep8(l1, vt)) << 8);
      words[i / kStep] = none ? 0 : static_cast<uint16_t>(w);
      l0 = _mm512_add_epi64(_mm512_mullo_epi64(l0, jm), ja);
      l1 = _mm512_add_epi64(_mm512_mullo_epi64(l1, jm), ja);
    }
    s = static_cast<uint64_t>(_mm_cvtsi128_si64(_mm512_castsi512_si128(l0)));  // the state before draw i
#else
    for (; i + kStep <= n; i += kStep) {
      unsigned w = 0;
      for (int v = 0; v < kVecs; ++v) {
        const U64x8 old = lanes[v];  // xsh_rr on 64-bit lanes, masked to 32 bits
        const U64x8 x = (((old >> 18) ^ old) >> 27) & 0xffffffffu;
        const U64x8 rot = old >> 59;
        const U64x8 draw = ((x >> rot) | (x << ((32 - rot) & 31))) & 0xffffffffu;
        for (int j = 0; j < kLanes; ++j) w |= static_cast<unsigned>(draw[j] >= threshold) << (v * kLanes + j);
        lanes[v] = old * jump_mul + jump_add;
      }
      words[i / kStep] = static_cast<uint16_t>(w);
    }
    s = lanes[0][0];
#endif
  }
  if (i < n) {
    unsigned w = 0;
    for (int j = 0; i + j < n; ++j) {
      w |= static_cast<unsigned>(xsh_rr(s) >= threshold) << j;
      s = s * kPcgMultiplier + inc;
    }
    words[i / kStep] = static_cast<uint16_t>(w);
  }
  return s;
}

template <class T>
void apply_keep_block(const uint16_t* words, int64_t len, T s, const T* bb, const T* sb, T* db) {
  int64_t i = 0;
#if ATTOGRAD_AVX512
  if constexpr (std::is_same_v<T, float>) {
    const __m512 vs = _mm512_set1_ps(s);
    for (; i + 16 <= len; i += 16) {
      const __m512 f = _mm512_maskz_mov_ps(words[i / 16], vs);  // scale where kept, 0 where dropped
      const __m512 x = _mm512_mul_ps(_mm512_loadu_ps(sb + i), f);
      _mm512_storeu_ps(db + i, bb ? _mm512_add_ps(_mm512_loadu_ps(bb + i), x) : x);
    }
  }
#endif
  for (; i < len; ++i) {
    const T f = (words[i / 16] >> (i % 16)) & 1 ? s : T(0);
    db[i] = bb ? bb[i] + sb[i] * f : sb[i] * f;
  }
}

template <class T>
void relu_keep_block(const uint16_t* words, int64_t len, T s, const T* xb, T* qb) {
  int64_t i = 0;
#if ATTOGRAD_AVX512
  if constexpr (std::is_same_v<T, float>) {
    const __m512 vs = _mm512_set1_ps(s), zero = _mm512_setzero_ps();
    for (; i + 16 <= len; i += 16)  // max(x, 0) is 0 for NaN and -0, as x > 0 ? x : 0 is
      _mm512_storeu_ps(
          qb + i, _mm512_mul_ps(_mm512_max_ps(_mm512_loadu_ps(xb + i), zero), _mm512_maskz_mov_ps(words[i / 16], vs)));
  }
#endif
  for (; i < len; ++i) {
    const T r = xb[i] > T(0) ? xb[i] : T(0);
    qb[i] = r * ((words[i / 16] >> (i % 16)) & 1 ? s : T(0));
  }
}

template <class T>
void positive_bits(const T* y, int64_t n, uint8_t* bits) {
  int64_t i = 0;
#if ATTOGRAD_AVX512
  if constexpr (std::is_same_v<T, float>) {
    for (; i + 16 <= n; i += 16) {
      const __mmask16 m = _mm512_cmp_ps_mask(_mm512_loadu_ps(y + i), _mm512_setzero_ps(), _CMP_GT_OQ);
      std::memcpy(bits + i / 8, &m, 2);
    }
  } else {
    for (; i + 8 <= n; i += 8)
      bits[i / 8] = _mm512_cmp_pd_mask(_mm512_loadu_pd(y + i), _mm512_setzero_pd(), _CMP_GT_OQ);
  }
#endif
  for (; i < n; i += 8) {
    uint8_t b = 0;
    for (int j = 0; j < 8 && i + j < n; ++j) b = static_cast<uint8_t>(b | ((y[i + j] > T(0)) << j));
    bits[i / 8] = b;
  }
}

template <class T>
void masked_scale(const uint8_t* bits, const T* g, T s, T* dx, int64_t n) {
  int64_t i = 0;
#if ATTOGRAD_AVX512
  if constexpr (std::is_same_v<T, float>) {
    const __m512 vs = _mm512_set1_ps(s);
    for (; i + 16 <= n; i += 16) {
      __mmask16 m;
      std::memcpy(&m, bits + i / 8, 2);
      _mm512_storeu_ps(dx + i, _mm512_maskz_mul_ps(m, _mm512_loadu_ps(g + i), vs));
    }
  } else {
    const __m512d vs = _mm512_set1_pd(s);
    for (; i + 8 <= n; i += 8)
      _mm512_storeu_pd(dx + i, _mm512_maskz_mul_pd(static_cast<__mmask8>(bits[i / 8]), _mm512_loadu_pd(g + i), vs));
  }
#endif
  for (; i < n; ++i) dx[i] = (bits[i / 8] >> (i % 8)) & 1 ? g[i] * s : T(0);
}

#define ATTOGRAD_INSTANTIATE(T)                                                           \
  template void apply_keep_block<T>(const uint16_t*, int64_t, T, const T*, const T*, T*); \
  template void relu_keep_block<T>(const uint16_t*, int64_t, T, const T*, T*);            \
  template void positive_bits<T>(const T*, int64_t, uint8_t*);                            \
  template void masked_scale<T>(const uint8_t*, const T*, T, T*, int64_t);
ATTOGRAD_INSTANTIATE(float)
ATTOGRAD_INSTANTIATE(double)
#undef ATTOGRAD_INSTANTIATE

}  // namespace attograd::cpu::ATTOGRAD_CPU_ISA
