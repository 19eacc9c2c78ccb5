#include "autograd/loss.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "autograd/cpu/kernels.h"
#include "autograd/elementwise.h"
#include "autograd/norm.h"

namespace attograd {

namespace {

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

// Cross-entropy layout: input viewed as (N, C, inner) (outer = N, n = C), target as (N, inner).
using CeLayout = cpu::Slices;

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
    L.n = is[0];
  } else {
    L.outer = is[0];
    L.n = is[1];
    for (size_t i = 2; i < is.size(); ++i) L.inner *= is[i];
  }
  const int64_t P = L.outer * L.inner;
  const int64_t* t = target.data<int64_t>();
  int64_t count = 0;
  for (int64_t p = 0; p < P; ++p) {
    if (t[p] == opts.ignore_index) continue;
    ATTO_CHECK(t[p] >= 0 && t[p] < L.n, op, "target value ", t[p], " is out of range for ", L.n,
               " classes (expected 0 <= target < ", L.n, ", or ignore_index ", opts.ignore_index, "); input shape ",
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
        ATTO_CPU(cross_entropy_forward<T>)(input.data<T>(), t, L, opts.label_smoothing, opts.ignore_index, per.data<T>(),
                                           save ? lse.data<T>() : nullptr);
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
      const auto backward = ATTO_CPU(cross_entropy_backward<T>);
      backward(xd.data<T>(), td.data<int64_t>(), lse.data<T>(), scale, stride, L, opts.label_smoothing, opts.ignore_index,
               dx.data<T>());
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
