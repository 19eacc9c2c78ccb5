// The engine: leaves and non-leaves, accumulation, retain_graph, detach, NoGradGuard, deep graphs
// and the errors of backward.

#include <thread>

#include "testing.h"

using namespace attograd;
using namespace attograd::testing;

namespace {
Tensor dleaf(std::vector<double> v, Shape s = {}) {
  return from_vector<double>(v, s, {.dtype = kFloat64, .requires_grad = true});
}
}  // namespace

TEST(Engine, ScalarBackwardSeedsOne) {
  Tensor x = dleaf({2.0}, {});
  Tensor y = x * x * 3.0;
  y.backward();
  EXPECT_DOUBLE_EQ(x.grad().item(), 12.0);
}

TEST(Engine, LeavesAndNonLeaves) {
  Tensor x = dleaf({1, 2}, {2});
  Tensor c = ones({2}, {.dtype = kFloat64});
  Tensor y = x * 2.0;
  EXPECT_TRUE(x.is_leaf());
  EXPECT_TRUE(c.is_leaf());
  EXPECT_FALSE(c.requires_grad());
  EXPECT_FALSE(y.is_leaf());
  EXPECT_TRUE(y.requires_grad());
  EXPECT_EQ(y.grad_fn_name(), "mul_scalar");
  Tensor z = c * 2.0;  // nothing requires grad: no history
  EXPECT_TRUE(z.is_leaf());
  EXPECT_FALSE(z.requires_grad());
}

TEST(Engine, NodeUsedTwiceAccumulates) {
  Tensor x = dleaf({3.0});
  (x * x).backward();
  EXPECT_DOUBLE_EQ(x.grad().item(), 6.0);
  Tensor w = dleaf({3.0});
  (w + w).backward();
  EXPECT_DOUBLE_EQ(w.grad().item(), 2.0);
}

TEST(Engine, DiamondAccumulates) {
  // y = a*b + a/b with a = 2x: dy/dx = 2(b + 1/b)
  Tensor x = dleaf({1.5});
  Tensor b = dleaf({4.0});
  Tensor a = x * 2.0;
  Tensor y = a * b + a / b;
  y.backward();
  EXPECT_DOUBLE_EQ(x.grad().item(), 2.0 * (4.0 + 0.25));
  EXPECT_DOUBLE_EQ(b.grad().item(), 3.0 - 3.0 / 16.0);
}

TEST(Engine, GradientsAccumulateAcrossBackwardsUntilZeroed) {
  Tensor x = dleaf({1.0, 2.0}, {2});
  Tensor g = ones({2}, {.dtype = kFloat64});
  (x * 3.0).backward(g);
  (x * 3.0).backward(g);
  EXPECT_EQ(x.grad().to_vector<double>(), (std::vector<double>{6, 6}));
  const double* before = x.grad().data<double>();
  x.zero_grad();
  EXPECT_EQ(x.grad().to_vector<double>(), (std::vector<double>{0, 0}));
  EXPECT_EQ(x.grad().data<double>(), before) << "zero_grad must reuse the buffer";
  x.zero_grad(/*set_to_none=*/true);
  EXPECT_FALSE(x.grad().defined());
}

TEST(Engine, LeafGradIsAPrivateCopy) {
  // add's backward hands the same gradient to both inputs; accumulating into one must not touch the other.
  Tensor a = dleaf({1.0});
  Tensor b = dleaf({1.0});
  Tensor y = a + b;
  y.backward(Tensor(), true);
  y.backward();
  EXPECT_DOUBLE_EQ(a.grad().item(), 2.0);
  EXPECT_DOUBLE_EQ(b.grad().item(), 2.0);
}

TEST(Engine, ExplicitGradientForNonScalar) {
  Tensor x = dleaf({1, 2, 3}, {3});
  Tensor y = x * x;
  y.backward(from_vector<double>({1, 0.5, 2}, {3}));
  EXPECT_EQ(x.grad().to_vector<double>(), (std::vector<double>{2, 2, 12}));
}

TEST(Engine, NonScalarWithoutGradientIsAnError) {
  Tensor x = dleaf({1, 2, 3}, {3});
  Tensor y = x * 2.0;
  EXPECT_ATTO_ERROR(y.backward(), "grad can be implicitly created only for one-element outputs, got shape [3]");
}

TEST(Engine, GradientShapeAndDtypeAreChecked) {
  Tensor x = dleaf({1, 2, 3}, {3});
  Tensor y = x * 2.0;
  EXPECT_ATTO_ERROR(y.backward(ones({2}, {.dtype = kFloat64})), "gradient of shape [2] does not match output of shape [3]");
  EXPECT_ATTO_ERROR(y.backward(ones({3})), "gradient dtype float32 does not match output dtype float64");
}

TEST(Engine, BackwardOnTensorWithoutGradIsAnError) {
  Tensor x = ones({1});
  EXPECT_ATTO_ERROR(x.backward(), "does not require grad");
}

