// The whole models' shared helpers (nn/model_helpers.h, internal): token checks and their messages, the key
// padding mask, the one-row tensor, and AttentionScope's restoring of the training flag and attention storing.

#include <stdexcept>

#include "nn/encoder_tagger.h"
#include "nn/model_helpers.h"
#include "testing.h"

using namespace attograd;
using attograd::nn::EncoderTagger;
using attograd::nn::TransformerEncoderLayer;

namespace {

TEST(ModelHelpers, CheckTokensNamesTheModelTheTensorAndTheValue) {
  const Tensor ok = from_vector<int64_t>({1, 2, 0, 3}, {2, 2});
  EXPECT_NO_THROW(nn::detail::check_tokens(ok, 4, 2, "M", "src", "n_position"));
  EXPECT_ATTO_ERROR(nn::detail::check_tokens(Tensor(), 4, 2, "M", "src", "n_position"), "M: src is undefined");
  EXPECT_ATTO_ERROR(nn::detail::check_tokens(from_vector<float>({1, 2}, {1, 2}), 4, 2, "M", "src", "n_position"),
                    "src must be int64 token ids, got float32 of shape [1, 2]");
  EXPECT_ATTO_ERROR(nn::detail::check_tokens(from_vector<int64_t>({1, 2}), 4, 2, "M", "src", "n_position"),
                    "expected src of shape (B, L), got [2]");
  EXPECT_ATTO_ERROR(nn::detail::check_tokens(ok, 4, 1, "M", "src", "n_position"),
                    "src length L=2 (shape [2, 2]) exceeds n_position=1");
  EXPECT_ATTO_ERROR(nn::detail::check_tokens(ok, 3, 2, "M", "src", "n_position"),
                    "token id 3 at [1, 1] of src [2, 2] is out of range for vocab size 3");
  EXPECT_ATTO_ERROR(nn::detail::check_tokens(from_vector<int64_t>({-1}, {1, 1}), 3, 2, "M", "src", "n_position"),
                    "token id -1 at [0, 0]");
}

TEST(ModelHelpers, KeyPaddingMaskAndRowTensor) {
  const Tensor m = nn::detail::key_padding_mask(from_vector<int64_t>({5, 0, 0, 7, 0, 6}, {2, 3}), 0);
  EXPECT_EQ(m.dtype(), kBool);
  EXPECT_EQ(m.shape(), (Shape{2, 3}));
  EXPECT_EQ(m.to_vector<bool>(), (std::vector<bool>{false, true, true, false, true, false}));
  const Tensor r = nn::detail::row_tensor({4, 5, 6});
  EXPECT_EQ(r.shape(), (Shape{1, 3}));
  EXPECT_EQ(r.to_vector<int64_t>(), (std::vector<int64_t>{4, 5, 6}));
}

TEST(ModelHelpers, AttentionScopeRestoresTheModelEvenOnAnError) {
  EncoderTagger m({.vocab = 7, .d_model = 8, .n_head = 2, .d_ff = 12, .n_layers = 1, .max_len = 4});
  m.train();
  {
    nn::detail::AttentionScope scope(m);
    EXPECT_FALSE(m.is_training());
    m.forward(nn::detail::row_tensor({5, 6, 3}));
    EXPECT_TRUE(static_cast<TransformerEncoderLayer&>(*(*m.layers)[0]).last_attention().defined());
  }
  EXPECT_TRUE(m.is_training());
  EXPECT_FALSE(static_cast<TransformerEncoderLayer&>(*(*m.layers)[0]).last_attention().defined());
  try {
    nn::detail::AttentionScope scope(m);
    throw std::runtime_error("inside");
  } catch (const std::runtime_error&) {
  }
  EXPECT_TRUE(m.is_training());
}

}  // namespace
