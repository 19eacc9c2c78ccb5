// Reductions. The reduced dims are coalesced into alternating kept/reduced groups, and each reduced
// group is summed as a (outer, R, inner) block: rows (inner == 1) by a pairwise sum, columns
// (inner > 1) by a pairwise sum over blocks of rows with a vectorisable inner loop. Float32 sums
// stay in float; pairwise summation keeps the error O(log n) instead of O(n).

#include "autograd/reduce.h"

#include <Eigen/Core>
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "autograd/dims.h"
#include "autograd/strided.h"

namespace attograd {

namespace {

struct Group {
  int64_t size;
  bool reduced;
};

using detail::for_each_outer;
using detail::Run;

using detail::wrap_dim;

// Which dims of x are reduced; validates range and duplicates. A 0-d tensor accepts dim 0 / -1.
std::vector<bool> reduce_mask(const Tensor& x, const std::vector<int64_t>& dims, const char* op) {
  ATTO_CHECK(x.defined(), op, "called with an undefined tensor");
  const int64_t n = x.dim();
  std::vector<bool> m(n, dims.empty());
  bool scalar_seen = false;  // a 0-d tensor has no mask entry; it still rejects {0, -1}
  for (int64_t d : dims) {
    const int64_t w = wrap_dim(d, std::max<int64_t>(n, 1), x.shape(), op);
    bool dup = n == 0 ? scalar_seen : static_cast<bool>(m[w]);
    ATTO_CHECK(!dup, op, "dim ", d, " appears more than once in dims ", dims, " (input shape ", x.shape(), ")");
    if (n == 0)
      scalar_seen = true;
    else
      m[w] = true;
  }
  return m;
}

Shape reduced_shape(const Shape& s, const std::vector<bool>& m, bool keepdim) {
  Shape out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (!m[i])
      out.push_back(s[i]);
    else if (keepdim)
      out.push_back(1);
  }
  return out;
}

// Alternating kept/reduced groups of adjacent dims, size-1 dims dropped (numel > 0).
std::vector<Group> coalesce(const Shape& s, const std::vector<bool>& m) {
  std::vector<Group> g;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == 1) continue;
    if (!g.empty() && g.back().reduced == m[i])
      g.back().size *= s[i];
    else
      g.push_back({s[i], m[i]});
  }
  return g;
}

template <class T>
using ConstVec = Eigen::Map<const Eigen::Array<T, Eigen::Dynamic, 1>>;

// Pairwise sum: blocks of up to 256 summed by Eigen (vectorised, several accumulators), halves
// added, so the rounding error grows with log(n) rather than n.
template <class T>
T pairwise_sum(const T* p, int64_t n) {
  if (n <= 256) return n == 0 ? T(0) : ConstVec<T>(p, static_cast<Eigen::Index>(n)).sum();
  const int64_t h = (n / 2) & ~int64_t{15};
  return pairwise_sum(p, h) + pairwise_sum(p + h, n - h);
}

constexpr int64_t kRowBlock = 32;

// Number of scratch rows column_sum needs for R rows.
int64_t column_levels(int64_t R) {
  int64_t levels = 1;
  for (int64_t r = R; r > kRowBlock; r = (r + 1) / 2) ++levels;
  return levels;
}

// dst[j] = sum_i p[i * inner + j] for R >= 1 rows: direct below kRowBlock rows, else both halves
// (the second into scratch) and then added.
template <class T>
void column_sum(const T* p, int64_t R, int64_t inner, T* dst, T* scratch) {
  if (R <= kRowBlock) {
    std::memcpy(dst, p, static_cast<size_t>(inner) * sizeof(T));
    for (int64_t i = 1; i < R; ++i) {
      const T* row = p + i * inner;
      for (int64_t j = 0; j < inner; ++j) dst[j] += row[j];
    }
    return;
  }
  const int64_t h = R / 2;
  column_sum(p, h, inner, dst, scratch);
  column_sum(p + h * inner, R - h, inner, scratch, scratch + inner);
  for (int64_t j = 0; j < inner; ++j) dst[j] += scratch[j];
}

