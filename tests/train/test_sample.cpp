// Sampling (train/decode.h): temperature, top-k and top-p on hand-computed distributions, HF's order and tie rule,
// multinomial draws within statistical bounds, and sample() on a fixed model: reproducible for a seed, greedy at
// temperature 0, first-token frequencies matching the model's softmax, more tokens than the model's window.

#include <cmath>

#include "autograd/shape.h"
#include "nn/models.h"
#include "testing.h"
#include "train/decode.h"

using namespace attograd;
using namespace attograd::train;
using namespace attograd::testing;

namespace {

Tensor row(std::vector<double> v) {
  const auto n = static_cast<int64_t>(v.size());
  return from_vector(v, {n});
}

std::vector<double> softmax(const std::vector<double>& z) {
  double mx = z[0], total = 0;
  for (double x : z) mx = std::max(mx, x);
  std::vector<double> p;
  for (double x : z) total += std::exp(x - mx);
  for (double x : z) p.push_back(std::exp(x - mx) / total);
  return p;
}

void expect_probs(const std::vector<double>& got, const std::vector<double>& want) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], want[i], 1e-12) << "token " << i;
}

std::shared_ptr<nn::SequenceModel> stream_model() {
  Generator g(11);
  return nn::make_model("lm",
                        {.vocab = 7,
                         .layers = 1,
                         .d_model = 8,
                         .heads = 2,
                         .d_ff = 16,
                         .max_source_len = 3,
                         .max_target_len = 1,
                         .stream = true},
                        g);
}

}  // namespace

TEST(Sampling, TemperatureScalesTheLogits) {
  expect_probs(sampling_distribution(row({1, 2, 3, 4}), {}), softmax({1, 2, 3, 4}));
  expect_probs(sampling_distribution(row({1, 2, 3, 4}), {.temperature = 2}), softmax({0.5, 1, 1.5, 2}));
  expect_probs(sampling_distribution(row({1, 2, 3, 4}), {.temperature = 0.5}), softmax({2, 4, 6, 8}));
  // Temperature 0 is greedy: all the mass on the first maximum.
  expect_probs(sampling_distribution(row({1, 5, 5, 4}), {.temperature = 0}), {0, 1, 0, 0});
  // float32 logits give the same distribution as their float64 values.
  const std::vector<float> f = {0.25f, -1.5f, 3.0f};
  expect_probs(sampling_distribution(from_vector(f, {3}), {}), softmax({0.25, -1.5, 3.0}));
}

TEST(Sampling, TopKKeepsTheKLargestWithTies) {
  const double e3 = std::exp(3.0), e4 = std::exp(4.0);
  expect_probs(sampling_distribution(row({1, 2, 3, 4}), {.top_k = 2}), {0, 0, e3 / (e3 + e4), e4 / (e3 + e4)});
  expect_probs(sampling_distribution(row({1, 2, 3, 4}), {.top_k = 1}), {0, 0, 0, 1});
  expect_probs(sampling_distribution(row({1, 2, 3, 4}), {.top_k = 9}), softmax({1, 2, 3, 4}));  // k >= V: off
  // HF's mask removes logits below the k-th largest: a tie with the k-th is kept.
  expect_probs(sampling_distribution(row({1, 3, 3, 0}), {.top_k = 1}), {0, 0.5, 0.5, 0});
}

TEST(Sampling, TopPKeepsTheSmallestSetReachingP) {
  const std::vector<double> logits = {std::log(0.15), std::log(0.5), std::log(0.05), std::log(0.3)};
  expect_probs(sampling_distribution(row(logits), {.top_p = 1}), {0.15, 0.5, 0.05, 0.3});
  expect_probs(sampling_distribution(row(logits), {.top_p = 0.7}), {0, 0.5 / 0.8, 0, 0.3 / 0.8});
  expect_probs(sampling_distribution(row(logits), {.top_p = 0.9}), {0.15 / 0.95, 0.5 / 0.95, 0, 0.3 / 0.95});
  // Always at least the most likely token.
  expect_probs(sampling_distribution(row(logits), {.top_p = 0.01}), {0, 1, 0, 0});
  // HF's order: temperature, then top-k, then top-p on the renormalised rest. Top-2 leaves {0.5, 0.3} -> {0.625,
  // 0.375}; p = 0.6 then keeps only the first.
  expect_probs(sampling_distribution(row(logits), {.top_k = 2, .top_p = 0.6}), {0, 1, 0, 0});
  // With temperature 2 the probabilities are proportional to sqrt(p): top-p sees those.
  std::vector<double> sq = {std::sqrt(0.15), std::sqrt(0.5), std::sqrt(0.05), std::sqrt(0.3)};
  double total = 0;
  for (double x : sq) total += x;
  for (double& x : sq) x /= total;            // 0.2075, 0.3789, 0.1198, 0.2935
  const double kept = sq[1] + sq[3] + sq[0];  // 0.6725 < 0.7 after two tokens, 0.88 after three
  expect_probs(sampling_distribution(row(logits), {.temperature = 2, .top_p = 0.7}),
               {sq[0] / kept, sq[1] / kept, 0, sq[3] / kept});
}

