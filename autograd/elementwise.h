#pragma once
// Elementwise arithmetic with numpy-style broadcasting, and the one place that reduces a
// broadcast gradient back to an input's shape (sum_to).

#include "autograd/tensor.h"

namespace attograd {

/// The broadcast shape of a and b (numpy rules); throws naming `op` and both shapes.
Shape broadcast_shapes(const Shape& a, const Shape& b, const char* op = "broadcast");
/// Expands x to `shape` by broadcasting (copies; differentiable).
Tensor broadcast_to(const Tensor& x, const Shape& shape);
/// Sums x down to `shape`, the inverse of broadcast_to (differentiable).
Tensor sum_to(const Tensor& x, const Shape& shape);

/// a + b with broadcasting.
Tensor add(const Tensor& a, const Tensor& b);
/// a - b with broadcasting.
Tensor sub(const Tensor& a, const Tensor& b);
/// a * b with broadcasting.
Tensor mul(const Tensor& a, const Tensor& b);
/// a / b with broadcasting.
Tensor div(const Tensor& a, const Tensor& b);
/// -x.
Tensor neg(const Tensor& x);
/// x + s.
Tensor add(const Tensor& x, double s);
/// x * s.
Tensor mul(const Tensor& x, double s);
/// s / x.
Tensor rdiv(double s, const Tensor& x);

/// In place a += b (b broadcast to a's shape); not recorded, for gradient accumulation and optimizers.
void add_(Tensor& a, const Tensor& b);
/// In place a *= s; not recorded.
void mul_(Tensor& a, double s);
/// In place fill with `value`; not recorded.
void fill_(Tensor& a, double value);
/// In place copy of src's values into dst (same shape; converts dtype); not recorded. dst is a handle, so a
/// temporary works: copy_(m.parameter("w"), src).
void copy_(const Tensor& dst, const Tensor& src);

/// a + b.
Tensor operator+(const Tensor& a, const Tensor& b);
/// a - b.
Tensor operator-(const Tensor& a, const Tensor& b);
/// a * b.
Tensor operator*(const Tensor& a, const Tensor& b);
/// a / b.
Tensor operator/(const Tensor& a, const Tensor& b);
/// -x.
Tensor operator-(const Tensor& x);
/// x + s.
Tensor operator+(const Tensor& x, double s);
/// s + x.
Tensor operator+(double s, const Tensor& x);
/// x - s.
Tensor operator-(const Tensor& x, double s);
/// s - x.
Tensor operator-(double s, const Tensor& x);
/// x * s.
Tensor operator*(const Tensor& x, double s);
/// s * x.
Tensor operator*(double s, const Tensor& x);
/// x / s.
Tensor operator/(const Tensor& x, double s);
/// s / x.
Tensor operator/(double s, const Tensor& x);

/// Applies f(v) to every element of a float tensor into a new tensor (a kernel helper, not recorded).
template <class F>
Tensor map_float(const Tensor& x, const char* op, F f) {
  Tensor out = empty(x.shape(), {.dtype = x.dtype()});
  const int64_t n = x.numel();
  dispatch_float(x.dtype(), op, [&]<typename T>() {
    const T* p = x.data<T>();
    T* q = out.data<T>();
    for (int64_t i = 0; i < n; ++i) q[i] = f(p[i]);
  });
  return out;
}

/// Applies f(a, b) to two float tensors of the same shape and dtype (a kernel helper, not recorded).
template <class F>
Tensor zip_float(const Tensor& a, const Tensor& b, const char* op, F f) {
  ATTO_CHECK(a.shape() == b.shape(), op, "shapes ", a.shape(), " and ", b.shape(), " differ");
  ATTO_CHECK(a.dtype() == b.dtype(), op, "dtypes ", dtype_name(a.dtype()), " and ", dtype_name(b.dtype()),
             " differ");
  Tensor out = empty(a.shape(), {.dtype = a.dtype()});
  const int64_t n = a.numel();
  dispatch_float(a.dtype(), op, [&]<typename T>() {
    const T* p = a.data<T>();
    const T* r = b.data<T>();
    T* q = out.data<T>();
    for (int64_t i = 0; i < n; ++i) q[i] = f(p[i], r[i]);
  });
  return out;
}

/// Throws naming `op` unless a and b have the same dtype.
void check_same_dtype(const Tensor& a, const Tensor& b, const char* op);

}  // namespace attograd
