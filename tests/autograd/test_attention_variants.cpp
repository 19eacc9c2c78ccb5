// Grouped-query / multi-query, sliding-window and block-sparse attention (AttentionOptions::window, block_size,
// block_layout, num_kv_heads): PyTorch goldens (tests/autograd/golden_attention_variants.py), equality with dense
// attention under the equivalent Bool mask (float64, forward and gradients), float32 against float64, the same bits
// for any thread count, and the checks of the new options.

#include <cmath>
#include <string>
#include <vector>

#include "autograd/attention.h"
#include "autograd/parallel.h"
#include "testing.h"

using namespace attograd;
using namespace attograd::testing;

namespace {

// The pattern's own blocking of (i, j) (true = blocked): causality, the window and the block layout.
bool pattern_blocks(const AttentionOptions& o, int64_t i, int64_t j) {
  bool b = o.is_causal && j > i;
  if (o.window > 0) b = b || (o.is_causal ? j <= i - o.window : std::llabs(i - j) > o.window);
  if (o.block_size > 0) {
    const bool* lay = o.block_layout.data<bool>();
    b = b || !lay[(i / o.block_size) * o.block_layout.size(1) + j / o.block_size];
  }
  return b;
}

// The dense options equivalent to `o`: the pattern (window, layout, causality) folded into a Bool (B, 1, Lq, Lk)
// attn_mask together with o's own Bool mask (given here as (B, 1, Lq, Lk) or undefined).
AttentionOptions dense_equivalent(const AttentionOptions& o, int64_t B, int64_t Lq, int64_t Lk) {
  Tensor m = zeros({B, 1, Lq, Lk}, {.dtype = kBool});
  bool* mp = m.data<bool>();
  const bool* user = o.attn_mask.defined() ? o.attn_mask.data<bool>() : nullptr;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t i = 0; i < Lq; ++i)
      for (int64_t j = 0; j < Lk; ++j) {
        const int64_t f = (b * Lq + i) * Lk + j;
        mp[f] = (user && user[f]) || pattern_blocks(o, i, j);
      }
  AttentionOptions d = o;
  d.attn_mask = m;
  d.is_causal = false;
  d.window = 0;
  d.block_size = 0;
  d.block_layout = Tensor();
  return d;
}

// A random Bool layout (rows, cols) with about `density` of its blocks computed.
Tensor random_layout(int64_t rows, int64_t cols, double density, Generator& gen) {
  Tensor t = zeros({rows, cols}, {.dtype = kBool});
  for (int64_t x = 0; x < rows * cols; ++x) t.data<bool>()[x] = gen.uniform() < density;
  return t;
}

struct Case {
  std::string name;
  int64_t B, H, Hkv, Lq, Lk, dk, dv;
  bool causal;
  int64_t window;
  int64_t block;     // 0 = no layout
  int layout;        // 0 = BigBird, 1 = random
  double dropout;
  bool user_mask;    // a random Bool (B, 1, Lq, Lk) attn_mask as well
  bool need_weights;
};

void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

struct Outputs {
  Tensor out, weights, dq, dk, dv;
};

Outputs run(const Case& c, const AttentionOptions& o, Dtype dt, uint64_t seed = 1) {
  Generator gen(seed);
  Tensor q = randn({c.B, c.H, c.Lq, c.dk}, gen, {.dtype = dt}).requires_grad_();
  Tensor k = randn({c.B, c.Hkv, c.Lk, c.dk}, gen, {.dtype = dt}).requires_grad_();
  Tensor v = randn({c.B, c.Hkv, c.Lk, c.dv}, gen, {.dtype = dt}).requires_grad_();
  Tensor g = randn({c.B, c.H, c.Lq, c.dv}, gen, {.dtype = dt});
  AttentionOptions oo = o;
  Generator drop(77);
  oo.generator = &drop;
  AttentionResult r = scaled_dot_product_attention(q, k, v, oo);
  r.output.backward(g);
  return {r.output, r.weights, q.grad(), k.grad(), v.grad()};
}

