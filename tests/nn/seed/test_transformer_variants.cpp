// Attention variants in the seed's encoder-decoder Transformer (TransformerOptions n_kv_head, enc_window, enc_block,
// checkpoint; ModelSpec::attention through build): grouped-query heads in every attention with caches of H_kv
// heads (cached decoding equals the recomputation), local / block-sparse encoder self-attention, checkpointing with
// bitwise gradients, entropy tracking ("enc0", "dec0.self", "dec0.cross"), and an Error naming the model kind and
// the option for what it does not support. The default model is unchanged (the goldens in test_transformer.cpp).
// The self-attention goes through the AttentionLayer interface (the internal kind "seed-mha"): its call equals the
// seed's masks bitwise, and cached decoding reads the layer's own cache.

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "autograd/attention.h"
#include "autograd/loss.h"
#include "autograd/shape.h"
#include "nn/attention_layer.h"
#include "nn/masks.h"
#include "nn/seed/transformer.h"
#include "testing.h"

using namespace attograd;
using namespace attograd::testing;
using namespace attograd::nn;
using namespace attograd::nn::seed;

namespace {

TransformerOptions small(Dtype dt = kFloat32) {
  return {.src_vocab = 13,
          .tgt_vocab = 13,
          .d_model = 32,
          .n_head = 4,
          .d_k = 8,
          .d_v = 8,
          .d_inner = 48,
          .n_layers = 2,
          .dropout = 0.1,
          .n_position = 16,
          .dtype = dt};
}

ModelSpec spec(AttentionSpec a) {
  return {.vocab = 13, .layers = 2, .d_model = 32, .heads = 4, .d_ff = 48, .max_source_len = 8, .max_target_len = 8,
          .attention = std::move(a)};
}

int64_t row_argmax(const Tensor& logits, int64_t i) {
  const std::vector<double> v = logits.to_vector<double>();
  const int64_t V = logits.size(1);
  return static_cast<int64_t>(std::max_element(v.begin() + i * V, v.begin() + (i + 1) * V) - (v.begin() + i * V));
}

// Greedy decoding; every step's logits.
std::vector<Tensor> run(SequenceModel& m, const TokenRows& sources, int64_t steps, bool use_cache,
                        std::vector<int64_t>* cache_heads = nullptr) {
  NoGradGuard no_grad;
  DecodeState st = m.begin_decode(sources);
  st.use_cache = use_cache;
  if (cache_heads)
    for (const KVCache& c : st.cache)  // self-attention: the layer's own KeyValueCache; cross: key / value
      cache_heads->push_back(c.layer ? dynamic_cast<const KeyValueCache&>(*c.layer).key.size(1) : c.key.size(1));
  std::vector<Tensor> out;
  for (int64_t s = 0; s < steps; ++s) {
    Tensor l = m.decode_step(st);
    out.push_back(l);
    for (size_t i = 0; i < st.active.size(); ++i)
      st.decoded[static_cast<size_t>(st.active[i])].push_back(row_argmax(l, static_cast<int64_t>(i)));
  }
  return out;
}

// Parameter gradients of one training-mode backward (dropout 0.1); with `entropy_reg` the loss adds the entropy
// regulariser of every attention (lambda 0.1) and the entropies come first.
std::vector<std::pair<std::string, Tensor>> gradients(TransformerOptions o, bool checkpoint, bool entropy_reg = false) {
  o.checkpoint = checkpoint;
  o.n_layers = 3;
  Generator gen(21);
  Transformer m(o, gen);
  m.train();
  if (entropy_reg) m.track_attention_entropy(true);
  Generator g(5);
  m.set_generator(g);
  default_generator().manual_seed(8);
  const Tensor src = pack_rows({{4, 5, 6, 7}, {8, 9}}, 4, 0), tgt = pack_rows({{1, 4, 5}, {1, 6, 0}}, 3, 0);
  Tensor logits = m.forward(src, tgt);  // (2, 3, 13)
  Tensor loss = cross_entropy(reshape(logits, {6, 13}), reshape(tgt, {6}));
  std::vector<std::pair<std::string, Tensor>> out;
  if (entropy_reg)
    for (const AttentionEntropy& e : m.attention_entropies()) {
      loss = loss + attention_entropy_loss(e.entropy, 0.1, unsqueeze(e.rows, 1));
      out.emplace_back(e.label, e.entropy.detach());
    }
  loss.backward();
  for (auto& [n, p] : m.named_parameters()) out.emplace_back(n, p.grad());
  return out;
}

}  // namespace

