// The attention kinds made of a mask over what the model passes (issue 23): "prefix-lm" (nn/attention/prefix_lm.cpp,
// each row's prompt bidirectional, causal after) and "document" (nn/attention/document.cpp, packed sequences).
// - the layer equals MultiheadAttention under the explicit dense Bool mask it stands for (float64, output and the
//   gradients of x and every parameter, 1e-12);
// - CausalLM with the kind equals CausalLM with a reference kind registered here that builds that dense mask from
//   the same AttentionCall (logits and every parameter's gradient, 1e-12), and the model passes the right prompt
//   lengths (up to and including the first SEP) and tokens;
// - what the masks mean at the model's level: a prompt token sees the later prompt tokens, a document nothing of
//   the one before;
// - cached decoding gives the tokens (and logits) of the recomputation: mixed prompt lengths, float32 and float64,
//   the crop beyond max_len, several new positions at once, documents in the prompt and decoded;
// - the options (prefix, separator) and the refusals.

#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "autograd/indexing.h"
#include "autograd/reduce.h"
#include "nn/attention.h"
#include "nn/attention_layer.h"
#include "nn/decode_testing.h"
#include "nn/models.h"
#include "testing.h"

using namespace attograd;
using namespace attograd::nn;
using namespace attograd::testing;

namespace {

constexpr int64_t kSep = 3, kEos = 2;  // CausalLM's default specials

// Dense (B * H, L, L) Bool masks (TRUE = blocked) of the two kinds.
Tensor dense_prefix_mask(const std::vector<int64_t>& prefix, int64_t H, int64_t L) {
  const auto B = static_cast<int64_t>(prefix.size());
  Tensor m = zeros({B * H, L, L}, {.dtype = kBool});
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t i = 0; i < L; ++i)
        for (int64_t j = 0; j < L; ++j) {
          const int64_t p = prefix[static_cast<size_t>(b)];
          m.data<bool>()[((b * H + h) * L + i) * L + j] = !((i < p && j < p) || j <= i);
        }
  return m;
}

Tensor dense_document_mask(const Tensor& tokens, int64_t sep, int64_t H) {
  const int64_t B = tokens.size(0), L = tokens.size(1);
  const int64_t* t = tokens.data<int64_t>();
  Tensor m = zeros({B * H, L, L}, {.dtype = kBool});
  for (int64_t b = 0; b < B; ++b) {
    std::vector<int64_t> doc(static_cast<size_t>(L));
    for (int64_t l = 1; l < L; ++l)
      doc[static_cast<size_t>(l)] = doc[static_cast<size_t>(l - 1)] + (t[b * L + l - 1] == sep);
    for (int64_t h = 0; h < H; ++h)
      for (int64_t i = 0; i < L; ++i)
        for (int64_t j = 0; j < L; ++j)
          m.data<bool>()[((b * H + h) * L + i) * L + j] =
              !(j <= i && doc[static_cast<size_t>(i)] == doc[static_cast<size_t>(j)]);
  }
  return m;
}

// The reference kind: a MultiheadAttention given the dense mask of the kind named by option "of" ("prefix-lm" or
// "document") from the call; records the calls' prompt lengths.
std::vector<std::vector<int64_t>>& seen_prompts() {
  static std::vector<std::vector<int64_t>> v;
  return v;
}

class DenseMaskAttention : public MultiheadAttention {
 public:
  DenseMaskAttention(const MultiheadAttentionOptions& o, bool prefix, Generator& gen)
      : MultiheadAttention(o, gen), prefix_(prefix) {}
  AttentionOutput forward(const Tensor& x, const AttentionCall& call) override {
    seen_prompts().push_back(call.prompt_lengths);
    const int64_t H = options().num_heads, L = x.size(1);
    const Tensor mask =
        prefix_ ? dense_prefix_mask(call.prompt_lengths, H, L) : dense_document_mask(call.tokens, kEos, H);
    MhaResult r = MultiheadAttention::forward(
        x, x, x, {.attn_mask = mask, .need_weights = call.need_weights, .average_attn_weights = false});
    return {.output = r.output, .weights = r.weights};
  }
  using MultiheadAttention::forward;

 private:
  bool prefix_;
};

