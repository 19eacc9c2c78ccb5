#include "autograd/attention.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <new>
#include <type_traits>
#include <vector>

#include "autograd/eigen_util.h"
#include "autograd/gemm.h"
#include "autograd/parallel.h"
#include "autograd/simd.h"

namespace attograd {

namespace {

constexpr const char* kOp = "scaled_dot_product_attention";
// Query rows per block: the scratch of a block is kBlockRows x Lk, never Lq x Lk. Causal attention uses blocks
// half as tall, so that its products skip more of the blocked upper triangle (a block sees only the keys up to its
// last row): measured faster for L = 32 ... 1024.
constexpr int64_t kBlockRows = 64;
constexpr int64_t kCausalBlockRows = 32;

inline int64_t block_rows(int64_t Lq, bool causal) { return std::min(causal ? kCausalBlockRows : kBlockRows, Lq); }

using detail::gemm;
using detail::GemmOperand;
using detail::operand;

template <class T>
using RowMap = Eigen::Map<Eigen::Array<T, 1, Eigen::Dynamic>>;

enum class MaskKind { None, Bool, Float };

// Everything the forward and the backward need to recompute a block of scores and its dropout mask.
struct Plan {
  int64_t B = 0, H = 0, Lq = 0, Lk = 0, dk = 0, dv = 0;
  double scale = 1.0;
  bool causal = false;
  MaskKind mask_kind = MaskKind::None;
  int64_t mb = 0, mh = 0, mi = 0, mj = 0;  // mask strides (elements) over (b, h, i, j); 0 where broadcast
  bool dropout = false;
  uint64_t seed = 0;        // drawn once per call from the generator
  uint64_t drop_below = 0;  // an element is dropped when its 32-bit hash is below this (= ceil(p * 2^32))
  double keep_scale = 1.0;  // 1 / (1 - p)
};

// Where the heads of a (B, H, L, d) operand live in a tensor's data: feature x of row l of head (b, h) is at
// data + off + b * sb + h * sh + l * sl + x. Contiguous (B, H, L, d) tensors and head-interleaved (B, L, H * d)
// ones (a linear projection's output, or one third of a packed q|k|v projection) are both such views.
struct Layout {
  int64_t off = 0, sb = 0, sh = 0, sl = 0;
};

template <class T>
struct HeadView {
  T* p = nullptr;
  int64_t sb = 0, sh = 0, sl = 0;
  T* head(int64_t b, int64_t h) const { return p + b * sb + h * sh; }
  explicit operator bool() const { return p != nullptr; }
};

template <class T>
HeadView<T> view_of(T* data, const Layout& l) {
  return {data + l.off, l.sb, l.sh, l.sl};
}

// (B, H, L, d) contiguous.
Layout bhld(int64_t H, int64_t L, int64_t d) { return {0, H * L * d, L * d, d}; }
// (B, L, H * d) with head h in features [h d, (h + 1) d), starting at feature `first` of rows of `row` features.
Layout blhd(int64_t L, int64_t d, int64_t row, int64_t first) { return {first, L * row, d, row}; }

// SplitMix64's finaliser (Steele, Lea, Flood 2014): a bijective 64-bit mix.
inline uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
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
  constexpr uint64_t kGamma64 = 0x9e3779b97f4a7c15ULL;
  constexpr uint32_t kGamma32 = 0x9e3779b9u;
  const uint64_t row = static_cast<uint64_t>((b * p.H + h) * p.Lq + i);
  const auto key = static_cast<uint32_t>(mix64(p.seed + (row + 1) * kGamma64) >> 32);
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
    if constexpr (std::is_same_v<T, float>)
      return detail::gemm_prepack_available() ? detail::packed_b_floats(kb, nb) : 0;
    return 0;
  }
  // Packs op(B) into buf (packed_floats(kb, nb) floats, 64-byte aligned) when the kernel takes packed operands.
  HeadOperand(int64_t kb_, int64_t nb_, GemmOperand<T> b, float* buf) : raw(b), kb(kb_), nb(nb_) {
    if constexpr (std::is_same_v<T, float>) {
      if (detail::gemm_prepack_available() && kb > 0 && nb > 0) {
        detail::pack_gemm_b(kb, nb, b, buf);
        packed = buf;
      }
    }
  }
  // C (m, n) (+)= alpha * op(A) (m, k) B[0:k, 0:n]; serial, the same bits either way.
  void mul(int64_t m, int64_t n, int64_t k, GemmOperand<T> a, T* c, int64_t ldc, bool acc, T alpha = T(1)) const {
    if constexpr (std::is_same_v<T, float>) {
      if (packed) {
        detail::gemm_packed(m, n, k, a, packed, kb, nb, c, ldc, acc, alpha);
        return;
      }
    }
    gemm(m, n, k, a, raw, c, ldc, acc, alpha, false);
  }
};

