// Rotary position embeddings (see rope.h): the forward rotates pairs (2i, 2i+1) by +angle, the backward by -angle.

#include "autograd/rope.h"

#include <cmath>
#include <utility>

#include "autograd/parallel.h"

namespace attograd {

std::pair<Tensor, Tensor> rotary_cos_sin(int64_t len, int64_t dim, int64_t offset, double base, Dtype dtype) {
  const char* me = "rotary_cos_sin";
  ATTO_CHECK(dim > 0 && dim % 2 == 0, me, "dim must be even and positive, got ", dim);
  ATTO_CHECK(len >= 0, me, "len must be >= 0, got ", len);
  ATTO_CHECK(offset >= 0, me, "offset must be >= 0, got ", offset);
  ATTO_CHECK(base > 0 && std::isfinite(base), me, "base must be positive and finite, got ", base);
  ATTO_CHECK(is_floating(dtype), me, "dtype must be a float type, got ", dtype_name(dtype));
  const int64_t half = dim / 2;
  Tensor c = empty({len, half}, {.dtype = dtype}), s = empty({len, half}, {.dtype = dtype});
  dispatch_float(dtype, me, [&]<typename T>() {
    T* pc = c.data<T>();
    T* ps = s.data<T>();
    for (int64_t i = 0; i < half; ++i) {
      const double theta = std::pow(base, -2.0 * static_cast<double>(i) / static_cast<double>(dim));
      for (int64_t l = 0; l < len; ++l) {
        const double angle = static_cast<double>(offset + l) * theta;
        pc[l * half + i] = static_cast<T>(std::cos(angle));
        ps[l * half + i] = static_cast<T>(std::sin(angle));
      }
    }
  });
  return {c, s};
}

namespace {

// out = rotation of x by +angle (sign = +1) or -angle (sign = -1), pairs (2i, 2i+1); x (rows, L, d) flattened.
template <typename T>
void rotate(const T* x, const T* cos, const T* sin, T* out, int64_t rows, int64_t len, int64_t dim, bool inverse) {
  const int64_t half = dim / 2;
  parallel_for(0, rows * len, std::max<int64_t>(1, 4096 / std::max<int64_t>(dim, 1)), [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r) {
      const int64_t l = r % len;
      const T* xr = x + r * dim;
      T* o = out + r * dim;
      const T* c = cos + l * half;
      const T* s = sin + l * half;
      for (int64_t i = 0; i < half; ++i) {
        const T x0 = xr[2 * i], x1 = xr[2 * i + 1];
        const T si = inverse ? -s[i] : s[i];
        o[2 * i] = x0 * c[i] - x1 * si;
        o[2 * i + 1] = x0 * si + x1 * c[i];
      }
    }
  });
}

}  // namespace

Tensor apply_rotary_emb(const Tensor& x, const Tensor& cos, const Tensor& sin) {
  const char* me = "apply_rotary_emb";
  ATTO_CHECK(x.defined() && cos.defined() && sin.defined(), me, "x, cos and sin must be defined");
  ATTO_CHECK(x.dim() >= 2, me, "x must be (..., L, d), got shape ", x.shape());
  ATTO_CHECK(is_floating(x.dtype()), me, "x must be a float tensor, got ", dtype_name(x.dtype()));
  const int64_t len = x.size(-2), dim = x.size(-1);
  ATTO_CHECK(dim % 2 == 0, me, "the feature size d of x (shape ", x.shape(), ") must be even, got ", dim);
  const Shape table{len, dim / 2};
  ATTO_CHECK(cos.shape() == table && sin.shape() == table, me, "cos ", cos.shape(), " and sin ", sin.shape(),
             " must be (L, d/2) = ", table, " for x of shape ", x.shape());
  ATTO_CHECK(cos.dtype() == x.dtype() && sin.dtype() == x.dtype(), me, "cos (", dtype_name(cos.dtype()), ") and sin (",
             dtype_name(sin.dtype()), ") must have x's dtype ", dtype_name(x.dtype()));
  ATTO_CHECK(!cos.requires_grad() && !sin.requires_grad(), me,
             "cos and sin are constant tables and must not require grad");
  const int64_t rows = len * dim == 0 ? 0 : x.numel() / (len * dim);
  Tensor out = empty(x.shape(), {.dtype = x.dtype()});
  dispatch_float(x.dtype(), me, [&]<typename T>() {
    rotate<T>(x.data<T>(), cos.data<T>(), sin.data<T>(), out.data<T>(), rows, len, dim, false);
  });
  if (!any_requires_grad({x})) return out;
  const Tensor c = cos.detach(), s = sin.detach();
  return record(me, out, {x}, [c, s, rows, len, dim](const Tensor& g, GradInputs& grads) {
    if (!grads.needs(0)) return;
    // x = R(-angle) out: the gradient is g rotated back (R is orthogonal).
    Tensor gx = reuse_or_empty_like(g);
    dispatch_float(g.dtype(), "apply_rotary_emb backward", [&]<typename T>() {
      rotate<T>(g.data<T>(), c.data<T>(), s.data<T>(), gx.data<T>(), rows, len, dim, true);
    });
    grads[0] = gx;
  });
}

Tensor apply_rotary_emb(const Tensor& x, int64_t offset, double base) {
  ATTO_CHECK(x.defined() && x.dim() >= 2, "apply_rotary_emb", "x must be (..., L, d)",
             x.defined() ? str_cat(", got shape ", x.shape()) : std::string());
  auto [c, s] = rotary_cos_sin(x.size(-2), x.size(-1), offset, base, x.dtype());
  return apply_rotary_emb(x, c, s);
}

}  // namespace attograd