AttentionOptions options_of(const Case& c) {
  AttentionOptions o{.is_causal = c.causal, .dropout_p = c.dropout, .need_weights = c.need_weights,
                     .window = c.window};
  Generator gen(c.Lq * 131 + c.Lk);
  if (c.user_mask) {
    Tensor m = zeros({c.B, 1, c.Lq, c.Lk}, {.dtype = kBool});
    for (int64_t x = 0; x < m.numel(); ++x) m.data<bool>()[x] = gen.uniform() < 0.2;
    o.attn_mask = m;
  }
  if (c.block > 0) {
    const int64_t rows = (c.Lq + c.block - 1) / c.block, cols = (c.Lk + c.block - 1) / c.block;
    o.block_size = c.block;
    o.block_layout = c.layout == 0 ? bigbird_block_layout({.q_blocks = rows, .k_blocks = cols, .local_blocks = 1,
                                                           .global_blocks = 1, .random_blocks = 1, .seed = 3})
                                   : random_layout(rows, cols, 0.4, gen);
  }
  return o;
}

const std::vector<Case>& cases() {
  static const std::vector<Case> all = {
      // name, B, H, Hkv, Lq, Lk, dk, dv, causal, window, block, layout, dropout, user_mask, need_weights
      {"window_causal", 2, 2, 2, 150, 150, 8, 6, true, 20, 0, 0, 0.0, false, true},
      {"window", 1, 3, 3, 140, 140, 5, 7, false, 17, 0, 0, 0.0, false, true},
      {"window_wide", 1, 2, 2, 40, 40, 4, 4, false, 100, 0, 0, 0.0, false, false},  // window wider than L
      {"window_one", 1, 2, 2, 70, 70, 4, 4, true, 1, 0, 0, 0.0, false, false},     // each row sees itself only
      {"window_lq_lt_lk", 2, 2, 2, 70, 130, 6, 5, false, 9, 0, 0, 0.0, false, false},
      {"window_lq_gt_lk_causal", 1, 2, 2, 130, 70, 6, 5, true, 12, 0, 0, 0.0, false, false},
      {"window_mask_dropout", 2, 2, 2, 100, 100, 8, 8, true, 16, 0, 0, 0.3, true, true},
      {"gqa_window", 2, 4, 2, 90, 90, 8, 8, true, 24, 0, 0, 0.0, false, false},
      {"mqa_window_dropout", 1, 3, 1, 80, 80, 4, 6, false, 11, 0, 0, 0.2, false, false},
      {"block_bigbird", 2, 2, 2, 150, 150, 8, 8, false, 0, 16, 0, 0.0, false, true},
      {"block_bigbird_causal", 1, 2, 2, 161, 161, 8, 8, true, 0, 16, 0, 0.0, false, false},  // ragged last block
      {"block_random_lq_ne_lk", 2, 2, 2, 75, 110, 6, 5, false, 0, 10, 1, 0.0, true, true},
      {"block_big", 1, 2, 2, 200, 200, 4, 4, false, 0, 70, 1, 0.0, false, false},  // blocks taller than 64 rows
      {"block_window_gqa_dropout", 2, 4, 2, 130, 130, 8, 8, true, 20, 16, 1, 0.25, true, true},
      {"block_mqa", 1, 4, 1, 96, 96, 8, 8, false, 0, 8, 0, 0.0, false, false},
      // Grouped-query attention on the dense path (no window, no layout).
      {"gqa_dense_causal_dropout", 2, 4, 2, 100, 100, 8, 8, true, 0, 0, 0, 0.1, false, true},
      {"mqa_dense_mask", 1, 4, 1, 90, 120, 8, 6, false, 0, 0, 0, 0.0, true, false},
  };
  return all;
}

class SparseAttention : public ::testing::TestWithParam<Case> {};

