// Attention kernels (autograd/attention.cpp has the op): the forward and the backward of scaled dot-product
// attention over blocks of query rows, FlashAttention-style (scores, softmax and the products one block at a time,
// scratch of kBlockRows x Lk per thread), with the dropout mask replayed from a hash instead of stored. The
// products run on the GEMM kernels (in the avx512 set, with K^T, V, V^T and K packed once per head). Grouped-query
// attention reads key/value head h / (H / H_kv) in place. A sliding window or a block layout takes the sparse path
// (sparse_forward, sparse_backward): each block of query rows computes only the keys some row of it can see.

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>

// GCC 12 reports false -Wuninitialized warnings inside Eigen's AVX-512 kernels; silence them for Eigen only.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <Eigen/Core>
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif

#include "autograd/cpu/kernels.h"
#include "autograd/cpu/rows.h"
#include "autograd/cpu/scratch.h"
#include "autograd/cpu/simd.h"
#include "autograd/parallel.h"

namespace attograd::cpu::ATTOGRAD_CPU_ISA {

namespace {

using Plan = AttentionPlan;
using detail::GemmOperand;
using detail::operand;

template <class T>
using RowMap = Eigen::Map<Eigen::Array<T, 1, Eigen::Dynamic>>;

// Query rows per block: the scratch of a block is kBlockRows x Lk, never Lq x Lk. Causal attention uses blocks
// half as tall, so that its products skip more of the blocked upper triangle (a block sees only the keys up to its
// last row): measured faster for L = 32 ... 1024.
constexpr int64_t kBlockRows = 64;
constexpr int64_t kCausalBlockRows = 32;

inline int64_t block_rows(int64_t Lq, bool causal) { return std::min(causal ? kCausalBlockRows : kBlockRows, Lq); }

// SplitMix64's finaliser (Steele, Lea, Flood 2014): a bijective 64-bit mix.
inline uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

// The dropout hash key of row i of head (b, h): SplitMix64 of the seed and the flat row index (see dropout_row).
inline uint32_t dropout_key(const Plan& p, int64_t b, int64_t h, int64_t i) {
  constexpr uint64_t kGamma64 = 0x9e3779b97f4a7c15ULL;
  const uint64_t row = static_cast<uint64_t>((b * p.H + h) * p.Lq + i);
  return static_cast<uint32_t>(mix64(p.seed + (row + 1) * kGamma64) >> 32);
}

// Dropout multipliers of row i, keys [0, len) of head (b, h): keep_scale = 1 / (1 - p) where the element is kept,
// 0 where it is dropped. Element (b, h, i, j) is dropped when hash(i, j) < p * 2^32, with
// hash = fmix32(row_key + j * golden) (MurmurHash3's 32-bit finaliser over a Weyl sequence) and
// row_key = SplitMix64(seed, flat row index (b, h, i)): a pure function of the seed and (b, h, i, j), so the backward
// replays the forward's mask without storing it (and any memory layout of q, k, v gives the same mask). 32-bit
// lanes: sixteen hashes per AVX-512 instruction sequence.
template <class T>
inline __attribute__((always_inline)) void dropout_row(const Plan& p, int64_t b, int64_t h, int64_t i, int64_t len,
                                                       T* mult) {
  constexpr uint32_t kGamma32 = 0x9e3779b9u;
  const uint32_t key = dropout_key(p, b, h, i);
  const T keep = static_cast<T>(p.keep_scale);
  const uint32_t below = static_cast<uint32_t>(std::min<uint64_t>(p.drop_below, 0xffffffffu));
  const bool all_dropped = p.drop_below > 0xffffffffu;
  for (int64_t j = 0; j < len; ++j) {
    uint32_t z = key + static_cast<uint32_t>(j) * kGamma32;
    z ^= z >> 16;
    z *= 0x85ebca6bu;
    z ^= z >> 13;
    z *= 0xc2b2ae35u;
    z ^= z >> 16;
    mult[j] = z >= below && !all_dropped ? keep : T(0);
  }
}

// sum_x a[x] b[x] over 16 independent lanes (vectorises without reassociating a single running sum).
template <class T>
T dot(const T* a, const T* b, int64_t n) {
  constexpr int kL = 16;
  T acc[kL] = {};
  int64_t x = 0;
  for (; x + kL <= n; x += kL)
    for (int l = 0; l < kL; ++l) acc[l] += a[x + l] * b[x + l];
  for (int l = 0; x + l < n; ++l) acc[l] += a[x + l] * b[x + l];
  for (int w = kL / 2; w > 0; w /= 2)
    for (int l = 0; l < w; ++l) acc[l] += acc[l + w];
  return acc[0];
}

// A right-hand operand op(B) (kb, nb) that every block of query rows of one head multiplies by (K^T, V, V^T, K):
// packed once per head for the float32 kernel, read in place otherwise.
template <class T>
struct HeadOperand {
  GemmOperand<T> raw;
  const float* packed = nullptr;
  int64_t kb = 0, nb = 0;