// s (n x lk) = scale * Q[i0:i0+n] K[0:lk]^T + mask, with -inf at blocked entries (bool mask, causal). The forward and
// the backward both call this, so they see bitwise the same scores.
template <class T>
void block_scores(const Plan& p, const T* q_bh, int64_t q_sl, const HeadOperand<T>& kt, const void* mask, int64_t b,
                  int64_t h, int64_t i0, int64_t n, int64_t lk, T* s) {
  kt.mul(n, lk, p.dk, operand(q_bh + i0 * q_sl, q_sl), s, lk, false, static_cast<T>(p.scale));
  constexpr T kNegInf = -std::numeric_limits<T>::infinity();
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

// The row's largest element (-inf for an empty or fully blocked row).
template <class T>
T row_max(const T* row, int64_t n) {
  return n == 0 ? -std::numeric_limits<T>::infinity()
                : Eigen::Map<const Eigen::Array<T, 1, Eigen::Dynamic>>(row, n).maxCoeff();
}

#if defined(__AVX512F__)
// float32: the same row kernels on whole AVX-512 vectors with a masked tail (Eigen's reductions cost more than the
// arithmetic on rows this short), exp being Eigen's own vectorised pexp.
template <>
inline __attribute__((always_inline)) float exp_shifted<float>(float* row, int64_t lk, float m, float scale) {
  using Eigen::internal::Packet16f;
  const __m512 vm = _mm512_set1_ps(m), tiny = _mm512_set1_ps(std::numeric_limits<float>::min());
  const __m512 ninf = _mm512_set1_ps(-std::numeric_limits<float>::infinity()), vscale = _mm512_set1_ps(scale);
  __m512 acc = _mm512_setzero_ps();
  for (int64_t j = 0; j < lk; j += 16) {
    const __mmask16 k = detail::first_lanes(lk - j);
    const __m512 x = _mm512_mask_loadu_ps(ninf, k, row + j);
    __m512 e = Eigen::internal::pexp<Packet16f>(_mm512_sub_ps(x, vm));
    e = _mm512_mul_ps(_mm512_maskz_mov_ps(_mm512_cmp_ps_mask(e, tiny, _CMP_GE_OQ), e), vscale);
    // A whole vector takes a plain store: AMD cores do not forward a masked store to the loads that read the row
    // right after (measured: a fifth of the attention backward was that stall).
    if (k == static_cast<__mmask16>(0xffff))
      _mm512_storeu_ps(row + j, e);
    else
      _mm512_mask_storeu_ps(row + j, k, e);
    acc = _mm512_add_ps(acc, e);
  }
  return _mm512_reduce_add_ps(acc);
}

// sum_x a[x] b[x]: one vector of partial sums, then a tree (the backward's D_i, once per row).
template <>
inline float dot<float>(const float* a, const float* b, int64_t n) {
  __m512 acc = _mm512_setzero_ps();
  for (int64_t x = 0; x < n; x += 16) {
    const __mmask16 k = detail::first_lanes(n - x);
    acc = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(k, a + x), _mm512_maskz_loadu_ps(k, b + x), acc);
  }
  return _mm512_reduce_add_ps(acc);
}

template <>
inline __attribute__((always_inline)) float row_max<float>(const float* row, int64_t n) {
  const __m512 ninf = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  __m512 acc = ninf;
  for (int64_t j = 0; j < n; j += 16) {
    const __mmask16 k = detail::first_lanes(n - j);
    acc = _mm512_max_ps(acc, _mm512_mask_loadu_ps(ninf, k, row + j));
  }
  return _mm512_reduce_max_ps(acc);
}
#endif