TEST(TransformerVariants, GroupedQueryHeadsInEveryAttention) {
  TransformerOptions o = small();
  o.n_kv_head = 2;
  Generator gen(1);
  Transformer m(o, gen);
  for (const auto& [n, p] : m.named_parameters()) {
    if (n.find("w_ks.weight") != std::string::npos || n.find("w_vs.weight") != std::string::npos) {
      EXPECT_EQ(p.shape(), Shape({16, 32})) << n;  // H_kv d_k = 2 * 8
    }
    if (n.find("w_qs.weight") != std::string::npos) {
      EXPECT_EQ(p.shape(), Shape({32, 32})) << n;
    }
  }
  EXPECT_EQ(m.spec().attention, (AttentionSpec{.kind = "gqa", .kv_heads = 2}));
  // n_kv_head = n_head is the plain model, bit for bit (the same draws).
  TransformerOptions same = small();
  same.n_kv_head = 4;
  Generator g1(3), g2(3);
  const StateDict a = Transformer(small(), g1).state_dict(), b = Transformer(same, g2).state_dict();
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(bitwise_equal(a[i].second, b[i].second)) << a[i].first;
}

TEST(TransformerVariants, BuildFromSpecAndErrors) {
  auto gqa = make_model("seq2seq", spec({.kind = "gqa", .kv_heads = 1}));
  EXPECT_EQ(static_cast<Transformer&>(*gqa).options.n_kv_head, 1);
  EXPECT_EQ(gqa->spec().attention.kind, "gqa");
  auto local = make_model("seq2seq", spec({.kind = "local", .window = 2, .checkpoint = true}));
  EXPECT_EQ(static_cast<Transformer&>(*local).options.enc_window, 2);
  EXPECT_TRUE(static_cast<Transformer&>(*local).options.checkpoint);
  EXPECT_EQ(static_cast<Transformer&>(*make_model("seq2seq", spec({.kind = "block-sparse", .block = 2}))).options.enc_block,
            2);
  EXPECT_ATTO_ERROR(make_model("seq2seq", spec({.kind = "mha", .rope = true})), "\"seq2seq\" does not support attention.rope");
  EXPECT_ATTO_ERROR(make_model("seq2seq", spec({.kind = "mla"})), "\"seq2seq\" does not support attention mla");
  EXPECT_ATTO_ERROR(make_model("seq2seq", spec({.kind = "linear"})), "\"seq2seq\" does not support attention linear");
  // The default spec builds the default model: the same weights as the options without any variant.
  Generator g1(4), g2(4);
  const ModelSpec plain = spec({});
  const StateDict a = Transformer::build(plain, g1)->state_dict();
  TransformerOptions o = small();
  o.n_position = 9;
  o.d_inner = 48;
  o.pad_idx = plain.specials.pad;
  o.dropout = plain.dropout;
  const StateDict b = Transformer(o, g2).state_dict();
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(bitwise_equal(a[i].second, b[i].second)) << a[i].first;
}

TEST(TransformerVariants, CachedEqualsRecomputedWithKvHeadCaches) {
  const TokenRows sources = {{4, 5, 6}, {7}, {8, 9, 10, 11, 12}};
  for (int64_t kv : {1, 2})
    for (Dtype dt : {kFloat32, kFloat64}) {
      SCOPED_TRACE("n_kv_head " + std::to_string(kv) + " " + dtype_name(dt));
      TransformerOptions o = small(dt);
      o.n_kv_head = kv;
      o.enc_window = kv == 1 ? 1 : 0;  // the encoder variants change only the memory
      o.enc_block = kv == 2 ? 2 : 0;
      Generator gen(6);
      Transformer m(o, gen);
      m.eval();
      std::vector<int64_t> heads;
      const std::vector<Tensor> cached = run(m, sources, 10, true, &heads), full = run(m, sources, 10, false);
      EXPECT_EQ(heads, std::vector<int64_t>(4, kv));  // 2 self + 2 cross caches of H_kv heads
      const double tol = dt == kFloat64 ? 1e-11 : 2e-5;
      ASSERT_EQ(cached.size(), full.size());
      for (size_t s = 0; s < full.size(); ++s) EXPECT_TRUE(all_close(cached[s], full[s], tol, tol)) << "step " << s;
    }
}

