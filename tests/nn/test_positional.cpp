// PositionalEncoding (the sinusoidal table, buffer, forward, dropout, errors, gradcheck) and the
// attention masks (padding_mask, causal_mask, subsequent_mask; true = blocked).

#include <cmath>

#include "autograd/indexing.h"
#include "autograd/shape.h"
#include "nn/masks.h"
#include "nn/positional.h"
#include "testing.h"

using namespace attograd;
using namespace attograd::testing;
using namespace attograd::nn;

TEST(PositionalEncoding, BufferNoParametersAndPrinting) {
  PositionalEncoding pe(8);
  EXPECT_TRUE(pe.named_parameters().empty());
  auto bufs = pe.named_buffers();
  ASSERT_EQ(bufs.size(), 1u);
  EXPECT_EQ(bufs[0].first, "pe");
  EXPECT_EQ(bufs[0].second.shape(), (Shape{1, 5000, 8}));
  EXPECT_FALSE(pe.pe.requires_grad());
  EXPECT_EQ(pe.to_string(),
            "PositionalEncoding(\n  d_model=8, max_len=5000\n  (dropout): Dropout(p=0.0, inplace=False)\n)");
}

TEST(PositionalEncoding, TableValues) {
  PositionalEncoding pe(6, 10);
  for (int64_t j = 0; j < 6; ++j) EXPECT_EQ(pe.pe.at({0, 0, j}), j % 2 == 0 ? 0.0 : 1.0);  // position 0
  // position 3, columns 2i and 2i+1 share the frequency 1 / 10000^(2i / d_model)
  for (int64_t i = 0; i < 3; ++i) {
    const double angle = 3.0 / std::pow(10000.0, 2.0 * static_cast<double>(i) / 6.0);
    EXPECT_FLOAT_EQ(static_cast<float>(pe.pe.at({0, 3, 2 * i})), static_cast<float>(std::sin(angle)));
    EXPECT_FLOAT_EQ(static_cast<float>(pe.pe.at({0, 3, 2 * i + 1})), static_cast<float>(std::cos(angle)));
  }
}

TEST(PositionalEncoding, TableMatchesTheSeedsNumpyFormula) {
  auto g = load_golden("nn/positional.golden");  // tests/nn/golden_layers.py: the seed's table, float32
  EXPECT_TRUE(all_close(PositionalEncoding(8, 50).pe, g.at("pe_50_8"), 1e-7));
  EXPECT_TRUE(all_close(PositionalEncoding(7, 20).pe, g.at("pe_20_7"), 1e-7));  // odd d_model
  EXPECT_TRUE(all_close(reshape(sinusoidal_table(50, 8), {1, 50, 8}), g.at("pe_50_8"), 1e-7));
}

TEST(PositionalEncoding, ForwardAddsThePrefixOfTheTable) {
  Generator gen(1);
  PositionalEncoding pe(4, 16);
  Tensor x = rand({2, 5, 4}, gen);
  Tensor expect = x + narrow(pe.pe, 1, 0, 5);
  EXPECT_EQ(pe(x).to_vector<float>(), expect.to_vector<float>());
  EXPECT_EQ(pe(zeros({3, 0, 4})).shape(), (Shape{3, 0, 4}));
  EXPECT_TRUE(all_close(pe(zeros({1, 16, 4})), pe.pe, 0));  // L == max_len is fine
}

TEST(PositionalEncoding, DropoutTrainEvalAndReplay) {
  Generator gen(2), masks(5);
  PositionalEncoding pe(4, 16, 0.5, masks);
  Tensor x = rand({2, 6, 4}, gen);
  pe.eval();
  Tensor clean = pe(x);
  EXPECT_EQ(clean.to_vector<float>(), (x + narrow(pe.pe, 1, 0, 6)).to_vector<float>());
  pe.train();
  masks.manual_seed(3);
  Tensor a = pe(x);
  masks.manual_seed(3);
  Tensor b = pe(x);
  EXPECT_EQ(a.to_vector<float>(), b.to_vector<float>());
  auto av = a.to_vector<float>();
  auto cv = clean.to_vector<float>();
  int dropped = 0;
  for (size_t i = 0; i < av.size(); ++i) {
    if (av[i] == 0.f)
      ++dropped;
    else
      EXPECT_FLOAT_EQ(av[i], 2.f * cv[i]);
  }
  EXPECT_GT(dropped, 0);
  Generator other(3);
  pe.set_generator(other);
  EXPECT_EQ(pe(x).to_vector<float>(), a.to_vector<float>());
}

