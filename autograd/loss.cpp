#include "autograd/loss.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "autograd/cpu/kernels.h"
#include "autograd/cpu/math.h"
#include "autograd/elementwise.h"
#include "autograd/norm.h"

namespace attograd {

namespace {

using detail::exp_le0;

const char* reduction_name(Reduction r) {
  switch (r) {
    case Reduction::None:
      return "none";
    case Reduction::Mean:
      return "mean";
    case Reduction::Sum:
      return "sum";
  }
  return "?";
}

// A 0-d tensor of dtype T holding v.
template <class T>
Tensor scalar_of(double v) {
  Tensor t = empty({}, {.dtype = dtype_of<T>()});
  *t.data<T>() = static_cast<T>(v);
  return t;
}

// Cross-entropy layout: input viewed as (N, C, inner), target as (N, inner); P = N * inner positions.
struct CeLayout {
  int64_t N = 1, C = 1, inner = 1;
};

// Forward of cross_entropy: writes the per-position loss (0 where ignored) and, when lse is non-null,
// the log-sum-exp of every position (0 where ignored). Returns the sum of the losses, in double.
template <class T>
double cross_entropy_forward(const T* x, const int64_t* t, const CeLayout L, const CrossEntropyOptions& o, T* loss,
                             T* lse_out) {
  const double s = o.label_smoothing;
  const double invC = L.C > 0 ? 1.0 / static_cast<double>(L.C) : 0.0;
  const T ninf = -std::numeric_limits<T>::infinity();
  double total = 0;
  // per element: nll = lse - x_t;  smooth = -mean_c log p_c = lse - mean_c x_c;  loss = (1-s) nll + s smooth
  auto combine = [&](double lse, double xt, double sum_x) {
    const double nll = lse - xt;
    return s > 0 ? (1.0 - s) * nll + s * (lse - sum_x * invC) : nll;
  };
  if (L.inner == 1) {  // (N, C) or (C): one contiguous row of logits per position
    for (int64_t n = 0; n < L.N; ++n) {
      const int64_t tn = t[n];
      if (tn == o.ignore_index) {
        loss[n] = 0;
        if (lse_out) lse_out[n] = 0;
        continue;
      }
      const T* xr = x + n * L.C;
      const T m = ATTO_CPU(row_max<T>)(xr, L.C);
      const T shift = m == ninf ? T(0) : m;
      const double lse = static_cast<double>(shift) + std::log(ATTO_CPU(sum_exp_shifted<T>)(xr, shift, L.C));
      const double sum_x = s > 0 ? ATTO_CPU(row_sum<T>)(xr, L.C) : 0.0;
      const double l = combine(lse, static_cast<double>(xr[tn]), sum_x);
      loss[n] = static_cast<T>(l);
      if (lse_out) lse_out[n] = static_cast<T>(lse);
      total += l;
    }
    return total;
  }
  // (N, C, d...): classes strided by `inner`; reduce over c outside, vectorise over positions inside.
  const size_t inner = static_cast<size_t>(L.inner);
  std::vector<T> shift(inner), tmp(inner);
  std::vector<double> sum(inner), sum_x(inner);
  T* sh = shift.data();
  double* se = sum.data();
  double* sx = sum_x.data();
  for (int64_t n = 0; n < L.N; ++n) {
    const T* xn = x + n * L.C * L.inner;
    const int64_t* tn = t + n * L.inner;
    for (int64_t j = 0; j < L.inner; ++j) {
      sh[j] = ninf;
      se[j] = 0;
      sx[j] = 0;
    }
    for (int64_t c = 0; c < L.C; ++c) {
      const T* xc = xn + c * L.inner;
      for (int64_t j = 0; j < L.inner; ++j) sh[j] = xc[j] > sh[j] ? xc[j] : sh[j];
    }
    for (int64_t j = 0; j < L.inner; ++j) sh[j] = sh[j] == ninf ? T(0) : sh[j];
    for (int64_t c = 0; c < L.C; ++c) {
      const T* xc = xn + c * L.inner;
      T* e = tmp.data();  // exp and the double sum in separate loops (vectorised)
      for (int64_t j = 0; j < L.inner; ++j) e[j] = exp_le0(xc[j] - sh[j]);
      for (int64_t j = 0; j < L.inner; ++j) se[j] += static_cast<double>(e[j]);
      if (s > 0)
        for (int64_t j = 0; j < L.inner; ++j) sx[j] += static_cast<double>(xc[j]);
    }
    for (int64_t j = 0; j < L.inner; ++j) {
      const int64_t p = n * L.inner + j;
      if (tn[j] == o.ignore_index) {
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
void cross_entropy_backward(const T* x, const int64_t* t, const T* lse, const T* scale, int64_t scale_stride,
                            const CeLayout L, const CrossEntropyOptions& o, T* dx) {
  const T sC = static_cast<T>(o.label_smoothing / static_cast<double>(std::max<int64_t>(L.C, 1)));
  const T on = static_cast<T>(1.0 - o.label_smoothing);
  if (L.inner == 1) {
    for (int64_t n = 0; n < L.N; ++n) {
      T* dr = dx + n * L.C;
      const int64_t tn = t[n];
      if (tn == o.ignore_index) {
        std::fill(dr, dr + L.C, T(0));
        continue;
      }
      const T* xr = x + n * L.C;
      const T l = lse[n], k = scale[n * scale_stride];
      for (int64_t c = 0; c < L.C; ++c) dr[c] = (exp_le0(xr[c] - l) - sC) * k;
      dr[tn] -= on * k;
    }
    return;
  }
  const size_t inner = static_cast<size_t>(L.inner);
  std::vector<T> kk(inner), keep(inner);
  T* kp = kk.data();
  T* kept = keep.data();
  for (int64_t n = 0; n < L.N; ++n) {
    const T* xn = x + n * L.C * L.inner;
    const int64_t* tn = t + n * L.inner;
    const T* ln = lse + n * L.inner;
    T* dn = dx + n * L.C * L.inner;
    for (int64_t j = 0; j < L.inner; ++j) {
      const bool ignored = tn[j] == o.ignore_index;
      kept[j] = ignored ? T(0) : T(1);
      kp[j] = ignored ? T(0) : scale[(n * L.inner + j) * scale_stride];
    }
    for (int64_t c = 0; c < L.C; ++c) {
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

}  // namespace

Tensor cross_entropy(const Tensor& input, const Tensor& target, CrossEntropyOptions opts) {
  const char* op = "cross_entropy";
  ATTO_CHECK(input.defined() && target.defined(), op, "called with an undefined tensor");
  const Shape& is = input.shape();
  const Shape& ts = target.shape();
  ATTO_CHECK(input.dim() >= 1, op, "input must have shape (C), (N, C) or (N, C, d1, ...), got shape ", is);
  ATTO_CHECK(is_floating(input.dtype()), op, "input must be float32 or float64, got ", dtype_name(input.dtype()));
  ATTO_CHECK(target.dtype() == kInt64, op, "target must be an int64 tensor of class indices, got ",
             dtype_name(target.dtype()), " of shape ", ts);
  Shape expect = is;
  expect.erase(expect.begin() + (input.dim() == 1 ? 0 : 1));
  ATTO_CHECK(ts == expect, op, "target shape ", ts, " does not match input shape ", is, " (expected target shape ",
             expect, ")");
  const double s = opts.label_smoothing;
  ATTO_CHECK(s >= 0.0 && s <= 1.0, op, "label_smoothing must be in [0, 1], got ", s);

  CeLayout L;
  if (input.dim() == 1) {
    L.C = is[0];
  } else {
    L.N = is[0];
    L.C = is[1];
    for (size_t i = 2; i < is.size(); ++i) L.inner *= is[i];
  }
  const int64_t P = L.N * L.inner;
  const int64_t* t = target.data<int64_t>();
  int64_t count = 0;
  for (int64_t p = 0; p < P; ++p) {
    if (t[p] == opts.ignore_index) continue;
    ATTO_CHECK(t[p] >= 0 && t[p] < L.C, op, "target value ", t[p], " is out of range for ", L.C,
               " classes (expected 0 <= target < ", L.C, ", or ignore_index ", opts.ignore_index, "); input shape ",
               is);
    ++count;
  }

  const bool save = any_requires_grad({input});
  Tensor lse;  // (N, d...) log-sum-exp per position, the one statistic the backward needs
  if (save) lse = empty(ts, {.dtype = input.dtype()});
  Tensor per = empty(ts, {.dtype = input.dtype()});  // per-position losses
  Tensor out;
  dispatch_float(input.dtype(), op, [&]<typename T>() {
    const double total =
        cross_entropy_forward<T>(input.data<T>(), t, L, opts, per.data<T>(), save ? lse.data<T>() : nullptr);
    switch (opts.reduction) {
      case Reduction::None:
        out = per;
        break;
      case Reduction::Sum:
        out = scalar_of<T>(total);
        break;
      case Reduction::Mean:
        out = scalar_of<T>(count > 0 ? total / static_cast<double>(count) : 0.0);
        break;
    }
  });
  if (!save) return out;

  Tensor xd = input.detach(), td = target.detach();
  return record(op, out, {input}, [xd, td, lse, L, opts, count](const Tensor& g, GradInputs& gi) {
    Tensor dx = empty(xd.shape(), {.dtype = xd.dtype()});
    dispatch_float(xd.dtype(), "cross_entropy_backward", [&]<typename T>() {
      T k = 0;  // the one scale for Mean and Sum
      const T* scale = &k;
      int64_t stride = 0;
      if (opts.reduction == Reduction::None) {
        scale = g.data<T>();
        stride = 1;
      } else if (opts.reduction == Reduction::Sum) {
        k = g.data<T>()[0];
      } else {
        k = count > 0 ? static_cast<T>(static_cast<double>(g.data<T>()[0]) / static_cast<double>(count)) : T(0);
      }
      cross_entropy_backward<T>(xd.data<T>(), td.data<int64_t>(), lse.data<T>(), scale, stride, L, opts, dx.data<T>());
    });
    gi[0] = dx;
  });
}

Tensor mse_loss(const Tensor& input, const Tensor& target, Reduction reduction) {
  const char* op = "mse_loss";
  ATTO_CHECK(input.defined() && target.defined(), op, "called with an undefined tensor");
  ATTO_CHECK(input.shape() == target.shape(), op, "input shape ", input.shape(), " and target shape ", target.shape(),
             " must be equal (reduction ", reduction_name(reduction), ")");
  check_same_dtype(input, target, op);
  const int64_t n = input.numel();
  Tensor out;
  dispatch_float(input.dtype(), op, [&]<typename T>() {
    const T* a = input.data<T>();
    const T* b = target.data<T>();
    if (reduction == Reduction::None) {
      out = empty(input.shape(), {.dtype = input.dtype()});
      T* q = out.data<T>();
      for (int64_t i = 0; i < n; ++i) q[i] = (a[i] - b[i]) * (a[i] - b[i]);
      return;
    }
    // sum of (a - b)^2 over 8 independent double lanes (vectorises), folded at the end
    double acc[8] = {};
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
      for (int k = 0; k < 8; ++k) {
        const double d = static_cast<double>(a[i + k]) - static_cast<double>(b[i + k]);
        acc[k] += d * d;
      }
    for (int k = 0; k < 8 && i + k < n; ++k) {
      const double d = static_cast<double>(a[i + k]) - static_cast<double>(b[i + k]);
      acc[k] += d * d;
    }
    const double total = ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
    out = scalar_of<T>(reduction == Reduction::Sum ? total : total / static_cast<double>(n));
  });
  if (!any_requires_grad({input, target})) return out;

  Tensor ad = input.detach(), bd = target.detach();
  // d/da = 2 (a - b) * g (/ n for Mean);  d/db = -d/da
  return record(op, out, {input, target}, [ad, bd, reduction, n](const Tensor& g, GradInputs& gi) {
    Tensor da = empty(ad.shape(), {.dtype = ad.dtype()});
    dispatch_float(ad.dtype(), "mse_loss_backward", [&]<typename T>() {
      const T* a = ad.data<T>();
      const T* b = bd.data<T>();
      const T* gp = g.data<T>();
      T* q = da.data<T>();
      if (reduction == Reduction::None) {
        for (int64_t i = 0; i < n; ++i) q[i] = T(2) * (a[i] - b[i]) * gp[i];
      } else {
        const T k = static_cast<T>(2.0 * static_cast<double>(gp[0]) /
                                   (reduction == Reduction::Mean ? static_cast<double>(n) : 1.0));
        for (int64_t i = 0; i < n; ++i) q[i] = k * (a[i] - b[i]);
      }
    });
    if (gi.needs(1)) {
      Tensor db = empty(bd.shape(), {.dtype = bd.dtype()});
      dispatch_float(bd.dtype(), "mse_loss_backward", [&]<typename T>() {
        const T* p = da.data<T>();
        T* q = db.data<T>();
        for (int64_t i = 0; i < n; ++i) q[i] = -p[i];
      });
      gi[1] = db;
    }
    if (gi.needs(0)) gi[0] = da;
  });
}

}  // namespace attograd
