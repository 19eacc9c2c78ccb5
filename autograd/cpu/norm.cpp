// Normalisation kernels (autograd/norm.cpp has the ops): the row reductions softmax, log_softmax and cross-entropy
// share, softmax along any dim, and LayerNorm's forward and backward. Written as plain loops that GCC vectorises at
// -O3 (checked with -fopt-info-vec): no std::function, no per-element branches that cannot become selects,
// reductions split over independent lanes so that no -ffast-math reassociation is needed; float32 LayerNorm has
// AVX-512 row kernels in the avx512 set.

#include <algorithm>
#include <cmath>
#include <limits>
#include <type_traits>

#include "autograd/cpu/kernels.h"
#include "autograd/cpu/math.h"
#include "autograd/cpu/rows.h"
#include "autograd/cpu/scratch.h"
#include "autograd/cpu/simd.h"
#include "autograd/parallel.h"

namespace attograd::cpu::ATTOGRAD_CPU_ISA {

using detail::exp_le0;

namespace {

constexpr int kLanes = 8;  // independent double accumulators (one 512-bit register)

// sum_{i<n} f(i) over kLanes independent double accumulators, folded pairwise.
template <class F>
inline double lane_sum(int64_t n, F f) {
  double acc[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (int k = 0; k < kLanes; ++k) acc[k] += f(i + k);
  for (int k = 0; k < kLanes && i + k < n; ++k) acc[k] += f(i + k);
  for (int w = kLanes / 2; w > 0; w /= 2)
    for (int k = 0; k < w; ++k) acc[k] += acc[k + w];
  return acc[0];
}

// Per-thread scratch of the softmax kernels along a dim other than the last.
Scratch& scratch() {
  thread_local Scratch s;
  return s;
}

}  // namespace

template <class T>
T row_max(const T* x, int64_t n) {
  return max_in_row(x, n);
}

template <class T>
double row_sum(const T* x, int64_t n) {
  return lane_sum(n, [x](int64_t i) { return static_cast<double>(x[i]); });
}

template <class T>
double exp_shifted_sum(const T* x, T shift, T* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = exp_le0(x[i] - shift);
  return row_sum(out, n);
}

template <class T>
double sum_exp_shifted(const T* x, T shift, int64_t n) {
  // In blocks through a stack buffer: GCC vectorises exp and the double sum as separate loops only.
  constexpr int64_t B = 256;
  T buf[B];
  double s = 0;
  for (int64_t i = 0; i < n; i += B) s += exp_shifted_sum(x + i, shift, buf, std::min(B, n - i));
  return s;
}

namespace {

// ---------------------------------------------------------------------------------------------
// LayerNorm over `rows` rows of N contiguous elements.

// One row of y = (x - mean) * rstd * w + b from its double mean and rstd. The forward and the recompute (for
// consumers that saved the recipe, see SavedTensor) both call this, so the two give the same bits. The row kernels
// are never inlined: GCC may fuse a multiply and an add differently in each copy of an inlined body (the serial and
// the parallel call sites), and one compiled body gives the same bits at every call site and thread count.
template <class T>
__attribute__((noinline)) void layer_norm_apply_row(const T* xr, const T* w, const T* b, T* yr, double mean,
                                                    double rstd, int64_t N) {
  // The mean as a float pair m + ml: x - m is exact near the mean, so xhat keeps the double mean's
  // accuracy (a lone float mean would shift every row by up to half an ulp of the mean).
  const T m = static_cast<T>(mean), ml = static_cast<T>(mean - static_cast<double>(m)), rs = static_cast<T>(rstd);
  if (w && b) {
    for (int64_t i = 0; i < N; ++i) yr[i] = ((xr[i] - m) - ml) * rs * w[i] + b[i];
  } else if (w) {
    for (int64_t i = 0; i < N; ++i) yr[i] = ((xr[i] - m) - ml) * rs * w[i];
  } else if (b) {
    for (int64_t i = 0; i < N; ++i) yr[i] = ((xr[i] - m) - ml) * rs + b[i];
  } else {
    for (int64_t i = 0; i < N; ++i) yr[i] = ((xr[i] - m) - ml) * rs;
  }
}

#if ATTOGRAD_AVX512
// The 16 float lanes of v as two vectors of 8 doubles (lanes 0-7, lanes 8-15).
inline void to_doubles(__m512 v, __m512d& lo, __m512d& hi) {
  lo = _mm512_cvtps_pd(_mm512_castps512_ps256(v));
  hi = _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)));
}