// out[o, j] = sum_r in[o, r, j].
template <class T>
void reduce3(const T* in, T* out, int64_t outer, int64_t R, int64_t inner) {
  if (inner == 1) {
    for (int64_t o = 0; o < outer; ++o) out[o] = pairwise_sum(in + o * R, R);
    return;
  }
  std::vector<T> scratch(static_cast<size_t>(inner * column_levels(R)));
  for (int64_t o = 0; o < outer; ++o) column_sum(in + o * R * inner, R, inner, out + o * inner, scratch.data());
}

// Sums the reduced dims of `in` (shape s, numel > 0) into `out`, one reduced group at a time from
// the last one.
template <class T>
void sum_kernel(const T* in, T* out, const Shape& s, const std::vector<bool>& m) {
  std::vector<Group> g = coalesce(s, m);
  auto last_reduced = [&]() -> int64_t {
    for (size_t k = g.size(); k-- > 0;)
      if (g[k].reduced) return static_cast<int64_t>(k);
    return -1;
  };
  int64_t k = last_reduced();
  if (k < 0) {
    std::memcpy(out, in, static_cast<size_t>(shape_numel(s)) * sizeof(T));
    return;
  }
  std::vector<T> buf[2];
  const T* cur = in;
  while (k >= 0) {
    int64_t outer = 1, inner = 1;
    for (int64_t i = 0; i < k; ++i) outer *= g[i].size;
    for (size_t i = k + 1; i < g.size(); ++i) inner *= g[i].size;
    const int64_t R = g[k].size;
    g.erase(g.begin() + k);
    if (k > 0 && k < static_cast<int64_t>(g.size())) {  // merge the two kept neighbours
      g[k - 1].size *= g[k].size;
      g.erase(g.begin() + k);
    }
    const int64_t next = last_reduced();
    T* dst = out;
    if (next >= 0) {
      std::vector<T>& b = (cur == buf[0].data() && !buf[0].empty()) ? buf[1] : buf[0];
      b.resize(static_cast<size_t>(outer * inner));
      dst = b.data();
    }
    reduce3(cur, dst, outer, R, inner);
    cur = dst;
    k = next;
  }
}

// out (shape s, numel > 0) = g broadcast over the reduced dims, times scale.
template <class T>
void expand_kernel(const T* g, T* out, const Shape& s, const std::vector<bool>& m, T scale) {
  std::vector<Group> groups = coalesce(s, m);
  if (groups.empty()) {
    out[0] = g[0] * scale;
    return;
  }
  std::vector<Run> runs(groups.size());
  int64_t gs = 1;
  for (size_t k = groups.size(); k-- > 0;) {
    runs[k] = {groups[k].size, groups[k].reduced ? 0 : gs};
    if (!groups[k].reduced) gs *= groups[k].size;
  }
  const Group last = groups.back();
  T* o = out;
  for_each_outer(runs, runs.size() - 1, [&](int64_t off) {
    if (last.reduced) {
      std::fill(o, o + last.size, g[off] * scale);
    } else {
      const T* p = g + off;
      for (int64_t j = 0; j < last.size; ++j) o[j] = p[j] * scale;
    }
    o += last.size;
  });
}

