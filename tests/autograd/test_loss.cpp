// Tests of the fused cross_entropy and mse_loss: hand-computed values, float64 gradchecks over every
// option, comparison with the same math composed from elementwise ops, edge cases and errors.

#include <cmath>
#include <limits>

#include "autograd/loss.h"
#include "autograd/norm.h"
#include "testing.h"

using namespace attograd;
using namespace attograd::testing;

namespace {

// Test-local differentiable reference ops for the composed cross-entropy.

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

// Sum over dims [d0, d1) keeping them as size 1; d/dx = broadcast of g.
Tensor ref_sum_keep(const Tensor& x, int64_t d0, int64_t d1) {
  Shape s = x.shape(), os = s;
  int64_t outer = 1, n = 1, inner = 1;
  for (int64_t i = 0; i < static_cast<int64_t>(s.size()); ++i) {
    if (i < d0) outer *= s[i];
    else if (i < d1) n *= s[i], os[i] = 1;
    else inner *= s[i];
  }
  Tensor out = zeros(os, {.dtype = kFloat64});
  const auto xv = x.to_vector<double>();
  double* q = out.data<double>();
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t c = 0; c < n; ++c)
      for (int64_t j = 0; j < inner; ++j) q[o * inner + j] += xv[(o * n + c) * inner + j];
  return record("ref_sum", out, {x}, [s](const Tensor& g, GradInputs& gi) { gi[0] = broadcast_to(g, s); });
}

// Cross-entropy composed from elementwise ops on float64: -sum_c q_c log p_c per position, where q is
// the smoothed one-hot target (zero where ignored); x (N, C, d...) or (C). Returns per-position
// losses shaped (N, 1, d...) for None, else the reduced 0-d... as a (1, 1, ...) tensor.
Tensor composed_cross_entropy(const Tensor& x, const Tensor& target, const CrossEntropyOptions& o) {
  const bool one_d = x.dim() == 1;
  const int64_t N = one_d ? 1 : x.shape()[0], C = one_d ? x.shape()[0] : x.shape()[1];
  int64_t inner = 1;
  for (int64_t i = 2; i < x.dim(); ++i) inner *= x.shape()[i];
  Tensor q = zeros(x.shape(), {.dtype = kFloat64});
  const auto t = target.to_vector<int64_t>();
  double count = 0;
  for (int64_t n = 0; n < N; ++n)
    for (int64_t j = 0; j < inner; ++j) {
      const int64_t tv = t[n * inner + j];
      if (tv == o.ignore_index) continue;
      count += 1;
      for (int64_t c = 0; c < C; ++c)
        q.data<double>()[(n * C + c) * inner + j] = o.label_smoothing / C + (c == tv ? 1 - o.label_smoothing : 0.0);
    }
  const int64_t cd = one_d ? 0 : 1;
  // log_softmax with the max shifted out (the shift is a constant: it does not change the gradient)
  Tensor m = full(x.shape(), 0.0, {.dtype = kFloat64});
  {
    auto xv = x.to_vector<double>();
    for (int64_t n = 0; n < N; ++n)
      for (int64_t j = 0; j < inner; ++j) {
        double mx = -std::numeric_limits<double>::infinity();
        for (int64_t c = 0; c < C; ++c) mx = std::max(mx, xv[(n * C + c) * inner + j]);
        for (int64_t c = 0; c < C; ++c) m.data<double>()[(n * C + c) * inner + j] = mx;
      }
  }
  Tensor z = x - m;
  Tensor logp = z - ref_log(ref_sum_keep(ref_exp(z), cd, cd + 1));
  Tensor per = -ref_sum_keep(q * logp, cd, cd + 1);
  if (o.reduction == Reduction::None) return per;
  Tensor total = ref_sum_keep(per, 0, per.dim());
  if (o.reduction == Reduction::Sum) return total;
  return count > 0 ? total / count : total * 0.0;
}

struct Result {
  Tensor out;
  Tensor grad;
};

