// MultiheadAttention with RoPE (MultiheadAttentionOptions::rope): float64 goldens from PyTorch
// (tests/nn/golden_mha_rope.py: plain-PyTorch MHA + llama-style interleaved RoPE + repeat_interleave GQA) for the
// forward and every gradient; its agreement with rotating the projections by hand through the same fused op; the
// decode helper rotate_cached_rows_ at each row's own positions; and the refused combinations.

#include <string>
#include <vector>

#include "autograd/attention.h"
#include "autograd/reduce.h"
#include "autograd/rope.h"
#include "autograd/shape.h"
#include "nn/attention.h"
#include "nn_golden.h"
#include "testing.h"

using namespace attograd;
using namespace attograd::testing;
using namespace attograd::nn;

namespace {

void check_golden(const std::string& name) {
  SCOPED_TRACE(name);
  const auto g = load_golden("nn/mha_rope_" + name + ".golden");
  const std::vector<double> cfg = g.at("config").to_vector<double>();
  const auto E = static_cast<int64_t>(cfg[0]), H = static_cast<int64_t>(cfg[1]), Hkv = static_cast<int64_t>(cfg[2]);
  const bool causal = cfg[3] != 0.0;
  const auto offset = static_cast<int64_t>(cfg[4]);
  MultiheadAttention m({.embed_dim = E, .num_heads = H, .dtype = kFloat64, .num_kv_heads = Hkv, .rope = true});
  ASSERT_TRUE(m.rotary() != nullptr);
  const std::vector<std::string> names = {"in_proj_weight", "in_proj_bias", "out_proj.weight", "out_proj.bias"};
  ASSERT_EQ(m.named_parameters().size(), names.size());  // RoPE adds no parameter
  for (const std::string& n : names) {
    ASSERT_EQ(m.parameter(n).shape(), g.at(n).shape()) << n;
    copy_(m.parameter(n), g.at(n));
  }
  Tensor x = leaf(g.at("x"));
  MhaResult r = m(x, x, x, {.need_weights = false, .is_causal = causal, .rope_offset = offset});
  EXPECT_TRUE(all_close(r.output, g.at("output"), 1e-12, 1e-12));
  sum(r.output * g.at("grad_output")).backward();
  EXPECT_TRUE(all_close(x.grad(), g.at("grad.x"), 1e-12, 1e-12));
  for (const std::string& n : names) EXPECT_TRUE(all_close(m.parameter(n).grad(), g.at("grad." + n), 1e-12, 1e-12)) << n;
}

}  // namespace

TEST(MhaRope, GoldenGqaCausal) { check_golden("gqa_causal"); }
TEST(MhaRope, GoldenMhaOffset) { check_golden("mha_offset"); }
TEST(MhaRope, GoldenMqaCausal) { check_golden("mqa_causal"); }

TEST(MhaRope, EqualsRotatingTheProjectionsByHand) {
  // The module's RoPE path is the fused op on projections rotated by apply_rotary_emb: bitwise, with a window and
  // with a block layout too (the variants combine).
  Generator gen(4);
  for (int64_t window : {0, 2})
    for (int64_t block : {0, 2}) {
      if (window > 0 && block > 0) continue;
      SCOPED_TRACE("window " + std::to_string(window) + " block " + std::to_string(block));
      Generator init(8);
      MultiheadAttention m({.embed_dim = 16, .num_heads = 4, .dtype = kFloat64, .num_kv_heads = 2, .window = window, .block_size = block,
                            .block_global = block > 0 ? 1 : 0, .rope = true},
                           init);
      Tensor x = rand_leaf({2, 7, 16}, gen);
      MhaResult r = m(x, x, x, {.need_weights = false, .is_causal = true, .rope_offset = 2});
      std::vector<Tensor> qkv = split(linear(x, m.in_proj_weight, m.in_proj_bias), {16, 8, 8}, 2);
      AttentionOptions ao{.is_causal = true, .window = window, .num_kv_heads = 2};
      if (block > 0) {
        ao.block_size = block;
        ao.block_layout = bigbird_block_layout({.q_blocks = 4, .k_blocks = 4, .local_blocks = 1, .global_blocks = 1});
      }
      AttentionResult want = multi_head_attention(apply_rotary_emb(qkv[0], 2, 10000.0, 4),
                                                  apply_rotary_emb(qkv[1], 2, 10000.0, 4), qkv[2], 4, ao);
      EXPECT_TRUE(bitwise_equal(r.output, m.out_proj->forward(want.output)));
    }
}