// Number of keys a block of query rows [i0, i0 + n) can see: causal blocks skip the keys past their last row.
inline int64_t visible_keys(const Plan& p, int64_t i0, int64_t n) { return p.causal ? std::min(p.Lk, i0 + n) : p.Lk; }

// Per-thread scratch, 64-byte aligned (so that the forward and the backward run Eigen's exp over identically
// aligned rows and get bitwise the same probabilities), grown on demand and kept: no allocation in steady state.
// take<U>(n) hands out consecutive 64-byte aligned buffers of n elements.
class Scratch {
 public:
  ~Scratch() { std::free(data_); }
  // Makes room for buffers of the given byte sizes and rewinds.
  void reserve(std::initializer_list<size_t> bytes) {
    size_t total = 0;
    for (size_t b : bytes) total += round(b);
    if (total > cap_) {
      std::free(data_);
      cap_ = std::max<size_t>(total, 64);
      data_ = static_cast<char*>(std::aligned_alloc(64, cap_));
      if (!data_) throw std::bad_alloc();
    }
    next_ = data_;
  }
  template <class U>
  U* take(size_t n) {
    U* p = reinterpret_cast<U*>(next_);
    next_ += round(n * sizeof(U));
    return p;
  }

 private:
  static size_t round(size_t b) { return (b + 63) / 64 * 64; }
  char* data_ = nullptr;
  char* next_ = nullptr;
  size_t cap_ = 0;
};

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