// Forward, then backward with `seed` (flat values reshaped to the output's shape); returns x's grad.
template <class F>
Result run(F f, Tensor x, const std::vector<double>& seed) {
  x.zero_grad(true);
  Result r;
  r.out = f();
  std::vector<double> s(seed.begin(), seed.begin() + r.out.numel());
  r.out.backward(r.out.dim() == 0 ? scalar_tensor(s[0], {.dtype = r.out.dtype()})
                                  : from_vector<double>(s, r.out.shape(), {.dtype = r.out.dtype()}));
  r.grad = x.grad();
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

Tensor i64(std::vector<int64_t> v, Shape s) { return from_vector<int64_t>(v, s, {.dtype = kInt64}); }

// Hand formula for one row: (1 - s) * (lse - x_t) + s * (lse - mean x).
double ce_row(const std::vector<double>& x, int64_t t, double s) {
  double se = 0, sx = 0;
  for (double v : x) {
    se += std::exp(v);
    sx += v;
  }
  const double lse = std::log(se);
  return (1 - s) * (lse - x[t]) + s * (lse - sx / static_cast<double>(x.size()));
}

const char* red_name(Reduction r) { return r == Reduction::None ? "none" : r == Reduction::Sum ? "sum" : "mean"; }

}  // namespace

// ---------------------------------------------------------------------------------------------
// cross_entropy

TEST(CrossEntropy, HandComputedValues) {
  Tensor x = f64({1, 2, 3, 1, -1, 0.5}, {2, 3});
  Tensor t = i64({2, 0}, {2});
  const double l0 = std::log(std::exp(1.0) + std::exp(2.0) + std::exp(3.0)) - 3;
  const double l1 = std::log(std::exp(1.0) + std::exp(-1.0) + std::exp(0.5)) - 1;
  EXPECT_NEAR(l0, 0.40760596444438063, 1e-15);  // -log_softmax([1,2,3])[2]
  Tensor none = cross_entropy(x, t, {.reduction = Reduction::None});
  EXPECT_EQ(none.shape(), (Shape{2}));
  EXPECT_NEAR(none.at({0}), l0, 1e-15);
  EXPECT_NEAR(none.at({1}), l1, 1e-15);
  EXPECT_NEAR(cross_entropy(x, t).item(), (l0 + l1) / 2, 1e-15);
  EXPECT_EQ(cross_entropy(x, t).shape(), Shape{});
  EXPECT_NEAR(cross_entropy(x, t, {.reduction = Reduction::Sum}).item(), l0 + l1, 1e-15);
}

TEST(CrossEntropy, HandComputedGradient) {
  // Mean over 2 rows: dx = (softmax(x) - onehot) / 2.
  Tensor x = f64({1, 2, 3, 1, -1, 0.5}, {2, 3});
  Tensor t = i64({2, 0}, {2});
  cross_entropy(x, t).backward();
  const double r0[3] = {1, 2, 3}, r1[3] = {1, -1, 0.5};
  double s0 = 0, s1 = 0;
  for (int c = 0; c < 3; ++c) {
    s0 += std::exp(r0[c]);
    s1 += std::exp(r1[c]);
  }
  for (int c = 0; c < 3; ++c) {
    EXPECT_NEAR(x.grad().at({0, c}), (std::exp(r0[c]) / s0 - (c == 2)) / 2, 1e-15);
    EXPECT_NEAR(x.grad().at({1, c}), (std::exp(r1[c]) / s1 - (c == 0)) / 2, 1e-15);
  }
}