void register_reference() {
  for (const bool prefix : {true, false})
    register_attention(prefix ? "test-dense-prefix" : "test-dense-document", [prefix](const AttentionSpec&,
                                                                                      const AttentionConfig& c,
                                                                                      Generator& gen) {
      return std::make_shared<DenseMaskAttention>(
          MultiheadAttentionOptions{.embed_dim = c.d_model, .num_heads = c.heads, .dropout = c.dropout}, prefix, gen);
    });
}

std::shared_ptr<CausalLM> make_lm(const AttentionSpec& a, Dtype dtype = kFloat64, int64_t max_len = 24,
                                  uint64_t seed = 5) {
  Generator gen(seed);
  auto m = std::make_shared<CausalLM>(CausalLMOptions{.vocab = 13,
                                                      .d_model = 32,
                                                      .n_head = 4,
                                                      .d_ff = 48,
                                                      .n_layers = 2,
                                                      .dropout = 0.0,
                                                      .max_len = max_len,
                                                      .dtype = dtype,
                                                      .attention = a},
                                      gen);
  m->eval();
  return m;
}

const AttentionConfig kConfig = {.d_model = 16, .heads = 4, .dropout = 0.0, .max_len = 16};

struct LayerRun {
  Tensor out;
  std::vector<Tensor> grads;  // x, then every parameter
};

// out and the gradients of x and the parameters under a fixed upstream gradient.
template <class F>
LayerRun run_layer(Module& layer, const Tensor& x0, const Tensor& go, F&& forward) {
  layer.zero_grad(true);
  Tensor x = x0.detach().requires_grad_();
  Tensor out = forward(x);
  out.backward(go);
  LayerRun r{out.detach(), {x.grad()}};
  for (const Tensor& p : layer.parameters()) r.grads.push_back(p.grad());
  return r;
}

void expect_same(const LayerRun& a, const LayerRun& b, double tol) {
  EXPECT_TRUE(all_close(a.out, b.out, tol, tol));
  ASSERT_EQ(a.grads.size(), b.grads.size());
  for (size_t i = 0; i < a.grads.size(); ++i) EXPECT_TRUE(all_close(a.grads[i], b.grads[i], tol, tol)) << i;
}

}  // namespace

TEST(AttentionMasks, PrefixLmLayerEqualsTheDenseMask) {
  // Rows of prefix 0 (causal), part of the row, the whole row (bidirectional), 1.
  const int64_t B = 4, L = 9;
  const std::vector<int64_t> prefix = {0, 4, L, 1};
  Generator g1(1), g2(1), gx(2);
  auto kind = make_attention({.kind = "prefix-lm"}, kConfig, g1);
  auto ref = std::make_shared<MultiheadAttention>(MultiheadAttentionOptions{.embed_dim = 16, .num_heads = 4}, g2);
  kind->to(kFloat64);
  ref->to(kFloat64);
  const Tensor x = rand_leaf({B, L, 16}, gx).detach(), go = rand_leaf({B, L, 16}, gx).detach();
  const LayerRun a = run_layer(*kind, x, go, [&](const Tensor& in) {
    return kind->forward(in, AttentionCall{.prompt_lengths = prefix}).output;
  });
  const LayerRun b = run_layer(*ref, x, go, [&](const Tensor& in) {
    return ref->forward(in, in, in, {.attn_mask = dense_prefix_mask(prefix, 4, L), .need_weights = false}).output;
  });
  expect_same(a, b, 1e-12);
  // The option prefix N: every row's first N positions, whatever the call says.
  Generator g3(1);
  auto fixed = make_attention({.kind = "prefix-lm", .options = R"({"prefix": 3})"}, kConfig, g3);
  fixed->to(kFloat64);
  const LayerRun c = run_layer(*fixed, x, go, [&](const Tensor& in) { return fixed->forward(in); });
  const LayerRun d = run_layer(*ref, x, go, [&](const Tensor& in) {
    return ref->forward(in, in, in, {.attn_mask = dense_prefix_mask({3, 3, 3, 3}, 4, L), .need_weights = false}).output;
  });
  expect_same(c, d, 1e-12);
}

