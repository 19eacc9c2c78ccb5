// Key/value-cached incremental decoding (nn/sequence_model.h, nn/attention.h cached_attention) against the full
// recomputation, for CausalLM and the seed's Transformer: the same tokens and logits equal within float tolerance
// (float32 and float64), with mixed prompt lengths, rows that stop at different times, dropout models in eval mode,
// several new positions fed at once (HF's test: n tokens at once == n - 1 then 1 resumed from the cache) and the
// decoder-only model's crop beyond max_len. Which asserts are bitwise is said at each (the cached path multiplies
// matrices of other shapes than the full one, so its logits are not bitwise those of the full recomputation; the
// bitwise asserts are NewPositionsAtOnceEqualOneByOneBitwise's, RecomputePathStillAvailable's, and the evaluation
// losses in tests/train/test_decode.cpp).

#include <algorithm>
#include <functional>
#include <memory>
#include <vector>

#include "autograd/shape.h"
#include "nn/models.h"
#include "decode_testing.h"
#include "testing.h"

using namespace attograd;
using namespace attograd::testing;
using namespace attograd::nn;

namespace {

const TokenRows& kSources = kDecodeSources;


std::shared_ptr<SequenceModel> make_lm(Dtype dtype, int64_t max_len = 24, uint64_t seed = 5) {
  Generator gen(seed);
  auto m = std::make_shared<CausalLM>(CausalLMOptions{.vocab = 13,
                                                      .d_model = 32,
                                                      .n_head = 4,
                                                      .d_ff = 48,
                                                      .n_layers = 2,
                                                      .dropout = 0.1,
                                                      .max_len = max_len,
                                                      .dtype = dtype},
                                      gen);
  m->eval();
  return m;
}

std::shared_ptr<SequenceModel> make_seq2seq(Dtype dtype, uint64_t seed = 6) {
  Generator gen(seed);
  auto m = std::make_shared<seed::Transformer>(seed::TransformerOptions{.src_vocab = 13,
                                                                        .tgt_vocab = 13,
                                                                        .d_model = 32,
                                                                        .n_head = 4,
                                                                        .d_k = 8,
                                                                        .d_v = 8,
                                                                        .d_inner = 48,
                                                                        .n_layers = 2,
                                                                        .dropout = 0.1,
                                                                        .n_position = 16,
                                                                        .dtype = dtype},
                                               gen);
  m->eval();
  return m;
}

using Factory = std::function<std::shared_ptr<SequenceModel>(Dtype)>;

struct Case {
  const char* name;
  Factory make;
};

const std::vector<Case> kCases = {{"lm", [](Dtype d) { return make_lm(d); }},
                                  {"seq2seq", [](Dtype d) { return make_seq2seq(d); }}};

}  // namespace

TEST(KVCache, CachedEqualsRecomputedMixedLengthsFloat32AndFloat64) {
  for (const Case& c : kCases)
    for (Dtype dt : {kFloat32, kFloat64}) {
      SCOPED_TRACE(std::string(c.name) + " " + dtype_name(dt));
      auto m = c.make(dt);
      ASSERT_FALSE(m->is_training());  // dropout 0.1 in eval mode
      const int64_t steps = m->max_decode_len() - 1;
      expect_same_decode(run_greedy(*m, kSources, steps, true), run_greedy(*m, kSources, steps, false), dt);
    }
}

TEST(KVCache, RowsFinishingEarly) {
  for (const Case& c : kCases) {
    SCOPED_TRACE(c.name);
    auto m = c.make(kFloat32);
    const std::vector<int64_t> stop = {2, 5, 1, 9};
    const DecodeTrace cached = run_greedy(*m, kSources, 12, true, stop), full = run_greedy(*m, kSources, 12, false, stop);
    expect_same_decode(cached, full, kFloat32);
    for (size_t b = 0; b < stop.size(); ++b) EXPECT_EQ(static_cast<int64_t>(cached.decoded[b].size()), stop[b]);
  }
}

TEST(KVCache, EmptySourceRow) {
  // An empty source: the decoder-only prompt is SEP alone; the encoder-decoder's cross-attention has no open key
  // (zeros, as in the full path).
  for (const Case& c : kCases) {
    SCOPED_TRACE(c.name);
    auto m = c.make(kFloat64);
    const TokenRows sources = {{}, {4, 5}};
    expect_same_decode(run_greedy(*m, sources, 6, true), run_greedy(*m, sources, 6, false), kFloat64);
  }
}

TEST(KVCache, BatchedRowsEqualEachRowAlone) {
  // A row decoded alone and in a batch of mixed prompt lengths: the same tokens, logits within 1e-12 in float64
  // (not bitwise: the batch's prefill has more than 16 positions and takes the GEMM).
  for (const Case& c : kCases) {
    SCOPED_TRACE(c.name);
    auto m = c.make(kFloat64);
    const DecodeTrace all = run_greedy(*m, kSources, 6, true);
    for (size_t b = 0; b < kSources.size(); ++b) {
      const DecodeTrace one = run_greedy(*m, {kSources[b]}, 6, true);
      EXPECT_EQ(one.decoded[0], all.decoded[b]);
      for (size_t s = 0; s < one.logits.size(); ++s) {
        const std::vector<double> a = all.logits[s].to_vector<double>(), o = one.logits[s].to_vector<double>();
        const size_t V = static_cast<size_t>(all.logits[s].size(1));
        for (size_t v = 0; v < V; ++v) EXPECT_NEAR(a[b * V + v], o[v], 1e-12) << "row " << b << " step " << s;
      }
    }
  }
}

