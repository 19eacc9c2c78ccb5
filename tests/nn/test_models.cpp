// The decoder-only CausalLM (nn/models.h): a PyTorch 1.13 golden (tests/nn/golden_transformer.py), parameter names
// and hand-computed counts, masks (padding invariance, causality), float64 gradchecks with dropout, train/eval,
// stored attention weights, and errors. The seed's Transformer is tested in tests/nn/seed/test_transformer.cpp.

#include <algorithm>
#include <cmath>

#include "autograd/indexing.h"
#include "autograd/matmul.h"
#include "autograd/reduce.h"
#include "autograd/shape.h"
#include "nn/init.h"
#include "nn/masks.h"
#include "nn/models.h"
#include "testing.h"
#include "nn_golden.h"

using namespace attograd;
using namespace attograd::testing;
using namespace attograd::nn;

// ---------------------------------------------------------------------------------------------
// CausalLM

TEST(CausalLM, MatchesPyTorchReimplementation) {
  Golden g = load_golden("nn/causal_lm.golden");
  // [vocab, d_model, n_head, d_ff, n_layers, max_len, pad_idx, mask_padding]
  const std::vector<int64_t> c = g.at("config").to_vector<int64_t>();
  Generator gen(1);
  CausalLM lm({.vocab = c[0],
               .d_model = c[1],
               .n_head = c[2],
               .d_ff = c[3],
               .n_layers = c[4],
               .dropout = 0.1,
               .max_len = c[5],
               .pad_idx = c[6]},
              gen);
  lm.eval();
  const std::vector<GoldenParam> gp = golden_params(g);
  std::vector<std::string> theirs;
  for (auto& p : gp) theirs.push_back(p.name);
  ASSERT_EQ(names_of(lm), theirs);
  for (auto& p : gp) {
    Tensor ours = lm.parameter(p.name);
    ASSERT_EQ(ours.shape(), p.value.shape()) << p.name;
    copy_(ours, p.value);
  }
  const Tensor tokens = g.at("tokens").to(kInt64);
  ASSERT_EQ(tokens.dtype(), kInt64);
  Tensor out = lm.forward(tokens, c[7] != 0);
  EXPECT_TRUE(all_close(out, g.at("output"), 1e-5));
  out.backward(g.at("grad_output"));
  for (auto& p : gp)
    EXPECT_TRUE(
        all_close(lm.parameter(p.name).grad(), g.at("grad." + std::to_string(p.index) + "." + p.name), 1e-5, 1e-4))
        << p.name;

  // Right padding under the causal mask: without the key padding mask only the padded positions change.
  Tensor unmasked = lm.forward(tokens, false);
  const int64_t L = tokens.size(1), V = c[0];
  for (int64_t b = 0; b < tokens.size(0); ++b)
    for (int64_t l = 0; l < L; ++l) {
      bool padded_before = false;
      for (int64_t j = 0; j <= l; ++j) padded_before |= tokens.at({b, j}) == c[6];
      if (padded_before) continue;
      for (int64_t v = 0; v < V; ++v) EXPECT_NEAR(unmasked.at({b, l, v}), out.at({b, l, v}), 1e-6) << b << " " << l;
    }
}