// The sparse kernels equal dense attention with the equivalent Bool mask: forward, weights and gradients in float64
// (the sums run over different sets of keys, so not bitwise), dropout included (the mask is a function of
// (b, h, i, j) only).
TEST_P(SparseAttention, EqualsDenseWithEquivalentMask) {
  const Case& c = GetParam();
  const AttentionOptions o = options_of(c);
  Outputs s = run(c, o, kFloat64), d = run(c, dense_equivalent(o, c.B, c.Lq, c.Lk), kFloat64);
  EXPECT_TRUE(all_close(s.out, d.out, 1e-12, 1e-12));
  EXPECT_TRUE(all_close(s.dq, d.dq, 1e-12, 1e-11));
  EXPECT_TRUE(all_close(s.dk, d.dk, 1e-12, 1e-11));
  EXPECT_TRUE(all_close(s.dv, d.dv, 1e-12, 1e-11));
  if (c.need_weights) {
    EXPECT_TRUE(all_close(s.weights, d.weights, 1e-12, 1e-12));
  }
  // Not vacuous: the pattern does block something and leaves something open.
  EXPECT_GT(max(abs(s.out)).item<double>(), 0.1);
}

// float32 agrees with float64 (and the saved-probabilities path of short sequences with the recomputing one).
TEST_P(SparseAttention, Float32MatchesFloat64) {
  const Case& c = GetParam();
  const AttentionOptions o = options_of(c);
  Outputs s32 = run(c, o, kFloat32), s64 = run(c, o, kFloat64);
  EXPECT_TRUE(all_close(s32.out.to(kFloat64), s64.out, 1e-5, 1e-4));
  EXPECT_TRUE(all_close(s32.dq.to(kFloat64), s64.dq, 1e-4, 1e-3));
  EXPECT_TRUE(all_close(s32.dk.to(kFloat64), s64.dk, 1e-4, 1e-3));
  EXPECT_TRUE(all_close(s32.dv.to(kFloat64), s64.dv, 1e-4, 1e-3));
}

// The same bits for 1 and 2 threads (shared key/value heads sum their query heads in a fixed order).
TEST_P(SparseAttention, SameBitsForAnyThreadCount) {
  const Case& c = GetParam();
  const AttentionOptions o = options_of(c);
  const int before = get_num_threads();
  set_num_threads(1);
  Outputs a = run(c, o, kFloat32);
  set_num_threads(2);
  Outputs b = run(c, o, kFloat32);
  set_num_threads(before);
  EXPECT_TRUE(bitwise_equal(a.out, b.out));
  EXPECT_TRUE(bitwise_equal(a.dq, b.dq));
  EXPECT_TRUE(bitwise_equal(a.dk, b.dk));
  EXPECT_TRUE(bitwise_equal(a.dv, b.dv));
}

INSTANTIATE_TEST_SUITE_P(Cases, SparseAttention, ::testing::ValuesIn(cases()),
                         [](const auto& info) { return info.param.name; });

// PyTorch 1.13 goldens: k.repeat_interleave(H / H_kv, dim=-3) (and v), windows as the equivalent mask.
class AttentionGolden : public ::testing::TestWithParam<std::string> {};

TEST_P(AttentionGolden, MatchesPyTorch) {
  auto g = load_golden("autograd/attention_" + GetParam() + ".golden");
  const int64_t* cfg = g["config"].data<int64_t>();
  Tensor q = g["q"].requires_grad_(), k = g["k"].requires_grad_(), v = g["v"].requires_grad_();
  ASSERT_EQ(k.size(1), cfg[2]);
  AttentionOptions o{.is_causal = cfg[7] != 0, .window = cfg[8]};
  Tensor out = scaled_dot_product_attention(q, k, v, o).output;
  EXPECT_TRUE(all_close(out, g["output"], 1e-13, 1e-12));
  out.backward(g["grad_output"]);
  EXPECT_TRUE(all_close(q.grad(), g["grad.q"], 1e-13, 1e-12));
  EXPECT_TRUE(all_close(k.grad(), g["grad.k"], 1e-13, 1e-12));
  EXPECT_TRUE(all_close(v.grad(), g["grad.v"], 1e-13, 1e-12));
}

INSTANTIATE_TEST_SUITE_P(Cases, AttentionGolden,
                         ::testing::Values("gqa", "mqa_causal", "gqa_window_causal", "gqa_window"));

