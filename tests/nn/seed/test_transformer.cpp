// The seed's encoder-decoder Transformer (seed::Transformer, nn/seed/transformer.h; jadore801120/
// attention-is-all-you-need-pytorch's transformer/Models.py and Layers.py): the seed's parameter names and
// hand-computed counts, shared and tied weights, embedding/projection scaling, masks (padding invariance,
// causality, encode/decode reuse), train/eval, stored attention weights, float64 gradchecks with dropout, and errors.

#include <algorithm>
#include <cmath>

#include "autograd/indexing.h"
#include "autograd/matmul.h"
#include "autograd/reduce.h"
#include "autograd/shape.h"
#include "nn/init.h"
#include "nn/masks.h"
#include "nn/nn_golden.h"
#include "nn/seed/transformer.h"
#include "testing.h"

using namespace attograd;
using namespace attograd::testing;
using namespace attograd::nn;
using namespace attograd::nn::seed;

namespace {



// Per encoder layer of the seed: attention (w_qs, w_ks, w_vs, fc, layer_norm) + feed-forward (w_1, w_2, layer_norm).
int64_t seed_attention_params(const TransformerOptions& o) {
  return o.n_head * o.d_k * o.d_model * 2 + o.n_head * o.d_v * o.d_model * 2 + 2 * o.d_model;
}
int64_t seed_ffn_params(const TransformerOptions& o) {
  return o.d_model * o.d_inner + o.d_inner + o.d_inner * o.d_model + o.d_model + 2 * o.d_model;
}

TransformerOptions tiny_transformer() {
  return {.src_vocab = 5,
          .tgt_vocab = 6,
          .d_model = 4,
          .n_head = 2,
          .d_k = 2,
          .d_v = 3,
          .d_inner = 6,
          .n_layers = 1,
          .dropout = 0.0,
          .pad_idx = 0,
          .n_position = 8};
}

}  // namespace

TEST(SeedTransformer, ParameterNamesAreTheSeedsAndCountsByHand) {
  Generator gen(20);
  TransformerOptions o{.src_vocab = 13,
                       .tgt_vocab = 11,
                       .d_model = 8,
                       .n_head = 2,
                       .d_k = 3,
                       .d_v = 5,
                       .d_inner = 12,
                       .n_layers = 2,
                       .n_position = 10};
  Transformer t(o, gen);
  const int64_t D = 8, attn = seed_attention_params(o), ffn = seed_ffn_params(o);
  const int64_t layers = 2 * (attn + ffn) + 2 * (2 * attn + ffn);
  EXPECT_EQ(t.num_parameters(), 13 * D + 11 * D + layers + 2 * D + 2 * D + 11 * D);
  std::vector<std::string> names = names_of(t);
  const std::vector<std::string> enc_layer{
      "encoder.layer_stack.0.slf_attn.w_qs.weight",       "encoder.layer_stack.0.slf_attn.w_ks.weight",
      "encoder.layer_stack.0.slf_attn.w_vs.weight",       "encoder.layer_stack.0.slf_attn.fc.weight",
      "encoder.layer_stack.0.slf_attn.layer_norm.weight", "encoder.layer_stack.0.slf_attn.layer_norm.bias",
      "encoder.layer_stack.0.pos_ffn.w_1.weight",         "encoder.layer_stack.0.pos_ffn.w_1.bias",
      "encoder.layer_stack.0.pos_ffn.w_2.weight",         "encoder.layer_stack.0.pos_ffn.w_2.bias",
      "encoder.layer_stack.0.pos_ffn.layer_norm.weight",  "encoder.layer_stack.0.pos_ffn.layer_norm.bias"};
  EXPECT_EQ(names[0], "encoder.src_word_emb.weight");
  EXPECT_EQ(std::vector<std::string>(names.begin() + 1, names.begin() + 13), enc_layer);
  EXPECT_EQ(names[25], "encoder.layer_norm.weight");
  EXPECT_EQ(names[27], "decoder.trg_word_emb.weight");
  EXPECT_EQ(names[28], "decoder.layer_stack.0.slf_attn.w_qs.weight");
  EXPECT_EQ(names[34], "decoder.layer_stack.0.enc_attn.w_qs.weight");
  EXPECT_EQ(names[40], "decoder.layer_stack.0.pos_ffn.w_1.weight");
  EXPECT_EQ(names[names.size() - 3], "decoder.layer_norm.weight");
  EXPECT_EQ(names.back(), "trg_word_prj.weight");
  EXPECT_EQ(t.output_weight().shape(), Shape({11, 8}));
  auto buffers = t.named_buffers();
  ASSERT_EQ(buffers.size(), 2u);
  EXPECT_EQ(buffers[0].first, "encoder.position_enc.pe");
  EXPECT_EQ(buffers[0].second.shape(), Shape({1, 10, 8}));

  // xavier_uniform_ on every parameter with more than one dimension, embeddings included (the padding row too).
  for (auto& [n, p] : t.named_parameters()) {
    if (p.dim() < 2) continue;
    const double bound = std::sqrt(6.0 / double(p.size(0) + p.size(1)));
    double mx = 0;
    for (double w : p.to_vector<double>()) mx = std::max(mx, std::fabs(w));
    EXPECT_LE(mx, bound) << n;
    EXPECT_GT(mx, 0.5 * bound) << n;
  }
  double pad_row = 0;
  for (int64_t k = 0; k < D; ++k) pad_row += std::fabs(t.encoder->src_word_emb->weight.at({0, k}));
  EXPECT_GT(pad_row, 0.0);
  for (double v : t.encoder->layer_norm->weight.to_vector<double>()) EXPECT_EQ(v, 1.0);
  // Seed defaults.
  const TransformerOptions d{};
  EXPECT_EQ(d.d_model, 512);
  EXPECT_EQ(d.n_head, 8);
  EXPECT_EQ(d.d_k, 64);
  EXPECT_EQ(d.d_inner, 2048);
  EXPECT_EQ(d.n_layers, 6);
  EXPECT_EQ(d.n_position, 200);
}