  // Floats of packed storage an operand of (kb, nb) needs (0 when it is read in place).
  static size_t packed_floats(int64_t kb, int64_t nb) {
    if constexpr (std::is_same_v<T, float>) return packed_gemm_available() ? packed_b_floats(kb, nb) : 0;
    return 0;
  }
  // Packs op(B) into buf (packed_floats(kb, nb) floats, 64-byte aligned) when the kernel takes packed operands.
  HeadOperand(int64_t kb_, int64_t nb_, GemmOperand<T> b, float* buf) : raw(b), kb(kb_), nb(nb_) {
    if constexpr (std::is_same_v<T, float>) {
      if (packed_gemm_available() && kb > 0 && nb > 0) {
        ATTOGRAD_CPU_ISA::pack_gemm_b(kb, nb, b, buf);
        packed = buf;
      }
    }
  }
  // C (m, n) (+)= alpha * op(A) (m, k) B[0:k, 0:n]; serial, the same bits either way.
  void mul(int64_t m, int64_t n, int64_t k, GemmOperand<T> a, T* c, int64_t ldc, bool acc, T alpha = T(1)) const {
    if constexpr (std::is_same_v<T, float>) {
      if (packed) {
        ATTOGRAD_CPU_ISA::gemm_packed(m, n, k, a, packed, kb, nb, c, ldc, acc, alpha);
        return;
      }
    }
    detail::gemm(m, n, k, a, raw, c, ldc, acc, alpha, false);
  }
};

// s (n x lk) = scale * Q[i0:i0+n] K[0:lk]^T + mask, with -inf at blocked entries (bool mask, causal). The forward and
// the backward both call this, so they see bitwise the same scores.
template <class T>
void block_scores(const Plan& p, const T* q_bh, int64_t q_sl, const HeadOperand<T>& kt, const void* mask, int64_t b,
                  int64_t h, int64_t i0, int64_t n, int64_t lk, T* s) {
  kt.mul(n, lk, p.dk, operand(q_bh + i0 * q_sl, q_sl), s, lk, false, static_cast<T>(p.scale));
  constexpr T kNegInf = -std::numeric_limits<T>::infinity();
  if (p.flex && p.flex->kinds) {  // a mask_mod on the dense path: its partial blocks' kept elements (FlexArgs::dense)
    const FlexArgs& fx = *p.flex;
    const int64_t bs = fx.bs, qb = i0 / bs;
    const uint8_t* kinds = fx.row(b, h, qb);
    const int64_t* bits_at = fx.bits_row(b, h, qb);
    for (int64_t c = 0; c * bs < lk; ++c) {
      if (kinds[c] != 1) continue;
      const int64_t j1 = std::min(lk, (c + 1) * bs);
      for (int64_t r = 0; r < n; ++r) {
        const uint8_t* brow = fx.bits + bits_at[c] + ((i0 + r) % bs) * bs - c * bs;  // indexed by the key j
        T* row = s + r * lk;
        for (int64_t j = c * bs; j < j1; ++j) row[j] = brow[j] ? row[j] : kNegInf;
      }
    }
  }
  for (int64_t r = 0; r < n; ++r) {
    const int64_t i = i0 + r;
    T* row = s + r * lk;
    const int64_t moff = b * p.mb + h * p.mh + i * p.mi;
    if (p.mask_kind == MaskKind::Bool) {
      const bool* m = static_cast<const bool*>(mask) + moff;
      if (p.mj == 1) {
        const auto* mb = reinterpret_cast<const uint8_t*>(m);  // 0 or 1; a select on bytes vectorises
        for (int64_t j = 0; j < lk; ++j) {
          const T x = row[j];
          row[j] = mb[j] ? kNegInf : x;
        }
      } else if (m[0]) {  // the mask is broadcast along keys: the whole row is blocked or open
        for (int64_t j = 0; j < lk; ++j) row[j] = kNegInf;
      }
    } else if (p.mask_kind == MaskKind::Float) {
      const T* m = static_cast<const T*>(mask) + moff;
      if (p.mj == 1) {
        for (int64_t j = 0; j < lk; ++j) row[j] += m[j];
      } else {
        for (int64_t j = 0; j < lk; ++j) row[j] += m[0];
      }
    }
    if (p.causal)
      for (int64_t j = i + 1; j < lk; ++j) row[j] = kNegInf;
  }
}

// In place row <- exp(row - m) with results below the smallest normal number flushed to exactly zero: the
// vectorised exp maps -inf (a blocked key) to a denormal rather than 0, and a blocked key must get
// probability 0 (and no denormals should slow the products that follow). Each value is then multiplied by `scale`:
// the forward passes 1 (exact) and divides by the returned sum later, the backward passes the saved 1 / sum and gets
// the forward's probabilities bitwise in one pass. Returns the sum of the new row.
template <class T>
T exp_shifted(T* row, int64_t lk, T m, T scale = T(1)) {
  RowMap<T> a(row, lk);
  a = (a - m).exp();
  constexpr T tiny = std::numeric_limits<T>::min();
  for (int64_t j = 0; j < lk; ++j) row[j] = (row[j] < tiny ? T(0) : row[j]) * scale;
  return a.sum();
}

#if ATTOGRAD_AVX512
// float32: the same row kernels on whole AVX-512 vectors with a masked tail (Eigen's reductions cost more than the
// arithmetic on rows this short), exp being Eigen's own vectorised pexp.
// exp(x - m) with results below the smallest normal number flushed to zero, times scale (exp_shifted's lanes).
[[gnu::always_inline]] inline __m512 exp_flushed(__m512 x, __m512 vm, __m512 vscale) {
  const __m512 e = Eigen::internal::pexp<Eigen::internal::Packet16f>(_mm512_sub_ps(x, vm));
  const __m512 tiny = _mm512_set1_ps(std::numeric_limits<float>::min());
  return _mm512_mul_ps(_mm512_maskz_mov_ps(_mm512_cmp_ps_mask(e, tiny, _CMP_GE_OQ), e), vscale);
}

template <>
inline __attribute__((always_inline)) float exp_shifted<float>(float* row, int64_t lk, float m, float scale) {
  const __m512 vm = _mm512_set1_ps(m), vscale = _mm512_set1_ps(scale);
  const __m512 ninf = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  __m512 acc = _mm512_setzero_ps();
  for (int64_t j = 0; j < lk; j += 16) {
    const __mmask16 k = first_lanes(lk - j);
    const __m512 e = exp_flushed(_mm512_mask_loadu_ps(ninf, k, row + j), vm, vscale);
    store_first_lanes(row + j, k, e);  // the row is read right after
    acc = _mm512_add_ps(acc, e);
  }
  return _mm512_reduce_add_ps(acc);
}

// Keys up to which a row of scores is held in registers by the one-pass row kernels below (four vectors).
constexpr int64_t kRegisterKeys = 64;

// The vectors of a row of lk <= kRegisterKeys keys: how many, and the lanes of each that hold keys.
struct RowVectors {
  int nv;
  __mmask16 lanes[4];
  explicit RowVectors(int64_t lk) : nv(static_cast<int>((lk + 15) / 16)) {
    for (int v = 0; v < 4; ++v) lanes[v] = first_lanes(lk - 16 * v);
  }
};

// Dropout multipliers of keys [j0, j0 + 16) of a row whose hash key is `key` (dropout_row's hash and rule on sixteen
// lanes): keep where the element is kept, 0 where it is dropped.
struct DropoutLanes {
  uint32_t below = 0;
  bool all_dropped = false;
  __m512 keep;

  explicit DropoutLanes(const Plan& p)
      : below(static_cast<uint32_t>(std::min<uint64_t>(p.drop_below, 0xffffffffu))),
        all_dropped(p.drop_below > 0xffffffffu),
        keep(_mm512_set1_ps(static_cast<float>(p.keep_scale))) {}

