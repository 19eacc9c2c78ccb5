// Attention variants in the encoder-only EncoderTagger (EncoderTaggerOptions::attention, ModelSpec::attention):
// gqa / local / block-sparse self-attention in every layer, checkpointing with bitwise gradients (dropout 0.1),
// and an Error naming the model kind and the option for mla, linear and rope. The default model is unchanged (its
// PyTorch golden in test_encoder_tagger.cpp).

#include <memory>
#include <string>
#include <vector>

#include "autograd/loss.h"
#include "autograd/shape.h"
#include "nn/encoder_tagger.h"
#include "testing.h"

using namespace attograd;
using namespace attograd::testing;
using namespace attograd::nn;

namespace {

EncoderTaggerOptions small(AttentionSpec a, double dropout = 0.1, int64_t layers = 2) {
  return {.vocab = 13, .d_model = 32, .n_head = 4, .d_ff = 48, .n_layers = layers, .dropout = dropout, .max_len = 12,
          .attention = std::move(a)};
}

std::vector<std::pair<std::string, Tensor>> gradients(AttentionSpec a, bool checkpoint) {
  a.checkpoint = checkpoint;
  Generator gen(31);
  EncoderTagger m(small(a, 0.1, 3), gen);
  m.train();
  Generator g(2);
  m.set_generator(g);
  default_generator().manual_seed(4);
  const Tensor tokens = pack_rows({{4, 5, 6, 7, 8, 3}, {9, 10, 3}}, 6, 0);
  Tensor logits = m.forward(tokens);  // (2, 6, 13)
  cross_entropy(reshape(logits, {12, 13}), reshape(tokens, {12})).backward();
  std::vector<std::pair<std::string, Tensor>> out;
  for (auto& [n, p] : m.named_parameters()) out.emplace_back(n, p.grad());
  return out;
}

}  // namespace

TEST(EncoderTaggerVariants, EveryMultiheadAttentionKindBuildsIntoEachLayer) {
  Generator gen(1);
  EncoderTagger gqa(small({.kind = "gqa", .kv_heads = 2}), gen);
  const auto& attn = *gqa.layers->at<TransformerEncoderLayer>(0)->attention<MultiheadAttention>();
  EXPECT_EQ(gqa.layers->at<TransformerEncoderLayer>(0)->self_attn->kind(), "gqa");
  EXPECT_EQ(attn.num_kv_heads(), 2);
  EXPECT_EQ(attn.in_proj_weight.shape(), Shape({32 + 2 * 16, 32}));
  EXPECT_EQ(gqa.spec().attention.kind, "gqa");
  EncoderTagger local(small({.kind = "local", .window = 2}), gen);
  EXPECT_EQ(local.layers->at<TransformerEncoderLayer>(1)->attention<MultiheadAttention>()->options().window, 2);
  EncoderTagger sparse(small({.kind = "block-sparse", .block = 3}), gen);
  EXPECT_EQ(sparse.layers->at<TransformerEncoderLayer>(1)->attention<MultiheadAttention>()->options().block_size, 3);
  EXPECT_EQ(sparse.layers->at<TransformerEncoderLayer>(1)->attention<MultiheadAttention>()->options().block_global, 1);
  // They run: a window of 2 changes the logits of a 6-token row, a window of 11 does not.
  const Tensor tokens = pack_rows({{4, 5, 6, 7, 8, 3}}, 6, 0);
  auto logits = [&](AttentionSpec a) {
    Generator g(9);
    EncoderTagger m(small(a, 0.0), g);
    m.eval();
    NoGradGuard no_grad;
    return m.forward(tokens.to(kInt64));
  };
  const Tensor dense = logits({});
  EXPECT_TRUE(all_close(logits({.kind = "local", .window = 11}), dense, 1e-5, 1e-5));
  EXPECT_FALSE(all_close(logits({.kind = "local", .window = 2}), dense, 1e-4, 1e-4));
}

TEST(EncoderTaggerVariants, CheckpointingGivesBitwiseGradientsWithDropout) {
  for (const AttentionSpec& a : {AttentionSpec{}, AttentionSpec{.kind = "gqa", .kv_heads = 1}}) {
    SCOPED_TRACE(a.kind);
    const auto plain = gradients(a, false), ckpt = gradients(a, true);
    ASSERT_EQ(plain.size(), ckpt.size());
    for (size_t i = 0; i < plain.size(); ++i) {
      ASSERT_TRUE(plain[i].second.defined()) << plain[i].first;
      EXPECT_TRUE(bitwise_equal(ckpt[i].second, plain[i].second)) << plain[i].first;
    }
  }
}

TEST(EncoderTaggerVariants, UnsupportedOptionsNameTheModelKind) {
  const ModelSpec base{.vocab = 13, .layers = 1, .d_model = 32, .heads = 4, .d_ff = 48, .max_source_len = 6,
                       .max_target_len = 6, .aligned = true};
  ModelSpec s = base;
  s.attention = {.kind = "mla"};
  EXPECT_ATTO_ERROR(make_model("encoder", s), "\"encoder\" does not support attention mla");
  s.attention = {.kind = "linear"};
  EXPECT_ATTO_ERROR(make_model("encoder", s), "\"encoder\" does not support attention linear");
  s.attention = {.kind = "gqa", .kv_heads = 2, .rope = true};
  EXPECT_ATTO_ERROR(make_model("encoder", s), "\"encoder\" does not support attention.rope");
  s.attention = {.kind = "block-sparse", .block = 2, .checkpoint = true};
  EXPECT_EQ(make_model("encoder", s)->spec().attention, s.attention);
  // Entropies: the tagger reports none (SequenceModel's Error names the kind).
  EXPECT_ATTO_ERROR(make_model("encoder", base)->track_attention_entropy(true), "\"encoder\"");
}