TEST(SeedTransformer, SharedAndTiedWeights) {
  Generator gen(21);
  TransformerOptions o{.src_vocab = 11,
                       .tgt_vocab = 11,
                       .d_model = 8,
                       .n_head = 2,
                       .d_k = 4,
                       .d_v = 4,
                       .d_inner = 12,
                       .n_layers = 1,
                       .n_position = 10,
                       .share_embeddings = true,
                       .tie_output = true};
  Transformer t(o, gen);
  EXPECT_TRUE(t.encoder->src_word_emb->weight.is_same(t.decoder->trg_word_emb->weight));
  EXPECT_TRUE(t.output_weight().is_same(t.decoder->trg_word_emb->weight));
  EXPECT_EQ(t.trg_word_prj, nullptr);
  std::vector<std::string> names = names_of(t);
  EXPECT_EQ(std::count(names.begin(), names.end(), "decoder.trg_word_emb.weight"), 0);
  EXPECT_EQ(std::count(names.begin(), names.end(), "encoder.src_word_emb.weight"), 1);
  const int64_t attn = seed_attention_params(o), ffn = seed_ffn_params(o);
  EXPECT_EQ(t.num_parameters(), 11 * 8 + (attn + ffn) + (2 * attn + ffn) + 4 * 8);
  // Converting the model keeps the sharing.
  t.to(kFloat64);
  EXPECT_EQ(t.decoder->trg_word_emb->weight.dtype(), kFloat64);
  EXPECT_TRUE(t.encoder->src_word_emb->weight.is_same(t.decoder->trg_word_emb->weight));

  // Tied only: the target embedding is the projection, the source embedding is separate.
  o.share_embeddings = false;
  o.src_vocab = 7;
  Transformer u(o, gen);
  EXPECT_FALSE(u.encoder->src_word_emb->weight.is_same(u.decoder->trg_word_emb->weight));
  EXPECT_EQ(u.num_parameters(), 7 * 8 + 11 * 8 + (attn + ffn) + (2 * attn + ffn) + 4 * 8);
}