// Forward over all heads (split between threads). stats (B, H, Lq, 2) receives per row {max score m,
// 1 / sum exp(s - m)}, i.e. the logsumexp m + log(sum) kept in two parts so that huge scores lose no precision in
// float32, and so that the backward's exp(s - m) * inv_sum reproduces the forward's probabilities bitwise;
// m = -inf marks a fully blocked row. stats and weights (B, H, Lq, Lk) may be null; so may probs (B, H, Lq, Lk), which
// receives the probabilities before dropout (of each row's visible keys) for a backward that reads instead of
// recomputing them.
template <class T>
void attention_forward(const Plan& p, HeadView<const T> q, HeadView<const T> k, HeadView<const T> v, const void* mask,
                       HeadView<T> out, T* stats, T* weights, T* probs) {
  const int64_t nb = block_rows(p.Lq, p.causal);
  constexpr T kNegInf = -std::numeric_limits<T>::infinity();
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
      const T* k_bh = k.head(b, h);                              // (Lk, d_k)
      const T* v_bh = v.head(b, h);                              // (Lk, d_v)
      T* out_bh = out.head(b, h);                                // (Lq, d_v)
      const HeadOperand<T> kt(p.dk, p.Lk, operand(k_bh, k.sl, true), kt_buf);  // K^T (d_k, Lk)
      const HeadOperand<T> vv(p.Lk, p.dv, operand(v_bh, v.sl), v_buf);         // V (Lk, d_v)
      for (int64_t i0 = 0; i0 < p.Lq; i0 += nb) {
        const int64_t n = std::min(nb, p.Lq - i0);
        const int64_t lk = visible_keys(p, i0, n);
        T* w_blk = weights ? weights + (bh * p.Lq + i0) * p.Lk : nullptr;  // (n, Lk)
        if (lk == 0) {                                                     // no keys at all: every row is blocked
          for (int64_t r = 0; r < n; ++r)
            std::fill(out_bh + (i0 + r) * out.sl, out_bh + (i0 + r) * out.sl + p.dv, T(0));
          if (stats)
            for (int64_t r = 0; r < n; ++r) {
              stats[2 * (bh * p.Lq + i0 + r)] = kNegInf;
              stats[2 * (bh * p.Lq + i0 + r) + 1] = 0;
            }
          if (w_blk) std::fill(w_blk, w_blk + n * p.Lk, T(0));
          continue;
        }
        T* s = s_buf;  // (n, lk)
        block_scores(p, q_bh, q.sl, kt, mask, b, h, i0, n, lk, s);
        // P = softmax(S) row by row over the row's visible keys, with the max shifted out; then dropout,
        // P <- P * keep / (1 - p). First every row's exp and sum, then the scaling: the rows' reductions and
        // divisions overlap instead of each row waiting on its own.
        T row_m[kBlockRows], row_sum[kBlockRows];
        for (int64_t r = 0; r < n; ++r) {
          T* row = s + r * lk;
          const T m = row_max(row, lk);
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
                        HeadView<T> dk, HeadView<T> dv) {
  const int64_t nb = block_rows(p.Lq, p.causal);
  const bool need_ds = dq || dk;
  const T scale = static_cast<T>(p.scale);
  constexpr T kNegInf = -std::numeric_limits<T>::infinity();
  parallel_for(0, p.B * p.H, head_grain(p), [&](int64_t bh0, int64_t bh1) {
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
    for (int64_t bh = bh0; bh < bh1; ++bh) {
      const int64_t b = bh / p.H, h = bh % p.H;
      const T* probs_bh = probs ? probs + bh * p.Lq * p.Lk : nullptr;  // the forward's blocks of P, in order
      const T* q_bh = q.head(b, h);                                    // (Lq, d_k)
      const T* k_bh = k.head(b, h);                                    // (Lk, d_k)
      const T* v_bh = v.head(b, h);                                    // (Lk, d_v)
      const T* o_bh = out.head(b, h);                                  // (Lq, d_v)
      const T* do_bh = dout.head(b, h);                                // (Lq, d_v)
      const HeadOperand<T> kt(probs ? 0 : p.dk, p.Lk, operand(k_bh, k.sl, true), kt_buf);    // K^T (d_k, Lk)
      const HeadOperand<T> vt(need_ds ? p.dv : 0, p.Lk, operand(v_bh, v.sl, true), vt_buf);  // V^T (d_v, Lk)
      const HeadOperand<T> kk(dq ? p.Lk : 0, p.dk, operand(k_bh, k.sl), k_buf);              // K (Lk, d_k)
      for (int64_t i0 = 0; i0 < p.Lq; i0 += nb) {
        const int64_t n = std::min(nb, p.Lq - i0);
        const int64_t lk = visible_keys(p, i0, n);
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
        for (int64_t r = 0; r < n; ++r) {
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
          gemm(lk, p.dv, n, operand<T>(p.dropout ? pd : pr, lk, true), operand(dob, dout.sl), dv.head(b, h), dv.sl,
               true, T(1), false);
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
        }
        // dQ = dS K * scale  (scale already in ds).
        if (dq) kk.mul(n, p.dk, lk, operand<T>(ds, lk), dq.head(b, h) + i0 * dq.sl, dq.sl, false);
        // dK += dS^T Q * scale.
        if (dk)
          gemm(lk, p.dk, n, operand<T>(ds, lk, true), operand(q_bh + i0 * q.sl, q.sl), dk.head(b, h), dk.sl, true, T(1),
               false);
      }
    }
  });
}

// Validates the options and the mask against the scores `target` ((B, H, Lq, Lk) or (N, Lq, Lk): what the error
// messages show), and resolves the scale, the mask strides and the dropout seed into p (whose sizes are set).
void finish_plan(Plan& p, const Tensor& q, const Tensor& k, const Shape& target, const AttentionOptions& opts) {
  ATTO_CHECK(opts.dropout_p >= 0.0 && opts.dropout_p < 1.0, kOp, "dropout_p must be in [0, 1), got ", opts.dropout_p);
  ATTO_CHECK(std::isfinite(opts.scale), kOp, "scale must be finite (0 = 1/sqrt(d_k)), got ", opts.scale);
  p.scale = opts.scale != 0.0 ? opts.scale : (p.dk > 0 ? 1.0 / std::sqrt(static_cast<double>(p.dk)) : 1.0);
  p.causal = opts.is_causal;

  const Tensor& mask = opts.attn_mask;
  if (mask.defined()) {
    ATTO_CHECK(mask.dtype() == kBool || mask.dtype() == q.dtype(), kOp, "attn_mask must be bool or ",
               dtype_name(q.dtype()), " (q's dtype), got ", dtype_name(mask.dtype()), " attn_mask ", mask.shape());
    const Shape& ms = mask.shape();
    bool ok = ms.size() <= target.size();
    for (size_t k2 = 0; ok && k2 < ms.size(); ++k2) {
      int64_t md = ms[ms.size() - 1 - k2], td = target[target.size() - 1 - k2];
      ok = md == td || md == 1;
    }
    ATTO_CHECK(ok, kOp, "attn_mask of shape ", ms, " does not broadcast to the scores ", target,
               target.size() == 4 ? " (B, H, Lq, Lk)" : " (N, Lq, Lk)", " of q ", q.shape(), " and k ", k.shape());
    // Right-aligned strides of the mask over the target; 0 where the mask dimension is broadcast.
    std::vector<int64_t> st(target.size(), 0);
    int64_t s = 1;
    for (size_t k2 = 0; k2 < ms.size(); ++k2) {
      size_t mdim = ms.size() - 1 - k2, tdim = target.size() - 1 - k2;
      st[tdim] = ms[mdim] == 1 ? 0 : s;
      s *= ms[mdim];
    }
    if (target.size() == 4) {
      p.mb = st[0], p.mh = st[1], p.mi = st[2], p.mj = st[3];
    } else {
      p.mb = st[0], p.mh = 0, p.mi = st[1], p.mj = st[2];
    }
    p.mask_kind = mask.dtype() == kBool ? MaskKind::Bool : MaskKind::Float;
  }

  if (opts.dropout_p > 0.0) {
    p.dropout = true;
    Generator& gen = opts.generator ? *opts.generator : default_generator();
    p.seed = gen.next_u64();
    p.drop_below = static_cast<uint64_t>(std::ceil(opts.dropout_p * 0x1.0p32));
    p.keep_scale = 1.0 / (1.0 - opts.dropout_p);
  }
}

void check_float_inputs(const Tensor& q, const Tensor& k, const Tensor& v) {
  ATTO_CHECK(is_floating(q.dtype()), kOp, "q must be float32 or float64, got ", dtype_name(q.dtype()), " q ",
             q.shape());
  ATTO_CHECK(k.dtype() == q.dtype() && v.dtype() == q.dtype(), kOp, "dtype mismatch: q ", dtype_name(q.dtype()), " ",
             q.shape(), ", k ", dtype_name(k.dtype()), " ", k.shape(), ", v ", dtype_name(v.dtype()), " ", v.shape(),
             " (convert with .to())");
}

// Validates scaled_dot_product_attention's inputs (every user error names the op and the shapes).
Plan make_plan(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionOptions& opts) {
  ATTO_CHECK(q.defined() && k.defined() && v.defined(), kOp, "q, k and v must be defined tensors");
  const int64_t rank = q.dim();
  ATTO_CHECK((rank == 3 || rank == 4) && k.dim() == rank && v.dim() == rank, kOp,
             "q, k and v must all be 4-D (B, H, L, d) or all 3-D (N, L, d), got q ", q.shape(), ", k ", k.shape(),
             ", v ", v.shape());
  check_float_inputs(q, k, v);
  const Shape& qs = q.shape();
  const Shape& ks = k.shape();
  const Shape& vs = v.shape();
  for (int64_t d = 0; d < rank - 2; ++d)
    ATTO_CHECK(qs[d] == ks[d] && qs[d] == vs[d], kOp, "batch/head dimensions differ: q ", qs, ", k ", ks, ", v ", vs,
               " (dimension ", d, ": ", qs[d], ", ", ks[d], ", ", vs[d], ")");
  ATTO_CHECK(qs[rank - 1] == ks[rank - 1], kOp, "d_k mismatch: q ", qs, " has d_k = ", qs[rank - 1], " but k ", ks,
             " has d_k = ", ks[rank - 1]);
  ATTO_CHECK(ks[rank - 2] == vs[rank - 2], kOp, "Lk mismatch: k ", ks, " has ", ks[rank - 2], " keys but v ", vs,
             " has ", vs[rank - 2], " values");
  Plan p;
  p.B = qs[0];
  p.H = rank == 4 ? qs[1] : 1;
  p.Lq = qs[rank - 2];
  p.Lk = ks[rank - 2];
  p.dk = qs[rank - 1];
  p.dv = vs[rank - 1];
  finish_plan(p, q, k, rank == 4 ? Shape{p.B, p.H, p.Lq, p.Lk} : Shape{p.B, p.Lq, p.Lk}, opts);
  return p;
}

// Runs the attention of inputs[qi], inputs[ki], inputs[vi] (seen through the layouts lq, lk, lv), writes the output
// (out_shape, layout lo) and records the op on `inputs` (each gets its own gradient; q, k, v may be regions of
// one input).
AttentionResult run_attention(const Plan& plan, const std::vector<Tensor>& inputs, size_t qi, size_t ki, size_t vi,
                              Layout lq, Layout lk, Layout lv, const Shape& out_shape, Layout lo, const Shape& w_shape,
                              const AttentionOptions& opts) {
  const Tensor& mask = opts.attn_mask;
  const void* mask_data = mask.defined() ? mask.raw_data() : nullptr;
  const Dtype dt = inputs[0].dtype();
  Tensor out = empty(out_shape, {.dtype = dt});
  bool save = false;
  if (is_grad_enabled())
    for (const Tensor& t : inputs) save = save || t.requires_grad();
  Tensor stats = save ? empty({plan.B, plan.H, plan.Lq, 2}, {.dtype = dt}) : Tensor();
  // Short sequences keep their probabilities: the backward then skips recomputing Q K^T, the masks and the
  // exponentials, about a fifth of its work at L = 32 ... 64, for 16 KB per head at most.
  Tensor probs = save && plan.Lq * plan.Lk <= detail::attention_saved_probs_limit()
                     ? empty({plan.B, plan.H, plan.Lq, plan.Lk}, {.dtype = dt})
                     : Tensor();
  AttentionResult result;
  if (opts.need_weights) result.weights = empty(w_shape, {.dtype = dt});

  dispatch_float(dt, kOp, [&]<typename T>() {
    attention_forward<T>(plan, view_of<const T>(inputs[qi].data<T>(), lq), view_of<const T>(inputs[ki].data<T>(), lk),
                         view_of<const T>(inputs[vi].data<T>(), lv), mask_data, view_of<T>(out.data<T>(), lo),
                         save ? stats.data<T>() : nullptr, opts.need_weights ? result.weights.data<T>() : nullptr,
                         probs.defined() ? probs.data<T>() : nullptr);
  });

  if (!save) {
    result.output = out;
    return result;
  }
  std::vector<Tensor> saved;
  saved.reserve(inputs.size());
  for (const Tensor& t : inputs) saved.push_back(t.detach());
  Tensor md = mask.defined() ? mask.detach() : Tensor();
  Tensor od = out.detach();
  result.output =
      record(kOp, out, inputs,
             [plan, saved, md, od, stats, probs, qi, ki, vi, lq, lk, lv, lo](const Tensor& g, GradInputs& gi) {
               ATTO_CHECK(g.dtype() == od.dtype(), kOp, "gradient dtype ", dtype_name(g.dtype()),
                          " differs from the output's ", dtype_name(od.dtype()));
               std::vector<Tensor> grads(saved.size());
               for (size_t i = 0; i < saved.size(); ++i)
                 if (gi.needs(i)) grads[i] = zeros(saved[i].shape(), {.dtype = saved[i].dtype()});
               dispatch_float(od.dtype(), kOp, [&]<typename T>() {
                 auto grad_view = [&](size_t i, const Layout& l) {
                   return grads[i].defined() ? view_of<T>(grads[i].data<T>(), l) : HeadView<T>{};
                 };
                 attention_backward<T>(
                     plan, view_of<const T>(saved[qi].data<T>(), lq), view_of<const T>(saved[ki].data<T>(), lk),
                     view_of<const T>(saved[vi].data<T>(), lv), md.defined() ? md.raw_data() : nullptr,
                     view_of<const T>(od.data<T>(), lo), stats.data<T>(), probs.defined() ? probs.data<T>() : nullptr,
                     view_of<const T>(g.data<T>(), lo), grad_view(qi, lq), grad_view(ki, lk), grad_view(vi, lv));
               });
               for (size_t i = 0; i < saved.size(); ++i)
                 if (gi.needs(i)) gi[i] = grads[i];
             });
  return result;
}

}  // namespace

int64_t& detail::attention_saved_probs_limit() {
  static int64_t limit = 64 * 64;
  return limit;
}

AttentionResult scaled_dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v,
                                             const AttentionOptions& opts) {
  const Plan p = make_plan(q, k, v, opts);
  const bool three_d = q.dim() == 3;
  const int64_t H = three_d ? 1 : p.H;
  Shape out_shape = three_d ? Shape{p.B, p.Lq, p.dv} : Shape{p.B, p.H, p.Lq, p.dv};
  Shape w_shape = three_d ? Shape{p.B, p.Lq, p.Lk} : Shape{p.B, p.H, p.Lq, p.Lk};
  return run_attention(p, {q, k, v}, 0, 1, 2, bhld(H, p.Lq, p.dk), bhld(H, p.Lk, p.dk), bhld(H, p.Lk, p.dv), out_shape,
                       bhld(H, p.Lq, p.dv), w_shape, opts);
}

