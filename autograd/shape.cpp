// Shape ops. Views (reshape & co.) share storage; the rest copy with raw-pointer kernels that move
// bits of the element's size, so every dtype (float, int64, bool) goes through the same code.

#include "autograd/shape.h"

#include <algorithm>
#include <cstring>

#include "autograd/dims.h"
#include "autograd/strided.h"

namespace attograd {

namespace {

// Calls f.template operator()<U>() with U an unsigned integer of the dtype's element size.
template <class F>
void dispatch_bytes(Dtype d, F&& f) {
  switch (dtype_size(d)) {
    case 1:
      f.template operator()<uint8_t>();
      return;
    case 4:
      f.template operator()<uint32_t>();
      return;
    default:
      f.template operator()<uint64_t>();
      return;
  }
}

template <class U>
const U* cdata(const Tensor& t) {
  return static_cast<const U*>(t.const_raw_data());
}
template <class U>
U* mdata(const Tensor& t) {
  return static_cast<U*>(t.raw_data());
}

void check_defined(const Tensor& x, const char* op) { ATTO_CHECK(x.defined(), op, "called with an undefined tensor"); }

using detail::wrap_dim;

int64_t prod(const Shape& s, size_t begin, size_t end) {
  int64_t p = 1;
  for (size_t i = begin; i < end; ++i) p *= s[i];
  return p;
}

// A tensor sharing x's storage with a new shape (same number of elements), recorded as `name`.
Tensor make_view(const Tensor& x, Shape shape, const char* name) {
  auto t = std::make_shared<TensorImpl>();
  t->shape = std::move(shape);
  t->dtype = x.dtype();
  t->storage = x.impl()->storage;
  t->offset = x.impl()->offset;
  Tensor out(std::move(t));
  if (!any_requires_grad({x})) return out;
  Shape in_shape = x.shape();
  return record(name, out, {x}, [in_shape](const Tensor& g, GradInputs& gi) { gi[0] = reshape(g, in_shape); });
}

// ---------------------------------------------------------------------------------------------
// Permute kernel. Output dim i reads input dim perm[i]. Size-1 dims are dropped and dims that stay
// adjacent are merged, so (B, L, H, D) -> (B, H, L, D) copies runs of D, and (..., M, N) -> (..., N, M)
// becomes a blocked 2-D transpose per batch.

using detail::for_each_outer;
using detail::Run;

template <class U>
void permute_kernel(const U* in, U* out, const Shape& in_shape, const std::vector<int64_t>& perm) {
  const int64_t numel = shape_numel(in_shape);
  if (numel == 0) return;
  const size_t n = in_shape.size();
  std::vector<int64_t> st(n);
  for (size_t d = n, s = 1; d-- > 0;) {
    st[d] = static_cast<int64_t>(s);
    s *= static_cast<size_t>(in_shape[d]);
  }
  std::vector<Run> dims;
  for (int64_t p : perm) {
    if (in_shape[p] == 1) continue;
    Run r{in_shape[p], st[p]};
    if (!dims.empty() && dims.back().stride == r.size * r.stride) {
      dims.back().size *= r.size;
      dims.back().stride = r.stride;
    } else {
      dims.push_back(r);
    }
  }
  const size_t k = dims.size();
  if (k == 0 || (k == 1 && dims[0].stride == 1)) {
    std::memcpy(out, in, static_cast<size_t>(numel) * sizeof(U));
    return;
  }
  if (dims[k - 1].stride == 1) {  // contiguous runs
    const int64_t run = dims[k - 1].size;
    U* o = out;
    for_each_outer(dims, k - 1, [&](int64_t off) {
      std::memcpy(o, in + off, static_cast<size_t>(run) * sizeof(U));
      o += run;
    });
    return;
  }
  if (k >= 2 && dims[k - 2].stride == 1) {  // batched 2-D transpose: out[i, j] = in[i + j * s2]
    const int64_t n1 = dims[k - 2].size, n2 = dims[k - 1].size, s2 = dims[k - 1].stride;
    constexpr int64_t B = 32;
    U* o = out;
    for_each_outer(dims, k - 2, [&](int64_t off) {
      const U* p = in + off;
      for (int64_t ib = 0; ib < n1; ib += B) {
        const int64_t ie = std::min(ib + B, n1);
        for (int64_t jb = 0; jb < n2; jb += B) {
          const int64_t je = std::min(jb + B, n2);
          for (int64_t i = ib; i < ie; ++i) {
            U* orow = o + i * n2;
            const U* pcol = p + i;
            for (int64_t j = jb; j < je; ++j) orow[j] = pcol[j * s2];
          }
        }
      }
      o += n1 * n2;
    });
    return;
  }
  const int64_t len = dims[k - 1].size, s = dims[k - 1].stride;  // general strided gather
  U* o = out;
  for_each_outer(dims, k - 1, [&](int64_t off) {
    const U* p = in + off;
    for (int64_t j = 0; j < len; ++j) o[j] = p[j * s];
    o += len;
  });
}

// Copies x permuted (no recording).
Tensor permute_copy(const Tensor& x, const std::vector<int64_t>& perm) {
  Shape out_shape(perm.size());
  for (size_t i = 0; i < perm.size(); ++i) out_shape[i] = x.shape()[perm[i]];
  Tensor out = empty(out_shape, {.dtype = x.dtype()});
  dispatch_bytes(x.dtype(), [&]<typename U>() { permute_kernel(cdata<U>(x), mdata<U>(out), x.shape(), perm); });
  return out;
}

Tensor permute_recorded(const Tensor& x, const std::vector<int64_t>& perm, const char* name) {
  Tensor out = permute_copy(x, perm);
  if (!any_requires_grad({x})) return out;
  std::vector<int64_t> inv(perm.size());
  for (size_t i = 0; i < perm.size(); ++i) inv[perm[i]] = static_cast<int64_t>(i);
  return record(name, out, {x}, [inv](const Tensor& g, GradInputs& gi) { gi[0] = permute_copy(g, inv); });
}

// ---------------------------------------------------------------------------------------------
// Slice kernels over x viewed as (outer, n, inner): rows start, start+step, ... (len of them).

// Copies n elements; short runs by a loop (memcpy's call overhead dominates below a cache line).
template <class U>
inline void copy_run(U* dst, const U* src, int64_t n) {
  if (n * static_cast<int64_t>(sizeof(U)) >= 64) {
    std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(U));
  } else {
    for (int64_t i = 0; i < n; ++i) dst[i] = src[i];
  }
}

template <class U>
void slice_gather(const U* in, U* out, int64_t outer, int64_t n, int64_t inner, int64_t start, int64_t len,
                  int64_t step) {
  for (int64_t o = 0; o < outer; ++o) {
    const U* src = in + (o * n + start) * inner;
    U* dst = out + o * len * inner;
    if (step == 1) {
      std::memcpy(dst, src, static_cast<size_t>(len * inner) * sizeof(U));
    } else if (inner == 1) {
      for (int64_t k = 0; k < len; ++k) dst[k] = src[k * step];
    } else {
      for (int64_t k = 0; k < len; ++k) copy_run(dst + k * inner, src + k * step * inner, inner);
    }
  }
}

template <class U>
void slice_scatter(const U* in, U* out, int64_t outer, int64_t n, int64_t inner, int64_t start, int64_t len,
                   int64_t step) {
  for (int64_t o = 0; o < outer; ++o) {
    const U* src = in + o * len * inner;
    U* dst = out + (o * n + start) * inner;
    if (step == 1) {
      std::memcpy(dst, src, static_cast<size_t>(len * inner) * sizeof(U));
    } else if (inner == 1) {
      for (int64_t k = 0; k < len; ++k) dst[k * step] = src[k];
    } else {
      for (int64_t k = 0; k < len; ++k) copy_run(dst + k * step * inner, src + k * inner, inner);
    }
  }
}

// x[..., start::step][:len] along dim d (already validated) with the given output shape (which may
// drop dim d, for select).
Tensor slice_impl(const Tensor& x, int64_t d, int64_t start, int64_t len, int64_t step, Shape out_shape,
                  const char* name) {
  const Shape& s = x.shape();
  const int64_t outer = prod(s, 0, d), n = s[d], inner = prod(s, d + 1, s.size());
  Tensor out = empty(out_shape, {.dtype = x.dtype()});
  if (len > 0 && outer > 0 && inner > 0)
    dispatch_bytes(x.dtype(),
                   [&]<typename U>() { slice_gather(cdata<U>(x), mdata<U>(out), outer, n, inner, start, len, step); });
  if (!any_requires_grad({x})) return out;
  Shape in_shape = s;
  return record(name, out, {x}, [in_shape, outer, n, inner, start, len, step](const Tensor& g, GradInputs& gi) {
    Tensor gx = zeros(in_shape, {.dtype = g.dtype()});
    if (len > 0 && outer > 0 && inner > 0)
      dispatch_bytes(g.dtype(), [&]<typename U>() {
        slice_scatter(cdata<U>(g), mdata<U>(gx), outer, n, inner, start, len, step);
      });
    gi[0] = gx;
  });
}

// ---------------------------------------------------------------------------------------------
// Concatenation of pieces laid out as (outer, lens[i], inner) into (outer, sum(lens), inner).
// stack uses it with lens all 1 and an output shape that has the new dimension.

Tensor cat_impl(const std::vector<Tensor>& ts, const Shape& out_shape, int64_t d, const std::vector<int64_t>& lens,
                const char* name) {
  const int64_t outer = prod(out_shape, 0, d), total = out_shape[d], inner = prod(out_shape, d + 1, out_shape.size());
  Tensor out = empty(out_shape, {.dtype = ts[0].dtype()});
  dispatch_bytes(out.dtype(), [&]<typename U>() {
    U* o = mdata<U>(out);
    std::vector<const U*> src(ts.size());
    for (size_t i = 0; i < ts.size(); ++i) src[i] = cdata<U>(ts[i]);
    for (int64_t r = 0; r < outer; ++r) {
      for (size_t i = 0; i < ts.size(); ++i) {
        const int64_t chunk = lens[i] * inner;
        std::memcpy(o, src[i] + r * chunk, static_cast<size_t>(chunk) * sizeof(U));
        o += chunk;
      }
    }
  });
  bool any = false;
  for (const Tensor& t : ts) any = any || t.requires_grad();
  if (!any || !is_grad_enabled()) return out;
  std::vector<Shape> in_shapes(ts.size());
  for (size_t i = 0; i < ts.size(); ++i) in_shapes[i] = ts[i].shape();
  return record(name, out, ts, [in_shapes, lens, outer, total, inner](const Tensor& g, GradInputs& gi) {
    int64_t start = 0;
    for (size_t i = 0; i < in_shapes.size(); ++i) {
      if (gi.needs(i)) {
        Tensor gx = empty(in_shapes[i], {.dtype = g.dtype()});
        if (outer > 0 && inner > 0 && lens[i] > 0)
          dispatch_bytes(g.dtype(), [&]<typename U>() {
            slice_gather(cdata<U>(g), mdata<U>(gx), outer, total, inner, start, lens[i], 1);
          });
        gi[i] = gx;
      }
      start += lens[i];
    }
  });
}

void check_list(const std::vector<Tensor>& ts, const char* op) {
  ATTO_CHECK(!ts.empty(), op, "expected a non-empty list of tensors");
  for (size_t i = 0; i < ts.size(); ++i) {
    ATTO_CHECK(ts[i].defined(), op, "tensor ", i, " is undefined");
    ATTO_CHECK(ts[i].dtype() == ts[0].dtype(), op, "tensor ", i, " has dtype ", dtype_name(ts[i].dtype()),
               " and shape ", ts[i].shape(), " but tensor 0 has dtype ", dtype_name(ts[0].dtype()),
               "; all tensors must have the same dtype");
  }
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Views

namespace {
Tensor reshape_impl(const Tensor& x, const Shape& shape, const char* op) {
  check_defined(x, op);
  Shape out = shape;
  int64_t infer = -1, known = 1;
  for (size_t i = 0; i < out.size(); ++i) {
    if (out[i] == -1) {
      ATTO_CHECK(infer < 0, op, "only one dimension can be -1, got shape ", shape, " for input of shape ", x.shape());
      infer = static_cast<int64_t>(i);
    } else {
      ATTO_CHECK(out[i] >= 0, op, "invalid size ", out[i], " in shape ", shape, " for input of shape ", x.shape());
      known *= out[i];
    }
  }
  const int64_t numel = x.numel();
  if (infer >= 0) {
    ATTO_CHECK(known != 0, op, "cannot reshape input of shape ", x.shape(), " into shape ", shape,
               ": the size of the -1 dimension is ambiguous when the other sizes multiply to 0");
    ATTO_CHECK(numel % known == 0, op, "shape ", shape, " is invalid for input of shape ", x.shape(), " (", numel,
               " elements)");
    out[infer] = numel / known;
  } else {
    ATTO_CHECK(known == numel, op, "shape ", shape, " (", known, " elements) is invalid for input of shape ", x.shape(),
               " (", numel, " elements)");
  }
  return make_view(x, std::move(out), op);
}
}  // namespace

Tensor reshape(const Tensor& x, const Shape& shape) { return reshape_impl(x, shape, "reshape"); }

Tensor view(const Tensor& x, const Shape& shape) { return reshape_impl(x, shape, "view"); }

Tensor flatten(const Tensor& x, int64_t start_dim, int64_t end_dim) {
  check_defined(x, "flatten");
  const Shape& s = x.shape();
  if (s.empty()) {
    wrap_dim(start_dim, 1, s, "flatten");
    wrap_dim(end_dim, 1, s, "flatten");
    return make_view(x, {1}, "flatten");
  }
  const int64_t n = x.dim();
  const int64_t a = wrap_dim(start_dim, n, s, "flatten"), b = wrap_dim(end_dim, n, s, "flatten");
  ATTO_CHECK(a <= b, "flatten", "start_dim ", start_dim, " comes after end_dim ", end_dim, " for shape ", s);
  Shape out(s.begin(), s.begin() + a);
  out.push_back(prod(s, a, b + 1));
  out.insert(out.end(), s.begin() + b + 1, s.end());
  return make_view(x, std::move(out), "flatten");
}

Tensor unsqueeze(const Tensor& x, int64_t dim) {
  check_defined(x, "unsqueeze");
  const int64_t d = wrap_dim(dim, x.dim() + 1, x.shape(), "unsqueeze");
  Shape out = x.shape();
  out.insert(out.begin() + d, 1);
  return make_view(x, std::move(out), "unsqueeze");
}

Tensor squeeze(const Tensor& x, int64_t dim) {
  check_defined(x, "squeeze");
  if (x.dim() == 0) {
    wrap_dim(dim, 1, x.shape(), "squeeze");
    return make_view(x, {}, "squeeze");
  }
  const int64_t d = wrap_dim(dim, x.dim(), x.shape(), "squeeze");
  Shape out = x.shape();
  if (out[d] == 1) out.erase(out.begin() + d);
  return make_view(x, std::move(out), "squeeze");
}

Tensor squeeze(const Tensor& x) {
  check_defined(x, "squeeze");
  Shape out;
  for (int64_t s : x.shape())
    if (s != 1) out.push_back(s);
  return make_view(x, std::move(out), "squeeze");
}

// ---------------------------------------------------------------------------------------------
// Transpose and permute. Backward applies the inverse permutation to the gradient.

Tensor transpose(const Tensor& x, int64_t dim0, int64_t dim1) {
  check_defined(x, "transpose");
  const int64_t n = x.dim();
  if (n == 0) {
    wrap_dim(dim0, 1, x.shape(), "transpose");
    wrap_dim(dim1, 1, x.shape(), "transpose");
    return permute_recorded(x, {}, "transpose");
  }
  const int64_t a = wrap_dim(dim0, n, x.shape(), "transpose"), b = wrap_dim(dim1, n, x.shape(), "transpose");
  std::vector<int64_t> perm(n);
  for (int64_t i = 0; i < n; ++i) perm[i] = i;
  std::swap(perm[a], perm[b]);
  return permute_recorded(x, perm, "transpose");
}

Tensor permute(const Tensor& x, const std::vector<int64_t>& dims) {
  check_defined(x, "permute");
  const int64_t n = x.dim();
  ATTO_CHECK(static_cast<int64_t>(dims.size()) == n, "permute", "dims ", dims, " has ", dims.size(),
             " entries but the input of shape ", x.shape(), " has ", n, " dimensions");
  std::vector<int64_t> perm(n);
  std::vector<bool> seen(n, false);
  for (int64_t i = 0; i < n; ++i) {
    perm[i] = wrap_dim(dims[i], n, x.shape(), "permute");
    ATTO_CHECK(!seen[perm[i]], "permute", "dims ", dims, " is not a permutation: dimension ", perm[i],
               " appears more than once (input shape ", x.shape(), ")");
    seen[perm[i]] = true;
  }
  return permute_recorded(x, perm, "permute");
}

// ---------------------------------------------------------------------------------------------
// Slicing. Backward scatters the gradient into zeros of the input's shape.

Tensor slice(const Tensor& x, int64_t dim, int64_t start, int64_t end, int64_t step) {
  check_defined(x, "slice");
  ATTO_CHECK(x.dim() > 0, "slice", "cannot slice a 0-d tensor");
  const int64_t d = wrap_dim(dim, x.dim(), x.shape(), "slice");
  ATTO_CHECK(step > 0, "slice", "step must be positive, got ", step, " (input shape ", x.shape(), ")");
  const int64_t n = x.shape()[d];
  if (start < 0) start += n;
  if (end < 0) end += n;
  start = std::clamp<int64_t>(start, 0, n);
  end = std::clamp<int64_t>(end, start, n);
  const int64_t len = (end - start + step - 1) / step;
  Shape out = x.shape();
  out[d] = len;
  return slice_impl(x, d, start, len, step, std::move(out), "slice");
}

Tensor narrow(const Tensor& x, int64_t dim, int64_t start, int64_t length) {
  check_defined(x, "narrow");
  ATTO_CHECK(x.dim() > 0, "narrow", "cannot narrow a 0-d tensor");
  const int64_t d = wrap_dim(dim, x.dim(), x.shape(), "narrow");
  const int64_t n = x.shape()[d];
  ATTO_CHECK(start >= -n && start <= n, "narrow", "start ", start, " out of range for dimension ", dim, " of size ", n,
             " (shape ", x.shape(), ")");
  if (start < 0) start += n;
  ATTO_CHECK(length >= 0 && start + length <= n, "narrow", "start (", start, ") + length (", length,
             ") exceeds dimension ", dim, " of size ", n, " (shape ", x.shape(), ")");
  Shape out = x.shape();
  out[d] = length;
  return slice_impl(x, d, start, length, 1, std::move(out), "narrow");
}

Tensor select(const Tensor& x, int64_t dim, int64_t index) {
  check_defined(x, "select");
  ATTO_CHECK(x.dim() > 0, "select", "cannot select from a 0-d tensor");
  const int64_t d = wrap_dim(dim, x.dim(), x.shape(), "select");
  const int64_t n = x.shape()[d];
  ATTO_CHECK(index >= -n && index < n, "select", "index ", index, " out of range for dimension ", dim, " of size ", n,
             " (shape ", x.shape(), ")");
  if (index < 0) index += n;
  Shape out = x.shape();
  out.erase(out.begin() + d);
  return slice_impl(x, d, index, 1, 1, std::move(out), "select");
}

// ---------------------------------------------------------------------------------------------
// Concatenation. Backward copies each input's block of the gradient.

Tensor cat(const std::vector<Tensor>& tensors, int64_t dim) {
  check_list(tensors, "cat");
  const Shape& s0 = tensors[0].shape();
  ATTO_CHECK(!s0.empty(), "cat", "zero-dimensional tensor 0 cannot be concatenated");
  const int64_t n = static_cast<int64_t>(s0.size());
  const int64_t d = wrap_dim(dim, n, s0, "cat");
  std::vector<int64_t> lens(tensors.size());
  Shape out = s0;
  out[d] = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const Shape& s = tensors[i].shape();
    bool ok = static_cast<int64_t>(s.size()) == n;
    for (int64_t k = 0; ok && k < n; ++k) ok = k == d || s[k] == s0[k];
    ATTO_CHECK(ok, "cat", "tensor ", i, " has shape ", s, " but tensor 0 has shape ", s0,
               ": sizes must match except in dimension ", dim);
    lens[i] = s[d];
    out[d] += s[d];
  }
  return cat_impl(tensors, out, d, lens, "cat");
}

Tensor stack(const std::vector<Tensor>& tensors, int64_t dim) {
  check_list(tensors, "stack");
  const Shape& s0 = tensors[0].shape();
  for (size_t i = 0; i < tensors.size(); ++i)
    ATTO_CHECK(tensors[i].shape() == s0, "stack", "tensor ", i, " has shape ", tensors[i].shape(),
               " but tensor 0 has shape ", s0, ": all tensors must have the same shape");
  const int64_t d = wrap_dim(dim, static_cast<int64_t>(s0.size()) + 1, s0, "stack");
  Shape out = s0;
  out.insert(out.begin() + d, static_cast<int64_t>(tensors.size()));
  return cat_impl(tensors, out, d, std::vector<int64_t>(tensors.size(), 1), "stack");
}

// ---------------------------------------------------------------------------------------------
// Splitting: each piece is a narrow of the input, with its own backward.

std::vector<Tensor> split(const Tensor& x, const std::vector<int64_t>& sizes, int64_t dim) {
  check_defined(x, "split");
  ATTO_CHECK(x.dim() > 0, "split", "cannot split a 0-d tensor");
  const int64_t d = wrap_dim(dim, x.dim(), x.shape(), "split");
  const int64_t n = x.shape()[d];
  int64_t total = 0;
  for (int64_t s : sizes) {
    ATTO_CHECK(s >= 0, "split", "split sizes ", sizes, " contain the negative size ", s);
    total += s;
  }
  ATTO_CHECK(total == n, "split", "split sizes ", sizes, " sum to ", total, " but dimension ", dim,
             " of the input of shape ", x.shape(), " has size ", n);
  std::vector<Tensor> out;
  out.reserve(sizes.size());
  int64_t start = 0;
  for (int64_t s : sizes) {
    Shape shape = x.shape();
    shape[d] = s;
    out.push_back(slice_impl(x, d, start, s, 1, std::move(shape), "split"));
    start += s;
  }
  return out;
}

std::vector<Tensor> split(const Tensor& x, int64_t split_size, int64_t dim) {
  check_defined(x, "split");
  ATTO_CHECK(x.dim() > 0, "split", "cannot split a 0-d tensor");
  const int64_t d = wrap_dim(dim, x.dim(), x.shape(), "split");
  const int64_t n = x.shape()[d];
  ATTO_CHECK(split_size > 0, "split", "split_size must be positive, got ", split_size, " (input shape ", x.shape(),
             ")");
  std::vector<int64_t> sizes;
  for (int64_t start = 0; start < n; start += split_size) sizes.push_back(std::min(split_size, n - start));
  if (sizes.empty()) sizes.push_back(0);
  return split(x, sizes, d);
}

std::vector<Tensor> chunk(const Tensor& x, int64_t chunks, int64_t dim) {
  check_defined(x, "chunk");
  ATTO_CHECK(chunks > 0, "chunk", "number of chunks must be positive, got ", chunks);
  ATTO_CHECK(x.dim() > 0, "chunk", "cannot chunk a 0-d tensor");
  const int64_t d = wrap_dim(dim, x.dim(), x.shape(), "chunk");
  const int64_t n = x.shape()[d];
  if (n == 0) return split(x, std::vector<int64_t>(chunks, 0), d);  // PyTorch: `chunks` empty pieces
  return split(x, (n + chunks - 1) / chunks, d);
}

}  // namespace attograd
