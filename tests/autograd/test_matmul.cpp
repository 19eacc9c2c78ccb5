#include "autograd/matmul.h"
#include "testing.h"

using namespace attograd;
using namespace attograd::testing;

namespace {

// Row-major index of `idx` (an index into the broadcast shape `full`) in a shape `part` that broadcasts to it.
int64_t broadcast_offset(const std::vector<int64_t>& idx, const Shape& part, const Shape& full) {
  int64_t off = 0;
  const size_t shift = full.size() - part.size();
  for (size_t d = 0; d < part.size(); ++d) off = off * part[d] + (part[d] == 1 ? 0 : idx[d + shift]);
  return off;
}

// A naive torch.matmul in double: promotion of 1-D operands, broadcast batch dims, a triple loop per batch.
Tensor reference_matmul(const Tensor& a, const Tensor& b) {
  Shape sa = a.shape(), sb = b.shape();
  const bool vec_a = sa.size() == 1, vec_b = sb.size() == 1;
  if (vec_a) sa = {1, sa[0]};
  if (vec_b) sb = {sb[0], 1};
  const int64_t m = sa[sa.size() - 2], k = sa.back(), n = sb.back();
  const Shape ba(sa.begin(), sa.end() - 2), bb(sb.begin(), sb.end() - 2);
  const Shape batch = broadcast_shapes(ba, bb);
  const auto av = a.to_vector<double>(), bv = b.to_vector<double>();
  const int64_t nb = shape_numel(batch);
  std::vector<double> out(static_cast<size_t>(nb * m * n), 0.0);
  for (int64_t j = 0; j < nb; ++j) {
    std::vector<int64_t> idx(batch.size());
    for (int64_t d = static_cast<int64_t>(batch.size()) - 1, rest = j; d >= 0; --d) {
      idx[static_cast<size_t>(d)] = rest % batch[static_cast<size_t>(d)];
      rest /= batch[static_cast<size_t>(d)];
    }
    const int64_t ia = broadcast_offset(idx, ba, batch), ib = broadcast_offset(idx, bb, batch);
    for (int64_t i = 0; i < m; ++i)
      for (int64_t c = 0; c < n; ++c) {
        double s = 0;
        for (int64_t t = 0; t < k; ++t) s += av[ia * m * k + i * k + t] * bv[ib * k * n + t * n + c];
        out[j * m * n + i * n + c] = s;
      }
  }
  Shape os = batch;
  if (!vec_a) os.push_back(m);
  if (!vec_b) os.push_back(n);
  Tensor r = empty(os, {.dtype = kFloat64});
  for (size_t i = 0; i < out.size(); ++i) r.data<double>()[i] = out[i];
  return r;
}

// A differentiable 2-D transpose local to this test (a transposed input built from a contiguous leaf).
Tensor transpose2d(const Tensor& x) {
  const int64_t r = x.size(0), c = x.size(1);
  Tensor out = empty({c, r}, {.dtype = x.dtype()});
  for (int64_t i = 0; i < r; ++i)
    for (int64_t j = 0; j < c; ++j) out.set({j, i}, x.at({i, j}));
  return record("transpose2d", out, {x}, [](const Tensor& g, GradInputs& gi) { gi[0] = transpose2d(g); });
}

// Values against the naive reference, then a float64 gradcheck of both operands.
void check_matmul(const Shape& sa, const Shape& sb, const Shape& expected_shape, uint64_t seed) {
  SCOPED_TRACE(shape_str(sa) + " x " + shape_str(sb));
  Generator gen(seed);
  Tensor a = rand_leaf(sa, gen), b = rand_leaf(sb, gen);
  Tensor y = matmul(a, b);
  EXPECT_EQ(y.shape(), expected_shape);
  EXPECT_EQ(y.dtype(), kFloat64);
  EXPECT_TRUE(all_close(y, reference_matmul(a, b), 1e-12));
  EXPECT_EQ(y.grad_fn_name(), "matmul");
  std::vector<Tensor> inputs{a, b};
  EXPECT_GRADCHECK([&] { return matmul(a, b); }, inputs);
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// matmul values

TEST(Matmul, TwoByTwoByHand) {
  Tensor a = from_vector<double>({1, 2, 3, 4}, {2, 2});
  Tensor b = from_vector<double>({5, 6, 7, 8}, {2, 2});
  Tensor y = matmul(a, b);
  EXPECT_TRUE(all_close(y, from_vector<double>({19, 22, 43, 50}, {2, 2}), 0));
}

TEST(Matmul, RectangularByHand) {
  Tensor a = from_vector<double>({1, 2, 3, 4, 5, 6}, {2, 3});
  Tensor b = from_vector<double>({1, 0, 0, 1, 1, 1}, {3, 2});
  // [1 2 3; 4 5 6] [1 0; 0 1; 1 1] = [4 5; 10 11]
  EXPECT_TRUE(all_close(matmul(a, b), from_vector<double>({4, 5, 10, 11}, {2, 2}), 0));
}

TEST(Matmul, DotGivesZeroDim) {
  Tensor a = from_vector<double>({1, 2, 3});
  Tensor b = from_vector<double>({4, 5, 6});
  Tensor y = matmul(a, b);
  EXPECT_EQ(y.shape(), Shape{});
  EXPECT_DOUBLE_EQ(y.item(), 32.0);
}

TEST(Matmul, MatrixVectorAndVectorMatrixByHand) {
  Tensor m = from_vector<double>({1, 2, 3, 4, 5, 6}, {2, 3});
  Tensor v3 = from_vector<double>({1, -1, 2});
  Tensor v2 = from_vector<double>({2, -1});
  EXPECT_TRUE(all_close(matmul(m, v3), from_vector<double>({5, 11}, {2}), 0));      // (2,3)x(3) -> (2)
  EXPECT_TRUE(all_close(matmul(v2, m), from_vector<double>({-2, -1, 0}, {3}), 0));  // (2)x(2,3) -> (3)
}

TEST(Matmul, BatchedByHand) {
  // Two batches of 1x2 times one shared 2x1: [1 2][3;4] = 11, [5 6][3;4] = 39.
  Tensor a = from_vector<double>({1, 2, 5, 6}, {2, 1, 2});
  Tensor b = from_vector<double>({3, 4}, {2, 1});
  EXPECT_TRUE(all_close(matmul(a, b), from_vector<double>({11, 39}, {2, 1, 1}), 0));
  // Per-batch second operand: [1 2][1;0] = 1, [5 6][0;1] = 6.
  Tensor c = from_vector<double>({1, 0, 0, 1}, {2, 2, 1});
  EXPECT_TRUE(all_close(matmul(a, c), from_vector<double>({1, 6}, {2, 1, 1}), 0));
}

TEST(Matmul, BackwardByHand) {
  Tensor a = from_vector<double>({1, 2, 3, 4}, {2, 2}, {.dtype = kFloat64, .requires_grad = true});
  Tensor b = from_vector<double>({5, 6, 7, 8}, {2, 2}, {.dtype = kFloat64, .requires_grad = true});
  Tensor g = from_vector<double>({1, 0, 0, 2}, {2, 2});
  matmul(a, b).backward(g);
  // dA = g B^T = [5 7; 12 16], dB = A^T g = [1 6; 2 8].
  EXPECT_TRUE(all_close(a.grad(), from_vector<double>({5, 7, 12, 16}, {2, 2}), 0));
  EXPECT_TRUE(all_close(b.grad(), from_vector<double>({1, 6, 2, 8}, {2, 2}), 0));
}

TEST(Matmul, OnlyTheOperandThatNeedsGradGetsOne) {
  Generator gen(3);
  Tensor a = rand_leaf({3, 4}, gen);
  Tensor b = rand({4, 2}, gen, {.dtype = kFloat64});
  matmul(a, b).backward(ones({3, 2}, {.dtype = kFloat64}));
  EXPECT_TRUE(a.grad().defined());
  EXPECT_FALSE(b.grad().defined());
  // dA = g B^T with g all ones: row i of dA is the row sums of B.
  auto bv = b.to_vector<double>();
  for (int64_t i = 0; i < 3; ++i)
    for (int64_t t = 0; t < 4; ++t) EXPECT_NEAR(a.grad().at({i, t}), bv[t * 2] + bv[t * 2 + 1], 1e-15);
  Tensor c = matmul(b, ones({2, 3}, {.dtype = kFloat64}));
  EXPECT_FALSE(c.requires_grad());
  {
    NoGradGuard ng;
    EXPECT_FALSE(matmul(a, b).requires_grad());
  }
}

// ---------------------------------------------------------------------------------------------
// matmul against the naive reference, with float64 gradchecks

TEST(Matmul, TwoDimensional) { check_matmul({3, 4}, {4, 5}, {3, 5}, 1); }
TEST(Matmul, Dot) { check_matmul({5}, {5}, {}, 2); }
TEST(Matmul, MatrixVector) { check_matmul({3, 4}, {4}, {3}, 3); }
TEST(Matmul, VectorMatrix) { check_matmul({4}, {4, 5}, {5}, 4); }
TEST(Matmul, OuterSizesOne) { check_matmul({1, 4}, {4, 1}, {1, 1}, 5); }

TEST(Matmul, NdTimesMatrixFoldsLeadingDims) { check_matmul({2, 3, 4}, {4, 5}, {2, 3, 5}, 6); }
TEST(Matmul, NdTimesVector) { check_matmul({2, 3, 4}, {4}, {2, 3}, 7); }
TEST(Matmul, VectorTimesNd) { check_matmul({4}, {2, 4, 5}, {2, 5}, 8); }
TEST(Matmul, MatrixTimesNd) { check_matmul({3, 4}, {2, 4, 5}, {2, 3, 5}, 9); }
TEST(Matmul, BatchedSameBatch) { check_matmul({2, 3, 4}, {2, 4, 5}, {2, 3, 5}, 10); }
TEST(Matmul, BroadcastBatchDims) { check_matmul({2, 1, 3, 4}, {5, 4, 6}, {2, 5, 3, 6}, 11); }
TEST(Matmul, BroadcastBatchDimsBothWays) { check_matmul({3, 1, 2, 3}, {1, 4, 3, 2}, {3, 4, 2, 2}, 12); }
TEST(Matmul, SecondBatchAllOnes) { check_matmul({2, 3, 4}, {1, 4, 5}, {2, 3, 5}, 13); }
TEST(Matmul, FirstBatchAllOnes) { check_matmul({1, 3, 4}, {2, 4, 5}, {2, 3, 5}, 14); }
TEST(Matmul, MatrixTimesHigherRankOnes) { check_matmul({3, 4}, {1, 1, 4, 5}, {1, 1, 3, 5}, 15); }
TEST(Matmul, FourDimensionalAttentionShapes) { check_matmul({2, 2, 3, 4}, {2, 2, 4, 3}, {2, 2, 3, 3}, 16); }

TEST(Matmul, ZeroRows) {
  check_matmul({0, 3}, {3, 4}, {0, 4}, 17);
  Generator gen(17);
  Tensor a = rand_leaf({0, 3}, gen), b = rand_leaf({3, 4}, gen);
  matmul(a, b).backward(zeros({0, 4}, {.dtype = kFloat64}));
  EXPECT_TRUE(all_close(b.grad(), zeros({3, 4}, {.dtype = kFloat64}), 0));
  EXPECT_EQ(a.grad().shape(), (Shape{0, 3}));
}

TEST(Matmul, ZeroInnerSizeGivesZeros) {
  Generator gen(18);
  Tensor a = rand_leaf({2, 0}, gen), b = rand_leaf({0, 3}, gen);
  Tensor y = matmul(a, b);
  EXPECT_TRUE(all_close(y, zeros({2, 3}, {.dtype = kFloat64}), 0));
  check_matmul({2, 0}, {0, 3}, {2, 3}, 18);
  // Batched (non-folded) path with an empty inner size, and an empty batch.
  Tensor c = rand_leaf({2, 2, 0}, gen), d = rand_leaf({2, 0, 3}, gen);
  EXPECT_TRUE(all_close(matmul(c, d), zeros({2, 2, 3}, {.dtype = kFloat64}), 0));
  check_matmul({0, 2, 3}, {0, 3, 4}, {0, 2, 4}, 19);
  check_matmul({0, 2, 3}, {3, 4}, {0, 2, 4}, 20);
  // A broadcast operand against an empty batch: its gradient is an empty sum, zeros.
  check_matmul({1, 2, 3}, {0, 3, 4}, {0, 2, 4}, 21);
  Tensor s = rand_leaf({1, 2, 3}, gen), t = rand_leaf({0, 3, 4}, gen);
  matmul(s, t).backward(zeros({0, 2, 4}, {.dtype = kFloat64}));
  EXPECT_TRUE(all_close(s.grad(), zeros({1, 2, 3}, {.dtype = kFloat64}), 0));
}

TEST(Matmul, TransposedInput) {
  Generator gen(21);
  Tensor x = rand_leaf({4, 3}, gen), y = rand_leaf({4, 5}, gen);
  Tensor xt = transpose2d(x);  // (3, 4)
  EXPECT_TRUE(all_close(matmul(xt, y), reference_matmul(xt, y), 1e-12));
  std::vector<Tensor> inputs{x, y};
  EXPECT_GRADCHECK([&] { return matmul(transpose2d(x), y); }, inputs);
  EXPECT_GRADCHECK([&] { return matmul(y, transpose2d(y)); }, inputs);  // x unused: zero gradient
}

TEST(Matmul, SameSquareInputTwice) {
  Generator gen(22);
  Tensor x = rand_leaf({4, 4}, gen);
  EXPECT_TRUE(all_close(matmul(x, x), reference_matmul(x, x), 1e-12));
  std::vector<Tensor> inputs{x};
  EXPECT_GRADCHECK([&] { return matmul(x, x); }, inputs);
  EXPECT_GRADCHECK([&] { return matmul(matmul(x, x), x); }, inputs);
  // Batched with a shared operand.
  Tensor z = rand_leaf({2, 3, 3}, gen);
  std::vector<Tensor> zin{z};
  EXPECT_GRADCHECK([&] { return matmul(z, z); }, zin);
}

TEST(Matmul, Float32MatchesFloat64) {
  Generator gen(23);
  const std::vector<std::pair<Shape, Shape>> cases = {
      {{7, 9}, {9, 5}}, {{2, 3, 9}, {9, 4}}, {{2, 1, 3, 9}, {5, 9, 4}}, {{9}, {9}}, {{3, 9}, {2, 9, 4}}};
  for (const auto& [sa, sb] : cases) {
    SCOPED_TRACE(shape_str(sa) + " x " + shape_str(sb));
    Tensor a64 = rand_leaf(sa, gen), b64 = rand_leaf(sb, gen);
    Tensor a32 = a64.detach().to(kFloat32).requires_grad_(), b32 = b64.detach().to(kFloat32).requires_grad_();
    Tensor y64 = matmul(a64, b64), y32 = matmul(a32, b32);
    EXPECT_EQ(y32.dtype(), kFloat32);
    EXPECT_TRUE(all_close(y32, y64, 1e-5, 1e-5));
    Tensor g64 = rand(y64.shape(), gen, {.dtype = kFloat64});
    y64.backward(g64);
    y32.backward(g64.to(kFloat32));
    EXPECT_EQ(a32.grad().dtype(), kFloat32);
    EXPECT_TRUE(all_close(a32.grad(), a64.grad(), 1e-5, 1e-5));
    EXPECT_TRUE(all_close(b32.grad(), b64.grad(), 1e-5, 1e-5));
  }
}

TEST(Matmul, LargeFloat32AgainstReference) {
  // Big enough for Eigen's blocked GEMM kernels (not the small coefficient-based path).
  Generator gen(24);
  Tensor a = rand({3, 70, 65}, gen), b = rand({65, 80}, gen);
  EXPECT_TRUE(all_close(matmul(a, b), reference_matmul(a, b), 1e-4, 1e-5));
  Tensor c = rand({2, 70, 65}, gen), d = rand({2, 65, 80}, gen);
  EXPECT_TRUE(all_close(matmul(c, d), reference_matmul(c, d), 1e-4, 1e-5));
}

TEST(Matmul, Errors) {
  Tensor a = zeros({2, 3}, {.dtype = kFloat64}), b = zeros({4, 5}, {.dtype = kFloat64});
  EXPECT_ATTO_ERROR(matmul(a, b), "matmul: shapes [2, 3] and [4, 5] cannot be multiplied (inner sizes 3 and 4 differ)");
  EXPECT_ATTO_ERROR(matmul(zeros({3}), zeros({4})), "shapes [3] and [4] cannot be multiplied (inner sizes 3 and 4");
  EXPECT_ATTO_ERROR(matmul(zeros({2, 3}), zeros({4})), "inner sizes 3 and 4 differ");
  EXPECT_ATTO_ERROR(matmul(scalar_tensor(1.0), zeros({3})),
                    "both arguments must be at least 1-D, got shapes [] and [3]");
  EXPECT_ATTO_ERROR(matmul(zeros({2, 3, 4}), zeros({5, 4, 6})),
                    "batch dimensions [2] of [2, 3, 4] and [5] of [5, 4, 6] cannot be broadcast");
  EXPECT_ATTO_ERROR(matmul(zeros({2, 3}), zeros({3, 2}, {.dtype = kFloat64})),
                    "dtype mismatch: float32 [2, 3] and float64 [3, 2]");
  EXPECT_ATTO_ERROR(matmul(zeros({2, 3}, {.dtype = kInt64}), zeros({3, 2}, {.dtype = kInt64})),
                    "expected a float32 or float64 tensor, got int64");
  EXPECT_ATTO_ERROR(matmul(Tensor(), zeros({3})), "matmul: called with an undefined tensor");
}

// ---------------------------------------------------------------------------------------------
// linear

TEST(Linear, ValuesByHand) {
  Tensor x = from_vector<double>({1, 2, 3, 4, 5, 6}, {2, 3});
  Tensor w = from_vector<double>({1, 0, -1, 0.5, 0.5, 0.5}, {2, 3});
  Tensor b = from_vector<double>({10, -1});
  // x W^T = [1-3, 3; 4-6, 7.5] = [-2 3; -2 7.5]
  EXPECT_TRUE(all_close(linear(x, w), from_vector<double>({-2, 3, -2, 7.5}, {2, 2}), 0));
  EXPECT_TRUE(all_close(linear(x, w, b), from_vector<double>({8, 2, 8, 6.5}, {2, 2}), 0));
  // 1-D input (in) -> (out).
  EXPECT_TRUE(all_close(linear(from_vector<double>({1, 2, 3}), w, b), from_vector<double>({8, 2}, {2}), 0));
}

TEST(Linear, BackwardByHand) {
  Tensor x = from_vector<double>({1, 2, 3, 4, 5, 6}, {2, 3}, {.dtype = kFloat64, .requires_grad = true});
  Tensor w = from_vector<double>({1, 0, -1, 0.5, 0.5, 0.5}, {2, 3}, {.dtype = kFloat64, .requires_grad = true});
  Tensor b = from_vector<double>({10, -1}, {2}, {.dtype = kFloat64, .requires_grad = true});
  Tensor g = from_vector<double>({1, 2, 3, 4}, {2, 2});
  linear(x, w, b).backward(g);
  // dx = g W = [1+1, 1, -1+1; 3+2, 2, -3+2], dW = g^T x = [1+12, 2+15, 3+18; 2+16, 4+20, 6+24], db = [4, 6].
  EXPECT_TRUE(all_close(x.grad(), from_vector<double>({2, 1, 0, 5, 2, -1}, {2, 3}), 1e-15));
  EXPECT_TRUE(all_close(w.grad(), from_vector<double>({13, 17, 21, 18, 24, 30}, {2, 3}), 1e-15));
  EXPECT_TRUE(all_close(b.grad(), from_vector<double>({4, 6}, {2}), 0));
}

TEST(Linear, MatchesComposedMatmul) {
  Generator gen(30);
  Tensor x = rand_leaf({2, 3, 4}, gen), w = rand_leaf({5, 4}, gen), b = rand_leaf({5}, gen);
  Tensor composed = matmul(x, transpose2d(w)).detach();
  auto cv = composed.to_vector<double>();
  auto bv = b.to_vector<double>();
  for (size_t i = 0; i < cv.size(); ++i) cv[i] += bv[i % 5];
  EXPECT_TRUE(all_close(linear(x, w, b), from_vector(cv, {2, 3, 5}), 1e-12));
  EXPECT_TRUE(all_close(linear(x, w), composed, 1e-12));
  EXPECT_EQ(linear(x, w, b).grad_fn_name(), "linear");
}

TEST(Linear, GradcheckWithBias) {
  Generator gen(31);
  Tensor x = rand_leaf({3, 4}, gen), w = rand_leaf({5, 4}, gen), b = rand_leaf({5}, gen);
  std::vector<Tensor> inputs{x, w, b};
  EXPECT_GRADCHECK([&] { return linear(x, w, b); }, inputs);
}

TEST(Linear, GradcheckWithoutBias) {
  Generator gen(32);
  Tensor x = rand_leaf({3, 4}, gen), w = rand_leaf({5, 4}, gen);
  std::vector<Tensor> inputs{x, w};
  EXPECT_GRADCHECK([&] { return linear(x, w); }, inputs);
}

TEST(Linear, GradcheckThreeDimensionalInput) {
  Generator gen(33);
  Tensor x = rand_leaf({2, 3, 4}, gen), w = rand_leaf({5, 4}, gen), b = rand_leaf({5}, gen);
  std::vector<Tensor> inputs{x, w, b};
  EXPECT_GRADCHECK([&] { return linear(x, w, b); }, inputs);
  std::vector<Tensor> wb{w, b};
  EXPECT_GRADCHECK([&] { return linear(x.detach(), w, b); }, wb);  // only the parameters need grad
}

TEST(Linear, GradcheckOneDimensionalInputAndReuse) {
  Generator gen(34);
  Tensor x = rand_leaf({4}, gen), w = rand_leaf({4, 4}, gen), b = rand_leaf({4}, gen);
  std::vector<Tensor> inputs{x, w, b};
  EXPECT_GRADCHECK([&] { return linear(x, w, b); }, inputs);
  EXPECT_GRADCHECK([&] { return linear(linear(x, w, b), w, b); }, inputs);  // w and b used twice
  std::vector<Tensor> ws{w};
  EXPECT_GRADCHECK([&] { return linear(w, w); }, ws);  // x W^T with x = W
}

TEST(Linear, ZeroRows) {
  Generator gen(35);
  Tensor x = rand_leaf({0, 4}, gen), w = rand_leaf({5, 4}, gen), b = rand_leaf({5}, gen);
  Tensor y = linear(x, w, b);
  EXPECT_EQ(y.shape(), (Shape{0, 5}));
  y.backward(zeros({0, 5}, {.dtype = kFloat64}));
  EXPECT_TRUE(all_close(w.grad(), zeros({5, 4}, {.dtype = kFloat64}), 0));
  EXPECT_TRUE(all_close(b.grad(), zeros({5}, {.dtype = kFloat64}), 0));
  // in_features == 0: the output is the bias.
  Tensor x0 = rand_leaf({2, 0}, gen), w0 = rand_leaf({3, 0}, gen), b0 = rand_leaf({3}, gen);
  Tensor y0 = linear(x0, w0, b0);
  EXPECT_EQ(y0.shape(), (Shape{2, 3}));
  for (int64_t i = 0; i < 2; ++i)
    for (int64_t o = 0; o < 3; ++o) EXPECT_EQ(y0.at({i, o}), b0.at({o}));
  std::vector<Tensor> inputs{x0, w0, b0};
  EXPECT_GRADCHECK([&] { return linear(x0, w0, b0); }, inputs);
}

TEST(Linear, Float32MatchesFloat64) {
  Generator gen(36);
  Tensor x64 = rand_leaf({4, 6, 33}, gen), w64 = rand_leaf({17, 33}, gen), b64 = rand_leaf({17}, gen);
  Tensor x32 = x64.detach().to(kFloat32).requires_grad_(), w32 = w64.detach().to(kFloat32).requires_grad_(),
         b32 = b64.detach().to(kFloat32).requires_grad_();
  Tensor y64 = linear(x64, w64, b64), y32 = linear(x32, w32, b32);
  EXPECT_EQ(y32.dtype(), kFloat32);
  EXPECT_TRUE(all_close(y32, y64, 1e-5, 1e-5));
  Tensor g = rand(y64.shape(), gen, {.dtype = kFloat64});
  y64.backward(g);
  y32.backward(g.to(kFloat32));
  EXPECT_TRUE(all_close(x32.grad(), x64.grad(), 1e-5, 1e-5));
  EXPECT_TRUE(all_close(w32.grad(), w64.grad(), 1e-5, 1e-5));
  EXPECT_TRUE(all_close(b32.grad(), b64.grad(), 1e-5, 1e-5));
}

TEST(Linear, Errors) {
  Tensor x = zeros({2, 3}), w = zeros({4, 5}), b = zeros({4});
  EXPECT_ATTO_ERROR(linear(x, w, b),
                    "linear: input of shape [2, 3] has 3 features but weight of shape [4, 5] expects in_features = 5");
  EXPECT_ATTO_ERROR(linear(x, zeros({4, 3, 1})), "weight must be 2-D (out_features, in_features), got shape [4, 3, 1]");
  EXPECT_ATTO_ERROR(linear(scalar_tensor(1.0), zeros({4, 1})),
                    "input must be at least 1-D (..., in_features), got shape []");
  EXPECT_ATTO_ERROR(linear(x, zeros({4, 3}), zeros({5})),
                    "bias of shape [5] does not match weight of shape [4, 3] (expected [4])");
  EXPECT_ATTO_ERROR(linear(x, zeros({4, 3}), zeros({1, 4})), "bias of shape [1, 4] does not match");
  EXPECT_ATTO_ERROR(linear(x, zeros({4, 3}, {.dtype = kFloat64})), "linear: dtype mismatch");
  EXPECT_ATTO_ERROR(linear(x, zeros({4, 3}), zeros({4}, {.dtype = kFloat64})), "linear: dtype mismatch");
}