// The sum of v's 16 float lanes, added in double (as the generic code folds its float lanes into a double).
inline double lanes_sum_in_double(__m512 v) {
  __m512d lo, hi;
  to_doubles(v, lo, hi);
  return _mm512_reduce_add_pd(_mm512_add_pd(lo, hi));
}

// Sum of a float32 row in double, on whole vectors (lanes past N read as 0).
inline double row_sum_f32(const float* x, int64_t N) {
  __m512d s0 = _mm512_setzero_pd(), s1 = _mm512_setzero_pd();
  for (int64_t i = 0; i < N; i += 16) {
    __m512d lo, hi;
    to_doubles(_mm512_maskz_loadu_ps(first_lanes(N - i), x + i), lo, hi);
    s0 = _mm512_add_pd(s0, lo);
    s1 = _mm512_add_pd(s1, hi);
  }
  return _mm512_reduce_add_pd(_mm512_add_pd(s0, s1));
}

// sum (x - mean)^2 over a float32 row, in double.
inline double row_sq_dev_f32(const float* x, int64_t N, double mean) {
  const __m512d vm = _mm512_set1_pd(mean);
  __m512d v0 = _mm512_setzero_pd(), v1 = _mm512_setzero_pd();
  for (int64_t i = 0; i < N; i += 16) {
    const __mmask16 k = first_lanes(N - i);
    __m512d lo, hi;
    to_doubles(_mm512_maskz_loadu_ps(k, x + i), lo, hi);
    const __m512d d0 = _mm512_maskz_sub_pd(static_cast<__mmask8>(k), lo, vm);
    const __m512d d1 = _mm512_maskz_sub_pd(static_cast<__mmask8>(k >> 8), hi, vm);
    v0 = _mm512_fmadd_pd(d0, d0, v0);
    v1 = _mm512_fmadd_pd(d1, d1, v1);
  }
  return _mm512_reduce_add_pd(_mm512_add_pd(v0, v1));
}
#endif

}  // namespace

// y = (x - mean) * rstd * w + b, with mean and the biased variance accumulated in double over two
// passes (never E[x^2] - E[x]^2). Writes mean and rstd per row when `mean_out` is non-null.
template <class T>
void layer_norm_forward(const T* x, const T* w, const T* b, T* y, double* mean_out, double* rstd_out, int64_t rows,
                        int64_t N, double eps) {
  if (N == 0) return;
#if ATTOGRAD_AVX512
  if constexpr (std::is_same_v<T, float>) {
    // Eight rows at a time: their sums on whole vectors, then the eight divisions and square roots as one vector
    // each (correctly rounded, so the same bits as one row at a time; a lone row waits on its divider chain).
    constexpr int G = 8;
    const __m512d vn = _mm512_set1_pd(static_cast<double>(N)), veps = _mm512_set1_pd(eps), one = _mm512_set1_pd(1.0);
    // Groups of rows in parallel (each row's result is independent of the split).
    parallel_for(0, (rows + G - 1) / G, std::max<int64_t>(1, (int64_t{1} << 15) / (G * N)),
                 [&](int64_t g0, int64_t g1) {
                   alignas(64) double acc[G], mean[G], rstd[G];
                   for (int64_t r0 = g0 * G; r0 < std::min(rows, g1 * G); r0 += G) {
                     const int g = static_cast<int>(std::min<int64_t>(G, rows - r0));
                     for (int q = 0; q < G; ++q) acc[q] = q < g ? row_sum_f32(x + (r0 + q) * N, N) : 0.0;
                     _mm512_store_pd(mean, _mm512_div_pd(_mm512_load_pd(acc), vn));
                     for (int q = 0; q < G; ++q) acc[q] = q < g ? row_sq_dev_f32(x + (r0 + q) * N, N, mean[q]) : 0.0;
                     const __m512d var = _mm512_div_pd(_mm512_load_pd(acc), vn);
                     _mm512_store_pd(rstd, _mm512_div_pd(one, _mm512_sqrt_pd(_mm512_add_pd(var, veps))));
                     for (int q = 0; q < g; ++q) {
                       if (mean_out) {
                         mean_out[r0 + q] = mean[q];
                         rstd_out[r0 + q] = rstd[q];
                       }
                       layer_norm_apply_row(x + (r0 + q) * N, w, b, y + (r0 + q) * N, mean[q], rstd[q], N);
                     }
                   }
                 });
    return;
  }
#endif
  for (int64_t r = 0; r < rows; ++r) {
    const T* xr = x + r * N;
    const double mean = row_sum(xr, N) / static_cast<double>(N);
    const double var = lane_sum(N,
                                [&](int64_t i) {
                                  const double d = static_cast<double>(xr[i]) - mean;
                                  return d * d;
                                }) /
                       static_cast<double>(N);
    const double rstd = 1.0 / std::sqrt(var + eps);
    if (mean_out) {
      mean_out[r] = mean;
      rstd_out[r] = rstd;
    }
    layer_norm_apply_row(xr, w, b, y + r * N, mean, rstd, N);
  }
}

