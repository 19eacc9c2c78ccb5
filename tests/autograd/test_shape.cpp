#include "autograd/reduce.h"
#include "autograd/shape.h"
#include "testing.h"

using namespace attograd;
using namespace attograd::testing;

namespace {

Tensor dvals(const std::vector<double>& v, const Shape& s, bool grad = false) {
  return from_vector<double>(v, s, {.dtype = kFloat64, .requires_grad = grad});
}

Tensor iota(const Shape& s, Dtype dt = kFloat64) {
  Tensor t = arange(shape_numel(s), {.dtype = dt});
  NoGradGuard ng;
  return reshape(t, s).detach();
}

// Reference permute via at(): out[idx] = x[idx mapped through perm], for 3-d tensors.
void expect_permuted3(const Tensor& out, const Tensor& x, const std::vector<int64_t>& perm) {
  ASSERT_EQ(out.dim(), 3);
  for (int64_t i = 0; i < out.size(0); ++i)
    for (int64_t j = 0; j < out.size(1); ++j)
      for (int64_t k = 0; k < out.size(2); ++k) {
        int64_t src[3];
        const int64_t o[3] = {i, j, k};
        for (int d = 0; d < 3; ++d) src[perm[d]] = o[d];
        ASSERT_EQ(out.at({i, j, k}), x.at({src[0], src[1], src[2]})) << i << "," << j << "," << k;
      }
}

// ---------------------------------------------------------------------------------------------
// reshape / view / flatten / unsqueeze / squeeze

TEST(Reshape, ValuesAndInference) {
  Tensor x = iota({2, 3});
  Tensor y = reshape(x, {3, -1});
  EXPECT_EQ(y.shape(), (Shape{3, 2}));
  EXPECT_EQ(y.at({1, 0}), 2.0);
  EXPECT_EQ(y.at({2, 1}), 5.0);
  EXPECT_EQ(reshape(x, {-1}).shape(), (Shape{6}));
  EXPECT_EQ(view(x, {1, 6, 1}).shape(), (Shape{1, 6, 1}));
  EXPECT_EQ(reshape(scalar_tensor(3.0), {1, 1}).shape(), (Shape{1, 1}));
  EXPECT_EQ(reshape(ones({1, 1}), {}).shape(), (Shape{}));
  EXPECT_EQ(reshape(zeros({0, 3}), {-1, 3}).shape(), (Shape{0, 3}));
  EXPECT_EQ(reshape(zeros({0, 3}), {3, 0, 5}).shape(), (Shape{3, 0, 5}));
  EXPECT_EQ(reshape(iota({2, 3}, kInt64), {6}).at({4}), 4.0);
}

TEST(Reshape, SharesStorage) {
  Tensor x = iota({2, 3});
  Tensor y = reshape(x, {3, 2});
  y.set({0, 1}, 42.0);  // flat element 1
  EXPECT_EQ(x.at({0, 1}), 42.0);
  x.set({1, 2}, -7.0);  // flat element 5
  EXPECT_EQ(y.at({2, 1}), -7.0);
  EXPECT_EQ(x.raw_data(), y.raw_data());
  Tensor z = unsqueeze(squeeze(flatten(view(x, {1, 2, 3})), 0), 1);
  EXPECT_EQ(z.raw_data(), x.raw_data());
}

TEST(Reshape, BackwardHasInputShape) {
  Tensor x = dvals({1, 2, 3, 4, 5, 6}, {2, 3}, true);
  Tensor w = dvals({10, 20, 30, 40, 50, 60}, {3, 2});
  Tensor y = reshape(x, {3, -1});
  EXPECT_EQ(y.grad_fn_name(), "reshape");
  sum(y * w).backward();
  ASSERT_TRUE(x.grad().defined());
  EXPECT_EQ(x.grad().shape(), (Shape{2, 3}));
  EXPECT_TRUE(all_close(x.grad(), dvals({10, 20, 30, 40, 50, 60}, {2, 3}), 0));
}

TEST(Reshape, Gradcheck) {
  Generator gen(1);
  Tensor x = rand_leaf({2, 3, 4}, gen);
  Tensor z = rand_leaf({2, 0, 3}, gen);
  Tensor w = rand_leaf({4, 6}, gen);
  EXPECT_GRADCHECK([&] { return reshape(x, {4, -1}) * w; }, {x, w});
  EXPECT_GRADCHECK([&] { return view(x, {-1}); }, {x});
  EXPECT_GRADCHECK([&] { return reshape(transpose(x, 0, 2), {6, 4}); }, {x});
  EXPECT_GRADCHECK([&] { return reshape(x, {24}) * reshape(x, {24}); }, {x});  // x used twice
  EXPECT_GRADCHECK([&] { return reshape(z, {3, -1}); }, {z});                  // zero-size
  EXPECT_GRADCHECK([&] { return flatten(x, 1); }, {x});
  EXPECT_GRADCHECK([&] { return flatten(x, 0, -2); }, {x});
  EXPECT_GRADCHECK([&] { return unsqueeze(x, -1) * 2.0; }, {x});
  EXPECT_GRADCHECK([&] { return squeeze(unsqueeze(x, 1), 1); }, {x});
  EXPECT_GRADCHECK([&] { return squeeze(unsqueeze(x, 0)); }, {x});
}

TEST(Reshape, FlattenUnsqueezeSqueezeShapes) {
  Tensor x = zeros({2, 3, 4, 5});
  EXPECT_EQ(flatten(x).shape(), (Shape{120}));
  EXPECT_EQ(flatten(x, 1).shape(), (Shape{2, 60}));
  EXPECT_EQ(flatten(x, 1, 2).shape(), (Shape{2, 12, 5}));
  EXPECT_EQ(flatten(x, -2, -1).shape(), (Shape{2, 3, 20}));
  EXPECT_EQ(flatten(x, 2, 2).shape(), (Shape{2, 3, 4, 5}));
  EXPECT_EQ(flatten(scalar_tensor(1.0)).shape(), (Shape{1}));
  EXPECT_EQ(unsqueeze(x, 0).shape(), (Shape{1, 2, 3, 4, 5}));
  EXPECT_EQ(unsqueeze(x, 4).shape(), (Shape{2, 3, 4, 5, 1}));
  EXPECT_EQ(unsqueeze(x, -1).shape(), (Shape{2, 3, 4, 5, 1}));
  EXPECT_EQ(unsqueeze(x, -5).shape(), (Shape{1, 2, 3, 4, 5}));
  EXPECT_EQ(unsqueeze(scalar_tensor(1.0), 0).shape(), (Shape{1}));
  Tensor y = zeros({1, 3, 1});
  EXPECT_EQ(squeeze(y, 0).shape(), (Shape{3, 1}));
  EXPECT_EQ(squeeze(y, -1).shape(), (Shape{1, 3}));
  EXPECT_EQ(squeeze(y, 1).shape(), (Shape{1, 3, 1}));  // not size 1: no-op
  EXPECT_EQ(squeeze(y).shape(), (Shape{3}));
  EXPECT_EQ(squeeze(scalar_tensor(1.0), 0).shape(), (Shape{}));
}

TEST(Reshape, Errors) {
  Tensor x = zeros({2, 3});
  EXPECT_ATTO_ERROR(reshape(x, {4, 2}),
                    "reshape: shape [4, 2] (8 elements) is invalid for input of shape [2, 3] (6 elements)");
  EXPECT_ATTO_ERROR(reshape(x, {4, -1}), "shape [4, -1] is invalid for input of shape [2, 3] (6 elements)");
  EXPECT_ATTO_ERROR(reshape(x, {-1, -1}), "only one dimension can be -1, got shape [-1, -1] for input of shape [2, 3]");
  EXPECT_ATTO_ERROR(reshape(x, {-2, -3}), "invalid size -2 in shape [-2, -3] for input of shape [2, 3]");
  EXPECT_ATTO_ERROR(reshape(zeros({0, 3}), {0, -1}), "the size of the -1 dimension is ambiguous");
  EXPECT_ATTO_ERROR(view(x, {5}), "view: shape [5] (5 elements) is invalid for input of shape [2, 3]");
  EXPECT_ATTO_ERROR(flatten(x, 1, 0), "flatten: start_dim 1 comes after end_dim 0 for shape [2, 3]");
  EXPECT_ATTO_ERROR(flatten(x, 2),
                    "flatten: dimension 2 out of range for a tensor of shape [2, 3] (expected in [-2, 1])");
  EXPECT_ATTO_ERROR(unsqueeze(x, 3),
                    "unsqueeze: dimension 3 out of range for a tensor of shape [2, 3] (expected in [-3, 2])");
  EXPECT_ATTO_ERROR(unsqueeze(x, -4), "dimension -4 out of range");
  EXPECT_ATTO_ERROR(squeeze(x, 2), "squeeze: dimension 2 out of range for a tensor of shape [2, 3]");
  EXPECT_ATTO_ERROR(reshape(Tensor(), {1}), "reshape: called with an undefined tensor");
  EXPECT_ATTO_ERROR(flatten(scalar_tensor(1.0), 1),
                    "flatten: dimension 1 out of range for a tensor of shape [] (expected in [-1, 0])");
  EXPECT_ATTO_ERROR(squeeze(scalar_tensor(1.0), -2), "squeeze: dimension -2 out of range for a tensor of shape []");
  EXPECT_ATTO_ERROR(unsqueeze(scalar_tensor(1.0), 1),
                    "unsqueeze: dimension 1 out of range for a tensor of shape [] (expected in [-1, 0])");
}

// ---------------------------------------------------------------------------------------------
// transpose / permute

TEST(Transpose, Values) {
  Tensor x = dvals({1, 2, 3, 4, 5, 6}, {2, 3});
  Tensor t = transpose(x, 0, 1);
  EXPECT_TRUE(all_close(t, dvals({1, 4, 2, 5, 3, 6}, {3, 2}), 0));
  EXPECT_TRUE(all_close(transpose(x, -1, -2), t, 0));
  EXPECT_TRUE(all_close(transpose(x, 1, 1), x, 0));
  EXPECT_NE(t.raw_data(), x.raw_data());  // a copy
  EXPECT_EQ(transpose(scalar_tensor(2.0), 0, -1).item(), 2.0);
}

TEST(Transpose, BlockedLastTwoDimsMatchesReference) {
  for (Dtype dt : {kFloat32, kFloat64, kInt64}) {
    Tensor x = iota({3, 67, 45}, dt);
    Tensor t = transpose(x, -1, -2);
    EXPECT_EQ(t.shape(), (Shape{3, 45, 67}));
    expect_permuted3(t, x, {0, 2, 1});
  }
  Tensor b = empty({2, 40, 33}, {.dtype = kBool});
  for (int64_t i = 0; i < b.numel(); ++i) b.data<bool>()[i] = (i * 7) % 3 == 0;
  expect_permuted3(transpose(b, 1, 2), b, {0, 2, 1});
  // A 2-D transpose where the first dim moves last: (A, B, C) -> (B, C, A) is one (A, B*C) transpose.
  Tensor y = iota({5, 6, 7});
  expect_permuted3(permute(y, {1, 2, 0}), y, {1, 2, 0});
}

TEST(Permute, AllKernelPaths) {
  Tensor x = iota({4, 5, 6});
  for (const std::vector<int64_t>& p : std::vector<std::vector<int64_t>>{
           {0, 1, 2}, {0, 2, 1}, {1, 0, 2}, {1, 2, 0}, {2, 0, 1}, {2, 1, 0}, {-1, 0, 1}}) {
    Tensor out = permute(x, p);
    std::vector<int64_t> wrapped(p);
    for (auto& d : wrapped) d = d < 0 ? d + 3 : d;
    expect_permuted3(out, x, wrapped);
  }
  // (B, L, H, D) -> (B, H, L, D): contiguous runs of D.
  Tensor a = iota({2, 3, 4, 5});
  Tensor b = permute(a, {0, 2, 1, 3});
  EXPECT_EQ(b.shape(), (Shape{2, 4, 3, 5}));
  for (int64_t i = 0; i < 2; ++i)
    for (int64_t h = 0; h < 4; ++h)
      for (int64_t l = 0; l < 3; ++l)
        for (int64_t d = 0; d < 5; ++d) ASSERT_EQ(b.at({i, h, l, d}), a.at({i, l, h, d}));
  // Size-1 dims anywhere.
  Tensor c = iota({1, 3, 1, 2});
  Tensor e = permute(c, {3, 2, 1, 0});
  EXPECT_EQ(e.shape(), (Shape{2, 1, 3, 1}));
  EXPECT_TRUE(all_close(reshape(e, {6}), dvals({0, 2, 4, 1, 3, 5}, {6}), 0));
  EXPECT_EQ(permute(zeros({2, 0, 3}), {2, 1, 0}).shape(), (Shape{3, 0, 2}));
}

TEST(Permute, Gradcheck) {
  Generator gen(2);
  Tensor x = rand_leaf({2, 3, 4}, gen);
  Tensor m = rand_leaf({3, 5}, gen);
  Tensor z = rand_leaf({2, 0, 3}, gen);
  EXPECT_GRADCHECK([&] { return transpose(m, 0, 1); }, {m});
  EXPECT_GRADCHECK([&] { return transpose(x, -1, -2); }, {x});
  EXPECT_GRADCHECK([&] { return transpose(x, 0, 2); }, {x});
  EXPECT_GRADCHECK([&] { return permute(x, {2, 0, 1}); }, {x});
  EXPECT_GRADCHECK([&] { return permute(x, {-1, -3, -2}); }, {x});
  EXPECT_GRADCHECK([&] { return permute(transpose(x, 0, 1), {1, 2, 0}); }, {x});
  EXPECT_GRADCHECK([&] { return transpose(m, 0, 1) * transpose(m, 1, 0); }, {m});  // used twice
  EXPECT_GRADCHECK([&] { return permute(z, {2, 1, 0}); }, {z});
  // diamond: x -> (transpose, reshape) -> product
  EXPECT_GRADCHECK([&] { return transpose(m, 0, 1) * reshape(m, {5, 3}); }, {m});
}

TEST(Permute, Float32Backward) {
  Tensor x = from_vector<float>({1, 2, 3, 4, 5, 6}, {2, 3}, {.requires_grad = true});
  Tensor w = from_vector<float>({1, 10, 100, 1000, 1e4f, 1e5f}, {3, 2});
  sum(transpose(x, 0, 1) * w).backward();
  EXPECT_EQ(x.grad().dtype(), kFloat32);
  EXPECT_TRUE(all_close(x.grad(), from_vector<float>({1, 100, 1e4f, 10, 1000, 1e5f}, {2, 3}), 0));
}

TEST(Permute, Errors) {
  Tensor x = zeros({2, 3, 4});
  EXPECT_ATTO_ERROR(permute(x, {0, 1}),
                    "permute: dims [0, 1] has 2 entries but the input of shape [2, 3, 4] has 3 dimensions");
  EXPECT_ATTO_ERROR(permute(x, {0, 1, 1}),
                    "dims [0, 1, 1] is not a permutation: dimension 1 appears more than once (input shape [2, 3, 4])");
  EXPECT_ATTO_ERROR(permute(x, {0, 2, -1}), "dimension 2 appears more than once");
  EXPECT_ATTO_ERROR(permute(x, {0, 1, 3}), "permute: dimension 3 out of range for a tensor of shape [2, 3, 4]");
  EXPECT_ATTO_ERROR(transpose(x, 0, 3),
                    "transpose: dimension 3 out of range for a tensor of shape [2, 3, 4] (expected in [-3, 2])");
  EXPECT_ATTO_ERROR(transpose(x, -4, 0), "transpose: dimension -4 out of range");
  EXPECT_ATTO_ERROR(transpose(scalar_tensor(1.0), 0, 1),
                    "transpose: dimension 1 out of range for a tensor of shape []");
  EXPECT_ATTO_ERROR(permute(Tensor(), {}), "permute: called with an undefined tensor");
}

// ---------------------------------------------------------------------------------------------
// slice / narrow / select

TEST(Slice, ClampingValues) {
  Tensor x = iota({5});
  EXPECT_TRUE(all_close(slice(x, 0, 1, 3), dvals({1, 2}, {2}), 0));
  EXPECT_TRUE(all_close(slice(x, 0, -2, 100), dvals({3, 4}, {2}), 0));
  EXPECT_TRUE(all_close(slice(x, 0, -100, 2), dvals({0, 1}, {2}), 0));
  EXPECT_TRUE(all_close(slice(x, 0, 0, -1), dvals({0, 1, 2, 3}, {4}), 0));
  EXPECT_TRUE(all_close(slice(x, 0, 0, 5, 2), dvals({0, 2, 4}, {3}), 0));
  EXPECT_TRUE(all_close(slice(x, -1, 1, 5, 3), dvals({1, 4}, {2}), 0));
  EXPECT_EQ(slice(x, 0, 3, 1).shape(), (Shape{0}));
  EXPECT_EQ(slice(x, 0, 7, 9).shape(), (Shape{0}));
  Tensor m = iota({3, 4});
  EXPECT_TRUE(all_close(slice(m, 1, 1, 4, 2), dvals({1, 3, 5, 7, 9, 11}, {3, 2}), 0));
  EXPECT_TRUE(all_close(slice(m, 0, 1, 2), dvals({4, 5, 6, 7}, {1, 4}), 0));
}

TEST(Slice, NarrowSelectValues) {
  Tensor m = iota({3, 4});
  EXPECT_TRUE(all_close(narrow(m, 1, 1, 2), dvals({1, 2, 5, 6, 9, 10}, {3, 2}), 0));
  EXPECT_TRUE(all_close(narrow(m, 0, -1, 1), dvals({8, 9, 10, 11}, {1, 4}), 0));
  EXPECT_EQ(narrow(m, 0, 3, 0).shape(), (Shape{0, 4}));
  EXPECT_TRUE(all_close(select(m, 1, -1), dvals({3, 7, 11}, {3}), 0));
  EXPECT_TRUE(all_close(select(m, 0, 1), dvals({4, 5, 6, 7}, {4}), 0));
  EXPECT_EQ(select(iota({4}), 0, 2).shape(), (Shape{}));
  EXPECT_EQ(select(iota({4}), 0, 2).item(), 2.0);
  EXPECT_EQ(select(iota({2, 3}, kInt64), 1, 2).to_vector<int64_t>(), (std::vector<int64_t>{2, 5}));
}

TEST(Slice, Gradcheck) {
  Generator gen(3);
  Tensor x = rand_leaf({3, 7}, gen);
  Tensor y = rand_leaf({2, 5, 3}, gen);
  EXPECT_GRADCHECK([&] { return slice(x, 1, 1, 6, 2); }, {x});
  EXPECT_GRADCHECK([&] { return slice(x, -1, -3, 100); }, {x});
  EXPECT_GRADCHECK([&] { return slice(y, 1, 1, 4); }, {y});
  EXPECT_GRADCHECK([&] { return slice(y, 0, 1, 2); }, {y});
  EXPECT_GRADCHECK([&] { return slice(x, 1, 4, 2); }, {x});  // empty result
  EXPECT_GRADCHECK([&] { return slice(transpose(y, 0, 2), 1, 0, 5, 3); }, {y});
  EXPECT_GRADCHECK([&] { return slice(x, 1, 0, 3) * slice(x, 1, 2, 5); }, {x});  // overlapping reuse
  EXPECT_GRADCHECK([&] { return narrow(y, -1, 1, 2); }, {y});
  EXPECT_GRADCHECK([&] { return select(y, 1, -2); }, {y});
  EXPECT_GRADCHECK([&] { return select(y, 2, 0) + select(y, 2, 2); }, {y});
  Tensor z = rand_leaf({0, 4}, gen);
  EXPECT_GRADCHECK([&] { return slice(z, 1, 1, 3); }, {z});
}

TEST(Slice, Float32Backward) {
  Tensor x = from_vector<float>({1, 2, 3, 4, 5}, {5}, {.requires_grad = true});
  sum(slice(x, 0, 0, 5, 2) * 3.0).backward();
  EXPECT_TRUE(all_close(x.grad(), from_vector<float>({3, 0, 3, 0, 3}, {5}), 0));
}

TEST(Slice, Errors) {
  Tensor m = zeros({3, 4});
  EXPECT_ATTO_ERROR(slice(m, 1, 0, 2, 0), "slice: step must be positive, got 0 (input shape [3, 4])");
  EXPECT_ATTO_ERROR(slice(m, 1, 0, 2, -1), "step must be positive, got -1");
  EXPECT_ATTO_ERROR(slice(m, 2, 0, 1), "slice: dimension 2 out of range for a tensor of shape [3, 4]");
  EXPECT_ATTO_ERROR(slice(scalar_tensor(1.0), 0, 0, 1), "slice: cannot slice a 0-d tensor");
  EXPECT_ATTO_ERROR(narrow(m, 1, 3, 2), "narrow: start (3) + length (2) exceeds dimension 1 of size 4 (shape [3, 4])");
  EXPECT_ATTO_ERROR(narrow(m, 1, 5, 0), "narrow: start 5 out of range for dimension 1 of size 4");
  EXPECT_ATTO_ERROR(narrow(m, 0, -4, 1), "start -4 out of range for dimension 0 of size 3");
  EXPECT_ATTO_ERROR(narrow(m, 0, 0, -1), "length (-1) exceeds");
  EXPECT_ATTO_ERROR(select(m, 1, 4), "select: index 4 out of range for dimension 1 of size 4 (shape [3, 4])");
  EXPECT_ATTO_ERROR(select(m, 0, -4), "index -4 out of range for dimension 0 of size 3");
  EXPECT_ATTO_ERROR(select(m, -3, 0), "select: dimension -3 out of range");
  EXPECT_ATTO_ERROR(narrow(scalar_tensor(1.0), 0, 0, 1), "narrow: cannot narrow a 0-d tensor");
  EXPECT_ATTO_ERROR(select(scalar_tensor(1.0), 0, 0), "select: cannot select from a 0-d tensor");
}

TEST(Slice, BoolAndInt64) {
  Tensor b = empty({2, 5}, {.dtype = kBool});
  for (int64_t i = 0; i < 10; ++i) b.data<bool>()[i] = i % 3 == 0;
  Tensor s = slice(b, 1, 1, 5, 2);
  EXPECT_EQ(s.dtype(), kBool);
  EXPECT_EQ(s.to_vector<bool>(), (std::vector<bool>{false, true, true, false}));  // elements 1, 3, 6, 8
  Tensor c = cat({b, s}, 1);
  EXPECT_EQ(c.shape(), (Shape{2, 7}));
  EXPECT_EQ(c.at({1, 6}), 0.0);
  EXPECT_EQ(c.at({1, 0}), 0.0);
  EXPECT_EQ(c.at({1, 1}), 1.0);
  Tensor i = iota({3, 4}, kInt64);
  EXPECT_EQ(permute(i, {1, 0}).to_vector<int64_t>(), (std::vector<int64_t>{0, 4, 8, 1, 5, 9, 2, 6, 10, 3, 7, 11}));
  EXPECT_EQ(stack({select(i, 0, 0), select(i, 0, 2)}, 1).to_vector<int64_t>(),
            (std::vector<int64_t>{0, 8, 1, 9, 2, 10, 3, 11}));
}

// ---------------------------------------------------------------------------------------------
// cat / stack

TEST(Cat, Values) {
  Tensor a = dvals({1, 2, 3, 4}, {2, 2});
  Tensor b = dvals({5, 6}, {2, 1});
  EXPECT_TRUE(all_close(cat({a, b}, 1), dvals({1, 2, 5, 3, 4, 6}, {2, 3}), 0));
  EXPECT_TRUE(all_close(cat({a, b}, -1), dvals({1, 2, 5, 3, 4, 6}, {2, 3}), 0));
  EXPECT_TRUE(all_close(cat({a, a}), dvals({1, 2, 3, 4, 1, 2, 3, 4}, {4, 2}), 0));
  EXPECT_TRUE(all_close(cat({a, zeros({2, 0}, {.dtype = kFloat64}), b}, 1), dvals({1, 2, 5, 3, 4, 6}, {2, 3}), 0));
  EXPECT_EQ(cat({zeros({0, 2}), zeros({0, 2})}).shape(), (Shape{0, 2}));
  EXPECT_TRUE(all_close(cat({a}), a, 0));
  Tensor i = cat({iota({2}, kInt64), iota({3}, kInt64)});
  EXPECT_EQ(i.dtype(), kInt64);
  EXPECT_EQ(i.to_vector<int64_t>(), (std::vector<int64_t>{0, 1, 0, 1, 2}));
}

TEST(Stack, Values) {
  Tensor a = dvals({1, 2, 3}, {3});
  Tensor b = dvals({4, 5, 6}, {3});
  EXPECT_TRUE(all_close(stack({a, b}), dvals({1, 2, 3, 4, 5, 6}, {2, 3}), 0));
  EXPECT_TRUE(all_close(stack({a, b}, 1), dvals({1, 4, 2, 5, 3, 6}, {3, 2}), 0));
  EXPECT_TRUE(all_close(stack({a, b}, -1), dvals({1, 4, 2, 5, 3, 6}, {3, 2}), 0));
  EXPECT_EQ(stack({scalar_tensor(1.0), scalar_tensor(2.0)}).shape(), (Shape{2}));
  EXPECT_EQ(stack({zeros({2, 0}), zeros({2, 0}), zeros({2, 0})}, 1).shape(), (Shape{2, 3, 0}));
}

TEST(Cat, Gradcheck) {
  Generator gen(4);
  Tensor x = rand_leaf({2, 3}, gen);
  Tensor y = rand_leaf({4, 3}, gen);
  Tensor z = rand_leaf({2, 0}, gen);
  Tensor u = rand_leaf({2, 2}, gen);
  Tensor t = rand_leaf({3, 2}, gen);
  EXPECT_GRADCHECK([&] { return cat({x, y}, 0); }, {x, y});
  EXPECT_GRADCHECK([&] { return cat({x, z, u}, -1); }, {x, z, u});
  EXPECT_GRADCHECK([&] { return cat({x, x}, 1); }, {x});  // x used twice
  EXPECT_GRADCHECK([&] { return cat({x, transpose(t, 0, 1), x * 2.0}); }, {x, t});
  EXPECT_GRADCHECK([&] { return cat({x, y}, 0) * cat({y, x}, 0); }, {x, y});
  EXPECT_GRADCHECK([&] { return stack({x, x * x}, 0); }, {x});
  EXPECT_GRADCHECK([&] { return stack({x, transpose(t, 0, 1)}, 1); }, {x, t});
  EXPECT_GRADCHECK([&] { return stack({x, x, x}, -1); }, {x});
  EXPECT_GRADCHECK([&] { return stack({z, z}, 1); }, {z});
  // diamond: x -> two slices -> cat
  EXPECT_GRADCHECK([&] { return cat({slice(y, 0, 2, 4), slice(y, 0, 0, 3)}) * 3.0; }, {y});
}

TEST(Cat, GradientOnlyToInputsThatNeedIt) {
  Tensor a = from_vector<float>({1, 2}, {2}, {.requires_grad = true});
  Tensor b = from_vector<float>({3}, {1});
  Tensor w = from_vector<float>({10, 20, 30}, {3});
  sum(cat({a, b}) * w).backward();
  EXPECT_TRUE(all_close(a.grad(), from_vector<float>({10, 20}, {2}), 0));
  EXPECT_FALSE(b.grad().defined());
  Tensor c = from_vector<float>({1, 2}, {2}, {.requires_grad = true});
  sum(stack({c, c}) * from_vector<float>({1, 2, 3, 4}, {2, 2})).backward();
  EXPECT_TRUE(all_close(c.grad(), from_vector<float>({4, 6}, {2}), 0));
}

TEST(Cat, Errors) {
  Tensor a = zeros({2, 3});
  EXPECT_ATTO_ERROR(cat({}), "cat: expected a non-empty list of tensors");
  EXPECT_ATTO_ERROR(
      cat({a, a, zeros({2, 4})}, 0),
      "cat: tensor 2 has shape [2, 4] but tensor 0 has shape [2, 3]: sizes must match except in dimension 0");
  EXPECT_ATTO_ERROR(cat({a, zeros({2, 3, 1})}, 1), "tensor 1 has shape [2, 3, 1] but tensor 0 has shape [2, 3]");
  EXPECT_ATTO_ERROR(cat({a, zeros({2, 3}, {.dtype = kFloat64})}),
                    "cat: tensor 1 has dtype float64 and shape [2, 3] but tensor 0 has dtype float32");
  EXPECT_ATTO_ERROR(cat({a, a}, 2), "cat: dimension 2 out of range for a tensor of shape [2, 3]");
  EXPECT_ATTO_ERROR(cat({scalar_tensor(1.0), scalar_tensor(2.0)}),
                    "cat: zero-dimensional tensor 0 cannot be concatenated");
  EXPECT_ATTO_ERROR(cat({a, Tensor()}), "cat: tensor 1 is undefined");
  EXPECT_ATTO_ERROR(stack({}), "stack: expected a non-empty list of tensors");
  EXPECT_ATTO_ERROR(
      stack({a, zeros({3, 2})}),
      "stack: tensor 1 has shape [3, 2] but tensor 0 has shape [2, 3]: all tensors must have the same shape");
  EXPECT_ATTO_ERROR(stack({a, a}, 3),
                    "stack: dimension 3 out of range for a tensor of shape [2, 3] (expected in [-3, 2])");
  EXPECT_ATTO_ERROR(stack({a, zeros({2, 3}, {.dtype = kInt64})}), "stack: tensor 1 has dtype int64");
}

// ---------------------------------------------------------------------------------------------
// split / chunk

std::vector<Shape> shapes_of(const std::vector<Tensor>& ts) {
  std::vector<Shape> s;
  for (const Tensor& t : ts) s.push_back(t.shape());
  return s;
}

TEST(Split, Values) {
  Tensor x = iota({5, 2});
  auto p = split(x, 2);
  ASSERT_EQ(p.size(), 3u);
  EXPECT_EQ(shapes_of(p), (std::vector<Shape>{{2, 2}, {2, 2}, {1, 2}}));
  EXPECT_TRUE(all_close(p[1], dvals({4, 5, 6, 7}, {2, 2}), 0));
  EXPECT_TRUE(all_close(p[2], dvals({8, 9}, {1, 2}), 0));
  auto q = split(x, {1, 3, 1}, 0);
  EXPECT_EQ(shapes_of(q), (std::vector<Shape>{{1, 2}, {3, 2}, {1, 2}}));
  EXPECT_TRUE(all_close(q[1], dvals({2, 3, 4, 5, 6, 7}, {3, 2}), 0));
  auto r = split(x, 1, -1);
  ASSERT_EQ(r.size(), 2u);
  EXPECT_TRUE(all_close(r[1], dvals({1, 3, 5, 7, 9}, {5, 1}), 0));
  EXPECT_EQ(split(x, 10).size(), 1u);
  EXPECT_EQ(shapes_of(split(zeros({0, 2}), 2)), (std::vector<Shape>{{0, 2}}));
  EXPECT_EQ(shapes_of(split(x, {0, 5, 0}, 0)), (std::vector<Shape>{{0, 2}, {5, 2}, {0, 2}}));
}

TEST(Chunk, PyTorchSemantics) {
  EXPECT_EQ(shapes_of(chunk(zeros({5}), 3)), (std::vector<Shape>{{2}, {2}, {1}}));
  EXPECT_EQ(shapes_of(chunk(zeros({6}), 4)), (std::vector<Shape>{{2}, {2}, {2}}));  // ceil: fewer pieces
  EXPECT_EQ(shapes_of(chunk(zeros({6}), 3)), (std::vector<Shape>{{2}, {2}, {2}}));
  EXPECT_EQ(shapes_of(chunk(zeros({2}), 5)), (std::vector<Shape>{{1}, {1}}));
  EXPECT_EQ(shapes_of(chunk(zeros({0}), 3)), (std::vector<Shape>{{0}, {0}, {0}}));
  auto qkv = chunk(iota({2, 6}), 3, -1);
  ASSERT_EQ(qkv.size(), 3u);
  EXPECT_TRUE(all_close(qkv[2], dvals({4, 5, 10, 11}, {2, 2}), 0));
}

TEST(Split, Gradcheck) {
  Generator gen(5);
  Tensor x = rand_leaf({5, 3}, gen);
  EXPECT_GRADCHECK(
      [&] {
        auto p = split(x, 2);
        return cat({p[0] * 2.0, p[1] * 3.0, p[2] * p[2]});
      },
      {x});
  EXPECT_GRADCHECK([&] { return split(x, 2)[1]; }, {x});  // unused pieces get zero gradient
  EXPECT_GRADCHECK(
      [&] {
        auto p = split(x, {1, 2}, -1);
        return p[0] * slice(p[1], 1, 0, 1);
      },
      {x});
  EXPECT_GRADCHECK(
      [&] {
        auto p = chunk(transpose(x, 0, 1), 2, 1);
        return cat({p[1], p[0]}, 1);
      },
      {x});
  EXPECT_GRADCHECK(
      [&] {
        auto p = chunk(x, 3, -1);
        return p[0] * p[1] + p[2];
      },
      {x});
}

TEST(Split, Float32Backward) {
  Tensor x = from_vector<float>({1, 2, 3, 4, 5}, {5}, {.requires_grad = true});
  auto p = split(x, 2);
  sum(p[0] * 1.0 + 0.0).backward(Tensor(), true);
  sum(cat({p[2] * 5.0, p[1] * 3.0})).backward();
  EXPECT_TRUE(all_close(x.grad(), from_vector<float>({1, 1, 3, 3, 5}, {5}), 0));
}

TEST(Split, Errors) {
  Tensor x = zeros({5, 2});
  EXPECT_ATTO_ERROR(split(x, 0), "split: split_size must be positive, got 0 (input shape [5, 2])");
  EXPECT_ATTO_ERROR(split(x, -1), "split_size must be positive, got -1");
  EXPECT_ATTO_ERROR(split(x, {1, 2}, 0),
                    "split: split sizes [1, 2] sum to 3 but dimension 0 of the input of shape [5, 2] has size 5");
  EXPECT_ATTO_ERROR(split(x, {6, -1}, 0), "split: split sizes [6, -1] contain the negative size -1");
  EXPECT_ATTO_ERROR(split(x, 2, 2), "split: dimension 2 out of range for a tensor of shape [5, 2]");
  EXPECT_ATTO_ERROR(split(scalar_tensor(1.0), 1), "split: cannot split a 0-d tensor");
  EXPECT_ATTO_ERROR(chunk(x, 0), "chunk: number of chunks must be positive, got 0");
  EXPECT_ATTO_ERROR(chunk(x, 2, -3), "chunk: dimension -3 out of range for a tensor of shape [5, 2]");
  EXPECT_ATTO_ERROR(chunk(scalar_tensor(1.0), 2), "chunk: cannot chunk a 0-d tensor");
  EXPECT_ATTO_ERROR(split(scalar_tensor(1.0), std::vector<int64_t>{1}, 0), "split: cannot split a 0-d tensor");
  EXPECT_ATTO_ERROR(split(Tensor(), 1), "split: called with an undefined tensor");
}

}  // namespace

TEST(Shape, BroadcastToAHugeShapeIsAnError) {
  const int64_t half = int64_t{1} << 31;
  EXPECT_ATTO_ERROR(broadcast_to(scalar_tensor(1.0), {half, half}), "largest tensor size");  // was a segfault
  EXPECT_ATTO_ERROR(broadcast_to(scalar_tensor(1.0), {int64_t{1} << 32, int64_t{1} << 32}), "more than 2^63");
}
