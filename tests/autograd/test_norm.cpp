// Tests of the fused softmax, log_softmax and layer_norm: hand-computed values, float64 gradchecks,
// comparison with the same math composed from elementwise ops, edge cases and errors.

#include <cmath>
#include <limits>

#include "autograd/cpu/math.h"
#include "autograd/norm.h"
#include "testing.h"

using namespace attograd;
using namespace attograd::testing;

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// ---------------------------------------------------------------------------------------------
// Test-local differentiable reference ops, so that the fused ops can be checked against the same
// math composed from elementwise ops (add/sub/mul/div broadcast through elementwise.h).

// e^x; d/dx = e^x.
Tensor ref_exp(const Tensor& x) {
  Tensor out = map_float(x, "ref_exp", [](auto v) { return std::exp(v); });
  Tensor y = out.detach();
  return record("ref_exp", out, {x}, [y](const Tensor& g, GradInputs& gi) { gi[0] = g * y; });
}

// log x; d/dx = 1/x.
Tensor ref_log(const Tensor& x) {
  Tensor out = map_float(x, "ref_log", [](auto v) { return std::log(v); });
  Tensor xd = x.detach();
  return record("ref_log", out, {x}, [xd](const Tensor& g, GradInputs& gi) { gi[0] = g / xd; });
}

// 1/sqrt(x); d/dx = -0.5 * x^-1.5.
Tensor ref_rsqrt(const Tensor& x) {
  Tensor out = map_float(x, "ref_rsqrt", [](auto v) { return 1 / std::sqrt(v); });
  Tensor y = out.detach();
  return record("ref_rsqrt", out, {x}, [y](const Tensor& g, GradInputs& gi) { gi[0] = g * (y * y * y) * -0.5; });
}

// Sum over dims [d0, d1) keeping them as size 1; d/dx = broadcast of g.
Tensor ref_sum_keep(const Tensor& x, int64_t d0, int64_t d1) {
  Shape s = x.shape(), os = s;
  int64_t outer = 1, n = 1, inner = 1;
  for (int64_t i = 0; i < static_cast<int64_t>(s.size()); ++i) {
    if (i < d0) outer *= s[i];
    else if (i < d1) n *= s[i], os[i] = 1;
    else inner *= s[i];
  }
  Tensor out = zeros(os, {.dtype = x.dtype()});
  const auto xv = x.to_vector<double>();
  std::vector<double> acc(static_cast<size_t>(outer * inner), 0.0);
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t c = 0; c < n; ++c)
      for (int64_t j = 0; j < inner; ++j) acc[o * inner + j] += xv[(o * n + c) * inner + j];
  for (size_t i = 0; i < acc.size(); ++i) {
    if (x.dtype() == kFloat64) out.data<double>()[i] = acc[i];
    else out.data<float>()[i] = static_cast<float>(acc[i]);
  }
  return record("ref_sum", out, {x}, [s](const Tensor& g, GradInputs& gi) { gi[0] = broadcast_to(g, s); });
}

// Max over dim d keeping it (no gradient: used as a constant shift).
Tensor ref_max_keep(const Tensor& x, int64_t d) {
  Shape s = x.shape(), os = s;
  os[d] = 1;
  int64_t outer = 1, inner = 1;
  for (int64_t i = 0; i < d; ++i) outer *= s[i];
  for (size_t i = d + 1; i < s.size(); ++i) inner *= s[i];
  Tensor out = full(os, -kInf, {.dtype = x.dtype()});
  const auto xv = x.to_vector<double>();
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t c = 0; c < s[d]; ++c)
      for (int64_t j = 0; j < inner; ++j) {
        double v = xv[(o * s[d] + c) * inner + j];
        if (v > out.flat(o * inner + j)) {
          if (x.dtype() == kFloat64) out.data<double>()[o * inner + j] = v;
          else out.data<float>()[o * inner + j] = static_cast<float>(v);
        }
      }
  return out;
}

Tensor composed_softmax(const Tensor& x, int64_t d) {
  Tensor e = ref_exp(x - ref_max_keep(x, d));
  return e / ref_sum_keep(e, d, d + 1);
}

Tensor composed_log_softmax(const Tensor& x, int64_t d) {
  Tensor z = x - ref_max_keep(x, d);
  return z - ref_log(ref_sum_keep(ref_exp(z), d, d + 1));
}

Tensor composed_layer_norm(const Tensor& x, int64_t k, const Tensor& w, const Tensor& b, double eps) {
  const int64_t r = x.dim();
  double n = 1;
  for (int64_t i = r - k; i < r; ++i) n *= static_cast<double>(x.shape()[i]);
  Tensor xc = x - ref_sum_keep(x, r - k, r) / n;
  Tensor var = ref_sum_keep(xc * xc, r - k, r) / n;
  Tensor y = xc * ref_rsqrt(var + eps);
  if (w.defined()) y = y * w;
  if (b.defined()) y = y + b;
  return y;
}