TEST(CausalLM, ParameterNamesAndCountByHand) {
  Generator gen(2);
  const CausalLMOptions o{.vocab = 11, .d_model = 8, .n_head = 2, .d_ff = 16, .n_layers = 3, .max_len = 20};
  CausalLM lm(o, gen);
  const int64_t V = 11, D = 8, F = 16;
  // Embedding (tied output: no extra weight) + per block [2 LayerNorms, in_proj (3D x D + 3D), out_proj (D x D + D),
  // linear1 (F x D + F), linear2 (D x F + D)] + final LayerNorm.
  const int64_t per_block = 4 * D + 3 * D * D + 3 * D + D * D + D + F * D + F + D * F + D;
  EXPECT_EQ(lm.num_parameters(), V * D + 3 * per_block + 2 * D);
  std::vector<std::string> names = names_of(lm);
  const std::vector<std::string> block0{"blocks.0.norm1.weight",
                                        "blocks.0.norm1.bias",
                                        "blocks.0.self_attn.in_proj_weight",
                                        "blocks.0.self_attn.in_proj_bias",
                                        "blocks.0.self_attn.out_proj.weight",
                                        "blocks.0.self_attn.out_proj.bias",
                                        "blocks.0.norm2.weight",
                                        "blocks.0.norm2.bias",
                                        "blocks.0.ff.linear1.weight",
                                        "blocks.0.ff.linear1.bias",
                                        "blocks.0.ff.linear2.weight",
                                        "blocks.0.ff.linear2.bias"};
  ASSERT_EQ(names.size(), 1 + 3 * block0.size() + 2);
  EXPECT_EQ(names[0], "embed.weight");
  EXPECT_EQ(std::vector<std::string>(names.begin() + 1, names.begin() + 13), block0);
  EXPECT_EQ(names[names.size() - 2], "norm.weight");
  EXPECT_EQ(names.back(), "norm.bias");
  auto buffers = lm.named_buffers();
  ASSERT_EQ(buffers.size(), 1u);
  EXPECT_EQ(buffers[0].first, "pe");
  EXPECT_EQ(buffers[0].second.shape(), Shape({20, 8}));
  EXPECT_TRUE(all_close(buffers[0].second, sinusoidal_table(20, 8), 0));
  ASSERT_NE(std::dynamic_pointer_cast<LayerNorm>(lm.norm), nullptr);
  EXPECT_DOUBLE_EQ(std::dynamic_pointer_cast<LayerNorm>(lm.norm)->eps, 1e-6);
  EXPECT_DOUBLE_EQ(std::dynamic_pointer_cast<LayerNorm>(lm.block(0)->norm1)->eps, 1e-6);
  EXPECT_EQ(lm.block(-1)->attention<MultiheadAttention>()->options().dropout, 0.1);
  // Defaults of the options.
  const CausalLMOptions d{};
  EXPECT_EQ(d.d_model, 128);
  EXPECT_EQ(d.n_head, 4);
  EXPECT_EQ(d.d_ff, 512);
  EXPECT_EQ(d.n_layers, 2);
  EXPECT_EQ(d.max_len, 512);
  EXPECT_EQ(d.pad_idx, 0);
  // Embedding init N(0, 1/D): the sample standard deviation is near 1/sqrt(D).
  Generator g2(3);
  CausalLM big({.vocab = 500, .d_model = 16, .n_head = 2, .d_ff = 8, .n_layers = 0}, g2);
  double s2 = 0;
  for (double w : big.embed->weight.to_vector<double>()) s2 += w * w;
  EXPECT_NEAR(std::sqrt(s2 / (500 * 16)), 0.25, 0.01);
  EXPECT_NE(lm.to_string().find("CausalLM(\n  vocab=11, d_model=8, n_head=2, d_ff=16, n_layers=3"), std::string::npos);
}

TEST(CausalLM, ShapesCausalityAndPaddingMask) {
  Generator gen(4);
  CausalLM lm({.vocab = 9, .d_model = 8, .n_head = 2, .d_ff = 16, .n_layers = 2, .max_len = 16}, gen);
  lm.eval();
  Tensor tokens = tokens_of({1, 5, 2, 8, 3, 7, 4, 6, 2, 1, 3, 5}, 2, 6);
  Tensor logits = lm.forward(tokens);
  ASSERT_EQ(logits.shape(), Shape({2, 6, 9}));
  // Earlier positions never depend on later tokens.
  Tensor prefix = lm.forward(narrow(tokens, 1, 0, 3));
  EXPECT_TRUE(all_close(prefix, narrow(logits, 1, 0, 3), 1e-5));
  // With mask_padding, padded keys are ignored: the real tokens' logits equal those of the unpadded sequence.
  Tensor padded = tokens_of({1, 5, 2, 0, 0, 0}, 1, 6);
  Tensor a = lm.forward(padded, true), b = lm.forward(tokens_of({1, 5, 2}, 1, 3));
  EXPECT_TRUE(all_close(narrow(a, 1, 0, 3), b, 1e-5));
  // A batch of one token and a full-length sequence work.
  EXPECT_EQ(lm.forward(tokens_of({4}, 1, 1)).shape(), Shape({1, 1, 9}));
  EXPECT_EQ(lm.forward(zeros({1, 16}, {.dtype = kInt64})).shape(), Shape({1, 16, 9}));
}

TEST(CausalLM, TrainEvalAndDropoutReplay) {
  Generator gen(5), drop(6);
  CausalLM lm({.vocab = 9, .d_model = 8, .n_head = 2, .d_ff = 16, .n_layers = 2, .dropout = 0.3, .max_len = 16}, gen);
  lm.set_generator(drop);
  Tensor tokens = tokens_of({1, 5, 2, 8, 3, 7, 4, 6}, 2, 4);
  EXPECT_TRUE(lm.is_training());
  EXPECT_FALSE(all_close(lm.forward(tokens), lm.forward(tokens), 1e-6));
  drop.manual_seed(1);
  Tensor r1 = lm.forward(tokens);
  drop.manual_seed(1);
  EXPECT_TRUE(all_close(lm.forward(tokens), r1, 0));
  lm.eval();
  for (auto& [name, m] : lm.named_modules()) EXPECT_FALSE(m->is_training()) << name;
  EXPECT_TRUE(all_close(lm.forward(tokens), lm.forward(tokens), 0));
  lm.train();
  EXPECT_TRUE(lm.block(1)->ff->dropout->is_training());
}