Tensor sum_mean(const Tensor& x, const std::vector<bool>& m, bool keepdim, bool is_mean, const char* name) {
  const Shape& s = x.shape();
  Shape out_shape = reduced_shape(s, m, keepdim);
  int64_t count = 1;
  for (size_t i = 0; i < s.size(); ++i)
    if (m[i]) count *= s[i];
  Tensor out = empty(out_shape, {.dtype = x.dtype()});
  dispatch_float(x.dtype(), name, [&]<typename T>() {
    T* q = out.data<T>();
    const int64_t n_out = out.numel();
    if (x.numel() == 0) {
      std::fill(q, q + n_out, T(0));
    } else {
      sum_kernel(x.data<T>(), q, s, m);
    }
    if (is_mean)
      for (int64_t i = 0; i < n_out; ++i) q[i] /= static_cast<T>(count);
  });
  if (!any_requires_grad({x})) return out;
  const double scale = is_mean ? 1.0 / static_cast<double>(count) : 1.0;
  // d sum / dx = broadcast(g); d mean / dx = broadcast(g) / count.
  return record(name, out, {x}, [s, m, scale](const Tensor& g, GradInputs& gi) {
    Tensor gx = empty(s, {.dtype = g.dtype()});
    if (gx.numel() > 0)
      dispatch_float(g.dtype(), "sum_backward",
                     [&]<typename T>() { expand_kernel(g.data<T>(), gx.data<T>(), s, m, static_cast<T>(scale)); });
    gi[0] = gx;
  });
}

// True when v should replace best as the running maximum: larger, or the first NaN (NaN propagates).
template <class T>
inline bool beats(T v, T best) {
  return v > best || (v != v && best == best);
}

// Index of the first maximum of p[0, n) (n >= 1); the first NaN wins if there is one.
template <class T>
int64_t row_argmax(const T* p, int64_t n) {
  constexpr int64_t B = 64;
  if (n >= 2 * B) {
    // Fast path for finite rows: vectorised block maxima, then a scan of the first block that
    // attains the maximum. (v - v) sums to NaN exactly when the row holds a NaN or an infinity.
    T best = p[0], finite = 0;
    int64_t best_block = 0;
    for (int64_t b = 0; b < n; b += B) {
      ConstVec<T> seg(p + b, static_cast<Eigen::Index>(std::min(B, n - b)));
      finite += (seg - seg).sum();
      const T m = seg.maxCoeff();
      if (m > best) {
        best = m;
        best_block = b;
      }
    }
    if (finite == 0) {
      int64_t i = best_block;
      while (p[i] != best) ++i;
      return i;
    }
  }
  T best = p[0];
  int64_t bi = 0;
  for (int64_t r = 1; r < n; ++r)
    if (beats(p[r], best)) {
      best = p[r];
      bi = r;
    }
  return bi;
}

// vals[o, j] = max_r in[o, r, j], idx = first r attaining it (R >= 1).
template <class T>
void max_kernel(const T* in, T* vals, int64_t* idx, int64_t outer, int64_t R, int64_t inner) {
  for (int64_t o = 0; o < outer; ++o) {
    const T* p = in + o * R * inner;
    T* v = vals + o * inner;
    int64_t* ix = idx + o * inner;
    if (inner == 1) {
      *ix = row_argmax(p, R);
      *v = p[*ix];
      continue;
    }
    std::memcpy(v, p, static_cast<size_t>(inner) * sizeof(T));
    std::fill(ix, ix + inner, int64_t{0});
    for (int64_t r = 1; r < R; ++r) {
      const T* row = p + r * inner;
      for (int64_t j = 0; j < inner; ++j)
        if (beats(row[j], v[j])) {
          v[j] = row[j];
          ix[j] = r;
        }
    }
  }
}

struct MaxDim {
  MaxResult result;
  int64_t outer, R, inner;
};

MaxDim max_dim_impl(const Tensor& x, int64_t dim, bool keepdim, const char* op) {
  ATTO_CHECK(x.defined(), op, "called with an undefined tensor");
  const int64_t n = x.dim();
  const Shape s = n == 0 ? Shape{1} : x.shape();
  const int64_t d = wrap_dim(dim, std::max<int64_t>(n, 1), x.shape(), op);
  const int64_t R = s[d];
  ATTO_CHECK(R > 0, op, "cannot take the max over dimension ", dim, " of size 0 (input shape ", x.shape(),
             "): the reduction has no identity");
  int64_t outer = 1, inner = 1;
  for (int64_t i = 0; i < d; ++i) outer *= s[i];
  for (size_t i = d + 1; i < s.size(); ++i) inner *= s[i];
  Shape out_shape;
  if (n > 0) {
    out_shape = s;
    if (keepdim)
      out_shape[d] = 1;
    else
      out_shape.erase(out_shape.begin() + d);
  }
  MaxDim r{{empty(out_shape, {.dtype = x.dtype()}), empty(out_shape, {.dtype = kInt64})}, outer, R, inner};
  dispatch_float(x.dtype(), op, [&]<typename T>() {
    max_kernel(x.data<T>(), r.result.values.data<T>(), r.result.indices.data<int64_t>(), outer, R, inner);
  });
  return r;
}