// Grouped-query attention reads the shared head in place: its forward is bitwise the forward on K, V with the heads
// repeated (a copy), and the gradient of a shared head is the sum of the repeated heads' gradients.
TEST(GroupedQueryAttention, EqualsRepeatedHeads) {
  for (Dtype dt : {kFloat32, kFloat64}) {
    Generator gen(4);
    const int64_t B = 2, H = 6, Hkv = 2, G = H / Hkv, L = 70, d = 8;
    Tensor q = randn({B, H, L, d}, gen, {.dtype = dt}).requires_grad_();
    Tensor k = randn({B, Hkv, L, d}, gen, {.dtype = dt}).requires_grad_();
    Tensor v = randn({B, Hkv, L, d}, gen, {.dtype = dt}).requires_grad_();
    std::vector<Tensor> kparts, vparts;
    for (int64_t h = 0; h < H; ++h) {
      kparts.push_back(narrow(k.detach(), 1, h / G, 1));
      vparts.push_back(narrow(v.detach(), 1, h / G, 1));
    }
    Tensor kr = cat(kparts, 1).requires_grad_(), vr = cat(vparts, 1).requires_grad_();
    AttentionOptions o{.is_causal = true, .dropout_p = 0.2};
    Generator g1(3), g2(3);
    o.generator = &g1;
    Tensor a = scaled_dot_product_attention(q, k, v, o).output;
    Tensor q2 = q.detach().clone().requires_grad_();
    o.generator = &g2;
    Tensor r = scaled_dot_product_attention(q2, kr, vr, o).output;
    EXPECT_TRUE(bitwise_equal(a, r));
    Tensor go = randn(a.shape(), gen, {.dtype = dt});
    a.backward(go);
    r.backward(go);
    EXPECT_TRUE(bitwise_equal(q.grad(), q2.grad()));
    Tensor dk = sum(reshape(kr.grad(), {B, Hkv, G, L, d}), {2}), dv = sum(reshape(vr.grad(), {B, Hkv, G, L, d}), {2});
    const double tol = dt == kFloat32 ? 1e-5 : 1e-13;
    EXPECT_TRUE(all_close(k.grad(), dk, tol, tol));
    EXPECT_TRUE(all_close(v.grad(), dv, tol, tol));
  }
}

// multi_head_attention and packed_self_attention with num_kv_heads agree bit for bit with
// scaled_dot_product_attention on the split heads.
TEST(GroupedQueryAttention, HeadInterleavedEntryPointsMatch) {
  Generator gen(8);
  const int64_t B = 2, H = 4, Hkv = 2, L = 33, d = 8;
  Tensor qkv = randn({B, L, (H + 2 * Hkv) * d}, gen).requires_grad_();
  AttentionOptions o{.is_causal = true, .dropout_p = 0.1, .window = 5, .num_kv_heads = Hkv};
  Generator g1(5), g2(5), g3(5);
  o.generator = &g1;
  Tensor packed = packed_self_attention(qkv, H, o).output;
  Tensor x = qkv.detach().clone().requires_grad_();
  std::vector<Tensor> parts = split(x, std::vector<int64_t>{H * d, Hkv * d, Hkv * d}, 2);
  o.generator = &g2;
  Tensor mha = multi_head_attention(parts[0], parts[1], parts[2], H, o).output;
  auto heads = [](const Tensor& t, int64_t n) {
    return transpose(reshape(t, {t.size(0), t.size(1), n, t.size(2) / n}), 1, 2);
  };
  Tensor y = qkv.detach().clone().requires_grad_();
  std::vector<Tensor> yp = split(y, std::vector<int64_t>{H * d, Hkv * d, Hkv * d}, 2);
  o.generator = &g3;
  o.num_kv_heads = 0;
  Tensor by = scaled_dot_product_attention(heads(yp[0], H), heads(yp[1], Hkv), heads(yp[2], Hkv), o).output;
  by = reshape(transpose(by, 1, 2), {B, L, H * d});
  EXPECT_EQ(packed.shape(), (Shape{B, L, H * d}));
  EXPECT_TRUE(bitwise_equal(packed, mha));
  EXPECT_TRUE(bitwise_equal(packed, by));
  Tensor go = randn(packed.shape(), gen);
  packed.backward(go);
  mha.backward(go);
  by.backward(go);
  EXPECT_TRUE(bitwise_equal(qkv.grad(), x.grad()));
  EXPECT_TRUE(bitwise_equal(qkv.grad(), y.grad()));
}