  [[gnu::always_inline]] __m512 mult(uint32_t key, int64_t j0) const {
    if (all_dropped) return _mm512_setzero_ps();
    const __m512i lane = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    const __m512i j = _mm512_add_epi32(_mm512_set1_epi32(static_cast<int>(j0)), lane);
    __m512i z = _mm512_add_epi32(_mm512_set1_epi32(static_cast<int>(key)),
                                 _mm512_mullo_epi32(j, _mm512_set1_epi32(static_cast<int>(0x9e3779b9u))));
    z = _mm512_xor_si512(z, _mm512_srli_epi32(z, 16));
    z = _mm512_mullo_epi32(z, _mm512_set1_epi32(static_cast<int>(0x85ebca6bu)));
    z = _mm512_xor_si512(z, _mm512_srli_epi32(z, 13));
    z = _mm512_mullo_epi32(z, _mm512_set1_epi32(static_cast<int>(0xc2b2ae35u)));
    z = _mm512_xor_si512(z, _mm512_srli_epi32(z, 16));
    return _mm512_maskz_mov_ps(_mm512_cmpge_epu32_mask(z, _mm512_set1_epi32(static_cast<int>(below))), keep);
  }
};

// The forward's row work on a block of scores s (n, lk), lk <= kRegisterKeys, in one pass: each row is loaded once,
// then max, exp(s - m) with exp_shifted's flush, the sum, times 1 / sum and times the dropout multipliers, stored
// once. Every operation is the one the separate passes (max_in_row, exp_shifted, the scaling loop, dropout_row) do, in
// the same order, so the probabilities are the same bits. row_m, row_inv receive each row's max and 1 / sum (-inf and
// 0 for a fully blocked row, whose probabilities are zeros); kept (n, lk), when non-null, the probabilities before
// dropout.
void softmax_dropout_rows(const Plan& p, int64_t b, int64_t h, int64_t i0, int64_t n, int64_t lk, float* s,
                          float* row_m, float* row_inv, float* kept) {
  const __m512 ninf = _mm512_set1_ps(-std::numeric_limits<float>::infinity()), one = _mm512_set1_ps(1.0f);
  const RowVectors rv(lk);
  const DropoutLanes drop(p);
  for (int64_t r = 0; r < n; ++r) {
    float* row = s + r * lk;
    __m512 x[4];
    __m512 mx = ninf;
    for (int v = 0; v < rv.nv; ++v) {
      x[v] = _mm512_mask_loadu_ps(ninf, rv.lanes[v], row + 16 * v);
      mx = _mm512_max_ps(x[v], mx);
    }
    const float m = _mm512_reduce_max_ps(mx);
    row_m[r] = m;
    if (m == -std::numeric_limits<float>::infinity()) {
      std::fill(row, row + lk, 0.0f);
      if (kept) std::fill(kept + r * lk, kept + (r + 1) * lk, 0.0f);
      row_inv[r] = 0;
      continue;
    }
    const __m512 vm = _mm512_set1_ps(m);
    __m512 acc = _mm512_setzero_ps();
    for (int v = 0; v < rv.nv; ++v) {
      x[v] = exp_flushed(x[v], vm, one);
      acc = _mm512_add_ps(acc, x[v]);
    }
    const float inv = 1.0f / _mm512_reduce_add_ps(acc);
    row_inv[r] = inv;
    const __m512 vinv = _mm512_set1_ps(inv);
    const uint32_t key = p.dropout ? dropout_key(p, b, h, i0 + r) : 0;
    for (int v = 0; v < rv.nv; ++v) {
      __m512 y = _mm512_mul_ps(x[v], vinv);
      if (kept) store_first_lanes(kept + r * lk + 16 * v, rv.lanes[v], y);
      if (p.dropout) y = _mm512_mul_ps(y, drop.mult(key, 16 * v));
      store_first_lanes(row + 16 * v, rv.lanes[v], y);
    }
  }
}

// The backward's row work on a block (n, lk), lk <= kRegisterKeys, in one pass per row: P = exp(s - m) * inv_sum
// (exp_shifted with the saved scale) in place in prob, or read from kept (the forward's, when non-null), the dropout
// multipliers into mult and P times them into pd (each when non-null): the same bits as exp_shifted, dropout_row and
// the product loop. Fully blocked rows get zeros.
void backward_rows(const Plan& p, const float* stats, int64_t bh, int64_t b, int64_t h, int64_t i0, int64_t n,
                   int64_t lk, const float* kept, float* prob, float* mult, float* pd) {
  const __m512 ninf = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  const RowVectors rv(lk);
  const DropoutLanes drop(p);
  for (int64_t r = 0; r < n; ++r) {
    float* row = prob + r * lk;
    const float m = stats[2 * (bh * p.Lq + i0 + r)];
    if (m == -std::numeric_limits<float>::infinity()) {
      if (!kept) std::fill(row, row + lk, 0.0f);
      if (mult) std::fill(mult + r * lk, mult + (r + 1) * lk, 0.0f);
      if (pd) std::fill(pd + r * lk, pd + (r + 1) * lk, 0.0f);
      continue;
    }
    const __m512 vm = _mm512_set1_ps(m), vscale = _mm512_set1_ps(stats[2 * (bh * p.Lq + i0 + r) + 1]);
    const uint32_t key = mult ? dropout_key(p, b, h, i0 + r) : 0;
    for (int v = 0; v < rv.nv; ++v) {
      __m512 e;
      if (kept) {
        e = _mm512_maskz_loadu_ps(rv.lanes[v], kept + r * lk + 16 * v);
      } else {
        e = exp_flushed(_mm512_mask_loadu_ps(ninf, rv.lanes[v], row + 16 * v), vm, vscale);
        store_first_lanes(row + 16 * v, rv.lanes[v], e);
      }
      if (mult) {
        const __m512 f = drop.mult(key, 16 * v);
        store_first_lanes(mult + r * lk + 16 * v, rv.lanes[v], f);
        if (pd) store_first_lanes(pd + r * lk + 16 * v, rv.lanes[v], _mm512_mul_ps(e, f));
      }
    }
  }
}

// sum_x a[x] b[x]: one vector of partial sums, then a tree (the backward's D_i, once per row).
template <>
inline float dot<float>(const float* a, const float* b, int64_t n) {
  __m512 acc = _mm512_setzero_ps();
  for (int64_t x = 0; x < n; x += 16) {
    const __mmask16 k = first_lanes(n - x);
    acc = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(k, a + x), _mm512_maskz_loadu_ps(k, b + x), acc);
  }
  return _mm512_reduce_add_ps(acc);
}

#endif

// Number of keys a block of query rows [i0, i0 + n) can see: causal blocks skip the keys past their last row.
inline int64_t visible_keys(const Plan& p, int64_t i0, int64_t n) { return p.causal ? std::min(p.Lk, i0 + n) : p.Lk; }

// The same for head (b, h), also cut at the end of the last non-empty key block of a mask_mod's block mask (the dense
// path takes a block mask only when each row of blocks is non-empty blocks [0, end), FlexArgs::dense).
inline int64_t visible_keys(const Plan& p, int64_t b, int64_t h, int64_t i0, int64_t n) {
  const int64_t lk = visible_keys(p, i0, n);
  if (!p.flex || !p.flex->kinds) return lk;
  const uint8_t* kinds = p.flex->row(b, h, i0 / p.flex->bs);
  int64_t c = p.flex->nbk;
  while (c > 0 && kinds[c - 1] == 0) --c;
  return std::min(lk, c * p.flex->bs);
}

// H = -sum_j p_j log p_j over a row of probabilities (0 log 0 = 0: blocked and flushed keys add nothing, as
// p_j log max(p_j, min normal) is exactly 0 there). Vectorised (Eigen's log), a fixed order for any thread count.
template <class T>
T row_entropy(const T* row, int64_t n) {
  const Eigen::Map<const Eigen::Array<T, 1, Eigen::Dynamic>> a(row, n);
  return -(a * a.max(std::numeric_limits<T>::min()).log()).sum();
}

// drow += ge * scale * dH/ds = -ge * scale * p_j (log p_j + H) over a row (zero where p_j = 0): the entropy's share of
// dS, added in the pass that forms the softmax backward's.
template <class T>
void add_entropy_grad(const T* prow, int64_t n, T ent, T ge, T scale, T* drow) {
  if (ge == T(0)) return;
  const Eigen::Map<const Eigen::Array<T, 1, Eigen::Dynamic>> a(prow, n);
  RowMap<T> d(drow, n);
  d += (-ge * scale) * a * (a.max(std::numeric_limits<T>::min()).log() + ent);
}

// Per-thread scratch (64-byte aligned, so that the forward and the backward run Eigen's exp over identically
// aligned rows and get bitwise the same probabilities).
Scratch& scratch() {
  thread_local Scratch s;
  return s;
}

// Heads per parallel chunk: enough work to pay for waking a thread.
int64_t head_grain(const Plan& p) {
  const double per_head =
      2.0 * static_cast<double>(p.Lq) * static_cast<double>(p.Lk) * static_cast<double>(p.dk + p.dv + 8);
  return std::max<int64_t>(1, static_cast<int64_t>(2e6 / std::max(per_head, 1.0)));
}

// ---- the sparse path (window and/or block layout): per block of query rows, only the keys some row can see.

// Rows per block of the sparse path: a mask_mod's block mask takes the causal height (its partial blocks are
// typically on a diagonal; shorter rows skip more of them).
inline int64_t sparse_block_rows(const Plan& p) {
  return block_rows(p.Lq, p.causal || (p.flex && p.flex->kinds));
}

// Query rows [i0, i0 + n) of the sparse path: at most kBlockRows (kCausalBlockRows when causal) and never across a
// row of the block layout, so that every row of a block has the same key blocks.
inline int64_t sparse_rows(const Plan& p, int64_t i0) {
  int64_t n = std::min(sparse_block_rows(p), p.Lq - i0);
  if (p.block > 0) n = std::min(n, p.block - i0 % p.block);
  if (p.flex && p.flex->kinds) n = std::min(n, p.flex->bs - i0 % p.flex->bs);
  return n;
}

// The keys some row of [i0, i0 + n) may see under causality, the window and the block layout, in increasing order
// into idx (when non-null); returns how many. Key blocks no row can see are left out, never computed. *contiguous
// tells whether they form one run idx[0] ... idx[0] + count - 1 (always so without a block layout).
inline int64_t key_set(const Plan& p, int64_t b, int64_t h, int64_t i0, int64_t n, int64_t* idx, bool* contiguous) {
  int64_t lo = 0, hi = p.Lk;
  const int64_t last = i0 + n - 1;
  if (p.causal) hi = std::min(hi, last + 1);
  if (p.window > 0) {
    if (p.causal) {
      lo = std::max<int64_t>(0, i0 - p.window + 1);
    } else {
      lo = std::max<int64_t>(0, i0 - p.window);
      hi = std::min(hi, last + p.window + 1);
    }
  }
  *contiguous = true;
  if (lo >= hi) return 0;
  if (p.flex && p.flex->kinds) {  // the key blocks of the block mask that are not empty, within the layout's
    const uint8_t* kinds = p.flex->row(b, h, i0 / p.flex->bs);
    const bool* lay = p.block > 0 ? p.layout + (i0 / p.block) * p.nbk : nullptr;
    const int64_t bs = p.flex->bs;
    int64_t count = 0, prev_end = -1, runs = 0;
    for (int64_t c = lo / bs; c <= (hi - 1) / bs; ++c) {
      if (kinds[c] == 0) continue;
      const int64_t a0 = std::max(lo, c * bs), e0 = std::min(hi, (c + 1) * bs);
      for (int64_t a = a0; a < e0;) {  // [a, e): one run within one layout block (or the whole range)
        int64_t e = e0;
        if (lay) {
          const int64_t lb = a / p.block;
          e = std::min(e0, (lb + 1) * p.block);
          if (!lay[lb]) {
            a = e;
            continue;
          }
        }
        if (a != prev_end) ++runs;
        if (idx)
          for (int64_t j = a; j < e; ++j) idx[count + j - a] = j;
        count += e - a;
        prev_end = e;
        a = e;
      }
    }
    *contiguous = runs <= 1;
    return count;
  }
  if (p.block <= 0) {
    if (idx)
      for (int64_t j = lo; j < hi; ++j) idx[j - lo] = j;
    return hi - lo;
  }
  const bool* row = p.layout + (i0 / p.block) * p.nbk;
  int64_t count = 0, prev_end = -1, runs = 0;
  for (int64_t c = lo / p.block; c <= (hi - 1) / p.block; ++c) {
    if (!row[c]) continue;
    const int64_t a = std::max(lo, c * p.block), e = std::min(hi, (c + 1) * p.block);
    if (a != prev_end) ++runs;
    if (idx)
      for (int64_t j = a; j < e; ++j) idx[count + j - a] = j;
    count += e - a;
    prev_end = e;
  }
  *contiguous = runs <= 1;
  return count;
}

// The most keys any block of query rows sees (the size of the sparse path's per-block scratch).
inline int64_t max_key_set(const Plan& p) {
  int64_t most = 0;
  bool contiguous = true;
  const int64_t mB = p.flex && p.flex->kinds ? p.flex->mB : 1, mH = p.flex && p.flex->kinds ? p.flex->mH : 1;
  for (int64_t b = 0; b < mB; ++b)
    for (int64_t h = 0; h < mH; ++h)
      for (int64_t i0 = 0; i0 < p.Lq;) {
        const int64_t n = sparse_rows(p, i0);
        most = std::max(most, key_set(p, b, h, i0, n, nullptr, &contiguous));
        i0 += n;
      }
  return most;
}

// Dropout multipliers of row i at the keys idx[0 .. len): the same hash of (seed, b, h, i, j) as dropout_row.
template <class T>
void dropout_at(const Plan& p, int64_t b, int64_t h, int64_t i, const int64_t* idx, int64_t len, T* mult) {
  constexpr uint32_t kGamma32 = 0x9e3779b9u;
  const uint32_t key = dropout_key(p, b, h, i);
  const T keep = static_cast<T>(p.keep_scale);
  const uint32_t below = static_cast<uint32_t>(std::min<uint64_t>(p.drop_below, 0xffffffffu));
  const bool all_dropped = p.drop_below > 0xffffffffu;
  for (int64_t t = 0; t < len; ++t) {
    uint32_t z = key + static_cast<uint32_t>(idx[t]) * kGamma32;
    z ^= z >> 16;
    z *= 0x85ebca6bu;
    z ^= z >> 13;
    z *= 0xc2b2ae35u;
    z ^= z >> 16;
    mult[t] = z >= below && !all_dropped ? keep : T(0);
  }
}

// s (n x m) = scale * Q[i0:i0+n] Kg^T + mask over the keys idx[0 .. m) (Kg row t = key idx[t]), with -inf where the
// mask, causality or the window blocks (i, j): the sparse path's block_scores.
template <class T>
void sparse_scores(const Plan& p, const T* q_bh, int64_t q_sl, const T* kg, int64_t kg_sl, const int64_t* idx,
                   const void* mask, int64_t b, int64_t h, int64_t i0, int64_t n, int64_t m, T* s, T* raw = nullptr) {
  detail::gemm(n, m, p.dk, operand(q_bh + i0 * q_sl, q_sl), operand(kg, kg_sl, true), s, m, false,
               static_cast<T>(p.scale), false);
  constexpr T kNegInf = -std::numeric_limits<T>::infinity();
  const FlexArgs* fx = p.flex;
  const uint8_t* kinds = fx && fx->kinds ? fx->row(b, h, i0 / fx->bs) : nullptr;
  const int64_t* bits_at = kinds ? fx->bits_row(b, h, i0 / fx->bs) : nullptr;
  for (int64_t r = 0; r < n; ++r) {
    const int64_t i = i0 + r;
    T* row = s + r * m;
    if (fx && fx->score) {  // score_mod on scale * q . k (raw keeps the scores it saw, for the backward)
      if (raw) std::copy(row, row + m, raw + r * m);
      for (int64_t t = 0; t < m; ++t) row[t] = static_cast<T>(flex_score(*fx, static_cast<double>(row[t]), b, h, i, idx[t]));
    }
    const int64_t moff = b * p.mb + h * p.mh + i * p.mi;
    if (p.mask_kind == MaskKind::Bool) {
      const bool* mrow = static_cast<const bool*>(mask) + moff;
      for (int64_t t = 0; t < m; ++t)
        if (mrow[idx[t] * p.mj]) row[t] = kNegInf;
    } else if (p.mask_kind == MaskKind::Float) {
      const T* mrow = static_cast<const T*>(mask) + moff;
      for (int64_t t = 0; t < m; ++t) row[t] += mrow[idx[t] * p.mj];
    }
    if (p.causal || p.window > 0)
      for (int64_t t = 0; t < m; ++t) {
        const int64_t j = idx[t];
        bool blocked = p.causal && j > i;
        if (p.window > 0) blocked = blocked || (p.causal ? j <= i - p.window : (j < i - p.window || j > i + p.window));
        if (blocked) row[t] = kNegInf;
      }
    if (kinds) {  // mask_mod in partial blocks only (full blocks skip it, empty ones are not in idx): their kept
                  // elements, else a call per element
      const int64_t bs = fx->bs, ib = i % bs;
      for (int64_t t = 0; t < m;) {
        const int64_t c = idx[t] / bs, end = (c + 1) * bs;
        int64_t t2 = t + 1;
        while (t2 < m && idx[t2] < end) ++t2;
        if (kinds[c] == 1) {
          if (bits_at[c] >= 0) {
            const uint8_t* brow = fx->bits + bits_at[c] + ib * bs - c * bs;  // indexed by the key j
            for (int64_t u = t; u < t2; ++u) row[u] = brow[idx[u]] ? row[u] : kNegInf;
          } else {
            for (int64_t u = t; u < t2; ++u)
              if (!flex_mask(*fx, b, h, i, idx[u])) row[u] = kNegInf;
          }
        }
        t = t2;
      }
    }
  }
}

// Rows idx[0 .. m) of a head (row stride sl, d features) into dst (m, d), or dst's rows added back to them.
template <class T>
void gather_rows(const T* src, int64_t sl, int64_t d, const int64_t* idx, int64_t m, T* dst) {
  for (int64_t t = 0; t < m; ++t) std::copy(src + idx[t] * sl, src + idx[t] * sl + d, dst + t * d);
}
template <class T>
void scatter_add_rows(const T* src, int64_t d, const int64_t* idx, int64_t m, T* dst, int64_t sl) {
  for (int64_t t = 0; t < m; ++t) {
    T* row = dst + idx[t] * sl;
    for (int64_t x = 0; x < d; ++x) row[x] += src[t * d + x];
  }
}

template <class T>
void sparse_forward(const Plan& p, HeadView<const T> q, HeadView<const T> k, HeadView<const T> v, const void* mask,
                    HeadView<T> out, T* stats, T* weights, T* probs, T* entropy) {
  constexpr T kNegInf = -std::numeric_limits<T>::infinity();
  const int64_t M = max_key_set(p), nb = sparse_block_rows(p), G = p.group();
  const bool gathers = p.block > 0 || (p.flex && p.flex->kinds);
  parallel_for(0, p.B * p.H, head_grain(p), [&](int64_t bh0, int64_t bh1) {
    const size_t blk = static_cast<size_t>(nb * M), mm = static_cast<size_t>(M);
    const size_t nk = gathers ? mm * p.dk : 0, nv = gathers ? mm * p.dv : 0, n_mult = p.dropout ? mm : 0;
    Scratch& sc = scratch();
    sc.reserve({blk * sizeof(T), n_mult * sizeof(T), mm * sizeof(int64_t), nk * sizeof(T), nv * sizeof(T)});
    T* s = sc.take<T>(blk);
    T* mult = sc.take<T>(n_mult);
    int64_t* idx = sc.take<int64_t>(mm);
    T* kbuf = sc.take<T>(nk);
    T* vbuf = sc.take<T>(nv);
    for (int64_t bh = bh0; bh < bh1; ++bh) {
      const int64_t b = bh / p.H, h = bh % p.H;
      T* probs_bh = probs ? probs + bh * p.Lq * p.Lk : nullptr;
      const T* q_bh = q.head(b, h);
      const T* k_bh = k.head(b, h / G);
      const T* v_bh = v.head(b, h / G);
      T* out_bh = out.head(b, h);
      for (int64_t i0 = 0, n = 0; i0 < p.Lq; i0 += n) {
        n = sparse_rows(p, i0);
        bool contiguous = true;
        const int64_t m = key_set(p, b, h, i0, n, idx, &contiguous);
        T* w_blk = weights ? weights + (bh * p.Lq + i0) * p.Lk : nullptr;  // (n, Lk)
        if (w_blk) std::fill(w_blk, w_blk + n * p.Lk, T(0));
        if (m == 0) {  // no key in reach: every row is blocked
          for (int64_t r = 0; r < n; ++r) {
            std::fill(out_bh + (i0 + r) * out.sl, out_bh + (i0 + r) * out.sl + p.dv, T(0));
            if (stats) {
              stats[2 * (bh * p.Lq + i0 + r)] = kNegInf;
              stats[2 * (bh * p.Lq + i0 + r) + 1] = 0;
            }
            if (entropy) entropy[bh * p.Lq + i0 + r] = 0;
          }
          continue;
        }
        const T *kg = k_bh + idx[0] * k.sl, *vg = v_bh + idx[0] * v.sl;
        int64_t kg_sl = k.sl, vg_sl = v.sl;
        if (!contiguous) {
          gather_rows(k_bh, k.sl, p.dk, idx, m, kbuf);
          gather_rows(v_bh, v.sl, p.dv, idx, m, vbuf);
          kg = kbuf, vg = vbuf, kg_sl = p.dk, vg_sl = p.dv;
        }
        sparse_scores(p, q_bh, q.sl, kg, kg_sl, idx, mask, b, h, i0, n, m, s);
        T row_m[kBlockRows];
        for (int64_t r = 0; r < n; ++r) {
          T* row = s + r * m;
          const T mx = max_in_row(row, m);
          row_m[r] = mx;
          T inv_sum = 0;
          if (mx == kNegInf) {
            std::fill(row, row + m, T(0));
          } else {
            inv_sum = T(1) / exp_shifted(row, m, mx);
            for (int64_t t = 0; t < m; ++t) row[t] *= inv_sum;
          }
          if (entropy) entropy[bh * p.Lq + i0 + r] = row_entropy(row, m);  // before dropout
          if (stats) {
            stats[2 * (bh * p.Lq + i0 + r)] = mx;
            stats[2 * (bh * p.Lq + i0 + r) + 1] = inv_sum;
          }
        }
        if (probs_bh) {  // P (n, m) before dropout, as the backward reads it
          std::copy(s, s + n * m, probs_bh);
          probs_bh += n * m;
        }
        if (p.dropout)
          for (int64_t r = 0; r < n; ++r) {
            if (row_m[r] == kNegInf) continue;
            T* row = s + r * m;
            dropout_at(p, b, h, i0 + r, idx, m, mult);
            for (int64_t t = 0; t < m; ++t) row[t] *= mult[t];
          }
        detail::gemm(n, p.dv, m, operand<T>(s, m), operand(vg, vg_sl), out_bh + i0 * out.sl, out.sl, false, T(1),
                     false);
        if (w_blk)
          for (int64_t r = 0; r < n; ++r)
            for (int64_t t = 0; t < m; ++t) w_blk[r * p.Lk + idx[t]] = s[r * m + t];
      }
    }
  });
}

template <class T>
void sparse_backward(const Plan& p, HeadView<const T> q, HeadView<const T> k, HeadView<const T> v, const void* mask,
                     HeadView<const T> out, const T* stats, const T* probs, HeadView<const T> dout, HeadView<T> dq,
                     HeadView<T> dk, HeadView<T> dv, const T* entropy, const T* dentropy) {
  const int64_t M = max_key_set(p), nb = sparse_block_rows(p), G = p.group();
  // The captured tensors' gradients need dL/dmod even when q and k want none.
  const bool need_ds = dq || dk || (p.flex && p.flex->cap_grad), gathers = p.block > 0 || (p.flex && p.flex->kinds);
  const bool mod = p.flex && p.flex->score;  // score_mod: dS goes through d mod / d score, and into the captures
  const T scale = static_cast<T>(p.scale);
  constexpr T kNegInf = -std::numeric_limits<T>::infinity();
  // Threads split the key/value heads: the query heads sharing one run in order on one thread, so that a shared
  // head's dK, dV sum their contributions in the same order for any thread count.
  parallel_for(0, p.B * (p.H / G), std::max<int64_t>(1, head_grain(p) / G), [&](int64_t g0, int64_t g1) {
    const size_t blk = static_cast<size_t>(nb * M), mm = static_cast<size_t>(M);
    const size_t n_ds = need_ds ? blk : 0, n_pd = p.dropout && dv ? blk : 0, n_mult = p.dropout ? blk : 0;
    const size_t nk = gathers ? mm * p.dk : 0, nv = gathers ? mm * p.dv : 0;
    Scratch& sc = scratch();
    const size_t n_raw = mod && need_ds ? blk : 0;
    sc.reserve({blk * sizeof(T), n_ds * sizeof(T), n_pd * sizeof(T), n_mult * sizeof(T), mm * sizeof(int64_t),
                nk * sizeof(T), nv * sizeof(T), nk * sizeof(T), nv * sizeof(T), n_raw * sizeof(T)});
    T* prob = sc.take<T>(blk);
    T* ds = sc.take<T>(n_ds);
    T* pd = n_pd ? sc.take<T>(n_pd) : nullptr;
    T* mult = sc.take<T>(n_mult);
    int64_t* idx = sc.take<int64_t>(mm);
    T* kbuf = sc.take<T>(nk);
    T* vbuf = sc.take<T>(nv);
    T* dkbuf = sc.take<T>(nk);
    T* dvbuf = sc.take<T>(nv);
    T* raw = n_raw ? sc.take<T>(n_raw) : nullptr;
    for (int64_t g = g0; g < g1; ++g) {
      double* cap_grad = mod && p.flex->cap_grad ? p.flex->cap_grad + g * p.flex->cap_numel : nullptr;
      const int64_t b = g / (p.H / G), hk = g % (p.H / G);
      const T* k_bh = k.head(b, hk);
      const T* v_bh = v.head(b, hk);
      for (int64_t h = hk * G; h < (hk + 1) * G; ++h) {
        const int64_t bh = b * p.H + h;
        const T* probs_bh = probs ? probs + bh * p.Lq * p.Lk : nullptr;
        const T* q_bh = q.head(b, h);
        const T* o_bh = out.head(b, h);
        const T* do_bh = dout.head(b, h);
        for (int64_t i0 = 0, n = 0; i0 < p.Lq; i0 += n) {
          n = sparse_rows(p, i0);
          bool contiguous = true;
          const int64_t m = key_set(p, b, h, i0, n, idx, &contiguous);
          if (m == 0) {
            if (dq) {
              T* dq_bh = dq.head(b, h);
              for (int64_t r = 0; r < n; ++r)
                std::fill(dq_bh + (i0 + r) * dq.sl, dq_bh + (i0 + r) * dq.sl + p.dk, T(0));
            }
            continue;
          }
          const T *kg = k_bh + idx[0] * k.sl, *vg = v_bh + idx[0] * v.sl;
          int64_t kg_sl = k.sl, vg_sl = v.sl;
          if (!contiguous) {
            gather_rows(k_bh, k.sl, p.dk, idx, m, kbuf);
            gather_rows(v_bh, v.sl, p.dv, idx, m, vbuf);
            kg = kbuf, vg = vbuf, kg_sl = p.dk, vg_sl = p.dv;
          }
          const T* dob = do_bh + i0 * dout.sl;  // (n, d_v)
          const T* pr = prob;                   // (n, m)
          if (probs_bh) {
            pr = probs_bh;
            probs_bh += n * m;
          } else {
            sparse_scores(p, q_bh, q.sl, kg, kg_sl, idx, mask, b, h, i0, n, m, prob, raw);
          }
          for (int64_t r = 0; r < n; ++r) {
            T* row = prob + r * m;
            const T mx = stats[2 * (bh * p.Lq + i0 + r)];
            const T inv_sum = stats[2 * (bh * p.Lq + i0 + r) + 1];
            T* mrow = p.dropout ? mult + r * m : nullptr;
            if (mx == kNegInf) {
              if (!probs) std::fill(row, row + m, T(0));
              if (mrow) std::fill(mrow, mrow + m, T(0));
              if (pd) std::fill(pd + r * m, pd + (r + 1) * m, T(0));
              continue;
            }
            if (!probs) exp_shifted(row, m, mx, inv_sum);
            if (mrow) {
              dropout_at(p, b, h, i0 + r, idx, m, mrow);
              if (pd)
                for (int64_t t = 0; t < m; ++t) pd[r * m + t] = pr[r * m + t] * mrow[t];
            }
          }
          // dV += Pd^T dO, straight into the shared head when the keys are one run, else through dvbuf.
          if (dv) {
            const GemmOperand<T> pa = operand<T>(p.dropout ? pd : pr, m, true);
            if (contiguous)
              detail::gemm(m, p.dv, n, pa, operand(dob, dout.sl), dv.head(b, hk) + idx[0] * dv.sl, dv.sl, true, T(1),
                           false);
            else {
              detail::gemm(m, p.dv, n, pa, operand(dob, dout.sl), dvbuf, p.dv, false, T(1), false);
              scatter_add_rows(dvbuf, p.dv, idx, m, dv.head(b, hk), dv.sl);
            }
          }
          if (!need_ds) continue;
          detail::gemm(n, m, p.dv, operand(dob, dout.sl), operand(vg, vg_sl, true), ds, m, false, T(1), false);
          for (int64_t r = 0; r < n; ++r) {
            const T d = dot(do_bh + (i0 + r) * dout.sl, o_bh + (i0 + r) * out.sl, p.dv);
            const T* prow = pr + r * m;
            T* drow = ds + r * m;
            if (mod) {  // dL/dmod = P (dP - D) (+ the entropy's), then times d mod / d score and scale
              const T* f = p.dropout ? mult + r * m : nullptr;
              for (int64_t t = 0; t < m; ++t) drow[t] = prow[t] * ((f ? drow[t] * f[t] : drow[t]) - d);
              if (dentropy) {
                const int64_t row_i = bh * p.Lq + i0 + r;
                add_entropy_grad(prow, m, entropy[row_i], dentropy[row_i], T(1), drow);
              }
              const T* rrow = raw + r * m;
              for (int64_t t = 0; t < m; ++t) {
                const T gm = drow[t];
                if (gm == T(0)) continue;  // blocked or zero-probability keys: no gradient anywhere
                const double dmod = flex_score_backward(*p.flex, static_cast<double>(rrow[t]), b, h, i0 + r, idx[t],
                                                        static_cast<double>(gm), cap_grad);
                drow[t] = static_cast<T>(static_cast<double>(gm) * dmod) * scale;
              }
              continue;
            }
            if (p.dropout) {
              const T* f = mult + r * m;
              for (int64_t t = 0; t < m; ++t) drow[t] = prow[t] * (drow[t] * f[t] - d) * scale;
            } else {
              for (int64_t t = 0; t < m; ++t) drow[t] = prow[t] * (drow[t] - d) * scale;
            }
            if (dentropy) {
              const int64_t row_i = bh * p.Lq + i0 + r;
              add_entropy_grad(prow, m, entropy[row_i], dentropy[row_i], scale, drow);
            }
          }
          if (dq)
            detail::gemm(n, p.dk, m, operand<T>(ds, m), operand(kg, kg_sl), dq.head(b, h) + i0 * dq.sl, dq.sl, false,
                         T(1), false);
          if (dk) {
            const GemmOperand<T> da = operand<T>(ds, m, true);
            if (contiguous)
              detail::gemm(m, p.dk, n, da, operand(q_bh + i0 * q.sl, q.sl), dk.head(b, hk) + idx[0] * dk.sl, dk.sl,
                           true, T(1), false);
            else {
              detail::gemm(m, p.dk, n, da, operand(q_bh + i0 * q.sl, q.sl), dkbuf, p.dk, false, T(1), false);
              scatter_add_rows(dkbuf, p.dk, idx, m, dk.head(b, hk), dk.sl);
            }
          }
        }
      }
    }
  });
}

}  // namespace