// The forward's y again from the saved per-row mean and rstd (no statistics pass).
template <class T>
void layer_norm_recompute(const T* x, const T* w, const T* b, T* y, const double* mean, const double* rstd,
                          int64_t rows, int64_t N) {
  parallel_for(0, rows, std::max<int64_t>(1, (int64_t{1} << 15) / std::max<int64_t>(N, 1)),
               [&](int64_t r0, int64_t r1) {
                 for (int64_t r = r0; r < r1; ++r)
                   layer_norm_apply_row(x + r * N, w, b, y + r * N, mean[r], rstd[r], N);
               });
}

namespace {

#if ATTOGRAD_AVX512
// One float32 row of layer_norm_backward below on whole vectors (masked tail): the dbias/dweight terms and the two
// row sums in one pass (sums of 16 float lanes, folded in double), then dx. dx may be g itself.
template <bool HasW>
__attribute__((noinline)) void backward_row_f32(const float* xr, const float* w, const float* gr, float m, float ml,
                                                float rs, double invN, float* dr, float* dwb, float* dbb, int64_t N) {
  const __m512 vm = _mm512_set1_ps(m), vml = _mm512_set1_ps(ml), vrs = _mm512_set1_ps(rs);
  __m512 s_dn = _mm512_setzero_ps(), s_dnx = _mm512_setzero_ps();
  for (int64_t i = 0; i < N; i += 16) {
    const __mmask16 k = first_lanes(N - i);
    const __m512 g = _mm512_maskz_loadu_ps(k, gr + i);  // 0 past N: adds nothing below
    const __m512 xh = _mm512_mul_ps(_mm512_sub_ps(_mm512_sub_ps(_mm512_maskz_loadu_ps(k, xr + i), vm), vml), vrs);
    // The next row loads these right back.
    if (dbb) store_first_lanes(dbb + i, k, _mm512_add_ps(_mm512_maskz_loadu_ps(k, dbb + i), g));
    if (dwb) store_first_lanes(dwb + i, k, _mm512_fmadd_ps(g, xh, _mm512_maskz_loadu_ps(k, dwb + i)));
    if (dr) {
      const __m512 dn = HasW ? _mm512_mul_ps(g, _mm512_maskz_loadu_ps(k, w + i)) : g;
      s_dn = _mm512_add_ps(s_dn, dn);
      s_dnx = _mm512_fmadd_ps(dn, xh, s_dnx);
    }
  }
  if (!dr) return;
  const __m512 mean_dn = _mm512_set1_ps(static_cast<float>(lanes_sum_in_double(s_dn) * invN));
  const __m512 mean_dnx = _mm512_set1_ps(static_cast<float>(lanes_sum_in_double(s_dnx) * invN));
  for (int64_t i = 0; i < N; i += 16) {
    const __mmask16 k = first_lanes(N - i);
    const __m512 g = _mm512_maskz_loadu_ps(k, gr + i);
    const __m512 dn = HasW ? _mm512_mul_ps(g, _mm512_maskz_loadu_ps(k, w + i)) : g;
    const __m512 xh = _mm512_mul_ps(_mm512_sub_ps(_mm512_sub_ps(_mm512_maskz_loadu_ps(k, xr + i), vm), vml), vrs);
    const __m512 d = _mm512_mul_ps(vrs, _mm512_sub_ps(_mm512_sub_ps(dn, mean_dn), _mm512_mul_ps(xh, mean_dnx)));
    store_first_lanes(dr + i, k, d);
  }
}
#endif

// One row of layer_norm_backward below (any T): the dbias/dweight terms, the two row sums over kAccLanes independent
// accumulators (so the loop vectorises), then dx. dr may be gr itself.
template <class T, bool HasW>
__attribute__((noinline)) void backward_row(const T* xr, const T* w, const T* gr, T m, T ml, T rs, double invN, T* dr,
                                            T* dwb, T* dbb, int64_t N) {
  constexpr int kAccLanes = 64 / sizeof(T);  // one 512-bit register of T
  if (dbb)
    for (int64_t i = 0; i < N; ++i) dbb[i] += gr[i];
  if (dwb)
    for (int64_t i = 0; i < N; ++i) dwb[i] += gr[i] * (((xr[i] - m) - ml) * rs);
  if (!dr) return;
  T s_dn[kAccLanes] = {}, s_dnx[kAccLanes] = {};
  int64_t i = 0;
  for (; i + kAccLanes <= N; i += kAccLanes)
    for (int k = 0; k < kAccLanes; ++k) {
      const T dn = HasW ? gr[i + k] * w[i + k] : gr[i + k];
      s_dn[k] += dn;
      s_dnx[k] += dn * (((xr[i + k] - m) - ml) * rs);
    }
  for (int k = 0; i + k < N; ++k) {
    const T dn = HasW ? gr[i + k] * w[i + k] : gr[i + k];
    s_dn[k] += dn;
    s_dnx[k] += dn * (((xr[i + k] - m) - ml) * rs);
  }
  double sum_dn = 0, sum_dnx = 0;
  for (int k = 0; k < kAccLanes; ++k) sum_dn += static_cast<double>(s_dn[k]), sum_dnx += static_cast<double>(s_dnx[k]);
  const T mean_dn = static_cast<T>(sum_dn * invN), mean_dnx = static_cast<T>(sum_dnx * invN);
  for (int64_t j = 0; j < N; ++j) {
    const T dn = HasW ? gr[j] * w[j] : gr[j];
    const T xh = ((xr[j] - m) - ml) * rs;
    dr[j] = rs * (dn - mean_dn - xh * mean_dnx);
  }
}

// Backward of layer_norm (llm.c's layernorm_backward), xhat = (x - mean) * rstd recomputed per row:
//   dbias_i   += g_i                 (bias is added to every row)
//   dweight_i += g_i * xhat_i        (weight scales xhat)
//   dnorm_i    = g_i * w_i           (gradient reaching xhat)
//   dx_i       = rstd * (dnorm_i - mean(dnorm) - xhat_i * mean(dnorm * xhat))   (through mean and rstd)
// Two passes per row (backward_row, backward_row_f32): one for the two row sums and the dweight/dbias terms, one for
// dx. dx, dw, db may each be null when not needed.
template <class T, bool HasW>
void layer_norm_backward_impl(const T* x, const T* w, const T* g, const double* mean, const double* rstd, T* dx,
                              double* dw, double* db, int64_t rows, int64_t N, T* dw_part, T* db_part) {
  if (N == 0 || rows == 0) return;
  const double invN = 1.0 / static_cast<double>(N);
  // Blocks of kLayerNormBlockRows rows run in parallel: each gathers its dweight/dbias terms in T (dw_part, db_part:
  // zeroed by the caller), and the blocks are then added into the double accumulators in block order, the same sums
  // in the same order whatever the threads.
  constexpr int64_t kBlockRows = kLayerNormBlockRows;
  const int64_t blocks = (rows + kBlockRows - 1) / kBlockRows;
  const int64_t grain = std::max<int64_t>(1, (int64_t{1} << 15) / (kBlockRows * N));
  parallel_for(0, blocks, grain, [&](int64_t b0, int64_t b1) {
    for (int64_t blk = b0; blk < b1; ++blk) {
      T* dwb = dw ? dw_part + blk * N : nullptr;
      T* dbb = db ? db_part + blk * N : nullptr;
      for (int64_t r = blk * kBlockRows; r < std::min(rows, (blk + 1) * kBlockRows); ++r) {
        const T* xr = x + r * N;
        const T* gr = g + r * N;
        const T m = static_cast<T>(mean[r]), ml = static_cast<T>(mean[r] - static_cast<double>(m));  // as in forward
        const T rs = static_cast<T>(rstd[r]);
#if ATTOGRAD_AVX512
        if constexpr (std::is_same_v<T, float>) {
          backward_row_f32<HasW>(xr, w, gr, m, ml, rs, invN, dx ? dx + r * N : nullptr, dwb, dbb, N);
          continue;
        }
#endif
        backward_row<T, HasW>(xr, w, gr, m, ml, rs, invN, dx ? dx + r * N : nullptr, dwb, dbb, N);
      }
    }
  });
  for (int64_t blk = 0; blk < blocks; ++blk) {
    if (dw)
      for (int64_t i = 0; i < N; ++i) dw[i] += static_cast<double>(dw_part[blk * N + i]);
    if (db)
      for (int64_t i = 0; i < N; ++i) db[i] += static_cast<double>(db_part[blk * N + i]);
  }
}

}  // namespace