TEST(CrossEntropy, LabelSmoothingValueAndGradient) {
  Tensor x = f64({1, 2, 3, 1, -1, 0.5}, {2, 3});
  Tensor t = i64({2, 0}, {2});
  const double s = 0.1;
  const double l0 = ce_row({1, 2, 3}, 2, s), l1 = ce_row({1, -1, 0.5}, 0, s);
  // PyTorch's formula written out: (1 - s) * nll + s * mean_c(-log p_c)
  double lse0 = std::log(std::exp(1.0) + std::exp(2.0) + std::exp(3.0));
  EXPECT_NEAR(l0, 0.9 * (lse0 - 3) + 0.1 * ((lse0 - 1) + (lse0 - 2) + (lse0 - 3)) / 3, 1e-15);
  Tensor loss = cross_entropy(x, t, {.label_smoothing = s});
  EXPECT_NEAR(loss.item(), (l0 + l1) / 2, 1e-15);
  loss.backward();
  // dx = (p - (1 - s) onehot - s / C) / count
  for (int c = 0; c < 3; ++c) {
    const double p = std::exp(c + 1.0 - lse0);
    EXPECT_NEAR(x.grad().at({0, c}), (p - 0.9 * (c == 2) - 0.1 / 3) / 2, 1e-15);
  }
  // s = 1: the loss is the uniform cross-entropy lse - mean x.
  Tensor one = cross_entropy(x, t, {.label_smoothing = 1.0, .reduction = Reduction::None});
  EXPECT_NEAR(one.at({0}), lse0 - 2, 1e-14);
}

TEST(CrossEntropy, IgnoreIndexExcludedFromLossAndCount) {
  Tensor x = f64({1, 2, 3, 1, -1, 0.5, 0, 0, 4}, {3, 3});
  Tensor t = i64({2, -100, 0}, {3});
  const double l0 = ce_row({1, 2, 3}, 2, 0), l2 = ce_row({0, 0, 4}, 0, 0);
  Tensor none = cross_entropy(x, t, {.reduction = Reduction::None});
  EXPECT_NEAR(none.at({0}), l0, 1e-15);
  EXPECT_EQ(none.at({1}), 0.0);
  EXPECT_NEAR(none.at({2}), l2, 1e-15);
  Tensor mean = cross_entropy(x, t);
  EXPECT_NEAR(mean.item(), (l0 + l2) / 2, 1e-15);  // two counted targets
  EXPECT_NEAR(cross_entropy(x, t, {.reduction = Reduction::Sum}).item(), l0 + l2, 1e-15);
  mean.backward();
  for (int c = 0; c < 3; ++c) EXPECT_EQ(x.grad().at({1, c}), 0.0);
  EXPECT_NEAR(x.grad().at({0, 2}), (std::exp(3 - (l0 + 3)) - 1) / 2, 1e-15);
  // with label smoothing the ignored row still contributes nothing
  Tensor sm = cross_entropy(x, t, {.label_smoothing = 0.3});
  EXPECT_NEAR(sm.item(), (ce_row({1, 2, 3}, 2, 0.3) + ce_row({0, 0, 4}, 0, 0.3)) / 2, 1e-15);
  // ignore_index 0 (a padding id) is honoured even though 0 is a valid class.
  Tensor pad = cross_entropy(x, i64({2, 0, 0}, {3}), {.ignore_index = 0});
  EXPECT_NEAR(pad.item(), l0, 1e-15);
}

TEST(CrossEntropy, MatchesPyTorchGolden) {
  // F.cross_entropy(x, t, label_smoothing=0.3) and x.grad from PyTorch 1.13 (float64).
  Tensor x = f64({1, 2, 3, 1, -1, 0.5, 0, 0, 4}, {3, 3});
  Tensor l = cross_entropy(x, i64({2, -100, 0}, {3}), {.label_smoothing = 0.3});
  EXPECT_NEAR(l.item(), 2.1717911320962866, 1e-14);
  l.backward();
  Tensor expect = f64({-0.004984713414809784, 0.07236423552739882, -0.06737952211258912, 0, 0, 0,
                       -0.39116578899297594, -0.041165788992975974, 0.43233157798595184},
                      {3, 3}, false);
  EXPECT_TRUE(all_close(x.grad(), expect, 1e-15));
  // (N, C, d) input, F.cross_entropy(x3, t3, label_smoothing=0.2)
  Tensor x3 = f64({1, 0.5, 2, -1, 3, 0, 0.1, 0.2, 0.3, 0.4, -0.5, 2.5}, {2, 3, 2});
  EXPECT_NEAR(cross_entropy(x3, i64({2, 0, -100, 1}, {2, 2}), {.label_smoothing = 0.2}).item(), 1.1731590849693652,
              1e-14);
}