TEST(TransformerVariants, EncoderWindowAndBlocksMatchTheDenseRule) {
  // A window covering the whole source is dense attention; a window of 1 is not.
  const Tensor src = pack_rows({{4, 5, 6, 7, 8, 9}}, 6, 0);
  auto memory = [&](int64_t window, int64_t block) {
    TransformerOptions o = small(kFloat64);
    o.enc_window = window;
    o.enc_block = block;
    Generator gen(2);
    Transformer m(o, gen);
    m.eval();
    NoGradGuard no_grad;
    return m.encode(src);
  };
  const Tensor dense = memory(0, 0);
  EXPECT_TRUE(all_close(memory(5, 0), dense, 1e-12, 1e-12));
  EXPECT_FALSE(all_close(memory(1, 0), dense, 1e-6, 1e-6));
  EXPECT_TRUE(all_close(memory(0, 3), dense, 1e-12, 1e-12));  // 2 blocks: local band + global cover everything
  EXPECT_FALSE(all_close(memory(0, 1), dense, 1e-6, 1e-6));   // 6 blocks of 1: blocks 3.. miss keys 1..
}

TEST(TransformerVariants, CheckpointingGivesBitwiseGradientsWithDropout) {
  // With the entropy regulariser too: the checkpointed layers' entropies come out of the recomputation with their
  // history (the entropies, then every parameter's gradient, bitwise).
  for (int64_t kv : {0, 2})
    for (bool entropy_reg : {false, true}) {
      SCOPED_TRACE("n_kv_head " + std::to_string(kv) + (entropy_reg ? " with the entropy regulariser" : ""));
      TransformerOptions o = small();
      o.n_kv_head = kv;
      const auto plain = gradients(o, false, entropy_reg), ckpt = gradients(o, true, entropy_reg);
      ASSERT_EQ(plain.size(), ckpt.size());
      if (entropy_reg) {
        EXPECT_EQ(plain[8].first, "dec2.cross");
      }
      for (size_t i = 0; i < plain.size(); ++i) {
        ASSERT_TRUE(plain[i].second.defined()) << plain[i].first;
        EXPECT_TRUE(bitwise_equal(ckpt[i].second, plain[i].second)) << plain[i].first;
      }
    }
}

