// checkpoint(): gradients bitwise equal to the plain run (dropout replayed from the default and named generators),
// a float64 gradcheck, nesting, grad mode off, generator states after the backward, and the errors.

#include <gtest/gtest.h>

#include "autograd/activation.h"
#include "autograd/attention.h"
#include "autograd/checkpoint.h"
#include "autograd/dropout.h"
#include "autograd/elementwise.h"
#include "autograd/matmul.h"
#include "autograd/norm.h"
#include "autograd/reduce.h"
#include "testing.h"

namespace attograd {
namespace {

using testing::bitwise_equal;

// A small block of plain ops that draws from two generators: layer_norm -> linear -> gelu -> dropout (default
// generator) -> linear -> dropout (own generator) -> + residual.
struct PlainBlock {
  Tensor w1, b1, w2, ln_w, ln_b;
  Generator* own = nullptr;
  Tensor operator()(const Tensor& x) const {
    Tensor h = layer_norm(x, {x.size(-1)}, ln_w, ln_b, 1e-5);
    h = gelu(linear(h, w1, b1));
    h = dropout(h, 0.3, true);  // default_generator()
    h = linear(h, w2);
    return add(x, dropout(h, 0.2, true, *own));
  }
  std::vector<Tensor> params() const { return {w1, b1, w2, ln_w, ln_b}; }
};

PlainBlock make_block(Generator& init, Generator& own, int64_t d, Dtype dtype) {
  auto leaf = [&](const Shape& s) { return mul(rand(s, init, {.dtype = dtype}), 0.5).detach().requires_grad_(true); };
  return {leaf({2 * d, d}), leaf({2 * d}), leaf({d, 2 * d}), leaf({d}), leaf({d}), &own};
}

// Loss of a stack of `n` blocks over x, checkpointing each block or not; returns the gradients of x and of every
// parameter after backward (and leaves the generators where the run left them).
std::vector<Tensor> stack_grads(const std::vector<PlainBlock>& blocks, const Tensor& x, bool ckpt, Generator& own) {
  Tensor h = mul(x, 1.5);  // a non-leaf input, as in a model
  for (const PlainBlock& b : blocks) {
    if (ckpt)
      h = checkpoint([&b](const std::vector<Tensor>& in) { return b(in[0]); }, {h}, {.generators = {&own}});
    else
      h = b(h);
  }
  Tensor loss = sum(mul(h, h));
  loss.backward();
  std::vector<Tensor> g{x.grad()};
  for (const PlainBlock& b : blocks)
    for (const Tensor& p : b.params()) g.push_back(p.grad());
  return g;
}

TEST(Checkpoint, StackOfPlainBlocksGivesBitwiseEqualGradientsWithDropout) {
  for (Dtype dtype : {kFloat32, kFloat64}) {
    Generator init(7), own(11);
    std::vector<PlainBlock> blocks;
    for (int i = 0; i < 3; ++i) blocks.push_back(make_block(init, own, 8, dtype));
    Tensor x = rand({2, 5, 8}, init, {.dtype = dtype}).requires_grad_(true);

    manual_seed(123);
    own.manual_seed(456);
    const std::vector<Tensor> plain = stack_grads(blocks, x, false, own);
    const GeneratorState after_plain = default_generator().get_state(), own_after_plain = own.get_state();
    std::vector<Tensor> plain_copy;
    for (const Tensor& g : plain) plain_copy.push_back(g.clone());
    x.zero_grad(true);
    for (const PlainBlock& b : blocks)
      for (Tensor p : b.params()) p.zero_grad(true);

    manual_seed(123);
    own.manual_seed(456);
    const std::vector<Tensor> ck = stack_grads(blocks, x, true, own);
    ASSERT_EQ(ck.size(), plain_copy.size());
    for (size_t i = 0; i < ck.size(); ++i) {
      ASSERT_TRUE(ck[i].defined()) << "gradient " << i;
      EXPECT_TRUE(bitwise_equal(ck[i], plain_copy[i])) << "gradient " << i << " " << dtype_name(dtype);
    }
    // The backward put the generators back where the forward left them: later draws do not change.
    EXPECT_EQ(default_generator().get_state(), after_plain);
    EXPECT_EQ(own.get_state(), own_after_plain);
    // Dropout did draw (the masks matter): a different seed gives different gradients.
    x.zero_grad(true);
    for (const PlainBlock& b : blocks)
      for (Tensor p : b.params()) p.zero_grad(true);
    manual_seed(124);
    own.manual_seed(456);
    const std::vector<Tensor> other = stack_grads(blocks, x, true, own);
    EXPECT_FALSE(bitwise_equal(other[0], plain_copy[0]));
  }
}

TEST(Checkpoint, ForgettingAGeneratorChangesTheMasks) {
  // Without naming `own`, the recomputation draws the next dropout mask from it instead of the forward's: the
  // gradients differ from the plain run's (which is why the generators must be named).
  Generator init(3), own(5);
  PlainBlock b = make_block(init, own, 6, kFloat64);
  Tensor x = rand({3, 6}, init, {.dtype = kFloat64}).requires_grad_(true);
  manual_seed(8);
  own.manual_seed(9);
  sum(b(x)).backward();
  const Tensor plain = x.grad().clone();
  x.zero_grad(true);
  manual_seed(8);
  own.manual_seed(9);
  sum(checkpoint([&b](const std::vector<Tensor>& in) { return b(in[0]); }, {x})).backward();
  EXPECT_FALSE(bitwise_equal(x.grad(), plain));
  x.zero_grad(true);
  manual_seed(8);
  own.manual_seed(9);
  sum(checkpoint([&b](const std::vector<Tensor>& in) { return b(in[0]); }, {x}, {.generators = {&own}})).backward();
  EXPECT_TRUE(bitwise_equal(x.grad(), plain));
}

TEST(Checkpoint, GradcheckFloat64) {
  Generator init(21), own(22);
  PlainBlock b = make_block(init, own, 4, kFloat64);
  Tensor x = testing::rand_leaf({2, 3, 4}, init);
  std::vector<Tensor> inputs{x};
  for (const Tensor& p : b.params()) inputs.push_back(p);
  auto f = [&] {
    manual_seed(77);
    own.manual_seed(78);
    return checkpoint([&b](const std::vector<Tensor>& in) { return b(in[0]); }, {x}, {.generators = {&own}});
  };
  EXPECT_TRUE(testing::gradcheck_ok(f, inputs));
}

TEST(Checkpoint, SeveralInputsDuplicatesAndUnusedInputs) {
  Generator gen(4);
  Tensor a = testing::rand_leaf({3, 4}, gen), b = testing::rand_leaf({4, 2}, gen), u = testing::rand_leaf({5}, gen);
  auto fn = [](const std::vector<Tensor>& in) { return tanh(matmul(mul(in[0], in[1]), in[2])); };
  Tensor plain = sum(exp(fn({a, a, b})));
  plain.backward();
  const Tensor ga = a.grad().clone(), gb = b.grad().clone();
  a.zero_grad(true);
  b.zero_grad(true);
  Tensor ck = sum(exp(checkpoint(
      [&](const std::vector<Tensor>& in) {
        return fn({in[0], in[1], in[2]});
      },
      {a, a, b, u})));
  EXPECT_TRUE(bitwise_equal(ck, plain));
  ck.backward();
  EXPECT_TRUE(testing::all_close(a.grad(), ga, 1e-15, 1e-14));  // a's two uses summed in another order
  EXPECT_TRUE(bitwise_equal(b.grad(), gb));
  EXPECT_FALSE(u.grad().defined());  // unused: no gradient, as in PyTorch
}

TEST(Checkpoint, NestedCheckpointsEqualThePlainRun) {
  Generator init(31), own(32);
  PlainBlock b1 = make_block(init, own, 5, kFloat64), b2 = make_block(init, own, 5, kFloat64);
  Tensor x = testing::rand_leaf({2, 5}, init);
  auto both = [&](const Tensor& h) { return b2(b1(h)); };
  manual_seed(1);
  own.manual_seed(2);
  sum(both(x)).backward();
  const Tensor gx = x.grad().clone(), gw = b1.w1.grad().clone();
  x.zero_grad(true);
  b1.w1.zero_grad(true);
  b1.w2.zero_grad(true);
  manual_seed(1);
  own.manual_seed(2);
  CheckpointOptions o{.generators = {&own}};
  Tensor y = checkpoint(
      [&](const std::vector<Tensor>& in) {
        Tensor h = checkpoint([&](const std::vector<Tensor>& i2) { return b1(i2[0]); }, {in[0]}, o);
        return b2(h);
      },
      {x}, o);
  sum(y).backward();
  EXPECT_TRUE(bitwise_equal(x.grad(), gx));
  EXPECT_TRUE(bitwise_equal(b1.w1.grad(), gw));
}

TEST(Checkpoint, KeepsNoActivationsAndRecordsOneNode) {
  Generator gen(5);
  Tensor x = testing::rand_leaf({4, 4}, gen);
  int calls = 0;
  Tensor y = checkpoint(
      [&](const std::vector<Tensor>& in) {
        ++calls;
        EXPECT_EQ(is_grad_enabled(), calls > 1);  // the forward records nothing; the recomputation does
        return exp(tanh(in[0]));
      },
      {x});
  EXPECT_EQ(y.grad_fn_name(), "checkpoint");
  EXPECT_EQ(calls, 1);
  sum(y).backward();
  EXPECT_EQ(calls, 2);
  EXPECT_TRUE(testing::all_close(x.grad(), mul(exp(tanh(x)), 1.0 - mul(tanh(x), tanh(x))).detach(), 1e-14));
}

TEST(Checkpoint, GradModeOffRunsTheFunction) {
  Generator gen(6);
  Tensor x = testing::rand_leaf({3}, gen);
  NoGradGuard no_grad;
  Tensor y = checkpoint([](const std::vector<Tensor>& in) { return exp(in[0]); }, {x});
  EXPECT_FALSE(y.requires_grad());
  EXPECT_TRUE(bitwise_equal(y, exp(x)));
}

TEST(Checkpoint, TensorsUsedBeforeKeepTheirVersions) {
  // The no-grad forward only reads: a leaf that an earlier recorded op noted (Node::leaf_versions) is not counted as
  // changed in place, so the earlier op's backward still runs (the mask too is read by both).
  Generator gen(8);
  Tensor x = testing::rand_leaf({1, 2, 4, 3}, gen);
  Tensor mask = from_vector(std::vector<bool>{false, true, true, true, false, false, true, true,  //
                                              false, false, false, true, false, false, false, false},
                            {4, 4});
  auto attend = [&mask](const Tensor& t) { return scaled_dot_product_attention(t, t, t, {.attn_mask = mask}).output; };
  Tensor a = mul(attend(x), x);  // notes the versions of x and the mask
  const uint32_t vx = x.impl()->storage->version;
  Tensor y = checkpoint([&](const std::vector<Tensor>& in) { return attend(in[0]); }, {x});
  EXPECT_EQ(x.impl()->storage->version, vx);
  EXPECT_NO_THROW(sum(add(a, y)).backward());
  EXPECT_TRUE(x.grad().defined());
}

TEST(Checkpoint, Errors) {
  Generator gen(9);
  Tensor x = rand({2, 2}, gen, {.dtype = kFloat64});
  auto f = [](const std::vector<Tensor>& in) { return exp(in[0]); };
  try {
    checkpoint(f, {x});
    FAIL() << "no input requires grad";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("none of the 1 inputs (shapes [[2, 2]]) requires grad"), std::string::npos)
        << e.what();
  }
  Tensor l = testing::rand_leaf({2}, gen);
  EXPECT_THROW(checkpoint(f, {l, Tensor()}), Error);
  EXPECT_THROW(checkpoint(CheckpointFn(), {l}), Error);
  EXPECT_THROW(checkpoint(f, {l}, {.generators = {nullptr}}), Error);
  EXPECT_THROW(checkpoint([](const std::vector<Tensor>&) { return Tensor(); }, {l}), Error);
  EXPECT_THROW(checkpoint([](const std::vector<Tensor>& in) { return gt(in[0], 0.0); }, {l}), Error);
  // A function that is not deterministic (its shape changes) is caught by the recomputation.
  int calls = 0;
  Tensor y = checkpoint(
      [&](const std::vector<Tensor>& in) {
        return ++calls == 1 ? exp(in[0]) : exp(reshape(in[0], {1, 2}));
      },
      {l});
  EXPECT_THROW(sum(y).backward(), Error);
}

}  // namespace
}  // namespace attograd