TEST(SeedTransformer, ScaleEmbeddingAndScaleProjection) {
  // Only with tie_output (as the seed): 'emb' multiplies the embeddings by sqrt(d_model), 'prj' the logits by
  // d_model^-0.5.
  TransformerOptions o = tiny_transformer();
  o.tgt_vocab = o.src_vocab;
  o.tie_output = true;
  Tensor src = tokens_of({1, 2, 3, 0, 4, 3}, 2, 3), tgt = tokens_of({1, 4, 2, 3, 3, 1}, 2, 3);
  Generator g1(22), g2(22), g3(22);
  Transformer plain(o, g1);
  o.scale_projection = true;
  Transformer prj(o, g2);
  plain.eval();
  prj.eval();
  EXPECT_TRUE(all_close(prj.forward(src, tgt), plain.forward(src, tgt) * 0.5, 1e-6));
  o.scale_projection = false;
  o.scale_embedding = true;
  Transformer emb(o, g3);
  emb.eval();
  // x * 2 + pe -> LayerNorm differs from x + pe -> LayerNorm.
  EXPECT_FALSE(all_close(emb.forward(src, tgt), plain.forward(src, tgt), 1e-4));
  Tensor x = emb.decoder->trg_word_emb->forward(tgt);
  Tensor expect = emb.decoder->layer_norm->forward(emb.decoder->position_enc->forward(x * 2.0));
  Tensor y = emb.decoder->layer_stack->at<DecoderLayer>(0)->forward(
      expect, emb.encode(src), logical_or(padding_mask(tgt, 0), causal_mask(3)), padding_mask(src, 0));
  EXPECT_TRUE(all_close(emb.decode(tgt, emb.encode(src), src), matmul(y, transpose(emb.output_weight(), 0, 1)), 1e-5));
  // Without tie_output the scale flags do nothing.
  o.tie_output = false;
  Generator g4(23), g5(23);
  Transformer a(o, g4);
  o.scale_embedding = false;
  Transformer b(o, g5);
  a.eval();
  b.eval();
  EXPECT_TRUE(all_close(a.forward(src, tgt), b.forward(src, tgt), 0));
}

TEST(SeedTransformer, ShapesEncodeDecodeAndMasks) {
  Generator gen(24);
  TransformerOptions o{.src_vocab = 9,
                       .tgt_vocab = 7,
                       .d_model = 8,
                       .n_head = 2,
                       .d_k = 4,
                       .d_v = 4,
                       .d_inner = 16,
                       .n_layers = 2,
                       .n_position = 12};
  Transformer t(o, gen);
  t.eval();
  Tensor src = tokens_of({1, 5, 2, 8, 0, 3, 7, 0, 0, 0}, 2, 5);
  Tensor tgt = tokens_of({1, 4, 2, 6, 1, 3, 5, 0}, 2, 4);
  Tensor logits = t.forward(src, tgt);
  ASSERT_EQ(logits.shape(), Shape({2, 4, 7}));
  Tensor memory = t.encode(src);
  ASSERT_EQ(memory.shape(), Shape({2, 5, 8}));
  EXPECT_TRUE(all_close(t.decode(tgt, memory, src), logits, 0));
  // Greedy decoding can feed growing prefixes: a prefix's logits equal those of the full target.
  EXPECT_TRUE(all_close(t.decode(narrow(tgt, 1, 0, 2), memory, src), narrow(logits, 1, 0, 2), 1e-5));
  // Padding keys of the source are ignored: more padding changes nothing.
  Tensor src_more = tokens_of({1, 5, 2, 8, 0, 0, 0, 3, 7, 0, 0, 0, 0, 0}, 2, 7);
  EXPECT_TRUE(all_close(t.forward(src_more, tgt), logits, 1e-5));
  // Dropping a padded target position leaves the others unchanged (causal).
  EXPECT_TRUE(all_close(t.forward(src, narrow(tgt, 1, 0, 3)), narrow(logits, 1, 0, 3), 1e-5));
}

TEST(SeedTransformer, TrainEvalAndStoredAttention) {
  Generator gen(25), drop(26);
  TransformerOptions o = tiny_transformer();
  o.dropout = 0.3;
  o.n_layers = 2;
  Transformer t(o, gen);
  t.set_generator(drop);
  Tensor src = tokens_of({1, 2, 3, 0, 4, 3, 0, 0}, 2, 4), tgt = tokens_of({1, 4, 2, 3, 5, 1}, 2, 3);
  EXPECT_FALSE(all_close(t.forward(src, tgt), t.forward(src, tgt), 1e-6));
  drop.manual_seed(2);
  Tensor r = t.forward(src, tgt);
  drop.manual_seed(2);
  EXPECT_TRUE(all_close(t.forward(src, tgt), r, 0));
  t.eval();
  for (auto& [name, m] : t.named_modules()) EXPECT_FALSE(m->is_training()) << name;
  Tensor e = t.forward(src, tgt);
  EXPECT_TRUE(all_close(t.forward(src, tgt), e, 0));

  EXPECT_FALSE(t.encoder_attention()[0].defined());
  t.store_attention(true);
  EXPECT_TRUE(all_close(t.forward(src, tgt), e, 0));
  ASSERT_EQ(t.encoder_attention().size(), 2u);
  for (const Tensor& w : t.encoder_attention()) {
    ASSERT_EQ(w.shape(), Shape({2, 2, 4, 4}));
    EXPECT_EQ(w.at({1, 1, 0, 2}), 0.0);  // padding key
  }
  for (const Tensor& w : t.decoder_self_attention()) {
    ASSERT_EQ(w.shape(), Shape({2, 2, 3, 3}));
    EXPECT_EQ(w.at({0, 0, 1, 2}), 0.0);  // causal
  }
  for (const Tensor& w : t.decoder_cross_attention()) {
    ASSERT_EQ(w.shape(), Shape({2, 2, 3, 4}));
    EXPECT_EQ(w.at({0, 1, 2, 3}), 0.0);  // source padding
    EXPECT_TRUE(all_close(sum(w, {-1}), ones({2, 2, 3}), 1e-6));
  }
  t.store_attention(false);
  EXPECT_FALSE(t.decoder_cross_attention()[1].defined());
}

