#include "autograd/matmul.h"

#include <memory>

#include "autograd/eigen_util.h"
#include "autograd/elementwise.h"

namespace attograd {

using detail::matrix_map;

namespace {

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

}  // namespace

// C = A B per batch. dA = g B^T, dB = A^T g, each summed over the batch entries that broadcast the operand.
Tensor matmul(const Tensor& a, const Tensor& b) {
  check_same_dtype(a, b, "matmul");
  auto plan = std::make_shared<const MatmulPlan>(plan_matmul(a.shape(), b.shape()));
  const MatmulPlan& p = *plan;
  Tensor out = empty(p.out_shape, {.dtype = a.dtype()});
  dispatch_float(a.dtype(), "matmul", [&]<typename T>() {
    const T* pa = a.data<T>();
    const T* pb = b.data<T>();
    T* pc = out.data<T>();
    if (p.folded) {
      const int64_t rows = p.a_batch * p.m;
      auto C = matrix_map(pc, rows, p.n);
      C.noalias() = matrix_map(pa, rows, p.k) * matrix_map(pb, p.k, p.n);
      return;
    }
    const int64_t sa = p.m * p.k, sb = p.k * p.n, sc = p.m * p.n;
    for (int64_t j = 0; j < p.batch; ++j) {
      auto C = matrix_map(pc + j * sc, p.m, p.n);
      C.noalias() = matrix_map(pa + p.a_index[static_cast<size_t>(j)] * sa, p.m, p.k) *
                    matrix_map(pb + p.b_index[static_cast<size_t>(j)] * sb, p.k, p.n);
    }
  });
  if (!any_requires_grad({a, b})) return out;
  // dA needs B, dB needs A: save only what a needed gradient reads.
  Tensor saved_a = b.requires_grad() ? a.detach() : Tensor();
  Tensor saved_b = a.requires_grad() ? b.detach() : Tensor();
  Shape shape_a = a.shape(), shape_b = b.shape();
  return record("matmul", out, {a, b}, [plan, saved_a, saved_b, shape_a, shape_b](const Tensor& g, GradInputs& gi) {
    const MatmulPlan& p = *plan;
    dispatch_float(g.dtype(), "matmul_backward", [&]<typename T>() {
      const T* pg = g.data<T>();
      if (p.folded) {
        const int64_t rows = p.a_batch * p.m;
        auto G = matrix_map(pg, rows, p.n);
        if (gi.needs(0)) {
          Tensor da = empty(shape_a, {.dtype = g.dtype()});
          auto dA = matrix_map(da.data<T>(), rows, p.k);
          dA.noalias() = G * matrix_map(saved_b.data<T>(), p.k, p.n).transpose();
          gi[0] = da;
        }
        if (gi.needs(1)) {
          Tensor db = empty(shape_b, {.dtype = g.dtype()});
          auto dB = matrix_map(db.data<T>(), p.k, p.n);
          dB.noalias() = matrix_map(saved_a.data<T>(), rows, p.k).transpose() * G;
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
        for (int64_t j = 0; j < p.batch; ++j) {
          auto dA = matrix_map(pda + p.a_index[static_cast<size_t>(j)] * sa, p.m, p.k);
          auto G = matrix_map(pg + j * sg, p.m, p.n);
          auto B = matrix_map(pb + p.b_index[static_cast<size_t>(j)] * sb, p.k, p.n);
          if (accumulate)
            dA.noalias() += G * B.transpose();
          else
            dA.noalias() = G * B.transpose();
        }
        gi[0] = da;
      }
      if (gi.needs(1)) {
        const bool accumulate = p.b_batch != p.batch;
        Tensor db = accumulate ? zeros(shape_b, {.dtype = g.dtype()}) : empty(shape_b, {.dtype = g.dtype()});
        T* pdb = db.data<T>();
        const T* pa = saved_a.data<T>();
        for (int64_t j = 0; j < p.batch; ++j) {
          auto dB = matrix_map(pdb + p.b_index[static_cast<size_t>(j)] * sb, p.k, p.n);
          auto G = matrix_map(pg + j * sg, p.m, p.n);
          auto A = matrix_map(pa + p.a_index[static_cast<size_t>(j)] * sa, p.m, p.k);
          if (accumulate)
            dB.noalias() += A.transpose() * G;
          else
            dB.noalias() = A.transpose() * G;
        }
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
  const int64_t rows = detail::leading_numel(x);
  Tensor out = empty(out_shape, {.dtype = x.dtype()});
  dispatch_float(x.dtype(), "linear", [&]<typename T>() {
    auto Y = matrix_map(out.data<T>(), rows, out_f);
    auto X = matrix_map(x.data<T>(), rows, in_f);
    auto W = matrix_map(weight.data<T>(), out_f, in_f);
    if (has_bias) {
      // Start from the bias rows: the GEMM accumulates onto them (it would zero-fill otherwise).
      const T* pb = bias.data<T>();
      T* py = out.data<T>();
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t o = 0; o < out_f; ++o) py[r * out_f + o] = pb[o];
      Y.noalias() += X * W.transpose();
    } else {
      Y.noalias() = X * W.transpose();
    }
  });
  if (!any_requires_grad({x, weight, bias})) return out;
  Tensor saved_x = weight.requires_grad() ? x.detach() : Tensor();
  Tensor saved_w = x.requires_grad() ? weight.detach() : Tensor();
  Shape shape_x = x.shape();
  return record("linear", out, {x, weight, bias},
                [saved_x, saved_w, shape_x, rows, in_f, out_f](const Tensor& g, GradInputs& gi) {
                  dispatch_float(g.dtype(), "linear_backward", [&]<typename T>() {
                    auto G = matrix_map(g.data<T>(), rows, out_f);
                    if (gi.needs(0)) {
                      Tensor dx = empty(shape_x, {.dtype = g.dtype()});
                      auto dX = matrix_map(dx.data<T>(), rows, in_f);
                      dX.noalias() = G * matrix_map(saved_w.data<T>(), out_f, in_f);
                      gi[0] = dx;
                    }
                    if (gi.needs(1)) {
                      Tensor dw = empty({out_f, in_f}, {.dtype = g.dtype()});
                      auto dW = matrix_map(dw.data<T>(), out_f, in_f);
                      dW.noalias() = G.transpose() * matrix_map(saved_x.data<T>(), rows, in_f);
                      gi[1] = dw;
                    }
                    if (gi.needs(2)) {
                      Tensor db = zeros({out_f}, {.dtype = g.dtype()});
                      T* pdb = db.data<T>();
                      const T* pg = g.data<T>();
                      for (int64_t r = 0; r < rows; ++r)
                        for (int64_t o = 0; o < out_f; ++o) pdb[o] += pg[r * out_f + o];
                      gi[2] = db;
                    }
                  });
                });
}

}  // namespace attograd