TEST(CrossEntropy, AllIgnoredGivesZeroAndZeroGradient) {
  Tensor x = f64({1, 2, 3, 1, -1, 0.5}, {2, 3});
  Tensor t = i64({-100, -100}, {2});
  for (Reduction r : {Reduction::Mean, Reduction::Sum, Reduction::None}) {
    for (double s : {0.0, 0.4}) {
      x.zero_grad(true);
      Tensor l = cross_entropy(x, t, {.label_smoothing = s, .reduction = r});
      for (double v : l.to_vector<double>()) EXPECT_EQ(v, 0.0) << red_name(r);
      l.backward(ones(l.shape(), {.dtype = kFloat64}));
      for (double v : x.grad().to_vector<double>()) EXPECT_EQ(v, 0.0) << red_name(r);
    }
  }
}

TEST(CrossEntropy, ClassDimOneForHigherRankInput) {
  // (N, C, d1) = (2, 3, 2): position (n, j) uses the logits x[n, :, j].
  std::vector<double> xv = {1, 0.5, 2, -1, 3, 0, 0.1, 0.2, 0.3, 0.4, -0.5, 2.5};
  Tensor x = f64(xv, {2, 3, 2});
  Tensor t = i64({2, 0, -100, 1}, {2, 2});
  Tensor none = cross_entropy(x, t, {.reduction = Reduction::None});
  EXPECT_EQ(none.shape(), (Shape{2, 2}));
  auto col = [&](int n, int j) {
    std::vector<double> r;
    for (int c = 0; c < 3; ++c) r.push_back(xv[(n * 3 + c) * 2 + j]);
    return r;
  };
  EXPECT_NEAR(none.at({0, 0}), ce_row(col(0, 0), 2, 0), 1e-15);
  EXPECT_NEAR(none.at({0, 1}), ce_row(col(0, 1), 0, 0), 1e-15);
  EXPECT_EQ(none.at({1, 0}), 0.0);
  EXPECT_NEAR(none.at({1, 1}), ce_row(col(1, 1), 1, 0), 1e-15);
  const double mean = (ce_row(col(0, 0), 2, 0) + ce_row(col(0, 1), 0, 0) + ce_row(col(1, 1), 1, 0)) / 3;
  EXPECT_NEAR(cross_entropy(x, t).item(), mean, 1e-15);
  const double smoothed =
      (ce_row(col(0, 0), 2, 0.2) + ce_row(col(0, 1), 0, 0.2) + ce_row(col(1, 1), 1, 0.2)) / 3;
  EXPECT_NEAR(cross_entropy(x, t, {.label_smoothing = 0.2}).item(), smoothed, 1e-15);
}

TEST(CrossEntropy, OneDimensionalInputWithScalarTarget) {
  Tensor x = f64({1, 2, 3}, {3});
  Tensor t = from_vector<int64_t>({1}, {1}, {.dtype = kInt64});
  Tensor t0 = empty({}, {.dtype = kInt64});
  t0.data<int64_t>()[0] = 1;
  for (Reduction r : {Reduction::None, Reduction::Mean, Reduction::Sum}) {
    Tensor l = cross_entropy(x, t0, {.reduction = r});
    EXPECT_EQ(l.shape(), Shape{});
    EXPECT_NEAR(l.item(), ce_row({1, 2, 3}, 1, 0), 1e-15);
    EXPECT_GRADCHECK([&] { return cross_entropy(x, t0, {.label_smoothing = 0.25, .reduction = r}); }, {x});
  }
  t0.data<int64_t>()[0] = -100;
  EXPECT_EQ(cross_entropy(x, t0).item(), 0.0);
}