// Runs f on the float64 leaves `in`, back-propagates `seed` and returns (output, grads).
struct Result {
  Tensor out;
  std::vector<Tensor> grads;
};
template <class F>
Result run(F f, const std::vector<Tensor>& in, const Tensor& seed) {
  for (Tensor t : in) t.zero_grad(true);
  Result r;
  r.out = f();
  r.out.backward(seed);
  for (const Tensor& t : in) r.grads.push_back(t.grad());
  return r;
}

bool all_finite(const Tensor& t) {
  for (double v : t.to_vector<double>())
    if (!std::isfinite(v)) return false;
  return true;
}

Tensor f64(std::vector<double> v, Shape s, bool grad = true) {
  return from_vector<double>(v, s, {.dtype = kFloat64, .requires_grad = grad});
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// softmax / log_softmax

TEST(Softmax, HandComputedValues) {
  Tensor x = f64({1, 2, 3}, {3}, false);
  const double s = std::exp(1.0) + std::exp(2.0) + std::exp(3.0);
  Tensor y = softmax(x, 0);
  EXPECT_NEAR(y.at({0}), 0.09003057317038046, 1e-15);
  EXPECT_NEAR(y.at({1}), 0.24472847105479767, 1e-15);
  EXPECT_NEAR(y.at({2}), 0.6652409557748219, 1e-15);
  for (int i = 0; i < 3; ++i) EXPECT_NEAR(y.at({i}), std::exp(i + 1.0) / s, 1e-15);
  Tensor l = log_softmax(x, -1);
  EXPECT_NEAR(l.at({0}), -2.4076059644443806, 1e-15);
  EXPECT_NEAR(l.at({1}), -1.4076059644443806, 1e-15);
  EXPECT_NEAR(l.at({2}), -0.40760596444438063, 1e-15);
  EXPECT_EQ(y.grad_fn_name(), "");  // x does not require grad: nothing recorded
}

TEST(Softmax, HandComputedGradient) {
  // d/dx_j of sum_i w_i y_i = y_j (w_j - sum_i w_i y_i)
  Tensor x = f64({1, 2, 3}, {3});
  Tensor w = f64({1, -2, 0.5}, {3}, false);
  softmax(x, 0).backward(w);
  const double y[3] = {0.09003057317038046, 0.24472847105479767, 0.6652409557748219};
  const double dot = 1 * y[0] - 2 * y[1] + 0.5 * y[2];
  const double wv[3] = {1, -2, 0.5};
  for (int j = 0; j < 3; ++j) EXPECT_NEAR(x.grad().at({j}), y[j] * (wv[j] - dot), 1e-15);
  // log_softmax: dx_j = w_j - y_j * sum(w)
  Tensor x2 = f64({1, 2, 3}, {3});
  log_softmax(x2, 0).backward(w);
  for (int j = 0; j < 3; ++j) EXPECT_NEAR(x2.grad().at({j}), wv[j] - y[j] * (1 - 2 + 0.5), 1e-15);
}

TEST(Softmax, RowsSumToOneAlongEveryDim) {
  Generator gen(1);
  Tensor x = rand_leaf({2, 3, 4}, gen, -3, 3);
  for (int64_t d = -3; d < 3; ++d) {
    Tensor y = softmax(x, d);
    const int64_t dd = d < 0 ? d + 3 : d;
    Tensor s = ref_sum_keep(y, dd, dd + 1);
    EXPECT_TRUE(all_close(s, ones(s.shape(), {.dtype = kFloat64}), 1e-14)) << "dim " << d;
    EXPECT_TRUE(all_close(log_softmax(x, d), composed_log_softmax(x, dd), 1e-14)) << "dim " << d;
  }
}

TEST(Softmax, MatchesComposedOpsValuesAndGradients) {
  Generator gen(2);
  for (int64_t d = 0; d < 3; ++d) {
    Tensor x = rand_leaf({3, 4, 5}, gen, -2, 2);
    Tensor seed = randn({3, 4, 5}, gen, {.dtype = kFloat64});
    Result a = run([&] { return softmax(x, d); }, {x}, seed);
    Result b = run([&] { return composed_softmax(x, d); }, {x}, seed);
    EXPECT_TRUE(all_close(a.out, b.out, 1e-14)) << "dim " << d;
    EXPECT_TRUE(all_close(a.grads[0], b.grads[0], 1e-13)) << "dim " << d;
    Result c = run([&] { return log_softmax(x, d); }, {x}, seed);
    Result e = run([&] { return composed_log_softmax(x, d); }, {x}, seed);
    EXPECT_TRUE(all_close(c.out, e.out, 1e-13)) << "dim " << d;
    EXPECT_TRUE(all_close(c.grads[0], e.grads[0], 1e-13)) << "dim " << d;
  }
}

TEST(Softmax, Gradcheck) {
  Generator gen(3);
  Tensor x3 = rand_leaf({2, 3, 4}, gen, -2, 2);
  for (int64_t d : {-1, 0, 1, 2, -2}) {
    EXPECT_GRADCHECK([&] { return softmax(x3, d); }, {x3});
    EXPECT_GRADCHECK([&] { return log_softmax(x3, d); }, {x3});
  }
  Tensor x1 = rand_leaf({5}, gen, -2, 2);
  EXPECT_GRADCHECK([&] { return softmax(x1, 0); }, {x1});
  EXPECT_GRADCHECK([&] { return log_softmax(x1, -1); }, {x1});
  // A single element: softmax is constant 1, its gradient 0.
  Tensor x11 = rand_leaf({4, 1}, gen);
  EXPECT_GRADCHECK([&] { return softmax(x11, 1); }, {x11});
  EXPECT_GRADCHECK([&] { return log_softmax(x11, 1); }, {x11});
}

TEST(Softmax, GradcheckReusedInputAndChains) {
  Generator gen(4);
  Tensor x = rand_leaf({3, 4}, gen, -2, 2);
  // x used by the op and again by the product; softmax along both dims of one leaf.
  EXPECT_GRADCHECK([&] { return softmax(x, -1) * x; }, {x});
  EXPECT_GRADCHECK([&] { return softmax(x, 0) + log_softmax(x, 1); }, {x});
  EXPECT_GRADCHECK([&] { return log_softmax(softmax(x, 1), 0); }, {x});
  // Broadcast input into the op.
  Tensor row = rand_leaf({1, 4}, gen, -2, 2);
  EXPECT_GRADCHECK([&] { return softmax(row + x, 0); }, {row, x});
}

TEST(Softmax, ScalarAndZeroSize) {
  Tensor s = scalar_tensor(0.7, {.dtype = kFloat64, .requires_grad = true});
  Tensor y = softmax(s, 0);
  EXPECT_EQ(y.shape(), Shape{});
  EXPECT_DOUBLE_EQ(y.item(), 1.0);
  EXPECT_DOUBLE_EQ(log_softmax(s, -1).item(), 0.0);
  EXPECT_GRADCHECK([&] { return softmax(s, 0); }, {s});
  EXPECT_GRADCHECK([&] { return log_softmax(s, -1); }, {s});

  for (Shape shape : {Shape{0, 3}, Shape{2, 0}, Shape{2, 0, 3}}) {
    Tensor z = zeros(shape, {.dtype = kFloat64, .requires_grad = true});
    for (int64_t d = 0; d < static_cast<int64_t>(shape.size()); ++d) {
      Tensor a = softmax(z, d), b = log_softmax(z, d);
      EXPECT_EQ(a.shape(), shape);
      EXPECT_EQ(b.shape(), shape);
      (a + b).backward(zeros(shape, {.dtype = kFloat64}));
      EXPECT_EQ(z.grad().shape(), shape);
      z.zero_grad(true);
    }
  }
}

TEST(Softmax, FullyMaskedRowGivesZerosAndZeroGradient) {
  // Last dim (contiguous path) and dim 0 (strided path): the all -inf slice is row/column 0.
  for (int64_t d : {1, 0}) {
    Tensor x = d == 1 ? f64({-kInf, -kInf, -kInf, 1, 2, 3}, {2, 3}) : f64({-kInf, 1, -kInf, 2, -kInf, 3}, {3, 2});
    Tensor seed = d == 1 ? f64({1, 2, 3, 4, 5, 6}, {2, 3}, false) : f64({1, 4, 2, 5, 3, 6}, {3, 2}, false);
    Tensor y = softmax(x, d);
    y.backward(seed);
    for (int i = 0; i < 3; ++i) {
      const double masked = d == 1 ? y.at({0, i}) : y.at({i, 0});
      const double live = d == 1 ? y.at({1, i}) : y.at({i, 1});
      const double gm = d == 1 ? x.grad().at({0, i}) : x.grad().at({i, 0});
      EXPECT_EQ(masked, 0.0);
      EXPECT_EQ(gm, 0.0);
      EXPECT_NEAR(live, std::exp(i + 1.0) / (std::exp(1.0) + std::exp(2.0) + std::exp(3.0)), 1e-15);
    }
    EXPECT_TRUE(all_finite(x.grad()));

    x.zero_grad(true);
    Tensor l = log_softmax(x, d);
    l.backward(seed);
    for (int i = 0; i < 3; ++i) {
      const double masked = d == 1 ? l.at({0, i}) : l.at({i, 0});
      const double gm = d == 1 ? x.grad().at({0, i}) : x.grad().at({i, 0});
      EXPECT_EQ(masked, -kInf);
      EXPECT_EQ(gm, 0.0);
    }
    EXPECT_TRUE(all_finite(x.grad()));
  }
  // float32 too
  Tensor xf = from_vector<float>({-INFINITY, -INFINITY}, {1, 2}, {.dtype = kFloat32, .requires_grad = true});
  Tensor yf = softmax(xf, -1);
  yf.backward(ones({1, 2}));
  EXPECT_EQ(yf.at({0, 0}), 0.0);
  EXPECT_EQ(xf.grad().at({0, 1}), 0.0);
}

TEST(Softmax, PartiallyMaskedRow) {
  Tensor x = f64({-kInf, 0.5, 0.5, -kInf}, {4});
  Tensor y = softmax(x, 0);
  EXPECT_EQ(y.at({0}), 0.0);
  EXPECT_EQ(y.at({3}), 0.0);
  EXPECT_DOUBLE_EQ(y.at({1}), 0.5);
  Tensor seed = f64({1, 2, 3, 4}, {4}, false);
  y.backward(seed);
  EXPECT_EQ(x.grad().at({0}), 0.0);
  EXPECT_NEAR(x.grad().at({1}), 0.5 * (2 - 2.5), 1e-15);
  x.zero_grad(true);
  Tensor l = log_softmax(x, 0);
  EXPECT_EQ(l.at({0}), -kInf);
  EXPECT_NEAR(l.at({2}), std::log(0.5), 1e-15);
  l.backward(seed);
  // dx = g - p * sum(g): the masked entries have p = 0 and keep g (as PyTorch).
  EXPECT_DOUBLE_EQ(x.grad().at({0}), 1.0);
  EXPECT_NEAR(x.grad().at({1}), 2 - 0.5 * 10, 1e-14);
}

TEST(Softmax, HugeLogitsStayFinite) {
  for (Dtype dt : {kFloat64, kFloat32}) {
    for (int64_t d : {0, 1}) {
      // dim 1: the contiguous path on one row; dim 0: the strided path on column 0 of (3, 2).
      Tensor x = d == 1 ? from_vector<double>({1e30, -1e30, 0}, {1, 3}, {.dtype = dt, .requires_grad = true})
                        : from_vector<double>({1e30, 1, -1e30, 2, 0, 3}, {3, 2}, {.dtype = dt, .requires_grad = true});
      auto at = [&](const Tensor& t, int i) { return d == 1 ? t.at({0, i}) : t.at({i, 0}); };
      Tensor y = softmax(x, d);
      EXPECT_EQ(at(y, 0), 1.0);
      EXPECT_EQ(at(y, 1), 0.0);
      EXPECT_EQ(at(y, 2), 0.0);
      y.backward(ones(y.shape(), {.dtype = dt}));
      EXPECT_TRUE(all_finite(x.grad()));
      x.zero_grad(true);
      Tensor l = log_softmax(x, d);
      EXPECT_EQ(at(l, 0), 0.0);
      EXPECT_NEAR(at(l, 1), -2e30, 2e30 * 1e-6);
      EXPECT_NEAR(at(l, 2), -1e30, 1e30 * 1e-6);
      EXPECT_TRUE(all_finite(l));
      l.backward(ones(l.shape(), {.dtype = dt}));
      EXPECT_TRUE(all_finite(x.grad()));
      EXPECT_NEAR(at(x.grad(), 0), 1 - 3.0, 1e-6);  // g - p * sum(g) with p0 = 1, three ones
      EXPECT_NEAR(at(x.grad(), 1), 1.0, 1e-6);
    }
  }
}

TEST(Softmax, Float32MatchesFloat64OnLongRows) {
  // Long rows exercise the vectorised exp, the blocked sums (> 256) and the lane remainders.
  Generator gen(5);
  for (Shape shape : {Shape{3, 1003}, Shape{2, 37, 19}}) {
    for (int64_t d : {-1, 1}) {
      Tensor x64 = randn(shape, gen, {.dtype = kFloat64});
      mul_(x64, 4.0);
      Tensor x32 = x64.to(kFloat32);
      x32.requires_grad_(true);
      x64.requires_grad_(true);
      Tensor seed = randn(shape, gen, {.dtype = kFloat64});
      Result a = run([&] { return softmax(x64, d); }, {x64}, seed);
      Result b = run([&] { return softmax(x32, d); }, {x32}, seed.to(kFloat32));
      EXPECT_EQ(b.out.dtype(), kFloat32);
      EXPECT_TRUE(all_close(b.out, a.out, 1e-7, 1e-5));
      EXPECT_TRUE(all_close(b.grads[0], a.grads[0], 1e-6, 1e-4));
      Result c = run([&] { return log_softmax(x64, d); }, {x64}, seed);
      Result e = run([&] { return log_softmax(x32, d); }, {x32}, seed.to(kFloat32));
      EXPECT_TRUE(all_close(e.out, c.out, 1e-5, 1e-6));
      EXPECT_TRUE(all_close(e.grads[0], c.grads[0], 1e-5, 1e-4));
    }
  }
}

TEST(Softmax, Float32ExpKernelAccuracy) {
  // The float kernel exp against std::exp over its whole range, and its edge values.
  double worst = 0;
  for (float v = -87.0f; v <= 0.0f; v += 0.001f) {
    const double e = std::exp(static_cast<double>(v));
    worst = std::max(worst, std::fabs(detail::exp_le0(v) - e) / e);
  }
  EXPECT_LT(worst, 2.5e-7);
  EXPECT_EQ(detail::exp_le0(0.0f), 1.0f);
  EXPECT_EQ(detail::exp_le0(-INFINITY), 0.0f);
  EXPECT_EQ(detail::exp_le0(-1000.0f), 0.0f);
  EXPECT_TRUE(std::isnan(detail::exp_le0(NAN)));
}

TEST(Softmax, NanPropagates) {
  Tensor x = f64({1, std::nan(""), 2}, {3}, false);
  Tensor y = softmax(x, 0);
  EXPECT_TRUE(std::isnan(y.at({1})));
}

TEST(Softmax, Errors) {
  Tensor x = zeros({2, 3});
  EXPECT_ATTO_ERROR(softmax(x, 2), "softmax: dimension 2 out of range for a tensor of shape [2, 3]");
  EXPECT_ATTO_ERROR(softmax(x, -3), "dimension -3 out of range for a tensor of shape [2, 3] (expected in [-2, 1])");
  EXPECT_ATTO_ERROR(log_softmax(x, 5), "log_softmax: dimension 5 out of range");
  EXPECT_ATTO_ERROR(softmax(scalar_tensor(1.0), 1), "dimension 1 out of range for a tensor of shape []");
  Tensor i = zeros({2, 3}, {.dtype = kInt64});
  EXPECT_ATTO_ERROR(softmax(i, 0), "softmax: expected a float32 or float64 tensor, got int64");
  EXPECT_ATTO_ERROR(log_softmax(i, 0), "log_softmax: expected a float32 or float64 tensor, got int64");
  EXPECT_ATTO_ERROR(softmax(Tensor(), 0), "softmax: called with an undefined tensor");
}

// ---------------------------------------------------------------------------------------------
// layer_norm

TEST(LayerNorm, HandComputedValues) {
  Tensor x = f64({1, 2, 3, 4, 2, 2, 2, 6}, {2, 4}, false);
  Tensor y = layer_norm(x, {4});
  // row 0: mean 2.5, biased var 1.25; row 1: mean 3, var 3
  const double r0 = 1 / std::sqrt(1.25 + 1e-5), r1 = 1 / std::sqrt(3 + 1e-5);
  const double e0[4] = {-1.5 * r0, -0.5 * r0, 0.5 * r0, 1.5 * r0};
  const double e1[4] = {-r1, -r1, -r1, 3 * r1};
  for (int i = 0; i < 4; ++i) {
    EXPECT_NEAR(y.at({0, i}), e0[i], 1e-15);
    EXPECT_NEAR(y.at({1, i}), e1[i], 1e-15);
  }
  Tensor w = f64({1, 2, -1, 0.5}, {4}, false), b = f64({0, 1, 2, 3}, {4}, false);
  Tensor z = layer_norm(x, {4}, w, b, 1e-6);
  const double q0 = 1 / std::sqrt(1.25 + 1e-6);
  EXPECT_NEAR(z.at({0, 0}), -1.5 * q0 * 1 + 0, 1e-15);
  EXPECT_NEAR(z.at({0, 1}), -0.5 * q0 * 2 + 1, 1e-15);
  EXPECT_NEAR(z.at({0, 2}), 0.5 * q0 * -1 + 2, 1e-15);
  EXPECT_NEAR(z.at({0, 3}), 1.5 * q0 * 0.5 + 3, 1e-15);
}

TEST(LayerNorm, HandComputedGradient) {
  // y = xhat * w + b with an upstream g: db = sum_rows g, dw = sum_rows g * xhat,
  // dx = rstd * (dn - mean(dn) - xhat * mean(dn * xhat)), dn = g * w.
  Tensor x = f64({1, 2, 3, 4}, {1, 4});
  Tensor w = f64({1, 2, -1, 0.5}, {4});
  Tensor b = f64({0, 0, 0, 0}, {4});
  Tensor g = f64({0.3, -1, 2, 0.5}, {1, 4}, false);
  layer_norm(x, {4}, w, b).backward(g);
  const double rstd = 1 / std::sqrt(1.25 + 1e-5);
  const double xh[4] = {-1.5 * rstd, -0.5 * rstd, 0.5 * rstd, 1.5 * rstd};
  const double gv[4] = {0.3, -1, 2, 0.5}, wv[4] = {1, 2, -1, 0.5};
  double mdn = 0, mdnx = 0;
  for (int i = 0; i < 4; ++i) {
    mdn += gv[i] * wv[i] / 4;
    mdnx += gv[i] * wv[i] * xh[i] / 4;
  }
  for (int i = 0; i < 4; ++i) {
    EXPECT_NEAR(b.grad().at({i}), gv[i], 1e-15);
    EXPECT_NEAR(w.grad().at({i}), gv[i] * xh[i], 1e-15);
    EXPECT_NEAR(x.grad().at({0, i}), rstd * (gv[i] * wv[i] - mdn - xh[i] * mdnx), 1e-14);
  }
}

TEST(LayerNorm, MatchesPyTorchGolden) {
  // F.layer_norm(y, [4], w, b, 1e-5) and its gradients from PyTorch 1.13 (float64).
  Tensor x = f64({1, 2, 3, 4, 2, 2, 2, 6}, {2, 4});
  Tensor w = f64({1, 2, -1, 0.5}, {4}), b = f64({0, 1, 2, 3}, {4});
  Tensor y = layer_norm(x, {4}, w, b, 1e-5);
  EXPECT_TRUE(all_close(y, f64({-1.341635419968927, 0.10557638668738178, 1.5527881933436911, 3.6708177099844637,
                                -0.5773493069415827, -0.15469861388316541, 2.5773493069415827, 3.866023960412374},
                               {2, 4}, false),
                        1e-14));
  y.backward(f64({0.3, -1, 2, 0.5, 1, 1, -2, 0.25}, {2, 4}, false));
  EXPECT_TRUE(all_close(x.grad(), f64({1.0196430801713474, -1.02411498357796, -1.0106987367082458, 1.0151706401148588,
                                       -0.38489879623004275, 0.19245051071153996, 0.19245051071153996,
                                       -2.225193036498041e-06},
                                      {2, 4}, false),
                        1e-13));
  EXPECT_TRUE(all_close(w.grad(), f64({-0.9798399329322609, -0.1301375002852736, 2.049122227195783, 1.1038296901906506},
                                      {4}, false),
                        1e-14));
  EXPECT_TRUE(all_close(b.grad(), f64({1.3, 0, 0, 0.75}, {4}, false), 1e-15));
}

TEST(LayerNorm, GradcheckAllVariants) {
  Generator gen(6);
  struct Case {
    Shape x, ns;
  };
  for (Case c : {Case{{3, 4}, {4}}, Case{{2, 3, 4}, {3, 4}}, Case{{5}, {5}}, Case{{2, 3, 4}, {2, 3, 4}}}) {
    Tensor x = rand_leaf(c.x, gen, -2, 2);
    Tensor w = rand_leaf(c.ns, gen, 0.5, 1.5);
    Tensor b = rand_leaf(c.ns, gen);
    EXPECT_GRADCHECK([&] { return layer_norm(x, c.ns); }, {x}) << shape_str(c.x);
    EXPECT_GRADCHECK([&] { return layer_norm(x, c.ns, w); }, {x, w}) << shape_str(c.x);
    EXPECT_GRADCHECK([&] { return layer_norm(x, c.ns, Tensor(), b); }, {x, b}) << shape_str(c.x);
    EXPECT_GRADCHECK([&] { return layer_norm(x, c.ns, w, b, 1e-6); }, {x, w, b}) << shape_str(c.x);
    EXPECT_GRADCHECK([&] { return layer_norm(x, c.ns, w, b, 0.5); }, {x, w, b}) << shape_str(c.x);
  }
}

TEST(LayerNorm, GradcheckOnlyParametersNeedGrad) {
  Generator gen(7);
  Tensor x = rand_leaf({3, 4}, gen);
  x.requires_grad_(false);
  Tensor w = rand_leaf({4}, gen), b = rand_leaf({4}, gen);
  EXPECT_GRADCHECK([&] { return layer_norm(x, {4}, w, b); }, {w, b});
  EXPECT_GRADCHECK([&] { return layer_norm(x, {4}, w); }, {w});
}

TEST(LayerNorm, GradcheckReusedInputAndBroadcast) {
  Generator gen(8);
  Tensor x = rand_leaf({4}, gen, -2, 2);
  // x is the input, the weight and the bias at once.
  EXPECT_GRADCHECK([&] { return layer_norm(x, {4}, x, x); }, {x});
  Tensor m = rand_leaf({3, 4}, gen, -2, 2);
  EXPECT_GRADCHECK([&] { return layer_norm(m + x, {4}, x) * m; }, {m, x});
  // The same leaf normalised over one and over both dims.
  EXPECT_GRADCHECK([&] { return layer_norm(m, {4}) + layer_norm(m, {3, 4}); }, {m});
}

TEST(LayerNorm, MatchesComposedOps) {
  Generator gen(9);
  struct Case {
    Shape x, ns;
  };
  for (Case c : {Case{{3, 5}, {5}}, Case{{2, 3, 4}, {3, 4}}}) {
    for (int variant = 0; variant < 4; ++variant) {
      Tensor x = rand_leaf(c.x, gen, -3, 3);
      Tensor w = variant & 1 ? rand_leaf(c.ns, gen, 0.5, 1.5) : Tensor();
      Tensor b = variant & 2 ? rand_leaf(c.ns, gen) : Tensor();
      std::vector<Tensor> in;
      for (const Tensor& t : {x, w, b})
        if (t.defined()) in.push_back(t);
      Tensor seed = randn(c.x, gen, {.dtype = kFloat64});
      const int64_t k = static_cast<int64_t>(c.ns.size());
      Result a = run([&] { return layer_norm(x, c.ns, w, b, 1e-5); }, in, seed);
      Result r = run([&] { return composed_layer_norm(x, k, w, b, 1e-5); }, in, seed);
      EXPECT_TRUE(all_close(a.out, r.out, 1e-13));
      for (size_t i = 0; i < in.size(); ++i) EXPECT_TRUE(all_close(a.grads[i], r.grads[i], 1e-12)) << i;
    }
  }
}

TEST(LayerNorm, ConstantRowsAreFinite) {
  for (Dtype dt : {kFloat64, kFloat32}) {
    for (double c : {3.0, 1e4, -7.5e6, 0.0}) {
      Tensor x = full({2, 8}, c, {.dtype = dt, .requires_grad = true});
      Tensor w = full({8}, 2.0, {.dtype = dt, .requires_grad = true});
      Tensor b = from_vector<double>({0, 1, 2, 3, 4, 5, 6, 7}, {8}, {.dtype = dt, .requires_grad = true});
      Tensor y = layer_norm(x, {8}, w, b);
      for (int i = 0; i < 8; ++i) EXPECT_EQ(y.at({1, i}), static_cast<double>(i)) << c;  // 0 * w + b
      Tensor g = from_vector<double>(std::vector<double>(16, 0.25), {2, 8}, {.dtype = dt});
      g.set({0, 3}, -1.0);
      y.backward(g);
      EXPECT_TRUE(all_finite(x.grad()));
      EXPECT_TRUE(all_finite(w.grad()));
      EXPECT_TRUE(all_finite(b.grad()));
      EXPECT_EQ(w.grad().at({0}), 0.0);   // xhat = 0
      EXPECT_EQ(b.grad().at({3}), -0.75);  // sum of g over rows
      // dx = rstd * (dn - mean(dn)) with rstd = 1/sqrt(eps), dn = 2 g: row 1 has constant g, so 0.
      EXPECT_NEAR(x.grad().at({1, 0}), 0.0, 1e-9);
      const double rstd = 1 / std::sqrt(1e-5), mdn = 2 * (7 * 0.25 - 1) / 8;
      EXPECT_NEAR(x.grad().at({0, 3}), rstd * (-2 - mdn), dt == kFloat32 ? 1e-3 : 1e-9);
    }
  }
  Generator gen(10);
  Tensor x = full({2, 3}, 1.5, {.dtype = kFloat64, .requires_grad = true});
  Tensor w = rand_leaf({3}, gen), b = rand_leaf({3}, gen);
  EXPECT_GRADCHECK([&] { return layer_norm(x, {3}, w, b, 0.1); }, {w, b});
}

TEST(LayerNorm, Float32LargeMeanMatchesFloat64) {
  // A large offset with small spread: the two-pass double statistics keep float32 accurate.
  Generator gen(11);
  Tensor x64 = randn({4, 512}, gen, {.dtype = kFloat64});
  Tensor off = full({4, 512}, 1e3, {.dtype = kFloat64});
  x64 = (x64 + off).to(kFloat32).to(kFloat64);  // exactly representable in float32
  x64.requires_grad_(true);
  Tensor x32 = x64.to(kFloat32).detach();
  x32.requires_grad_(true);
  Tensor w64 = rand_leaf({512}, gen, 0.5, 1.5);
  Tensor w32 = w64.to(kFloat32).detach();
  w32.requires_grad_(true);
  Tensor seed = randn({4, 512}, gen, {.dtype = kFloat64});
  Result a = run([&] { return layer_norm(x64, {512}, w64); }, {x64, w64}, seed);
  Result b = run([&] { return layer_norm(x32, {512}, w32); }, {x32, w32}, seed.to(kFloat32));
  EXPECT_EQ(b.out.dtype(), kFloat32);
  EXPECT_TRUE(all_close(b.out, a.out, 2e-4));  // float32 input resolution at 1e3 is 6e-5
  EXPECT_TRUE(all_close(b.grads[0], a.grads[0], 1e-3, 1e-3));
  EXPECT_TRUE(all_close(b.grads[1], a.grads[1], 1e-3, 1e-4));
  // The statistics themselves: every row of the float32 output has mean 0 and variance ~1.
  Tensor plain = layer_norm(x32, {512}).detach().to(kFloat64);
  Tensor m = ref_sum_keep(plain, 1, 2) / 512.0;
  Tensor v = ref_sum_keep(plain * plain, 1, 2) / 512.0;
  for (int r = 0; r < 4; ++r) {
    EXPECT_NEAR(m.at({r, 0}), 0.0, 1e-5);
    EXPECT_NEAR(v.at({r, 0}), 1.0, 1e-4);
  }
}

TEST(LayerNorm, Float32VectorPathMatchesFloat64AtEveryTail) {
  // The float32 kernels work on 16 features and 8 rows at a time: every remainder of both against float64.
  Generator gen(21);
  for (int64_t rows : {1, 7, 8, 9, 19}) {
    for (int64_t n : {1, 5, 16, 17, 33, 64}) {
      for (int variant = 0; variant < 3; ++variant) {
        Tensor x64 = rand_leaf({rows, n}, gen, -2, 3).to(kFloat32).to(kFloat64).detach();
        x64.requires_grad_(true);
        Tensor w64 = variant > 0 ? rand_leaf({n}, gen, 0.5, 1.5).to(kFloat32).to(kFloat64).detach() : Tensor();
        Tensor b64 = variant > 1 ? rand_leaf({n}, gen).to(kFloat32).to(kFloat64).detach() : Tensor();
        std::vector<Tensor> in64{x64}, in32;
        for (Tensor* t : {&w64, &b64})
          if (t->defined()) {
            t->requires_grad_(true);
            in64.push_back(*t);
          }
        for (const Tensor& t : in64) {
          Tensor c = t.to(kFloat32).detach();
          c.requires_grad_(true);
          in32.push_back(c);
        }
        auto at = [](const std::vector<Tensor>& v, size_t i) { return i < v.size() ? v[i] : Tensor(); };
        Tensor seed = randn({rows, n}, gen, {.dtype = kFloat64});
        Result a = run([&] { return layer_norm(in64[0], {n}, at(in64, 1), at(in64, 2), 1e-5); }, in64, seed);
        Result b = run([&] { return layer_norm(in32[0], {n}, at(in32, 1), at(in32, 2), 1e-5); }, in32,
                       seed.to(kFloat32));
        const std::string what = "rows " + std::to_string(rows) + ", n " + std::to_string(n) + ", variant " +
                                 std::to_string(variant);
        EXPECT_TRUE(all_close(b.out, a.out, 1e-5, 1e-5)) << what;
        for (size_t i = 0; i < in64.size(); ++i) EXPECT_TRUE(all_close(b.grads[i], a.grads[i], 1e-4, 1e-4)) << what << " grad " << i;
      }
    }
  }
}

TEST(LayerNorm, Float32Gradcheck) {
  // float32 needs a large step and loose bounds (REFERENCE.md): a smoke check of the float path.
  Generator gen(12);
  Tensor x = rand_leaf({2, 6}, gen, -2, 2).to(kFloat32).detach();
  x.requires_grad_(true);
  Tensor w = ones({6}, {.dtype = kFloat32, .requires_grad = true});
  GradcheckOptions o;
  o.eps = 1e-2;
  o.atol = 1e-2;
  o.rtol = 1e-2;
  EXPECT_GRADCHECK([&] { return layer_norm(x, {6}, w); }, {x, w}, o);
  EXPECT_GRADCHECK([&] { return softmax(x, 1); }, {x}, o);
  EXPECT_GRADCHECK([&] { return log_softmax(x, 0); }, {x}, o);
}

TEST(LayerNorm, ZeroSize) {
  Tensor x = zeros({0, 4}, {.dtype = kFloat64, .requires_grad = true});
  Tensor w = ones({4}, {.dtype = kFloat64, .requires_grad = true});
  Tensor b = zeros({4}, {.dtype = kFloat64, .requires_grad = true});
  Tensor y = layer_norm(x, {4}, w, b);
  EXPECT_EQ(y.shape(), (Shape{0, 4}));
  y.backward(zeros({0, 4}, {.dtype = kFloat64}));
  EXPECT_EQ(x.grad().shape(), (Shape{0, 4}));
  EXPECT_TRUE(all_close(w.grad(), zeros({4}, {.dtype = kFloat64})));
  Tensor e = zeros({3, 0}, {.dtype = kFloat64, .requires_grad = true});
  Tensor ye = layer_norm(e, {0});
  EXPECT_EQ(ye.shape(), (Shape{3, 0}));
}

TEST(LayerNorm, DoesNotRecordWithoutGrad) {
  Tensor x = f64({1, 2, 3}, {3});
  {
    NoGradGuard ng;
    EXPECT_FALSE(layer_norm(x, {3}).requires_grad());
    EXPECT_FALSE(softmax(x, 0).requires_grad());
  }
  EXPECT_EQ(layer_norm(x, {3}).grad_fn_name(), "layer_norm");
  EXPECT_EQ(softmax(x, 0).grad_fn_name(), "softmax");
  EXPECT_EQ(log_softmax(x, 0).grad_fn_name(), "log_softmax");
}

TEST(LayerNorm, Errors) {
  Tensor x = zeros({2, 4});
  EXPECT_ATTO_ERROR(layer_norm(x, {3}),
                    "layer_norm: normalized_shape [3] does not match the trailing dimensions of input shape [2, 4]");
  EXPECT_ATTO_ERROR(layer_norm(x, {3, 2, 4}), "normalized_shape [3, 2, 4] does not match the trailing dimensions of "
                                              "input shape [2, 4]");
  EXPECT_ATTO_ERROR(layer_norm(x, {}), "normalized_shape must have at least one dimension, got [] for input shape "
                                       "[2, 4]");
  EXPECT_ATTO_ERROR(layer_norm(x, {4}, zeros({3})), "weight shape [3] does not match normalized_shape [4]");
  EXPECT_ATTO_ERROR(layer_norm(x, {4}, Tensor(), zeros({2, 4})), "bias shape [2, 4] does not match normalized_shape [4]");
  EXPECT_ATTO_ERROR(layer_norm(x, {4}, zeros({4}, {.dtype = kFloat64})), "layer_norm: dtype mismatch: float32 [2, 4] and float64 [4]");
  EXPECT_ATTO_ERROR(layer_norm(x, {4}, Tensor(), zeros({4}, {.dtype = kFloat64})), "dtype mismatch");
  EXPECT_ATTO_ERROR(layer_norm(x, {4}, Tensor(), Tensor(), -1.0), "eps must be non-negative, got -1");
  EXPECT_ATTO_ERROR(layer_norm(zeros({2, 4}, {.dtype = kInt64}), {4}), "layer_norm: expected a float32 or float64 tensor, got int64");
  EXPECT_ATTO_ERROR(layer_norm(Tensor(), {4}), "layer_norm: called with an undefined input");
}