TEST(Sampling, BadOptionsAreErrors) {
  EXPECT_ATTO_ERROR(sampling_distribution(row({1, 2}), {.temperature = -1}), "temperature must be >= 0");
  EXPECT_ATTO_ERROR(sampling_distribution(row({1, 2}), {.temperature = NAN}), "temperature");
  EXPECT_ATTO_ERROR(sampling_distribution(row({1, 2}), {.top_k = -1}), "top_k must be >= 0");
  EXPECT_ATTO_ERROR(sampling_distribution(row({1, 2}), {.top_p = 0}), "top_p must be in (0, 1]");
  EXPECT_ATTO_ERROR(sampling_distribution(row({1, 2}), {.top_p = 1.5}), "top_p must be in (0, 1]");
  Generator g(1);
  EXPECT_ATTO_ERROR(draw_token({0, 0}, g), "every probability is zero");
}

TEST(Sampling, DrawFrequenciesMatchTheDistribution) {
  const std::vector<double> p = {0.1, 0.0, 0.2, 0.3, 0.4};
  Generator g(2026);
  constexpr int kDraws = 40000;
  std::vector<int> count(p.size(), 0);
  for (int i = 0; i < kDraws; ++i) ++count[static_cast<size_t>(draw_token(p, g))];
  EXPECT_EQ(count[1], 0);  // a masked token is never drawn
  for (size_t v = 0; v < p.size(); ++v) {
    const double sigma = std::sqrt(p[v] * (1 - p[v]) / kDraws);
    EXPECT_NEAR(static_cast<double>(count[v]) / kDraws, p[v], 5 * sigma + 1e-12) << "token " << v;
  }
}

TEST(Sampling, SampleIsReproducibleAndGreedyAtTemperatureZero) {
  auto m = stream_model();
  const TokenRows prompts = {{4, 5}, {6}};
  Generator a(7), b(7), c(8);
  std::vector<std::pair<int64_t, int64_t>> streamed;
  const TokenRows x = sample(*m, prompts, 12, {}, a, [&](int64_t r, int64_t t) { streamed.emplace_back(r, t); });
  const TokenRows y = sample(*m, prompts, 12, {}, b);
  const TokenRows z = sample(*m, prompts, 12, {}, c);
  ASSERT_EQ(x.size(), 2u);
  EXPECT_EQ(x[0].size(), 12u);  // a stream model never stops early, and goes past its window of 3 tokens
  EXPECT_EQ(x[1].size(), 12u);
  EXPECT_EQ(x, y);  // same seed, same tokens
  EXPECT_NE(x, z);  // another seed, other tokens (24 draws from 7 tokens)
  ASSERT_EQ(streamed.size(), 24u);
  for (size_t i = 0; i < streamed.size(); ++i) {  // per step: row 0, then row 1
    EXPECT_EQ(streamed[i].first, static_cast<int64_t>(i % 2));
    EXPECT_EQ(streamed[i].second, x[i % 2][i / 2]);
  }
  Generator d(1);
  EXPECT_EQ(sample(*m, prompts, 12, {.temperature = 0}, d), greedy_decode(*m, prompts, 12));
  EXPECT_ATTO_ERROR(sample(*m, prompts, 0, {}, d), "max_new must be in [1");
  EXPECT_ATTO_ERROR(sample(*m, {{4, 99}}, 3, {}, d), "token 99 outside [0, 7)");
}

TEST(Sampling, FirstTokenFrequenciesFollowTheModel) {
  auto m = stream_model();
  auto& lm = static_cast<nn::CausalLM&>(*m);
  lm.eval();
  std::vector<double> logits;
  {
    NoGradGuard no_grad;
    const Tensor out = lm.forward(from_vector(std::vector<int64_t>{4, 5, 6}, {1, 3}));  // (1, 3, 7)
    for (int64_t v = 0; v < 7; ++v) logits.push_back(out.data<float>()[2 * 7 + v]);
  }
  // Temperature 0.5 and top-k 4: the distribution the draws must follow, computed here by hand.
  std::vector<double> sorted = logits;
  std::sort(sorted.rbegin(), sorted.rend());
  std::vector<double> scaled;
  for (double l : logits) scaled.push_back(l >= sorted[3] ? l / 0.5 : -INFINITY);
  const std::vector<double> want = softmax(scaled);
  Generator g(99);
  constexpr int kDraws = 3000;
  std::vector<int> count(7, 0);
  for (int i = 0; i < kDraws; ++i)
    ++count[static_cast<size_t>(sample(*m, {{4, 5, 6}}, 1, {.temperature = 0.5, .top_k = 4}, g)[0][0])];
  for (size_t v = 0; v < 7; ++v) {
    const double sigma = std::sqrt(want[v] * (1 - want[v]) / kDraws);
    EXPECT_NEAR(static_cast<double>(count[v]) / kDraws, want[v], 5 * sigma + 1e-12) << "token " << v;
  }
}