TEST(AttentionMasks, DocumentLayerEqualsTheDenseMask) {
  const int64_t B = 3, L = 10;
  const Tensor tokens = from_vector<int64_t>({4, 5, 2, 6, 7, 8, 2, 9, 2, 4,   // three documents and a fourth
                                              2, 2, 5, 5, 5, 5, 5, 5, 5, 5,   // a separator alone, twice
                                              4, 4, 4, 4, 4, 4, 4, 4, 4, 4},  // one document: causal
                                             {B, L});
  Generator g1(1), g2(1), gx(2);
  auto kind = make_attention({.kind = "document"}, kConfig, g1);
  auto ref = std::make_shared<MultiheadAttention>(MultiheadAttentionOptions{.embed_dim = 16, .num_heads = 4}, g2);
  kind->to(kFloat64);
  ref->to(kFloat64);
  const Tensor x = rand_leaf({B, L, 16}, gx).detach(), go = rand_leaf({B, L, 16}, gx).detach();
  const LayerRun a = run_layer(
      *kind, x, go, [&](const Tensor& in) { return kind->forward(in, AttentionCall{.tokens = tokens}).output; });
  const LayerRun b = run_layer(*ref, x, go, [&](const Tensor& in) {
    return ref->forward(in, in, in, {.attn_mask = dense_document_mask(tokens, 2, 4), .need_weights = false}).output;
  });
  expect_same(a, b, 1e-12);
  // Another separator (option separator 4): the documents change, and still equal their dense mask.
  Generator g3(1);
  auto other = make_attention({.kind = "document", .options = R"({"separator": 4})"}, kConfig, g3);
  other->to(kFloat64);
  const LayerRun c = run_layer(
      *other, x, go, [&](const Tensor& in) { return other->forward(in, AttentionCall{.tokens = tokens}).output; });
  const LayerRun d = run_layer(*ref, x, go, [&](const Tensor& in) {
    return ref->forward(in, in, in, {.attn_mask = dense_document_mask(tokens, 4, 4), .need_weights = false}).output;
  });
  expect_same(c, d, 1e-12);
  EXPECT_FALSE(all_close(a.out, c.out, 1e-6, 1e-6));
}

TEST(AttentionMasks, CausalLMEqualsTheDenseMaskModel) {
  register_reference();
  // src SEP tgt rows, right-padded, one without SEP (prompt 0: causal) and one whose SEP is first (prompt 1).
  const Tensor tokens = from_vector<int64_t>({4,    5,    6,    kSep, 7,    8, 0, 0,   //
                                              5,    kSep, 9,    kEos, 4,    4, 5, 6,   //
                                              4,    4,    5,    6,    7,    8, 9, 10,  //
                                              kSep, 6,    kEos, 6,    kEos, 0, 0, 0},
                                             {4, 8});
  for (const auto& [kind, ref] : {std::pair{"prefix-lm", "test-dense-prefix"}, {"document", "test-dense-document"}}) {
    SCOPED_TRACE(kind);
    auto a = make_lm({.kind = kind}), b = make_lm({.kind = ref});
    a->train();  // (dropout 0: the same values as eval, with gradients through the training path)
    b->train();
    seen_prompts().clear();
    Tensor la = a->forward(tokens), lb = b->forward(tokens);
    EXPECT_TRUE(all_close(la, lb, 1e-12, 1e-12));
    sum(mul(la, la)).backward();
    sum(mul(lb, lb)).backward();
    const auto pa = a->named_parameters(), pb = b->named_parameters();
    ASSERT_EQ(pa.size(), pb.size());
    for (size_t i = 0; i < pa.size(); ++i)
      EXPECT_TRUE(all_close(pa[i].second.grad(), pb[i].second.grad(), 1e-12, 1e-12)) << pa[i].first;
    // The model passed each row's prompt: up to and including its first SEP, 0 without one.
    ASSERT_EQ(seen_prompts().size(), 2u);  // one call per block
    EXPECT_EQ(seen_prompts()[0], (std::vector<int64_t>{4, 2, 0, 1}));
  }
}

