// nn::Checkpointed: the same state_dict keys as the block, and gradients bitwise equal to the plain blocks' with
// dropout on (TransformerEncoderLayer stacks, post-LN and pre-LN with masks, and CausalLM's blocks).

#include <gtest/gtest.h>

#include "autograd/allocator.h"
#include "autograd/elementwise.h"
#include "autograd/reduce.h"
#include "nn/checkpointed.h"
#include "nn/masks.h"
#include "nn/models.h"
#include "nn/transformer.h"
#include "testing.h"

namespace attograd::nn {
namespace {

using testing::bitwise_equal;

// Runs loss = sum(stack(x) * w) forward and backward with the dropout generator seeded; returns x's gradient then
// every parameter's (by name), and clears them.
template <class Forward>
std::vector<std::pair<std::string, Tensor>> grads_of(Module& params_of, Tensor x, const Tensor& w, Generator& drop,
                                                     Forward forward) {
  manual_seed(99);
  drop.manual_seed(1234);
  Tensor loss = sum(mul(forward(mul(x, 1.0)), w));
  loss.backward();
  std::vector<std::pair<std::string, Tensor>> g{{"x", x.grad().clone()}};
  x.zero_grad(true);
  for (auto& [n, p] : params_of.named_parameters()) {
    EXPECT_TRUE(p.grad().defined()) << n;
    if (p.grad().defined()) g.emplace_back(n, p.grad().clone());
  }
  params_of.zero_grad(true);
  return g;
}

void expect_bitwise(const std::vector<std::pair<std::string, Tensor>>& a,
                    const std::vector<std::pair<std::string, Tensor>>& b) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].first, b[i].first);
    EXPECT_TRUE(bitwise_equal(a[i].second, b[i].second)) << a[i].first;
  }
}

TEST(Checkpointed, KeepsTheBlocksNamesAndValues) {
  Generator gen(1);
  auto layer = std::make_shared<TransformerEncoderLayer>(
      TransformerLayerOptions{.d_model = 8, .nhead = 2, .dim_feedforward = 16, .dropout = 0.1}, gen);
  Checkpointed<TransformerEncoderLayer> ck(layer);
  const StateDict a = layer->state_dict(), b = ck.state_dict();
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].first, b[i].first);
    EXPECT_TRUE(a[i].second.is_same(b[i].second)) << a[i].first;
  }
  ck.eval();
  EXPECT_FALSE(layer->linear1->is_training());
}

class CheckpointedStack : public ::testing::TestWithParam<bool> {};

TEST_P(CheckpointedStack, EncoderLayersGiveBitwiseEqualGradientsWithDropout) {
  const bool norm_first = GetParam();
  Generator gen(2), drop(3);
  ModuleList plain, wrapped;
  for (int i = 0; i < 3; ++i) {
    auto layer = std::make_shared<TransformerEncoderLayer>(
        TransformerLayerOptions{
            .d_model = 16, .nhead = 4, .dim_feedforward = 32, .dropout = 0.2, .norm_first = norm_first},
        gen);
    plain.push_back(layer);
    wrapped.push_back(std::make_shared<Checkpointed<TransformerEncoderLayer>>(layer));
  }
  plain.set_generator(drop);
  wrapped.set_generator(drop);
  Tensor x = rand({2, 6, 16}, gen).requires_grad_(true);
  Tensor w = rand({2, 6, 16}, gen);
  Tensor kpm = from_vector(std::vector<bool>{false, false, false, false, false, false,  //
                                             false, false, false, false, true, true},
                           {2, 6});
  const EncoderForwardOptions masks{.src_mask = causal_mask(6), .src_key_padding_mask = kpm, .is_causal = true};
  auto run_plain = [&](Tensor h) {
    for (size_t i = 0; i < plain.size(); ++i) h = plain.at<TransformerEncoderLayer>(i)->forward(h, masks);
    return h;
  };
  auto run_ckpt = [&](Tensor h) {
    for (size_t i = 0; i < wrapped.size(); ++i)
      h = wrapped.at<Checkpointed<TransformerEncoderLayer>>(i)->forward_with(h, masks);
    return h;
  };
  const auto a = grads_of(plain, x, w, drop, run_plain);
  const auto b = grads_of(wrapped, x, w, drop, run_ckpt);
  expect_bitwise(a, b);
  // Evaluation and the plain forward(x) (no masks) give the same values too.
  wrapped.eval();
  plain.eval();
  NoGradGuard no_grad;
  EXPECT_TRUE(bitwise_equal(wrapped.at<Checkpointed<TransformerEncoderLayer>>(0)->forward(x),
                            plain.at<TransformerEncoderLayer>(0)->forward(x)));
}

