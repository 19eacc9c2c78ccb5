// MultiheadAttention (torch.nn.MultiheadAttention, batch-first): PyTorch 1.13 goldens (tests/nn/golden_attention.py),
// parameter names, float64 gradchecks with masks and dropout, fully blocked queries, and errors. The seed's
// attention sublayer is tested in tests/nn/seed/test_attention.cpp.

#include <algorithm>
#include <cmath>
#include <tuple>

#include "autograd/indexing.h"
#include "autograd/reduce.h"
#include "autograd/shape.h"
#include "nn/attention.h"
#include "nn/init.h"
#include "nn/masks.h"
#include "testing.h"
#include "nn_golden.h"

using namespace attograd;
using namespace attograd::testing;
using namespace attograd::nn;

// ---------------------------------------------------------------------------------------------
// PyTorch 1.13 goldens: nn.MultiheadAttention(batch_first=True), eval mode

class MhaGolden : public ::testing::TestWithParam<std::string> {};

TEST_P(MhaGolden, MatchesPyTorch) {
  Golden g = load_golden("nn/mha_" + GetParam() + ".golden");
  const std::vector<int64_t> cfg = g.at("config").to_vector<int64_t>();
  // [E, H, kdim, vdim, bias, add_bias_kv, add_zero_attn, average_attn_weights, is_causal, self_attention]
  Generator gen(1);
  MultiheadAttention mha({.embed_dim = cfg[0],
                          .num_heads = cfg[1],
                          .bias = cfg[4] != 0,
                          .add_bias_kv = cfg[5] != 0,
                          .add_zero_attn = cfg[6] != 0,
                          .kdim = cfg[2],
                          .vdim = cfg[3]},
                         gen);
  mha.eval();
  const std::vector<GoldenParam> gp = golden_params(g);
  expect_names_and_load(mha, gp);

  const bool self = cfg[9] != 0;
  Tensor q = leaf(g.at("query"));
  Tensor k = self ? q : leaf(g.at("key"));
  Tensor v = self ? q : leaf(g.at("value"));
  MhaForwardOptions fo;
  if (g.count("key_padding_mask")) fo.key_padding_mask = g.at("key_padding_mask");
  if (g.count("attn_mask")) fo.attn_mask = g.at("attn_mask");  // PyTorch got it OR-ed with the causal mask
  fo.average_attn_weights = cfg[7] != 0;
  fo.is_causal = cfg[8] != 0;

  MhaResult r = mha(q, k, v, fo);
  EXPECT_TRUE(all_close(r.output, g.at("output"), 1e-5));
  EXPECT_TRUE(all_close(r.weights, g.at("weights"), 1e-5));
  r.output.backward(g.at("grad_output"));
  EXPECT_TRUE(all_close(q.grad(), g.at("grad.query"), 1e-5, 1e-4));
  if (!self) {
    EXPECT_TRUE(all_close(k.grad(), g.at("grad.key"), 1e-5, 1e-4));
    EXPECT_TRUE(all_close(v.grad(), g.at("grad.value"), 1e-5, 1e-4));
  }
  expect_param_grads(mha, g, gp);
}

INSTANTIATE_TEST_SUITE_P(Attention, MhaGolden,
                         ::testing::Values("nomask", "self", "kpm_bool", "kpm_float", "mask2d_bool", "mask2d_float",
                                           "mask3d_bool_kpm", "mask3d_float", "causal", "causal_cross", "kdim_vdim",
                                           "bias_kv", "zero_attn", "bias_kv_zero_attn", "causal_bias_kv", "no_bias"),
                         [](const ::testing::TestParamInfo<std::string>& info) { return info.param; });

// ---------------------------------------------------------------------------------------------
// Parameters: names, order, shapes, init

