#include "autograd/matmul.h"

#include <algorithm>
#include <memory>
#include <type_traits>

#include "autograd/autocast.h"
#include "autograd/elementwise.h"
#include "autograd/gemm.h"
#include "autograd/parallel.h"

namespace attograd {

using detail::operand;

namespace {

// The ops' products: detail::gemm, or detail::gemm_bf16 for a float32 op recorded under autocast (bf16 = true).
template <class T>
void gemm(bool bf16, int64_t m, int64_t n, int64_t k, detail::GemmOperand<T> a, detail::GemmOperand<T> b, T* c,
          int64_t ldc, bool accumulate, T alpha = T(1), bool parallel = true, const T* bias = nullptr) {
  if constexpr (std::is_same_v<T, float>)
    if (bf16) return detail::gemm_bf16(m, n, k, a, b, c, ldc, accumulate, alpha, parallel, bias);
  detail::gemm(m, n, k, a, b, c, ldc, accumulate, alpha, parallel, bias);
}

// True when a float32 op runs its products in bfloat16 (autocast is on).
bool autocast_bf16(const Tensor& x) { return x.dtype() == kFloat32 && autocast_precision() == Precision::bfloat16; }

// How matmul(a, b) runs: the shapes of its matrices and which matrix of a and b each output batch uses.
struct MatmulPlan {
  Shape out_shape;  // final result shape (promoted 1-D dims removed)
  int64_t m = 0, k = 0, n = 0;
  int64_t batch = 1;    // output batch count (product of the broadcast batch dims)
  int64_t a_batch = 1;  // number of (m, k) matrices in a
  int64_t b_batch = 1;  // number of (k, n) matrices in b
  bool folded = false;  // b is one matrix: every row of a goes through one (a_batch * m, k) x (k, n) GEMM
  std::vector<int64_t> a_index, b_index;  // batched mode: matrix of a / b used by output batch j
};

MatmulPlan plan_matmul(const Shape& sa, const Shape& sb) {
  ATTO_CHECK(!sa.empty() && !sb.empty(), "matmul", "both arguments must be at least 1-D, got shapes ", sa, " and ", sb);
  MatmulPlan p;
  // Promote 1-D operands: a (k) -> (1, k), b (k) -> (k, 1).
  Shape a = sa.size() == 1 ? Shape{1, sa[0]} : sa;
  Shape b = sb.size() == 1 ? Shape{sb[0], 1} : sb;
  p.m = a[a.size() - 2];
  p.k = a[a.size() - 1];
  p.n = b[b.size() - 1];
  const int64_t kb = b[b.size() - 2];
  ATTO_CHECK(p.k == kb, "matmul", "shapes ", sa, " and ", sb, " cannot be multiplied (inner sizes ", p.k, " and ", kb,
             " differ)");

  // Broadcast the batch dimensions (all but the last two), aligned from the right.
  const Shape ab(a.begin(), a.end() - 2), bb(b.begin(), b.end() - 2);
  const size_t r = std::max(ab.size(), bb.size());
  Shape batch(r);
  for (size_t i = 0; i < r; ++i) {
    const int64_t da = i < r - ab.size() ? 1 : ab[i - (r - ab.size())];
    const int64_t db = i < r - bb.size() ? 1 : bb[i - (r - bb.size())];
    ATTO_CHECK(da == db || da == 1 || db == 1, "matmul", "batch dimensions ", ab, " of ", sa, " and ", bb, " of ", sb,
               " cannot be broadcast (dimension ", i, ": ", da, " vs ", db, ")");
    batch[i] = da == 1 ? db : da;
  }
  p.batch = shape_numel(batch);
  p.a_batch = shape_numel(ab);
  p.b_batch = shape_numel(bb);

  p.out_shape = batch;
  if (sa.size() > 1) p.out_shape.push_back(p.m);
  if (sb.size() > 1) p.out_shape.push_back(p.n);

  // b a single matrix (its batch dims, if any, all 1): a's matrices are consecutive rows in the output.
  p.folded = p.b_batch == 1 && p.a_batch == p.batch;
  if (p.folded) return p;

  // Batched mode: for every output batch index, the matrix index in a and in b (stride 0 where broadcast).
  std::vector<int64_t> stride_a(r, 0), stride_b(r, 0);
  for (int64_t i = static_cast<int64_t>(r) - 1, s_a = 1, s_b = 1; i >= 0; --i) {
    const size_t u = static_cast<size_t>(i);
    const size_t ia = u + ab.size() - r, ib = u + bb.size() - r;  // wraps (unused) when out of range
    if (u >= r - ab.size()) {
      stride_a[u] = ab[ia] == 1 ? 0 : s_a;
      s_a *= ab[ia];
    }
    if (u >= r - bb.size()) {
      stride_b[u] = bb[ib] == 1 ? 0 : s_b;
      s_b *= bb[ib];
    }
  }
  p.a_index.resize(static_cast<size_t>(p.batch));
  p.b_index.resize(static_cast<size_t>(p.batch));
  std::vector<int64_t> idx(r, 0);
  int64_t oa = 0, ob = 0;
  for (int64_t j = 0; j < p.batch; ++j) {
    p.a_index[static_cast<size_t>(j)] = oa;
    p.b_index[static_cast<size_t>(j)] = ob;
    for (size_t d = r; d-- > 0;) {  // advance the row-major counter over the batch dims
      ++idx[d];
      oa += stride_a[d];
      ob += stride_b[d];
      if (idx[d] < batch[d]) break;
      oa -= stride_a[d] * batch[d];
      ob -= stride_b[d] * batch[d];
      idx[d] = 0;
    }
  }
  return p;
}

// Calls f(j, parallel_inside) for every output batch j: the batches split between threads when there are
// enough of them (each product then serial), otherwise one after another with each product split.
template <class F>
void for_each_batch(const MatmulPlan& p, F f) {
  const double flops = 2.0 * static_cast<double>(p.m) * static_cast<double>(p.n) * static_cast<double>(p.k);
  const int64_t grain = std::max<int64_t>(1, static_cast<int64_t>(2e6 / std::max(flops, 1.0)));
  if (p.batch >= 2 * get_num_threads() && parallel_num_chunks(p.batch, grain) > 1) {
    parallel_for(0, p.batch, grain, [&](int64_t j0, int64_t j1) {
      for (int64_t j = j0; j < j1; ++j) f(j, false);
    });
  } else {
    for (int64_t j = 0; j < p.batch; ++j) f(j, true);
  }
}

}  // namespace

// C = A B per batch. dA = g B^T, dB = A^T g, each summed over the batch entries that broadcast the operand.
Tensor matmul(const Tensor& a, const Tensor& b) {
  check_same_dtype(a, b, "matmul");
  auto plan = std::make_shared<const MatmulPlan>(plan_matmul(a.shape(), b.shape()));
  const MatmulPlan& p = *plan;
  const bool bf16 = autocast_bf16(a);
  Tensor out = empty(p.out_shape, {.dtype = a.dtype()});
  dispatch_float(a.dtype(), "matmul", [&]<typename T>() {
    const T* pa = a.data<T>();
    const T* pb = b.data<T>();
    T* pc = out.data<T>();
    if (p.folded) {
      const int64_t rows = p.a_batch * p.m;
      gemm(bf16, rows, p.n, p.k, operand(pa, p.k), operand(pb, p.n), pc, p.n, false);
      return;
    }
    const int64_t sa = p.m * p.k, sb = p.k * p.n, sc = p.m * p.n;
    for_each_batch(p, [&](int64_t j, bool par) {
      gemm(bf16, p.m, p.n, p.k, operand(pa + p.a_index[static_cast<size_t>(j)] * sa, p.k),
           operand(pb + p.b_index[static_cast<size_t>(j)] * sb, p.n), pc + j * sc, p.n, false, T(1), par);
    });
  });
  if (!any_requires_grad({a, b})) return out;
  // dA needs B, dB needs A: save only what a needed gradient reads.
  Tensor saved_a = b.requires_grad() ? a.detach() : Tensor();
  Tensor saved_b = a.requires_grad() ? b.detach() : Tensor();
  Shape shape_a = a.shape(), shape_b = b.shape();
  return record(
      "matmul", out, {a, b}, [plan, saved_a, saved_b, shape_a, shape_b, bf16](const Tensor& g, GradInputs& gi) {
        const MatmulPlan& p = *plan;
        dispatch_float(g.dtype(), "matmul_backward", [&]<typename T>() {
          const T* pg = g.data<T>();
          if (p.folded) {
            const int64_t rows = p.a_batch * p.m;
            if (gi.needs(0)) {  // dA (rows, k) = G (rows, n) B^T
              Tensor da = empty(shape_a, {.dtype = g.dtype()});
              gemm(bf16, rows, p.k, p.n, operand(pg, p.n), operand(saved_b.data<T>(), p.n, true), da.data<T>(), p.k,
                   false);
              gi[0] = da;
            }
            if (gi.needs(1)) {  // dB (k, n) = A^T G
              Tensor db = empty(shape_b, {.dtype = g.dtype()});
              gemm(bf16, p.k, p.n, rows, operand(saved_a.data<T>(), p.k, true), operand(pg, p.n), db.data<T>(), p.n,
                   false);
              gi[1] = db;
            }
            return;
          }
          const int64_t sa = p.m * p.k, sb = p.k * p.n, sg = p.m * p.n;
          if (gi.needs(0)) {
            // Without broadcasting each matrix of dA is written once; with it, the products accumulate.
            const bool accumulate = p.a_batch != p.batch;
            Tensor da = accumulate ? zeros(shape_a, {.dtype = g.dtype()}) : empty(shape_a, {.dtype = g.dtype()});
            T* pda = da.data<T>();
            const T* pb = saved_b.data<T>();
            auto one = [&](int64_t j, bool par) {  // dA_j (+)= G_j B_j^T
              gemm(bf16, p.m, p.k, p.n, operand(pg + j * sg, p.n),
                   operand(pb + p.b_index[static_cast<size_t>(j)] * sb, p.n, true),
                   pda + p.a_index[static_cast<size_t>(j)] * sa, p.k, accumulate, T(1), par);
            };
            if (accumulate)  // several batches write one matrix: in order, each product parallel inside
              for (int64_t j = 0; j < p.batch; ++j) one(j, true);
            else
              for_each_batch(p, one);
            gi[0] = da;
          }
          if (gi.needs(1)) {
            const bool accumulate = p.b_batch != p.batch;
            Tensor db = accumulate ? zeros(shape_b, {.dtype = g.dtype()}) : empty(shape_b, {.dtype = g.dtype()});
            T* pdb = db.data<T>();
            const T* pa = saved_a.data<T>();
            auto one = [&](int64_t j, bool par) {  // dB_j (+)= A_j^T G_j
              gemm(bf16, p.k, p.n, p.m, operand(pa + p.a_index[static_cast<size_t>(j)] * sa, p.k, true),
                   operand(pg + j * sg, p.n), pdb + p.b_index[static_cast<size_t>(j)] * sb, p.n, accumulate, T(1), par);
            };
            if (accumulate)
              for (int64_t j = 0; j < p.batch; ++j) one(j, true);
            else
              for_each_batch(p, one);
            gi[1] = db;
          }
        });
      });
}

// y = x W^T + b over all rows of x. dx = g W, dW = g^T x, db = sum of g's rows.
Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias) {
  check_same_dtype(x, weight, "linear");
  ATTO_CHECK(weight.dim() == 2, "linear", "weight must be 2-D (out_features, in_features), got shape ", weight.shape());
  ATTO_CHECK(x.dim() >= 1, "linear", "input must be at least 1-D (..., in_features), got shape ", x.shape());
  const int64_t out_f = weight.size(0), in_f = weight.size(1);
  ATTO_CHECK(x.shape().back() == in_f, "linear", "input of shape ", x.shape(), " has ", x.shape().back(),
             " features but weight of shape ", weight.shape(), " expects in_features = ", in_f);
  const bool has_bias = bias.defined();
  if (has_bias) {
    check_same_dtype(x, bias, "linear");
    ATTO_CHECK(bias.dim() == 1 && bias.size(0) == out_f, "linear", "bias of shape ", bias.shape(),
               " does not match weight of shape ", weight.shape(), " (expected [", out_f, "])");
  }
  Shape out_shape = x.shape();
  out_shape.back() = out_f;
  int64_t rows = 1;
  for (int64_t d = 0; d + 1 < x.dim(); ++d) rows *= x.shape()[static_cast<size_t>(d)];
  const bool bf16 = autocast_bf16(x);
  Tensor out = empty(out_shape, {.dtype = x.dtype()});
  dispatch_float(x.dtype(), "linear", [&]<typename T>() {
    // Y (rows, out) = X (rows, in) W^T + b, the bias added inside the product (no separate pass over Y)
    gemm(bf16, rows, out_f, in_f, operand(x.data<T>(), in_f), operand(weight.data<T>(), in_f, true), out.data<T>(),
         out_f, false, T(1), true, has_bias ? bias.data<T>() : nullptr);
  });
  if (!any_requires_grad({x, weight, bias})) return out;
  SavedTensor saved_x(weight.requires_grad() ? x : Tensor());
  Tensor saved_w = x.requires_grad() ? weight.detach() : Tensor();
  Shape shape_x = x.shape();
  // The weight and bias gradients first, then x is dropped (when the pass frees the graph as it goes) before dX is
  // allocated: when nothing else keeps x (an FFN's hidden layer), dX takes its memory.
  return record("linear", out, {x, weight, bias},
                [saved_x, saved_w, shape_x, rows, in_f, out_f, bf16](const Tensor& g, GradInputs& gi) mutable {
                  dispatch_float(g.dtype(), "linear_backward", [&]<typename T>() {
                    const T* pg = g.data<T>();
                    if (gi.needs(1)) {  // dW (out, in) = G^T X
                      Tensor dw = empty({out_f, in_f}, {.dtype = g.dtype()});
                      const Tensor xs = saved_x.get();
                      gemm(bf16, out_f, in_f, rows, operand(pg, out_f, true), operand(xs.data<T>(), in_f), dw.data<T>(),
                           in_f, false);
                      gi[1] = dw;
                    }
                    if (backward_frees_saved()) saved_x.reset();
                    if (gi.needs(2)) {  // db = column sums of G, each thread summing its own columns over all rows
                      Tensor db = empty({out_f}, {.dtype = g.dtype()});
                      T* pdb = db.data<T>();
                      parallel_for(0, out_f, std::max<int64_t>(16, (1 << 16) / std::max<int64_t>(rows, 1)),
                                   [&](int64_t o0, int64_t o1) {
                                     for (int64_t o = o0; o < o1; ++o) pdb[o] = T(0);
                                     for (int64_t r = 0; r < rows; ++r)
                                       for (int64_t o = o0; o < o1; ++o) pdb[o] += pg[r * out_f + o];
                                   });
                      gi[2] = db;
                    }
                    if (gi.needs(0)) {  // dX (rows, in) = G (rows, out) W
                      Tensor dx = empty(shape_x, {.dtype = g.dtype()});
                      gemm(bf16, rows, in_f, out_f, operand(pg, out_f), operand(saved_w.data<T>(), in_f), dx.data<T>(),
                           in_f, false);
                      gi[0] = dx;
                    }
                  });
                });
}

}  // namespace attograd