TEST(CrossEntropy, GradcheckEveryOption) {
  Generator gen(20);
  struct Case {
    Shape x;
    Shape t;
  };
  for (Case c : {Case{{4, 3}, {4}}, Case{{2, 3, 4}, {2, 4}}, Case{{2, 4, 2, 3}, {2, 2, 3}}, Case{{3, 5, 1}, {3, 1}}}) {
    const int64_t C = c.x[1];
    for (int ignore = 0; ignore < 2; ++ignore) {
      Tensor t = randint(0, C, c.t, gen);
      if (ignore) {
        t.data<int64_t>()[0] = -100;
        t.data<int64_t>()[t.numel() - 1] = -100;
      }
      Tensor x = rand_leaf(c.x, gen, -2, 2);
      for (Reduction r : {Reduction::None, Reduction::Mean, Reduction::Sum})
        for (double s : {0.0, 0.2, 1.0}) {
          CrossEntropyOptions o{.label_smoothing = s, .reduction = r};
          EXPECT_GRADCHECK([&] { return cross_entropy(x, t, o); }, {x})
              << shape_str(c.x) << " " << red_name(r) << " s=" << s << " ignore=" << ignore;
        }
    }
  }
}

TEST(CrossEntropy, GradcheckReusedAndChainedInputs) {
  Generator gen(21);
  Tensor x = rand_leaf({3, 4}, gen, -2, 2);
  Tensor t = i64({1, 3, 0}, {3});
  // the same leaf feeds the loss twice and through another op
  EXPECT_GRADCHECK([&] { return cross_entropy(x, t) + cross_entropy(x * x, t, {.label_smoothing = 0.1}); }, {x});
  EXPECT_GRADCHECK([&] { return cross_entropy(x, t, {.reduction = Reduction::None}) * cross_entropy(x, t); }, {x});
  Tensor b = rand_leaf({4}, gen);
  EXPECT_GRADCHECK([&] { return cross_entropy(x + b, t, {.ignore_index = 3}); }, {x, b});
  // against log_softmax: nll of the log-probabilities
  EXPECT_GRADCHECK([&] { return cross_entropy(log_softmax(x, 1), t); }, {x});
}

TEST(CrossEntropy, MatchesComposedOps) {
  Generator gen(22);
  std::vector<double> seed(64);
  for (double& v : seed) v = randn({1}, gen, {.dtype = kFloat64}).item();
  struct Case {
    Shape x;
    Shape t;
  };
  for (Case c : {Case{{5, 4}, {5}}, Case{{2, 3, 4}, {2, 4}}, Case{{6}, {}}}) {
    const int64_t C = c.x.size() == 1 ? c.x[0] : c.x[1];
    Tensor t = randint(0, C, c.t, gen);
    if (t.numel() > 1) t.data<int64_t>()[1] = 7;
    Tensor x = rand_leaf(c.x, gen, -3, 3);
    for (Reduction r : {Reduction::None, Reduction::Mean, Reduction::Sum})
      for (double s : {0.0, 0.3}) {
        CrossEntropyOptions o{.ignore_index = 7, .label_smoothing = s, .reduction = r};
        Result a = run([&] { return cross_entropy(x, t, o); }, x, seed);
        Result b = run([&] { return composed_cross_entropy(x, t, o); }, x, seed);
        EXPECT_EQ(a.out.numel(), b.out.numel());
        EXPECT_TRUE(all_close(from_vector<double>(a.out.to_vector<double>(), {a.out.numel()}),
                              from_vector<double>(b.out.to_vector<double>(), {b.out.numel()}), 1e-13))
            << shape_str(c.x) << " " << red_name(r) << " s=" << s;
        EXPECT_TRUE(all_close(a.grad, b.grad, 1e-13)) << shape_str(c.x) << " " << red_name(r) << " s=" << s;
      }
  }
}