TEST(MultiheadAttention, ParameterNamesOrderAndShapesArePyTorchs) {
  Generator gen(3);
  MultiheadAttention a({.embed_dim = 8, .num_heads = 2}, gen);
  EXPECT_EQ(names_of(a),
            (std::vector<std::string>{"in_proj_weight", "in_proj_bias", "out_proj.weight", "out_proj.bias"}));
  EXPECT_EQ(a.in_proj_weight.shape(), Shape({24, 8}));
  EXPECT_EQ(a.in_proj_bias.shape(), Shape({24}));
  EXPECT_EQ(a.out_proj->weight.shape(), Shape({8, 8}));
  EXPECT_EQ(a.num_parameters(), 24 * 8 + 24 + 64 + 8);
  EXPECT_EQ(a.head_dim(), 4);

  MultiheadAttention b({.embed_dim = 8, .num_heads = 4, .add_bias_kv = true, .kdim = 3, .vdim = 5}, gen);
  EXPECT_EQ(names_of(b), (std::vector<std::string>{"q_proj_weight", "k_proj_weight", "v_proj_weight", "in_proj_bias",
                                                   "bias_k", "bias_v", "out_proj.weight", "out_proj.bias"}));
  EXPECT_EQ(b.k_proj_weight.shape(), Shape({8, 3}));
  EXPECT_EQ(b.v_proj_weight.shape(), Shape({8, 5}));
  EXPECT_EQ(b.bias_k.shape(), Shape({1, 1, 8}));
  EXPECT_FALSE(b.in_proj_weight.defined());

  // kdim = vdim = embed_dim given explicitly is the packed layout, as in PyTorch.
  MultiheadAttention c({.embed_dim = 6, .num_heads = 3, .bias = false, .kdim = 6, .vdim = 6}, gen);
  EXPECT_EQ(names_of(c), (std::vector<std::string>{"in_proj_weight", "out_proj.weight"}));
  EXPECT_FALSE(c.out_proj->bias.defined());
  EXPECT_EQ(c.options().kdim, 6);
  EXPECT_EQ(c.to_string(), "MultiheadAttention(\n  (out_proj): Linear(in_features=6, out_features=6, bias=False)\n)");
}

TEST(MultiheadAttention, InitIsPyTorchs) {
  Generator gen(4);
  const int64_t E = 32;
  MultiheadAttention a({.embed_dim = E, .num_heads = 4, .add_bias_kv = true}, gen);
  const double bound = std::sqrt(6.0 / (E + 3 * E));  // xavier_uniform_ on (3E, E)
  double mx = 0;
  for (double w : a.in_proj_weight.to_vector<double>()) mx = std::max(mx, std::fabs(w));
  EXPECT_LE(mx, bound);
  EXPECT_GT(mx, 0.95 * bound);
  for (double b : a.in_proj_bias.to_vector<double>()) EXPECT_EQ(b, 0.0);
  for (double b : a.out_proj->bias.to_vector<double>()) EXPECT_EQ(b, 0.0);
  const double lin = 1.0 / std::sqrt(double(E));  // Linear's default on out_proj.weight
  for (double w : a.out_proj->weight.to_vector<double>()) EXPECT_LE(std::fabs(w), lin);
  double s2 = 0;  // xavier_normal_ on (1, 1, E): fan_in = fan_out = E, std = sqrt(1 / E)
  for (double w : a.bias_k.to_vector<double>()) s2 += w * w;
  EXPECT_GT(s2, 0.0);
  EXPECT_LT(std::sqrt(s2 / E), 3.0 * std::sqrt(1.0 / E));

  Generator g1(5), g2(5);
  MultiheadAttention x({.embed_dim = 8, .num_heads = 2}, g1), y({.embed_dim = 8, .num_heads = 2}, g2);
  EXPECT_EQ(x.in_proj_weight.to_vector<float>(), y.in_proj_weight.to_vector<float>());
  EXPECT_EQ(x.out_proj->weight.to_vector<float>(), y.out_proj->weight.to_vector<float>());
}

// ---------------------------------------------------------------------------------------------
// Behaviour

TEST(MultiheadAttention, WeightsAveragedOrPerHeadAndOptional) {
  Generator gen(7);
  MultiheadAttention mha({.embed_dim = 6, .num_heads = 3}, gen);
  Tensor q = randn({2, 3, 6}, gen), kv = randn({2, 5, 6}, gen);
  MhaResult avg = mha(q, kv, kv);
  MhaResult per = mha(q, kv, kv, {.average_attn_weights = false});
  MhaResult none = mha(q, kv, kv, {.need_weights = false});
  ASSERT_EQ(avg.weights.shape(), Shape({2, 3, 5}));
  ASSERT_EQ(per.weights.shape(), Shape({2, 3, 3, 5}));
  EXPECT_FALSE(none.weights.defined());
  EXPECT_TRUE(all_close(none.output, avg.output, 0));
  EXPECT_TRUE(all_close(avg.weights, mean(per.weights, {1}), 1e-7));
  EXPECT_TRUE(all_close(sum(per.weights, {-1}), ones({2, 3, 3}), 1e-6));
}