TEST(CausalLM, StoredAttentionWeights) {
  Generator gen(7);
  CausalLM lm({.vocab = 9, .d_model = 8, .n_head = 2, .d_ff = 16, .n_layers = 2, .max_len = 16}, gen);
  lm.eval();
  Tensor tokens = tokens_of({1, 5, 2, 8, 3, 7, 0, 0}, 2, 4);
  Tensor plain = lm.forward(tokens, true);
  for (const Tensor& w : lm.attention_weights()) EXPECT_FALSE(w.defined());
  lm.store_attention(true);
  EXPECT_TRUE(all_close(lm.forward(tokens, true), plain, 0));
  std::vector<Tensor> ws = lm.attention_weights();
  ASSERT_EQ(ws.size(), 2u);
  for (const Tensor& w : ws) {
    ASSERT_EQ(w.shape(), Shape({2, 2, 4, 4}));
    EXPECT_TRUE(all_close(sum(w, {-1}), ones({2, 2, 4}), 1e-6));
    EXPECT_EQ(w.at({0, 1, 2, 3}), 0.0);  // causal
    EXPECT_EQ(w.at({1, 0, 3, 2}), 0.0);  // padding key
  }
  lm.store_attention(false);
  for (const Tensor& w : lm.attention_weights()) EXPECT_FALSE(w.defined());
}

TEST(CausalLM, GradcheckEveryParameter) {
  Generator gen(8);
  CausalLM lm({.vocab = 7, .d_model = 4, .n_head = 2, .d_ff = 6, .n_layers = 2, .max_len = 8}, gen);
  lm.eval();
  lm.to(kFloat64);
  Tensor tokens = tokens_of({3, 1, 4, 1, 5, 2, 0, 0}, 2, 4);
  EXPECT_GRADCHECK([&] { return lm.forward(tokens, true); }, params_as_inputs(lm, gen));
}

TEST(CausalLM, GradcheckWithDropout) {
  Generator gen(9), drop(10);
  CausalLM lm({.vocab = 7, .d_model = 4, .n_head = 2, .d_ff = 6, .n_layers = 1, .dropout = 0.2, .max_len = 8}, gen);
  lm.to(kFloat64);
  lm.set_generator(drop);
  Tensor tokens = tokens_of({3, 1, 4, 1, 5, 2, 6, 6}, 2, 4);
  EXPECT_GRADCHECK(
      [&] {
        drop.manual_seed(11);
        return lm.forward(tokens);
      },
      params_as_inputs(lm, gen));
}

TEST(CausalLM, Errors) {
  Generator gen(12);
  EXPECT_ATTO_ERROR(CausalLM({.vocab = 0}, gen), "vocab");
  EXPECT_ATTO_ERROR(CausalLM({.vocab = 5, .d_model = 6, .n_head = 4}, gen), "divisible by n_head");
  EXPECT_ATTO_ERROR(CausalLM({.vocab = 5, .d_model = 4, .n_head = 2, .dropout = 1.0}, gen), "dropout");
  EXPECT_ATTO_ERROR(CausalLM({.vocab = 5, .d_model = 4, .n_head = 2, .pad_idx = 5}, gen), "pad_idx");
  CausalLM lm({.vocab = 5, .d_model = 4, .n_head = 2, .d_ff = 4, .n_layers = 1, .max_len = 4}, gen);
  EXPECT_ATTO_ERROR(lm.forward(zeros({1, 3})), "must be int64");
  EXPECT_ATTO_ERROR(lm.forward(zeros({3}, {.dtype = kInt64})), "(B, L)");
  EXPECT_ATTO_ERROR(lm.forward(zeros({1, 5}, {.dtype = kInt64})), "exceeds max_len=4");
  EXPECT_ATTO_ERROR(lm.forward(tokens_of({1, 5}, 1, 2)), "token id 5 at [0, 1]");
  EXPECT_ATTO_ERROR(lm.forward(tokens_of({-1, 2}, 2, 1)), "out of range for vocab size 5");
}
