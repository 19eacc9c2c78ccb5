// MultiheadAttention's attention variants (num_kv_heads, window, block-sparse; docs/ATTENTION.md): the parameters and
// their init, equality with plain multi-head attention (repeated key/value heads, the equivalent attn_mask), and
// gradchecks.

#include <cmath>
#include <vector>

#include "autograd/attention.h"
#include "autograd/elementwise.h"
#include "autograd/reduce.h"
#include "autograd/shape.h"
#include "nn/attention.h"
#include "nn_golden.h"
#include "testing.h"

using namespace attograd;
using namespace attograd::testing;
using namespace attograd::nn;

namespace {

// Rows [W_q; W_k; W_v] of a grouped-query in-projection (E + 2 Ekv, in) with each key/value head's rows repeated
// G times: the weights of a plain MultiheadAttention computing the same function.
Tensor repeat_kv_rows(const Tensor& w, int64_t E, int64_t Hkv, int64_t hd, int64_t G) {
  std::vector<Tensor> parts = split(w, std::vector<int64_t>{E, Hkv * hd, Hkv * hd}, 0);
  std::vector<Tensor> rows{parts[0]};
  for (int p = 1; p <= 2; ++p)
    for (int64_t h = 0; h < Hkv * G; ++h) rows.push_back(narrow(parts[p], 0, (h / G) * hd, hd));
  return cat(rows, 0);
}

// Copies the parameters of `from` into `to` (same names), through f for in-projection ones.
template <class F>
void load_from(MultiheadAttention& to, const MultiheadAttention& from, F f) {
  NoGradGuard ng;
  auto src = from.named_parameters();
  auto dst = to.named_parameters();
  ASSERT_EQ(src.size(), dst.size());
  for (size_t i = 0; i < src.size(); ++i) {
    ASSERT_EQ(src[i].first, dst[i].first);
    copy_(dst[i].second, src[i].first.rfind("out_proj", 0) == 0 ? src[i].second : f(src[i].first, src[i].second));
  }
}

}  // namespace

TEST(MultiheadAttentionVariants, DefaultsAreUnchanged) {
  Generator g1(5), g2(5);
  MultiheadAttention a({.embed_dim = 8, .num_heads = 2}, g1);
  MultiheadAttention b({.embed_dim = 8, .num_heads = 2, .num_kv_heads = 2}, g2);
  EXPECT_EQ(a.num_kv_heads(), 2);
  EXPECT_EQ(a.in_proj_weight.shape(), Shape({24, 8}));
  EXPECT_EQ(a.in_proj_weight.to_vector<float>(), b.in_proj_weight.to_vector<float>());
}

TEST(MultiheadAttentionVariants, GroupedQueryParametersAndInit) {
  Generator gen(4);
  const int64_t E = 64, H = 8, Hkv = 2, hd = E / H, Ekv = Hkv * hd;
  MultiheadAttention a({.embed_dim = E, .num_heads = H, .add_bias_kv = true, .num_kv_heads = Hkv}, gen);
  std::vector<std::string> names;
  for (const auto& [n, t] : a.named_parameters()) names.push_back(n);
  EXPECT_EQ(names, (std::vector<std::string>{"in_proj_weight", "in_proj_bias", "bias_k", "bias_v", "out_proj.weight",
                                             "out_proj.bias"}));
  EXPECT_EQ(a.in_proj_weight.shape(), Shape({E + 2 * Ekv, E}));
  EXPECT_EQ(a.in_proj_bias.shape(), Shape({E + 2 * Ekv}));
  EXPECT_EQ(a.bias_k.shape(), Shape({1, 1, Ekv}));
  // xavier_uniform_ on the whole (E + 2 Ekv, E) matrix: U(-b, b), b = sqrt(6 / (fan_in + fan_out)), variance b^2 / 3.
  const double bound = std::sqrt(6.0 / double(E + E + 2 * Ekv));
  double mx = 0, s2 = 0;
  const std::vector<double> w = a.in_proj_weight.to_vector<double>();
  for (double x : w) mx = std::max(mx, std::fabs(x)), s2 += x * x;
  EXPECT_LE(mx, bound);
  EXPECT_GT(mx, 0.99 * bound);
  EXPECT_NEAR(s2 / double(w.size()), bound * bound / 3.0, 0.05 * bound * bound / 3.0);
  for (double b : a.in_proj_bias.to_vector<double>()) EXPECT_EQ(b, 0.0);

  // Separate projections (kdim != E): each xavier_uniform_ on its own shape.
  MultiheadAttention c({.embed_dim = E, .num_heads = H, .kdim = 16, .num_kv_heads = 1}, gen);
  EXPECT_EQ(c.k_proj_weight.shape(), Shape({hd, 16}));
  EXPECT_EQ(c.v_proj_weight.shape(), Shape({hd, E}));
  const double kb = std::sqrt(6.0 / double(16 + hd));
  double kmx = 0;
  for (double x : c.k_proj_weight.to_vector<double>()) kmx = std::max(kmx, std::fabs(x));
  EXPECT_LE(kmx, kb);
  EXPECT_GT(kmx, 0.8 * kb);
}

