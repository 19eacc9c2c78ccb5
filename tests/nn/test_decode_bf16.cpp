// Decoding under Autocast (bfloat16): decode_linear reads a DecodeWeightCache's bf16 copy of each weight (converted
// once) and computes what linear() computes under autocast (bf16 operands, float32 accumulation) up to float32
// summation order; without a cache it is linear() itself; cached greedy decoding in bf16 gives the recomputation's
// tokens, with logits within bf16 rounding.

#include <algorithm>
#include <cmath>

#include "autograd/autocast.h"
#include "autograd/gemm.h"
#include "autograd/matmul.h"
#include "decode_testing.h"
#include "nn/attention.h"
#include "nn/models.h"
#include "testing.h"

using namespace attograd;
using namespace attograd::testing;
using namespace attograd::nn;

namespace {

Tensor uniform(const Shape& s, Generator& gen) { return (rand(s, gen) * 2.0 - 1.0).detach(); }

double max_abs(const Tensor& t) {
  double m = 0;
  for (double v : t.to_vector<double>()) m = std::max(m, std::fabs(v));
  return m;
}

}  // namespace

TEST(DecodeBf16, DecodeLinearIsLinearUnderAutocast) {
  NoGradGuard no_grad;
  // Both kernels of this set: vdpbf16ps (where the CPU has it) and the widened weights.
  for (bool native : {true, false}) {
    SCOPED_TRACE(native ? "native path" : "portable path");
    attograd::detail::set_gemm_bf16_native(native);
    Generator gen(1);
    for (int64_t M : {1, 3, 16})
      for (auto [N, K] : {std::pair<int64_t, int64_t>{7, 5}, {36, 48}, {130, 515}, {45, 1024}}) {
        SCOPED_TRACE(str_cat("M ", M, " N ", N, " K ", K));
        const Tensor x = uniform({M, K}, gen), w = uniform({N, K}, gen), b = uniform({N}, gen);
        const Tensor plain = decode_linear(x, w, b);
        Autocast on;
        const Tensor reference = linear(x, w, b);                       // bf16 operands, float32 accumulation
        EXPECT_TRUE(bitwise_equal(decode_linear(x, w, b), reference));  // no cache: linear() itself
        DecodeWeightCache cache;
        const Tensor cached = decode_linear(x, w, b);
        EXPECT_EQ(cache.size(), 1u);
        EXPECT_TRUE(all_close(cached, reference, 1e-5, 1e-5));
        EXPECT_FALSE(all_close(cached, plain, 1e-4, 0));  // the operands really were rounded
        // Each row alone gives the same bits as with the others.
        EXPECT_TRUE(bitwise_equal(decode_linear(narrow(x, 0, 0, 1), w, b), narrow(cached, 0, 0, 1)));
        EXPECT_TRUE(all_close(decode_linear(x, w), linear(x, w), 1e-5, 1e-5));  // no bias
        EXPECT_EQ(cache.size(), 1u);                                            // the same weight: converted once
        {
          DecodeWeightCache inner;  // nested: the outer one serves
          decode_linear(x, uniform({N, K}, gen));
          EXPECT_EQ(cache.size(), 2u);
        }
      }
  }
  attograd::detail::set_gemm_bf16_native(true);
}

// A weight changed in place while the cache is alive is converted again (its storage version moved).
TEST(DecodeBf16, AWeightChangedInPlaceIsConvertedAgain) {
  NoGradGuard no_grad;
  Generator gen(3);
  const Tensor x = uniform({1, 32}, gen);
  const Tensor w = uniform({8, 32}, gen);
  Autocast on;
  DecodeWeightCache cache;
  const Tensor before = decode_linear(x, w);
  copy_(w, w * 2.0);
  const Tensor after = decode_linear(x, w);
  EXPECT_TRUE(all_close(after, before * 2.0, 1e-5, 1e-5));
  EXPECT_TRUE(all_close(after, linear(x, w), 1e-5, 1e-5));
  EXPECT_EQ(cache.size(), 1u);
}

// No input features: every output is the bias (zero without one), in every precision.
TEST(DecodeBf16, NoInputFeaturesGiveTheBias) {
  NoGradGuard no_grad;
  const Tensor x = zeros({2, 0}), w = zeros({3, 0}), b = from_vector(std::vector<float>{1.5f, -2.0f, 0.25f}, {3});
  const std::vector<float> expected = {1.5f, -2.0f, 0.25f, 1.5f, -2.0f, 0.25f};
  EXPECT_EQ(decode_linear(x, w, b).to_vector<float>(), expected);
  EXPECT_EQ(decode_linear(x, w).to_vector<float>(), std::vector<float>(6, 0.0f));
  Autocast on;
  DecodeWeightCache cache;
  EXPECT_EQ(decode_linear(x, w, b).to_vector<float>(), expected);
}

TEST(DecodeBf16, Float32AndFloat64OutsideAutocastAreUnchanged) {
  NoGradGuard no_grad;
  Generator gen(2);
  const Tensor x = uniform({2, 40}, gen), w = uniform({9, 40}, gen);
  const Tensor before = decode_linear(x, w);
  DecodeWeightCache cache;
  EXPECT_TRUE(bitwise_equal(decode_linear(x, w), before));
  EXPECT_EQ(cache.size(), 0u);
  const Tensor xd = x.to(kFloat64), wd = w.to(kFloat64);
  const Tensor d0 = decode_linear(xd, wd);
  Autocast on;
  EXPECT_TRUE(bitwise_equal(decode_linear(xd, wd), d0));
}

// Greedy decoding in bf16 from the cache (bf16 weight copies) against recomputing (linear's bf16 GEMM): the same
// tokens; logits within 4 bf16 ulps of their scale (2^-5 * max |logit|): each path's activations carry bf16
// rounding of the operands of every product, and a float32-sized difference between the paths can move an operand
// to the neighbouring bf16 value.
TEST(DecodeBf16, CachedEqualsRecomputedTokens) {
  for (const char* kind : {"lm", "lm-rope"}) {
    SCOPED_TRACE(kind);
    Generator gen(5);
    AttentionSpec attention;
    attention.rope = std::string(kind) == "lm-rope";
    CausalLM m(CausalLMOptions{.vocab = 13,
                               .d_model = 32,
                               .n_head = 4,
                               .d_ff = 48,
                               .n_layers = 2,
                               .dropout = 0.1,
                               .max_len = 24,
                               .attention = attention},
               gen);
    m.eval();
    Autocast on;
    DecodeWeightCache cache;
    const int64_t steps = m.max_decode_len() - 1;
    const DecodeTrace cached = run_greedy(m, kDecodeSources, steps, true);
    EXPECT_GT(cache.size(), 0u);
    const DecodeTrace full = run_greedy(m, kDecodeSources, steps, false);
    EXPECT_EQ(cached.decoded, full.decoded);
    ASSERT_EQ(cached.logits.size(), full.logits.size());
    for (size_t s = 0; s < full.logits.size(); ++s) {
      const double tol = std::ldexp(max_abs(full.logits[s]), -5);
      EXPECT_TRUE(all_close(cached.logits[s], full.logits[s], tol)) << "step " << s;
    }
  }
}