TEST(SeedTransformer, GradcheckTinyModel) {
  Generator gen(27);
  Transformer t(tiny_transformer(), gen);
  t.eval();
  t.to(kFloat64);
  // Source padding is masked; the target has none (its padding row would get no gradient through the lookup,
  // PyTorch's padding_idx semantics, which finite differences would see).
  Tensor src = tokens_of({1, 2, 3, 4, 0, 0}, 2, 3), tgt = tokens_of({1, 5, 2, 3, 4, 4}, 2, 3);
  EXPECT_GRADCHECK([&] { return t.forward(src, tgt); }, params_as_inputs(t, gen));
}

TEST(SeedTransformer, GradcheckSharedTiedScaledWithDropout) {
  Generator gen(28), drop(29);
  TransformerOptions o = tiny_transformer();
  o.tgt_vocab = o.src_vocab;
  o.share_embeddings = o.tie_output = o.scale_embedding = true;
  o.dropout = 0.2;
  Transformer t(o, gen);
  t.to(kFloat64);
  t.set_generator(drop);
  Tensor src = tokens_of({1, 2, 3, 4, 2, 0}, 2, 3), tgt = tokens_of({1, 4, 2, 3, 3, 1}, 2, 3);
  EXPECT_GRADCHECK(
      [&] {
        drop.manual_seed(30);
        return t.forward(src, tgt);
      },
      params_as_inputs(t, gen), GradcheckOptions{.fast_mode = true});
}

TEST(SeedTransformer, Errors) {
  Generator gen(31);
  TransformerOptions o = tiny_transformer();
  o.share_embeddings = true;
  EXPECT_ATTO_ERROR(Transformer(o, gen), "share_embeddings needs src_vocab == tgt_vocab");
  o = tiny_transformer();
  o.scale_embedding = o.scale_projection = true;
  EXPECT_ATTO_ERROR(Transformer(o, gen), "exclusive");
  o = tiny_transformer();
  o.pad_idx = 5;
  EXPECT_ATTO_ERROR(Transformer(o, gen), "pad_idx 5");
  o = tiny_transformer();
  o.src_vocab = 0;
  EXPECT_ATTO_ERROR(Transformer(o, gen), "src_vocab");

  Transformer t(tiny_transformer(), gen);
  Tensor src = tokens_of({1, 2, 3, 4, 0, 0}, 2, 3), tgt = tokens_of({1, 5, 2, 3, 4, 4}, 2, 3);
  EXPECT_ATTO_ERROR(t.forward(src.to(kFloat32), tgt), "src must be int64");
  EXPECT_ATTO_ERROR(t.forward(src, tgt.to(kFloat32)), "tgt_in must be int64");
  EXPECT_ATTO_ERROR(t.forward(zeros({2, 9}, {.dtype = kInt64}), tgt), "exceeds n_position=8");
  EXPECT_ATTO_ERROR(t.forward(src, zeros({2, 9}, {.dtype = kInt64})), "tgt_in length L=9");
  EXPECT_ATTO_ERROR(t.forward(tokens_of({1, 2, 5, 4, 0, 0}, 2, 3), tgt), "token id 5 at [0, 2] of src");
  EXPECT_ATTO_ERROR(t.forward(src, tokens_of({1, 5, 2, 3, 4, 6}, 2, 3)), "out of range for vocab size 6");
  EXPECT_ATTO_ERROR(t.forward(src, tokens_of({1, 5, 2}, 1, 3)), "batch sizes differ");
  EXPECT_ATTO_ERROR(t.decode(tgt, zeros({2, 3, 5}), src), "memory must be the encoder output");
}