TEST(CrossEntropy, HugeLogitsStayFinite) {
  for (Dtype dt : {kFloat64, kFloat32}) {
    for (bool strided : {false, true}) {
      // the same logits as (1, 3) or as (1, 3, 1): the contiguous and the strided kernels
      Shape xs = strided ? Shape{1, 3, 1} : Shape{1, 3};
      Shape ts = strided ? Shape{1, 1} : Shape{1};
      Tensor x = from_vector<double>({1e30, -1e30, 0}, xs, {.dtype = dt, .requires_grad = true});
      const double expect[3] = {0, 2e30, 1e30};
      for (int64_t target = 0; target < 3; ++target) {
        x.zero_grad(true);
        Tensor l = cross_entropy(x, from_vector<int64_t>({target}, ts, {.dtype = kInt64}));
        EXPECT_NEAR(l.item(), expect[target], expect[target] * 1e-6);
        EXPECT_TRUE(all_finite(l));
        l.backward();
        EXPECT_TRUE(all_finite(x.grad()));
        // dx = p - onehot with p = (1, 0, 0)
        auto v = x.grad().to_vector<double>();
        for (int c = 0; c < 3; ++c) EXPECT_NEAR(v[c], (c == 0) - (c == target), 1e-6);
      }
      // a masked (-inf) non-target class is harmless
      Tensor m = from_vector<double>({-INFINITY, 1, 2}, xs, {.dtype = dt, .requires_grad = true});
      Tensor lm = cross_entropy(m, from_vector<int64_t>({2}, ts, {.dtype = kInt64}));
      EXPECT_NEAR(lm.item(), std::log(std::exp(1.0) + std::exp(2.0)) - 2, 1e-6);
      lm.backward();
      EXPECT_TRUE(all_finite(m.grad()));
      EXPECT_EQ(m.grad().flat(0), 0.0);
    }
  }
}

TEST(CrossEntropy, Float32MatchesFloat64) {
  Generator gen(23);
  std::vector<double> seed(512);
  for (double& v : seed) v = randn({1}, gen, {.dtype = kFloat64}).item();
  struct Case {
    Shape x;
    Shape t;
  };
  for (Case c : {Case{{8, 1000}, {8}}, Case{{3, 37, 5}, {3, 5}}}) {
    Tensor t = randint(0, c.x[1], c.t, gen);
    t.data<int64_t>()[0] = -100;
    Tensor x64 = randn(c.x, gen, {.dtype = kFloat64});
    mul_(x64, 3.0);
    Tensor x32 = x64.to(kFloat32);
    x64.requires_grad_(true);
    x32.requires_grad_(true);
    for (Reduction r : {Reduction::None, Reduction::Mean, Reduction::Sum})
      for (double s : {0.0, 0.1}) {
        CrossEntropyOptions o{.label_smoothing = s, .reduction = r};
        Result a = run([&] { return cross_entropy(x64, t, o); }, x64, seed);
        Result b = run([&] { return cross_entropy(x32, t, o); }, x32, seed);
        EXPECT_EQ(b.out.dtype(), kFloat32);
        EXPECT_EQ(b.grad.dtype(), kFloat32);
        EXPECT_TRUE(all_close(b.out, a.out, 1e-5, 1e-6)) << shape_str(c.x) << " " << red_name(r);
        EXPECT_TRUE(all_close(b.grad, a.grad, 1e-6, 1e-4)) << shape_str(c.x) << " " << red_name(r);
      }
  }
}

TEST(CrossEntropy, ZeroSize) {
  Tensor x = zeros({0, 3}, {.dtype = kFloat64, .requires_grad = true});
  Tensor t = zeros({0}, {.dtype = kInt64});
  EXPECT_EQ(cross_entropy(x, t).item(), 0.0);
  EXPECT_EQ(cross_entropy(x, t, {.reduction = Reduction::Sum}).item(), 0.0);
  Tensor none = cross_entropy(x, t, {.reduction = Reduction::None});
  EXPECT_EQ(none.shape(), (Shape{0}));
  cross_entropy(x, t).backward();
  EXPECT_EQ(x.grad().shape(), (Shape{0, 3}));
  Tensor x3 = zeros({2, 3, 0}, {.dtype = kFloat64, .requires_grad = true});
  EXPECT_EQ(cross_entropy(x3, zeros({2, 0}, {.dtype = kInt64}), {.reduction = Reduction::None}).shape(),
            (Shape{2, 0}));
}