TEST(AttentionMasks, PromptTokensSeeTheWholePromptAndDocumentsNothingBefore) {
  NoGradGuard no_grad;
  auto prefix = make_lm({.kind = "prefix-lm"}), causal = make_lm({.kind = "mha"});
  // Position 0 of the prompt 4 5 SEP changes with the later prompt token under prefix-lm, never under causal mha.
  const Tensor a = pack_rows({{4, 5, kSep, 7}}, 4, 0), b = pack_rows({{4, 9, kSep, 7}}, 4, 0);
  EXPECT_FALSE(all_close(gather_positions(prefix->forward(a), {{0, 0}}), gather_positions(prefix->forward(b), {{0, 0}}),
                         1e-6, 1e-6));
  EXPECT_TRUE(all_close(gather_positions(causal->forward(a), {{0, 0}}), gather_positions(causal->forward(b), {{0, 0}}),
                        1e-12, 1e-12));
  // ... but the target after SEP cannot reach back: the prompt's positions are the same whatever follows it.
  const Tensor c = pack_rows({{4, 5, kSep, 11}}, 4, 0);
  EXPECT_TRUE(all_close(narrow(prefix->forward(a), 1, 0, 3), narrow(prefix->forward(c), 1, 0, 3), 1e-12, 1e-12));
  // A document sees nothing of the one before it: the second document's logits do not depend on the first's tokens.
  auto doc = make_lm({.kind = "document"});
  const Tensor d1 = pack_rows({{4, 5, kEos, 6, 7}}, 5, 0), d2 = pack_rows({{9, 8, kEos, 6, 7}}, 5, 0);
  EXPECT_TRUE(all_close(narrow(doc->forward(d1), 1, 3, 2), narrow(doc->forward(d2), 1, 3, 2), 1e-12, 1e-12));
  EXPECT_FALSE(all_close(narrow(causal->forward(d1), 1, 3, 2), narrow(causal->forward(d2), 1, 3, 2), 1e-6, 1e-6));
}

TEST(AttentionMasks, CachedDecodingEqualsRecomputing) {
  // Mixed prompt lengths; for document, separators in the prompts (and greedy tokens may end documents too).
  const TokenRows doc_sources = {{4, kEos, 6}, {7}, {8, 9, kEos, kEos, 12}, {5, 4}};
  for (const char* kind : {"prefix-lm", "document"})
    for (Dtype dt : {kFloat32, kFloat64}) {
      SCOPED_TRACE(std::string(kind) + " " + dtype_name(dt));
      const TokenRows& sources = std::string(kind) == "document" ? doc_sources : kDecodeSources;
      auto m = make_lm({.kind = kind}, dt);
      const int64_t steps = m->max_decode_len() - 1;
      const DecodeTrace cached = run_greedy(*m, sources, steps, true, {steps, 3, steps, 7});
      const DecodeTrace full = run_greedy(*m, sources, steps, false, {steps, 3, steps, 7});
      ASSERT_EQ(cached.cache_blocks, 2u);  // from the cache: nothing recomputes
      EXPECT_GT(cached.cached_steps, 0);
      expect_same_decode(cached, full, dt);
      // The crop beyond max_len 8: recomputed windows after it, the cache before.
      auto short_lm = make_lm({.kind = kind}, dt, 8);
      expect_same_decode(run_greedy(*short_lm, sources, 14, true), run_greedy(*short_lm, sources, 14, false), dt);
      // Several new positions at once, after a prefill and resumed.
      expect_new_positions_at_once(*m, sources, {{5, 6, kEos, 7}, {9, 10, 11, 4}, {kEos, 4, 4, 5}, {6, 6, 6, 6}}, dt);
    }
}

TEST(AttentionMasks, DocumentCacheKeepsEachPositionsDocument) {
  auto m = make_lm({.kind = "document"});
  NoGradGuard no_grad;
  DecodeState st = m->begin_decode({{4, kEos, 6}});
  ASSERT_EQ(st.cache.size(), 2u);
  const int64_t C = st.cache[0].layer->capacity();
  // Keys and values of 4 heads of 8 features (float64), and per position its document (8 bytes) and end flag (1).
  EXPECT_EQ(st.cache[0].layer->bytes(), 2 * 4 * 8 * C * 8 + C * 9);
  m->decode_step(st);
  EXPECT_EQ(st.cached[0], 4);  // 4 2 6 SEP
}