// A grouped-query module computes what a plain module with each key/value head repeated computes (self-attention
// through the packed path, cross-attention with kdim != E through separate projections), gradients included.
TEST(MultiheadAttentionVariants, GroupedQueryEqualsRepeatedHeads) {
  for (bool self : {true, false}) {
    SCOPED_TRACE(self ? "self" : "cross");
    Generator gen(11);
    const int64_t E = 12, H = 6, Hkv = 2, hd = E / H, G = H / Hkv, kd = self ? 0 : 5;
    MultiheadAttention gqa({.embed_dim = E, .num_heads = H, .kdim = kd, .vdim = kd, .num_kv_heads = Hkv}, gen);
    MultiheadAttention mha({.embed_dim = E, .num_heads = H, .kdim = kd, .vdim = kd}, gen);
    gqa.to(kFloat64);
    mha.to(kFloat64);
    load_from(mha, gqa, [&](const std::string& name, const Tensor& t) {
      if (name == "in_proj_weight") return repeat_kv_rows(t, E, Hkv, hd, G);
      if (name == "in_proj_bias") return reshape(repeat_kv_rows(reshape(t, {t.numel(), 1}), E, Hkv, hd, G), {-1});
      if (name == "k_proj_weight" || name == "v_proj_weight") {
        std::vector<Tensor> rows;
        for (int64_t h = 0; h < H; ++h) rows.push_back(narrow(t, 0, (h / G) * hd, hd));
        return cat(rows, 0);
      }
      return t;
    });
    Tensor x = randn({2, 7, E}, gen, {.dtype = kFloat64}).requires_grad_();
    Tensor kv = self ? x : randn({2, 9, kd}, gen, {.dtype = kFloat64});
    MhaForwardOptions fo{.is_causal = self};
    MhaResult a = gqa(x, kv, kv, fo), b = mha(x, kv, kv, fo);
    EXPECT_TRUE(all_close(a.output, b.output, 1e-13, 1e-12));
    EXPECT_TRUE(all_close(a.weights, b.weights, 1e-13, 1e-12));
    sum(a.output * a.output).backward();
    Tensor gx = x.grad().clone();
    x.zero_grad();
    sum(b.output * b.output).backward();
    EXPECT_TRUE(all_close(gx, x.grad(), 1e-12, 1e-11));
    EXPECT_TRUE(all_close(gqa.out_proj->weight.grad(), mha.out_proj->weight.grad(), 1e-12, 1e-11));
  }
}

