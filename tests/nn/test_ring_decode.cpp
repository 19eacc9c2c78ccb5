// Decoding past the context with a ring (nn/models.h CausalLM::decode_step, nn/attention_layer.h make_ring_cache):
// a model without an absolute position table whose kind slides (RoPE, none, ALiBi, local + RoPE, gqa, softcap)
// keeps every layer's last max_len keys in a ring, and every query attends to those. Tested: the ring decode gives
// the tokens and logits (float32 and float64, the tolerances of test_kv_cache.cpp) of the reference path
// (use_cache = false, a sliding-window recompute), past twice the ring's capacity, with prompts longer than
// max_len; the reference is itself the full sequence under local attention of window max_len (an independent
// model); for one layer the ring is exactly today's crop; the rings never grow; several tokens at once equal one by
// one; and models with an absolute table or a kind that cannot slide keep the crop rule.

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "autograd/shape.h"
#include "decode_testing.h"
#include "nn/attention.h"
#include "nn/models.h"
#include "testing.h"

using namespace attograd;
using namespace attograd::testing;
using namespace attograd::nn;

namespace {

struct Variant {
  const char* name;
  AttentionSpec attention;
  std::string positions;
};

// The kinds that slide, each without an absolute table (positions rope or none, or ALiBi's own penalty).
const std::vector<Variant> kSliding = {
    {"rope", {.kind = "mha"}, "rope"},
    {"none", {.kind = "mha"}, "none"},
    {"alibi", {.kind = "alibi"}, "sinusoidal"},  // ALiBi owns its positions: the model adds no table
    {"local+rope", {.kind = "local", .window = 5}, "rope"},
    {"local wider than max_len +rope", {.kind = "local", .window = 20}, "rope"},
    {"gqa+rope", {.kind = "gqa", .kv_heads = 2}, "rope"},
    {"softcap+rope", {.kind = "softcap", .options = R"({"cap":0.5})"}, "rope"},
};

constexpr int64_t kMaxLen = 8;

std::shared_ptr<CausalLM> make_lm(const AttentionSpec& a, const std::string& positions, Dtype dtype, int64_t layers = 3,
                                  int64_t max_len = kMaxLen, uint64_t seed = 11) {
  Generator gen(seed);
  auto m = std::make_shared<CausalLM>(CausalLMOptions{.vocab = 13,
                                                      .d_model = 32,
                                                      .n_head = 4,
                                                      .d_ff = 48,
                                                      .n_layers = layers,
                                                      .dropout = 0.1,
                                                      .max_len = max_len,
                                                      .dtype = dtype,
                                                      .attention = a,
                                                      .architecture = {.positions = positions}},
                                      gen);
  m->eval();
  return m;
}

// Mixed prompt lengths, two of them longer than max_len (their prefill wraps the ring in one step).
const TokenRows kSources = {{4, 5, 6}, {7}, {8, 9, 10, 11, 12, 1, 2, 3, 4, 5, 6}, {5, 4, 3, 2,  1,  2,  3, 4, 5, 6,
                                                                                   7, 8, 9, 10, 11, 12, 1, 2, 3, 4}};

// Whether begin_decode gave every block a ring.
bool rings(CausalLM& m, const TokenRows& sources) {
  NoGradGuard no_grad;
  const DecodeState st = m.begin_decode(sources);
  if (st.cache.empty() || st.cache.size() != m.blocks->size()) return false;
  return std::all_of(st.cache.begin(), st.cache.end(), [](const KVCache& c) { return c.layer && c.layer->ring; });
}

}  // namespace

TEST(RingDecode, RingEqualsTheSlidingReferencePastTwiceTheCapacity) {
  // 3 layers, max_len 8, 30 steps: rows reach 50 positions, more than 2x the ring's 8 slots, from the ring alone.
  for (const Variant& v : kSliding)
    for (Dtype dt : {kFloat32, kFloat64}) {
      SCOPED_TRACE(std::string(v.name) + " " + dtype_name(dt));
      auto m = make_lm(v.attention, v.positions, dt);
      ASSERT_TRUE(rings(*m, kSources));
      const DecodeTrace cached = run_greedy(*m, kSources, 30, true, {30, 4, 30, 25});
      const DecodeTrace full = run_greedy(*m, kSources, 30, false, {30, 4, 30, 25});
      EXPECT_EQ(cached.cached_steps, 30);  // every step from the rings
      expect_same_decode(cached, full, dt);
    }
}