TEST(AttentionMasks, FixedPrefixDecodesByRecomputing) {
  // With options.prefix the kind has no cache (a prompt shorter than the prefix would change cached positions): the
  // model recomputes, and the tokens are those of the same decode without a cache.
  auto m = make_lm({.kind = "prefix-lm", .options = R"({"prefix": 4})"});
  const DecodeTrace a = run_greedy(*m, kDecodeSources, 6, true), b = run_greedy(*m, kDecodeSources, 6, false);
  EXPECT_EQ(a.cache_blocks, 0u);
  expect_same_decode(a, b, kFloat64);
}

TEST(AttentionMasks, OptionsAndRefusals) {
  Generator gen(1);
  auto p = make_attention({.kind = "prefix-lm"}, kConfig, gen);
  const Tensor x = rand_leaf({2, 5, 16}, gen).detach();
  // No prompt (a stream/text model passes none) and no fixed prefix.
  EXPECT_ATTO_ERROR(p->forward(x), "prefix-lm: no prefix: the model passes no prompt lengths");
  EXPECT_ATTO_ERROR(p->forward(x, AttentionCall{.prompt_lengths = {1}}), "prompt_lengths has 1 rows for a batch of 2");
  EXPECT_ATTO_ERROR(p->forward(x, AttentionCall{.is_causal = false, .prompt_lengths = {1, 2}}), "is_causal false");
  EXPECT_ATTO_ERROR(make_attention({.kind = "prefix-lm", .options = R"({"prefix": -1})"}, kConfig),
                    "prefix-lm needs options.prefix a whole number >= 0");
  EXPECT_ATTO_ERROR(make_attention({.kind = "prefix-lm", .options = R"({"prefix": 1.5})"}, kConfig), "got 1.5");
  EXPECT_ATTO_ERROR(make_attention({.kind = "prefix-lm", .window = 3}, kConfig), "window");
  auto d = make_attention({.kind = "document"}, kConfig, gen);
  EXPECT_ATTO_ERROR(d->forward(x), "document: no tokens");
  EXPECT_ATTO_ERROR(d->forward(x, AttentionCall{.tokens = zeros({2, 4}, {.dtype = kInt64})}),
                    "tokens must be Int64 (B, L) = (2, 5)");
  EXPECT_ATTO_ERROR(make_attention({.kind = "document", .options = R"({"separator": -2})"}, kConfig),
                    "document needs options.separator a token id");
  // A prefix LM decodes a row's prompt in one step.
  auto m = make_lm({.kind = "prefix-lm"});
  NoGradGuard no_grad;
  DecodeState st = m->begin_decode({{4, 5, 6}});
  auto* cache = st.cache[0].layer.get();
  const Tensor h = zeros({1, 2, 32}, {.dtype = kFloat64});
  EXPECT_ATTO_ERROR(m->block(0)->self_attn->forward_cached(
                        h, *cache, {.cache_row = {0}, .start = {0}, .count = {2}, .prompt_lengths = {4}}),
                    "a prompt is decoded in one step");
  EXPECT_ATTO_ERROR(m->block(0)->self_attn->forward_cached(h, *cache, {.cache_row = {0}, .start = {0}, .count = {2}}),
                    "CachedAttentionRows::prompt_lengths");
  // The encoder-only and seq2seq models take only kinds that are a MultiheadAttention with options: not these.
  for (const char* kind : {"prefix-lm", "document"}) {
    MultiheadAttentionOptions o;
    EXPECT_FALSE(attention_as_multihead({.kind = kind}, kConfig, &o));
  }
}