// window and block_size give what the plain module gives with the equivalent Bool attn_mask.
TEST(MultiheadAttentionVariants, WindowAndBlockSparseEqualTheEquivalentMask) {
  struct V {
    int64_t window, block, local, global, random;
    bool causal;
  };
  for (const V& c : {V{3, 0, 0, 0, 0, true}, V{2, 0, 0, 0, 0, false}, V{0, 4, 1, 1, 1, false},
                     V{5, 3, 0, 1, 2, true}}) {
    SCOPED_TRACE(c.window * 100 + c.block);
    const int64_t E = 8, H = 2, L = 19;
    Generator g1(3), g2(3);
    MultiheadAttentionOptions o{.embed_dim = E, .num_heads = H, .dtype = kFloat64, .num_kv_heads = 1};
    MultiheadAttention plain(o, g1);
    o.window = c.window, o.block_size = c.block, o.block_local = c.local, o.block_global = c.global,
    o.block_random = c.random, o.block_seed = 9;
    MultiheadAttention sparse(o, g2);
    Tensor lay = c.block ? bigbird_block_layout({.q_blocks = (L + c.block - 1) / c.block,
                                                 .k_blocks = (L + c.block - 1) / c.block,
                                                 .local_blocks = c.local,
                                                 .global_blocks = c.global,
                                                 .random_blocks = c.random,
                                                 .seed = 9})
                         : Tensor();
    Tensor mask = zeros({L, L}, {.dtype = kBool});
    for (int64_t i = 0; i < L; ++i)
      for (int64_t j = 0; j < L; ++j) {
        bool b = c.window > 0 && (c.causal ? j <= i - c.window : std::llabs(i - j) > c.window);
        if (c.block) b = b || !lay.data<bool>()[(i / c.block) * lay.size(1) + j / c.block];
        mask.data<bool>()[i * L + j] = b;
      }
    Generator gx(4);
    Tensor x = randn({2, L, E}, gx, {.dtype = kFloat64});
    MhaResult a = sparse(x, x, x, {.is_causal = c.causal});
    MhaResult b = plain(x, x, x, {.attn_mask = mask, .is_causal = c.causal});
    EXPECT_TRUE(all_close(a.output, b.output, 1e-13, 1e-12));
    EXPECT_TRUE(all_close(a.weights, b.weights, 1e-13, 1e-12));
  }
}

TEST(MultiheadAttentionVariants, Gradcheck) {
  Generator gen(20);
  MultiheadAttention mha({.embed_dim = 8, .num_heads = 4, .dtype = kFloat64, .num_kv_heads = 2, .window = 2,
                          .block_size = 2, .block_local = 1, .block_global = 1, .block_random = 1},
                         gen);
  Tensor x = rand_leaf({2, 5, 8}, gen);
  Tensor kpm = zeros({2, 5}, {.dtype = kBool});
  kpm.set({1, 1}, 1);
  MhaForwardOptions fo{.key_padding_mask = kpm, .is_causal = true};
  EXPECT_GRADCHECK([&] { return mha(x, x, x, fo).output; }, with_params({x}, mha, gen));
  MultiheadAttention cross({.embed_dim = 8, .num_heads = 4, .kdim = 3, .vdim = 5, .dtype = kFloat64,
                            .num_kv_heads = 1, .window = 1},
                           gen);
  Tensor k = rand_leaf({2, 6, 3}, gen), v = rand_leaf({2, 6, 5}, gen);
  EXPECT_GRADCHECK([&] { return cross(x, k, v).output; }, with_params({x, k, v}, cross, gen));
}

TEST(MultiheadAttentionVariants, Errors) {
  EXPECT_ATTO_ERROR(MultiheadAttention({.embed_dim = 8, .num_heads = 4, .num_kv_heads = 3}),
                    "num_kv_heads must divide num_heads (0 means num_heads), got num_kv_heads=3, num_heads=4");
  EXPECT_ATTO_ERROR(MultiheadAttention({.embed_dim = 8, .num_heads = 4, .window = -1}),
                    "window and the block options must be >= 0, got window=-1");
  EXPECT_ATTO_ERROR(MultiheadAttention({.embed_dim = 8, .num_heads = 4, .add_zero_attn = true, .window = 2}),
                    "window and block_size do not combine with add_bias_kv / add_zero_attn");
}
