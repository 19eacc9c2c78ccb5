// Pointwise math and activations: values against hand-computed numbers, float64 gradchecks away
// from kinks, float32 runs, reused inputs, zero-size tensors, large-|x| stability and errors.

#include <cmath>
#include <limits>
#include <memory>

#include "autograd/activation.h"
#include "testing.h"

using namespace attograd;
using namespace attograd::testing;

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

Tensor dvec(std::vector<double> v, Shape s = {}) {
  return from_vector<double>(v, s.empty() ? Shape{std::ssize(v)} : s, {.dtype = kFloat64});
}
Tensor dleaf(std::vector<double> v, Shape s = {}) {
  return from_vector<double>(v, s.empty() ? Shape{std::ssize(v)} : s, {.dtype = kFloat64, .requires_grad = true});
}

// The sample points of the value tests, and float64 leaves built from them.
const std::vector<double> kPoints = {-2.0, -0.5, 0.3, 1.0, 2.5};

// A float64 leaf with values in +-[0.1, 1.1): never within 0.1 of the kink at 0.
Tensor away_from_zero(const Shape& shape, Generator& gen) {
  Tensor t = rand_leaf(shape, gen);
  double* p = t.data<double>();
  for (int64_t i = 0; i < t.numel(); ++i) p[i] = p[i] < 0 ? p[i] - 0.1 : p[i] + 0.1;
  return t;
}

