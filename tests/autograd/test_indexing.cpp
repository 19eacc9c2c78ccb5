// where, masked_fill, comparisons, logic and embedding: values by hand, float64 gradchecks with
// broadcast shapes, reused inputs, zero-size tensors, float32 runs and error messages.

#include <cmath>
#include <limits>

#include "autograd/activation.h"
#include "autograd/indexing.h"
#include "testing.h"

using namespace attograd;
using namespace attograd::testing;

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

Tensor dvec(std::vector<double> v, Shape s = {}) {
  return from_vector<double>(v, s.empty() ? Shape{std::ssize(v)} : s, {.dtype = kFloat64});
}
Tensor dleaf(std::vector<double> v, Shape s = {}) {
  return from_vector<double>(v, s.empty() ? Shape{std::ssize(v)} : s, {.dtype = kFloat64, .requires_grad = true});
}
Tensor bvec(std::vector<bool> v, Shape s = {}) { return from_vector<bool>(v, s.empty() ? Shape{std::ssize(v)} : s); }
Tensor ivec(std::vector<int64_t> v, Shape s = {}) {
  return from_vector<int64_t>(v, s.empty() ? Shape{std::ssize(v)} : s);
}

// A Bool tensor with a fixed pseudo-random pattern.
Tensor bool_pattern(const Shape& shape, Generator& gen) {
  Tensor r = rand(shape, gen, {.dtype = kFloat64});
  return lt(r, 0.5);
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// where

TEST(Where, ValuesWithBroadcasting) {
  Tensor cond = bvec({true, false, true}, {3, 1});
  Tensor a = dvec({1, 2, 3, 4}, {1, 4});
  Tensor b = scalar_tensor(-1.0, {.dtype = kFloat64});  // shape []
  Tensor y = where(cond, a, b);
  EXPECT_EQ(y.shape(), (Shape{3, 4}));
  EXPECT_TRUE(all_close(y, dvec({1, 2, 3, 4, -1, -1, -1, -1, 1, 2, 3, 4}, {3, 4}), 0));
  // All three broadcast: cond (2,1,1), a (3,1), b (4).
  Tensor c3 = bvec({false, true}, {2, 1, 1});
  Tensor a3 = dvec({10, 20, 30}, {3, 1});
  Tensor b3 = dvec({1, 2, 3, 4}, {4});
  Tensor y3 = where(c3, a3, b3);
  EXPECT_EQ(y3.shape(), (Shape{2, 3, 4}));
  EXPECT_TRUE(all_close(y3, dvec({1, 2, 3, 4, 1, 2, 3, 4, 1, 2, 3, 4,  //
                                  10, 10, 10, 10, 20, 20, 20, 20, 30, 30, 30, 30},
                                 {2, 3, 4}),
                        0));
}

TEST(Where, ScalarOtherValues) {
  Tensor cond = bvec({true, false, false, true}, {2, 2});
  Tensor a = dvec({1, 2}, {2});
  EXPECT_TRUE(all_close(where(cond, a, 7.0), dvec({1, 7, 7, 2}, {2, 2}), 0));
  auto v = where(cond, a, -kInf).to_vector<double>();
  EXPECT_EQ(v[1], -kInf);
  // The result takes the broadcast shape of cond and a.
  EXPECT_EQ(where(bvec({true}, {1}), dvec({1, 2, 3}, {3, 1}), 0.0).shape(), (Shape{3, 1}));
  EXPECT_EQ(where(bvec({true, false}, {2}), dvec({1, 2, 3}, {3, 1}), 0.0).shape(), (Shape{3, 2}));
  // Int64 and Bool values pass through (no gradient).
  EXPECT_EQ(where(cond, ivec({5, 6}, {2}), -1.0).to_vector<int64_t>(), (std::vector<int64_t>{5, -1, -1, 6}));
}

TEST(Where, GradientsByHand) {
  Tensor cond = bvec({true, false, true, false, false, false}, {2, 3});
  Tensor a = dleaf({1, 2, 3}, {3});
  Tensor b = dleaf({4, 5}, {2, 1});
  Tensor g = dvec({1, 2, 3, 4, 5, 6}, {2, 3});
  where(cond, a, b).backward(g);
  // a gets g where cond, summed over rows: [1, 0, 3]; b gets g elsewhere, summed over columns: [2, 15].
  EXPECT_TRUE(all_close(a.grad(), dvec({1, 0, 3}), 0));
  EXPECT_TRUE(all_close(b.grad(), dvec({2, 15}, {2, 1}), 0));
}

TEST(Where, Gradcheck) {
  Generator gen(11);
  Tensor cond = bool_pattern({2, 1, 4}, gen);
  Tensor a = rand_leaf({3, 1}, gen);
  Tensor b = rand_leaf({2, 3, 4}, gen);
  EXPECT_GRADCHECK([&] { return where(cond, a, b); }, {a, b});
  EXPECT_GRADCHECK([&] { return where(cond, b, a); }, {a, b});
  Tensor s = rand_leaf({}, gen);
  EXPECT_GRADCHECK([&] { return where(cond, s, b); }, {s, b});
  EXPECT_GRADCHECK([&] { return where(cond, a, 2.5); }, {a});
  Tensor same = bool_pattern({2, 3, 4}, gen);
  EXPECT_GRADCHECK([&] { return where(same, b, b * 3.0); }, {b});
}

TEST(Where, ReusedInput) {
  Tensor x = dleaf({1, 2, 3}, {3});
  Tensor cond = bvec({true, false, true}, {3});
  where(cond, x, x).backward(ones({3}, {.dtype = kFloat64}));
  EXPECT_TRUE(all_close(x.grad(), dvec({1, 1, 1}), 0));
  Generator gen(12);
  Tensor y = rand_leaf({2, 3}, gen);
  Tensor c = bool_pattern({2, 3}, gen);
  EXPECT_GRADCHECK([&] { return where(c, y * y, y); }, {y});
}

TEST(Where, OnlyNeededGradients) {
  Tensor cond = bvec({true, false}, {2});
  Tensor a = dleaf({1, 2}, {2});
  Tensor b = dvec({3, 4}, {2});
  Tensor y = where(cond, a, b);
  EXPECT_EQ(y.grad_fn_name(), "where");
  y.backward(ones({2}, {.dtype = kFloat64}));
  EXPECT_TRUE(all_close(a.grad(), dvec({1, 0}), 0));
  EXPECT_FALSE(b.grad().defined());
  EXPECT_FALSE(where(cond, b, b).requires_grad());
}

TEST(Where, ZeroSizeAndFloat32) {
  Tensor cond = zeros({0, 3}, {.dtype = kBool});
  Tensor a = zeros({3}, {.dtype = kFloat64, .requires_grad = true});
  Tensor b = zeros({0, 1}, {.dtype = kFloat64, .requires_grad = true});
  Tensor y = where(cond, a, b);
  EXPECT_EQ(y.shape(), (Shape{0, 3}));
  y.backward(zeros({0, 3}, {.dtype = kFloat64}));
  EXPECT_TRUE(all_close(a.grad(), zeros({3}, {.dtype = kFloat64}), 0));
  EXPECT_EQ(b.grad().shape(), (Shape{0, 1}));

  Tensor c = bvec({true, false, true}, {3});
  Tensor f = from_vector<float>({1.5f, 2.5f, 3.5f}, {3}, {.dtype = kFloat32, .requires_grad = true});
  Tensor yf = where(c, f, 0.25);
  EXPECT_EQ(yf.dtype(), kFloat32);
  EXPECT_EQ(yf.to_vector<float>(), (std::vector<float>{1.5f, 0.25f, 3.5f}));
  yf.backward(ones({3}));
  EXPECT_EQ(f.grad().to_vector<float>(), (std::vector<float>{1, 0, 1}));
}

TEST(Where, Errors) {
  Tensor a = dvec({1, 2, 3}, {3});
  Tensor c = bvec({true, false, true}, {3});
  EXPECT_ATTO_ERROR(where(dvec({1, 0, 1}, {3}), a, a), "where: condition must be a bool tensor, got float64");
  EXPECT_ATTO_ERROR(where(c, a, from_vector<float>({1, 2, 3}, {3})), "dtype mismatch: float64 [3] and float32 [3]");
  EXPECT_ATTO_ERROR(where(c, a, dvec({1, 2}, {2})), "condition [3], a [3] and b [2] cannot be broadcast together");
  EXPECT_ATTO_ERROR(where(bvec({true, false}, {2}), a, 1.0), "condition [2], a [3]");
  EXPECT_ATTO_ERROR(where(c, ivec({1, 2, 3}, {3}), kInf), "cannot put the value inf into a int64 tensor");
}

// ---------------------------------------------------------------------------------------------
// masked_fill

TEST(MaskedFill, ValuesAndNegativeInfinity) {
  Tensor x = dvec({1, 2, 3, 4, 5, 6}, {2, 3});
  Tensor mask = bvec({false, true, true}, {3});
  auto v = masked_fill(x, mask, -kInf).to_vector<double>();
  EXPECT_EQ(v, (std::vector<double>{1, -kInf, -kInf, 4, -kInf, -kInf}));
  Tensor col = bvec({true, false}, {2, 1});
  EXPECT_TRUE(all_close(masked_fill(x, col, 0.5), dvec({0.5, 0.5, 0.5, 4, 5, 6}, {2, 3}), 0));
  Tensor full_mask = bvec({true, false, false, false, false, true}, {2, 3});
  EXPECT_TRUE(all_close(masked_fill(x, full_mask, -1e9), dvec({-1e9, 2, 3, 4, 5, -1e9}, {2, 3}), 0));
  Tensor scalar_mask = bvec({true}, {1});
  EXPECT_TRUE(all_close(masked_fill(x, scalar_mask, 0), zeros({2, 3}, {.dtype = kFloat64}), 0));
  // Int64 targets, as in targets.masked_fill(pad, -100).
  EXPECT_EQ(masked_fill(ivec({3, 0, 7}, {3}), bvec({false, true, false}, {3}), -100).to_vector<int64_t>(),
            (std::vector<int64_t>{3, -100, 7}));
}

TEST(MaskedFill, GradientZeroAtFilledPositions) {
  Tensor x = dleaf({1, 2, 3, 4, 5, 6}, {2, 3});
  Tensor mask = bvec({false, true, false}, {1, 3});
  masked_fill(x, mask, -kInf).backward(dvec({1, 2, 3, 4, 5, 6}, {2, 3}));
  EXPECT_TRUE(all_close(x.grad(), dvec({1, 0, 3, 4, 0, 6}, {2, 3}), 0));
}

TEST(MaskedFill, NegativeInfinityThroughExpGivesZerosNotNaN) {
  // The attention pattern: scores.masked_fill(mask, -inf) then exp; masked entries give 0 value and 0 grad.
  Tensor x = dleaf({0.5, -1.0, 2.0, 0.25}, {2, 2});
  Tensor mask = bvec({false, true}, {2});
  Tensor y = exp(masked_fill(x, mask, -kInf));
  EXPECT_TRUE(all_close(y, dvec({std::exp(0.5), 0.0, std::exp(2.0), 0.0}, {2, 2}), 1e-15));
  y.backward(ones({2, 2}, {.dtype = kFloat64}));
  EXPECT_TRUE(all_close(x.grad(), dvec({std::exp(0.5), 0.0, std::exp(2.0), 0.0}, {2, 2}), 1e-15));
}

TEST(MaskedFill, Gradcheck) {
  Generator gen(13);
  Tensor x = rand_leaf({2, 3, 4}, gen);
  for (Shape ms : {Shape{2, 3, 4}, Shape{2, 1, 4}, Shape{4}, Shape{3, 1}, Shape{}}) {
    Tensor mask = bool_pattern(ms, gen);
    EXPECT_GRADCHECK([&] { return masked_fill(x, mask, -3.0); }, {x}) << shape_str(ms);
  }
  Tensor mask = bool_pattern({2, 3, 4}, gen);
  EXPECT_GRADCHECK([&] { return masked_fill(x, mask, 1.0) * x; }, {x});
}

TEST(MaskedFill, ZeroSizeFloat32AndRecording) {
  Tensor x = zeros({2, 0}, {.dtype = kFloat32, .requires_grad = true});
  Tensor y = masked_fill(x, zeros({0}, {.dtype = kBool}), 1.0);
  EXPECT_EQ(y.shape(), (Shape{2, 0}));
  y.backward(zeros({2, 0}));
  EXPECT_EQ(x.grad().shape(), (Shape{2, 0}));

  Tensor f = from_vector<float>({1, 2, 3}, {3}, {.dtype = kFloat32, .requires_grad = true});
  Tensor yf = masked_fill(f, bvec({true, false, false}, {3}), -1e9);
  EXPECT_EQ(yf.grad_fn_name(), "masked_fill");
  EXPECT_EQ(yf.to_vector<float>(), (std::vector<float>{-1e9f, 2, 3}));
  yf.backward(ones({3}));
  EXPECT_EQ(f.grad().to_vector<float>(), (std::vector<float>{0, 1, 1}));
}

TEST(MaskedFill, Errors) {
  Tensor x = dvec({1, 2, 3, 4, 5, 6}, {2, 3});
  EXPECT_ATTO_ERROR(masked_fill(x, bvec({true, false}, {2}), 0),
                    "masked_fill: mask of shape [2] cannot be broadcast to x of shape [2, 3]");
  EXPECT_ATTO_ERROR(masked_fill(x, zeros({1, 2, 3}, {.dtype = kBool}), 0), "mask of shape [1, 2, 3]");
  EXPECT_ATTO_ERROR(masked_fill(x, dvec({1, 0, 1}, {3}), 0), "masked_fill: mask must be a bool tensor, got float64");
  EXPECT_ATTO_ERROR(masked_fill(ivec({1}, {1}), bvec({true}, {1}), -kInf), "cannot fill a int64 tensor with -inf");
}

// ---------------------------------------------------------------------------------------------
// Comparisons and logic

TEST(Compare, ScalarValues) {
  Tensor x = dvec({-1.0, 0.5, 2.0, 0.5}, {2, 2});
  using B = std::vector<bool>;
  EXPECT_EQ(eq(x, 0.5).to_vector<bool>(), (B{false, true, false, true}));
  EXPECT_EQ(ne(x, 0.5).to_vector<bool>(), (B{true, false, true, false}));
  EXPECT_EQ(lt(x, 0.5).to_vector<bool>(), (B{true, false, false, false}));
  EXPECT_EQ(le(x, 0.5).to_vector<bool>(), (B{true, true, false, true}));
  EXPECT_EQ(gt(x, 0.5).to_vector<bool>(), (B{false, false, true, false}));
  EXPECT_EQ(ge(x, 0.5).to_vector<bool>(), (B{false, true, true, true}));
  Tensor m = eq(x, 0.5);
  EXPECT_EQ(m.dtype(), kBool);
  EXPECT_EQ(m.shape(), (Shape{2, 2}));
  // Token ids: the padding mask.
  EXPECT_EQ(eq(ivec({5, 0, 3, 0}, {4}), 0).to_vector<bool>(), (B{false, true, false, true}));
  EXPECT_EQ(gt(ivec({5, 0, 3}, {3}), 2.5).to_vector<bool>(), (B{true, false, true}));
  // float32 compares against the scalar rounded to float32, as PyTorch (tensor([0.1]) == 0.1 is True).
  EXPECT_EQ(eq(from_vector<float>({0.1f, 0.2f}, {2}), 0.1).to_vector<bool>(), (B{true, false}));
  EXPECT_EQ(eq(bvec({true, false}, {2}), 1.0).to_vector<bool>(), (B{true, false}));
  EXPECT_EQ(ne(dvec({std::nan("")}, {1}), 0.0).to_vector<bool>(), (B{true}));
  EXPECT_EQ(eq(dvec({std::nan("")}, {1}), std::nan("")).to_vector<bool>(), (B{false}));
}

TEST(Compare, TensorValuesWithBroadcasting) {
  Tensor a = dvec({1, 2, 3}, {3, 1});
  Tensor b = dvec({2, 3}, {2});
  using B = std::vector<bool>;
  EXPECT_EQ(eq(a, b).shape(), (Shape{3, 2}));
  EXPECT_EQ(eq(a, b).to_vector<bool>(), (B{false, false, true, false, false, true}));
  EXPECT_EQ(ne(a, b).to_vector<bool>(), (B{true, true, false, true, true, false}));
  EXPECT_EQ(lt(a, b).to_vector<bool>(), (B{true, true, false, true, false, false}));
  EXPECT_EQ(le(a, b).to_vector<bool>(), (B{true, true, true, true, false, true}));
  EXPECT_EQ(gt(a, b).to_vector<bool>(), (B{false, false, false, false, true, false}));
  EXPECT_EQ(ge(a, b).to_vector<bool>(), (B{false, false, true, false, true, true}));
  EXPECT_EQ(lt(ivec({1, 5}, {2}), ivec({3, 3}, {2})).to_vector<bool>(), (B{true, false}));
  EXPECT_EQ(eq(dvec({1, 2}, {2}), dvec({1, 3}, {2})).to_vector<bool>(), (B{true, false}));
  EXPECT_EQ(eq(zeros({0, 2}), zeros({2})).shape(), (Shape{0, 2}));
}

TEST(Compare, NotRecorded) {
  Tensor x = dleaf({1, 2}, {2});
  EXPECT_FALSE(gt(x, 1.5).requires_grad());
  EXPECT_FALSE(eq(x, x).requires_grad());
  EXPECT_TRUE(gt(x, 1.5).is_leaf());
}

TEST(Compare, Errors) {
  EXPECT_ATTO_ERROR(eq(dvec({1}, {1}), from_vector<float>({1}, {1})), "eq: dtype mismatch: float64 [1] and float32 [1]");
  EXPECT_ATTO_ERROR(lt(dvec({1, 2}, {2}), dvec({1, 2, 3}, {3})), "lt: shapes [2] and [3] cannot be broadcast together");
}

TEST(Logic, Values) {
  using B = std::vector<bool>;
  Tensor a = bvec({true, false}, {2, 1});
  Tensor b = bvec({true, false, true}, {3});
  EXPECT_EQ(logical_not(b).to_vector<bool>(), (B{false, true, false}));
  EXPECT_EQ(logical_and(a, b).shape(), (Shape{2, 3}));
  EXPECT_EQ(logical_and(a, b).to_vector<bool>(), (B{true, false, true, false, false, false}));
  EXPECT_EQ(logical_or(a, b).to_vector<bool>(), (B{true, true, true, true, false, true}));
  EXPECT_EQ(logical_or(a, a).to_vector<bool>(), (B{true, false}));
  EXPECT_EQ(logical_not(zeros({0}, {.dtype = kBool})).shape(), (Shape{0}));
  // Causal-and-padding mask composition.
  Tensor pad = eq(ivec({4, 0}, {2}), 0);
  Tensor causal = bvec({false, true, false, false}, {2, 2});
  EXPECT_EQ(logical_or(causal, pad).to_vector<bool>(), (B{false, true, false, true}));
}

TEST(Logic, Errors) {
  Tensor b = bvec({true}, {1});
  EXPECT_ATTO_ERROR(logical_not(dvec({1}, {1})), "logical_not: input must be a bool tensor, got float64");
  EXPECT_ATTO_ERROR(logical_and(b, ivec({1}, {1})), "logical_and: b must be a bool tensor, got int64");
  EXPECT_ATTO_ERROR(logical_or(dvec({1}, {1}), b), "logical_or: a must be a bool tensor");
  EXPECT_ATTO_ERROR(logical_and(bvec({true, false, true}, {3}), bvec({true, false, true, false}, {2, 2})),
                    "logical_and: shapes [3] and [2, 2] cannot be broadcast together");
}

// ---------------------------------------------------------------------------------------------
// embedding

TEST(Embedding, ValuesAndShape) {
  Tensor w = dvec({0, 1, 10, 11, 20, 21, 30, 31}, {4, 2});
  Tensor idx = ivec({3, 0, 1, 3, 2, 2}, {2, 3});
  Tensor y = embedding(w, idx);
  EXPECT_EQ(y.shape(), (Shape{2, 3, 2}));
  EXPECT_TRUE(all_close(y, dvec({30, 31, 0, 1, 10, 11, 30, 31, 20, 21, 20, 21}, {2, 3, 2}), 0));
  Tensor y0 = embedding(w, ivec({2}, Shape{1}));
  EXPECT_EQ(y0.shape(), (Shape{1, 2}));
  Tensor s = zeros({}, {.dtype = kInt64});
  s.set({}, 1);
  EXPECT_TRUE(all_close(embedding(w, s), dvec({10, 11}, {2}), 0));
}

TEST(Embedding, BackwardScatterAddsAndSkipsPadding) {
  Tensor w = dleaf({0, 1, 10, 11, 20, 21, 30, 31}, {4, 2});
  Tensor idx = ivec({3, 0, 3, 1, 0, 3}, {2, 3});
  Tensor g = dvec({1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}, {2, 3, 2});
  embedding(w, idx).backward(g);
  // row 0: positions 1, 4 -> (3+9, 4+10); row 1: position 3 -> (7, 8); row 2: none; row 3: 0, 2, 5.
  EXPECT_TRUE(all_close(w.grad(), dvec({12, 14, 7, 8, 0, 0, 1 + 5 + 11, 2 + 6 + 12}, {4, 2}), 0));

  Tensor wp = dleaf({0, 1, 10, 11, 20, 21, 30, 31}, {4, 2});
  Tensor yp = embedding(wp, idx, /*padding_idx=*/3);
  EXPECT_TRUE(all_close(yp, embedding(w.detach(), idx), 0));  // the padding row is still looked up
  yp.backward(g);
  EXPECT_TRUE(all_close(wp.grad(), dvec({12, 14, 7, 8, 0, 0, 0, 0}, {4, 2}), 0));

  Tensor wn = dleaf({0, 1, 10, 11}, {2, 2});
  embedding(wn, ivec({1, 1}, {2}), -5).backward(dvec({1, 2, 3, 4}, {2, 2}));  // negative: no padding
  EXPECT_TRUE(all_close(wn.grad(), dvec({0, 0, 4, 6}, {2, 2}), 0));
}

TEST(Embedding, Gradcheck) {
  Generator gen(14);
  Tensor w = rand_leaf({5, 3}, gen);
  Tensor idx = ivec({4, 0, 4, 2, 2, 4, 1, 0}, {2, 4});
  EXPECT_GRADCHECK([&] { return embedding(w, idx); }, {w});
  // padding_idx deliberately withholds a true gradient, so only an absent padding row can be checked.
  EXPECT_GRADCHECK([&] { return embedding(w, idx, 3); }, {w});
  EXPECT_GRADCHECK([&] { return embedding(w, idx) * embedding(w, ivec({1, 2, 3, 4, 0, 1, 2, 3}, {2, 4})); }, {w});
  Tensor col = rand_leaf({3}, gen);
  EXPECT_GRADCHECK([&] { return embedding(w, idx) * col; }, {w, col});
}

TEST(Embedding, ZeroSizeAndFloat32) {
  Tensor w = from_vector<float>({1, 2, 3, 4, 5, 6}, {3, 2}, {.dtype = kFloat32, .requires_grad = true});
  Tensor y = embedding(w, zeros({0}, {.dtype = kInt64}));
  EXPECT_EQ(y.shape(), (Shape{0, 2}));
  EXPECT_EQ(y.dtype(), kFloat32);
  y.backward(zeros({0, 2}));
  EXPECT_EQ(w.grad().to_vector<float>(), (std::vector<float>(6, 0.0f)));

  w.zero_grad(true);
  Tensor yf = embedding(w, ivec({2, 2, 0}, {3}), 0);
  EXPECT_EQ(yf.to_vector<float>(), (std::vector<float>{5, 6, 5, 6, 1, 2}));
  yf.backward(ones({3, 2}));
  EXPECT_EQ(w.grad().to_vector<float>(), (std::vector<float>{0, 0, 0, 0, 2, 2}));

  Tensor empty_dim = zeros({3, 0}, {.dtype = kFloat64, .requires_grad = true});
  EXPECT_EQ(embedding(empty_dim, ivec({1, 2}, {2})).shape(), (Shape{2, 0}));
}

TEST(Embedding, Errors) {
  Tensor w = dvec({0, 1, 10, 11, 20, 21}, {3, 2});
  EXPECT_ATTO_ERROR(embedding(w, ivec({0, 1, 2, 7}, {2, 2})),
                    "embedding: index 7 at position [1, 1] of indices [2, 2] is out of range for num_embeddings 3");
  EXPECT_ATTO_ERROR(embedding(w, ivec({-1}, {1})), "index -1 at position [0]");
  EXPECT_ATTO_ERROR(embedding(w, ivec({3}, {1})), "index 3 at position [0] of indices [1] is out of range");
  EXPECT_ATTO_ERROR(embedding(w, dvec({0, 1}, {2})), "embedding: indices must be int64, got float64");
  EXPECT_ATTO_ERROR(embedding(w, from_vector<float>({0, 1}, {2})), "got float32");
  EXPECT_ATTO_ERROR(embedding(dvec({1, 2, 3}, {3}), ivec({0}, {1})), "weight must be 2-D");
  EXPECT_ATTO_ERROR(embedding(w, ivec({0}, {1}), 3), "padding_idx 3 is out of range for num_embeddings 3");
  EXPECT_ATTO_ERROR(embedding(ivec({0, 1}, {1, 2}), ivec({0}, {1})), "embedding: expected a float32 or float64");
}