// Flat index of the first maximum (numel > 0).
int64_t argmax_flat(const Tensor& x, const char* op) {
  ATTO_CHECK(x.defined(), op, "called with an undefined tensor");
  ATTO_CHECK(x.numel() > 0, op, "cannot take the max of an empty tensor of shape ", x.shape());
  return dispatch_float(x.dtype(), op, [&]<typename T>() { return row_argmax(x.data<T>(), x.numel()); });
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// sum / mean

Tensor sum(const Tensor& x) {
  ATTO_CHECK(x.defined(), "sum", "called with an undefined tensor");
  return sum_mean(x, std::vector<bool>(x.dim(), true), false, false, "sum");
}

Tensor sum(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim) {
  return sum_mean(x, reduce_mask(x, dims, "sum"), keepdim, false, "sum");
}

Tensor mean(const Tensor& x) {
  ATTO_CHECK(x.defined(), "mean", "called with an undefined tensor");
  return sum_mean(x, std::vector<bool>(x.dim(), true), false, true, "mean");
}

Tensor mean(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim) {
  return sum_mean(x, reduce_mask(x, dims, "mean"), keepdim, true, "mean");
}

// ---------------------------------------------------------------------------------------------
// max / argmax. Backward puts g at the index of the (first) maximum, zeros elsewhere.

MaxResult max(const Tensor& x, int64_t dim, bool keepdim) {
  MaxDim r = max_dim_impl(x, dim, keepdim, "max");
  if (!any_requires_grad({x})) return r.result;
  Shape in_shape = x.shape();
  Tensor idx = r.result.indices.detach();
  const int64_t outer = r.outer, R = r.R, inner = r.inner;
  r.result.values =
      record("max", r.result.values, {x}, [in_shape, idx, outer, R, inner](const Tensor& g, GradInputs& gi) {
        Tensor gx = zeros(in_shape, {.dtype = g.dtype()});
        dispatch_float(g.dtype(), "max_backward", [&]<typename T>() {
          const T* pg = g.data<T>();
          const int64_t* pi = idx.data<int64_t>();
          T* q = gx.data<T>();
          for (int64_t o = 0; o < outer; ++o)
            for (int64_t j = 0; j < inner; ++j) q[(o * R + pi[o * inner + j]) * inner + j] = pg[o * inner + j];
        });
        gi[0] = gx;
      });
  return r.result;
}

Tensor max(const Tensor& x) {
  const int64_t at = argmax_flat(x, "max");
  Tensor out = empty({}, {.dtype = x.dtype()});
  dispatch_float(x.dtype(), "max", [&]<typename T>() { out.data<T>()[0] = x.data<T>()[at]; });
  if (!any_requires_grad({x})) return out;
  Shape in_shape = x.shape();
  return record("max", out, {x}, [in_shape, at](const Tensor& g, GradInputs& gi) {
    Tensor gx = zeros(in_shape, {.dtype = g.dtype()});
    dispatch_float(g.dtype(), "max_backward", [&]<typename T>() { gx.data<T>()[at] = g.data<T>()[0]; });
    gi[0] = gx;
  });
}

Tensor argmax(const Tensor& x, int64_t dim, bool keepdim) {
  return max_dim_impl(x, dim, keepdim, "argmax").result.indices;
}

Tensor argmax(const Tensor& x) {
  const int64_t at = argmax_flat(x, "argmax");
  Tensor out = empty({}, {.dtype = kInt64});
  out.data<int64_t>()[0] = at;
  return out;
}

}  // namespace attograd
