// Every op fed with transposed (and permuted) inputs: the gradient must flow back through the
// transpose to the original leaf. Tensors are always contiguous here, so this checks that each
// op's backward and the transpose's backward compose, for ops whose own tests use plain leaves.

#include "testing.h"

using namespace attograd;
using namespace attograd::testing;

namespace {
// A (3, 4) leaf seen as (4, 3).
struct T {
  Generator gen{17};
  Tensor a = rand_leaf({3, 4}, gen, 0.2, 1.5);
  Tensor b = rand_leaf({4, 3}, gen, 0.2, 1.5);
  Tensor at() const { return transpose(a, 0, 1); }
};
}  // namespace

TEST(Transposed, Elementwise) {
  T t;
  EXPECT_GRADCHECK([&] { return t.at() * t.b + t.at() / t.b - t.b; }, {t.a, t.b});
  EXPECT_GRADCHECK([&] { return -t.at() * 2.0 + 1.0; }, {t.a});
}

TEST(Transposed, Activations) {
  T t;
  EXPECT_GRADCHECK([&] { return exp(t.at()) + log(t.at()) + sqrt(t.at()) + pow(t.at(), 3.0); }, {t.a});
  EXPECT_GRADCHECK([&] { return tanh(t.at()) + sigmoid(t.at()) + relu(t.at()) + gelu(t.at()) + abs(t.at()); },
                   {t.a});
}

TEST(Transposed, MatmulAndLinear) {
  T t;
  EXPECT_GRADCHECK([&] { return matmul(t.at(), t.a); }, {t.a});
  Tensor bias = rand_leaf({4}, t.gen);
  EXPECT_GRADCHECK([&] { return linear(t.at(), t.b, bias); }, {t.a, t.b, bias});
}

TEST(Transposed, ShapeOps) {
  T t;
  EXPECT_GRADCHECK([&] { return reshape(t.at(), {2, 6}); }, {t.a});
  EXPECT_GRADCHECK([&] { return slice(t.at(), 0, 1, 4, 2); }, {t.a});
  EXPECT_GRADCHECK([&] { return cat({t.at(), t.b}, 1); }, {t.a, t.b});
  EXPECT_GRADCHECK([&] { return stack({t.at(), t.b}, 0); }, {t.a, t.b});
  EXPECT_GRADCHECK([&] { return split(t.at(), 2, 0)[1] * 3.0; }, {t.a});
  EXPECT_GRADCHECK([&] { return permute(reshape(t.at(), {2, 2, 3}), {2, 0, 1}); }, {t.a});
}

TEST(Transposed, Reductions) {
  T t;
  EXPECT_GRADCHECK([&] { return sum(t.at(), {0}); }, {t.a});
  EXPECT_GRADCHECK([&] { return mean(t.at(), {1}, true); }, {t.a});
  EXPECT_GRADCHECK([&] { return max(t.at(), 1).values; }, {t.a});
}

TEST(Transposed, NormsLossesAndMasks) {
  T t;
  EXPECT_GRADCHECK([&] { return softmax(t.at(), 1) + log_softmax(t.at(), 0); }, {t.a});
  Tensor w = rand_leaf({3}, t.gen), bb = rand_leaf({3}, t.gen);
  EXPECT_GRADCHECK([&] { return layer_norm(t.at(), {3}, w, bb); }, {t.a, w, bb});
  Tensor target = from_vector<int64_t>({0, 2, 1, -100});
  EXPECT_GRADCHECK([&] { return cross_entropy(t.at(), target, {.label_smoothing = 0.1}); }, {t.a});
  EXPECT_GRADCHECK([&] { return mse_loss(t.at(), t.b); }, {t.a, t.b});
  Tensor mask = from_vector<bool>({true, false, false, false, true, false, false, false, true, true, false, false},
                                  {4, 3});
  EXPECT_GRADCHECK([&] { return masked_fill(t.at(), mask, 0.5) + where(mask, t.b, t.at()); }, {t.a, t.b});
}

TEST(Transposed, DropoutAndEmbedding) {
  T t;
  EXPECT_GRADCHECK(
      [&] {
        Generator g(5);
        return dropout(t.at(), 0.3, true, g);
      },
      {t.a});
  Tensor idx = from_vector<int64_t>({3, 0, 3, 1}, {2, 2});
  EXPECT_GRADCHECK([&] { return embedding(t.at(), idx); }, {t.a});
}

TEST(Transposed, Attention) {
  Generator gen(3);
  // q, k, v as (B, H, L, d) built by permuting (B, L, H, d) leaves, as multi-head attention does.
  Tensor q = rand_leaf({1, 3, 2, 2}, gen), k = rand_leaf({1, 4, 2, 2}, gen), v = rand_leaf({1, 4, 2, 3}, gen);
  auto heads = [](const Tensor& x) { return permute(x, {0, 2, 1, 3}); };
  EXPECT_GRADCHECK(
      [&] {
        Generator g(9);
        return scaled_dot_product_attention(heads(q), heads(k), heads(v),
                                            {.is_causal = true, .dropout_p = 0.2, .generator = &g})
            .output;
      },
      {q, k, v});
}