TEST(TransformerVariants, EntropyTrackingLabelsAndValues) {
  TransformerOptions o = small(kFloat64);
  o.dropout = 0.0;
  o.n_kv_head = 2;
  Generator gen(7);
  Transformer m(o, gen);
  m.track_attention_entropy(true);
  const Tensor src = pack_rows({{4, 5, 6, 7}, {8, 9}}, 4, 0), tgt = pack_rows({{1, 4, 5}, {1, 6}}, 3, 0);
  m.forward(src, tgt);
  const std::vector<AttentionEntropy> e = m.attention_entropies();
  std::vector<std::string> labels;
  for (const AttentionEntropy& x : e) labels.push_back(x.label);
  EXPECT_EQ(labels, (std::vector<std::string>{"enc0", "enc1", "dec0.self", "dec0.cross", "dec1.self", "dec1.cross"}));
  EXPECT_EQ(e[0].entropy.shape(), Shape({2, 4, 4}));
  EXPECT_EQ(e[2].entropy.shape(), Shape({2, 4, 3}));
  EXPECT_EQ(e[3].entropy.shape(), Shape({2, 4, 3}));
  EXPECT_TRUE(e[3].entropy.requires_grad());
  // rows: the real tokens (source row 1 and target row 1 end in padding).
  const std::vector<double> enc_rows = e[0].rows.to_vector<double>(), dec_rows = e[2].rows.to_vector<double>();
  EXPECT_EQ(std::count(enc_rows.begin(), enc_rows.end(), 1.0), 6);
  EXPECT_EQ(enc_rows[6] + enc_rows[7], 0.0);
  EXPECT_EQ(std::count(dec_rows.begin(), dec_rows.end(), 1.0), 5);
  EXPECT_EQ(dec_rows[5], 0.0);
  EXPECT_TRUE(bitwise_equal(e[3].rows, e[2].rows));
  // enc0 equals its sublayer called directly on the encoder's input (dropout 0).
  const Tensor x0 = m.encoder->layer_norm->forward(m.encoder->position_enc->forward(m.encoder->src_word_emb->forward(src)));
  auto& a = dynamic_cast<AttentionSublayer&>(*m.encoder->layer_stack->at<EncoderLayer>(0)->slf_attn);
  const AttentionSublayerResult r = a.forward(x0, x0, x0, padding_mask(src, 0), false, true);
  EXPECT_TRUE(bitwise_equal(e[0].entropy, r.entropy));
  m.track_attention_entropy(false);
  EXPECT_TRUE(m.attention_entropies().empty());
}

TEST(TransformerVariants, SelfAttentionIsTheInterfacesKindSeedMha) {
  // Encoder and decoder self-attention are AttentionLayers of the internal kind "seed-mha" (built by make_attention),
  // the cross-attention the seed's sublayer called directly.
  TransformerOptions o = small();
  o.n_kv_head = 2;
  Generator gen(4);
  Transformer m(o, gen);
  for (const auto& l : *m.encoder->layer_stack) {
    const AttentionLayer& a = *static_cast<EncoderLayer&>(*l).slf_attn;
    EXPECT_EQ(a.kind(), "seed-mha");
    EXPECT_EQ(a.type_name(), "AttentionSublayer");
    EXPECT_EQ(a.spec().kv_heads, 2);
    EXPECT_EQ(a.config().heads, 4);
    EXPECT_EQ(dynamic_cast<const AttentionSublayer&>(a).pad, -1);  // the encoder keeps no decoding cache
  }
  for (const auto& l : *m.decoder->layer_stack) {
    const DecoderLayer& d = static_cast<DecoderLayer&>(*l);
    EXPECT_EQ(d.slf_attn->kind(), "seed-mha");
    EXPECT_EQ(dynamic_cast<const AttentionSublayer&>(*d.slf_attn).pad, o.pad_idx);
    EXPECT_EQ(d.enc_attn->kind(), "");  // not built by make_attention
  }
  // Internal: not offered to the other models (--attention, the lists of kinds), but built by make_attention.
  EXPECT_FALSE(has_attention("seed-mha"));
  EXPECT_EQ(attention_kinds_list().find("seed-mha"), std::string::npos);
  for (const auto& [kind, description] : registered_attentions()) EXPECT_NE(kind, "seed-mha");
  EXPECT_ATTO_ERROR(make_attention({.kind = "seed-mha"}, {.d_model = 8, .heads = 2}),
                    "\"seed-mha\" is the seq2seq model's own layer and needs the options d_k and d_v");
  Generator g1(9), g2(9);
  std::shared_ptr<AttentionLayer> a =
      make_attention({.kind = "seed-mha", .options = R"({"d_k": 3, "d_v": 5})"}, {.d_model = 8, .heads = 2}, g1);
  AttentionSublayer direct(2, 8, 3, 5, 0.0, g2);
  ASSERT_EQ(a->named_parameters().size(), direct.named_parameters().size());
  for (size_t i = 0; i < direct.named_parameters().size(); ++i) {
    EXPECT_EQ(a->named_parameters()[i].first, direct.named_parameters()[i].first);
    EXPECT_TRUE(bitwise_equal(a->named_parameters()[i].second, direct.named_parameters()[i].second));
  }
  EXPECT_EQ(a->facts().weights, 8 * 2 * 3 + 8 * 2 * (3 + 5) + 2 * 5 * 8);
  EXPECT_EQ(a->facts().cache_per_token, 2 * (3 + 5));
}

