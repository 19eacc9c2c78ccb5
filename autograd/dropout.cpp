#include "autograd/dropout.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <type_traits>

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

#include "autograd/activation.h"
#include "autograd/elementwise.h"
#include "autograd/parallel.h"

namespace attograd {

namespace {

void check_probability(double p, const char* op) {
  ATTO_CHECK(p >= 0.0 && p <= 1.0, op, "dropout probability has to be between 0 and 1, but got p = ", p);
}

// An element is kept when its 32-bit draw is >= this threshold: probability (2^32 - t) / 2^32 = 1 - p.
uint64_t keep_threshold(double p) { return static_cast<uint64_t>(std::llround(p * 4294967296.0)); }

// Generator is PCG32: next_u32() returns xsh_rr(state) and steps state = state * kPcgMultiplier + inc.
constexpr uint64_t kPcgMultiplier = 6364136223846793005ULL;

inline uint32_t xsh_rr(uint64_t old) {
  const auto xorshifted = static_cast<uint32_t>(((old >> 18u) ^ old) >> 27u);
  const auto rot = static_cast<uint32_t>(old >> 59u);
  return (xorshifted >> rot) | (xorshifted << ((32u - rot) & 31u));
}

// Eight 64-bit lanes (one AVX-512 register; GCC/Clang vector extension, lowered on narrower machines).
typedef uint64_t U64x8 __attribute__((vector_size(64)));

#if defined(__AVX512F__) && defined(__AVX512VL__) && defined(__AVX512DQ__)
#define ATTOGRAD_DROPOUT_AVX512 1
// The keep bits of eight consecutive draws from eight LCG states: xsh_rr on whole vectors (the 32-bit rotate is one
// instruction once the lanes are narrowed), then an unsigned compare.
inline __mmask8 keep8(__m512i old, __m256i threshold) {
  const __m512i x = _mm512_srli_epi64(_mm512_xor_si512(_mm512_srli_epi64(old, 18), old), 27);
  const __m256i draw = _mm256_rorv_epi32(_mm512_cvtepi64_epi32(x), _mm512_cvtepi64_epi32(_mm512_srli_epi64(old, 59)));
  return _mm256_cmpge_epu32_mask(draw, threshold);
}
#else
#define ATTOGRAD_DROPOUT_AVX512 0
#endif

// Sets bit i % 16 of words[i / 16] to (draw_i >= threshold) for i in [0, n) (the last word's unused bits 0), where
// draw_i is exactly what the i-th of n calls to gen.next_u32() would return, and leaves gen in the state those calls
// would leave. The serial LCG chain is split into 16 interleaved chains held in two vectors, each chain jumping 16
// steps at once (s' = A s + C), so the draws run in SIMD instead of waiting on one multiply after another; the
// result is a bit mask that masked vector instructions apply directly.
void draw_keep_bits(Generator& gen, int64_t n, uint64_t threshold, uint16_t* words) {
  constexpr int kLanes = 8, kVecs = 2, kStep = kLanes * kVecs;
  const GeneratorState st = gen.get_state();
  uint64_t jump_mul = 1, jump_add = 0;  // s_{t + kStep} = jump_mul * s_t + jump_add
  for (int j = 0; j < kStep; ++j) {
    jump_add = jump_add * kPcgMultiplier + st.inc;
    jump_mul *= kPcgMultiplier;
  }
  U64x8 lanes[kVecs];  // lanes[v][j]: the state before draw i + v * kLanes + j
  uint64_t t = st.state;
  for (int v = 0; v < kVecs; ++v)
    for (int j = 0; j < kLanes; ++j) {
      lanes[v][j] = t;
      t = t * kPcgMultiplier + st.inc;
    }
  int64_t i = 0;
  uint64_t s = st.state;  // the state before draw i
  if (n >= kStep) {
#if ATTOGRAD_DROPOUT_AVX512
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
      s = s * kPcgMultiplier + st.inc;
    }
    words[i / kStep] = static_cast<uint16_t>(w);
  }
  gen.set_state({s, st.inc});
}

constexpr int64_t kBlock = 4096;  // elements per block of keep bits (a multiple of 16)

// The LCG state `delta` steps after s (Brown, "Random number generation with arbitrary strides", 1994: the jump's
// multiplier and increment by repeated squaring).
uint64_t lcg_advance(uint64_t s, uint64_t inc, uint64_t delta) {
  uint64_t mul = kPcgMultiplier, add = inc, acc_mul = 1, acc_add = 0;
  for (; delta > 0; delta >>= 1) {
    if (delta & 1) {
      acc_mul *= mul;
      acc_add = acc_add * mul + add;
    }
    add = (mul + 1) * add;
    mul *= mul;
  }
  return acc_mul * s + acc_add;
}

// Calls f(start, len, words) for the consecutive blocks [start, start + len) of [0, n) (len <= kBlock), words holding
// the block's keep bits exactly as n sequential draws from gen give them (draw_keep_bits). Blocks run in parallel,
// each from gen's state advanced to its first draw, so the bits never depend on the thread count; gen ends n draws
// further, as after the sequential draws.
template <class F>
void for_keep_blocks(Generator& gen, int64_t n, uint64_t threshold, F&& f) {
  const GeneratorState st = gen.get_state();
  const int64_t blocks = (n + kBlock - 1) / kBlock;
  parallel_for(0, blocks, 8, [&](int64_t b0, int64_t b1) {
    Generator g;
    g.set_state({lcg_advance(st.state, st.inc, static_cast<uint64_t>(b0 * kBlock)), st.inc});
    uint16_t words[kBlock / 16];
    for (int64_t b = b0; b < b1; ++b) {
      const int64_t start = b * kBlock, len = std::min(kBlock, n - start);
      draw_keep_bits(g, len, threshold, words);
      f(start, len, words);
    }
  });
  gen.set_state({lcg_advance(st.state, st.inc, static_cast<uint64_t>(n)), st.inc});
}

// dst[i] = base[i] + src[i] * (keep_i ? s : 0) for i in [0, len) (base may be null: no addition), keep_i bit i % 16 of
// words[i / 16]. Never inlined: one compiled body, so that GCC cannot fuse the multiply and the add differently at
// different call sites (the serial and the parallel paths give the same bits).
template <class T>
__attribute__((noinline)) void apply_block(const uint16_t* words, int64_t len, T s, const T* bb, const T* sb, T* db) {
  int64_t i = 0;
#if defined(__AVX512F__)
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

// dst[i] = base[i] + src[i] * (keep_i ? scale : 0) (base may be null: no addition), keep_i drawn exactly as
// dropout_mask draws its n flags from gen (which advances by n draws). The backward replays a mask by calling this
// with a generator restored to the state the forward started from, so no mask is stored.
template <class T>
void apply_keep(Generator& gen, uint64_t threshold, double scale, int64_t n, const T* base, const T* src, T* dst) {
  const T s = static_cast<T>(scale);
  for_keep_blocks(gen, n, threshold, [&](int64_t start, int64_t len, const uint16_t* words) {
    apply_block<T>(words, len, s, base ? base + start : nullptr, src + start, dst + start);
  });
}

}  // namespace

Tensor dropout_mask(const Shape& shape, double p, Generator& gen, Dtype dtype) {
  check_probability(p, "dropout_mask");
  ATTO_CHECK(dtype != kInt64, "dropout_mask", "dtype must be float32, float64 or bool, got ", dtype_name(dtype));
  Tensor mask = empty(shape, {.dtype = dtype});
  if (p == 0.0 || p == 1.0) {  // deterministic: no draws
    fill_(mask, p == 0.0 ? 1.0 : 0.0);
    return mask;
  }
  const int64_t n = mask.numel();
  const uint64_t threshold = keep_threshold(p);
  dispatch_all(dtype, [&]<typename T>() {
    const T kept = dtype == kBool ? T(1) : static_cast<T>(1.0 / (1.0 - p));
    T* q = static_cast<T*>(mask.raw_data());
    for_keep_blocks(gen, n, threshold, [&](int64_t start, int64_t len, const uint16_t* words) {
      for (int64_t i = 0; i < len; ++i) q[start + i] = (words[i / 16] >> (i % 16)) & 1 ? kept : T(0);
    });
  });
  return mask;
}

// y = x * m / (1 - p) with m ~ Bernoulli(1 - p); dy/dx = m / (1 - p).
Tensor dropout(const Tensor& x, double p, bool training, Generator& gen) {
  ATTO_CHECK(x.defined(), "dropout", "called with an undefined tensor");
  check_probability(p, "dropout");
  ATTO_CHECK(is_floating(x.dtype()), "dropout", "expected a float32 or float64 tensor, got ", dtype_name(x.dtype()),
             " of shape ", x.shape());
  if (!training || p == 0.0) return x;
  if (p == 1.0) {
    Tensor out = zeros(x.shape(), {.dtype = x.dtype()});
    return record("dropout", out, {x},
                  [](const Tensor& g, GradInputs& gi) { gi[0] = zeros(g.shape(), {.dtype = g.dtype()}); });
  }
  // The mask is drawn as dropout_mask(x.shape(), p, gen, kBool) would draw it; the backward replays it from the
  // generator state the forward started from instead of keeping it (no memory per element).
  const GeneratorState start = gen.get_state();
  const uint64_t threshold = keep_threshold(p);
  const double scale = 1.0 / (1.0 - p);
  const int64_t n = x.numel();
  Tensor out = empty(x.shape(), {.dtype = x.dtype()});
  dispatch_float(x.dtype(), "dropout",
                 [&]<typename T>() { apply_keep<T>(gen, threshold, scale, n, nullptr, x.data<T>(), out.data<T>()); });
  if (!any_requires_grad({x})) return out;
  return record("dropout", out, {x}, [start, threshold, scale](const Tensor& g, GradInputs& gi) {
    Tensor dx = reuse_or_empty_like(g);  // elementwise: may overwrite g
    Generator replay;
    replay.set_state(start);
    dispatch_float(g.dtype(), "dropout_backward", [&]<typename T>() {
      apply_keep<T>(replay, threshold, scale, g.numel(), nullptr, g.data<T>(), dx.data<T>());
    });
    gi[0] = dx;
  });
}

// y = relu(x) * m / (1 - p). Where y > 0 the element was positive and kept: dy/dx = 1 / (1 - p); elsewhere 0.
namespace {

// bits[i / 8] bit i % 8 = (y[i] > 0) for i in [0, n), n a multiple of 8 (relu_dropout's saved mask: 1 bit per
// element instead of its output, so an FFN's hidden layer is kept by the next linear only and freed by its backward).
template <class T>
void positive_bits(const T* y, int64_t n, uint8_t* bits) {
  int64_t i = 0;
#if defined(__AVX512F__)
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

// dx[i] = bit i ? g[i] * s : 0 over [0, n).
template <class T>
void masked_scale(const uint8_t* bits, const T* g, T s, T* dx, int64_t n) {
  int64_t i = 0;
#if defined(__AVX512F__)
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

// relu_dropout; `temporary` is x when the caller handed it over as an rvalue (its storage may take the result).
Tensor relu_dropout_impl(const Tensor& x, double p, bool training, Generator& gen, Tensor* temporary) {
  ATTO_CHECK(x.defined(), "relu_dropout", "called with an undefined tensor");
  check_probability(p, "relu_dropout");
  ATTO_CHECK(is_floating(x.dtype()), "relu_dropout", "expected a float32 or float64 tensor, got ",
             dtype_name(x.dtype()), " of shape ", x.shape());
  if (!training || p == 0.0) return relu(x);
  if (p == 1.0) return dropout(relu(x), p, training, gen);
  const double scale = 1.0 / (1.0 - p);
  const uint64_t threshold = keep_threshold(p);
  const int64_t n = x.numel();
  const bool save = any_requires_grad({x});
  // Element i of the result depends on element i of x only, so it may be written over a temporary x.
  Tensor out = temporary ? reuse_temporary_or_empty(std::move(*temporary)) : empty(x.shape(), {.dtype = x.dtype()});
  Tensor mask = save ? empty({(n + 7) / 8}, {.dtype = kBool}) : Tensor();  // bit i: out[i] > 0
  uint8_t* bits = save ? static_cast<uint8_t*>(mask.raw_data()) : nullptr;
  dispatch_float(x.dtype(), "relu_dropout", [&]<typename T>() {
    const T s = static_cast<T>(scale);
    const T* px = x.data<T>();
    T* q = out.data<T>();
    // Blocks of keep bits (the draws dropout_mask makes), then applied (kBlock is a multiple of 16: each block
    // fills whole bytes of the saved mask).
    for_keep_blocks(gen, n, threshold, [&](int64_t start, int64_t len, const uint16_t* words) {
      const T* xb = px + start;
      T* qb = q + start;
      int64_t i = 0;
#if defined(__AVX512F__)
      if constexpr (std::is_same_v<T, float>) {
        const __m512 vs = _mm512_set1_ps(s), zero = _mm512_setzero_ps();
        for (; i + 16 <= len; i += 16)  // max(x, 0) is 0 for NaN and -0, as x > 0 ? x : 0 is
          _mm512_storeu_ps(qb + i, _mm512_mul_ps(_mm512_max_ps(_mm512_loadu_ps(xb + i), zero),
                                                 _mm512_maskz_mov_ps(words[i / 16], vs)));
      }
#endif
      for (; i < len; ++i) {
        const T r = xb[i] > T(0) ? xb[i] : T(0);
        qb[i] = r * ((words[i / 16] >> (i % 16)) & 1 ? s : T(0));
      }
      if (bits) positive_bits(qb, len, bits + start / 8);  // the block is still in L1
    });
  });
  if (!save) return out;
  return record("relu_dropout", out, {x}, [mask, scale](const Tensor& g, GradInputs& gi) {
    Tensor dx = reuse_or_empty_like(g);  // elementwise: may overwrite g
    dispatch_float(g.dtype(), "relu_dropout_backward", [&]<typename T>() {
      masked_scale<T>(static_cast<const uint8_t*>(mask.raw_data()), g.data<T>(), static_cast<T>(scale), dx.data<T>(),
                      g.numel());
    });
    gi[0] = dx;
  });
}

}  // namespace

Tensor relu_dropout(const Tensor& x, double p, bool training, Generator& gen) {
  return relu_dropout_impl(x, p, training, gen, nullptr);
}

Tensor relu_dropout(Tensor&& x, double p, bool training, Generator& gen) {
  return relu_dropout_impl(x, p, training, gen, &x);
}

// out = x + y * m / (1 - p); d out / dx = 1, d out / dy = m / (1 - p).
namespace {

// dropout_add; `temporary` is y when the caller handed it over as an rvalue (its storage may take the result).
Tensor dropout_add_impl(const Tensor& x, const Tensor& y, double p, bool training, Generator& gen, Tensor* temporary) {
  ATTO_CHECK(x.defined() && y.defined(), "dropout_add", "called with an undefined tensor");
  check_probability(p, "dropout_add");
  ATTO_CHECK(x.shape() == y.shape() && x.dtype() == y.dtype(), "dropout_add", "x ", x.shape(), " (",
             dtype_name(x.dtype()), ") and y ", y.shape(), " (", dtype_name(y.dtype()),
             ") must have the same shape and dtype");
  ATTO_CHECK(is_floating(x.dtype()), "dropout_add", "expected float32 or float64 tensors, got ", dtype_name(x.dtype()));
  if (!training || p == 0.0 || p == 1.0) return add(x, dropout(y, p, training, gen));
  const GeneratorState start = gen.get_state();  // the backward replays the mask from here (nothing stored)
  const uint64_t threshold = keep_threshold(p);
  const double scale = 1.0 / (1.0 - p);
  const int64_t n = x.numel();
  // Element i of the result depends on element i of x and y only, so it may be written over a temporary y.
  Tensor out = temporary ? reuse_temporary_or_empty(std::move(*temporary)) : empty(x.shape(), {.dtype = x.dtype()});
  dispatch_float(x.dtype(), "dropout_add", [&]<typename T>() {
    apply_keep<T>(gen, threshold, scale, n, x.data<T>(), y.data<T>(), out.data<T>());
  });
  if (!any_requires_grad({x, y})) return out;
  return record("dropout_add", out, {x, y}, [start, threshold, scale](const Tensor& g, GradInputs& gi) {
    if (gi.needs(0)) gi[0] = g;
    if (!gi.needs(1)) return;
    Tensor dy = gi.needs(0) ? empty(g.shape(), {.dtype = g.dtype()}) : reuse_or_empty_like(g);
    Generator replay;
    replay.set_state(start);
    dispatch_float(g.dtype(), "dropout_add_backward", [&]<typename T>() {
      apply_keep<T>(replay, threshold, scale, g.numel(), nullptr, g.data<T>(), dy.data<T>());
    });
    gi[1] = dy;
  });
}

}  // namespace

Tensor dropout_add(const Tensor& x, const Tensor& y, double p, bool training, Generator& gen) {
  return dropout_add_impl(x, y, p, training, gen, nullptr);
}

Tensor dropout_add(const Tensor& x, Tensor&& y, double p, bool training, Generator& gen) {
  return dropout_add_impl(x, y, p, training, gen, &y);
}

}  // namespace attograd
