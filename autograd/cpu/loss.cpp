// Loss kernels (autograd/loss.cpp has the ops): cross-entropy's forward (per-position loss and log-sum-exp) and
// backward over logits viewed as (N, C, inner), with label smoothing and ignored positions.

#include <algorithm>
#include <cmath>
#include <limits>

#include "autograd/cpu/kernels.h"
#include "autograd/cpu/math.h"
#include "autograd/cpu/rows.h"
#include "autograd/cpu/scratch.h"

namespace attograd::cpu::ATTOGRAD_CPU_ISA {

using detail::exp_le0;

namespace {

// Per-thread scratch of the kernels along a dim other than the last.
Scratch& scratch() {
  thread_local Scratch s;
  return s;
}

}  // namespace

// Forward of cross_entropy: writes the per-position loss (0 where ignored) and, when lse is non-null,
// the log-sum-exp of every position (0 where ignored). Returns the sum of the losses, in double.
template <class T>
double cross_entropy_forward(const T* x, const int64_t* t, Slices L, double label_smoothing, int64_t ignore_index,
                             T* loss, T* lse_out) {
  const double s = label_smoothing;
  const double invC = L.n > 0 ? 1.0 / static_cast<double>(L.n) : 0.0;
  const T ninf = -std::numeric_limits<T>::infinity();
  double total = 0;
  // per element: nll = lse - x_t;  smooth = -mean_c log p_c = lse - mean_c x_c;  loss = (1-s) nll + s smooth
  auto combine = [&](double lse, double xt, double sum_x) {
    const double nll = lse - xt;
    return s > 0 ? (1.0 - s) * nll + s * (lse - sum_x * invC) : nll;
  };
  if (L.inner == 1) {  // (N, C) or (C): one contiguous row of logits per position
    for (int64_t n = 0; n < L.outer; ++n) {
      const int64_t tn = t[n];
      if (tn == ignore_index) {
        loss[n] = 0;
        if (lse_out) lse_out[n] = 0;
        continue;
      }
      const T* xr = x + n * L.n;
      const T m = max_in_row(xr, L.n);
      const T shift = m == ninf ? T(0) : m;
      const double lse = static_cast<double>(shift) + std::log(sum_exp_shifted(xr, shift, L.n));
      const double sum_x = s > 0 ? row_sum(xr, L.n) : 0.0;
      const double l = combine(lse, static_cast<double>(xr[tn]), sum_x);
      loss[n] = static_cast<T>(l);
      if (lse_out) lse_out[n] = static_cast<T>(lse);
      total += l;
    }
    return total;
  }
  // (N, C, d...): classes strided by `inner`; reduce over c outside, vectorise over positions inside.
  const size_t inner = static_cast<size_t>(L.inner);
  Scratch& sc = scratch();
  sc.reserve({inner * sizeof(T), inner * sizeof(T), inner * sizeof(double), inner * sizeof(double)});
  T* sh = sc.take<T>(inner);
  T* tmp = sc.take<T>(inner);
  double* se = sc.take<double>(inner);
  double* sx = sc.take<double>(inner);
  for (int64_t n = 0; n < L.outer; ++n) {
    const T* xn = x + n * L.n * L.inner;
    const int64_t* tn = t + n * L.inner;
    for (int64_t j = 0; j < L.inner; ++j) {
      sh[j] = ninf;
      se[j] = 0;
      sx[j] = 0;
    }
    for (int64_t c = 0; c < L.n; ++c) {
      const T* xc = xn + c * L.inner;
      for (int64_t j = 0; j < L.inner; ++j) sh[j] = xc[j] > sh[j] ? xc[j] : sh[j];
    }
    for (int64_t j = 0; j < L.inner; ++j) sh[j] = sh[j] == ninf ? T(0) : sh[j];
    for (int64_t c = 0; c < L.n; ++c) {
      const T* xc = xn + c * L.inner;
      T* e = tmp;  // exp and the double sum in separate loops (vectorised)
      for (int64_t j = 0; j < L.inner; ++j) e[j] = exp_le0(xc[j] - sh[j]);
      for (int64_t j = 0; j < L.inner; ++j) se[j] += static_cast<double>(e[j]);
      if (s > 0)
        for (int64_t j = 0; j < L.inner; ++j) sx[j] += static_cast<double>(xc[j]);
    }
    for (int64_t j = 0; j < L.inner; ++j) {
      const int64_t p = n * L.inner + j;
      if (tn[j] == ignore_index) {
        loss[p] = 0;
        if (lse_out) lse_out[p] = 0;
        continue;
      }
      const double lse = static_cast<double>(sh[j]) + std::log(se[j]);
      const double l = combine(lse, static_cast<double>(xn[tn[j] * L.inner + j]), sx[j]);
      loss[p] = static_cast<T>(l);
      if (lse_out) lse_out[p] = static_cast<T>(lse);
      total += l;
    }
  }
  return total;
}

// Backward of cross_entropy, per class c of a non-ignored position with target t and scale k
// (g for None and Sum, g / count for Mean):
//   dx_c = k * (exp(x_c - lse) - s / C)     (softmax minus the uniform part of the smoothed target)
//   dx_t -= k * (1 - s)                      (minus the one-hot part)
// Ignored positions get dx = 0. `scale` holds k per position (stride 0 when it is one scalar).
template <class T>
void cross_entropy_backward(const T* x, const int64_t* t, const T* lse, const T* scale, int64_t scale_stride, Slices L,
                            double label_smoothing, int64_t ignore_index, T* dx) {
  const T sC = static_cast<T>(label_smoothing / static_cast<double>(std::max<int64_t>(L.n, 1)));
  const T on = static_cast<T>(1.0 - label_smoothing);
  if (L.inner == 1) {
    for (int64_t n = 0; n < L.outer; ++n) {
      T* dr = dx + n * L.n;
      const int64_t tn = t[n];
      if (tn == ignore_index) {
        std::fill(dr, dr + L.n, T(0));
        continue;
      }
      const T* xr = x + n * L.n;
      const T l = lse[n], k = scale[n * scale_stride];
      for (int64_t c = 0; c < L.n; ++c) dr[c] = (exp_le0(xr[c] - l) - sC) * k;
      dr[tn] -= on * k;
    }
    return;
  }
  const size_t inner = static_cast<size_t>(L.inner);
  Scratch& sc = scratch();
  sc.reserve({inner * sizeof(T), inner * sizeof(T)});
  T* kp = sc.take<T>(inner);
  T* kept = sc.take<T>(inner);
  for (int64_t n = 0; n < L.outer; ++n) {
    const T* xn = x + n * L.n * L.inner;
    const int64_t* tn = t + n * L.inner;
    const T* ln = lse + n * L.inner;
    T* dn = dx + n * L.n * L.inner;
    for (int64_t j = 0; j < L.inner; ++j) {
      const bool ignored = tn[j] == ignore_index;
      kept[j] = ignored ? T(0) : T(1);
      kp[j] = ignored ? T(0) : scale[(n * L.inner + j) * scale_stride];
    }
    for (int64_t c = 0; c < L.n; ++c) {
      const T* xc = xn + c * L.inner;
      T* dc = dn + c * L.inner;
      for (int64_t j = 0; j < L.inner; ++j) {
        const T v = (exp_le0(xc[j] - ln[j]) - sC) * kp[j];
        dc[j] = kept[j] != T(0) ? v : T(0);
      }
    }
    for (int64_t j = 0; j < L.inner; ++j)
      if (kept[j] != T(0)) dn[tn[j] * L.inner + j] -= on * kp[j];
  }
}

template double cross_entropy_forward<float>(const float*, const int64_t*, Slices, double, int64_t, float*, float*);
template double cross_entropy_forward<double>(const double*, const int64_t*, Slices, double, int64_t, double*, double*);
template void cross_entropy_backward<float>(const float*, const int64_t*, const float*, const float*, int64_t, Slices,
                                            double, int64_t, float*);
template void cross_entropy_backward<double>(const double*, const int64_t*, const double*, const double*, int64_t,
                                             Slices, double, int64_t, double*);

}  // namespace attograd::cpu::ATTOGRAD_CPU_ISA