TEST(TransformerVariants, InterfaceCallEqualsTheSeedsMasksBitwise) {
  // forward(x, call) builds the seed model's masks: the key padding (B, 1, 1, L), or'ed with the causal one.
  Generator gen(6);
  AttentionSublayer a(4, 32, 8, 8, 0.0, gen);
  a.eval();
  const Tensor tokens = pack_rows({{4, 5, 6, 7, 8}, {9, 3}}, 5, 0);  // (2, 5)
  const Tensor x = randn({2, 5, 32}, gen);
  const Tensor kpm = reshape(padding_mask(tokens, 0), {2, 5});
  for (bool causal : {false, true}) {
    SCOPED_TRACE(causal);
    const AttentionOutput r = a.forward(x, {.key_padding_mask = kpm, .is_causal = causal, .need_weights = true,
                                            .need_entropy = true});
    const Tensor mask = causal ? logical_or(padding_mask(tokens, 0), causal_mask(5)) : padding_mask(tokens, 0);
    const AttentionSublayerResult e = a.forward(x, x, x, mask, true, true);
    EXPECT_TRUE(bitwise_equal(r.output, e.output));
    EXPECT_TRUE(bitwise_equal(r.weights, e.attn));
    EXPECT_TRUE(bitwise_equal(r.entropy, e.entropy));
  }
  EXPECT_TRUE(bitwise_equal(a.forward(x), a.forward(x, x, x, causal_mask(5), false).output));
  EXPECT_ATTO_ERROR(a.forward(x, {.window = 2}), "has no rotary positions or call window");
  EXPECT_ATTO_ERROR(a.forward(x, {.key_padding_mask = reshape(kpm, {10})}), "key_padding_mask must be Bool (B, L)");
}

TEST(TransformerVariants, CachedDecodingThroughTheLayersOwnCache) {
  // The decoder's self-attention decodes from its own state (make_cache), the pad token's keys blocked as in the
  // recomputation, which blocks them by the key padding mask; the cross-attention keeps its keys and values.
  Generator gen(12);
  Transformer m(small(), gen);
  m.eval();
  NoGradGuard no_grad;
  const TokenRows sources = {{4, 5, 6}, {7, 8, 9, 10, 11}};
  DecodeState st = m.begin_decode(sources);
  ASSERT_EQ(st.cache.size(), 4u);
  for (size_t i = 0; i < 2; ++i) {
    ASSERT_TRUE(st.cache[i].layer != nullptr);
    EXPECT_TRUE(dynamic_cast<const SeedKeyValueCache*>(st.cache[i].layer.get()) != nullptr);
    EXPECT_EQ(st.cache[i].layer->capacity(), 16);
    EXPECT_EQ(st.cache[i].layer->rows, 2);
    EXPECT_TRUE(st.cache[2 + i].layer == nullptr);
    EXPECT_EQ(st.cache[2 + i].key.size(3), 5);
  }
  // Decoded tokens with the pad (0) among them, fed at once and then one at a time.
  st.decoded = {{3, 0, 5}, {0, 6, 0, 7}};
  const Tensor cached = m.decode_step(st);
  DecodeState again = m.begin_decode(sources);
  again.use_cache = false;
  again.decoded = st.decoded;
  const Tensor recomputed = m.decode_step(again);
  EXPECT_TRUE(all_close(cached, recomputed, 1e-5));
  st.decoded[0].push_back(0);
  st.decoded[1].push_back(9);
  again.decoded = st.decoded;
  EXPECT_TRUE(all_close(m.decode_step(st), m.decode_step(again), 1e-5));
  // A state whose self-attention cache is not the layer's is refused.
  DecodeState bad = m.begin_decode(sources);
  bad.cache[0].layer = nullptr;
  EXPECT_ATTO_ERROR(m.decode_step(bad), "the decode state's cache 0 is not what begin_decode made");
}
