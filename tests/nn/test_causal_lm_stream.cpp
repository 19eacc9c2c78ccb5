// CausalLM as a language model of a text stream (ModelSpec::stream): the batch framing (inputs seq[:-1], targets
// seq[1:] at every position, no SEP or EOS), prompts without SEP, an unbounded decoding budget, and nanoGPT's crop
// (a sequence longer than the window is seen through its last max_len tokens).

#include <limits>

#include "autograd/indexing.h"
#include "autograd/shape.h"
#include "nn/models.h"
#include "testing.h"

using namespace attograd;
using namespace attograd::nn;
using namespace attograd::testing;

namespace {

ModelSpec stream_spec() {
  return {.vocab = 9,
          .layers = 1,
          .d_model = 8,
          .heads = 2,
          .d_ff = 16,
          .max_source_len = 4,
          .max_target_len = 1,
          .stream = true};
}

std::vector<int64_t> values(const Tensor& t) {
  return std::vector<int64_t>(t.data<int64_t>(), t.data<int64_t>() + t.numel());
}

}  // namespace

TEST(CausalLMStream, SpecJsonAndWindow) {
  const ModelSpec s = stream_spec();
  EXPECT_EQ(ModelSpec::from_json(s.to_json()), s);
  EXPECT_NE(s.to_json().find("\"stream\":true"), std::string::npos);
  Generator g(1);
  auto m = std::dynamic_pointer_cast<CausalLM>(make_model("lm", s, g));
  ASSERT_TRUE(m);
  EXPECT_EQ(m->options.max_len, 4);  // context 4 + 1 target - 1: the inputs (src tgt)[:-1]
  EXPECT_EQ(m->max_decode_len(), std::numeric_limits<int64_t>::max());
  ModelSpec plain = s;
  plain.stream = false;
  EXPECT_EQ(std::dynamic_pointer_cast<CausalLM>(make_model("lm", plain, g))->options.max_len, 6);
}

TEST(CausalLMStream, BatchPredictsEveryNextToken) {
  Generator g(1);
  auto m = make_model("lm", stream_spec(), g);
  const SequenceBatch b = m->make_batch({{.src = {4, 5, 6, 7}, .tgt = {8}}, {.src = {5, 6}, .tgt = {4}}});
  ASSERT_EQ(b.inputs.size(), 1u);
  EXPECT_EQ(b.inputs[0].shape(), (Shape{2, 4}));
  EXPECT_EQ(values(b.inputs[0]), (std::vector<int64_t>{4, 5, 6, 7, 5, 6, 0, 0}));  // right-padded with pad 0
  EXPECT_EQ(values(b.target), (std::vector<int64_t>{5, 6, 7, 8, 6, 4, -100, -100}));
  EXPECT_EQ(m->forward_batch(b).shape(), (Shape{2, 4, 9}));
  EXPECT_ATTO_ERROR(m->make_batch({{.src = {4}, .tgt = {}}}), "needs at least 2");
}

TEST(CausalLMStream, DecodingCropsToTheLastMaxLenTokens) {
  Generator g(3);
  auto m = make_model("lm", stream_spec(), g);
  auto& lm = static_cast<CausalLM&>(*m);
  lm.eval();
  NoGradGuard no_grad;
  // A prompt of 3 tokens and 4 decoded: 7 > max_len 4, so the model sees the last 4 (no SEP anywhere).
  DecodeState st = m->begin_decode({{4, 5, 6}});
  st.decoded[0] = {7, 8, 4, 5};
  const Tensor step = m->decode_step(st);                                                 // (1, V)
  const Tensor want = lm.forward(from_vector(std::vector<int64_t>{7, 8, 4, 5}, {1, 4}));  // the last 4 tokens
  EXPECT_TRUE(bitwise_equal(step, reshape(select(want, 1, 3), {1, 9})));
  // A short row needs no crop: its logits are those of the whole prompt.
  DecodeState st2 = m->begin_decode({{4, 5}});
  const Tensor want2 = lm.forward(from_vector(std::vector<int64_t>{4, 5}, {1, 2}));
  EXPECT_TRUE(bitwise_equal(m->decode_step(st2), reshape(select(want2, 1, 1), {1, 9})));
  EXPECT_ATTO_ERROR(m->begin_decode({{}}), "is empty");
}