INSTANTIATE_TEST_SUITE_P(PostAndPreLN, CheckpointedStack, ::testing::Values(false, true));

TEST(Checkpointed, CausalLMBlocksOnTheDefaultGeneratorGiveBitwiseEqualGradients) {
  // CausalLM's blocks draw their dropout from default_generator() unless set_generator() says otherwise.
  Generator gen(4), unused(5);
  const CausalLMOptions o{.vocab = 11, .d_model = 16, .n_head = 2, .d_ff = 32, .n_layers = 4, .dropout = 0.1};
  ModuleList plain, wrapped;
  for (int i = 0; i < 4; ++i) {
    auto block = std::make_shared<CausalLMBlock>(o, gen);
    plain.push_back(block);
    wrapped.push_back(std::make_shared<Checkpointed<CausalLMBlock>>(block));
  }
  Tensor x = rand({3, 7, 16}, gen).requires_grad_(true);
  Tensor w = rand({3, 7, 16}, gen);
  auto run = [&](ModuleList& list) {
    return [&list](Tensor h) {
      for (size_t i = 0; i < list.size(); ++i) h = list.at<Module>(i)->forward(h);
      return h;
    };
  };
  const auto a = grads_of(plain, x, w, unused, run(plain));
  const GeneratorState after = default_generator().get_state();
  const auto b = grads_of(wrapped, x, w, unused, run(wrapped));
  EXPECT_EQ(default_generator().get_state(), after);
  expect_bitwise(a, b);
}

TEST(Checkpointed, AnInputWithoutGradFallsBackToAPlainForward) {
  Generator gen(6);
  auto block = std::make_shared<CausalLMBlock>(
      CausalLMOptions{.vocab = 5, .d_model = 8, .n_head = 2, .d_ff = 16, .dropout = 0.0}, gen);
  Checkpointed<CausalLMBlock> ck(block);
  Tensor x = rand({1, 3, 8}, gen);
  Tensor y = ck.forward(x);
  EXPECT_NE(y.grad_fn_name(), "checkpoint");
  sum(y).backward();
  EXPECT_TRUE(block->norm1->parameter("weight").grad().defined());
}

TEST(Checkpointed, RefusesAnotherArgumentThatRequiresGrad) {
  Generator gen(7);
  auto block = std::make_shared<CausalLMBlock>(
      CausalLMOptions{.vocab = 5, .d_model = 8, .n_head = 2, .d_ff = 16, .dropout = 0.0}, gen);
  Checkpointed<CausalLMBlock> ck(block);
  Tensor x = rand({1, 3, 8}, gen).requires_grad_(true);
  EXPECT_ATTO_ERROR(ck.forward_with(x, rand({1, 3}, gen).requires_grad_(true)), "would get no gradient");
  EXPECT_NO_THROW(ck.forward_with(x, Tensor()));
}

TEST(Checkpointed, AStackKeepsLessThanHalfTheActivations) {
  // The allocator's peak above the step's start (parameters and gradient buffers exist before: a warm-up step).
  Generator gen(8);
  const CausalLMOptions o{.vocab = 5, .d_model = 32, .n_head = 4, .d_ff = 128, .dropout = 0.1};
  std::vector<std::shared_ptr<CausalLMBlock>> blocks;
  std::vector<std::shared_ptr<Checkpointed<CausalLMBlock>>> wrapped;
  for (int i = 0; i < 6; ++i) {
    blocks.push_back(std::make_shared<CausalLMBlock>(o, gen));
    wrapped.push_back(std::make_shared<Checkpointed<CausalLMBlock>>(blocks.back()));
  }
  Tensor x = rand({4, 64, 32}, gen).requires_grad_(true);
  auto peak = [&](bool ckpt) {
    reset_peak_allocator_stats();
    const size_t base = allocator_stats().allocated_bytes;
    {
      Tensor h = mul(x, 1.0);
      for (size_t i = 0; i < blocks.size(); ++i) h = ckpt ? wrapped[i]->forward(h) : blocks[i]->forward(h);
      Tensor loss = mean(mul(h, h));
      h = Tensor();
      loss.backward();
    }
    const size_t p = allocator_stats().peak_allocated_bytes - base;
    x.zero_grad();
    for (auto& b : blocks) b->zero_grad();
    return static_cast<double>(p);
  };
  peak(false);  // warm-up: the gradient buffers
  const double plain = peak(false), ck = peak(true);
  EXPECT_GT(plain / ck, 2.0) << "plain " << plain << " bytes, checkpointed " << ck << " bytes";
}

}  // namespace
}  // namespace attograd::nn
