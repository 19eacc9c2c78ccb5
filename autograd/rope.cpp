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

// out = rotation of x by +angle or -angle (inverse), pairs (2i, 2i+1) of each group of `dim` features; x (rows, L,
// groups * dim) flattened (groups > 1: heads interleaved in the last dim, every head rotated alike).
template <typename T>
void rotate(const T* x, const T* cos, const T* sin, T* out, int64_t rows, int64_t len, int64_t dim, int64_t groups,
            bool inverse) {
  const int64_t half = dim / 2, width = dim * groups;
  parallel_for(0, rows * len, std::max<int64_t>(1, 4096 / std::max<int64_t>(width, 1)), [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r) {
      const int64_t l = r % len;
      const T* c = cos + l * half;
      const T* s = sin + l * half;
      for (int64_t h = 0; h < groups; ++h) {
        const T* xr = x + r * width + h * dim;
        T* o = out + r * width + h * dim;
        for (int64_t i = 0; i < half; ++i) {
          const T x0 = xr[2 * i], x1 = xr[2 * i + 1];
          const T si = inverse ? -s[i] : s[i];
          o[2 * i] = x0 * c[i] - x1 * si;
          o[2 * i + 1] = x0 * si + x1 * c[i];
        }
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
  const int64_t len = x.size(-2), width = x.size(-1);
  ATTO_CHECK(cos.dim() == 2 && cos.size(0) == len && cos.size(1) > 0 && sin.shape() == cos.shape(), me, "cos ",
             cos.shape(), " and sin ", sin.shape(), " must be (L, d/2) with L = ", len, " for x of shape ", x.shape());
  const int64_t dim = 2 * cos.size(1);
  ATTO_CHECK(width % dim == 0, me, "the last dim of x (shape ", x.shape(), ") must be a multiple of d = ", dim,
             " (the tables' 2 * ", cos.size(1), ")");
  const int64_t groups = width / dim;
  ATTO_CHECK(cos.dtype() == x.dtype() && sin.dtype() == x.dtype(), me, "cos (", dtype_name(cos.dtype()), ") and sin (",
             dtype_name(sin.dtype()), ") must have x's dtype ", dtype_name(x.dtype()));
  ATTO_CHECK(!cos.requires_grad() && !sin.requires_grad(), me,
             "cos and sin are constant tables and must not require grad");
  const int64_t rows = len * width == 0 ? 0 : x.numel() / (len * width);
  Tensor out = empty(x.shape(), {.dtype = x.dtype()});
  dispatch_float(x.dtype(), me, [&]<typename T>() {
    rotate<T>(x.data<T>(), cos.data<T>(), sin.data<T>(), out.data<T>(), rows, len, dim, groups, false);
  });
  if (!any_requires_grad({x})) return out;
  const Tensor c = cos.detach(), s = sin.detach();
  return record(me, out, {x}, [c, s, rows, len, dim, groups](const Tensor& g, GradInputs& grads) {
    if (!grads.needs(0)) return;
    // x = R(-angle) out: the gradient is g rotated back (R is orthogonal).
    Tensor gx = reuse_or_empty_like(g);
    dispatch_float(g.dtype(), "apply_rotary_emb backward", [&]<typename T>() {
      rotate<T>(g.data<T>(), c.data<T>(), s.data<T>(), gx.data<T>(), rows, len, dim, groups, true);
    });
    grads[0] = gx;
  });
}

Tensor apply_rotary_emb(const Tensor& x, int64_t offset, double base, int64_t head_dim) {
  ATTO_CHECK(x.defined() && x.dim() >= 2, "apply_rotary_emb", "x must be (..., L, d)",
             x.defined() ? str_cat(", got shape ", x.shape()) : std::string());
  ATTO_CHECK(head_dim >= 0, "apply_rotary_emb", "head_dim must be >= 0 (0: the whole last dim), got ", head_dim);
  auto [c, s] = rotary_cos_sin(x.size(-2), head_dim == 0 ? x.size(-1) : head_dim, offset, base, x.dtype());
  return apply_rotary_emb(x, c, s);
}

}  // namespace attograd