// Gradient of sum(f(x)) at x: backward with a ones seed.
Tensor grad_of(const std::function<Tensor(const Tensor&)>& f, const Tensor& x) {
  Tensor leaf = x.detach();
  leaf.requires_grad_(true);
  Tensor y = f(leaf);
  y.backward(ones_like(y));
  return leaf.grad();
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Values

TEST(Activation, ExpLogSqrtValues) {
  Tensor x = dvec(kPoints);
  EXPECT_TRUE(all_close(exp(x), dvec({0.1353352832366127, 0.6065306597126334, 1.3498588075760032, 2.718281828459045,
                                      12.182493960703473}),
                        1e-14, 1e-14));
  Tensor p = dvec({0.25, 1.0, 4.0, 9.0, 2.0}, {5});
  EXPECT_TRUE(all_close(sqrt(p), dvec({0.5, 1.0, 2.0, 3.0, 1.4142135623730951}), 1e-15));
  EXPECT_TRUE(all_close(log(p), dvec({-1.3862943611198906, 0.0, 1.3862943611198906, 2.1972245773362196,
                                      0.6931471805599453}),
                        1e-15));
  Tensor edge = dvec({0.0, -1.0});
  auto l = log(edge).to_vector<double>();
  EXPECT_EQ(l[0], -kInf);
  EXPECT_TRUE(std::isnan(l[1]));
  EXPECT_EQ(exp(dvec({-kInf})).item(), 0.0);
  EXPECT_EQ(exp(dvec({kInf})).item(), kInf);
}

TEST(Activation, AbsReluValues) {
  Tensor x = dvec({-2.0, -0.5, 0.0, 0.3, 2.5});
  EXPECT_TRUE(all_close(abs(x), dvec({2.0, 0.5, 0.0, 0.3, 2.5}), 0));
  EXPECT_TRUE(all_close(relu(x), dvec({0.0, 0.0, 0.0, 0.3, 2.5}), 0));
}

TEST(Activation, PowValues) {
  Tensor x = dvec({-2.0, 0.5, 3.0});
  EXPECT_TRUE(all_close(pow(x, 2.0), dvec({4.0, 0.25, 9.0}), 1e-15));
  EXPECT_TRUE(all_close(pow(x, 3.0), dvec({-8.0, 0.125, 27.0}), 1e-15));
  EXPECT_TRUE(all_close(pow(x, 4.0), dvec({16.0, 0.0625, 81.0}), 1e-13));
  EXPECT_TRUE(all_close(pow(x, -1.0), dvec({-0.5, 2.0, 1.0 / 3.0}), 1e-15));
  EXPECT_TRUE(all_close(pow(x, -2.0), dvec({0.25, 4.0, 1.0 / 9.0}), 1e-15));
  EXPECT_TRUE(all_close(pow(x, 1.0), x, 0));
  EXPECT_TRUE(all_close(pow(x, 0.0), dvec({1.0, 1.0, 1.0}), 0));
  Tensor p = dvec({4.0, 0.25, 2.0});
  EXPECT_TRUE(all_close(pow(p, 0.5), dvec({2.0, 0.5, 1.4142135623730951}), 1e-15));
  EXPECT_TRUE(all_close(pow(p, 1.5), dvec({8.0, 0.125, 2.8284271247461903}), 1e-14));
  EXPECT_TRUE(all_close(pow(p, -0.5), dvec({0.5, 2.0, 0.7071067811865476}), 1e-15));
  EXPECT_TRUE(std::isnan(pow(dvec({-2.0}), 0.5).item()));
}

TEST(Activation, TanhSigmoidValues) {
  Tensor x = dvec(kPoints);
  EXPECT_TRUE(all_close(tanh(x), dvec({-0.9640275800758169, -0.46211715726000974, 0.2913126124515909,
                                       0.7615941559557649, 0.9866142981514303}),
                        1e-15));
  EXPECT_TRUE(all_close(sigmoid(x), dvec({0.11920292202211755, 0.3775406687981454, 0.574442516811659,
                                          0.7310585786300049, 0.9241418199787566}),
                        1e-15));
  EXPECT_EQ(sigmoid(dvec({0.0})).item(), 0.5);
}

TEST(Activation, GeluValuesMatchPyTorch) {
  // torch.nn.functional.gelu(x, approximate=...) and the gradient of its sum, PyTorch 1.13, float64.
  Tensor x = dvec(kPoints);
  EXPECT_TRUE(all_close(gelu(x), dvec({-0.04550026389635842, -0.15426876936299344, 0.1853734266566858,
                                       0.841344746068543, 2.4844758366855597}),
                        1e-15));
  EXPECT_TRUE(all_close(gelu(x, "none"), gelu(x), 0));
  EXPECT_TRUE(all_close(gelu(x, "tanh"), dvec({-0.04540230591222494, -0.15428599017485606, 0.18537092354275922,
                                               0.8411919906082768, 2.484915733910001}),
                        1e-15));
  EXPECT_TRUE(all_close(grad_of([](const Tensor& t) { return gelu(t); }, x),
                        dvec({-0.08523180107819692, 0.13250487534383712, 0.7323277668271099, 1.0833154705876864,
                              1.037611085908145}),
                        1e-14));
  EXPECT_TRUE(all_close(grad_of([](const Tensor& t) { return gelu(t, "tanh"); }, x),
                        dvec({-0.0860992566236183, 0.13263009646535764, 0.7322954516388018, 1.0829640838457826,
                              1.037951576212666}),
                        1e-14));
}

TEST(Activation, BackwardValuesByHand) {
  Tensor x = dvec({-2.0, 0.5, 3.0});
  // exp: e^x; tanh: 1 - tanh^2; sigmoid: s(1 - s); relu: [x > 0]; abs: sign; pow 3: 3x^2
  EXPECT_TRUE(all_close(grad_of([](const Tensor& t) { return exp(t); }, x),
                        dvec({std::exp(-2.0), std::exp(0.5), std::exp(3.0)}), 1e-14));
  EXPECT_TRUE(all_close(grad_of([](const Tensor& t) { return tanh(t); }, x),
                        dvec({1 - std::pow(std::tanh(-2.0), 2), 1 - std::pow(std::tanh(0.5), 2),
                              1 - std::pow(std::tanh(3.0), 2)}),
                        1e-15));
  EXPECT_TRUE(all_close(grad_of([](const Tensor& t) { return sigmoid(t); }, dvec(kPoints)),
                        dvec({0.1049935854035065, 0.2350037122015945, 0.24445831169074586, 0.19661193324148185,
                              0.07010371654510807}),
                        1e-15));
  EXPECT_TRUE(all_close(grad_of([](const Tensor& t) { return relu(t); }, x), dvec({0.0, 1.0, 1.0}), 0));
  EXPECT_TRUE(all_close(grad_of([](const Tensor& t) { return abs(t); }, x), dvec({-1.0, 1.0, 1.0}), 0));
  EXPECT_TRUE(all_close(grad_of([](const Tensor& t) { return pow(t, 3.0); }, x), dvec({12.0, 0.75, 27.0}), 1e-14));
  EXPECT_TRUE(all_close(grad_of([](const Tensor& t) { return pow(t, 0.0); }, x), dvec({0.0, 0.0, 0.0}), 0));
  Tensor p = dvec({0.25, 4.0});
  EXPECT_TRUE(all_close(grad_of([](const Tensor& t) { return log(t); }, p), dvec({4.0, 0.25}), 1e-15));
  EXPECT_TRUE(all_close(grad_of([](const Tensor& t) { return sqrt(t); }, p), dvec({1.0, 0.25}), 1e-15));
  EXPECT_TRUE(all_close(grad_of([](const Tensor& t) { return pow(t, -0.5); }, p), dvec({-4.0, -1.0 / 16.0}), 1e-14));
}

TEST(Activation, KinksFollowPyTorch) {
  // PyTorch: relu'(0) = 0, |x|'(0) = 0.
  Tensor z = dvec({0.0});
  EXPECT_EQ(grad_of([](const Tensor& t) { return relu(t); }, z).item(), 0.0);
  EXPECT_EQ(grad_of([](const Tensor& t) { return abs(t); }, z).item(), 0.0);
}

// ---------------------------------------------------------------------------------------------
// Stability

TEST(Activation, SigmoidIsStableForLargeMagnitudes) {
  Tensor x = dvec({-1000.0, -40.0, 40.0, 1000.0, -kInf, kInf});
  auto y = sigmoid(x).to_vector<double>();
  EXPECT_EQ(y[0], 0.0);
  EXPECT_NEAR(y[1] / 4.248354255291589e-18, 1.0, 1e-14);  // full relative precision in the tail
  EXPECT_EQ(y[2], 1.0);
  EXPECT_EQ(y[3], 1.0);
  EXPECT_EQ(y[4], 0.0);
  EXPECT_EQ(y[5], 1.0);
  auto g = grad_of([](const Tensor& t) { return sigmoid(t); }, x).to_vector<double>();
  for (double v : g) EXPECT_TRUE(std::isfinite(v) && v >= 0.0 && v < 1e-17) << v;

  Tensor xf = from_vector<float>({-200.f, -90.f, -20.f, 20.f, 90.f, 200.f}, {6});
  auto yf = sigmoid(xf).to_vector<double>();
  for (double v : yf) EXPECT_TRUE(std::isfinite(v) && v >= 0.0 && v <= 1.0) << v;
  EXPECT_NEAR(yf[2] / 2.0611536181902037e-09, 1.0, 1e-6);
  EXPECT_EQ(yf[5], 1.0);
}

// exp runs a vectorised kernel in chunks and redoes the arguments outside its packets' accurate range with std::exp:
// every float and double agrees with std::exp to a few ulps, overflow is inf, deep underflow is exactly 0, NaN stays
// NaN, and a value at any position of a chunk (the edge elements are spread over three 256-element chunks) is right.
TEST(Activation, ExpMatchesStdExpOverTheWholeRange) {
  for (Dtype dt : {kFloat32, kFloat64}) {
    const bool f32 = dt == kFloat32;
    const double top = f32 ? 88.72 : 709.78, bottom = f32 ? -103.0 : -744.0;
    std::vector<double> xs;
    for (int i = 0; i < 700; ++i) xs.push_back(bottom - 5 + (top + 10 - bottom) * i / 699.0);  // past both ends
    for (double e : {88.0, 88.3, 88.5, 88.7, 89.0, 100.0, -87.0, -87.5, -88.5, -88.8, -90.0, 709.5, -708.5, -745.5})
      xs.push_back(e);
    xs.push_back(kInf);
    xs.push_back(-kInf);
    xs.push_back(std::nan(""));
    Tensor x = from_vector<double>(xs, {static_cast<int64_t>(xs.size())}, {.dtype = dt});
    const auto xv = x.to_vector<double>();  // the values as stored (float32 rounds them)
    const auto y = exp(x).to_vector<double>();
    for (size_t i = 0; i < xv.size(); ++i) {
      const double want = f32 ? static_cast<double>(std::exp(static_cast<float>(xv[i]))) : std::exp(xv[i]);
      const double lo = f32 ? -88.723 : -709.784;
      if (std::isnan(xv[i])) {
        EXPECT_TRUE(std::isnan(y[i]));
      } else if (xv[i] < lo) {
        EXPECT_EQ(y[i], 0.0) << xv[i];
      } else if (std::isinf(want) || want == 0.0) {
        EXPECT_EQ(y[i], want) << xv[i];
      } else {
        const double tol = f32 ? 4 * 1.2e-7 : 4 * 2.3e-16;
        EXPECT_NEAR(y[i] / want, 1.0, tol) << (f32 ? "float " : "double ") << xv[i];
      }
    }
  }
}

TEST(Activation, TanhAndGeluSaturateWithoutNaN) {
  for (Dtype dt : {kFloat32, kFloat64}) {
    Tensor x = from_vector<double>({-1000.0, -30.0, 30.0, 1000.0}, {4}, {.dtype = dt});
    auto t = tanh(x).to_vector<double>();
    EXPECT_EQ(t[0], -1.0);
    EXPECT_EQ(t[3], 1.0);
    for (const char* mode : {"none", "tanh"}) {
      auto y = gelu(x, mode).to_vector<double>();
      EXPECT_EQ(y[0], 0.0) << mode;
      EXPECT_EQ(y[1], 0.0) << mode;  // Phi(-30) underflows to 0 in both types
      EXPECT_EQ(y[2], 30.0) << mode;
      EXPECT_EQ(y[3], 1000.0) << mode;
      auto g = grad_of([mode](const Tensor& v) { return gelu(v, mode); }, x).to_vector<double>();
      EXPECT_EQ(g[0], 0.0) << mode;
      EXPECT_EQ(g[3], 1.0) << mode;
      for (double v : g) EXPECT_TRUE(std::isfinite(v)) << mode;
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Gradchecks (float64)

TEST(Activation, GradcheckSmoothOps) {
  Generator gen(1);
  Tensor x = rand_leaf({3, 4}, gen, -2.0, 2.0);
  EXPECT_GRADCHECK([&] { return exp(x); }, {x});
  EXPECT_GRADCHECK([&] { return tanh(x); }, {x});
  EXPECT_GRADCHECK([&] { return sigmoid(x); }, {x});
  EXPECT_GRADCHECK([&] { return gelu(x); }, {x});
  EXPECT_GRADCHECK([&] { return gelu(x, "tanh"); }, {x});
  Tensor big = rand_leaf({2, 3, 4}, gen, -8.0, 8.0);
  EXPECT_GRADCHECK([&] { return sigmoid(big); }, {big});
  EXPECT_GRADCHECK([&] { return gelu(big); }, {big});
  EXPECT_GRADCHECK([&] { return gelu(big, "tanh"); }, {big});
  Tensor s = dleaf({0.7}, {});
  EXPECT_GRADCHECK([&] { return tanh(s); }, {s});
}

TEST(Activation, GradcheckPositiveDomainOps) {
  Generator gen(2);
  Tensor p = rand_leaf({2, 5}, gen, 0.5, 2.0);
  EXPECT_GRADCHECK([&] { return log(p); }, {p});
  EXPECT_GRADCHECK([&] { return sqrt(p); }, {p});
  for (double e : {0.0, 0.5, 1.0, 1.5, 2.0, 3.0, -1.0, -2.0, -0.5, 2.7})
    EXPECT_GRADCHECK([&] { return pow(p, e); }, {p}) << "exponent " << e;
}

TEST(Activation, GradcheckKinkedOpsAwayFromZero) {
  Generator gen(3);
  Tensor x = away_from_zero({4, 3}, gen);
  EXPECT_GRADCHECK([&] { return relu(x); }, {x});
  EXPECT_GRADCHECK([&] { return abs(x); }, {x});
  // Integer exponents on negative bases.
  for (double e : {2.0, 3.0, 4.0, -1.0, -2.0, -3.0}) EXPECT_GRADCHECK([&] { return pow(x, e); }, {x}) << e;
}

TEST(Activation, GradcheckReusedInputAndChains) {
  Generator gen(4);
  Tensor x = away_from_zero({3, 3}, gen);
  EXPECT_GRADCHECK([&] { return mul(exp(x), x); }, {x});
  EXPECT_GRADCHECK([&] { return tanh(x) * sigmoid(x) + relu(x) * x; }, {x});
  EXPECT_GRADCHECK([&] { return gelu(tanh(x)) / (abs(x) + 1.0); }, {x});
  EXPECT_GRADCHECK([&] { return log(exp(x) + exp(x * 2.0)); }, {x});
  EXPECT_GRADCHECK([&] { return sqrt(pow(x, 2.0) + 1.0) * gelu(x, "tanh"); }, {x});
  Tensor y = away_from_zero({3, 1}, gen);
  EXPECT_GRADCHECK([&] { return sigmoid(x * y) + exp(y); }, {x, y});
}

TEST(Activation, ReusedInputByHand) {
  // d/dx (e^x * x) = e^x (1 + x)
  Tensor x = dleaf({0.5, -1.0}, {2});
  mul(exp(x), x).backward(ones({2}, {.dtype = kFloat64}));
  EXPECT_TRUE(all_close(x.grad(), dvec({std::exp(0.5) * 1.5, 0.0}), 1e-15));
}

// ---------------------------------------------------------------------------------------------
// float32, zero-size, bookkeeping, errors

TEST(Activation, Float32MatchesFloat64) {
  Generator gen(5);
  Tensor x64 = rand(Shape{4, 7}, gen, {.dtype = kFloat64});
  {
    double* p = x64.data<double>();
    for (int64_t i = 0; i < x64.numel(); ++i) p[i] = 0.2 + 3.0 * p[i];  // positive, for log/sqrt/pow
  }
  Tensor x32 = x64.to(kFloat32);
  using Fn = std::function<Tensor(const Tensor&)>;
  std::vector<std::pair<const char*, Fn>> ops = {
      {"exp", [](const Tensor& t) { return exp(t); }},
      {"log", [](const Tensor& t) { return log(t); }},
      {"sqrt", [](const Tensor& t) { return sqrt(t); }},
      {"abs", [](const Tensor& t) { return abs(t - 1.5); }},
      {"pow", [](const Tensor& t) { return pow(t, 2.5); }},
      {"pow2", [](const Tensor& t) { return pow(t, 2.0); }},
      {"tanh", [](const Tensor& t) { return tanh(t - 1.5); }},
      {"sigmoid", [](const Tensor& t) { return sigmoid(t - 1.5); }},
      {"relu", [](const Tensor& t) { return relu(t - 1.5); }},
      {"gelu", [](const Tensor& t) { return gelu(t - 1.5); }},
      {"gelu_tanh", [](const Tensor& t) { return gelu(t - 1.5, "tanh"); }},
  };
  for (auto& [name, f] : ops) {
    Tensor y32 = f(x32);
    EXPECT_EQ(y32.dtype(), kFloat32) << name;
    EXPECT_TRUE(all_close(y32, f(x64), 1e-6, 1e-6)) << name;
    Tensor g32 = grad_of(f, x32);
    EXPECT_EQ(g32.dtype(), kFloat32) << name;
    EXPECT_TRUE(all_close(g32, grad_of(f, x64), 1e-6, 1e-5)) << name;
  }
}

TEST(Activation, ZeroSizeTensors) {
  using Fn = std::function<Tensor(const Tensor&)>;
  std::vector<Fn> ops = {[](const Tensor& t) { return exp(t); },        [](const Tensor& t) { return log(t); },
                         [](const Tensor& t) { return sqrt(t); },       [](const Tensor& t) { return abs(t); },
                         [](const Tensor& t) { return pow(t, 2.5); },   [](const Tensor& t) { return tanh(t); },
                         [](const Tensor& t) { return sigmoid(t); },    [](const Tensor& t) { return relu(t); },
                         [](const Tensor& t) { return gelu(t); },       [](const Tensor& t) { return gelu(t, "tanh"); }};
  for (Dtype dt : {kFloat32, kFloat64}) {
    for (auto& f : ops) {
      Tensor x = zeros({0, 3}, {.dtype = dt, .requires_grad = true});
      Tensor y = f(x);
      EXPECT_EQ(y.shape(), (Shape{0, 3}));
      EXPECT_EQ(y.dtype(), dt);
      y.backward(zeros({0, 3}, {.dtype = dt}));
      ASSERT_TRUE(x.grad().defined());
      EXPECT_EQ(x.grad().shape(), (Shape{0, 3}));
    }
  }
}

TEST(Activation, RecordsOnlyWhenNeeded) {
  Tensor c = dvec({1.0, 2.0});
  EXPECT_FALSE(exp(c).requires_grad());
  Tensor x = dleaf({1.0, 2.0}, {2});
  EXPECT_EQ(exp(x).grad_fn_name(), "exp");
  EXPECT_EQ(gelu(x, "tanh").grad_fn_name(), "gelu");
  EXPECT_EQ(pow(x, 2.0).grad_fn_name(), "pow");
  {
    NoGradGuard ng;
    EXPECT_FALSE(sigmoid(x).requires_grad());
  }
}

TEST(Activation, SavedOutputsDoNotLeakTheGraph) {
  // Ops that save their output must save a detached copy: the output's impl must die with its handle.
  using Fn = std::function<Tensor(const Tensor&)>;
  std::vector<Fn> ops = {[](const Tensor& t) { return exp(t); }, [](const Tensor& t) { return sqrt(t); },
                         [](const Tensor& t) { return tanh(t); }, [](const Tensor& t) { return sigmoid(t); },
                         [](const Tensor& t) { return relu(t); }, [](const Tensor& t) { return gelu(t); }};
  Tensor x = dleaf({1.0, 2.0}, {2});
  for (auto& f : ops) {
    Tensor y = f(x);
    std::weak_ptr<TensorImpl> w = y.impl();
    y = Tensor();
    EXPECT_TRUE(w.expired());
  }
}

TEST(Activation, Errors) {
  Tensor x = dvec({1.0, 2.0});
  EXPECT_ATTO_ERROR(gelu(x, "fast"), "\"fast\"");
  EXPECT_ATTO_ERROR(gelu(x, "Tanh"), "approximate must be \"none\" or \"tanh\"");
  EXPECT_ATTO_ERROR(gelu(x, ""), "gelu");
  Tensor i = from_vector<int64_t>({1, 2}, {2});
  EXPECT_ATTO_ERROR(exp(i), "exp: expected a float32 or float64 tensor, got int64");
  EXPECT_ATTO_ERROR(relu(i), "relu");
  EXPECT_ATTO_ERROR(pow(i, 2.0), "pow");
  Tensor b = from_vector<bool>({true}, {1});
  EXPECT_ATTO_ERROR(sigmoid(b), "got bool");
}
