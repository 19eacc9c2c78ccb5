// gradcheck itself: it passes correct gradients, catches wrong ones, reports the worst element
// and detects non-reentrant backward functions.

#include "testing.h"

using namespace attograd;
using namespace attograd::testing;

namespace {
// x * x with a deliberately wrong backward (3x instead of 2x).
Tensor bad_square(const Tensor& x) {
  Tensor out = map_float(x, "bad_square", [](auto v) { return v * v; });
  Tensor dx = x.detach();
  return record("bad_square", out, {x}, [dx](const Tensor& g, GradInputs& gi) { gi[0] = g * dx * 3.0; });
}

// Correct values but a backward that changes every call (not reentrant).
Tensor flaky_identity(const Tensor& x) {
  static int calls = 0;
  Tensor out = map_float(x, "flaky", [](auto v) { return v; });
  return record("flaky", out, {x}, [](const Tensor& g, GradInputs& gi) { gi[0] = g * (1.0 + 1e-12 * ++calls); });
}
}  // namespace

TEST(Gradcheck, PassesCorrectGradients) {
  Generator gen(1);
  Tensor a = rand_leaf({3, 4}, gen);
  Tensor b = rand_leaf({4}, gen, 0.5, 2.0);
  GradcheckResult r = gradcheck([&] { return (a * b + a / b) * a; }, {a, b});
  EXPECT_TRUE(r.passed) << r.message;
  EXPECT_TRUE(r.reentrant);
  EXPECT_EQ(r.checked, (12 + 4) * 12);
  EXPECT_LT(r.max_abs_error, 1e-8);
}

TEST(Gradcheck, CatchesAWrongGradientAndNamesTheWorstElement) {
  Tensor x = from_vector<double>({0.5, -2.0, 1.0}, {3}, {.dtype = kFloat64, .requires_grad = true});
  GradcheckResult r = gradcheck([&] { return bad_square(x); }, {x});
  EXPECT_FALSE(r.passed);
  EXPECT_EQ(r.worst_input, 0u);
  EXPECT_EQ(r.worst_index, 1);  // largest |x| gives the largest error
  EXPECT_EQ(r.worst_output, 1);
  EXPECT_NEAR(r.analytic, -6.0, 1e-12);
  EXPECT_NEAR(r.numeric, -4.0, 1e-6);
  EXPECT_NE(r.message.find("gradcheck FAILED"), std::string::npos) << r.message;
  EXPECT_NE(r.message.find("analytic -6 vs numeric -4"), std::string::npos) << r.message;
}

TEST(Gradcheck, FastModeAlsoCatchesIt) {
  Tensor x = from_vector<double>({0.5, -2.0, 1.0}, {3}, {.dtype = kFloat64, .requires_grad = true});
  EXPECT_FALSE(gradcheck([&] { return bad_square(x); }, {x}, {.fast_mode = true}).passed);
  EXPECT_TRUE(gradcheck([&] { return x * x; }, {x}, {.fast_mode = true}).passed);
}

TEST(Gradcheck, DetectsNonReentrantBackward) {
  Tensor x = from_vector<double>({0.5, 1.0}, {2}, {.dtype = kFloat64, .requires_grad = true});
  GradcheckResult r = gradcheck([&] { return flaky_identity(x); }, {x});
  EXPECT_FALSE(r.reentrant);
  EXPECT_FALSE(r.passed);
  EXPECT_NE(r.message.find("NOT reentrant"), std::string::npos);
}

TEST(Gradcheck, VectorFormAndRestoredInputs) {
  Tensor x = from_vector<double>({0.3, 0.7}, {2}, {.dtype = kFloat64, .requires_grad = true});
  auto before = x.to_vector<double>();
  EXPECT_GRADCHECK([](const std::vector<Tensor>& in) { return in[0] * in[0] * in[0]; }, {x});
  EXPECT_EQ(x.to_vector<double>(), before) << "inputs are restored after perturbation";
}

TEST(Gradcheck, Errors) {
  Tensor x = ones({2}, {.dtype = kFloat64});
  EXPECT_ATTO_ERROR(gradcheck([&] { return x * 2.0; }, {x}), "input 0 must be a leaf tensor with requires_grad");
  Tensor y = ones({2}, {.dtype = kFloat64, .requires_grad = true});
  Tensor c = ones({2}, {.dtype = kFloat64});
  EXPECT_ATTO_ERROR(gradcheck([&] { return c * 2.0; }, {y}), "does not depend on any input that requires grad");
}

// Misleading reports (issue 14): where the numeric derivative is 0, a relative error is meaningless; a passing check
// must not report one near 1e+293 (it divided by the smallest double).
TEST(Gradcheck, RelativeErrorIgnoresZeroNumericDerivatives) {
  Tensor x = from_vector(std::vector<double>{0.3, -0.7}, TensorOptions{.dtype = kFloat64, .requires_grad = true});
  // Analytic gradient 1e-7 (x - detach(x) has gradient 1), numeric 0 (detach reads the perturbed value too).
  auto f = [&]() { return mul(sub(x, x.detach()), scalar_tensor(1e-7, {.dtype = kFloat64})); };
  const GradcheckResult r = gradcheck(f, {x});
  EXPECT_TRUE(r.passed) << r.message;
  EXPECT_GT(r.max_abs_error, 0);
  EXPECT_EQ(r.max_rel_error, 0) << r.message;
  EXPECT_EQ(r.message.find("e+29"), std::string::npos) << r.message;
}