template <class T>
void layer_norm_backward(const T* x, const T* w, const T* g, const double* mean, const double* rstd, T* dx, double* dw,
                         double* db, int64_t rows, int64_t N, T* dw_part, T* db_part) {
  if (w)
    layer_norm_backward_impl<T, true>(x, w, g, mean, rstd, dx, dw, db, rows, N, dw_part, db_part);
  else
    layer_norm_backward_impl<T, false>(x, w, g, mean, rstd, dx, dw, db, rows, N, dw_part, db_part);
}

// ---------------------------------------------------------------------------------------------
// Softmax along one dim of x viewed as (outer, n, inner).

// Forward of softmax (Log = false) and log_softmax (Log = true). The shift is the slice max, or 0
// for an all -inf slice, so that x - shift is never -inf - -inf; such a slice then has sum 0 and
// gives y = 0 (softmax) or y = x - 0 = -inf (log_softmax).
template <class T, bool Log>
void softmax_forward(const T* x, T* y, Slices s) {
  const T ninf = -std::numeric_limits<T>::infinity();
  if (s.inner == 1) {  // the last dim: contiguous rows
    for (int64_t o = 0; o < s.outer; ++o) {
      const T* xr = x + o * s.n;
      T* yr = y + o * s.n;
      const T m = max_in_row(xr, s.n);
      const T shift = m == ninf ? T(0) : m;
      if constexpr (Log) {
        const double sum = sum_exp_shifted(xr, shift, s.n);
        const T lse = sum > 0 ? static_cast<T>(shift + std::log(sum)) : T(0);
        for (int64_t i = 0; i < s.n; ++i) yr[i] = xr[i] - lse;
      } else {
        const double sum = exp_shifted_sum(xr, shift, yr, s.n);
        const T inv = sum > 0 ? static_cast<T>(1.0 / sum) : T(0);
        for (int64_t i = 0; i < s.n; ++i) yr[i] *= inv;
      }
    }
    return;
  }
  // Any other dim: loop over the reduced dim outside, over the contiguous inner positions inside.
  const size_t inner = static_cast<size_t>(s.inner);
  Scratch& sc = scratch();
  sc.reserve({inner * sizeof(T), Log ? inner * sizeof(T) : 0, inner * sizeof(double)});
  T* sh = sc.take<T>(inner);
  T* tmp = sc.take<T>(Log ? inner : 0);
  double* sm = sc.take<double>(inner);
  for (int64_t o = 0; o < s.outer; ++o) {
    const T* xo = x + o * s.n * s.inner;
    T* yo = y + o * s.n * s.inner;
    for (int64_t j = 0; j < s.inner; ++j) sh[j] = ninf;
    for (int64_t c = 0; c < s.n; ++c) {
      const T* xc = xo + c * s.inner;
      for (int64_t j = 0; j < s.inner; ++j) sh[j] = xc[j] > sh[j] ? xc[j] : sh[j];
    }
    for (int64_t j = 0; j < s.inner; ++j) {
      sh[j] = sh[j] == ninf ? T(0) : sh[j];
      sm[j] = 0;
    }
    for (int64_t c = 0; c < s.n; ++c) {
      const T* xc = xo + c * s.inner;
      T* e = Log ? tmp : yo + c * s.inner;  // exp and the double sum in separate loops (vectorised)
      for (int64_t j = 0; j < s.inner; ++j) e[j] = exp_le0(xc[j] - sh[j]);
      for (int64_t j = 0; j < s.inner; ++j) sm[j] += static_cast<double>(e[j]);
    }
    if constexpr (Log) {
      for (int64_t j = 0; j < s.inner; ++j) sh[j] = sm[j] > 0 ? static_cast<T>(sh[j] + std::log(sm[j])) : T(0);
      for (int64_t c = 0; c < s.n; ++c) {
        const T* xc = xo + c * s.inner;
        T* yc = yo + c * s.inner;
        for (int64_t j = 0; j < s.inner; ++j) yc[j] = xc[j] - sh[j];
      }
    } else {
      for (int64_t j = 0; j < s.inner; ++j) sh[j] = sm[j] > 0 ? static_cast<T>(1.0 / sm[j]) : T(0);
      for (int64_t c = 0; c < s.n; ++c) {
        T* yc = yo + c * s.inner;
        for (int64_t j = 0; j < s.inner; ++j) yc[j] *= sh[j];
      }
    }
  }
}

