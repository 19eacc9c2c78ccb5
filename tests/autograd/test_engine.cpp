// The engine: leaves and non-leaves, accumulation, retain_graph, detach, NoGradGuard, deep graphs
// and the errors of backward.

#include <thread>

#include "autograd/allocator.h"
#include "autograd/hooks.h"
#include "testing.h"

using namespace attograd;
using namespace attograd::testing;

namespace {
Tensor dleaf(std::vector<double> v, Shape s = {}) {
  return from_vector<double>(v, s.empty() ? Shape{std::ssize(v)} : s, {.dtype = kFloat64, .requires_grad = true});
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

// ---------------------------------------------------------------------------------------------
// Saved values: layer_norm's output is saved by its consumers as a recompute recipe (not its data), and linear drops
// its saved input before allocating dX when the pass frees the graph.

namespace {
struct LnLinear {  // layer_norm (rows, N) then linear to M features, float32
  Tensor x, w_ln, b_ln, w, b;
  LnLinear(int64_t rows, int64_t N, int64_t M, uint64_t seed) {
    Generator gen(seed);
    x = randn({rows, N}, gen).requires_grad_();
    w_ln = randn({N}, gen).requires_grad_();
    b_ln = randn({N}, gen).requires_grad_();
    w = randn({M, N}, gen).requires_grad_();
    b = randn({M}, gen).requires_grad_();
  }
  Tensor norm() const { return layer_norm(x, {x.size(1)}, w_ln, b_ln, 1e-5); }
  void zero() {
    for (Tensor* t : {&x, &w_ln, &b_ln, &w, &b}) t->zero_grad();
  }
};
}  // namespace

TEST(SavedTensor, LayerNormRecipeGivesTheSavedValuesBitForBit) {
  for (int64_t N : {1, 7, 64, 301}) {  // vector bodies and tails
    LnLinear m(9, N, 5, 11 + static_cast<uint64_t>(N));
    Tensor g = randn({9, 5}, *std::make_unique<Generator>(3));
    linear(m.norm(), m.w, m.b).backward(g);  // linear keeps the recipe: the normalised rows are rebuilt in backward
    std::vector<Tensor> recipe = {m.x.grad(), m.w_ln.grad(), m.b_ln.grad(), m.w.grad(), m.b.grad()};
    m.zero();
    linear(m.norm().clone(), m.w, m.b).backward(g);  // clone's output has no recipe: linear keeps its data
    std::vector<Tensor> data = {m.x.grad(), m.w_ln.grad(), m.b_ln.grad(), m.w.grad(), m.b.grad()};
    for (size_t i = 0; i < recipe.size(); ++i) EXPECT_TRUE(bitwise_equal(recipe[i], data[i])) << "N " << N << " grad " << i;
  }
}

TEST(SavedTensor, LayerNormOutputIsFreedWithTheForwardPass) {
  LnLinear m(256, 256, 8, 5);  // a 256 KiB normalised output
  const size_t before = allocator_stats().allocated_bytes;
  Tensor with_recipe = linear(m.norm(), m.w, m.b);
  const size_t recipe_bytes = allocator_stats().allocated_bytes - before;
  with_recipe = Tensor();
  const size_t before2 = allocator_stats().allocated_bytes;
  Tensor with_copy = linear(m.norm().clone(), m.w, m.b);
  const size_t copy_bytes = allocator_stats().allocated_bytes - before2;
  EXPECT_EQ(copy_bytes - recipe_bytes, allocator_size_class(256 * 256 * 4));
}

TEST(SavedTensor, OutputWrittenBeforeUseIsSavedAsData) {
  for (int mode = 0; mode < 5; ++mode) {
    LnLinear m(4, 6, 3, 21);
    Tensor y = m.norm();
    Tensor expected = y.detach().clone();
    if (mode == 0) {  // an in-place op
      Tensor yy = y;
      mul_(yy, 2.0);
      mul_(expected, 2.0);
    } else if (mode == 1) {  // a write through a view's data pointer
      Tensor v = reshape(y, {24});
      v.data<float>()[5] = 100.0f;
      expected.data<float>()[5] = 100.0f;
    } else if (mode == 2) {  // copy_
      Tensor yy = y;
      Tensor src = full({4, 6}, 0.5);
      copy_(yy, src);
      copy_(expected, src);
    } else if (mode == 3) {  // copy_ into a temporary handle
      Tensor src = full({4, 6}, -0.25);
      copy_(Tensor(y), src);
      copy_(expected, src);
    } else {  // a write through the raw (untyped, writable) pointer of a const handle
      const Tensor& cy = y;
      static_cast<float*>(cy.raw_data())[7] = -50.0f;
      expected.data<float>()[7] = -50.0f;
    }
    Tensor g = ones({4, 3});
    linear(y, m.w, m.b).backward(g);
    // dW = g^T y for the values y held when linear read them
    EXPECT_TRUE(all_close(m.w.grad(), matmul(transpose(g, 0, 1), expected), 1e-4)) << "mode " << mode;
  }
}

TEST(SavedTensor, RecipeServesASecondBackwardWithRetainGraph) {
  LnLinear m(5, 8, 3, 31);
  Tensor out = sum(linear(m.norm(), m.w, m.b));
  out.backward(Tensor(), /*retain_graph=*/true);
  Tensor once = m.w.grad().clone();
  out.backward();
  EXPECT_TRUE(all_close(m.w.grad(), once * 2.0, 0));
  EXPECT_ATTO_ERROR(out.backward(), "backward through the graph a second time");
}

// linear computes dW first and drops its saved input before allocating dX: in an FFN, dX of the second layer takes
// the memory of the hidden layer (kept by nothing else: relu_dropout keeps a bit mask), so the backward's peak is one
// hidden layer lower than with retain_graph (which must keep everything).
TEST(SavedTensor, LinearInputGradientTakesTheMemoryOfItsSavedInput) {
  const int64_t rows = 512, D = 16, F = 512;  // hidden (rows, F) float32: 1 MiB
  Generator gen(41);
  Tensor x = randn({rows, D}, gen), w1 = randn({F, D}, gen).requires_grad_(), w2 = randn({D, F}, gen).requires_grad_();
  auto peak_rise = [&](bool retain) {
    Generator drop(42);
    Tensor loss = sum(linear(relu_dropout(linear(x, w1), 0.1, true, drop), w2));
    w1.zero_grad();
    w2.zero_grad();
    reset_peak_allocator_stats();
    const size_t start = allocator_stats().allocated_bytes;
    loss.backward(Tensor(), retain);
    return allocator_stats().peak_allocated_bytes - start;
  };
  const size_t kept = peak_rise(true), dropped = peak_rise(false);
  EXPECT_EQ(kept - dropped, allocator_size_class(rows * F * 4));
}

// A recipe keeps its op's saved input (layer_norm's x) alive only as long as something may still need it: once the
// consumers and the op itself have run their backward, x is freed, even while the pass goes on (and whether or not a
// handle to the output is still held).
TEST(SavedTensor, RecipeInputsAreFreedAfterTheirOpsBackward) {
  for (bool keep_output_handle : {false, true}) {
    Generator gen(51);
    Tensor x = randn({64, 256}, gen).requires_grad_();
    Tensor w = randn({8, 256}, gen).requires_grad_();
    std::weak_ptr<Storage> a_storage;
    bool checked = false, expired = false;
    Tensor loss, y;
    {
      // a = x through an op whose backward runs after layer_norm's and looks at a's memory then
      Tensor a = record("probe", x.detach().clone(), {x}, [&](const Tensor& g, GradInputs& gi) {
        expired = a_storage.expired();
        checked = true;
        gi[0] = g;
      });
      a_storage = a.impl()->storage;
      Tensor norm = layer_norm(a, {256}, Tensor(), Tensor(), 1e-5);
      if (keep_output_handle) y = norm;
      loss = sum(linear(norm, w));
    }
    EXPECT_FALSE(a_storage.expired());  // layer_norm keeps it for its backward
    loss.backward();
    EXPECT_TRUE(checked);
    EXPECT_TRUE(expired) << "output handle kept: " << keep_output_handle;
  }
}

// ---------------------------------------------------------------------------------------------
// Modified saved tensors (issue 14): an in-place change of a leaf between the forward and the backward is an Error
// naming the op and the tensor (PyTorch's version counter), never gradients of the new values.

TEST(Engine, LeafModifiedInPlaceBeforeBackwardIsAnError) {
  Tensor w = dleaf({1, 2, 3}, {3});
  Tensor x = from_vector(std::vector<double>{4, 5, 6});
  Tensor y = sum(mul(w, x));
  {
    NoGradGuard no_grad;
    copy_(x, from_vector(std::vector<double>{7, 8, 9}));  // x's values are what mul's backward needs for w
  }
  EXPECT_ATTO_ERROR(y.backward(), "input 1 of 'mul' (a leaf tensor of shape [3]) was modified in place");

  Tensor y2 = sum(mul(w, w));
  {
    NoGradGuard no_grad;
    fill_(w, 0.5);  // the parameter itself, as an optimizer step would, but before the backward
  }
  EXPECT_ATTO_ERROR(y2.backward(), "of 'mul' (a leaf tensor of shape [3] that requires grad) was modified");

  Tensor y3 = sum(mul(w, x));
  x.set({0}, 1.0);  // set() counts with grad mode on too
  EXPECT_ATTO_ERROR(y3.backward(), "modified in place");
}

TEST(Engine, ChangesAfterBackwardAndReadsKeepWorking) {
  Tensor w = dleaf({1, 2, 3}, {3});
  Tensor x = from_vector(std::vector<double>{4, 5, 6});
  for (int step = 0; step < 3; ++step) {  // forward, backward, in-place update (an optimizer's order)
    Tensor y = sum(mul(w, x));
    (void)w.raw_data();  // a writable pointer taken to read, with grad mode on: not a change
    y.backward();
    EXPECT_EQ(w.grad().to_vector<double>(), (std::vector<double>{4, 5, 6}));
    NoGradGuard no_grad;
    copy_(w, from_vector(std::vector<double>{1, 2, 3}));
    w.zero_grad(true);
  }
  // retain_graph: a second backward is fine as long as nothing changed in between.
  Tensor y = sum(mul(w, x));
  y.backward(Tensor(), /*retain_graph=*/true);
  y.backward();
  EXPECT_EQ(w.grad().to_vector<double>(), (std::vector<double>{8, 10, 12}));
}

// ---------------------------------------------------------------------------------------------
// Post-accumulate-grad hooks (autograd/hooks.h)

namespace attograd {
namespace {

// A hook runs once per leaf and backward pass, after the leaf's gradient of the pass (all its uses summed) is in
// .grad; hooks of one leaf run in registration order; removing the handle removes the hook.
TEST(GradHooks, RunOncePerLeafWithTheAccumulatedGradient) {
  Tensor w = from_vector<float>({1.0f, 2.0f}).requires_grad_();
  Tensor b = from_vector<float>({0.5f}).requires_grad_();
  std::vector<std::string> calls;
  std::vector<float> seen;
  GradHookHandle h1 = register_post_accumulate_grad_hook(w, [&](const Tensor& t) {
    calls.push_back("w1");
    seen = t.grad().to_vector<float>();
  });
  GradHookHandle h2 = register_post_accumulate_grad_hook(w, [&](const Tensor&) { calls.push_back("w2"); });
  GradHookHandle hb = register_post_accumulate_grad_hook(b, [&](const Tensor&) { calls.push_back("b"); });
  // w used twice: d/dw sum(w * w + 3 w) = 2 w + 3.
  (sum(w * w + w * 3.0) + sum(b)).backward();
  ASSERT_EQ(calls.size(), 3u);
  EXPECT_EQ(std::count(calls.begin(), calls.end(), "w1"), 1);
  EXPECT_LT(std::find(calls.begin(), calls.end(), "w1"), std::find(calls.begin(), calls.end(), "w2"));
  EXPECT_EQ(seen, (std::vector<float>{5.0f, 7.0f}));
  // A second pass accumulates: the hook sees the sum so far.
  h2.remove();
  hb = GradHookHandle();
  calls.clear();
  sum(w * 2.0).backward();
  EXPECT_EQ(calls, std::vector<std::string>{"w1"});
  EXPECT_EQ(seen, (std::vector<float>{7.0f, 9.0f}));
  h1.remove();
  sum(w * 2.0).backward();
  EXPECT_EQ(calls.size(), 1u) << "a removed hook runs no more";
}

TEST(GradHooks, OnlyOnLeavesThatRequireGrad) {
  Tensor w = from_vector<float>({1.0f}).requires_grad_();
  const auto noop = [](const Tensor&) {};
  EXPECT_THROW(register_post_accumulate_grad_hook(w * 2.0, noop), Error);
  EXPECT_THROW(register_post_accumulate_grad_hook(from_vector<float>({1.0f}), noop), Error);
  EXPECT_THROW(register_post_accumulate_grad_hook(Tensor(), noop), Error);
}

}  // namespace
}  // namespace attograd
