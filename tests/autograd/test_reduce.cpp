#include <cmath>
#include <limits>

#include "autograd/reduce.h"
#include "autograd/shape.h"
#include "testing.h"

using namespace attograd;
using namespace attograd::testing;

namespace {

Tensor dvals(const std::vector<double>& v, const Shape& s, bool grad = false) {
  return from_vector<double>(v, s, {.dtype = kFloat64, .requires_grad = grad});
}

// Reference sum over the dims marked in `red`, in double, by walking every input index.
Tensor ref_sum(const Tensor& x, const std::vector<bool>& red, bool keepdim) {
  const Shape& s = x.shape();
  Shape out_shape;
  for (size_t d = 0; d < s.size(); ++d) {
    if (!red[d])
      out_shape.push_back(s[d]);
    else if (keepdim)
      out_shape.push_back(1);
  }
  std::vector<double> acc(static_cast<size_t>(shape_numel(out_shape)), 0.0);
  std::vector<int64_t> idx(s.size(), 0);
  for (int64_t f = 0; f < x.numel(); ++f) {
    int64_t rem = f;
    for (size_t d = s.size(); d-- > 0;) {
      idx[d] = rem % s[d];
      rem /= s[d];
    }
    int64_t o = 0;
    for (size_t d = 0; d < s.size(); ++d)
      if (!red[d]) o = o * s[d] + idx[d];
    acc[o] += x.flat(f);
  }
  if (out_shape.empty()) return scalar_tensor(acc[0], {.dtype = kFloat64});
  return from_vector<double>(acc, out_shape, {.dtype = kFloat64});
}

// ---------------------------------------------------------------------------------------------
// sum / mean values

TEST(Sum, HandValues) {
  Tensor x = dvals({1, 2, 3, 4, 5, 6}, {2, 3});
  EXPECT_EQ(sum(x).shape(), (Shape{}));
  EXPECT_EQ(sum(x).item(), 21.0);
  EXPECT_TRUE(all_close(sum(x, {0}), dvals({5, 7, 9}, {3}), 0));
  EXPECT_TRUE(all_close(sum(x, {1}), dvals({6, 15}, {2}), 0));
  EXPECT_TRUE(all_close(sum(x, {-1}, true), dvals({6, 15}, {2, 1}), 0));
  EXPECT_TRUE(all_close(sum(x, {-2}, true), dvals({5, 7, 9}, {1, 3}), 0));
  EXPECT_TRUE(all_close(sum(x, {0, 1}), scalar_tensor(21.0, {.dtype = kFloat64}), 0));
  EXPECT_TRUE(all_close(sum(x, {1, 0}, true), dvals({21}, {1, 1}), 0));
  EXPECT_TRUE(
      all_close(sum(x, {}), scalar_tensor(21.0, {.dtype = kFloat64}), 0));  // PyTorch 1.13: empty dims reduce all
  EXPECT_EQ(sum(scalar_tensor(3.0)).item(), 3.0);
  EXPECT_EQ(sum(scalar_tensor(3.0), {0}).item(), 3.0);
  EXPECT_EQ(sum(scalar_tensor(3.0), {-1}, true).shape(), (Shape{}));
}

TEST(Mean, HandValues) {
  Tensor x = dvals({1, 2, 3, 4, 5, 6}, {2, 3});
  EXPECT_DOUBLE_EQ(mean(x).item(), 3.5);
  EXPECT_TRUE(all_close(mean(x, {0}), dvals({2.5, 3.5, 4.5}, {3}), 1e-15));
  EXPECT_TRUE(all_close(mean(x, {-1}, true), dvals({2, 5}, {2, 1}), 1e-15));
  Tensor y = from_vector<float>({1, 2, 3, 4, 5, 6, 7, 8}, {2, 2, 2});
  EXPECT_EQ(mean(y, {0, 2}).dtype(), kFloat32);
  EXPECT_TRUE(all_close(mean(y, {0, 2}), from_vector<float>({3.5f, 5.5f}, {2}), 1e-6));
  EXPECT_TRUE(all_close(mean(y, {2, 0}, true), from_vector<float>({3.5f, 5.5f}, {1, 2, 1}), 1e-6));
}

TEST(Sum, ZeroSize) {
  Tensor x = zeros({2, 0, 3}, {.dtype = kFloat64});
  EXPECT_TRUE(all_close(sum(x, {1}), zeros({2, 3}, {.dtype = kFloat64}), 0));
  EXPECT_EQ(sum(x, {0}).shape(), (Shape{0, 3}));
  EXPECT_EQ(sum(x).item(), 0.0);
  Tensor m = mean(x, {1});
  EXPECT_EQ(m.shape(), (Shape{2, 3}));
  for (double v : m.to_vector<double>()) EXPECT_TRUE(std::isnan(v));
  EXPECT_TRUE(std::isnan(mean(x).item()));
  EXPECT_EQ(mean(x, {0}, true).shape(), (Shape{1, 0, 3}));
}

TEST(Sum, MatchesReferenceOnAllDimSets) {
  Generator gen(11);
  // R = 300 rows > the column block, to exercise the pairwise column recursion.
  for (Shape s : {Shape{7, 300, 5}, Shape{3, 1, 4, 1, 6}, Shape{2, 3, 2, 3, 2, 3}, Shape{257, 9}, Shape{5, 1000}}) {
    Tensor x = rand(s, gen, {.dtype = kFloat64});
    const size_t n = s.size();
    for (uint32_t bits = 0; bits < (1u << n); ++bits) {
      std::vector<int64_t> dims;
      std::vector<bool> red(n, false);
      for (size_t d = 0; d < n; ++d)
        if (bits >> d & 1) {
          dims.push_back(d % 2 ? static_cast<int64_t>(d) - static_cast<int64_t>(n) : static_cast<int64_t>(d));
          red[d] = true;
        }
      if (dims.empty()) continue;
      for (bool keep : {false, true}) {
        ASSERT_TRUE(all_close(sum(x, dims, keep), ref_sum(x, red, keep), 1e-10, 1e-12))
            << shape_str(s) << " dims " << shape_str(dims) << " keepdim " << keep;
      }
    }
  }
}

TEST(Sum, BackwardBroadcastsOnLargeShapes) {
  Generator gen(12);
  Tensor x = rand({6, 70, 4}, gen, {.dtype = kFloat64});
  x.requires_grad_();
  Tensor g = rand({6, 1, 4}, gen, {.dtype = kFloat64});
  sum(x, {1}, true).backward(g);
  for (int64_t i = 0; i < 6; ++i)
    for (int64_t j = 0; j < 70; ++j)
      for (int64_t k = 0; k < 4; ++k) ASSERT_EQ(x.grad().at({i, j, k}), g.at({i, 0, k}));
  x.zero_grad(true);
  Tensor g2 = rand({70}, gen, {.dtype = kFloat64});
  mean(x, {0, 2}).backward(g2);
  for (int64_t i = 0; i < 6; ++i)
    for (int64_t j = 0; j < 70; ++j)
      for (int64_t k = 0; k < 4; ++k) ASSERT_DOUBLE_EQ(x.grad().at({i, j, k}), g2.at({j}) / 24.0);
}

TEST(Sum, Float32LongRowsAreAccurate) {
  // Sequential float accumulation of 2^22 values of 0.1 drifts by ~1e-2 relative; pairwise does not.
  const int64_t n = int64_t{1} << 22;
  Tensor x = full({n}, 0.1, {.dtype = kFloat32});
  const double exact = static_cast<double>(0.1f) * static_cast<double>(n);
  EXPECT_NEAR(sum(x).item(), exact, exact * 1e-6);
  EXPECT_NEAR(mean(x).item(), static_cast<double>(0.1f), 1e-7);
  // Long columns: reduce the leading dim of (2^20, 4).
  Tensor c = full({int64_t{1} << 20, 4}, 0.1, {.dtype = kFloat32});
  Tensor s = sum(c, {0});
  const double exact_c = static_cast<double>(0.1f) * static_cast<double>(int64_t{1} << 20);
  for (int64_t j = 0; j < 4; ++j) EXPECT_NEAR(s.at({j}), exact_c, exact_c * 1e-6);
  // Long rows with several of them: reduce the last dim of (4, 2^20).
  Tensor r = full({4, int64_t{1} << 20}, 0.1, {.dtype = kFloat32});
  Tensor sr = sum(r, {-1});
  for (int64_t j = 0; j < 4; ++j) EXPECT_NEAR(sr.at({j}), exact_c, exact_c * 1e-6);
}

TEST(Sum, Float32Backward) {
  Tensor x = from_vector<float>({1, 2, 3, 4, 5, 6}, {2, 3}, {.requires_grad = true});
  Tensor w = from_vector<float>({1, 2}, {2});
  sum(mean(x, {1}) * w).backward();
  EXPECT_EQ(x.grad().dtype(), kFloat32);
  EXPECT_TRUE(
      all_close(x.grad(), from_vector<float>({1.f / 3, 1.f / 3, 1.f / 3, 2.f / 3, 2.f / 3, 2.f / 3}, {2, 3}), 1e-7));
}

// ---------------------------------------------------------------------------------------------
// sum / mean gradchecks

TEST(Sum, Gradcheck) {
  Generator gen(13);
  Tensor x = rand_leaf({2, 3, 4}, gen);
  Tensor z = rand_leaf({2, 0, 3}, gen);
  Tensor v = rand_leaf({3}, gen);
  EXPECT_GRADCHECK([&] { return sum(x); }, {x});
  EXPECT_GRADCHECK([&] { return sum(x, {0}); }, {x});
  EXPECT_GRADCHECK([&] { return sum(x, {-1}); }, {x});
  EXPECT_GRADCHECK([&] { return sum(x, {1}, true); }, {x});
  EXPECT_GRADCHECK([&] { return sum(x, {0, 2}); }, {x});
  EXPECT_GRADCHECK([&] { return sum(x, {-1, 0}, true); }, {x});
  EXPECT_GRADCHECK([&] { return sum(x, {0, 1, 2}); }, {x});
  EXPECT_GRADCHECK([&] { return sum(x, {}); }, {x});
  Tensor w = rand_leaf({2, 3}, gen);
  EXPECT_GRADCHECK([&] { return sum(z, {1}) + w; }, {z, w});  // zero-size reduced dim
  EXPECT_GRADCHECK([&] { return sum(z, {0}, true); }, {z});
  EXPECT_GRADCHECK([&] { return sum(transpose(x, 0, 2), {1}); }, {x});
  EXPECT_GRADCHECK([&] { return sum(x, {1}) * sum(x, {1}); }, {x});  // used twice
  EXPECT_GRADCHECK([&] { return sum(x, {1}, true) * x; }, {x});      // diamond with broadcast
  EXPECT_GRADCHECK([&] { return sum(v, {0}) * v; }, {v});
  EXPECT_GRADCHECK([&] { return sum(cat({x, x}, 1), {1}); }, {x});
}

TEST(Mean, Gradcheck) {
  Generator gen(14);
  Tensor x = rand_leaf({2, 3, 4}, gen);
  Tensor z = rand_leaf({2, 0, 3}, gen);
  EXPECT_GRADCHECK([&] { return mean(x); }, {x});
  EXPECT_GRADCHECK([&] { return mean(x, {1}); }, {x});
  EXPECT_GRADCHECK([&] { return mean(x, {-1}, true); }, {x});
  EXPECT_GRADCHECK([&] { return mean(x, {0, 2}, false); }, {x});
  EXPECT_GRADCHECK([&] { return mean(x, {2, 0}, true); }, {x});
  EXPECT_GRADCHECK([&] { return mean(z, {0}); }, {z});
  EXPECT_GRADCHECK([&] { return mean(permute(x, {2, 0, 1}), {0}); }, {x});
  EXPECT_GRADCHECK([&] { return x - mean(x, {-1}, true); }, {x});  // diamond
  EXPECT_GRADCHECK([&] { return mean(x, {0}) + sum(x, {0}); }, {x});
}

// ---------------------------------------------------------------------------------------------
// max / argmax

TEST(Max, ValuesIndicesAndTies) {
  Tensor x = dvals({1, 3, 3, 2, 2, 1}, {2, 3});
  MaxResult r = max(x, 1);
  EXPECT_TRUE(all_close(r.values, dvals({3, 2}, {2}), 0));
  EXPECT_EQ(r.indices.dtype(), kInt64);
  EXPECT_EQ(r.indices.to_vector<int64_t>(), (std::vector<int64_t>{1, 0}));
  MaxResult c = max(x, 0, true);
  EXPECT_EQ(c.values.shape(), (Shape{1, 3}));
  EXPECT_TRUE(all_close(c.values, dvals({2, 3, 3}, {1, 3}), 0));
  EXPECT_EQ(c.indices.shape(), (Shape{1, 3}));
  EXPECT_EQ(c.indices.to_vector<int64_t>(), (std::vector<int64_t>{1, 0, 0}));
  EXPECT_EQ(max(x, -1, true).values.shape(), (Shape{2, 1}));
  EXPECT_EQ(max(x).item(), 3.0);
  EXPECT_EQ(max(x).shape(), (Shape{}));
  EXPECT_EQ(argmax(x).item<int64_t>(), 1);
  EXPECT_EQ(argmax(x, 1).to_vector<int64_t>(), (std::vector<int64_t>{1, 0}));
  EXPECT_EQ(argmax(x, 0, true).shape(), (Shape{1, 3}));
  EXPECT_EQ(argmax(x, -2).to_vector<int64_t>(), (std::vector<int64_t>{1, 0, 0}));
  // 0-d input and zero-size kept dims.
  MaxResult s = max(scalar_tensor(4.0), 0);
  EXPECT_EQ(s.values.item(), 4.0);
  EXPECT_EQ(s.indices.item<int64_t>(), 0);
  EXPECT_EQ(max(zeros({0, 3}), 1).values.shape(), (Shape{0}));
}

TEST(Max, NaNPropagates) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  Tensor x = dvals({1, nan, 3, nan}, {4});
  EXPECT_TRUE(std::isnan(max(x).item()));
  EXPECT_EQ(argmax(x).item<int64_t>(), 1);
  Tensor m = dvals({1, 5, nan, 2, 0, 9}, {3, 2});
  MaxResult r = max(m, 0);
  EXPECT_TRUE(std::isnan(r.values.at({0})));
  EXPECT_EQ(r.values.at({1}), 9.0);
  EXPECT_EQ(r.indices.to_vector<int64_t>(), (std::vector<int64_t>{1, 2}));
}