TEST(CrossEntropy, NoRecordWithoutGrad) {
  Tensor x = f64({1, 2, 3}, {1, 3}, false);
  Tensor l = cross_entropy(x, i64({0}, {1}));
  EXPECT_FALSE(l.requires_grad());
  Tensor y = f64({1, 2, 3}, {1, 3});
  EXPECT_EQ(cross_entropy(y, i64({0}, {1})).grad_fn_name(), "cross_entropy");
}

TEST(CrossEntropy, Errors) {
  Tensor x = zeros({2, 3});
  EXPECT_ATTO_ERROR(cross_entropy(x, i64({0, 3}, {2})),
                    "cross_entropy: target value 3 is out of range for 3 classes (expected 0 <= target < 3, or "
                    "ignore_index -100)");
  EXPECT_ATTO_ERROR(cross_entropy(x, i64({-1, 0}, {2})), "target value -1 is out of range for 3 classes");
  EXPECT_ATTO_ERROR(cross_entropy(x, i64({-100, 0}, {2}), {.ignore_index = 5}),
                    "target value -100 is out of range for 3 classes (expected 0 <= target < 3, or ignore_index 5)");
  EXPECT_ATTO_ERROR(cross_entropy(zeros({2, 3, 2}), i64({0, 1, 2, 9}, {2, 2})), "target value 9 is out of range");
  EXPECT_ATTO_ERROR(cross_entropy(x, zeros({2})),
                    "cross_entropy: target must be an int64 tensor of class indices, got float32 of shape [2]");
  EXPECT_ATTO_ERROR(cross_entropy(x, i64({0, 1, 2}, {3})),
                    "target shape [3] does not match input shape [2, 3] (expected target shape [2])");
  EXPECT_ATTO_ERROR(cross_entropy(zeros({2, 3, 4}), i64({0, 1, 2, 0, 1, 2}, {2, 3})),
                    "target shape [2, 3] does not match input shape [2, 3, 4] (expected target shape [2, 4])");
  EXPECT_ATTO_ERROR(cross_entropy(zeros({3}), i64({0}, {1})),
                    "target shape [1] does not match input shape [3] (expected target shape [])");
  EXPECT_ATTO_ERROR(cross_entropy(x, i64({0, 1}, {2}), {.label_smoothing = 1.5}),
                    "cross_entropy: label_smoothing must be in [0, 1], got 1.5");
  EXPECT_ATTO_ERROR(cross_entropy(x, i64({0, 1}, {2}), {.label_smoothing = -0.1}),
                    "label_smoothing must be in [0, 1], got -0.1");
  EXPECT_ATTO_ERROR(cross_entropy(scalar_tensor(1.0), i64({0}, {1})),
                    "input must have shape (C), (N, C) or (N, C, d1, ...), got shape []");
  EXPECT_ATTO_ERROR(cross_entropy(zeros({2, 3}, {.dtype = kInt64}), i64({0, 1}, {2})),
                    "cross_entropy: input must be float32 or float64, got int64");
  EXPECT_ATTO_ERROR(cross_entropy(Tensor(), i64({0}, {1})), "cross_entropy: called with an undefined tensor");
}

// ---------------------------------------------------------------------------------------------
// mse_loss

