// The seed's attention sublayer (seed::AttentionSublayer, nn/seed/attention.h; jadore801120/
// attention-is-all-you-need-pytorch's transformer/SubLayers.py MultiHeadAttention): goldens from the seed's code
// written out in tests/nn/golden_attention.py, parameter names and init, mask shapes, fully blocked queries, float64
// gradchecks with masks and dropout, and errors.

#include <cmath>

#include "autograd/indexing.h"
#include "autograd/reduce.h"
#include "autograd/shape.h"
#include "nn/init.h"
#include "nn/masks.h"
#include "nn/nn_golden.h"
#include "nn/seed/attention.h"
#include "testing.h"

using namespace attograd;
using namespace attograd::testing;
using namespace attograd::nn;
using namespace attograd::nn::seed;

// ---------------------------------------------------------------------------------------------
// Goldens: the seed's module in PyTorch 1.13, eval mode

// The seed's MultiHeadAttention, written out in golden_attention.py. Its masks are true = attend; attograd's are
// true = blocked, so the test passes the negation.
class AttentionSublayerGolden : public ::testing::TestWithParam<std::string> {};

TEST_P(AttentionSublayerGolden, MatchesSeedInPyTorch) {
  Golden g = load_golden("nn/seed_mha_" + GetParam() + ".golden");
  const std::vector<int64_t> cfg = g.at("config").to_vector<int64_t>();  // [n_head, d_model, d_k, d_v]
  Generator gen(2);
  AttentionSublayer mha(cfg[0], cfg[1], cfg[2], cfg[3], 0.1, gen);
  mha.eval();
  const std::vector<GoldenParam> gp = golden_params(g);
  expect_names_and_load(mha, gp);

  Tensor q = leaf(g.at("query")), k = leaf(g.at("key")), v = leaf(g.at("value"));
  Tensor mask = g.count("mask") ? logical_not(g.at("mask")) : Tensor();
  AttentionSublayerResult r = mha(q, k, v, mask);
  EXPECT_TRUE(all_close(r.output, g.at("output"), 1e-5));
  EXPECT_TRUE(all_close(r.attn, g.at("weights"), 1e-5));
  r.output.backward(g.at("grad_output"));
  EXPECT_TRUE(all_close(q.grad(), g.at("grad.query"), 1e-5, 1e-4));
  EXPECT_TRUE(all_close(k.grad(), g.at("grad.key"), 1e-5, 1e-4));
  EXPECT_TRUE(all_close(v.grad(), g.at("grad.value"), 1e-5, 1e-4));
  expect_param_grads(mha, g, gp);
}

INSTANTIATE_TEST_SUITE_P(Seed, AttentionSublayerGolden, ::testing::Values("nomask", "pad", "pad_causal"),
                         [](const ::testing::TestParamInfo<std::string>& info) { return info.param; });

TEST(AttentionSublayer, ParametersAndInit) {
  Generator gen(6);
  AttentionSublayer m(3, 10, 4, 2, 0.1, gen);
  EXPECT_EQ(names_of(m), (std::vector<std::string>{"w_qs.weight", "w_ks.weight", "w_vs.weight", "fc.weight",
                                                   "layer_norm.weight", "layer_norm.bias"}));
  EXPECT_EQ(m.w_qs->weight.shape(), Shape({12, 10}));
  EXPECT_EQ(m.w_vs->weight.shape(), Shape({6, 10}));
  EXPECT_EQ(m.fc->weight.shape(), Shape({10, 6}));
  EXPECT_FALSE(m.w_qs->bias.defined());
  EXPECT_DOUBLE_EQ(m.layer_norm->eps, 1e-6);
  const double bound = std::sqrt(6.0 / (12 + 10));
  for (double w : m.w_qs->weight.to_vector<double>()) EXPECT_LE(std::fabs(w), bound);
}

// ---------------------------------------------------------------------------------------------
// Behaviour

