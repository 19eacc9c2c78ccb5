// apply_rotary_emb: the interleaved pairing by hand, the PyTorch float64 golden (forward and gradient), offset
// equivalence (positions [t, t+n) of a slice equal the slice of the full rotation, bit for bit), norm preservation,
// relative-position property, gradcheck and errors.

#include <gtest/gtest.h>

#include <cmath>

#include "autograd/elementwise.h"
#include "autograd/matmul.h"
#include "autograd/reduce.h"
#include "autograd/rope.h"
#include "autograd/shape.h"
#include "testing.h"

namespace attograd {
namespace {

TEST(Rope, RotatesInterleavedPairsByPositionTimesTheta) {
  // d = 4: theta_0 = 1, theta_1 = 10000^(-1/2) = 0.01. Position 3, x = (1, 2, 3, 4).
  Tensor x = from_vector(std::vector<double>{0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 2, 3, 4}, {4, 4});
  Tensor y = apply_rotary_emb(x);
  const double a0 = 3.0, a1 = 3.0 * 0.01;
  EXPECT_NEAR(y.at({3, 0}), 1 * std::cos(a0) - 2 * std::sin(a0), 1e-15);
  EXPECT_NEAR(y.at({3, 1}), 1 * std::sin(a0) + 2 * std::cos(a0), 1e-15);
  EXPECT_NEAR(y.at({3, 2}), 3 * std::cos(a1) - 4 * std::sin(a1), 1e-15);
  EXPECT_NEAR(y.at({3, 3}), 3 * std::sin(a1) + 4 * std::cos(a1), 1e-15);
  // Position 0 is the identity.
  Tensor z = apply_rotary_emb(from_vector(std::vector<double>{1, 2, 3, 4}, {1, 4}));
  EXPECT_TRUE(testing::bitwise_equal(z, from_vector(std::vector<double>{1, 2, 3, 4}, {1, 4})));
}

TEST(Rope, MatchesPyTorchGolden) {
  // tests/autograd/golden_rope.py: a plain torch implementation of the interleaved pairing, float64.
  auto g = testing::load_golden("autograd/rope.golden");
  Tensor x = g.at("x").detach().requires_grad_(true);
  const int64_t offset = static_cast<int64_t>(g.at("offset").item());
  const double base = g.at("base").item();
  Tensor y = apply_rotary_emb(x, offset, base);
  EXPECT_TRUE(testing::all_close(y, g.at("out"), 1e-13, 1e-12));
  sum(mul(y, g.at("w"))).backward();
  EXPECT_TRUE(testing::all_close(x.grad(), g.at("grad_x"), 1e-13, 1e-12));
}

TEST(Rope, OffsetSliceEqualsSliceOfFullRotation) {
  Generator gen(3);
  for (Dtype dt : {kFloat32, kFloat64}) {
    Tensor x = rand({2, 3, 20, 8}, gen, {.dtype = dt});
    Tensor full = apply_rotary_emb(x);
    for (int64_t t : {0, 1, 7, 19}) {
      const int64_t n = std::min<int64_t>(3, 20 - t);
      Tensor part = apply_rotary_emb(narrow(x, 2, t, n).clone(), t);
      EXPECT_TRUE(testing::bitwise_equal(part, narrow(full, 2, t, n).clone())) << "t=" << t;
    }
  }
}

TEST(Rope, HeadInterleavedLayoutEqualsTheSplitHeads) {
  // (B, L, H * d) as projections give, rotated per head, equals (B, H, L, d) rotated, bit for bit; so does the
  // gradient.
  Generator gen(6);
  Tensor x = testing::rand_leaf({2, 5, 3 * 4}, gen);
  Tensor packed = apply_rotary_emb(x, 2, 10000.0, 4);
  Tensor split = transpose(reshape(x, {2, 5, 3, 4}), 1, 2).clone();
  Tensor expected = reshape(transpose(apply_rotary_emb(split, 2), 1, 2), {2, 5, 12});
  EXPECT_TRUE(testing::bitwise_equal(packed, expected));
  EXPECT_TRUE(testing::gradcheck_ok([&] { return apply_rotary_emb(x, 2, 10000.0, 4); }, {x}));
  EXPECT_THROW(apply_rotary_emb(x, 0, 10000.0, 5), Error);  // 12 is not a multiple of 5
  EXPECT_THROW(apply_rotary_emb(x, 0, 10000.0, -2), Error);
}

TEST(Rope, PreservesNormsAndScoresDependOnRelativePosition) {
  Generator gen(4);
  Tensor q = rand({1, 16}, gen, {.dtype = kFloat64}), k = rand({1, 16}, gen, {.dtype = kFloat64});
  auto score = [&](int64_t m, int64_t n) { return sum(mul(apply_rotary_emb(q, m), apply_rotary_emb(k, n))).item(); };
  EXPECT_NEAR(score(5, 2), score(13, 10), 1e-12);  // <R_m q, R_n k> depends on m - n only
  EXPECT_NEAR(score(0, 7), score(100, 107), 1e-12);
  EXPECT_NEAR(sum(mul(apply_rotary_emb(q, 9), apply_rotary_emb(q, 9))).item(), sum(mul(q, q)).item(), 1e-12);
}

TEST(Rope, GradcheckFloat64WithTables) {
  Generator gen(5);
  Tensor x = testing::rand_leaf({2, 2, 5, 6}, gen);
  auto [c, s] = rotary_cos_sin(5, 6, 3, 100.0, kFloat64);
  EXPECT_TRUE(testing::gradcheck_ok([&] { return apply_rotary_emb(x, c, s); }, {x}));
  EXPECT_TRUE(testing::bitwise_equal(apply_rotary_emb(x, c, s), apply_rotary_emb(x, 3, 100.0)));
}

TEST(Rope, Errors) {
  EXPECT_THROW(apply_rotary_emb(zeros({3, 5})), Error);  // odd d
  EXPECT_THROW(apply_rotary_emb(zeros({5})), Error);     // no L dim
  EXPECT_THROW(apply_rotary_emb(zeros({3, 4}), -1), Error);
  EXPECT_THROW(apply_rotary_emb(zeros({3, 4}), 0, 0.0), Error);
  auto [c, s] = rotary_cos_sin(3, 4);
  EXPECT_THROW(apply_rotary_emb(zeros({4, 4}), c, s), Error);                       // L differs
  EXPECT_THROW(apply_rotary_emb(zeros({3, 4}, {.dtype = kFloat64}), c, s), Error);  // dtype
  EXPECT_THROW(apply_rotary_emb(zeros({3, 4}), c.detach().requires_grad_(true), s), Error);
  EXPECT_THROW(apply_rotary_emb(zeros({3, 4}, {.dtype = kInt64}), 0), Error);
}

}  // namespace
}  // namespace attograd
