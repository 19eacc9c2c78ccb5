// where / masked_fill (forward and backward side by side), comparisons and logic producing Bool
// masks, and embedding lookup with its scatter-add backward.

#include "autograd/indexing.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <type_traits>

#include "autograd/elementwise.h"

namespace attograd {

namespace {

// Element strides of `shape` seen as broadcast to `out` (right-aligned; 0 on broadcast dims).
std::vector<int64_t> strides_in(const Shape& shape, const Shape& out) {
  std::vector<int64_t> st(out.size(), 0);
  int64_t s = 1;
  for (size_t k = 0; k < shape.size(); ++k) {
    const size_t i = shape.size() - 1 - k;
    st[out.size() - 1 - k] = shape[i] == 1 ? 0 : s;
    s *= shape[i];
  }
  return st;
}

// Calls f(o, i, j, k) for every element o of `out` in row-major order, where i, j, k are the
// matching flat offsets into three operands whose broadcast strides are s0, s1, s2.
template <class F>
void for_each3(const Shape& out, const std::vector<int64_t>& s0, const std::vector<int64_t>& s1,
               const std::vector<int64_t>& s2, F f) {
  const int64_t n = shape_numel(out);
  if (n == 0) return;
  const size_t r = out.size();
  if (r == 0) {
    f(0, 0, 0, 0);
    return;
  }
  const int64_t inner = out[r - 1];
  const int64_t a = s0[r - 1], b = s1[r - 1], c = s2[r - 1];
  std::vector<int64_t> idx(r, 0);
  int64_t o0 = 0, o1 = 0, o2 = 0;
  for (int64_t base = 0; base < n; base += inner) {
    for (int64_t j = 0; j < inner; ++j) f(base + j, o0 + j * a, o1 + j * b, o2 + j * c);
    for (size_t d = r - 1; d-- > 0;) {
      ++idx[d];
      o0 += s0[d];
      o1 += s1[d];
      o2 += s2[d];
      if (idx[d] < out[d]) break;
      o0 -= s0[d] * out[d];
      o1 -= s1[d] * out[d];
      o2 -= s2[d] * out[d];
      idx[d] = 0;
    }
  }
}

// The broadcast shape of three shapes; the error names all three.
Shape broadcast3(const Shape& a, const Shape& b, const Shape& c, const char* op, const char* na, const char* nb,
                 const char* nc) {
  const size_t r = std::max({a.size(), b.size(), c.size()});
  Shape out(r, 1);
  for (const Shape* s : {&a, &b, &c}) {
    for (size_t k = 0; k < s->size(); ++k) {
      const int64_t d = (*s)[s->size() - 1 - k];
      int64_t& o = out[r - 1 - k];
      ATTO_CHECK(d == o || d == 1 || o == 1, op, na, " ", a, ", ", nb, " ", b, " and ", nc, " ", c,
                 " cannot be broadcast together");
      if (o == 1) o = d;
    }
  }
  return out;
}

// True when `from` broadcasts to exactly `to` (numpy rules).
bool broadcastable_to(const Shape& from, const Shape& to) {
  if (from.size() > to.size()) return false;
  for (size_t k = 0; k < from.size(); ++k) {
    const int64_t d = from[from.size() - 1 - k];
    if (d != 1 && d != to[to.size() - 1 - k]) return false;
  }
  return true;
}

void check_bool(const Tensor& t, const char* op, const char* what) {
  ATTO_CHECK(t.defined(), op, what, " is an undefined tensor");
  ATTO_CHECK(t.dtype() == kBool, op, what, " must be a bool tensor, got ", dtype_name(t.dtype()), " of shape ",
             t.shape());
}

// out = cond ? a : b over the broadcast shape (any dtype for a and b, which must match).
Tensor where_kernel(const Tensor& cond, const Tensor& a, const Tensor& b, const Shape& out_shape) {
  Tensor out = empty(out_shape, {.dtype = a.dtype()});
  const auto sc = strides_in(cond.shape(), out_shape);
  const auto sa = strides_in(a.shape(), out_shape);
  const auto sb = strides_in(b.shape(), out_shape);
  const bool* c = cond.data<bool>();
  dispatch_all(a.dtype(), [&]<typename T>() {
    const T* pa = a.data<T>();
    const T* pb = b.data<T>();
    T* q = out.data<T>();
    if (cond.shape() == out_shape && a.shape() == out_shape && b.shape() == out_shape) {
      const int64_t n = out.numel();
      for (int64_t i = 0; i < n; ++i) q[i] = c[i] ? pa[i] : pb[i];
      return;
    }
    for_each3(out_shape, sc, sa, sb, [&](int64_t o, int64_t i, int64_t j, int64_t k) { q[o] = c[i] ? pa[j] : pb[k]; });
  });
  return out;
}

// g where cond == keep, 0 elsewhere; cond broadcast to g's shape.
Tensor select_grad(const Tensor& g, const Tensor& cond, bool keep) {
  Tensor out = empty(g.shape(), {.dtype = g.dtype()});
  const auto sc = strides_in(cond.shape(), g.shape());
  const std::vector<int64_t> none(g.shape().size(), 0);
  const bool* c = cond.data<bool>();
  dispatch_float(g.dtype(), "where_backward", [&]<typename T>() {
    const T* pg = g.data<T>();
    T* q = out.data<T>();
    if (cond.shape() == g.shape()) {
      const int64_t n = g.numel();
      for (int64_t i = 0; i < n; ++i) q[i] = c[i] == keep ? pg[i] : T(0);
      return;
    }
    for_each3(g.shape(), sc, none, none, [&](int64_t o, int64_t i, int64_t, int64_t) { q[o] = c[i] == keep ? pg[o] : T(0); });
  });
  return out;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Selection

// d where(c, a, b) = sum_to(c ? g : 0, a.shape), sum_to(c ? 0 : g, b.shape)
Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b) {
  check_bool(cond, "where", "condition");
  check_same_dtype(a, b, "where");
  const Shape out_shape = broadcast3(cond.shape(), a.shape(), b.shape(), "where", "condition", "a", "b");
  Tensor out = where_kernel(cond, a, b, out_shape);
  if (!any_requires_grad({a, b})) return out;
  Tensor c = cond.detach();
  Shape sa = a.shape(), sb = b.shape();
  return record("where", out, {a, b}, [c, sa, sb](const Tensor& g, GradInputs& gi) {
    if (gi.needs(0)) gi[0] = sum_to(select_grad(g, c, true), sa);
    if (gi.needs(1)) gi[1] = sum_to(select_grad(g, c, false), sb);
  });
}

// d where(c, a, s) = sum_to(c ? g : 0, a.shape)
Tensor where(const Tensor& cond, const Tensor& a, double b) {
  check_bool(cond, "where", "condition");
  ATTO_CHECK(a.defined(), "where", "a is an undefined tensor");
  ATTO_CHECK(is_floating(a.dtype()) || std::isfinite(b), "where", "cannot put the value ", b, " into a ",
             dtype_name(a.dtype()), " tensor");
  const Shape out_shape = broadcast3(cond.shape(), a.shape(), {}, "where", "condition", "a", "b");
  Tensor out = where_kernel(cond, a, full({}, b, {.dtype = a.dtype()}), out_shape);
  if (!any_requires_grad({a})) return out;
  Tensor c = cond.detach();
  Shape sa = a.shape();
  return record("where", out, {a}, [c, sa](const Tensor& g, GradInputs& gi) {
    gi[0] = sum_to(select_grad(g, c, true), sa);
  });
}

// d masked_fill(x, m, v) = m ? 0 : g
Tensor masked_fill(const Tensor& x, const Tensor& mask, double value) {
  ATTO_CHECK(x.defined(), "masked_fill", "x is an undefined tensor");
  check_bool(mask, "masked_fill", "mask");
  ATTO_CHECK(broadcastable_to(mask.shape(), x.shape()), "masked_fill", "mask of shape ", mask.shape(),
             " cannot be broadcast to x of shape ", x.shape());
  ATTO_CHECK(is_floating(x.dtype()) || std::isfinite(value), "masked_fill", "cannot fill a ", dtype_name(x.dtype()),
             " tensor with ", value);
  Tensor out = where_kernel(mask, full({}, value, {.dtype = x.dtype()}), x, x.shape());
  if (!any_requires_grad({x})) return out;
  Tensor m = mask.detach();
  return record("masked_fill", out, {x}, [m](const Tensor& g, GradInputs& gi) { gi[0] = select_grad(g, m, false); });
}

// ---------------------------------------------------------------------------------------------
// Comparisons and logic (Bool results, not recorded)

namespace {

// a `cmp` s elementwise. Float tensors compare against s converted to their own type (as PyTorch
// does); Int64 and Bool tensors compare as double.
template <class Cmp>
Tensor compare_scalar(const Tensor& a, double s, const char* op, Cmp cmp) {
  ATTO_CHECK(a.defined(), op, "called with an undefined tensor");
  Tensor out = empty(a.shape(), {.dtype = kBool});
  bool* q = out.data<bool>();
  const int64_t n = a.numel();
  dispatch_all(a.dtype(), [&]<typename T>() {
    const T* p = a.data<T>();
    if constexpr (std::is_floating_point_v<T>) {
      const T c = static_cast<T>(s);
      for (int64_t i = 0; i < n; ++i) q[i] = cmp(p[i], c);
    } else {
      for (int64_t i = 0; i < n; ++i) q[i] = cmp(static_cast<double>(p[i]), s);
    }
  });
  return out;
}

// a `cmp` b elementwise with broadcasting; a and b of the same dtype.
template <class Cmp>
Tensor compare_tensors(const Tensor& a, const Tensor& b, const char* op, Cmp cmp) {
  check_same_dtype(a, b, op);
  const Shape out_shape = broadcast_shapes(a.shape(), b.shape(), op);
  Tensor out = empty(out_shape, {.dtype = kBool});
  bool* q = out.data<bool>();
  dispatch_all(a.dtype(), [&]<typename T>() {
    const T* pa = a.data<T>();
    const T* pb = b.data<T>();
    if (a.shape() == b.shape()) {
      const int64_t n = a.numel();
      for (int64_t i = 0; i < n; ++i) q[i] = cmp(pa[i], pb[i]);
      return;
    }
    const auto sa = strides_in(a.shape(), out_shape);
    const auto sb = strides_in(b.shape(), out_shape);
    for_each3(out_shape, sa, sb, sb, [&](int64_t o, int64_t i, int64_t j, int64_t) { q[o] = cmp(pa[i], pb[j]); });
  });
  return out;
}

constexpr auto kEq = [](auto x, auto y) { return x == y; };
constexpr auto kNe = [](auto x, auto y) { return x != y; };
constexpr auto kLt = [](auto x, auto y) { return x < y; };
constexpr auto kLe = [](auto x, auto y) { return x <= y; };
constexpr auto kGt = [](auto x, auto y) { return x > y; };
constexpr auto kGe = [](auto x, auto y) { return x >= y; };

}  // namespace

Tensor eq(const Tensor& a, double s) { return compare_scalar(a, s, "eq", kEq); }
Tensor ne(const Tensor& a, double s) { return compare_scalar(a, s, "ne", kNe); }
Tensor lt(const Tensor& a, double s) { return compare_scalar(a, s, "lt", kLt); }
Tensor le(const Tensor& a, double s) { return compare_scalar(a, s, "le", kLe); }
Tensor gt(const Tensor& a, double s) { return compare_scalar(a, s, "gt", kGt); }
Tensor ge(const Tensor& a, double s) { return compare_scalar(a, s, "ge", kGe); }
Tensor eq(const Tensor& a, const Tensor& b) { return compare_tensors(a, b, "eq", kEq); }
Tensor ne(const Tensor& a, const Tensor& b) { return compare_tensors(a, b, "ne", kNe); }
Tensor lt(const Tensor& a, const Tensor& b) { return compare_tensors(a, b, "lt", kLt); }
Tensor le(const Tensor& a, const Tensor& b) { return compare_tensors(a, b, "le", kLe); }
Tensor gt(const Tensor& a, const Tensor& b) { return compare_tensors(a, b, "gt", kGt); }
Tensor ge(const Tensor& a, const Tensor& b) { return compare_tensors(a, b, "ge", kGe); }

Tensor logical_not(const Tensor& x) {
  check_bool(x, "logical_not", "input");
  Tensor out = empty(x.shape(), {.dtype = kBool});
  const bool* p = x.data<bool>();
  bool* q = out.data<bool>();
  const int64_t n = x.numel();
  for (int64_t i = 0; i < n; ++i) q[i] = !p[i];
  return out;
}

Tensor logical_and(const Tensor& a, const Tensor& b) {
  check_bool(a, "logical_and", "a");
  check_bool(b, "logical_and", "b");
  return compare_tensors(a, b, "logical_and", [](bool x, bool y) { return x && y; });
}

Tensor logical_or(const Tensor& a, const Tensor& b) {
  check_bool(a, "logical_or", "a");
  check_bool(b, "logical_or", "b");
  return compare_tensors(a, b, "logical_or", [](bool x, bool y) { return x || y; });
}

// ---------------------------------------------------------------------------------------------
// Embedding

namespace {

// The multi-index of flat element i of `shape`, e.g. [1, 2].
Shape unravel(int64_t i, const Shape& shape) {
  Shape idx(shape.size());
  for (size_t k = shape.size(); k-- > 0;) {
    idx[k] = i % shape[k];
    i /= shape[k];
  }
  return idx;
}

}  // namespace

// d embedding(w, idx)[r] = sum of g[i] over the positions i with idx[i] == r (none for padding_idx)
Tensor embedding(const Tensor& weight, const Tensor& indices, int64_t padding_idx) {
  ATTO_CHECK(weight.defined() && indices.defined(), "embedding", "called with an undefined tensor");
  ATTO_CHECK(indices.dtype() == kInt64, "embedding", "indices must be int64, got ", dtype_name(indices.dtype()),
             " of shape ", indices.shape());
  ATTO_CHECK(weight.dim() == 2, "embedding", "weight must be 2-D (num_embeddings, embedding_dim), got shape ",
             weight.shape());
  const int64_t num = weight.size(0), dim = weight.size(1);
  ATTO_CHECK(padding_idx < num, "embedding", "padding_idx ", padding_idx, " is out of range for num_embeddings ",
             num);
  const int64_t n = indices.numel();
  const int64_t* idx = indices.data<int64_t>();
  for (int64_t i = 0; i < n; ++i)
    ATTO_CHECK(idx[i] >= 0 && idx[i] < num, "embedding", "index ", idx[i], " at position ",
               unravel(i, indices.shape()), " of indices ", indices.shape(), " is out of range for num_embeddings ",
               num);
  Shape out_shape = indices.shape();
  out_shape.push_back(dim);
  Tensor out = empty(out_shape, {.dtype = weight.dtype()});
  dispatch_float(weight.dtype(), "embedding", [&]<typename T>() {
    const T* w = weight.data<T>();
    T* q = out.data<T>();
    for (int64_t i = 0; i < n; ++i) std::memcpy(q + i * dim, w + idx[i] * dim, static_cast<size_t>(dim) * sizeof(T));
  });
  if (!any_requires_grad({weight})) return out;
  Tensor saved = indices.detach();
  return record("embedding", out, {weight}, [saved, num, dim, padding_idx](const Tensor& g, GradInputs& gi) {
    Tensor gw = zeros({num, dim}, {.dtype = g.dtype()});
    const int64_t* ix = saved.data<int64_t>();
    const int64_t m = saved.numel();
    dispatch_float(g.dtype(), "embedding_backward", [&]<typename T>() {
      const T* pg = g.data<T>();
      T* q = gw.data<T>();
      for (int64_t i = 0; i < m; ++i) {
        if (ix[i] == padding_idx) continue;
        T* row = q + ix[i] * dim;
        const T* src = pg + i * dim;
        for (int64_t k = 0; k < dim; ++k) row[k] += src[k];
      }
    });
    gi[0] = gw;
  });
}

}  // namespace attograd