TEST(Max, LongRowsMatchReference) {
  // Rows of >= 128 take the blocked path; rows with a NaN or an infinity take the scalar path.
  Generator gen(16);
  for (Dtype dt : {kFloat32, kFloat64}) {
    Tensor x = rand({6, 300}, gen, {.dtype = dt});
    x.set({1, 250}, 2.0);
    x.set({1, 150}, 2.0);  // tie: the first one wins
    x.set({2, 299}, 5.0);  // last element
    x.set({3, 0}, 5.0);    // first element
    x.set({4, 200}, INFINITY);
    x.set({4, 100}, 1.5);
    x.set({5, 280}, NAN);
    x.set({5, 10}, 3.0);
    MaxResult r = max(x, -1);
    EXPECT_EQ(r.indices.to_vector<int64_t>()[1], 150);
    EXPECT_EQ(r.indices.to_vector<int64_t>()[2], 299);
    EXPECT_EQ(r.indices.to_vector<int64_t>()[3], 0);
    EXPECT_EQ(r.indices.to_vector<int64_t>()[4], 200);
    EXPECT_EQ(r.indices.to_vector<int64_t>()[5], 280);
    EXPECT_TRUE(std::isinf(r.values.at({4})));
    EXPECT_TRUE(std::isnan(r.values.at({5})));
    int64_t ref = 0;  // row 0: plain reference
    for (int64_t i = 1; i < 300; ++i)
      if (x.at({0, i}) > x.at({0, ref})) ref = i;
    EXPECT_EQ(r.indices.to_vector<int64_t>()[0], ref);
    EXPECT_EQ(r.values.at({0}), x.at({0, ref}));
    Tensor flat = reshape(slice(x, 0, 0, 4), {-1});
    EXPECT_EQ(argmax(flat).item<int64_t>(), 2 * 300 + 299);  // 5.0 first appears at (2, 299)
    EXPECT_EQ(max(flat).item(), 5.0);
  }
}