// HF's test: feeding n tokens at once equals feeding n - 1, then 1 resumed from the cache; and several new
// positions after a prefill equal the same positions fed one by one.
TEST(KVCache, SeveralTokensAtOnceEqualOneByOneResumed) {
  for (const Case& c : kCases)
    for (Dtype dt : {kFloat32, kFloat64}) {
      SCOPED_TRACE(std::string(c.name) + " " + dtype_name(dt));
      auto m = c.make(dt);
      // Row 1 continues with a padding token (0): the seq2seq decoder blocks it as a key, in both paths.
      const TokenRows next = {{3, 9, 4, 7}, {0, 6, 11, 2}, {10, 10, 5, 8}, {12, 1, 3, 4}};
      const std::vector<int64_t> cached = expect_new_positions_at_once(*m, kSources, next, dt);
      for (size_t b = 0; b < next.size(); ++b)
        EXPECT_EQ(cached[b], static_cast<int64_t>(kSources[b].size() + 1 + next[b].size()) -
                                 (c.name == std::string("lm") ? 0 : static_cast<int64_t>(kSources[b].size())));
    }
}

TEST(KVCache, NewPositionsAtOnceEqualOneByOneBitwise) {
  // After the prefill, a cached step's arithmetic is per position (embedding, LayerNorm, decode_linear's matrix-vector
  // products for steps of at most 16 positions, each query's attention over the cache): feeding four tokens at once
  // gives bitwise the logits of feeding them one by one, and a row's logits do not depend on which other rows are
  // still decoding (bitwise).
  for (const Case& c : kCases)
    for (Dtype dt : {kFloat32, kFloat64}) {
      SCOPED_TRACE(std::string(c.name) + " " + dtype_name(dt));
      auto m = c.make(dt);
      NoGradGuard no_grad;
      const TokenRows next = {{3, 9, 4, 7}, {0, 6, 11, 2}, {10, 10, 5, 8}, {12, 1, 3, 4}};
      DecodeState at_once = m->begin_decode(kSources), one_by_one = m->begin_decode(kSources);
      m->decode_step(at_once);
      m->decode_step(one_by_one);
      at_once.decoded = next;
      const Tensor la = m->decode_step(at_once);  // (4, V)
      Tensor lb;
      for (size_t i = 0; i < 4; ++i) {
        for (size_t b = 0; b < next.size(); ++b) one_by_one.decoded[b].push_back(next[b][i]);
        lb = m->decode_step(one_by_one);
      }
      EXPECT_TRUE(bitwise_equal(la, lb));
      // Row 1 alone continues from the same cache: its logits are row 1's of the batch.
      one_by_one.active = {1};
      one_by_one.decoded[1].push_back(5);
      for (auto& row : at_once.decoded) row.push_back(5);
      const Tensor alone = m->decode_step(one_by_one);  // (1, V)
      const Tensor batch = m->decode_step(at_once);     // (4, V)
      const int64_t V = alone.size(1);
      EXPECT_TRUE(bitwise_equal(alone, reshape(gather_positions(reshape(batch, {4, 1, V}), {{1, 0}}), {1, V})));
    }
}

TEST(KVCache, StepWithoutNewTokenIsAnError) {
  for (const Case& c : kCases) {
    auto m = c.make(kFloat32);
    NoGradGuard no_grad;
    DecodeState st = m->begin_decode(kSources);
    m->decode_step(st);
    EXPECT_THROW(m->decode_step(st), Error);
  }
}

TEST(KVCache, CausalLMCropBeyondMaxLen) {
  // max_len 8: prompts of 2 .. 6 tokens run past the position table; beyond it the model sees the last 8 tokens
  // (positions restarting at 0 for the window), recomputed each step in the cached path too.
  for (Dtype dt : {kFloat32, kFloat64}) {
    SCOPED_TRACE(dtype_name(dt));
    auto m = make_lm(dt, 8);
    const DecodeTrace cached = run_greedy(*m, kSources, 14, true), full = run_greedy(*m, kSources, 14, false);
    expect_same_decode(cached, full, dt);
    // The window rule itself: the last step's logits of row 0 are forward(last 8 tokens)[-1].
    std::vector<int64_t> seq = kSources[0];
    seq.push_back(SpecialTokens{}.sep);
    seq.insert(seq.end(), full.decoded[0].begin(), full.decoded[0].end() - 1);
    ASSERT_GT(seq.size(), 8u);
    const std::vector<int64_t> window(seq.end() - 8, seq.end());
    NoGradGuard no_grad;
    const Tensor l = static_cast<CausalLM&>(*m).forward(pack_rows({window}, 8, 0));  // (1, 8, V)
    const std::vector<double> want = gather_positions(l, {{0, 7}}).to_vector<double>();
    const std::vector<double> got = full.logits.back().to_vector<double>();  // row 0 first
    for (size_t v = 0; v < want.size(); ++v) EXPECT_NEAR(got[v], want[v], decode_tolerance(dt)) << v;
  }
}

TEST(KVCache, RecomputePathStillAvailable) {
  // use_cache = false leaves the cache untouched and decodes exactly as before the cache existed (forward over
  // the whole sequence: bitwise the teacher-forced forward's logits).
  auto m = make_lm(kFloat32);
  NoGradGuard no_grad;
  DecodeState st = m->begin_decode({{4, 5, 6}});
  st.use_cache = false;
  st.decoded[0] = {7, 8};
  const Tensor l = m->decode_step(st);
  EXPECT_EQ(st.cached[0], 0);
  const Tensor f = static_cast<CausalLM&>(*m).forward(pack_rows({{4, 5, 6, 3, 7, 8}}, 6, 0));
  EXPECT_TRUE(bitwise_equal(l, gather_positions(f, {{0, 5}})));
}