// Rows that the pattern and the mask leave without keys give zero outputs, weights and gradients (never NaN).
TEST(SparseAttentionOp, FullyBlockedRowsAreZero) {
  Generator gen(2);
  const int64_t L = 40, d = 4, b = 8;
  Tensor q = randn({1, 1, L, d}, gen, {.dtype = kFloat64}).requires_grad_();
  Tensor k = randn({1, 1, L, d}, gen, {.dtype = kFloat64}).requires_grad_();
  Tensor v = randn({1, 1, L, d}, gen, {.dtype = kFloat64}).requires_grad_();
  Tensor lay = ones({L / b, L / b}, {.dtype = kBool});
  for (int64_t c = 0; c < L / b; ++c) lay.data<bool>()[1 * (L / b) + c] = false;  // query block 1 sees nothing
  Tensor mask = zeros({L, L}, {.dtype = kBool});
  for (int64_t j = 0; j < L; ++j) mask.data<bool>()[30 * L + j] = j >= 27;  // row 30's window [27, 30] is masked
  AttentionOptions o{.attn_mask = mask, .is_causal = true, .need_weights = true, .window = 4, .block_size = b,
                     .block_layout = lay};
  AttentionResult r = scaled_dot_product_attention(q, k, v, o);
  r.output.backward(ones(r.output.shape(), {.dtype = kFloat64}));
  for (int64_t i : {8L, 12L, 15L, 30L}) {
    SCOPED_TRACE(i);
    for (int64_t x = 0; x < d; ++x) {
      EXPECT_EQ(r.output.data<double>()[i * d + x], 0.0);
      EXPECT_EQ(q.grad().data<double>()[i * d + x], 0.0);
    }
    for (int64_t j = 0; j < L; ++j) EXPECT_EQ(r.weights.data<double>()[i * L + j], 0.0);
  }
  EXPECT_NE(r.output.data<double>()[16 * d], 0.0);  // the next block is open again
  for (int64_t x = 0; x < L * d; ++x) EXPECT_TRUE(std::isfinite(q.grad().data<double>()[x]));
}

TEST(SparseAttentionOp, Gradcheck) {
  Generator gen(31);
  Tensor q = rand_leaf({1, 4, 11, 3}, gen), k = rand_leaf({1, 2, 9, 3}, gen), v = rand_leaf({1, 2, 9, 2}, gen);
  auto window = [&]() { return scaled_dot_product_attention(q, k, v, {.is_causal = true, .window = 3}).output; };
  EXPECT_GRADCHECK(window, {q, k, v});
  Tensor lay = bigbird_block_layout({.q_blocks = 3, .k_blocks = 3, .local_blocks = 0, .global_blocks = 1});
  Tensor fmask = randn({11, 9}, gen, {.dtype = kFloat64});
  auto block = [&]() {
    Generator g(7);
    AttentionOptions o{.attn_mask = fmask, .dropout_p = 0.3, .generator = &g, .window = 4, .block_size = 4};
    o.block_layout = lay;
    return scaled_dot_product_attention(q, k, v, o).output;
  };
  EXPECT_GRADCHECK(block, {q, k, v});
}

TEST(BigBirdBlockLayout, BandGlobalAndRandomBlocks) {
  Tensor a = bigbird_block_layout(
      {.q_blocks = 10, .k_blocks = 12, .local_blocks = 1, .global_blocks = 2, .random_blocks = 3, .seed = 9});
  Tensor b = bigbird_block_layout(
      {.q_blocks = 10, .k_blocks = 12, .local_blocks = 1, .global_blocks = 2, .random_blocks = 3, .seed = 9});
  Tensor c = bigbird_block_layout(
      {.q_blocks = 10, .k_blocks = 12, .local_blocks = 1, .global_blocks = 2, .random_blocks = 3, .seed = 10});
  EXPECT_EQ(a.dtype(), kBool);
  EXPECT_EQ(a.shape(), (Shape{10, 12}));
  EXPECT_TRUE(bitwise_equal(a, b));
  EXPECT_FALSE(bitwise_equal(a, c));
  const bool* m = a.data<bool>();
  for (int64_t r = 0; r < 10; ++r) {
    int64_t fixed = 0, count = 0;
    for (int64_t col = 0; col < 12; ++col) {
      const bool band_or_global = r < 2 || col < 2 || std::llabs(r - col) <= 1;
      if (band_or_global) {
        EXPECT_TRUE(m[r * 12 + col]) << r << ", " << col;
        ++fixed;
      }
      count += m[r * 12 + col];
    }
    EXPECT_EQ(count, std::min<int64_t>(12, fixed + 3)) << "row " << r;  // exactly 3 random blocks where room
  }
  EXPECT_ATTO_ERROR(bigbird_block_layout({.q_blocks = -1}), "block counts must be >= 0");
}