// Forward over all heads (split between threads). stats (B, H, Lq, 2) receives per row {max score m,
// 1 / sum exp(s - m)}, i.e. the logsumexp m + log(sum) kept in two parts so that huge scores lose no precision in
// float32, and so that the backward's exp(s - m) * inv_sum reproduces the forward's probabilities bitwise;
// m = -inf marks a fully blocked row. stats and weights (B, H, Lq, Lk) may be null; so may probs (B, H, Lq, Lk), which
// receives the probabilities before dropout (of each row's visible keys) for a backward that reads instead of
// recomputing them.
template <class T>
void attention_forward(const Plan& p, HeadView<const T> q, HeadView<const T> k, HeadView<const T> v, const void* mask,
                       HeadView<T> out, T* stats, T* weights, T* probs, T* entropy) {
  if (p.sparse()) {
    sparse_forward(p, q, k, v, mask, out, stats, weights, probs, entropy);
    return;
  }
  const int64_t nb = block_rows(p.Lq, p.causal || p.flex), G = p.group();
  constexpr T kNegInf = -std::numeric_limits<T>::infinity();
#if ATTOGRAD_AVX512
  // Rows short enough to stay in registers, without the entropy (it reads the probabilities between the passes): one
  // pass per row.
  const bool one_pass_rows = p.one_pass_rows && p.Lk <= kRegisterKeys && !entropy;
#endif
  parallel_for(0, p.B * p.H, head_grain(p), [&](int64_t bh0, int64_t bh1) {
    const size_t blk = static_cast<size_t>(nb * p.Lk), n_mult = p.dropout ? static_cast<size_t>(p.Lk) : 0;
    const size_t n_kt = HeadOperand<T>::packed_floats(p.dk, p.Lk), n_v = HeadOperand<T>::packed_floats(p.Lk, p.dv);
    Scratch& sc = scratch();
    sc.reserve({blk * sizeof(T), n_mult * sizeof(T), n_kt * sizeof(float), n_v * sizeof(float)});
    T* s_buf = sc.take<T>(blk);
    T* mult = sc.take<T>(n_mult);
    float* kt_buf = sc.take<float>(n_kt);
    float* v_buf = sc.take<float>(n_v);
    for (int64_t bh = bh0; bh < bh1; ++bh) {
      const int64_t b = bh / p.H, h = bh % p.H;
      T* probs_bh = probs ? probs + bh * p.Lq * p.Lk : nullptr;  // the head's kept blocks, one after another
      const T* q_bh = q.head(b, h);                              // (Lq, d_k), row stride q.sl
      const T* k_bh = k.head(b, h / G);                          // (Lk, d_k), shared by G query heads
      const T* v_bh = v.head(b, h / G);                          // (Lk, d_v)
      T* out_bh = out.head(b, h);                                // (Lq, d_v)
      const HeadOperand<T> kt(p.dk, p.Lk, operand(k_bh, k.sl, true), kt_buf);  // K^T (d_k, Lk)
      const HeadOperand<T> vv(p.Lk, p.dv, operand(v_bh, v.sl), v_buf);         // V (Lk, d_v)
      for (int64_t i0 = 0; i0 < p.Lq; i0 += nb) {
        const int64_t n = std::min(nb, p.Lq - i0);
        const int64_t lk = visible_keys(p, b, h, i0, n);
        T* w_blk = weights ? weights + (bh * p.Lq + i0) * p.Lk : nullptr;  // (n, Lk)
        if (lk == 0) {                                                     // no keys at all: every row is blocked
          for (int64_t r = 0; r < n; ++r)
            std::fill(out_bh + (i0 + r) * out.sl, out_bh + (i0 + r) * out.sl + p.dv, T(0));
          if (stats)
            for (int64_t r = 0; r < n; ++r) {
              stats[2 * (bh * p.Lq + i0 + r)] = kNegInf;
              stats[2 * (bh * p.Lq + i0 + r) + 1] = 0;
            }
          if (entropy) std::fill(entropy + bh * p.Lq + i0, entropy + bh * p.Lq + i0 + n, T(0));
          if (w_blk) std::fill(w_blk, w_blk + n * p.Lk, T(0));
          continue;
        }
        T* s = s_buf;  // (n, lk)
        block_scores(p, q_bh, q.sl, kt, mask, b, h, i0, n, lk, s);
#if ATTOGRAD_AVX512
        if constexpr (std::is_same_v<T, float>) {
          if (one_pass_rows) {  // softmax and dropout with each row in registers (the same bits as below)
            float row_m[kBlockRows], row_inv[kBlockRows];
            softmax_dropout_rows(p, b, h, i0, n, lk, s, row_m, row_inv, probs_bh);
            if (probs_bh) probs_bh += n * lk;
            if (stats)
              for (int64_t r = 0; r < n; ++r) {
                stats[2 * (bh * p.Lq + i0 + r)] = row_m[r];
                stats[2 * (bh * p.Lq + i0 + r) + 1] = row_inv[r];
              }
            vv.mul(n, p.dv, lk, operand<T>(s, lk), out_bh + i0 * out.sl, out.sl, false);
            if (w_blk)
              for (int64_t r = 0; r < n; ++r) {
                std::copy(s + r * lk, s + (r + 1) * lk, w_blk + r * p.Lk);
                std::fill(w_blk + r * p.Lk + lk, w_blk + (r + 1) * p.Lk, T(0));
              }
            continue;
          }
        }
#endif
        // P = softmax(S) row by row over the row's visible keys, with the max shifted out; then dropout,
        // P <- P * keep / (1 - p). First every row's exp and sum, then the scaling: the rows' reductions and
        // divisions overlap instead of each row waiting on its own.
        T row_m[kBlockRows], row_sum[kBlockRows];
        for (int64_t r = 0; r < n; ++r) {
          T* row = s + r * lk;
          const T m = max_in_row(row, lk);
          row_m[r] = m;
          row_sum[r] = m == kNegInf ? T(0) : exp_shifted(row, lk, m);
        }
        for (int64_t r = 0; r < n; ++r) {
          T* row = s + r * lk;
          const T m = row_m[r];
          T inv_sum = 0;
          if (m == kNegInf) {
            std::fill(row, row + lk, T(0));  // all keys blocked: zero probabilities, zero output
          } else {
            inv_sum = T(1) / row_sum[r];
            for (int64_t j = 0; j < lk; ++j) row[j] *= inv_sum;
          }
          if (entropy) entropy[bh * p.Lq + i0 + r] = row_entropy(row, lk);  // before dropout
          if (stats) {
            stats[2 * (bh * p.Lq + i0 + r)] = m;
            stats[2 * (bh * p.Lq + i0 + r) + 1] = inv_sum;
          }
        }
        if (probs_bh) {  // P (n, lk) as the backward reads it, the blocks of a head one after another
          std::copy(s, s + n * lk, probs_bh);
          probs_bh += n * lk;
        }
        if (p.dropout)
          for (int64_t r = 0; r < n; ++r) {
            if (row_m[r] == kNegInf) continue;
            T* row = s + r * lk;
            dropout_row(p, b, h, i0 + r, lk, mult);
            for (int64_t j = 0; j < lk; ++j) row[j] *= mult[j];
          }
        // O = P V.
        vv.mul(n, p.dv, lk, operand<T>(s, lk), out_bh + i0 * out.sl, out.sl, false);
        if (w_blk)
          for (int64_t r = 0; r < n; ++r) {
            std::copy(s + r * lk, s + (r + 1) * lk, w_blk + r * p.Lk);
            std::fill(w_blk + r * p.Lk + lk, w_blk + (r + 1) * p.Lk, T(0));
          }
      }
    }
  });
}

