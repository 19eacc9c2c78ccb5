// DecodeState misuse (nn/sequence_model.h DecodeState::validate): for each built-in model kind (decoder-only "lm",
// encoder-decoder "seq2seq", encoder-only "encoder"), decode_step refuses with an Error naming the misuse a state
// that no begin_decode made, a state another model began, active rows out of range / repeated / unordered, rows
// whose count or sources changed since begin_decode, and a row decoded past the end the model can reach; a state
// used as documented (tokens appended, rows dropped from active, use_cache switched off) still decodes.

#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "nn/sequence_model.h"
#include "testing.h"

using namespace attograd;
using namespace attograd::testing;
using namespace attograd::nn;

namespace {

const TokenRows kSources = {{4, 5, 6}, {7, 8}};

ModelSpec spec_for(const std::string& kind, int64_t d_model = 16) {
  return {.vocab = 12,
          .layers = 1,
          .d_model = d_model,
          .heads = 2,
          .d_ff = 24,
          .max_source_len = 6,
          .max_target_len = 6,
          .aligned = kind == "encoder"};
}

std::shared_ptr<SequenceModel> build(const std::string& kind, int64_t d_model = 16, uint64_t seed = 3) {
  Generator gen(seed);
  auto m = make_model(kind, spec_for(kind, d_model), gen);
  m->eval();
  return m;
}

class DecodeStateMisuse : public ::testing::TestWithParam<std::string> {};

TEST_P(DecodeStateMisuse, StateWithoutBeginDecodeIsRefused) {
  auto m = build(GetParam());
  NoGradGuard no_grad;
  DecodeState by_hand;  // rows filled in, nothing the model computes
  by_hand.sources = kSources;
  by_hand.decoded.resize(2);
  by_hand.cached.assign(2, 0);
  by_hand.active = {0, 1};
  EXPECT_ATTO_ERROR(m->decode_step(by_hand), "begin_decode");
  DecodeState started = DecodeState::start(kSources);  // what a user's own model starts from, not this model's
  EXPECT_ATTO_ERROR(m->decode_step(started), "begin_decode");
  DecodeState empty;
  EXPECT_ATTO_ERROR(m->decode_step(empty), "begin_decode");
}

TEST_P(DecodeStateMisuse, AnotherModelsStateIsRefused) {
  auto a = build(GetParam(), 16, 3), b = build(GetParam(), 32, 4);
  NoGradGuard no_grad;
  DecodeState st = a->begin_decode(kSources);
  EXPECT_ATTO_ERROR(b->decode_step(st), "another");
  // The same kind and sizes is still another model.
  auto c = build(GetParam(), 16, 3);
  EXPECT_ATTO_ERROR(c->decode_step(st), "another");
  // Its own model decodes it.
  EXPECT_EQ(a->decode_step(st).shape(), (Shape{2, 12}));
}

TEST_P(DecodeStateMisuse, ActiveRowsOutOfRangeAreRefused) {
  auto m = build(GetParam());
  NoGradGuard no_grad;
  for (const std::vector<int64_t>& active :
       std::vector<std::vector<int64_t>>{{2}, {0, 5}, {-1}, {1, 0}, {0, 0}, {int64_t{1} << 40}}) {
    DecodeState st = m->begin_decode(kSources);
    st.active = active;
    SCOPED_TRACE(active.size());
    EXPECT_ATTO_ERROR(m->decode_step(st), "active");
  }
}

TEST_P(DecodeStateMisuse, RowsChangedSinceBeginDecodeAreRefused) {
  auto m = build(GetParam());
  NoGradGuard no_grad;
  {
    DecodeState st = m->begin_decode(kSources);
    st.sources.push_back({4});
    st.decoded.emplace_back();
    st.cached.push_back(0);
    st.active = {0, 1, 2};
    EXPECT_ATTO_ERROR(m->decode_step(st), "rows");
  }
  {
    DecodeState st = m->begin_decode(kSources);
    st.sources[1] = {7, 8, 9, 10, 11};  // longer than the encoded source
    EXPECT_ATTO_ERROR(m->decode_step(st), "sources");
  }
  {
    DecodeState st = m->begin_decode(kSources);
    st.decoded.pop_back();
    EXPECT_ATTO_ERROR(m->decode_step(st), "decoded");
  }
  {
    DecodeState st = m->begin_decode(kSources);
    st.cached.clear();
    EXPECT_ATTO_ERROR(m->decode_step(st), "cached");
  }
  {
    DecodeState st = m->begin_decode(kSources);
    st.memory.clear();
    st.cache.clear();
    if (GetParam() != "lm") EXPECT_ATTO_ERROR(m->decode_step(st), "memory");  // the LM keeps no memory
  }
}

TEST_P(DecodeStateMisuse, TokensOutsideTheVocabularyAreRefused) {
  auto m = build(GetParam());
  NoGradGuard no_grad;
  for (int64_t bad : {int64_t{12}, int64_t{-1}, int64_t{1} << 50}) {
    DecodeState st = m->begin_decode(kSources);
    st.decoded[0] = {bad};
    SCOPED_TRACE(bad);
    EXPECT_ATTO_ERROR(m->decode_step(st), "outside [0, 12)");
  }
}

TEST_P(DecodeStateMisuse, DecodingPastTheEndIsRefused) {
  auto m = build(GetParam());
  NoGradGuard no_grad;
  DecodeState st = m->begin_decode(kSources);
  // 1000 tokens: beyond every model's longest decode (and the position tables of 16).
  st.decoded[1].assign(1000, 4);
  if (GetParam() == "lm") {
    // A decoder-only model crops a long sequence to its window (the documented slide): still defined and finite.
    const std::vector<double> v = m->decode_step(st).to_vector<double>();
    for (double x : v) EXPECT_TRUE(std::isfinite(x));
  } else {
    EXPECT_ATTO_ERROR(m->decode_step(st), "row 1");
  }
}

TEST_P(DecodeStateMisuse, DocumentedUseStillDecodes) {
  auto m = build(GetParam());
  NoGradGuard no_grad;
  DecodeState st = m->begin_decode(kSources);
  Tensor l = m->decode_step(st);  // (2, V)
  EXPECT_EQ(l.shape(), (Shape{2, 12}));
  st.decoded[0].push_back(4);
  st.decoded[1].push_back(5);
  st.active = {1};  // row 0 finished
  l = m->decode_step(st);
  EXPECT_EQ(l.shape(), (Shape{1, 12}));
  for (double x : l.to_vector<double>()) EXPECT_FALSE(std::isnan(x));
  DecodeState full = m->begin_decode(kSources);
  full.use_cache = false;
  full.decoded = {{4}, {5}};
  full.active = {1};
  EXPECT_TRUE(all_close(m->decode_step(full), l, 1e-5, 1e-5));
  st.active.clear();
  EXPECT_EQ(m->decode_step(st).shape(), (Shape{0, 12}));
}

INSTANTIATE_TEST_SUITE_P(Models, DecodeStateMisuse, ::testing::Values("lm", "seq2seq", "encoder"),
                         [](const auto& info) { return info.param; });

TEST(EncoderDecodeState, PastItsSourceIsEosThenAnError) {
  // The encoder-only model tags one token per source position, then EOS at SEP's position; a row may still be fed
  // one token past that (the forced EOS), and nothing after it.
  auto m = build("encoder");
  NoGradGuard no_grad;
  DecodeState st = m->begin_decode({{4, 5, 6}, {7}});
  st.decoded[1] = {4, 5};  // past row 1's source of 1 token: EOS is the only choice
  st.active = {1};
  const std::vector<double> v = m->decode_step(st).to_vector<double>();
  ASSERT_EQ(v.size(), 12u);
  EXPECT_EQ(v[2], 0.0);  // EOS
  for (size_t k = 0; k < v.size(); ++k) {
    if (k != 2) {
      EXPECT_EQ(v[k], -INFINITY) << k;
    }
  }
  st.decoded[1] = {4, 5, 2};  // past the forced EOS
  EXPECT_ATTO_ERROR(m->decode_step(st), "row 1");
}

}  // namespace