TEST(AttentionSublayer, MaskShapesAreEquivalentAndBlockedRowsAreFinite) {
  Generator gen(12);
  AttentionSublayer m(2, 6, 3, 4, 0.1, gen);
  m.eval();
  Tensor q = randn({2, 4, 6}, gen), kv = randn({2, 4, 6}, gen);
  Tensor c2 = causal_mask(4);                                      // (Lq, Lk)
  Tensor c3 = logical_or(c2, zeros({2, 4, 4}, {.dtype = kBool}));  // (B, Lq, Lk), the seed's shape
  Tensor c4 = reshape(c2, {1, 1, 4, 4});
  AttentionSublayerResult r2 = m(q, kv, kv, c2), r3 = m(q, kv, kv, c3), r4 = m(q, kv, kv, c4);
  EXPECT_TRUE(all_close(r2.output, r3.output, 0));
  EXPECT_TRUE(all_close(r2.output, r4.output, 0));
  EXPECT_EQ(r2.attn.shape(), Shape({2, 2, 4, 4}));
  EXPECT_EQ(r2.attn.at({1, 1, 0, 1}), 0.0);

  // padding_mask (B, 1, 1, L) from nn/masks.h, with batch 1 entirely padding: its rows are finite (the seed's
  // -1e9 would give uniform weights; attograd gives zero attention, so the output is layer_norm(q)).
  Tensor tokens = from_vector<int64_t>({1, 2, 3, 0, 0, 0, 0, 0}, {2, 4});
  AttentionSublayerResult p = m(q, kv, kv, padding_mask(tokens, 0));
  ASSERT_TRUE(all_finite(p.output));
  ASSERT_TRUE(all_finite(p.attn));
  EXPECT_EQ(p.attn.at({1, 0, 2, 3}), 0.0);
  Tensor ln = m.layer_norm->forward(q);
  EXPECT_TRUE(all_close(select(p.output, 0, 1), select(ln, 0, 1), 1e-6));
  EXPECT_FALSE(m(q, kv, kv, Tensor(), false).attn.defined());
}

// ---------------------------------------------------------------------------------------------
// Gradchecks (float64) over inputs and parameters

TEST(AttentionSublayer, GradcheckMaskWithFullyBlockedQuery) {
  Generator gen(24);
  AttentionSublayer m(2, 5, 3, 2, 0.0, gen);
  m.to(kFloat64);
  Tensor q = rand_leaf({2, 4, 5}, gen), k = rand_leaf({2, 4, 5}, gen), v = rand_leaf({2, 4, 5}, gen);
  Tensor mask = logical_or(causal_mask(4), zeros({2, 1, 4}, {.dtype = kBool}));  // (B, Lq, Lk)
  mask.set({1, 2, 3}, 1);
  for (int64_t j = 0; j < 4; ++j) mask.set({0, 2, j}, 1);  // batch 0, query 2 sees nothing
  EXPECT_GRADCHECK([&] { return m(q, k, v, mask).output; }, with_params({q, k, v}, m, gen));
}

TEST(AttentionSublayer, GradcheckWithDropoutReplayed) {
  Generator gen(25), drop(0);
  AttentionSublayer m(2, 4, 3, 3, 0.2, gen);
  m.to(kFloat64);
  m.set_generator(drop);
  Tensor q = rand_leaf({2, 3, 4}, gen), kv = rand_leaf({2, 5, 4}, gen);
  Tensor pad = zeros({2, 1, 5}, {.dtype = kBool});
  pad.set({0, 0, 4}, 1);
  auto f = [&] {
    drop.manual_seed(5);  // replays both the attention and the output dropout masks
    return m(q, kv, kv, pad).output;
  };
  drop.manual_seed(5);
  Tensor a = f();
  Tensor b = f();
  EXPECT_TRUE(all_close(a, b, 0));
  EXPECT_GRADCHECK(f, with_params({q, kv}, m, gen));
}

// ---------------------------------------------------------------------------------------------
// Errors

TEST(AttentionSublayer, Errors) {
  EXPECT_ATTO_ERROR(AttentionSublayer(0, 4, 2, 2), "AttentionSublayer: n_head, d_model, d_k and d_v must be positive");
  Generator gen(31);
  AttentionSublayer m(2, 4, 3, 3, 0.1, gen);
  Tensor q = randn({2, 3, 4}, gen), kv = randn({2, 5, 4}, gen);
  EXPECT_ATTO_ERROR(m(q, randn({2, 5, 6}, gen), kv),
                    "expected q (B, Lq, 4), k (B, Lk, 4), v (B, Lk, 4), got q "
                    "[2, 3, 4], k [2, 5, 6], v [2, 5, 4]");
  EXPECT_ATTO_ERROR(m(q, kv, randn({2, 4, 4}, gen)), "k and v lengths differ");
  EXPECT_ATTO_ERROR(m(q, kv, kv, zeros({2, 3, 4}, {.dtype = kBool})),
                    "mask of shape [2, 3, 4] does not broadcast to the scores (B, H, Lq, Lk) = [2, 2, 3, 5]");
  EXPECT_ATTO_ERROR(m(q, kv, kv, zeros({5}, {.dtype = kBool})), "mask of shape [5] does not broadcast");
  EXPECT_ATTO_ERROR(m(q, kv, kv, zeros({2, 1, 5}, {.dtype = kInt64})),
                    "mask must be bool (true = blocked) or float32, got int64");
}
