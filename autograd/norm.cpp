#include "autograd/norm.h"

#include <algorithm>
#include <vector>

#include "autograd/cpu/kernels.h"
#include "autograd/dims.h"
#include "autograd/elementwise.h"

namespace attograd {

namespace {

using cpu::Slices;

// The shape viewed as (outer, n, inner) around dim d: softmax reduces over n.
Slices slices_of(const Shape& shape, int64_t d) {
  Slices s;
  if (shape.empty()) return s;
  for (int64_t i = 0; i < d; ++i) s.outer *= shape[static_cast<size_t>(i)];
  s.n = shape[static_cast<size_t>(d)];
  for (size_t i = static_cast<size_t>(d) + 1; i < shape.size(); ++i) s.inner *= shape[i];
  return s;
}

template <bool Log>
Tensor softmax_op(const Tensor& x, int64_t dim, const char* name) {
  ATTO_CHECK(x.defined(), name, "called with an undefined tensor");
  const Slices s = slices_of(x.shape(), detail::wrap_dim(dim, std::max<int64_t>(x.dim(), 1), x.shape(), name));
  Tensor out = empty(x.shape(), {.dtype = x.dtype()});
  dispatch_float(x.dtype(), name, [&]<typename T>() {
    ATTO_CPU(softmax_forward<T, Log>)(x.data<T>(), out.data<T>(), s);
  });
  if (!any_requires_grad({x})) return out;
  Tensor y = out.detach();  // the backward needs only the output
  return record(name, out, {x}, [y, s](const Tensor& g, GradInputs& gi) {
    Tensor dx = empty(y.shape(), {.dtype = y.dtype()});
    dispatch_float(y.dtype(), Log ? "log_softmax_backward" : "softmax_backward", [&]<typename T>() {
      if constexpr (Log)
        ATTO_CPU(log_softmax_backward<T>)(y.data<T>(), g.data<T>(), dx.data<T>(), s);
      else
        ATTO_CPU(softmax_backward<T>)(y.data<T>(), g.data<T>(), dx.data<T>(), s);
    });
    gi[0] = dx;
  });
}

// Converts a double accumulator into a new tensor of dtype T and the given shape.
template <class T>
Tensor from_accumulator(const std::vector<double>& acc, const Shape& shape) {
  Tensor t = empty(shape, {.dtype = dtype_of<T>()});
  T* p = t.data<T>();
  for (size_t i = 0; i < acc.size(); ++i) p[i] = static_cast<T>(acc[i]);
  return t;
}

}  // namespace

Tensor softmax(const Tensor& x, int64_t dim) { return softmax_op<false>(x, dim, "softmax"); }

Tensor log_softmax(const Tensor& x, int64_t dim) { return softmax_op<true>(x, dim, "log_softmax"); }

Tensor layer_norm(const Tensor& x, const Shape& normalized_shape, const Tensor& weight, const Tensor& bias,
                  double eps) {
  const char* op = "layer_norm";
  ATTO_CHECK(x.defined(), op, "called with an undefined input");
  const Shape& xs = x.shape();
  const Shape& ns = normalized_shape;
  ATTO_CHECK(!ns.empty(), op, "normalized_shape must have at least one dimension, got [] for input shape ", xs);
  const bool trailing = xs.size() >= ns.size() && std::equal(ns.begin(), ns.end(), xs.end() - ns.size());
  ATTO_CHECK(trailing, op, "normalized_shape ", ns, " does not match the trailing dimensions of input shape ", xs);
  if (weight.defined()) {
    ATTO_CHECK(weight.shape() == ns, op, "weight shape ", weight.shape(), " does not match normalized_shape ", ns);
    check_same_dtype(x, weight, op);
  }
  if (bias.defined()) {
    ATTO_CHECK(bias.shape() == ns, op, "bias shape ", bias.shape(), " does not match normalized_shape ", ns);
    check_same_dtype(x, bias, op);
  }
  ATTO_CHECK(eps >= 0, op, "eps must be non-negative, got ", eps);

  const int64_t N = shape_numel(ns);
  int64_t rows = 1;
  for (size_t i = 0; i + ns.size() < xs.size(); ++i) rows *= xs[i];
  const bool save = any_requires_grad({x, weight, bias});
  Tensor stats;  // (2, rows): mean, then rstd
  if (save) stats = empty({2, rows}, {.dtype = kFloat64});
  double* mean = save ? stats.data<double>() : nullptr;
  double* rstd = save ? mean + rows : nullptr;

  Tensor out = empty(xs, {.dtype = x.dtype()});
  dispatch_float(x.dtype(), op, [&]<typename T>() {
    const auto forward = ATTO_CPU(layer_norm_forward<T>);
    forward(x.data<T>(), weight.defined() ? weight.data<T>() : nullptr, bias.defined() ? bias.data<T>() : nullptr,
            out.data<T>(), mean, rstd, rows, N, eps);
  });
  if (!save) return out;

  Tensor xd = x.detach();
  Tensor wd = weight.defined() ? weight.detach() : Tensor();
  // A consumer that saves `out` (linear) keeps this recipe instead of out's data: out is rebuilt from what this
  // node keeps anyway (x, the statistics, the weight) plus the bias, so a pre-norm block stores no normalised copy.
  Tensor bd = bias.defined() ? bias.detach() : Tensor();
  out.impl()->recompute = std::make_shared<const std::function<Tensor()>>([xd, wd, bd, stats, rows, N]() {
    Tensor y = empty(xd.shape(), {.dtype = xd.dtype()});
    dispatch_float(xd.dtype(), "layer_norm_recompute", [&]<typename T>() {
      const double* mean = stats.data<double>();
      const auto recompute = ATTO_CPU(layer_norm_recompute<T>);
      recompute(xd.data<T>(), wd.defined() ? wd.data<T>() : nullptr, bd.defined() ? bd.data<T>() : nullptr, y.data<T>(),
                mean, mean + rows, rows, N);
    });
    return y;
  });
  out.impl()->storage->modified = false;  // the recipe describes the data just written
  return record(op, out, {x, weight, bias}, [xd, wd, stats, rows, N, ns](const Tensor& g, GradInputs& gi) {
    dispatch_float(xd.dtype(), "layer_norm_backward", [&]<typename T>() {
      Tensor dx;
      if (gi.needs(0)) dx = reuse_or_empty_like(g);  // row i of dx depends on row i of g only: may overwrite g
      std::vector<double> dw, db;
      if (gi.needs(1)) dw.assign(static_cast<size_t>(N), 0.0);
      if (gi.needs(2)) db.assign(static_cast<size_t>(N), 0.0);
      const double* mean = stats.data<double>();
      const double* rstd = mean + rows;
      T* dxp = dx.defined() ? dx.data<T>() : nullptr;
      double* dwp = gi.needs(1) ? dw.data() : nullptr;
      double* dbp = gi.needs(2) ? db.data() : nullptr;
      // Per-block partial sums of dweight and dbias, from the caching allocator (no system allocation in a step).
      const int64_t blocks = (rows + cpu::kLayerNormBlockRows - 1) / cpu::kLayerNormBlockRows;
      Tensor dw_part = dwp ? zeros({blocks, N}, {.dtype = dtype_of<T>()}) : Tensor();
      Tensor db_part = dbp ? zeros({blocks, N}, {.dtype = dtype_of<T>()}) : Tensor();
      const auto backward = ATTO_CPU(layer_norm_backward<T>);
      backward(xd.data<T>(), wd.defined() ? wd.data<T>() : nullptr, g.data<T>(), mean, rstd, dxp, dwp, dbp, rows, N,
               dwp ? dw_part.data<T>() : nullptr, dbp ? db_part.data<T>() : nullptr);
      if (gi.needs(0)) gi[0] = dx;
      if (gi.needs(1)) gi[1] = from_accumulator<T>(dw, ns);
      if (gi.needs(2)) gi[2] = from_accumulator<T>(db, ns);
    });
  });
}

}  // namespace attograd