// Backward over all heads (split between threads: a head's dq, dk, dv are written by its own thread only),
// recomputing P block by block from the saved stats, or reading it from probs (the forward's, when it kept them).
// dq, dk, dv may be null (not wanted); dk and dv must be zero-filled (they accumulate over query blocks); every dq row
// is assigned.
template <class T>
void attention_backward(const Plan& p, HeadView<const T> q, HeadView<const T> k, HeadView<const T> v, const void* mask,
                        HeadView<const T> out, const T* stats, const T* probs, HeadView<const T> dout, HeadView<T> dq,
                        HeadView<T> dk, HeadView<T> dv, const T* entropy, const T* dentropy) {
  if (p.sparse()) {
    sparse_backward(p, q, k, v, mask, out, stats, probs, dout, dq, dk, dv, entropy, dentropy);
    return;
  }
  const int64_t nb = block_rows(p.Lq, p.causal || p.flex), G = p.group();
  const bool need_ds = dq || dk;
  const T scale = static_cast<T>(p.scale);
  constexpr T kNegInf = -std::numeric_limits<T>::infinity();
  // Threads split the key/value heads (each query head when G = 1): the G query heads sharing one run in order on
  // one thread, so that a shared head's dK, dV sum their contributions in the same order for any thread count.
  parallel_for(0, p.B * (p.H / G), std::max<int64_t>(1, head_grain(p) / G), [&](int64_t g0, int64_t g1) {
    // Per-block scratch, block rows x Lk each: P, dP (then dS * scale), the dropped-out P, the dropout multipliers.
    const size_t blk = static_cast<size_t>(nb * p.Lk);
    const size_t n_ds = need_ds ? blk : 0, n_pd = p.dropout && dv ? blk : 0, n_mult = p.dropout ? blk : 0;
    // (P is zero past each row's visible keys, so dS = P * (...) is zero there too.)
    const size_t n_kt = probs ? 0 : HeadOperand<T>::packed_floats(p.dk, p.Lk);
    const size_t n_vt = need_ds ? HeadOperand<T>::packed_floats(p.dv, p.Lk) : 0;
    const size_t n_k = dq ? HeadOperand<T>::packed_floats(p.Lk, p.dk) : 0;
    Scratch& sc = scratch();
    sc.reserve({blk * sizeof(T), n_ds * sizeof(T), n_pd * sizeof(T), n_mult * sizeof(T), n_kt * sizeof(float),
                n_vt * sizeof(float), n_k * sizeof(float)});
    T* prob = sc.take<T>(blk);
    T* ds = sc.take<T>(n_ds);
    T* pd = n_pd ? sc.take<T>(n_pd) : nullptr;
    T* mult = sc.take<T>(n_mult);
    float* kt_buf = sc.take<float>(n_kt);
    float* vt_buf = sc.take<float>(n_vt);
    float* k_buf = sc.take<float>(n_k);
    for (int64_t bh = g0 * G; bh < g1 * G; ++bh) {
      const int64_t b = bh / p.H, h = bh % p.H, hk = h / G;
      const T* probs_bh = probs ? probs + bh * p.Lq * p.Lk : nullptr;  // the forward's blocks of P, in order
      const T* q_bh = q.head(b, h);                                    // (Lq, d_k)
      const T* k_bh = k.head(b, hk);                                   // (Lk, d_k), shared by G query heads
      const T* v_bh = v.head(b, hk);                                   // (Lk, d_v)
      const T* o_bh = out.head(b, h);                                  // (Lq, d_v)
      const T* do_bh = dout.head(b, h);                                // (Lq, d_v)
      const HeadOperand<T> kt(probs ? 0 : p.dk, p.Lk, operand(k_bh, k.sl, true), kt_buf);    // K^T (d_k, Lk)
      const HeadOperand<T> vt(need_ds ? p.dv : 0, p.Lk, operand(v_bh, v.sl, true), vt_buf);  // V^T (d_v, Lk)
      const HeadOperand<T> kk(dq ? p.Lk : 0, p.dk, operand(k_bh, k.sl), k_buf);              // K (Lk, d_k)
      for (int64_t i0 = 0; i0 < p.Lq; i0 += nb) {
        const int64_t n = std::min(nb, p.Lq - i0);
        const int64_t lk = visible_keys(p, b, h, i0, n);
        if (lk == 0) {
          if (dq) {
            T* dq_bh = dq.head(b, h);
            for (int64_t r = 0; r < n; ++r) std::fill(dq_bh + (i0 + r) * dq.sl, dq_bh + (i0 + r) * dq.sl + p.dk, T(0));
          }
          continue;
        }
        const T* dob = do_bh + i0 * dout.sl;  // dO block (n, d_v)
        // P = exp(S - m) / sum, recomputed exactly as in the forward; blocked rows and keys are zero. Pd = P * keep /
        // (1 - p), the dropped-out probabilities, replayed from the same hash (mult holds each row's multipliers).
        const T* pr = prob;  // (n, lk)
        if (probs_bh) {      // kept by the forward (blocked rows already zero)
          pr = probs_bh;
          probs_bh += n * lk;
        } else {
          block_scores(p, q_bh, q.sl, kt, mask, b, h, i0, n, lk, prob);
        }
        bool recomputed = false;
#if ATTOGRAD_AVX512
        if constexpr (std::is_same_v<T, float>) {
          if (p.one_pass_rows && p.Lk <= kRegisterKeys) {  // each row in one pass (the same bits as the loop below)
            backward_rows(p, stats, bh, b, h, i0, n, lk, probs ? pr : nullptr, prob, p.dropout ? mult : nullptr, pd);
            recomputed = true;
          }
        }
#endif
        for (int64_t r = 0; r < n && !recomputed; ++r) {
          T* row = prob + r * lk;
          const T m = stats[2 * (bh * p.Lq + i0 + r)];
          const T inv_sum = stats[2 * (bh * p.Lq + i0 + r) + 1];
          T* mrow = p.dropout ? mult + r * lk : nullptr;
          if (m == kNegInf) {
            if (!probs) std::fill(row, row + lk, T(0));
            if (mrow) std::fill(mrow, mrow + lk, T(0));
            if (pd) std::fill(pd + r * lk, pd + (r + 1) * lk, T(0));
            continue;
          }
          if (!probs) exp_shifted(row, lk, m, inv_sum);
          if (mrow) {
            dropout_row(p, b, h, i0 + r, lk, mrow);
            if (pd) {
              const T* prow = pr + r * lk;
              T* pdr = pd + r * lk;
              for (int64_t j = 0; j < lk; ++j) pdr[j] = prow[j] * mrow[j];
            }
          }
        }
        // dV += Pd^T dO  (O = Pd V).
        if (dv)
          detail::gemm(lk, p.dv, n, operand<T>(p.dropout ? pd : pr, lk, true), operand(dob, dout.sl), dv.head(b, hk),
                       dv.sl, true, T(1), false);
        if (!need_ds) continue;
        // dPd = dO V^T  (gradient of the dropped-out probabilities); dP = dPd * keep / (1 - p).
        vt.mul(n, lk, p.dv, operand(dob, dout.sl), ds, lk, false);
        for (int64_t r = 0; r < n; ++r) {
          // D_i = rowsum(dO_i * O_i) = sum_j P_ij dP_ij (since O_i = sum_j P_ij keep_ij/(1-p) V_j).
          const T d = dot(do_bh + (i0 + r) * dout.sl, o_bh + (i0 + r) * out.sl, p.dv);
          // dS = P * (dP - D_i)  (softmax backward), times scale for the S = scale * Q K^T below.
          const T* prow = pr + r * lk;
          T* drow = ds + r * lk;
          if (p.dropout) {
            const T* f = mult + r * lk;
            for (int64_t j = 0; j < lk; ++j) drow[j] = prow[j] * (drow[j] * f[j] - d) * scale;
          } else {
            for (int64_t j = 0; j < lk; ++j) drow[j] = prow[j] * (drow[j] - d) * scale;
          }
          // The entropy's gradient joins dS in the same pass (no second sweep over the scores).
          if (dentropy) {
            const int64_t row_i = bh * p.Lq + i0 + r;
            add_entropy_grad(prow, lk, entropy[row_i], dentropy[row_i], scale, drow);
          }
        }
        // dQ = dS K * scale  (scale already in ds).
        if (dq) kk.mul(n, p.dk, lk, operand<T>(ds, lk), dq.head(b, h) + i0 * dq.sl, dq.sl, false);
        // dK += dS^T Q * scale.
        if (dk)
          detail::gemm(lk, p.dk, n, operand<T>(ds, lk, true), operand(q_bh + i0 * q.sl, q.sl), dk.head(b, hk), dk.sl,
                       true, T(1), false);
      }
    }
  });
}

template void attention_forward<float>(const Plan&, HeadView<const float>, HeadView<const float>, HeadView<const float>,
                                       const void*, HeadView<float>, float*, float*, float*, float*);
template void attention_forward<double>(const Plan&, HeadView<const double>, HeadView<const double>,
                                        HeadView<const double>, const void*, HeadView<double>, double*, double*,
                                        double*, double*);
template void attention_backward<float>(const Plan&, HeadView<const float>, HeadView<const float>,
                                        HeadView<const float>, const void*, HeadView<const float>, const float*,
                                        const float*, HeadView<const float>, HeadView<float>, HeadView<float>,
                                        HeadView<float>, const float*, const float*);
template void attention_backward<double>(const Plan&, HeadView<const double>, HeadView<const double>,
                                         HeadView<const double>, const void*, HeadView<const double>, const double*,
                                         const double*, HeadView<const double>, HeadView<double>, HeadView<double>,
                                         HeadView<double>, const double*, const double*);

}  // namespace attograd::cpu::ATTOGRAD_CPU_ISA