TEST(RingDecode, ReferenceIsTheFullSequenceUnderAWindowOfMaxLen) {
  // The semantics, independently: the same weights in a model with a long context whose attention is local with
  // window max_len give, over the whole sequence at once, the ring decode's logits at every position (rope: the
  // positions are the true ones; none: no positions at all).
  for (const std::string positions : {"rope", "none"})
    for (Dtype dt : {kFloat32, kFloat64}) {
      SCOPED_TRACE(positions + " " + dtype_name(dt));
      auto m = make_lm({.kind = "mha"}, positions, dt);
      auto wide = make_lm({.kind = "local", .window = kMaxLen}, positions, dt, 3, 64, 99);
      wide->load_state_dict(m->state_dict());
      const TokenRows sources = {{3, 1, 4, 1, 5}};
      const DecodeTrace cached = run_greedy(*m, sources, 27, true);
      std::vector<int64_t> seq = sources[0];
      seq.push_back(SpecialTokens{}.sep);                                             // the prompt is src SEP
      seq.insert(seq.end(), cached.decoded[0].begin(), cached.decoded[0].end() - 1);  // what the steps read
      NoGradGuard no_grad;
      const Tensor all = wide->forward(pack_rows({seq}, static_cast<int64_t>(seq.size()), 0));  // (1, L, V)
      ASSERT_EQ(cached.logits.size(), 27u);
      for (size_t s = 0; s < cached.logits.size(); ++s) {
        const auto pos = static_cast<int64_t>(sources[0].size() + s);  // the position step s predicts from
        EXPECT_TRUE(
            all_close(cached.logits[s], gather_positions(all, {{0, pos}}), decode_tolerance(dt), decode_tolerance(dt)))
            << "step " << s;
      }
    }
}

TEST(RingDecode, OneLayerRingIsTheCrop) {
  // One layer: the last query attends to the last max_len keys, each computed from its own token alone, so the
  // ring is exactly nanoGPT's crop: forward(the last max_len tokens at positions 0 .. max_len-1)[-1].
  for (Dtype dt : {kFloat32, kFloat64}) {
    SCOPED_TRACE(dtype_name(dt));
    auto m = make_lm({.kind = "mha"}, "rope", dt, 1);
    const TokenRows sources = {{2, 7, 1, 8}};
    const DecodeTrace cached = run_greedy(*m, sources, 24, true);
    std::vector<int64_t> seq = sources[0];
    seq.push_back(SpecialTokens{}.sep);  // the prompt is src SEP
    seq.insert(seq.end(), cached.decoded[0].begin(), cached.decoded[0].end());
    NoGradGuard no_grad;
    for (size_t s = 0; s < cached.logits.size(); ++s) {
      const auto length = static_cast<int64_t>(sources[0].size() + 1 + s);  // the sequence step s read
      const int64_t first = std::max<int64_t>(0, length - kMaxLen);
      const std::vector<int64_t> window(seq.begin() + first, seq.begin() + length);
      const Tensor l = m->forward(pack_rows({window}, static_cast<int64_t>(window.size()), 0));
      const Tensor want = gather_positions(l, {{0, static_cast<int64_t>(window.size()) - 1}});
      EXPECT_TRUE(all_close(cached.logits[s], want, decode_tolerance(dt), decode_tolerance(dt))) << "step " << s;
    }
  }
}