// Backward of softmax: dx = y * (g - sum(g * y)). A zero slice (all -inf input) gets dx = 0.
template <class T>
void softmax_backward(const T* y, const T* g, T* dx, Slices s) {
  if (s.inner == 1) {
    for (int64_t o = 0; o < s.outer; ++o) {
      const T* yr = y + o * s.n;
      const T* gr = g + o * s.n;
      T* dr = dx + o * s.n;
      const T dot = static_cast<T>(
          lane_sum(s.n, [&](int64_t i) { return static_cast<double>(gr[i]) * static_cast<double>(yr[i]); }));
      for (int64_t i = 0; i < s.n; ++i) dr[i] = yr[i] * (gr[i] - dot);
    }
    return;
  }
  const size_t inner = static_cast<size_t>(s.inner);
  Scratch& sc = scratch();
  sc.reserve({inner * sizeof(double), inner * sizeof(T)});
  double* dp = sc.take<double>(inner);
  T* dt = sc.take<T>(inner);
  for (int64_t o = 0; o < s.outer; ++o) {
    const T* yo = y + o * s.n * s.inner;
    const T* go = g + o * s.n * s.inner;
    T* dxo = dx + o * s.n * s.inner;
    for (int64_t j = 0; j < s.inner; ++j) dp[j] = 0;
    for (int64_t c = 0; c < s.n; ++c) {
      const T* yc = yo + c * s.inner;
      const T* gc = go + c * s.inner;
      for (int64_t j = 0; j < s.inner; ++j) dp[j] += static_cast<double>(gc[j]) * static_cast<double>(yc[j]);
    }
    for (int64_t j = 0; j < s.inner; ++j) dt[j] = static_cast<T>(dp[j]);
    for (int64_t c = 0; c < s.n; ++c) {
      const T* yc = yo + c * s.inner;
      const T* gc = go + c * s.inner;
      T* dc = dxo + c * s.inner;
      for (int64_t j = 0; j < s.inner; ++j) dc[j] = yc[j] * (gc[j] - dt[j]);
    }
  }
}