TEST(PositionalEncoding, GradcheckInDoubleWithDropoutOn) {
  Generator gen(4), masks(0);
  auto pe = std::make_shared<PositionalEncoding>(6, 12, 0.3, masks);
  pe->to(kFloat64);
  EXPECT_EQ(pe->pe.dtype(), kFloat64);
  Tensor x = rand_leaf({2, 5, 6}, gen);
  EXPECT_GRADCHECK(
      [&] {
        masks.manual_seed(21);
        return pe->forward(x);
      },
      {x});
  pe->eval();
  EXPECT_GRADCHECK([&] { return pe->forward(x); }, {x});
}

TEST(PositionalEncoding, Errors) {
  PositionalEncoding pe(4, 5);
  EXPECT_ATTO_ERROR(pe(zeros({1, 7, 4})),
                    "PositionalEncoding: sequence length L=7 of input [1, 7, 4] exceeds max_len=5");
  EXPECT_ATTO_ERROR(pe(zeros({1, 3, 5})),
                    "PositionalEncoding: expected input of shape (B, L, d_model=4), got shape [1, 3, 5]");
  EXPECT_ATTO_ERROR(pe(zeros({3, 4})), "got shape [3, 4]");
  EXPECT_ATTO_ERROR(pe(zeros({1, 3, 4}, {.dtype = kFloat64})),
                    "input dtype float64 does not match the table's float32");
  EXPECT_ATTO_ERROR(PositionalEncoding(0), "d_model and max_len must be positive");
  EXPECT_ATTO_ERROR(PositionalEncoding(4, 5, 1.5), "Dropout: dropout probability has to be between 0 and 1");
}

// ---------------------------------------------------------------------------------------------
// Masks (true = blocked)

TEST(Masks, PaddingMaskBlocksPadKeys) {
  Tensor tokens = from_vector<int64_t>({5, 7, 0, 0, 3, 0, 2, 9}, {2, 4});
  Tensor m = padding_mask(tokens, 0);
  EXPECT_EQ(m.dtype(), kBool);
  EXPECT_EQ(m.shape(), (Shape{2, 1, 1, 4}));
  EXPECT_EQ(m.to_vector<bool>(), (std::vector<bool>{false, false, true, true, false, true, false, false}));
  EXPECT_EQ(padding_mask(from_vector<int64_t>({1, 1}, {1, 2}), 1).to_vector<bool>(), (std::vector<bool>{true, true}));
}

TEST(Masks, CausalMaskBlocksTheFuture) {
  Tensor m = causal_mask(3);
  EXPECT_EQ(m.dtype(), kBool);
  EXPECT_EQ(m.shape(), (Shape{3, 3}));
  EXPECT_EQ(m.to_vector<bool>(), (std::vector<bool>{false, true, true, false, false, true, false, false, false}));
  EXPECT_EQ(subsequent_mask(3).to_vector<bool>(), m.to_vector<bool>());
  EXPECT_EQ(causal_mask(0).shape(), (Shape{0, 0}));
}

TEST(Masks, CombineAndApplyWithMaskedFill) {
  // scores (B=1, H=1, L=3, L=3); tokens [4, 2, pad]: query i sees keys j <= i that are not padding.
  Tensor tokens = from_vector<int64_t>({4, 2, 0}, {1, 3});
  Tensor blocked = logical_or(padding_mask(tokens, 0), causal_mask(3));  // (1, 1, 3, 3)
  EXPECT_EQ(blocked.shape(), (Shape{1, 1, 3, 3}));
  Tensor scores = masked_fill(zeros({1, 1, 3, 3}), blocked, -1e9);
  EXPECT_EQ(scores.to_vector<float>(), (std::vector<float>{0, -1e9f, -1e9f, 0, 0, -1e9f, 0, 0, -1e9f}));
}

TEST(Masks, Errors) {
  EXPECT_ATTO_ERROR(padding_mask(zeros({2, 3}), 0),
                    "padding_mask: expected int64 tokens of shape (B, L), got float32 of shape [2, 3]");
  EXPECT_ATTO_ERROR(padding_mask(from_vector<int64_t>({1, 2}, {2}), 0), "got int64 of shape [2]");
  EXPECT_ATTO_ERROR(causal_mask(-1), "causal_mask: length must be non-negative, got -1");
}