TEST(MultiheadAttention, IsCausalEqualsExplicitCausalMask) {
  Generator gen(8);
  MultiheadAttention mha({.embed_dim = 4, .num_heads = 2, .add_zero_attn = true}, gen);
  Tensor x = randn({2, 4, 4}, gen);
  Tensor kpm = zeros({2, 4}, {.dtype = kBool});
  kpm.set({1, 3}, 1);
  MhaResult a = mha(x, x, x, {.key_padding_mask = kpm, .is_causal = true});
  MhaResult b = mha(x, x, x, {.key_padding_mask = kpm, .attn_mask = causal_mask(4)});
  EXPECT_TRUE(all_close(a.output, b.output, 1e-6));
  EXPECT_TRUE(all_close(a.weights, b.weights, 1e-7));
  // The zero-attention key (last column) stays visible under is_causal.
  EXPECT_GT(a.weights.at({0, 0, 4}), 0.0);
  EXPECT_EQ(a.weights.at({0, 0, 1}), 0.0);
}

TEST(MultiheadAttention, FullyBlockedQueryGivesOutProjBiasAndFiniteZeroGradients) {
  Generator gen(9);
  MultiheadAttention mha({.embed_dim = 4, .num_heads = 2}, gen);
  {
    NoGradGuard no_grad;
    init::uniform_(mha.out_proj->bias, -1, 1, gen);
  }
  Tensor q = leaf(randn({2, 3, 4}, gen)), k = leaf(randn({2, 5, 4}, gen)), v = leaf(randn({2, 5, 4}, gen));
  Tensor am = zeros({3, 5}, {.dtype = kBool});
  for (int64_t j = 0; j < 5; ++j) am.set({1, j}, 1);  // query 1 sees nothing
  MhaResult r = mha(q, k, v, {.attn_mask = am, .average_attn_weights = false});
  ASSERT_TRUE(all_finite(r.output));
  ASSERT_TRUE(all_finite(r.weights));
  for (int64_t b = 0; b < 2; ++b) {
    for (int64_t e = 0; e < 4; ++e) EXPECT_FLOAT_EQ(r.output.at({b, 1, e}), mha.out_proj->bias.at({e}));
    for (int64_t h = 0; h < 2; ++h)
      for (int64_t j = 0; j < 5; ++j) EXPECT_EQ(r.weights.at({b, h, 1, j}), 0.0);
  }
  r.output.backward(ones({2, 3, 4}));
  for (const Tensor& t : {q.grad(), k.grad(), v.grad()}) EXPECT_TRUE(all_finite(t));
  for (auto& p : mha.parameters()) EXPECT_TRUE(all_finite(p.grad()));
  for (int64_t b = 0; b < 2; ++b)
    for (int64_t e = 0; e < 4; ++e) EXPECT_EQ(q.grad().at({b, 1, e}), 0.0);

  // A batch whose keys are all padding: every query of it gives out_proj.bias.
  Tensor kpm = zeros({2, 5}, {.dtype = kBool});
  for (int64_t j = 0; j < 5; ++j) kpm.set({0, j}, 1);
  MhaResult p = mha(q, k, v, {.key_padding_mask = kpm});
  ASSERT_TRUE(all_finite(p.output));
  for (int64_t i = 0; i < 3; ++i)
    for (int64_t e = 0; e < 4; ++e) EXPECT_FLOAT_EQ(p.output.at({0, i, e}), mha.out_proj->bias.at({e}));
}