TEST(SparseAttentionOp, Errors) {
  Tensor q = zeros({1, 4, 10, 3}), k = zeros({1, 2, 10, 3}), v = zeros({1, 2, 10, 3});
  EXPECT_ATTO_ERROR(scaled_dot_product_attention(q, zeros({1, 3, 10, 3}), zeros({1, 3, 10, 3})),
                    "batch/head dimensions differ: q [1, 4, 10, 3], k [1, 3, 10, 3], v [1, 3, 10, 3] (dimension 1: 4, "
                    "3, 3); k and v may have H_kv heads dividing q's H");
  EXPECT_ATTO_ERROR(scaled_dot_product_attention(q, k, zeros({1, 4, 10, 3})), "batch/head dimensions differ");
  EXPECT_ATTO_ERROR(scaled_dot_product_attention(q, k, v, {.num_kv_heads = 4}),
                    "num_kv_heads = 4 differs from the heads of k [1, 2, 10, 3]");
  EXPECT_ATTO_ERROR(scaled_dot_product_attention(q, k, v, {.window = -1}), "window must be >= 0 (0 = off), got -1");
  EXPECT_ATTO_ERROR(scaled_dot_product_attention(q, k, v, {.block_size = -2}), "block_size must be >= 0");
  EXPECT_ATTO_ERROR(scaled_dot_product_attention(q, k, v, {.block_size = 4}),
                    "block_size (4) and block_layout (undefined) go together");
  EXPECT_ATTO_ERROR(scaled_dot_product_attention(q, k, v, {.block_layout = ones({3, 3}, {.dtype = kBool})}),
                    "block_size (0) and block_layout (given) go together");
  EXPECT_ATTO_ERROR(
      scaled_dot_product_attention(q, k, v, {.block_size = 4, .block_layout = ones({2, 3}, {.dtype = kBool})}),
      "block_layout must be bool (ceil(Lq / block_size), ceil(Lk / block_size)) = [3, 3] for Lq = 10, Lk = 10, "
      "block_size = 4, got bool [2, 3]");
  EXPECT_ATTO_ERROR(scaled_dot_product_attention(q, k, v, {.block_size = 4, .block_layout = ones({3, 3})}),
                    "got float32 [3, 3]");
  Tensor x = zeros({2, 5, 8});
  EXPECT_ATTO_ERROR(multi_head_attention(x, x, x, 4, {.num_kv_heads = 3}),
                    "num_kv_heads = 3 must be positive and divide num_heads = 4");
  EXPECT_ATTO_ERROR(multi_head_attention(x, x, zeros({2, 5, 4}), 4, {.num_kv_heads = 2}),
                    "d_k mismatch: q [2, 5, 8] and k [2, 5, 8] must have d_k = 2 features per head (k has 2 heads)");
  EXPECT_ATTO_ERROR(packed_self_attention(zeros({2, 5, 14}), 4, {.num_kv_heads = 2}),
                    "qkv must be 3-D (B, L, (H + 2 H_kv) d) holding [q | k | v] in its last dimension, got [2, 5, 14] "
                    "for H = 4, H_kv = 2");
  EXPECT_ATTO_ERROR(packed_self_attention(zeros({2, 5, 16}), 4, {.num_kv_heads = 3}),
                    "num_kv_heads = 3 must be positive and divide num_heads = 4");
}

}  // namespace