TEST(RingDecode, RingsNeverGrow) {
  // Each ring holds max_len slots (a local window: min(window, max_len)) for every row, and decoding 4x past it
  // neither reallocates nor grows it.
  for (const Variant& v : kSliding) {
    SCOPED_TRACE(v.name);
    auto m = make_lm(v.attention, v.positions, kFloat32);
    NoGradGuard no_grad;
    DecodeState st = m->begin_decode({{1, 2}, {3}});
    ASSERT_EQ(st.cache.size(), 3u);
    const int64_t slots = v.attention.window > 0 ? std::min(v.attention.window, kMaxLen) : kMaxLen;
    std::vector<int64_t> bytes;
    std::vector<const void*> data;
    for (const KVCache& c : st.cache) {
      ASSERT_TRUE(c.layer->ring);
      EXPECT_EQ(c.layer->capacity(), slots);
      const auto& kv = dynamic_cast<const KeyValueCache&>(*c.layer);
      const int64_t heads = v.attention.kv_heads > 0 ? v.attention.kv_heads : 4;  // gqa: its key/value heads
      EXPECT_EQ(kv.key.shape(), Shape({2, heads, 8, slots}));
      EXPECT_EQ(c.layer->bytes(), 2 * 2 * heads * 8 * slots * 4);  // keys and values, float32
      bytes.push_back(c.layer->bytes());
      data.push_back(kv.key.const_raw_data());
    }
    for (int64_t s = 0; s < 4 * kMaxLen; ++s) {
      const Tensor l = m->decode_step(st);
      for (size_t i = 0; i < st.active.size(); ++i)
        st.decoded[static_cast<size_t>(st.active[i])].push_back(row_argmax(l, static_cast<int64_t>(i)));
    }
    EXPECT_EQ(st.cached[0], 3 + 4 * kMaxLen - 1);  // every position (src SEP decoded) went through the rings
    for (size_t i = 0; i < st.cache.size(); ++i) {
      EXPECT_EQ(st.cache[i].layer->bytes(), bytes[i]);
      EXPECT_EQ(dynamic_cast<const KeyValueCache&>(*st.cache[i].layer).key.const_raw_data(), data[i]);
    }
  }
}

TEST(RingDecode, SeveralTokensAtOnceEqualOneByOne) {
  // Past the context the ring writes and attends one position at a time (each query still finds its last max_len
  // keys): 6 tokens appended at once give bitwise the last step's logits of feeding them one by one, and a prompt
  // three times max_len prefilled at once those of the reference.
  for (Dtype dt : {kFloat32, kFloat64}) {
    SCOPED_TRACE(dtype_name(dt));
    auto m = make_lm({.kind = "mha"}, "rope", dt);
    NoGradGuard no_grad;
    const std::vector<int64_t> more = {3, 9, 2, 11, 4, 6};
    DecodeState a = m->begin_decode({{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}}),
                b = m->begin_decode({{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}});
    a.decoded[0] = {12};
    b.decoded[0] = {12};
    m->decode_step(a);
    m->decode_step(b);
    a.decoded[0].insert(a.decoded[0].end(), more.begin(), more.end());
    const Tensor at_once = m->decode_step(a);
    Tensor last;
    for (int64_t t : more) {
      b.decoded[0].push_back(t);
      last = m->decode_step(b);
    }
    EXPECT_TRUE(bitwise_equal(at_once, last));
    std::vector<int64_t> prompt;
    for (int64_t i = 0; i < 3 * kMaxLen; ++i) prompt.push_back(1 + (i * 5) % 12);
    const DecodeTrace cached = run_greedy(*m, {prompt}, 5, true), full = run_greedy(*m, {prompt}, 5, false);
    expect_same_decode(cached, full, dt);
  }
}

