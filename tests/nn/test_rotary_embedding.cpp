// nn::RotaryEmbedding: equal to apply_rotary_emb, nothing in the state_dict, offset decoding bit for bit (past the
// table too), and errors.

#include <gtest/gtest.h>

#include "autograd/rope.h"
#include "autograd/shape.h"
#include "nn/positional.h"
#include "testing.h"

namespace attograd::nn {
namespace {

TEST(RotaryEmbedding, EqualsTheOpAndSavesNothing) {
  RotaryEmbedding rope(8, 64);
  EXPECT_TRUE(rope.state_dict().empty());
  EXPECT_EQ(rope.num_parameters(), 0);
  Generator gen(1);
  for (Dtype dt : {kFloat32, kFloat64}) {
    Tensor x = rand({2, 3, 10, 8}, gen, {.dtype = dt});
    EXPECT_TRUE(testing::bitwise_equal(rope.forward(x), apply_rotary_emb(x)));
    EXPECT_TRUE(testing::bitwise_equal(rope.forward(x, 17), apply_rotary_emb(x, 17)));
  }
  EXPECT_NE(rope.to_string().find("head_dim=8, max_len=64, base=10000"), std::string::npos) << rope.to_string();
}

TEST(RotaryEmbedding, DecodingOnePositionAtATimeEqualsTheFullSequence) {
  RotaryEmbedding rope(4, 16, 500.0);
  Generator gen(2);
  Tensor x = rand({1, 2, 9, 4}, gen);
  Tensor full = rope.forward(x);
  for (int64_t t = 0; t < 9; ++t)
    EXPECT_TRUE(testing::bitwise_equal(rope.forward(narrow(x, 2, t, 1), t), narrow(full, 2, t, 1))) << t;
}

TEST(RotaryEmbedding, GradientIsTheInverseRotation) {
  RotaryEmbedding rope(6, 8);
  Generator gen(3);
  Tensor x = testing::rand_leaf({2, 5, 6}, gen);
  EXPECT_TRUE(testing::gradcheck_ok([&] { return rope.forward(x, 2); }, {x}));
}

TEST(RotaryEmbedding, Errors) {
  EXPECT_THROW(RotaryEmbedding(5, 8), Error);
  EXPECT_THROW(RotaryEmbedding(4, 0), Error);
  RotaryEmbedding rope(4, 8);
  EXPECT_THROW(rope.forward(zeros({2, 6})), Error);     // not a multiple of head_dim
  EXPECT_TRUE(testing::bitwise_equal(rope.forward(full({2, 8}, 0.5), 3),
                                     apply_rotary_emb(full({2, 8}, 0.5), 3, 10000.0, 4)));  // two heads
  EXPECT_THROW(rope.forward(zeros({5, 4}), -1), Error);  // a negative offset
  EXPECT_NO_THROW(rope.forward(zeros({5, 4}), 3));
}

TEST(RotaryEmbedding, PositionsPastTheTableAreWhatALongerTableHolds) {
  // A ring decode past the context rotates at positions beyond max_len: bitwise the rows of a longer table, in
  // float32 and float64, whether the rows straddle the table's end or lie wholly past it.
  Generator gen(3);
  RotaryEmbedding shorter(8, 16), longer(8, 4096);
  for (Dtype dt : {kFloat32, kFloat64}) {
    const Tensor x = testing::rand_leaf({2, 5, 16}, gen).detach().to(dt);  // two heads of 8
    for (int64_t offset : {13, 16, 1000, 4000}) {
      SCOPED_TRACE(offset);
      EXPECT_TRUE(testing::bitwise_equal(shorter.forward(x, offset), longer.forward(x, offset)));
    }
  }
}

}  // namespace
}  // namespace attograd::nn