TEST(Engine, SecondBackwardNeedsRetainGraph) {
  Tensor x = dleaf({2.0});
  Tensor y = x * x;
  y.backward(Tensor(), /*retain_graph=*/true);
  y.backward();
  EXPECT_DOUBLE_EQ(x.grad().item(), 8.0);
  EXPECT_ATTO_ERROR(y.backward(), "backward through the graph a second time");
}

TEST(Engine, DetachStopsGradientAndSharesData) {
  Tensor x = dleaf({2.0});
  Tensor d = x.detach();
  EXPECT_FALSE(d.requires_grad());
  EXPECT_TRUE(d.is_leaf());
  EXPECT_EQ(d.raw_data(), x.raw_data());
  Tensor y = x * d;  // d/dx (x * const) = const
  y.backward();
  EXPECT_DOUBLE_EQ(x.grad().item(), 2.0);
}

TEST(Engine, NoGradGuardIsThreadLocalAndRestores) {
  Tensor x = dleaf({2.0});
  {
    NoGradGuard ng;
    EXPECT_FALSE(is_grad_enabled());
    Tensor y = x * 2.0;
    EXPECT_FALSE(y.requires_grad());
    bool other_thread_enabled = false;
    std::thread t([&] { other_thread_enabled = is_grad_enabled(); });
    t.join();
    EXPECT_TRUE(other_thread_enabled);
    {
      NoGradGuard nested;
      EXPECT_FALSE(is_grad_enabled());
    }
    EXPECT_FALSE(is_grad_enabled());
  }
  EXPECT_TRUE(is_grad_enabled());
  EXPECT_TRUE((x * 2.0).requires_grad());
}

TEST(Engine, RetainGradKeepsNonLeafGradient) {
  Tensor x = dleaf({3.0});
  Tensor h = x * 2.0;
  h.retain_grad();
  Tensor y = h * h;
  y.backward();
  EXPECT_DOUBLE_EQ(h.grad().item(), 12.0);
  EXPECT_DOUBLE_EQ(x.grad().item(), 24.0);
}

TEST(Engine, NonLeafGradNotKeptByDefault) {
  Tensor x = dleaf({3.0});
  Tensor h = x * 2.0;
  (h * h).backward();
  EXPECT_FALSE(h.grad().defined());
}

TEST(Engine, RequiresGradOnlyOnFloatLeaves) {
  Tensor i = zeros({2}, {.dtype = kInt64});
  EXPECT_ATTO_ERROR(i.requires_grad_(), "only float32/float64 tensors can require gradients, got int64");
  Tensor x = dleaf({1.0});
  Tensor y = x * 2.0;
  EXPECT_ATTO_ERROR(y.requires_grad_(false), "can only change requires_grad of a leaf tensor");
}

TEST(Engine, DeepChainBackwardsAndFreesWithoutRecursion) {
  // 100,000 ops: both the backward and the destruction of the graph must not recurse.
  Tensor x = dleaf({1.0});
  Tensor y = x;
  for (int i = 0; i < 100000; ++i) y = y * 1.0;
  y.backward();
  EXPECT_DOUBLE_EQ(x.grad().item(), 1.0);
  // A retained graph of the same depth is freed by dropping the last handle.
  Tensor z = x;
  for (int i = 0; i < 100000; ++i) z = z + 0.0;
  z.backward(Tensor(), true);
  z = Tensor();
  EXPECT_DOUBLE_EQ(x.grad().item(), 2.0);
}

TEST(Engine, DeepChainNeverBackwardedIsFreed) {
  Tensor x = dleaf({1.0});
  Tensor y = x;
  for (int i = 0; i < 100000; ++i) y = y * 1.0;
  y = Tensor();  // destruction of a 100,000-deep graph
  SUCCEED();
}

TEST(Engine, GraphFreedAfterBackward) {
  Tensor x = dleaf({1.0, 2.0}, {2});
  std::weak_ptr<TensorImpl> mid;
  Tensor y;
  {
    Tensor h = x * 2.0;
    mid = h.impl();
    y = (h * h) * 1.0;
  }
  EXPECT_FALSE(mid.expired()) << "the graph keeps the intermediate alive before backward";
  y.backward(ones({2}, {.dtype = kFloat64}));
  EXPECT_TRUE(mid.expired()) << "backward without retain_graph frees the graph";
}

TEST(Engine, ToDtypeIsDifferentiable) {
  Tensor x = dleaf({1.5});
  Tensor f = x.to(kFloat32);
  EXPECT_EQ(f.dtype(), kFloat32);
  (f * f).to(kFloat64).backward();
  EXPECT_DOUBLE_EQ(x.grad().item(), 3.0);
}

TEST(Engine, CloneIsDeepAndDifferentiable) {
  Tensor x = dleaf({1.0, 2.0}, {2});
  Tensor c = x.clone();
  EXPECT_NE(c.raw_data(), x.raw_data());
  (c * c).backward(ones({2}, {.dtype = kFloat64}));
  EXPECT_EQ(x.grad().to_vector<double>(), (std::vector<double>{2, 4}));
}