TEST(Max, GradientGoesToFirstMaximum) {
  Tensor x = from_vector<double>({1, 3, 3, 2, 2, 1}, {2, 3}, {.dtype = kFloat64, .requires_grad = true});
  sum(max(x, 1).values * dvals({10, 20}, {2})).backward();
  EXPECT_TRUE(all_close(x.grad(), dvals({0, 10, 0, 20, 0, 0}, {2, 3}), 0));
  x.zero_grad(true);
  max(x).backward();
  EXPECT_TRUE(all_close(x.grad(), dvals({0, 1, 0, 0, 0, 0}, {2, 3}), 0));
  Tensor f = from_vector<float>({4, 1, 7, 7}, {2, 2}, {.requires_grad = true});
  sum(max(f, 0, true).values).backward();
  EXPECT_EQ(f.grad().dtype(), kFloat32);
  EXPECT_TRUE(all_close(f.grad(), from_vector<float>({0, 0, 1, 1}, {2, 2}), 0));
}

TEST(Max, Gradcheck) {
  Generator gen(15);  // continuous uniform values: no ties
  Tensor x = rand_leaf({3, 4, 5}, gen);
  Tensor z = rand_leaf({0, 4}, gen);
  EXPECT_GRADCHECK([&] { return max(x, 0).values; }, {x});
  EXPECT_GRADCHECK([&] { return max(x, 1, true).values; }, {x});
  EXPECT_GRADCHECK([&] { return max(x, -1).values; }, {x});
  EXPECT_GRADCHECK([&] { return max(x, -1, true).values; }, {x});
  EXPECT_GRADCHECK([&] { return max(x); }, {x});
  EXPECT_GRADCHECK([&] { return max(transpose(x, 0, 2), 1).values; }, {x});
  EXPECT_GRADCHECK([&] { return max(x, 2).values * max(x, 2).values; }, {x});  // used twice
  EXPECT_GRADCHECK([&] { return x - max(x, -1, true).values; }, {x});          // diamond
  EXPECT_GRADCHECK([&] { return max(z, 1).values; }, {z});                     // zero-size kept dim
  EXPECT_GRADCHECK([&] { return max(cat({x, x * 2.0}, 1), 1).values; }, {x});
}