TEST(MultiheadAttention, DropoutReplaysWithTheSameGeneratorAndIsOffInEval) {
  Generator gen(10), drop(11);
  MultiheadAttention mha({.embed_dim = 4, .num_heads = 2, .dropout = 0.5}, gen);
  mha.set_generator(drop);
  Tensor x = randn({2, 6, 4}, gen);
  drop.manual_seed(1);
  MhaResult a = mha(x, x, x, {.average_attn_weights = false});
  drop.manual_seed(1);
  MhaResult b = mha(x, x, x, {.average_attn_weights = false});
  MhaResult c = mha(x, x, x, {.average_attn_weights = false});
  EXPECT_TRUE(all_close(a.output, b.output, 0));
  EXPECT_FALSE(all_close(a.output, c.output, 1e-6));
  int zeros_seen = 0;  // dropped probabilities are zero, kept ones scaled by 2
  for (double w : a.weights.to_vector<double>()) zeros_seen += w == 0.0;
  EXPECT_GT(zeros_seen, 0);
  mha.eval();
  MhaResult e1 = mha(x, x, x), e2 = mha(x, x, x);
  EXPECT_TRUE(all_close(e1.output, e2.output, 0));
  EXPECT_TRUE(all_close(sum(e1.weights, {-1}), ones({2, 6}), 1e-6));
}

// ---------------------------------------------------------------------------------------------
// Gradchecks (float64) over inputs and parameters

TEST(MultiheadAttention, GradcheckSelfAttentionPaddingAndCausal) {
  Generator gen(20);
  MultiheadAttention mha({.embed_dim = 4, .num_heads = 2}, gen);
  mha.to(kFloat64);
  Tensor x = rand_leaf({2, 4, 4}, gen);
  Tensor kpm = zeros({2, 4}, {.dtype = kBool});
  kpm.set({0, 3}, 1);
  kpm.set({1, 2}, 1);
  MhaForwardOptions fo{.key_padding_mask = kpm, .is_causal = true};
  EXPECT_GRADCHECK([&] { return mha(x, x, x, fo).output; }, with_params({x}, mha, gen));
}

TEST(MultiheadAttention, GradcheckCrossAttentionBiasKvZeroAttnFloatMaskCausal) {
  Generator gen(21);
  MultiheadAttention mha(
      {.embed_dim = 4, .num_heads = 2, .add_bias_kv = true, .add_zero_attn = true, .kdim = 3, .vdim = 5}, gen);
  mha.to(kFloat64);
  Tensor q = rand_leaf({2, 3, 4}, gen), k = rand_leaf({2, 4, 3}, gen), v = rand_leaf({2, 4, 5}, gen);
  Tensor am = rand({3, 4}, gen, {.dtype = kFloat64});
  am.set({2, 0}, -INFINITY);
  Tensor kpm = zeros({2, 4}, {.dtype = kBool});
  kpm.set({1, 0}, 1);
  MhaForwardOptions fo{.key_padding_mask = kpm, .attn_mask = am, .is_causal = true};
  EXPECT_GRADCHECK([&] { return mha(q, k, v, fo).output; }, with_params({q, k, v}, mha, gen));
}

TEST(MultiheadAttention, GradcheckFullyBlockedQueryAnd3dMask) {
  Generator gen(22);
  MultiheadAttention mha({.embed_dim = 6, .num_heads = 3}, gen);
  mha.to(kFloat64);
  Tensor q = rand_leaf({2, 3, 6}, gen), k = rand_leaf({2, 4, 6}, gen), v = rand_leaf({2, 4, 6}, gen);
  Tensor am = zeros({6, 3, 4}, {.dtype = kBool});  // (B * H, Lq, Lk)
  am.set({0, 0, 1}, 1);
  am.set({4, 2, 3}, 1);
  for (int64_t j = 0; j < 4; ++j) am.set({2, 1, j}, 1);  // batch 0, head 2, query 1 sees nothing
  Tensor kpm = zeros({2, 4}, {.dtype = kBool});
  kpm.set({1, 1}, 1);
  MhaForwardOptions fo{.key_padding_mask = kpm, .attn_mask = am};
  EXPECT_GRADCHECK([&] { return mha(q, k, v, fo).output; }, with_params({q, k, v}, mha, gen));
}