TEST(MseLoss, HandComputedValuesAndGradients) {
  Tensor x = f64({1, 2, 3}, {3});
  Tensor t = f64({0, 2, 5}, {3});
  Tensor none = mse_loss(x, t, Reduction::None);
  EXPECT_EQ(none.shape(), (Shape{3}));
  EXPECT_EQ(none.to_vector<double>(), (std::vector<double>{1, 0, 4}));
  EXPECT_EQ(mse_loss(x, t, Reduction::Sum).item(), 5.0);
  Tensor mean = mse_loss(x, t);
  EXPECT_EQ(mean.shape(), Shape{});
  EXPECT_NEAR(mean.item(), 5.0 / 3, 1e-15);
  mean.backward();
  // d/dx = 2 (x - t) / n, d/dt = -d/dx
  const double ex[3] = {2.0 / 3, 0, -4.0 / 3};
  for (int i = 0; i < 3; ++i) {
    EXPECT_NEAR(x.grad().at({i}), ex[i], 1e-15);
    EXPECT_NEAR(t.grad().at({i}), -ex[i], 1e-15);
  }
  x.zero_grad(true);
  mse_loss(x, t, Reduction::None).backward(f64({1, 2, 3}, {3}, false));
  EXPECT_NEAR(x.grad().at({2}), 2 * (3 - 5) * 3, 1e-15);
}

TEST(MseLoss, GradcheckEveryReduction) {
  Generator gen(30);
  for (Shape s : {Shape{3, 4}, Shape{5}, Shape{}, Shape{2, 3, 2}}) {
    Tensor x = rand_leaf(s, gen, -2, 2), t = rand_leaf(s, gen, -2, 2);
    for (Reduction r : {Reduction::None, Reduction::Mean, Reduction::Sum}) {
      EXPECT_GRADCHECK([&] { return mse_loss(x, t, r); }, {x, t}) << shape_str(s) << " " << red_name(r);
      // reused inputs: both arguments the same leaf, and the leaf inside the target expression
      EXPECT_GRADCHECK([&] { return mse_loss(x, x, r); }, {x});
      EXPECT_GRADCHECK([&] { return mse_loss(x * x, x + t, r); }, {x, t});
    }
  }
  // only the target requires grad
  Tensor a = rand_leaf({4}, gen), b = rand_leaf({4}, gen);
  a.requires_grad_(false);
  EXPECT_GRADCHECK([&] { return mse_loss(a, b); }, {b});
}

TEST(MseLoss, Float32AndZeroSize) {
  Generator gen(31);
  Tensor x64 = randn({50, 7}, gen, {.dtype = kFloat64}), t64 = randn({50, 7}, gen, {.dtype = kFloat64});
  Tensor x32 = x64.to(kFloat32), t32 = t64.to(kFloat32);
  x32.requires_grad_(true);
  Tensor l = mse_loss(x32, t32);
  EXPECT_EQ(l.dtype(), kFloat32);
  EXPECT_NEAR(l.item(), mse_loss(x64, t64).item(), 1e-6);
  l.backward();
  EXPECT_EQ(x32.grad().dtype(), kFloat32);
  Tensor e = zeros({0, 3}, {.dtype = kFloat64, .requires_grad = true});
  EXPECT_EQ(mse_loss(e, e, Reduction::Sum).item(), 0.0);
  EXPECT_TRUE(std::isnan(mse_loss(e, e).item()));  // torch.mean of nothing
  EXPECT_EQ(mse_loss(e, e, Reduction::None).shape(), (Shape{0, 3}));
}

TEST(MseLoss, Errors) {
  EXPECT_ATTO_ERROR(mse_loss(zeros({2, 3}), zeros({3})),
                    "mse_loss: input shape [2, 3] and target shape [3] must be equal (reduction mean)");
  EXPECT_ATTO_ERROR(mse_loss(zeros({2}), zeros({2, 1}), Reduction::Sum),
                    "input shape [2] and target shape [2, 1] must be equal (reduction sum)");
  EXPECT_ATTO_ERROR(mse_loss(zeros({2}), zeros({2}, {.dtype = kFloat64})),
                    "mse_loss: dtype mismatch: float32 [2] and float64 [2]");
  EXPECT_ATTO_ERROR(mse_loss(zeros({2}, {.dtype = kInt64}), zeros({2}, {.dtype = kInt64})),
                    "mse_loss: expected a float32 or float64 tensor, got int64");
  EXPECT_ATTO_ERROR(mse_loss(Tensor(), zeros({2})), "mse_loss: called with an undefined tensor");
}