TEST(Max, Float32) {
  Tensor x = from_vector<float>({0.5f, -1.f, 2.5f, 2.f, 7.f, -3.f}, {3, 2});
  MaxResult r = max(x, 0);
  EXPECT_EQ(r.values.dtype(), kFloat32);
  EXPECT_TRUE(all_close(r.values, from_vector<float>({7.f, 2.f}, {2}), 0));
  EXPECT_EQ(r.indices.to_vector<int64_t>(), (std::vector<int64_t>{2, 1}));
  EXPECT_EQ(max(x).item(), 7.0);
  EXPECT_EQ(argmax(x).item<int64_t>(), 4);
}

// ---------------------------------------------------------------------------------------------
// errors

TEST(Reduce, Errors) {
  Tensor x = zeros({2, 3});
  EXPECT_ATTO_ERROR(sum(x, {0, 0}), "sum: dim 0 appears more than once in dims [0, 0] (input shape [2, 3])");
  EXPECT_ATTO_ERROR(sum(x, {1, -1}), "sum: dim -1 appears more than once in dims [1, -1]");
  EXPECT_ATTO_ERROR(sum(x, {2}), "sum: dimension 2 out of range for a tensor of shape [2, 3] (expected in [-2, 1])");
  EXPECT_ATTO_ERROR(sum(x, {-3}), "sum: dimension -3 out of range");
  EXPECT_ATTO_ERROR(sum(scalar_tensor(1.0), {1}), "sum: dimension 1 out of range for a tensor of shape []");
  EXPECT_ATTO_ERROR(sum(scalar_tensor(1.0), {0, -1}), "sum: dim -1 appears more than once");
  EXPECT_ATTO_ERROR(mean(x, {0, -2}), "mean: dim -2 appears more than once");
  EXPECT_ATTO_ERROR(mean(x, {5}), "mean: dimension 5 out of range");
  EXPECT_ATTO_ERROR(sum(zeros({2}, {.dtype = kInt64})), "sum: expected a float32 or float64 tensor, got int64");
  EXPECT_ATTO_ERROR(mean(Tensor()), "mean: called with an undefined tensor");
  EXPECT_ATTO_ERROR(sum(Tensor(), {0}), "sum: called with an undefined tensor");
  EXPECT_ATTO_ERROR(max(Tensor(), 0), "max: called with an undefined tensor");
  EXPECT_ATTO_ERROR(argmax(Tensor()), "argmax: called with an undefined tensor");
  EXPECT_ATTO_ERROR(max(scalar_tensor(1.0), 1), "max: dimension 1 out of range for a tensor of shape []");
  EXPECT_ATTO_ERROR(max(zeros({2, 0}), 1), "max: cannot take the max over dimension 1 of size 0 (input shape [2, 0])");
  EXPECT_ATTO_ERROR(max(zeros({0, 2}), -2), "cannot take the max over dimension -2 of size 0");
  EXPECT_ATTO_ERROR(max(zeros({0})), "max: cannot take the max of an empty tensor of shape [0]");
  EXPECT_ATTO_ERROR(max(x, 2), "max: dimension 2 out of range for a tensor of shape [2, 3]");
  EXPECT_ATTO_ERROR(argmax(x, -3), "argmax: dimension -3 out of range");
  EXPECT_ATTO_ERROR(argmax(zeros({3, 0}), 1), "argmax: cannot take the max over dimension 1 of size 0");
  EXPECT_ATTO_ERROR(argmax(zeros({0, 3})), "argmax: cannot take the max of an empty tensor");
  EXPECT_ATTO_ERROR(max(zeros({2}, {.dtype = kBool}), 0), "max: expected a float32 or float64 tensor, got bool");
}

}  // namespace
