// nn::LinearAttention: MultiheadAttention's parameter names, shapes and init; equal to the projections composed
// by hand around linear_attention; causal self-attention as a drop-in; gradcheck in float64.

#include <gtest/gtest.h>

#include <cmath>

#include "autograd/elementwise.h"
#include "autograd/linear_attention.h"
#include "autograd/matmul.h"
#include "autograd/reduce.h"
#include "autograd/shape.h"
#include "nn/attention.h"
#include "nn/linear_attention.h"
#include "testing.h"

namespace attograd::nn {
namespace {

TEST(LinearAttentionModule, SameParametersAsMultiheadAttentionAndXavierInit) {
  Generator g1(1), g2(1);
  LinearAttention la({.embed_dim = 16, .num_heads = 4}, g1);
  MultiheadAttention mha({.embed_dim = 16, .num_heads = 4}, g2);
  const auto a = la.named_parameters(), b = mha.named_parameters();
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].first, b[i].first);
    EXPECT_EQ(a[i].second.shape(), b[i].second.shape()) << a[i].first;
    // Same generator, same order of draws: the same initial values as MultiheadAttention.
    EXPECT_TRUE(testing::bitwise_equal(a[i].second, b[i].second)) << a[i].first;
  }
  const double bound = std::sqrt(6.0 / (16 + 48));  // xavier_uniform_ on (3E, E)
  double max_abs = 0;
  for (double v : la.in_proj_weight.to_vector<double>()) max_abs = std::max(max_abs, std::fabs(v));
  EXPECT_LE(max_abs, bound);
  EXPECT_GT(max_abs, 0.9 * bound);
  EXPECT_EQ(sum(abs(la.in_proj_bias)).item(), 0.0);
  EXPECT_EQ(sum(abs(la.out_proj->bias)).item(), 0.0);
}

TEST(LinearAttentionModule, LoadsAMultiheadAttentionStateDict) {
  // A drop-in: the weights of a trained MultiheadAttention load strictly, and the forward reads them.
  Generator g1(5), g2(6);
  MultiheadAttention mha({.embed_dim = 8, .num_heads = 2}, g1);
  LinearAttention la({.embed_dim = 8, .num_heads = 2}, g2);
  Tensor x = rand({1, 3, 8}, g1);
  const Tensor before = la.forward(x).detach();
  la.load_state_dict(mha.state_dict());
  for (auto& [n, p] : la.named_parameters()) EXPECT_TRUE(testing::bitwise_equal(p, mha.parameter(n))) << n;
  EXPECT_FALSE(testing::bitwise_equal(la.forward(x).detach(), before));
}

TEST(LinearAttentionModule, EqualsTheProjectionsComposedByHand) {
  Generator gen(2);
  LinearAttention la({.embed_dim = 8, .num_heads = 2, .causal = true, .dtype = kFloat64}, gen);
  NoGradGuard no_grad;
  copy_(la.out_proj->bias, rand({8}, gen, {.dtype = kFloat64}));  // non-zero biases: their place matters
  copy_(la.in_proj_bias, rand({24}, gen, {.dtype = kFloat64}));
  Tensor x = rand({2, 5, 8}, gen, {.dtype = kFloat64});
  Tensor qkv = linear(x, la.in_proj_weight, la.in_proj_bias);  // (B, L, 3E)
  auto heads = [&](int64_t i) { return transpose(reshape(narrow(qkv, 2, i * 8, 8), {2, 5, 2, 4}), 1, 2); };
  Tensor o = linear_attention(heads(0), heads(1), heads(2), true);
  Tensor expected = linear(reshape(transpose(o, 1, 2), {2, 5, 8}), la.out_proj->weight, la.out_proj->bias);
  EXPECT_TRUE(testing::all_close(la.forward(x), expected, 1e-14, 1e-13));
  EXPECT_FALSE(testing::bitwise_equal(la.forward(x), la.forward(x, x, x, false)));
}

TEST(LinearAttentionModule, GradcheckFloat64) {
  Generator gen(3);
  LinearAttention la({.embed_dim = 6, .num_heads = 2, .causal = true, .dtype = kFloat64}, gen);
  Tensor x = testing::rand_leaf({2, 4, 6}, gen);
  std::vector<Tensor> inputs{x};
  for (const Tensor& p : la.parameters()) inputs.push_back(p);
  EXPECT_TRUE(testing::gradcheck_ok([&] { return la.forward(x); }, inputs));
}

TEST(LinearAttentionModule, Errors) {
  Generator gen(4);
  EXPECT_THROW(LinearAttention({.embed_dim = 6, .num_heads = 4}, gen), Error);
  LinearAttention la({.embed_dim = 8, .num_heads = 2}, gen);
  EXPECT_THROW(la.forward(zeros({2, 3, 6})), Error);
  EXPECT_THROW(la.forward(zeros({2, 3, 8}), zeros({2, 4, 8}), zeros({2, 4, 8}), true), Error);
  EXPECT_NO_THROW(la.forward(zeros({2, 3, 8}), zeros({2, 4, 8}), zeros({2, 4, 8}), false));
}

// attention_weights: the explicit weights reproduce the layer's causal output exactly (sum_j w_ij v_j per head).
TEST(LinearAttentionModule, ExplicitWeightsReproduceTheCausalOutput) {
  Generator gen(6);
  LinearAttention la({.embed_dim = 8, .num_heads = 2, .causal = true, .dtype = kFloat64}, gen);
  Tensor x = rand({2, 5, 8}, gen, {.dtype = kFloat64});
  NoGradGuard no_grad;
  Tensor w = la.attention_weights(x);  // (B, H, L, L)
  ASSERT_EQ(w.shape(), (Shape{2, 2, 5, 5}));
  Tensor v = transpose(reshape(linear(x, narrow(la.in_proj_weight, 0, 16, 8), narrow(la.in_proj_bias, 0, 16, 8)),
                               {2, 5, 2, 4}),
                       1, 2);                                   // (B, H, L, d)
  Tensor o = reshape(transpose(matmul(w, v), 1, 2), {2, 5, 8});  // concat of the heads
  Tensor want = la.forward(x);
  Tensor got = la.out_proj->forward(o);
  const std::vector<double> a = got.to_vector<double>(), b = want.to_vector<double>();
  for (size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(a[i], b[i], 1e-12) << i;
  const std::vector<double> p = w.to_vector<double>();
  for (int64_t r = 0; r < 2 * 2 * 5; ++r)
    for (int64_t j = r % 5 + 1; j < 5; ++j) {
      EXPECT_EQ(p[static_cast<size_t>(r * 5 + j)], 0);
    }
  EXPECT_THROW(la.attention_weights(zeros({2, 5, 6}, {.dtype = kFloat64})), Error);
}

}  // namespace
}  // namespace attograd::nn
