// EncoderTagger: PyTorch parity on a golden (nn.TransformerEncoderLayer(norm_first=True) stack with the same
// parameter names, right padding as a key padding mask), a double-precision gradcheck, dtype construction,
// and dropout replay from the model's generator.

#include <cmath>

#include "autograd/gradcheck.h"
#include "autograd/reduce.h"
#include "nn/encoder_tagger.h"
#include "nn_golden.h"
#include "testing.h"

using namespace attograd;
using namespace attograd::testing;
using namespace attograd::nn;

namespace {

TEST(EncoderTagger, MatchesPyTorch) {
  Golden g = load_golden("nn/encoder_tagger.golden");
  // [vocab, d_model, n_head, d_ff, n_layers, max_len, pad_idx]
  const std::vector<int64_t> c = g.at("config").to_vector<int64_t>();
  Generator gen(1);
  EncoderTagger m({.vocab = c[0],
                   .d_model = c[1],
                   .n_head = c[2],
                   .d_ff = c[3],
                   .n_layers = c[4],
                   .dropout = 0.1,
                   .max_len = c[5],
                   .pad_idx = c[6]},
                  gen);
  m.eval();
  const std::vector<GoldenParam> gp = golden_params(g);
  expect_names_and_load(m, gp);
  const Tensor tokens = g.at("tokens").to(kInt64);  // (2, 5) src SEP, right-padded
  Tensor out = m.forward(tokens);                   // (2, 5, V)
  EXPECT_TRUE(all_close(out, g.at("output"), 1e-5));
  out.backward(g.at("grad_output"));
  for (auto& p : gp)
    EXPECT_TRUE(all_close(m.parameter(p.name).grad(), g.at("grad." + std::to_string(p.index) + "." + p.name), 1e-5,
                          1e-4))
        << p.name;
}

TEST(EncoderTagger, GradcheckInDouble) {
  Generator gen(4);
  EncoderTagger m({.vocab = 7, .d_model = 8, .n_head = 2, .d_ff = 12, .n_layers = 2, .max_len = 6, .dtype = kFloat64},
                  gen);
  const Tensor tokens = from_vector<int64_t>({5, 6, 4, 3, 0, 6, 6, 5, 4, 3}, {2, 5});
  const std::vector<Tensor> params = m.parameters();
  const GradcheckResult r = gradcheck(
      [&](const std::vector<Tensor>&) {
        const Tensor out = m.forward(tokens);  // (2, 5, 7)
        return sum(out * out * 0.1 + out);
      },
      params);
  EXPECT_TRUE(r.passed) << r.message;
}

TEST(EncoderTagger, DtypeOptionEqualsConvertingAfterwards) {
  Generator a(9), b(9);
  EncoderTagger direct({.vocab = 7, .d_model = 8, .n_head = 2, .d_ff = 12, .n_layers = 1, .dtype = kFloat64}, a);
  EncoderTagger later({.vocab = 7, .d_model = 8, .n_head = 2, .d_ff = 12, .n_layers = 1}, b);
  later.to(kFloat64);
  const auto x = direct.state_dict(), y = later.state_dict();
  ASSERT_EQ(x.size(), y.size());
  for (size_t i = 0; i < x.size(); ++i) {
    EXPECT_EQ(x[i].second.dtype(), kFloat64) << x[i].first;
    EXPECT_EQ(x[i].second.to_vector<double>(), y[i].second.to_vector<double>()) << x[i].first;
  }
}

TEST(EncoderTagger, DropoutReplaysFromItsGenerator) {
  Generator init(2), drop(11);
  EncoderTagger m({.vocab = 7, .d_model = 8, .n_head = 2, .d_ff = 12, .n_layers = 2, .dropout = 0.3}, init);
  m.set_generator(drop);
  const Tensor tokens = from_vector<int64_t>({5, 6, 4, 3, 6, 6, 5, 3}, {2, 4});
  const GeneratorState s = drop.get_state();
  const std::vector<float> first = m.forward(tokens).to_vector<float>();
  drop.set_state(s);
  EXPECT_EQ(m.forward(tokens).to_vector<float>(), first);
  EXPECT_NE(m.forward(tokens).to_vector<float>(), first) << "new masks after the first replay";
  m.eval();
  const std::vector<float> e = m.forward(tokens).to_vector<float>();
  EXPECT_EQ(m.forward(tokens).to_vector<float>(), e);
}

TEST(EncoderTagger, Errors) {
  EXPECT_ATTO_ERROR(EncoderTagger({.vocab = 7, .d_model = 6, .n_head = 4}), "d_model must be divisible by n_head");
  EXPECT_ATTO_ERROR(EncoderTagger({.vocab = 3, .sep_idx = 3}), "sep_idx 3 must be token ids below vocab=3");
  EncoderTagger m({.vocab = 7, .d_model = 8, .n_head = 2, .d_ff = 12, .n_layers = 1, .max_len = 4});
  EXPECT_ATTO_ERROR(m.forward(from_vector<int64_t>({5, 6, 4, 3, 3}, {1, 5})), "exceeds max_len=4");
  EXPECT_ATTO_ERROR(m.forward(from_vector<int64_t>({5, 9}, {1, 2})),
                    "token id 9 at [0, 1] of tokens [1, 2] is out of range for vocab size 7");
  EXPECT_ATTO_ERROR(m.forward(from_vector<float>({5, 6}, {1, 2})), "tokens must be int64 token ids, got float32");
}

}  // namespace