TEST(MhaRope, SelfAttentionScoresDependOnRelativePositionsOnly) {
  // RoPE's point: shifting every position by the same offset leaves q . k unchanged (up to rounding).
  Generator gen(5);
  MultiheadAttention m({.embed_dim = 8, .num_heads = 2, .dtype = kFloat64, .rope = true}, gen);
  Tensor x = rand_leaf({1, 5, 8}, gen);
  NoGradGuard no_grad;
  const Tensor a = m(x, x, x, {.is_causal = true, .rope_offset = 0}).output;
  const Tensor b = m(x, x, x, {.is_causal = true, .rope_offset = 100}).output;
  EXPECT_TRUE(all_close(a, b, 1e-12, 1e-12));
}

TEST(MhaRope, RotateCachedRowsUsesEachRowsPositions) {
  // Row a's new positions start[a] + i, as the module's rotary table gives them: bitwise.
  Generator gen(6);
  RotaryEmbedding rot(4, 32);
  Tensor x = rand_leaf({2, 3, 20}, gen).detach();  // (A, N, W): 2 heads of 4 from feature 6
  Tensor y = x.clone();
  CachedAttentionRows rows{.cache_row = {0, 1}, .start = {5, 0}, .count = {3, 2}};
  rotate_cached_rows_(y, 6, 2, rot, rows);
  const Tensor r0 = rot.forward(narrow(narrow(x, 0, 0, 1), 2, 6, 8), 5);                   // (1, 3, 8)
  const Tensor r1 = rot.forward(narrow(narrow(narrow(x, 0, 1, 1), 1, 0, 2), 2, 6, 8), 0);  // (1, 2, 8)
  EXPECT_TRUE(bitwise_equal(narrow(narrow(y, 0, 0, 1), 2, 6, 8), r0));
  EXPECT_TRUE(bitwise_equal(narrow(narrow(narrow(y, 0, 1, 1), 1, 0, 2), 2, 6, 8), r1));
  // Features outside the heads and the padding position of row 1 are untouched.
  EXPECT_TRUE(bitwise_equal(narrow(y, 2, 0, 6), narrow(x, 2, 0, 6)));
  EXPECT_TRUE(bitwise_equal(narrow(y, 2, 14, 6), narrow(x, 2, 14, 6)));
  EXPECT_TRUE(bitwise_equal(narrow(narrow(y, 0, 1, 1), 1, 2, 1), narrow(narrow(x, 0, 1, 1), 1, 2, 1)));
  // Past the table (a ring decode past the context): the angles a longer table holds, bitwise.
  CachedAttentionRows far{.cache_row = {0, 1}, .start = {30, 0}, .count = {3, 1}};
  Tensor z = x.clone();
  rotate_cached_rows_(z, 6, 2, rot, far);
  RotaryEmbedding longer(4, 64);
  EXPECT_TRUE(bitwise_equal(narrow(narrow(z, 0, 0, 1), 2, 6, 8),
                            longer.forward(narrow(narrow(x, 0, 0, 1), 2, 6, 8), 30)));
}

TEST(MhaRope, RefusedCombinations) {
  EXPECT_ATTO_ERROR(MultiheadAttention({.embed_dim = 6, .num_heads = 2, .rope = true}), "even head_dim");
  EXPECT_ATTO_ERROR(MultiheadAttention({.embed_dim = 8, .num_heads = 2, .add_bias_kv = true, .rope = true}),
                    "add_bias_kv");
  MultiheadAttention m({.embed_dim = 8, .num_heads = 2, .dtype = kFloat64, .rope = true, .rope_max_len = 6});
  Generator gen(1);
  Tensor q = rand_leaf({1, 3, 8}, gen), kv = rand_leaf({1, 4, 8}, gen);
  EXPECT_ATTO_ERROR(m(q, kv, kv), "Lq == Lk");
  // Positions past the tables are computed per call (a ring decode past the context): relative, so the same
  // output as at offset 0.
  EXPECT_TRUE(all_close(m(q, q, q, {.is_causal = true, .rope_offset = 4}).output,
                        m(q, q, q, {.is_causal = true}).output, 1e-12, 1e-12));
  EXPECT_ATTO_ERROR(m(q, q, q, {.rope_offset = -1}), "rope_offset >= 0");
}