AttentionResult multi_head_attention(const Tensor& q, const Tensor& k, const Tensor& v, int64_t num_heads,
                                     const AttentionOptions& opts) {
  ATTO_CHECK(q.defined() && k.defined() && v.defined(), kOp, "q, k and v must be defined tensors");
  ATTO_CHECK(q.dim() == 3 && k.dim() == 3 && v.dim() == 3, kOp,
             "q, k and v must be 3-D (B, L, H * d) with the heads side by side in the last dimension, got q ",
             q.shape(), ", k ", k.shape(), ", v ", v.shape());
  check_float_inputs(q, k, v);
  const Shape& qs = q.shape();
  const Shape& ks = k.shape();
  const Shape& vs = v.shape();
  ATTO_CHECK(num_heads > 0, kOp, "num_heads must be positive, got ", num_heads);
  ATTO_CHECK(qs[2] % num_heads == 0 && vs[2] % num_heads == 0, kOp, "num_heads = ", num_heads,
             " must divide the features of q ", qs, " and v ", vs);
  ATTO_CHECK(qs[0] == ks[0] && qs[0] == vs[0], kOp, "batch sizes differ: q ", qs, ", k ", ks, ", v ", vs);
  ATTO_CHECK(qs[2] == ks[2], kOp, "d_k mismatch: q ", qs, " and k ", ks, " must have the same features");
  ATTO_CHECK(ks[1] == vs[1], kOp, "Lk mismatch: k ", ks, " has ", ks[1], " keys but v ", vs, " has ", vs[1], " values");
  Plan p;
  p.B = qs[0];
  p.H = num_heads;
  p.Lq = qs[1];
  p.Lk = ks[1];
  p.dk = qs[2] / num_heads;
  p.dv = vs[2] / num_heads;
  finish_plan(p, q, k, {p.B, p.H, p.Lq, p.Lk}, opts);
  return run_attention(p, {q, k, v}, 0, 1, 2, blhd(p.Lq, p.dk, qs[2], 0), blhd(p.Lk, p.dk, ks[2], 0),
                       blhd(p.Lk, p.dv, vs[2], 0), {p.B, p.Lq, vs[2]}, blhd(p.Lq, p.dv, vs[2], 0),
                       {p.B, p.H, p.Lq, p.Lk}, opts);
}