// Backward of log_softmax: dx = g - exp(y) * sum(g). A slice whose outputs are all -inf (all -inf
// input) gets dx = 0 by definition.
template <class T>
void log_softmax_backward(const T* y, const T* g, T* dx, Slices s) {
  const T ninf = -std::numeric_limits<T>::infinity();
  if (s.inner == 1) {
    for (int64_t o = 0; o < s.outer; ++o) {
      const T* yr = y + o * s.n;
      const T* gr = g + o * s.n;
      T* dr = dx + o * s.n;
      if (max_in_row(yr, s.n) == ninf) {
        std::fill(dr, dr + s.n, T(0));
        continue;
      }
      const T sg = static_cast<T>(row_sum(gr, s.n));
      for (int64_t i = 0; i < s.n; ++i) dr[i] = gr[i] - exp_le0(yr[i]) * sg;
    }
    return;
  }
  const size_t inner = static_cast<size_t>(s.inner);
  Scratch& sc = scratch();
  sc.reserve({inner * sizeof(T), inner * sizeof(double), inner * sizeof(T)});
  T* ym = sc.take<T>(inner);
  double* sm = sc.take<double>(inner);
  T* st = sc.take<T>(inner);
  for (int64_t o = 0; o < s.outer; ++o) {
    const T* yo = y + o * s.n * s.inner;
    const T* go = g + o * s.n * s.inner;
    T* dxo = dx + o * s.n * s.inner;
    for (int64_t j = 0; j < s.inner; ++j) {
      ym[j] = ninf;
      sm[j] = 0;
    }
    for (int64_t c = 0; c < s.n; ++c) {
      const T* yc = yo + c * s.inner;
      const T* gc = go + c * s.inner;
      for (int64_t j = 0; j < s.inner; ++j) {
        ym[j] = yc[j] > ym[j] ? yc[j] : ym[j];
        sm[j] += static_cast<double>(gc[j]);
      }
    }
    for (int64_t j = 0; j < s.inner; ++j) st[j] = static_cast<T>(sm[j]);
    for (int64_t c = 0; c < s.n; ++c) {
      const T* yc = yo + c * s.inner;
      const T* gc = go + c * s.inner;
      T* dc = dxo + c * s.inner;
      for (int64_t j = 0; j < s.inner; ++j) {
        const T v = gc[j] - exp_le0(yc[j]) * st[j];
        dc[j] = ym[j] == ninf ? T(0) : v;
      }
    }
  }
}

