// The sequence-model interface: each model's batch framing (shapes, padding, where the loss falls), the registry,
// ModelSpec's JSON, the specs models derive from their options, gather_positions, and EncoderTagger's errors.

#include <memory>
#include <string>
#include <vector>

#include "autograd/shape.h"
#include "nn/encoder_tagger.h"
#include "nn/models.h"
#include "nn/sequence_model.h"
#include "testing.h"

namespace attograd::nn {
namespace {

constexpr int64_t kPad = 0, kBos = 1, kEos = 2, kSep = 3, kIgnore = -100;
int64_t d(int64_t x) { return 5 + x; }  // digit x, as the built-in tasks number them

ModelSpec small_spec() {
  return {.vocab = 15, .layers = 1, .d_model = 8, .heads = 2, .d_ff = 16, .max_source_len = 4, .max_target_len = 4,
          .aligned = true};
}

TEST(SequenceModel, Seq2SeqFraming) {
  auto m = make_model("seq2seq", small_spec());
  const SequenceBatch b = m->make_batch({{{d(1), d(2), d(3)}, {d(3), d(2), d(1)}}, {{d(4)}, {d(4)}}});
  ASSERT_EQ(b.inputs.size(), 2u);
  EXPECT_EQ(b.inputs[0].to_vector<int64_t>(), (std::vector<int64_t>{d(1), d(2), d(3), d(4), kPad, kPad}));
  EXPECT_EQ(b.inputs[1].to_vector<int64_t>(), (std::vector<int64_t>{kBos, d(3), d(2), d(1), kBos, d(4), kPad, kPad}));
  EXPECT_EQ(b.target.to_vector<int64_t>(),
            (std::vector<int64_t>{d(3), d(2), d(1), kEos, d(4), kEos, kIgnore, kIgnore}));
  EXPECT_EQ(m->forward_batch(b).shape(), (Shape{2, 4, 15}));
}

TEST(SequenceModel, CausalLMFramingPutsLossOnTargetOnly) {
  // seq = 1 2 SEP 2 1 EOS; input = 1 2 SEP 2 1; target = - - 2 1 EOS
  auto m = make_model("lm", small_spec());
  const SequenceBatch b = m->make_batch({{{d(1), d(2)}, {d(2), d(1)}}, {{d(5)}, {d(5)}}});
  ASSERT_EQ(b.inputs.size(), 1u);
  EXPECT_EQ(b.inputs[0].shape(), (Shape{2, 5}));
  EXPECT_EQ(b.inputs[0].to_vector<int64_t>(),
            (std::vector<int64_t>{d(1), d(2), kSep, d(2), d(1), d(5), kSep, d(5), kPad, kPad}));
  EXPECT_EQ(b.target.to_vector<int64_t>(),
            (std::vector<int64_t>{kIgnore, kIgnore, d(2), d(1), kEos, kIgnore, d(5), kEos, kIgnore, kIgnore}));
  EXPECT_EQ(m->forward_batch(b).shape(), (Shape{2, 5, 15}));
}

TEST(SequenceModel, EncoderFramingTagsEveryPositionThenEos) {
  auto m = make_model("encoder", small_spec());
  const SequenceBatch b = m->make_batch({{{d(1), d(2)}, {d(7), d(8)}}, {{d(5)}, {d(6)}}});
  ASSERT_EQ(b.inputs.size(), 1u);
  EXPECT_EQ(b.inputs[0].to_vector<int64_t>(), (std::vector<int64_t>{d(1), d(2), kSep, d(5), kSep, kPad}));
  EXPECT_EQ(b.target.to_vector<int64_t>(), (std::vector<int64_t>{d(7), d(8), kEos, d(6), kEos, kIgnore}));
  EXPECT_EQ(m->forward_batch(b).shape(), (Shape{2, 3, 15}));
  EXPECT_ATTO_ERROR(m->make_batch({{{d(1), d(2)}, {d(1)}}}),
                    "example 0 has a source of 2 tokens and a target of 1: the encoder-only model needs a target as "
                    "long as its source");
  EXPECT_ATTO_ERROR(make_model("encoder", {.vocab = 15, .max_source_len = 4, .max_target_len = 5}),
                    "needs targets aligned with their sources");
}

TEST(SequenceModel, EncoderPaddingDoesNotChangeOtherPositions) {
  // Padding keys are blocked: a row's logits are the same alone and batched with a longer row.
  auto m = make_model("encoder", small_spec());
  m->eval();
  NoGradGuard no_grad;
  const Tensor alone = m->forward_batch(m->make_batch({{{d(1)}, {d(1)}}}));                       // (1, 2, V)
  const Tensor both = m->forward_batch(m->make_batch({{{d(1)}, {d(1)}}, {{d(1), d(2), d(3)}, {d(1), d(2), d(3)}}}));
  const std::vector<float> a = alone.to_vector<float>(), b = both.to_vector<float>();
  for (size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(a[i], b[i], 1e-5f) << i;
}

TEST(SequenceModel, MakeBatchChecksTheSpec) {
  for (const std::string kind : {"lm", "seq2seq", "encoder"}) {
    SCOPED_TRACE(kind);
    auto m = make_model(kind, small_spec());
    EXPECT_ATTO_ERROR(m->make_batch({}), "empty batch");
    EXPECT_ATTO_ERROR(m->make_batch({{{d(1), 99}, {d(1), d(1)}}}), "example 0 has token 99 outside [0, 15)");
    EXPECT_ATTO_ERROR(m->make_batch({{{d(1), d(1), d(1), d(1), d(1)}, {d(1), d(1), d(1), d(1), d(1)}}}),
                      "source length 5 exceeds the model's max_source_len 4");
  }
}

TEST(SequenceModel, SpecsFromOptions) {
  CausalLM lm({.vocab = 20, .d_model = 16, .n_head = 2, .d_ff = 32, .n_layers = 1, .max_len = 10});
  EXPECT_EQ(lm.kind(), "lm");
  EXPECT_EQ(lm.vocab_size(), 20);
  EXPECT_EQ(lm.spec().max_source_len, 9);
  seed::Transformer tf({.src_vocab = 12, .tgt_vocab = 17, .d_model = 16, .n_head = 2, .d_k = 8, .d_v = 8,
                        .d_inner = 32, .n_layers = 1, .n_position = 7});
  EXPECT_EQ(tf.kind(), "seq2seq");
  EXPECT_EQ(tf.vocab_size(), 17);
  EXPECT_EQ(tf.max_decode_len(), 7);
  EncoderTagger enc({.vocab = 9, .max_len = 6});
  EXPECT_EQ(enc.kind(), "encoder");
  EXPECT_TRUE(enc.spec().aligned);
  EXPECT_EQ(enc.spec().max_source_len, 5);
  // From a spec, each kind keeps the spec it was given.
  const ModelSpec s = small_spec();
  for (const std::string kind : {"lm", "seq2seq", "encoder"}) EXPECT_EQ(make_model(kind, s)->spec(), s) << kind;
}

TEST(SequenceModel, DtypeOptionOfEveryModelEqualsConvertingAfterwards) {
  auto same = [](const Module& a, const Module& b) {
    const auto x = a.state_dict(), y = b.state_dict();
    ASSERT_EQ(x.size(), y.size());
    for (size_t i = 0; i < x.size(); ++i) {
      EXPECT_EQ(x[i].second.dtype(), kFloat64) << x[i].first;
      EXPECT_EQ(x[i].second.to_vector<double>(), y[i].second.to_vector<double>()) << x[i].first;
    }
  };
  {
    Generator a(1), b(1);
    CausalLM direct({.vocab = 9, .d_model = 8, .n_head = 2, .d_ff = 16, .n_layers = 1, .dtype = kFloat64}, a);
    CausalLM later({.vocab = 9, .d_model = 8, .n_head = 2, .d_ff = 16, .n_layers = 1}, b);
    later.to(kFloat64);
    same(direct, later);
  }
  {
    Generator a(2), b(2);
    const seed::TransformerOptions o{.src_vocab = 9, .tgt_vocab = 9, .d_model = 8, .n_head = 2, .d_k = 4, .d_v = 4,
                                     .d_inner = 16, .n_layers = 1};
    seed::TransformerOptions o64 = o;
    o64.dtype = kFloat64;
    seed::Transformer direct(o64, a), later(o, b);
    later.to(kFloat64);
    same(direct, later);
  }
}

TEST(SequenceModel, SpecJsonRoundTrips) {
  ModelSpec s = small_spec();
  s.dropout = 0.25;
  s.specials.eos = 7;
  EXPECT_EQ(ModelSpec::from_json(s.to_json()), s);
  EXPECT_ATTO_ERROR(ModelSpec::from_json(R"({"vocab": 3, "colour": 1})"), "unknown field \"colour\"");
  EXPECT_ATTO_ERROR(ModelSpec::from_json(R"({"vocab": "x"})"), "field \"vocab\" must be an integer");
  EXPECT_ATTO_ERROR(ModelSpec::from_json("[1]"), "not a JSON object");
}

TEST(SequenceModel, RegistryBuildsKindsAndUserKinds) {
  const auto kinds = registered_models();
  ASSERT_GE(kinds.size(), 3u);
  EXPECT_EQ(kinds[0].first, "lm");
  EXPECT_EQ(kinds[1].first, "seq2seq");
  EXPECT_EQ(kinds[2].first, "encoder");
  EXPECT_FALSE(has_model("tiny_test_kind"));
  int built = 0;
  register_model("tiny_test_kind", [&](const ModelSpec& s, Generator& g) {
    ++built;
    return make_model("lm", s, g);
  });
  EXPECT_TRUE(has_model("tiny_test_kind"));
  EXPECT_EQ(make_model("tiny_test_kind", small_spec())->kind(), "lm");
  EXPECT_EQ(built, 1);
  EXPECT_ATTO_ERROR(make_model("rnn", small_spec()), "unknown model kind \"rnn\" (registered: lm, seq2seq, encoder");
  EXPECT_ATTO_ERROR(make_model("lm", {.vocab = 0}), "lm: vocab must be positive, got 0");
  EXPECT_ATTO_ERROR(register_model("", [](const ModelSpec& s, Generator& g) { return make_model("lm", s, g); }),
                    "the kind must not be empty");
  EXPECT_ATTO_ERROR(register_model("x", nullptr), "no factory given for kind \"x\"");
  // The same generator state gives the same weights.
  Generator g1(5), g2(5);
  auto a = make_model("encoder", small_spec(), g1), b = make_model("encoder", small_spec(), g2);
  EXPECT_EQ(a->parameters()[0].to_vector<float>(), b->parameters()[0].to_vector<float>());
}

TEST(SequenceModel, GatherPositionsCopiesRows) {
  const Tensor logits = reshape(arange(0, 2 * 3 * 4), {2, 3, 4});  // (2, 3, 4)
  const Tensor g = gather_positions(logits, {{1, 2}, {0, 0}});
  EXPECT_EQ(g.shape(), (Shape{2, 4}));
  EXPECT_EQ(g.to_vector<float>(), (std::vector<float>{20, 21, 22, 23, 0, 1, 2, 3}));
  EXPECT_ATTO_ERROR(gather_positions(logits, {{2, 0}}), "position (2, 0) outside (2, 3)");
  EXPECT_EQ(pack_rows({{4, 5}, {6}}, 3, -1).to_vector<int64_t>(), (std::vector<int64_t>{4, 5, -1, 6, -1, -1}));
}

TEST(SequenceModel, AttentionMapsOfEveryModel) {
  const std::vector<int64_t> src{d(1), d(2), d(3)}, out{d(3), d(2), d(1)};
  auto lm = make_model("lm", small_spec());
  auto maps = lm->attention_maps(src, out);
  ASSERT_EQ(maps.size(), 1u);
  EXPECT_EQ(maps[0].weights.shape(), (Shape{1, 2, 7, 7}));
  auto tf = make_model("seq2seq", small_spec());
  maps = tf->attention_maps(src, out);
  ASSERT_EQ(maps.size(), 3u);
  EXPECT_EQ(maps[2].label, "decoder 0 cross");
  EXPECT_EQ(maps[2].weights.shape(), (Shape{1, 2, 4, 3}));
  auto enc = make_model("encoder", small_spec());
  enc->train();
  maps = enc->attention_maps(src, out);
  ASSERT_EQ(maps.size(), 1u);
  EXPECT_EQ(maps[0].weights.shape(), (Shape{1, 2, 4, 4}));
  EXPECT_EQ(maps[0].keys, (std::vector<int64_t>{d(1), d(2), d(3), kSep}));
  EXPECT_TRUE(enc->is_training()) << "the training flag is restored";
}

// An example without a source token (issue 14) is an error naming it, for every built-in model.
TEST(SequenceModel, EmptyExampleIsAnErrorNamingIt) {
  for (const char* kind : {"lm", "seq2seq", "encoder"}) {
    auto m = make_model(kind, small_spec());
    EXPECT_ATTO_ERROR(m->make_batch({{{d(1)}, {d(1)}}, {{}, {}}}), "example 1 has an empty source");
  }
}

}  // namespace
}  // namespace attograd::nn
