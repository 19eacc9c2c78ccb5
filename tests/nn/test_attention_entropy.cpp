// MultiheadAttention's attention entropies (MhaForwardOptions::need_entropy -> MhaResult::entropy) and the
// regulariser attention_entropy_loss on them: the entropies of the module's own weights, rows with no key, and a
// gradient step with lambda > 0 raising the mean entropy.

#include <cmath>
#include <vector>

#include "autograd/attention.h"
#include "autograd/elementwise.h"
#include "autograd/reduce.h"
#include "nn/attention.h"
#include "testing.h"

using namespace attograd;
using namespace attograd::testing;
using namespace attograd::nn;

namespace {

// -sum_j w_j log w_j per row of weights (B, H, Lq, Lk), 0 log 0 = 0.
std::vector<double> entropies_of(const Tensor& w) {
  const int64_t Lk = w.size(3), rows = w.numel() / Lk;
  std::vector<double> h(rows, 0.0);
  const std::vector<double> x = w.to_vector<double>();
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = 0; j < Lk; ++j)
      if (x[r * Lk + j] > 0) h[r] -= x[r * Lk + j] * std::log(x[r * Lk + j]);
  return h;
}

// The module's entropies are those of its own (per-head) attention weights, for plain and grouped-query heads,
// with a key padding mask (a batch row whose keys are all padding has entropy 0 and no gradient).
TEST(MultiheadAttentionEntropy, EqualsEntropyOfItsWeights) {
  for (int64_t Hkv : {4, 2}) {
    Generator gen(21);
    const int64_t B = 2, L = 9, E = 16, H = 4;
    MultiheadAttention mha({.embed_dim = E, .num_heads = H, .dtype = kFloat64, .num_kv_heads = Hkv}, gen);
    Tensor x = randn({B, L, E}, gen, {.dtype = kFloat64}).requires_grad_();
    Tensor pad = zeros({B, L}, {.dtype = kBool});
    for (int64_t j = 5; j < L; ++j) pad.data<bool>()[j] = true;   // batch 0: keys 5.. are padding
    for (int64_t j = 0; j < L; ++j) pad.data<bool>()[L + j] = true;  // batch 1: every key is padding
    MhaResult r = mha.forward(x, x, x,
                              {.key_padding_mask = pad, .average_attn_weights = false, .need_entropy = true});
    ASSERT_EQ(r.entropy.shape(), Shape({B, H, L}));
    const std::vector<double> want = entropies_of(r.weights);
    const std::vector<double> got = r.entropy.to_vector<double>();
    for (size_t i = 0; i < want.size(); ++i) EXPECT_NEAR(got[i], want[i], 1e-12) << i;
    for (int64_t i = 0; i < H * L; ++i) EXPECT_EQ(got[H * L + i], 0.0);  // batch 1: no key
    EXPECT_GT(*std::max_element(got.begin(), got.end()), 1.0);          // batch 0 rows spread over 5 keys
    EXPECT_LE(*std::max_element(got.begin(), got.end()), std::log(5.0) + 1e-12);
    sum(r.entropy).backward();
    const std::vector<double> gx = x.grad().to_vector<double>();
    double batch0 = 0;
    for (int64_t i = 0; i < L * E; ++i) batch0 = std::max(batch0, std::fabs(gx[i]));
    EXPECT_GT(batch0, 1e-4);
    for (int64_t i = L * E; i < 2 * L * E; ++i) EXPECT_EQ(gx[i], 0.0);
  }
}

// Without need_entropy nothing changes and no entropy is returned.
TEST(MultiheadAttentionEntropy, OffByDefault) {
  Generator gen(4);
  MultiheadAttention mha({.embed_dim = 8, .num_heads = 2}, gen);
  Tensor x = randn({1, 5, 8}, gen);
  MhaResult a = mha.forward(x, x, x), b = mha.forward(x, x, x, {.need_entropy = true});
  EXPECT_FALSE(a.entropy.defined());
  EXPECT_TRUE(bitwise_equal(a.output, b.output));
  EXPECT_TRUE(bitwise_equal(a.weights, b.weights));
}

// One SGD step on attention_entropy_loss with lambda > 0 raises the mean entropy on a fixed input (the heads spread
// out); lambda < 0 lowers it.
TEST(MultiheadAttentionEntropy, PositiveLambdaStepRaisesMeanEntropy) {
  auto change = [](double lambda) {
    Generator gen(8);
    const int64_t E = 16;
    MultiheadAttention mha({.embed_dim = E, .num_heads = 4}, gen);
    Tensor x = mul(randn({2, 12, E}, gen), 2.0);
    auto mean_entropy = [&]() {
      return mha.forward(x, x, x, {.need_weights = false, .is_causal = true, .need_entropy = true}).entropy;
    };
    Tensor e0 = mean_entropy();
    const double before = mean(e0).item<double>();
    attention_entropy_loss(e0, lambda).backward();
    for (Tensor& p : mha.parameters()) {  // SGD, learning rate 0.5
      if (!p.grad().defined()) continue;
      float* w = p.data<float>();
      const float* g = p.grad().data<float>();
      for (int64_t i = 0; i < p.numel(); ++i) w[i] -= 0.5f * g[i];
    }
    return mean(mean_entropy()).item<double>() - before;
  };
  EXPECT_GT(change(1.0), 1e-3);
  EXPECT_LT(change(-1.0), -1e-3);
}

}  // namespace