AttentionResult packed_self_attention(const Tensor& qkv, int64_t num_heads, const AttentionOptions& opts) {
  ATTO_CHECK(qkv.defined(), kOp, "qkv must be a defined tensor");
  ATTO_CHECK(qkv.dim() == 3 && qkv.shape()[2] % 3 == 0, kOp,
             "qkv must be 3-D (B, L, 3 * E) holding [q | k | v] in its last dimension, got ", qkv.shape());
  ATTO_CHECK(is_floating(qkv.dtype()), kOp, "qkv must be float32 or float64, got ", dtype_name(qkv.dtype()), " qkv ",
             qkv.shape());
  const int64_t E = qkv.shape()[2] / 3;
  ATTO_CHECK(num_heads > 0 && E % num_heads == 0, kOp, "num_heads = ", num_heads,
             " must be positive and divide E = ", E, " of qkv ", qkv.shape());
  Plan p;
  p.B = qkv.shape()[0];
  p.H = num_heads;
  p.Lq = p.Lk = qkv.shape()[1];
  p.dk = p.dv = E / num_heads;
  finish_plan(p, qkv, qkv, {p.B, p.H, p.Lq, p.Lk}, opts);
  const int64_t row = 3 * E;
  return run_attention(p, {qkv}, 0, 0, 0, blhd(p.Lq, p.dk, row, 0), blhd(p.Lk, p.dk, row, E),
                       blhd(p.Lk, p.dv, row, 2 * E), {p.B, p.Lq, E}, blhd(p.Lq, p.dv, E, 0), {p.B, p.H, p.Lq, p.Lk},
                       opts);
}

}  // namespace attograd