#define ATTOGRAD_INSTANTIATE(T)                                                                                      \
  template T row_max<T>(const T*, int64_t);                                                                          \
  template double row_sum<T>(const T*, int64_t);                                                                     \
  template double exp_shifted_sum<T>(const T*, T, T*, int64_t);                                                      \
  template double sum_exp_shifted<T>(const T*, T, int64_t);                                                          \
  template void softmax_forward<T, false>(const T*, T*, Slices);                                                     \
  template void softmax_forward<T, true>(const T*, T*, Slices);                                                      \
  template void softmax_backward<T>(const T*, const T*, T*, Slices);                                                 \
  template void log_softmax_backward<T>(const T*, const T*, T*, Slices);                                             \
  template void layer_norm_forward<T>(const T*, const T*, const T*, T*, double*, double*, int64_t, int64_t, double); \
  template void layer_norm_recompute<T>(const T*, const T*, const T*, T*, const double*, const double*, int64_t,     \
                                        int64_t);                                                                    \
  template void layer_norm_backward<T>(const T*, const T*, const T*, const double*, const double*, T*, double*,      \
                                       double*, int64_t, int64_t, T*, T*);
ATTOGRAD_INSTANTIATE(float)
ATTOGRAD_INSTANTIATE(double)
#undef ATTOGRAD_INSTANTIATE

}  // namespace attograd::cpu::ATTOGRAD_CPU_ISA
