#include "autograd/elementwise.h"

#include <algorithm>
#include <cstring>

namespace attograd {

void check_same_dtype(const Tensor& a, const Tensor& b, const char* op) {
  ATTO_CHECK(a.defined() && b.defined(), op, "called with an undefined tensor");
  ATTO_CHECK(a.dtype() == b.dtype(), op, "dtype mismatch: ", dtype_name(a.dtype()), " ", a.shape(), " and ",
             dtype_name(b.dtype()), " ", b.shape(), " (convert one with .to())");
}

Shape broadcast_shapes(const Shape& a, const Shape& b, const char* op) {
  size_t r = std::max(a.size(), b.size());
  Shape out(r);
  for (size_t i = 0; i < r; ++i) {
    int64_t da = i < r - a.size() ? 1 : a[i - (r - a.size())];
    int64_t db = i < r - b.size() ? 1 : b[i - (r - b.size())];
    ATTO_CHECK(da == db || da == 1 || db == 1, op, "shapes ", a, " and ", b,
               " cannot be broadcast together (dimension ", i, ": ", da, " vs ", db, ")");
    out[i] = da == 1 ? db : da;
  }
  return out;
}

namespace {

// Strides (in elements) of `shape` viewed as broadcast to `out` (rank-aligned right): 0 where
// the dimension is broadcast.
std::vector<int64_t> broadcast_strides(const Shape& shape, const Shape& out) {
  std::vector<int64_t> st(out.size(), 0);
  int64_t s = 1;
  for (size_t k = 0; k < shape.size(); ++k) {
    size_t i = shape.size() - 1 - k;
    size_t o = out.size() - 1 - k;
    st[o] = shape[i] == 1 ? 0 : s;
    s *= shape[i];
  }
  return st;
}

// Visits every element of `out`, calling f(out_index, a_index, b_index) in row-major order.
template <class F>
void for_each_broadcast(const Shape& out, const std::vector<int64_t>& sa, const std::vector<int64_t>& sb, F f) {
  const int64_t n = shape_numel(out);
  if (n == 0) return;
  const size_t r = out.size();
  if (r == 0) {
    f(0, 0, 0);
    return;
  }
  const int64_t inner = out[r - 1];
  const int64_t ia = sa[r - 1], ib = sb[r - 1];
  std::vector<int64_t> idx(r, 0);
  int64_t oa = 0, ob = 0;
  for (int64_t base = 0; base < n; base += inner) {
    for (int64_t j = 0; j < inner; ++j) f(base + j, oa + j * ia, ob + j * ib);
    // advance the outer counter
    for (size_t d = r - 1; d-- > 0;) {
      ++idx[d];
      oa += sa[d];
      ob += sb[d];
      if (idx[d] < out[d]) break;
      oa -= sa[d] * out[d];
      ob -= sb[d] * out[d];
      idx[d] = 0;
    }
  }
}

template <class Op>
Tensor binary_kernel(const Tensor& a, const Tensor& b, const char* name, Op op) {
  check_same_dtype(a, b, name);
  if (a.shape() == b.shape()) return zip_float(a, b, name, op);
  Shape out_shape = broadcast_shapes(a.shape(), b.shape(), name);
  Tensor out = empty(out_shape, {.dtype = a.dtype()});
  auto sa = broadcast_strides(a.shape(), out_shape);
  auto sb = broadcast_strides(b.shape(), out_shape);
  dispatch_float(a.dtype(), name, [&]<typename T>() {
    const T* pa = a.data<T>();
    const T* pb = b.data<T>();
    T* q = out.data<T>();
    for_each_broadcast(out_shape, sa, sb, [&](int64_t o, int64_t i, int64_t j) { q[o] = op(pa[i], pb[j]); });
  });
  return out;
}

}  // namespace

Tensor sum_to(const Tensor& x, const Shape& shape) {
  if (x.shape() == shape) return x;
  ATTO_CHECK(shape.size() <= x.shape().size(), "sum_to", "cannot sum shape ", x.shape(), " to larger rank shape ",
             shape);
  ATTO_CHECK(broadcast_shapes(shape, x.shape(), "sum_to") == x.shape(), "sum_to", "shape ", shape,
             " does not broadcast to ", x.shape());
  Tensor out = zeros(shape, {.dtype = x.dtype()});
  auto so = broadcast_strides(shape, x.shape());
  std::vector<int64_t> sx(x.shape().size(), 0);
  dispatch_float(x.dtype(), "sum_to", [&]<typename T>() {
    const T* p = x.data<T>();
    T* q = out.data<T>();
    for_each_broadcast(x.shape(), sx, so, [&](int64_t i, int64_t, int64_t o) { q[o] += p[i]; });
  });
  Shape from = x.shape();
  return record("sum_to", out, {x}, [from](const Tensor& g, GradInputs& gi) { gi[0] = broadcast_to(g, from); });
}

Tensor broadcast_to(const Tensor& x, const Shape& shape) {
  if (x.shape() == shape) return x;
  ATTO_CHECK(broadcast_shapes(x.shape(), shape, "broadcast_to") == shape, "broadcast_to", "shape ", x.shape(),
             " cannot be broadcast to ", shape);
  Tensor out = empty(shape, {.dtype = x.dtype()});
  auto sx = broadcast_strides(x.shape(), shape);
  std::vector<int64_t> so(shape.size(), 0);
  dispatch_all(x.dtype(), [&]<typename T>() {
    const T* p = x.data<T>();
    T* q = out.data<T>();
    for_each_broadcast(shape, sx, so, [&](int64_t o, int64_t i, int64_t) { q[o] = p[i]; });
  });
  if (!is_floating(x.dtype())) return out;
  Shape from = x.shape();
  return record("broadcast_to", out, {x}, [from](const Tensor& g, GradInputs& gi) { gi[0] = sum_to(g, from); });
}

// ---------------------------------------------------------------------------------------------
// Binary ops. d(a+b) = g; d(a-b) = g, -g; d(a*b) = g*b, g*a; d(a/b) = g/b, -g*a/b^2.

Tensor add(const Tensor& a, const Tensor& b) {
  Tensor out = binary_kernel(a, b, "add", [](auto x, auto y) { return x + y; });
  Shape sa = a.shape(), sb = b.shape();
  return record("add", out, {a, b}, [sa, sb](const Tensor& g, GradInputs& gi) {
    if (gi.needs(0)) gi[0] = sum_to(g, sa);
    if (gi.needs(1)) gi[1] = sum_to(g, sb);
  });
}

Tensor sub(const Tensor& a, const Tensor& b) {
  Tensor out = binary_kernel(a, b, "sub", [](auto x, auto y) { return x - y; });
  Shape sa = a.shape(), sb = b.shape();
  return record("sub", out, {a, b}, [sa, sb](const Tensor& g, GradInputs& gi) {
    if (gi.needs(0)) gi[0] = sum_to(g, sa);
    if (gi.needs(1)) gi[1] = sum_to(neg(g), sb);
  });
}

Tensor mul(const Tensor& a, const Tensor& b) {
  Tensor out = binary_kernel(a, b, "mul", [](auto x, auto y) { return x * y; });
  if (!any_requires_grad({a, b})) return out;
  Tensor da = a.detach(), db = b.detach();
  return record("mul", out, {a, b}, [da, db](const Tensor& g, GradInputs& gi) {
    if (gi.needs(0)) gi[0] = sum_to(mul(g, db), da.shape());
    if (gi.needs(1)) gi[1] = sum_to(mul(g, da), db.shape());
  });
}

Tensor div(const Tensor& a, const Tensor& b) {
  Tensor out = binary_kernel(a, b, "div", [](auto x, auto y) { return x / y; });
  if (!any_requires_grad({a, b})) return out;
  Tensor da = a.detach(), db = b.detach();
  return record("div", out, {a, b}, [da, db](const Tensor& g, GradInputs& gi) {
    Tensor gb = div(g, db);
    if (gi.needs(0)) gi[0] = sum_to(gb, da.shape());
    if (gi.needs(1)) gi[1] = sum_to(neg(div(mul(gb, da), db)), db.shape());
  });
}

Tensor neg(const Tensor& x) {
  Tensor out = map_float(x, "neg", [](auto v) { return -v; });
  return record("neg", out, {x}, [](const Tensor& g, GradInputs& gi) { gi[0] = neg(g); });
}

Tensor add(const Tensor& x, double s) {
  Tensor out = dispatch_float(x.dtype(), "add", [&]<typename T>() {
    T c = static_cast<T>(s);
    return map_float(x, "add", [c](auto v) { return v + c; });
  });
  return record("add_scalar", out, {x}, [](const Tensor& g, GradInputs& gi) { gi[0] = g; });
}

Tensor mul(const Tensor& x, double s) {
  Tensor out = dispatch_float(x.dtype(), "mul", [&]<typename T>() {
    T c = static_cast<T>(s);
    return map_float(x, "mul", [c](auto v) { return v * c; });
  });
  return record("mul_scalar", out, {x}, [s](const Tensor& g, GradInputs& gi) { gi[0] = mul(g, s); });
}

Tensor rdiv(double s, const Tensor& x) {
  Tensor out = dispatch_float(x.dtype(), "rdiv", [&]<typename T>() {
    T c = static_cast<T>(s);
    return map_float(x, "rdiv", [c](auto v) { return c / v; });
  });
  if (!any_requires_grad({x})) return out;
  Tensor dx = x.detach();
  // d(s/x) = -s/x^2
  return record("rdiv_scalar", out, {x}, [dx, s](const Tensor& g, GradInputs& gi) {
    gi[0] = zip_float(g, dx, "rdiv_backward", [s](auto gv, auto xv) { return -gv * static_cast<decltype(xv)>(s) / (xv * xv); });
  });
}

Tensor operator+(const Tensor& a, const Tensor& b) { return add(a, b); }
Tensor operator-(const Tensor& a, const Tensor& b) { return sub(a, b); }
Tensor operator*(const Tensor& a, const Tensor& b) { return mul(a, b); }
Tensor operator/(const Tensor& a, const Tensor& b) { return div(a, b); }
Tensor operator-(const Tensor& x) { return neg(x); }
Tensor operator+(const Tensor& x, double s) { return add(x, s); }
Tensor operator+(double s, const Tensor& x) { return add(x, s); }
Tensor operator-(const Tensor& x, double s) { return add(x, -s); }
Tensor operator-(double s, const Tensor& x) { return add(neg(x), s); }
Tensor operator*(const Tensor& x, double s) { return mul(x, s); }
Tensor operator*(double s, const Tensor& x) { return mul(x, s); }
Tensor operator/(const Tensor& x, double s) {
  // True division (not x * (1/s), which overflows for tiny s and is off by an ulp elsewhere).
  Tensor out = dispatch_float(x.dtype(), "div", [&]<typename T>() {
    T c = static_cast<T>(s);
    return map_float(x, "div", [c](auto v) { return v / c; });
  });
  return record("div_scalar", out, {x}, [s](const Tensor& g, GradInputs& gi) { gi[0] = g / s; });
}
Tensor operator/(double s, const Tensor& x) { return rdiv(s, x); }

// ---------------------------------------------------------------------------------------------
// In-place helpers (never recorded).

void add_(Tensor& a, const Tensor& b) {
  check_same_dtype(a, b, "add_");
  if (a.shape() != b.shape()) {
    ATTO_CHECK(broadcast_shapes(a.shape(), b.shape(), "add_") == a.shape(), "add_", "cannot add shape ", b.shape(),
               " in place into shape ", a.shape());
    Tensor bb;
    {
      NoGradGuard ng;
      bb = broadcast_to(b.detach(), a.shape());
    }
    add_(a, bb);
    return;
  }
  const int64_t n = a.numel();
  dispatch_float(a.dtype(), "add_", [&]<typename T>() {
    T* p = a.data<T>();
    const T* q = b.data<T>();
    for (int64_t i = 0; i < n; ++i) p[i] += q[i];
  });
}

void mul_(Tensor& a, double s) {
  const int64_t n = a.numel();
  dispatch_float(a.dtype(), "mul_", [&]<typename T>() {
    T* p = a.data<T>();
    T c = static_cast<T>(s);
    for (int64_t i = 0; i < n; ++i) p[i] *= c;
  });
}

void fill_(Tensor& a, double value) {
  const int64_t n = a.numel();
  dispatch_all(a.dtype(), [&]<typename T>() {
    T* p = a.data<T>();
    T c = static_cast<T>(value);
    for (int64_t i = 0; i < n; ++i) p[i] = c;
  });
}

void copy_(const Tensor& dst_handle, const Tensor& src) {
  Tensor dst = dst_handle;  // another handle to the same data (Tensor is a shallow handle)
  ATTO_CHECK(dst.shape() == src.shape(), "copy_", "destination shape ", dst.shape(), " differs from source shape ",
             src.shape());
  if (dst.defined() && dst.impl()->storage) dst.impl()->storage->modified = true;  // see Storage::modified
  if (dst.dtype() == src.dtype()) {
    std::memmove(dst.raw_data(), src.const_raw_data(), src.nbytes());
    return;
  }
  const int64_t n = src.numel();
  dispatch_all(src.dtype(), [&]<typename S>() {
    const S* p = src.data<S>();
    dispatch_all(dst.dtype(), [&]<typename D>() {
      D* q = dst.data<D>();
      for (int64_t i = 0; i < n; ++i) q[i] = static_cast<D>(p[i]);
    });
  });
}

}  // namespace attograd