TEST(RingDecode, AbsolutePositionsAndKindsThatCannotSlideKeepTheCrop) {
  // An absolute table (sinusoidal, learned) keeps nanoGPT's crop, and so does a kind whose cache cannot slide
  // (block-sparse's layout, mla's latent, linear attention's running sums): no ring, and the cached decode still
  // gives the reference's tokens past the context.
  const std::vector<Variant> crop = {
      {"sinusoidal", {.kind = "mha"}, "sinusoidal"},
      {"learned", {.kind = "mha"}, "learned"},
      {"local+sinusoidal", {.kind = "local", .window = 3}, "sinusoidal"},
      {"block-sparse+rope", {.kind = "block-sparse", .block = 2}, "rope"},
      {"mla+rope", {.kind = "mla"}, "rope"},
      {"linear", {.kind = "linear"}, "none"},
  };
  for (const Variant& v : crop) {
    SCOPED_TRACE(v.name);
    auto m = make_lm(v.attention, v.positions, kFloat64, 2);
    EXPECT_FALSE(rings(*m, kSources));
    const DecodeTrace cached = run_greedy(*m, kSources, 14, true), full = run_greedy(*m, kSources, 14, false);
    expect_same_decode(cached, full, kFloat64);
  }
  // The crop's rule, one row: the last step's logits are forward(last max_len tokens)[-1] for the learned table.
  auto m = make_lm({.kind = "mha"}, "learned", kFloat64, 2);
  const DecodeTrace full = run_greedy(*m, {{4, 5, 6}}, 12, false);
  std::vector<int64_t> seq = {4, 5, 6, SpecialTokens{}.sep};
  seq.insert(seq.end(), full.decoded[0].begin(), full.decoded[0].end() - 1);
  const std::vector<int64_t> window(seq.end() - kMaxLen, seq.end());
  NoGradGuard no_grad;
  const Tensor l = m->forward(pack_rows({window}, kMaxLen, 0));
  EXPECT_TRUE(bitwise_equal(full.logits.back(), gather_positions(l, {{0, kMaxLen - 1}})));
}

TEST(RingDecode, WhetherAKindSlidesIsItsOwnFact) {
  const AttentionConfig c{.d_model = 32, .heads = 4, .max_len = kMaxLen};
  for (const AttentionSpec& s : std::vector<AttentionSpec>{{.kind = "mha"},
                                                           {.kind = "gqa", .kv_heads = 2},
                                                           {.kind = "local", .window = 3},
                                                           {.kind = "alibi"},
                                                           {.kind = "softcap"}})
    EXPECT_TRUE(attention_facts(s, c).slides) << s.kind;
  for (const AttentionSpec& s :
       std::vector<AttentionSpec>{{.kind = "block-sparse", .block = 2}, {.kind = "mla"}, {.kind = "linear"}})
    EXPECT_FALSE(attention_facts(s, c).slides) << s.kind;
  // A user's kind says nothing: it does not slide, and the default AttentionLayer gives no ring.
  EXPECT_FALSE(AttentionFacts{}.slides);
}

TEST(RingDecode, ModelWithoutBlocksDecodesPastTheContext) {
  // No attention at all (0 blocks, positions rope): the logits of a position depend on its token alone, cached or
  // recomputed, past the context too.
  auto m = make_lm({.kind = "mha"}, "rope", kFloat64, 0);
  EXPECT_FALSE(rings(*m, kSources));  // no block, no ring
  const DecodeTrace cached = run_greedy(*m, kSources, 20, true), full = run_greedy(*m, kSources, 20, false);
  expect_same_decode(cached, full, kFloat64);
}

TEST(RingDecode, RingCacheFunctionsRefuseWhatTheyCannotHold) {
  // The ring's own checks: a query's window must fit the slots (it reads only positions the ring still holds), and
  // one write holds at most that many positions of a row.
  Tensor key = zeros({1, 2, 3, 4}, {.dtype = kFloat64}), value = zeros({1, 2, 4, 3}, {.dtype = kFloat64});  // 4 slots
  const Tensor q = zeros({1, 5, 6}, {.dtype = kFloat64});  // 5 new positions of 2 heads of 3
  const CachedAttentionRows five{.cache_row = {0}, .start = {7}, .count = {5}};
  EXPECT_ATTO_ERROR(write_kv_cache(key, value, q, 0, q, 0, five, true), "writes positions 7 .. 11 into a ring of 4");
  const CachedAttentionRows one{.cache_row = {0}, .start = {9}, .count = {1}};
  write_kv_cache(key, value, q, 0, q, 0, {.cache_row = {0}, .start = {9}, .count = {1}}, true);  // slot 1
  EXPECT_ATTO_ERROR(cached_attention(q, 0, key, value, one, 1.0, true, nullptr, -1, {.window = 5, .ring = true}),
                    "0 < window <= its 4 slots");
  EXPECT_ATTO_ERROR(cached_attention(q, 0, key, value, one, 1.0, true, nullptr, -1, {.ring = true}), "window=0");
  EXPECT_NO_THROW(cached_attention(q, 0, key, value, one, 1.0, true, nullptr, -1, {.window = 4, .ring = true}));
}
