// TransformerEncoderLayer / TransformerDecoderLayer / TransformerEncoder / TransformerDecoder: PyTorch 1.13 goldens
// (tests/nn/golden_transformer.py), parameter names and counts, float64 gradchecks with masks and dropout,
// train/eval, stored attention weights, and errors.

#include <algorithm>
#include <cmath>

#include "autograd/activation.h"
#include "autograd/indexing.h"
#include "autograd/reduce.h"
#include "autograd/shape.h"
#include "nn/init.h"
#include "nn/masks.h"
#include "nn/transformer.h"
#include "testing.h"
#include "nn_golden.h"

using namespace attograd;
using namespace attograd::testing;
using namespace attograd::nn;

namespace {

Tensor maybe(const Golden& g, const std::string& name) { return g.count(name) ? g.at(name) : Tensor(); }

TransformerLayerOptions options_from(const Golden& g) {
  const std::vector<int64_t> c = g.at("config").to_vector<int64_t>();  // [d_model, nhead, dim_ff, norm_first, gelu]
  return {.d_model = c[0],
          .nhead = c[1],
          .dim_feedforward = c[2],
          .dropout = 0.1,
          .activation = c[4] ? "gelu" : "relu",
          .norm_first = c[3] != 0};
}

// (B, L) Bool, true at positions >= lengths[b].
Tensor right_padding(const std::vector<int64_t>& lengths, int64_t L) {
  Tensor m = zeros({static_cast<int64_t>(lengths.size()), L}, {.dtype = kBool});
  for (size_t b = 0; b < lengths.size(); ++b)
    for (int64_t j = lengths[b]; j < L; ++j) m.set({static_cast<int64_t>(b), j}, 1);
  return m;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// PyTorch 1.13 goldens, eval mode

class EncoderLayerGolden : public ::testing::TestWithParam<std::string> {};

TEST_P(EncoderLayerGolden, MatchesPyTorch) {
  Golden g = load_golden("nn/transformer_" + GetParam() + ".golden");
  Generator gen(1);
  TransformerEncoderLayer layer(options_from(g), gen);
  layer.eval();
  const std::vector<GoldenParam> gp = golden_params(g);
  expect_names_and_load(layer, gp);

  Tensor src = leaf(g.at("src"));
  Tensor out = layer.forward(src, {.src_mask = g.at("src_mask"), .src_key_padding_mask = g.at("src_key_padding_mask")});
  EXPECT_TRUE(all_close(out, g.at("output"), 1e-5));
  out.backward(g.at("grad_output"));
  EXPECT_TRUE(all_close(src.grad(), g.at("grad.src"), 1e-5, 1e-4));
  expect_param_grads(layer, g, gp);

  // is_causal instead of the explicit causal mask gives the same numbers.
  Tensor again = layer.forward(g.at("src"), {.src_key_padding_mask = g.at("src_key_padding_mask"), .is_causal = true});
  EXPECT_TRUE(all_close(again, g.at("output"), 1e-5));
}

INSTANTIATE_TEST_SUITE_P(Transformer, EncoderLayerGolden, ::testing::Values("encoder_post", "encoder_pre"),
                         [](const ::testing::TestParamInfo<std::string>& info) { return info.param; });

class DecoderLayerGolden : public ::testing::TestWithParam<std::string> {};

TEST_P(DecoderLayerGolden, MatchesPyTorch) {
  Golden g = load_golden("nn/transformer_" + GetParam() + ".golden");
  Generator gen(2);
  TransformerDecoderLayer layer(options_from(g), gen);
  layer.eval();
  const std::vector<GoldenParam> gp = golden_params(g);
  expect_names_and_load(layer, gp);

  Tensor tgt = leaf(g.at("tgt")), memory = leaf(g.at("memory"));
  const Tensor tkpm = maybe(g, "tgt_key_padding_mask"), mkpm = g.at("memory_key_padding_mask");
  Tensor out = layer.forward(
      tgt, memory, {.tgt_mask = g.at("tgt_mask"), .tgt_key_padding_mask = tkpm, .memory_key_padding_mask = mkpm});
  EXPECT_TRUE(all_close(out, g.at("output"), 1e-5));
  out.backward(g.at("grad_output"));
  EXPECT_TRUE(all_close(tgt.grad(), g.at("grad.tgt"), 1e-5, 1e-4));
  EXPECT_TRUE(all_close(memory.grad(), g.at("grad.memory"), 1e-5, 1e-4));
  expect_param_grads(layer, g, gp);

  Tensor again = layer.forward(g.at("tgt"), g.at("memory"),
                               {.tgt_key_padding_mask = tkpm, .memory_key_padding_mask = mkpm, .tgt_is_causal = true});
  EXPECT_TRUE(all_close(again, g.at("output"), 1e-5));
}

INSTANTIATE_TEST_SUITE_P(Transformer, DecoderLayerGolden, ::testing::Values("decoder_post", "decoder_pre"),
                         [](const ::testing::TestParamInfo<std::string>& info) { return info.param; });

// ---------------------------------------------------------------------------------------------
// Parameters: names, order, counts, init

TEST(TransformerEncoderLayer, ParameterNamesAndCountArePyTorchs) {
  Generator gen(3);
  const int64_t D = 8, F = 32;
  TransformerEncoderLayer layer({.d_model = D, .nhead = 2, .dim_feedforward = F}, gen);
  EXPECT_EQ(names_of(layer),
            (std::vector<std::string>{"self_attn.in_proj_weight", "self_attn.in_proj_bias", "self_attn.out_proj.weight",
                                      "self_attn.out_proj.bias", "linear1.weight", "linear1.bias", "linear2.weight",
                                      "linear2.bias", "norm1.weight", "norm1.bias", "norm2.weight", "norm2.bias"}));
  std::vector<std::string> children;
  for (auto& [n, _] : layer.named_children()) children.push_back(n);
  EXPECT_EQ(children, (std::vector<std::string>{"self_attn", "linear1", "dropout", "linear2", "norm1", "norm2",
                                                "dropout1", "dropout2"}));
  // 4 D^2 + 4 D (attention) + 2 D F + F + D (feed-forward) + 4 D (two LayerNorms).
  EXPECT_EQ(layer.num_parameters(), 4 * D * D + 4 * D + 2 * D * F + F + D + 4 * D);
  EXPECT_EQ(layer.linear1->weight.shape(), Shape({F, D}));
  EXPECT_DOUBLE_EQ(std::dynamic_pointer_cast<LayerNorm>(layer.norm1)->eps, 1e-5);
  EXPECT_DOUBLE_EQ(layer.dropout->p(), 0.1);
  EXPECT_EQ(layer.options.dim_feedforward, F);

  // PyTorch's default dim_feedforward = 2048.
  TransformerEncoderLayer big({.d_model = 4, .nhead = 1}, gen);
  EXPECT_EQ(big.linear1->weight.shape(), Shape({2048, 4}));
}

TEST(TransformerDecoderLayer, ParameterNamesAndCountArePyTorchs) {
  Generator gen(4);
  const int64_t D = 8, F = 16;
  TransformerDecoderLayer layer({.d_model = D, .nhead = 4, .dim_feedforward = F, .layer_norm_eps = 1e-6}, gen);
  EXPECT_EQ(
      names_of(layer),
      (std::vector<std::string>{
          "self_attn.in_proj_weight", "self_attn.in_proj_bias", "self_attn.out_proj.weight", "self_attn.out_proj.bias",
          "multihead_attn.in_proj_weight", "multihead_attn.in_proj_bias", "multihead_attn.out_proj.weight",
          "multihead_attn.out_proj.bias", "linear1.weight", "linear1.bias", "linear2.weight", "linear2.bias",
          "norm1.weight", "norm1.bias", "norm2.weight", "norm2.bias", "norm3.weight", "norm3.bias"}));
  std::vector<std::string> children;
  for (auto& [n, _] : layer.named_children()) children.push_back(n);
  EXPECT_EQ(children, (std::vector<std::string>{"self_attn", "multihead_attn", "linear1", "dropout", "linear2", "norm1",
                                                "norm2", "norm3", "dropout1", "dropout2", "dropout3"}));
  EXPECT_EQ(layer.num_parameters(), 2 * (4 * D * D + 4 * D) + 2 * D * F + F + D + 6 * D);
  EXPECT_DOUBLE_EQ(std::dynamic_pointer_cast<LayerNorm>(layer.norm3)->eps, 1e-6);
}

TEST(TransformerStacks, ChildNamesAreLayersAndNorm) {
  Generator gen(5);
  const TransformerLayerOptions lo{.d_model = 4, .nhead = 2, .dim_feedforward = 8};
  TransformerEncoder enc(lo, 2, true, gen);
  std::vector<std::string> names = names_of(enc);
  ASSERT_EQ(names.size(), 2 * 12 + 2u);
  EXPECT_EQ(names.front(), "layers.0.self_attn.in_proj_weight");
  EXPECT_EQ(names[12], "layers.1.self_attn.in_proj_weight");
  EXPECT_EQ(names[24], "norm.weight");
  EXPECT_EQ(names[25], "norm.bias");
  EXPECT_EQ(enc.num_layers(), 2);
  TransformerEncoderLayer one(lo, gen);
  EXPECT_EQ(enc.num_parameters(), 2 * one.num_parameters() + 8);

  TransformerDecoder dec(lo, 3, false, gen);
  names = names_of(dec);
  ASSERT_EQ(names.size(), 3 * 18u);
  EXPECT_EQ(names[18], "layers.1.self_attn.in_proj_weight");
  EXPECT_EQ(names.back(), "layers.2.norm3.bias");
  EXPECT_EQ(dec.norm, nullptr);

  // Layers are initialised independently from the generator (not copies of one layer).
  EXPECT_NE(enc.layer(0)->linear1->weight.to_vector<float>(), enc.layer(1)->linear1->weight.to_vector<float>());
  // The same seed builds the same weights.
  Generator g1(6), g2(6);
  TransformerEncoder a(lo, 2, true, g1), b(lo, 2, true, g2);
  for (size_t i = 0; i < a.parameters().size(); ++i)
    EXPECT_EQ(a.parameters()[i].to_vector<float>(), b.parameters()[i].to_vector<float>());
}

// ---------------------------------------------------------------------------------------------
// Behaviour

TEST(TransformerStacks, ForwardChainsTheLayersThenTheNorm) {
  Generator gen(7);
  const TransformerLayerOptions lo{.d_model = 4, .nhead = 2, .dim_feedforward = 8, .norm_first = true};
  TransformerEncoder enc(lo, 2, true, gen);
  enc.eval();
  Tensor x = randn({2, 5, 4}, gen);
  Tensor kpm = right_padding({5, 3}, 5);
  Tensor expect = enc.norm->forward(
      enc.layer(1)->forward(enc.layer(0)->forward(x, {.src_key_padding_mask = kpm, .is_causal = true}),
                            {.src_key_padding_mask = kpm, .is_causal = true}));
  EXPECT_TRUE(all_close(enc.forward(x, {.src_key_padding_mask = kpm, .is_causal = true}), expect, 0));
  EXPECT_TRUE(all_close(enc.forward(x), enc.norm->forward(enc.layer(1)->forward(enc.layer(0)->forward(x))), 0));

  TransformerDecoder dec(lo, 2, true, gen);
  dec.eval();
  Tensor y = randn({2, 3, 4}, gen);
  Tensor mkpm = right_padding({4, 2}, 5);
  Tensor h = dec.layer(0)->forward(y, x, {.tgt_mask = causal_mask(3), .memory_key_padding_mask = mkpm});
  h = dec.norm->forward(dec.layer(1)->forward(h, x, {.tgt_mask = causal_mask(3), .memory_key_padding_mask = mkpm}));
  EXPECT_TRUE(all_close(dec.forward(y, x, {.tgt_mask = causal_mask(3), .memory_key_padding_mask = mkpm}), h, 0));
}

TEST(TransformerEncoderLayer, PostAndPreLnDifferAndShapesHold) {
  Generator g1(8), g2(8);
  TransformerEncoderLayer post({.d_model = 6, .nhead = 3, .dim_feedforward = 12, .dropout = 0.0}, g1);
  TransformerEncoderLayer pre({.d_model = 6, .nhead = 3, .dim_feedforward = 12, .dropout = 0.0, .norm_first = true},
                              g2);
  Tensor x = randn({3, 4, 6}, g1);
  Tensor a = post.forward(x), b = pre.forward(x);
  EXPECT_EQ(a.shape(), Shape({3, 4, 6}));
  EXPECT_EQ(b.shape(), Shape({3, 4, 6}));
  EXPECT_FALSE(all_close(a, b, 1e-3));
  // Post-LN ends with a LayerNorm (weight 1, bias 0): every row has mean 0 and variance 1.
  EXPECT_TRUE(all_close(mean(a, {-1}), zeros({3, 4}), 1e-5));
  // Pre-LN's output is x plus the two branches computed by hand.
  Tensor n1 = pre.norm1->forward(x);
  Tensor h = x + pre.attention<MultiheadAttention>()->forward(n1, n1, n1, {.need_weights = false}).output;
  h = h + pre.linear2->forward(relu(pre.linear1->forward(pre.norm2->forward(h))));
  EXPECT_TRUE(all_close(b, h, 1e-6));
  // A batch of one sequence of length one passes through.
  EXPECT_EQ(post.forward(randn({1, 1, 6}, g1)).shape(), Shape({1, 1, 6}));
}

TEST(TransformerLayers, TrainEvalPropagateAndDropoutIsOffInEval) {
  Generator gen(9), drop(10);
  TransformerDecoder dec({.d_model = 4, .nhead = 2, .dim_feedforward = 8, .dropout = 0.3}, 2, true, gen);
  dec.set_generator(drop);
  Tensor y = randn({2, 3, 4}, gen), mem = randn({2, 5, 4}, gen);
  EXPECT_TRUE(dec.is_training());
  Tensor t1 = dec.forward(y, mem), t2 = dec.forward(y, mem);
  EXPECT_FALSE(all_close(t1, t2, 1e-6));  // different masks
  drop.manual_seed(3);
  Tensor r1 = dec.forward(y, mem);
  drop.manual_seed(3);
  Tensor r2 = dec.forward(y, mem);
  EXPECT_TRUE(all_close(r1, r2, 0));  // re-seeding replays every mask
  dec.eval();
  for (auto& [name, m] : dec.named_modules()) EXPECT_FALSE(m->is_training()) << name;
  Tensor e1 = dec.forward(y, mem), e2 = dec.forward(y, mem);
  EXPECT_TRUE(all_close(e1, e2, 0));
  dec.train();
  EXPECT_TRUE(dec.layer(1)->dropout3->is_training());
  EXPECT_TRUE(dec.layer(0)->self_attn->is_training());
}

TEST(TransformerLayers, StoredAttentionWeights) {
  Generator gen(11);
  TransformerEncoder enc({.d_model = 4, .nhead = 2, .dim_feedforward = 8}, 2, false, gen);
  enc.eval();
  Tensor x = randn({2, 5, 4}, gen);
  Tensor kpm = right_padding({5, 3}, 5);
  enc.forward(x, {.src_key_padding_mask = kpm, .is_causal = true});
  for (const Tensor& w : enc.attention_weights()) EXPECT_FALSE(w.defined());  // off by default
  enc.set_store_attention(true);
  EXPECT_TRUE(enc.layer(0)->store_attention());
  enc.forward(x, {.src_key_padding_mask = kpm, .is_causal = true});
  std::vector<Tensor> ws = enc.attention_weights();
  ASSERT_EQ(ws.size(), 2u);
  for (const Tensor& w : ws) {
    ASSERT_EQ(w.shape(), Shape({2, 2, 5, 5}));
    EXPECT_FALSE(w.requires_grad());
    EXPECT_TRUE(all_close(sum(w, {-1}), ones({2, 2, 5}), 1e-6));
    EXPECT_EQ(w.at({0, 1, 1, 2}), 0.0);  // causal
    EXPECT_EQ(w.at({1, 0, 4, 3}), 0.0);  // padding key
    EXPECT_GT(w.at({1, 0, 4, 2}), 0.0);
  }
  // Storing does not change the output.
  Tensor with = enc.forward(x);
  enc.set_store_attention(false);
  EXPECT_TRUE(all_close(enc.forward(x), with, 0));
  for (const Tensor& w : enc.attention_weights()) EXPECT_FALSE(w.defined());

  TransformerDecoder dec({.d_model = 4, .nhead = 2, .dim_feedforward = 8}, 1, true, gen);
  dec.eval();
  dec.set_store_attention(true);
  Tensor y = randn({2, 3, 4}, gen);
  dec.forward(y, x, {.memory_key_padding_mask = kpm, .tgt_is_causal = true});
  Tensor s = dec.self_attention_weights()[0], c = dec.cross_attention_weights()[0];
  ASSERT_EQ(s.shape(), Shape({2, 2, 3, 3}));
  ASSERT_EQ(c.shape(), Shape({2, 2, 3, 5}));
  EXPECT_EQ(s.at({0, 0, 0, 1}), 0.0);
  EXPECT_EQ(c.at({1, 1, 0, 4}), 0.0);
  EXPECT_TRUE(all_close(sum(c, {-1}), ones({2, 2, 3}), 1e-6));
}

TEST(TransformerLayers, FloatMasksAndPerHeadMasksAreAccepted) {
  Generator gen(12);
  TransformerEncoderLayer layer({.d_model = 4, .nhead = 2, .dim_feedforward = 8}, gen);
  layer.eval();
  Tensor x = randn({2, 3, 4}, gen);
  Tensor bool_mask = causal_mask(3);
  Tensor float_mask = masked_fill(zeros({3, 3}), bool_mask, -INFINITY);
  EXPECT_TRUE(all_close(layer.forward(x, {.src_mask = bool_mask}), layer.forward(x, {.src_mask = float_mask}), 1e-6));
  Tensor per_head = logical_or(bool_mask, zeros({4, 3, 3}, {.dtype = kBool}));  // (B * nhead, L, L)
  EXPECT_TRUE(all_close(layer.forward(x, {.src_mask = per_head}), layer.forward(x, {.src_mask = bool_mask}), 0));
}

TEST(TransformerLayers, FullyBlockedQueriesStayFinite) {
  // Left padding under a causal mask leaves query 0 with no visible key: attograd gives zero attention there
  // (PyTorch 1.13 gives NaN), so outputs and gradients stay finite.
  Generator gen(13);
  TransformerEncoderLayer layer({.d_model = 4, .nhead = 2, .dim_feedforward = 8}, gen);
  layer.eval();
  Tensor x = randn({2, 3, 4}, gen);
  x.requires_grad_(true);
  Tensor kpm = zeros({2, 3}, {.dtype = kBool});
  kpm.set({1, 0}, 1);
  Tensor out = layer.forward(x, {.src_key_padding_mask = kpm, .is_causal = true});
  ASSERT_TRUE(all_finite(out));
  sum(out * out).backward();
  EXPECT_TRUE(all_finite(x.grad()));
  for (auto& p : layer.parameters()) EXPECT_TRUE(all_finite(p.grad()));
}

// ---------------------------------------------------------------------------------------------
// Gradchecks (float64) over inputs and every parameter

TEST(TransformerEncoderLayer, GradcheckPostLnWithMasks) {
  Generator gen(20);
  TransformerEncoderLayer layer({.d_model = 4, .nhead = 2, .dim_feedforward = 6}, gen);
  layer.eval();
  layer.to(kFloat64);
  Tensor x = rand_leaf({2, 4, 4}, gen);
  Tensor kpm = right_padding({4, 2}, 4);
  EXPECT_GRADCHECK([&] { return layer.forward(x, {.src_mask = causal_mask(4), .src_key_padding_mask = kpm}); },
                   params_as_inputs(layer, gen, {x}));
}

TEST(TransformerEncoderLayer, GradcheckPreLnGeluWithMasksAndDropout) {
  Generator gen(21), drop(22);
  TransformerEncoderLayer layer(
      {.d_model = 4, .nhead = 2, .dim_feedforward = 6, .dropout = 0.2, .activation = "gelu", .norm_first = true}, gen);
  layer.to(kFloat64);
  layer.set_generator(drop);
  ASSERT_TRUE(layer.is_training());
  Tensor x = rand_leaf({2, 4, 4}, gen);
  Tensor kpm = right_padding({3, 4}, 4);
  EXPECT_GRADCHECK(
      [&] {
        drop.manual_seed(7);  // the same dropout masks at every evaluation
        return layer.forward(x, {.src_key_padding_mask = kpm, .is_causal = true});
      },
      params_as_inputs(layer, gen, {x}));
}

TEST(TransformerDecoderLayer, GradcheckPostLnWithMasks) {
  Generator gen(23);
  TransformerDecoderLayer layer({.d_model = 4, .nhead = 2, .dim_feedforward = 6}, gen);
  layer.eval();
  layer.to(kFloat64);
  Tensor y = rand_leaf({2, 3, 4}, gen), mem = rand_leaf({2, 4, 4}, gen);
  Tensor mkpm = right_padding({4, 2}, 4);
  EXPECT_GRADCHECK([&] { return layer.forward(y, mem, {.tgt_mask = causal_mask(3), .memory_key_padding_mask = mkpm}); },
                   params_as_inputs(layer, gen, {y, mem}));
}

TEST(TransformerDecoderLayer, GradcheckPreLnWithDropoutAndAllMasks) {
  Generator gen(24), drop(25);
  TransformerDecoderLayer layer({.d_model = 4, .nhead = 2, .dim_feedforward = 6, .dropout = 0.2, .norm_first = true},
                                gen);
  layer.to(kFloat64);
  layer.set_generator(drop);
  Tensor y = rand_leaf({2, 3, 4}, gen), mem = rand_leaf({2, 4, 4}, gen);
  Tensor tkpm = right_padding({3, 2}, 3), mkpm = right_padding({3, 4}, 4);
  Tensor mem_mask = zeros({3, 4}, {.dtype = kBool});
  mem_mask.set({0, 1}, 1);
  EXPECT_GRADCHECK(
      [&] {
        drop.manual_seed(8);
        return layer.forward(y, mem,
                             {.memory_mask = mem_mask,
                              .tgt_key_padding_mask = tkpm,
                              .memory_key_padding_mask = mkpm,
                              .tgt_is_causal = true});
      },
      params_as_inputs(layer, gen, {y, mem}));
}

TEST(TransformerStacks, GradcheckEncoderDecoderStack) {
  Generator gen(26);
  const TransformerLayerOptions lo{.d_model = 4, .nhead = 2, .dim_feedforward = 4};
  TransformerEncoder enc(lo, 2, true, gen);
  TransformerDecoder dec(lo, 1, true, gen);
  enc.eval();
  dec.eval();
  enc.to(kFloat64);
  dec.to(kFloat64);
  Tensor src = rand_leaf({1, 3, 4}, gen), tgt = rand_leaf({1, 2, 4}, gen);
  std::vector<Tensor> inputs = params_as_inputs(dec, gen, params_as_inputs(enc, gen, {src, tgt}));
  EXPECT_GRADCHECK([&] { return dec.forward(tgt, enc.forward(src), {.tgt_is_causal = true}); }, inputs);
}

// ---------------------------------------------------------------------------------------------
// Errors

TEST(TransformerLayers, Errors) {
  Generator gen(30);
  EXPECT_ATTO_ERROR(TransformerEncoderLayer({.d_model = 6, .nhead = 4}, gen), "divisible by nhead");
  EXPECT_ATTO_ERROR(TransformerEncoderLayer({.d_model = 0, .nhead = 1}, gen), "must be positive");
  EXPECT_ATTO_ERROR(TransformerDecoderLayer({.d_model = 4, .nhead = 2, .activation = "tanh"}, gen), "'tanh'");
  EXPECT_ATTO_ERROR(TransformerDecoderLayer({.d_model = 4, .nhead = 2, .dropout = 1.0}, gen), "dropout");
  EXPECT_ATTO_ERROR(TransformerEncoder({.d_model = 4, .nhead = 2}, -1, false, gen), "num_layers");

  TransformerEncoderLayer enc({.d_model = 4, .nhead = 2, .dim_feedforward = 8}, gen);
  EXPECT_ATTO_ERROR(enc.forward(randn({2, 3, 5}, gen)), "TransformerEncoderLayer");
  EXPECT_ATTO_ERROR(enc.forward(randn({3, 4}, gen)), "[3, 4]");
  EXPECT_ATTO_ERROR(enc.forward(randn({2, 3, 4}, gen), {.src_key_padding_mask = zeros({2, 4}, {.dtype = kBool})}),
                    "key_padding_mask");
  EXPECT_ATTO_ERROR(enc.forward(randn({2, 3, 4}, gen), {.src_mask = causal_mask(4)}), "attn_mask");
  EXPECT_ATTO_ERROR(enc.forward(randn({2, 3, 4}, gen, {.dtype = kFloat64})), "dtype");

  TransformerDecoderLayer dec({.d_model = 4, .nhead = 2, .dim_feedforward = 8}, gen);
  EXPECT_ATTO_ERROR(dec.forward(randn({2, 3, 4}, gen), randn({3, 5, 4}, gen)), "batch sizes differ");
  EXPECT_ATTO_ERROR(dec.forward(randn({2, 3, 4}, gen), randn({2, 5, 3}, gen)), "memory");
  EXPECT_ATTO_ERROR(dec.forward(randn({2, 3, 4}, gen)), "does not take a single tensor");
}