TEST(AttentionMasks, StreamModelHasNoPromptUnlessAFixedPrefix) {
  // A stream/text model passes tokens but no prompt lengths, even when its tokens hold the SEP id: prefix-lm refuses
  // in one line; with options.prefix it is a prefix LM over the first N positions (and decodes by recomputing);
  // document needs only the tokens, and decodes from its cache.
  ModelSpec spec{.vocab = 9,
                 .layers = 1,
                 .d_model = 8,
                 .heads = 2,
                 .d_ff = 16,
                 .dropout = 0.0,
                 .max_source_len = 6,
                 .max_target_len = 2,
                 .stream = true,
                 .attention = {.kind = "prefix-lm"}};
  Generator g(1);
  auto plain = make_model("lm", spec, g);
  const Tensor tokens = pack_rows({{4, kSep, 5, 6}}, 4, 0);
  EXPECT_ATTO_ERROR(plain->forward(tokens),
                    "prefix-lm: no prefix: the model passes no prompt lengths (a stream/text model has no prompt); set "
                    "options.prefix N");
  spec.attention.options = R"({"prefix": 2})";
  auto fixed = make_model("lm", spec, g);
  fixed->to(kFloat64);
  fixed->eval();
  NoGradGuard no_grad;
  // Position 0 sees position 1 (the prefix of 2), not position 2.
  const Tensor a = fixed->forward(pack_rows({{4, 5, 6}}, 3, 0)), b = fixed->forward(pack_rows({{4, 7, 6}}, 3, 0)),
               c = fixed->forward(pack_rows({{4, 5, 7}}, 3, 0));
  EXPECT_FALSE(all_close(narrow(a, 1, 0, 1), narrow(b, 1, 0, 1), 1e-6, 1e-6));
  EXPECT_TRUE(all_close(narrow(a, 1, 0, 2), narrow(c, 1, 0, 2), 1e-12, 1e-12));
  const DecodeTrace x = run_greedy(*fixed, {{4, 5, 6}, {7}}, 4, true),
                    y = run_greedy(*fixed, {{4, 5, 6}, {7}}, 4, false);
  EXPECT_EQ(x.cache_blocks, 0u);
  expect_same_decode(x, y, kFloat64);
  spec.attention = {.kind = "document"};
  auto doc = make_model("lm", spec, g);
  doc->to(kFloat64);
  doc->eval();
  const DecodeTrace p = run_greedy(*doc, {{4, kEos, 6}, {7}}, 4, true),
                    q = run_greedy(*doc, {{4, kEos, 6}, {7}}, 4, false);
  EXPECT_EQ(p.cache_blocks, 1u);
  expect_same_decode(p, q, kFloat64);
}

TEST(AttentionMasks, CheckpointingAndEntropiesSeeTheSameCall) {
  // Gradient checkpointing recomputes a block with the same call (prompt lengths, tokens): the same gradients; the
  // tracked entropies are those of the masked rows.
  const Tensor tokens = pack_rows({{4, 5, kSep, 6, kEos, 7}, {kSep, 8, 9}}, 6, 0);
  for (const char* kind : {"prefix-lm", "document"}) {
    SCOPED_TRACE(kind);
    auto plain = make_lm({.kind = kind}), ckpt = make_lm({.kind = kind, .checkpoint = true});
    plain->train();
    ckpt->train();
    plain->track_attention_entropy(true);
    ckpt->track_attention_entropy(true);
    Tensor a = plain->forward(tokens), b = ckpt->forward(tokens);
    EXPECT_TRUE(all_close(a, b, 0, 0));
    EXPECT_TRUE(all_close(plain->block(0)->last_entropy(), ckpt->block(0)->last_entropy(), 0, 0));
    sum(mul(a, a)).backward();
    sum(mul(b, b)).backward();
    const auto pa = plain->named_parameters(), pb = ckpt->named_parameters();
    for (size_t i = 0; i < pa.size(); ++i)
      EXPECT_TRUE(all_close(pa[i].second.grad(), pb[i].second.grad(), 0, 0)) << pa[i].first;
  }
  // Row 0's first query (prompt 4 5 SEP) has three keys under prefix-lm: its entropy is above 0; under document it
  // has one key (itself): entropy 0.
  auto p = make_lm({.kind = "prefix-lm"}), d = make_lm({.kind = "document"});
  p->track_attention_entropy(true);
  d->track_attention_entropy(true);
  NoGradGuard no_grad;
  p->forward(tokens);
  d->forward(tokens);
  EXPECT_GT(p->block(0)->last_entropy().data<double>()[0], 1e-3);
  EXPECT_EQ(d->block(0)->last_entropy().data<double>()[0], 0.0);
  // Row 0's query 5 (after the EOS at 4) starts a new document under document: one key, entropy 0.
  EXPECT_EQ(d->block(0)->last_entropy().data<double>()[5], 0.0);
}