TEST(MultiheadAttention, GradcheckWithDropoutReplayed) {
  Generator gen(23), drop(0);
  MultiheadAttention mha({.embed_dim = 4, .num_heads = 2, .dropout = 0.3}, gen);
  mha.to(kFloat64);
  mha.set_generator(drop);
  ASSERT_TRUE(mha.is_training());
  Tensor q = rand_leaf({2, 3, 4}, gen), kv = rand_leaf({2, 5, 4}, gen);
  auto f = [&] {
    drop.manual_seed(77);  // the same masks at every evaluation
    return mha(q, kv, kv).output;
  };
  EXPECT_GRADCHECK(f, with_params({q, kv}, mha, gen));
}

// ---------------------------------------------------------------------------------------------
// Errors

TEST(MultiheadAttention, Errors) {
  EXPECT_ATTO_ERROR(MultiheadAttention({.embed_dim = 6, .num_heads = 4}),
                    "MultiheadAttention: embed_dim must be divisible by num_heads, got embed_dim=6, num_heads=4");
  EXPECT_ATTO_ERROR(MultiheadAttention({.embed_dim = 4, .num_heads = 0}), "must be positive");
  EXPECT_ATTO_ERROR(MultiheadAttention({.embed_dim = 4, .num_heads = 2, .dropout = 1.0}),
                    "dropout must be in [0, 1), got 1");
  Generator gen(30);
  MultiheadAttention mha({.embed_dim = 4, .num_heads = 2}, gen);
  Tensor q = randn({2, 3, 4}, gen), kv = randn({2, 5, 4}, gen);
  EXPECT_ATTO_ERROR(mha(randn({2, 3, 5}, gen), kv, kv),
                    "MultiheadAttention: expected batch-first query (B, Lq, 4), key (B, Lk, 4), value (B, Lk, 4), "
                    "got query [2, 3, 5], key [2, 5, 4], value [2, 5, 4]");
  EXPECT_ATTO_ERROR(mha(randn({3, 4}, gen), kv, kv), "got query [3, 4]");
  EXPECT_ATTO_ERROR(mha(q, randn({3, 5, 4}, gen), randn({3, 5, 4}, gen)),
                    "batch sizes differ: query [2, 3, 4], key [3, 5, 4], value [3, 5, 4]");
  EXPECT_ATTO_ERROR(mha(q, kv, randn({2, 6, 4}, gen)), "key and value lengths differ: key [2, 5, 4], value [2, 6, 4]");
  EXPECT_ATTO_ERROR(mha(q.to(kFloat64), kv.to(kFloat64), kv.to(kFloat64)),
                    "dtype mismatch: parameters are float32, query float64");
  EXPECT_ATTO_ERROR(mha(q, kv, kv, {.key_padding_mask = zeros({2, 4}, {.dtype = kBool})}),
                    "key_padding_mask must have shape (B, Lk) = [2, 5], got [2, 4]");
  EXPECT_ATTO_ERROR(mha(q, kv, kv, {.key_padding_mask = zeros({2, 5}, {.dtype = kInt64})}),
                    "key_padding_mask must be bool or float32, got int64");
  EXPECT_ATTO_ERROR(mha(q, kv, kv, {.attn_mask = zeros({3, 4}, {.dtype = kBool})}),
                    "attn_mask must have shape (Lq, Lk) = [3, 5] or (B * num_heads, Lq, Lk) = [4, 3, 5], got [3, 4]");
  EXPECT_ATTO_ERROR(mha(q, kv, kv, {.attn_mask = zeros({2, 3, 5}, {.dtype = kBool})}), "got [2, 3, 5]");
  EXPECT_ATTO_ERROR(mha(q, kv, kv, {.attn_mask = zeros({3, 5}, {.dtype = kFloat64})}),
                    "attn_mask must be bool or float32, got float64");
  EXPECT_ATTO_ERROR(mha(q, kv, kv, {.attn_mask = zeros({3, 5}, {.dtype = kInt64})}),
                    "attn_mask must be bool or float32, got int64");
  MultiheadAttention kv_dims({.embed_dim = 4, .num_heads = 2, .kdim = 3, .vdim = 5}, gen);
  EXPECT_ATTO_ERROR(kv_dims(q, kv, kv), "key (B, Lk, 3), value (B, Lk, 5), got query [2, 3, 4], key [2, 5, 4]");
}
