// The attention-entropy option of the fused attention (AttentionOptions::need_entropy -> AttentionResult::entropy)
// and attention_entropy_loss: equal to a composed float64 reference (softmax, then -sum p log p with the masks),
// forward and gradients through q, k and v, on the dense, causal, masked, windowed, block-sparse and grouped-query
// paths, with the short (kept probabilities) and long (recomputed) backward; the same bits for any thread count; the
// results without it unchanged.

#include <cmath>
#include <string>
#include <vector>

#include "autograd/activation.h"
#include "autograd/attention.h"
#include "autograd/elementwise.h"
#include "autograd/indexing.h"
#include "autograd/matmul.h"
#include "autograd/norm.h"
#include "autograd/parallel.h"
#include "autograd/reduce.h"
#include "autograd/shape.h"
#include "testing.h"

using namespace attograd;
using namespace attograd::testing;

namespace {

struct Case {
  std::string name;
  int64_t B, H, Hkv, Lq, Lk, d;
  bool causal;
  int64_t window;
  int64_t block;        // 0 = no layout (else a random layout of about half the blocks)
  bool user_mask;       // a random Bool (B, 1, Lq, Lk) mask with one fully blocked row
  double dropout;
};

void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

const std::vector<Case>& cases() {
  static const std::vector<Case> all = {
      // name, B, H, Hkv, Lq, Lk, d, causal, window, block, user_mask, dropout
      {"dense_short", 2, 2, 2, 20, 24, 5, false, 0, 0, false, 0.0},  // probabilities kept by the forward
      {"dense_long", 1, 2, 2, 90, 100, 6, false, 0, 0, false, 0.0},  // recomputed block by block
      {"causal", 1, 3, 3, 100, 100, 4, true, 0, 0, false, 0.0},
      {"masked_short", 2, 2, 2, 30, 40, 4, false, 0, 0, true, 0.0},
      {"masked_long_dropout", 2, 2, 2, 80, 70, 4, false, 0, 0, true, 0.2},
      {"window", 1, 2, 2, 120, 120, 4, false, 9, 0, false, 0.0},
      {"window_causal_short", 1, 2, 2, 40, 40, 4, true, 5, 0, false, 0.0},
      {"block_sparse", 1, 2, 2, 100, 100, 4, false, 0, 16, false, 0.0},
      {"block_sparse_causal_mask", 2, 2, 2, 50, 50, 4, true, 0, 8, true, 0.0},
      {"gqa_causal", 2, 4, 2, 70, 70, 4, true, 0, 0, false, 0.0},
      {"mqa_window_block_dropout", 1, 4, 1, 90, 90, 4, true, 20, 16, true, 0.25},
  };
  return all;
}

AttentionOptions options_of(const Case& c) {
  AttentionOptions o{.is_causal = c.causal, .dropout_p = c.dropout, .window = c.window, .need_entropy = true};
  Generator gen(c.Lq * 7 + c.Lk);
  if (c.user_mask) {
    Tensor m = zeros({c.B, 1, c.Lq, c.Lk}, {.dtype = kBool});
    bool* mp = m.data<bool>();
    for (int64_t x = 0; x < m.numel(); ++x) mp[x] = gen.uniform() < 0.3;
    for (int64_t j = 0; j < c.Lk; ++j) mp[3 * c.Lk + j] = true;  // row 3 of batch 0 sees no key
    o.attn_mask = m;
  }
  if (c.block > 0) {
    const int64_t rows = (c.Lq + c.block - 1) / c.block, cols = (c.Lk + c.block - 1) / c.block;
    Tensor lay = zeros({rows, cols}, {.dtype = kBool});
    for (int64_t x = 0; x < rows * cols; ++x) lay.data<bool>()[x] = gen.uniform() < 0.5;
    o.block_size = c.block;
    o.block_layout = lay;
  }
  return o;
}

// (B, 1, Lq, Lk) Bool, true = blocked: the user mask, causality, the window and the block layout.
Tensor blocked_of(const Case& c, const AttentionOptions& o) {
  Tensor m = zeros({c.B, 1, c.Lq, c.Lk}, {.dtype = kBool});
  bool* mp = m.data<bool>();
  const bool* user = o.attn_mask.defined() ? o.attn_mask.data<bool>() : nullptr;
  for (int64_t b = 0; b < c.B; ++b)
    for (int64_t i = 0; i < c.Lq; ++i)
      for (int64_t j = 0; j < c.Lk; ++j) {
        const int64_t f = (b * c.Lq + i) * c.Lk + j;
        bool x = (user && user[f]) || (o.is_causal && j > i);
        if (o.window > 0) x = x || (o.is_causal ? j <= i - o.window : std::llabs(i - j) > o.window);
        if (o.block_size > 0)
          x = x || !o.block_layout.data<bool>()[(i / o.block_size) * o.block_layout.size(1) + j / o.block_size];
        mp[f] = x;
      }
  return m;
}

// The composed reference: H = -sum_j p_j log p_j of p = softmax(q k^T scale) with the blocked keys at -inf (k's
// heads repeated for grouped-query attention), 0 for rows with no key (their scores are left open so that the
// softmax stays finite, then the row is multiplied by 0).
Tensor reference_entropy(const Case& c, const Tensor& q, const Tensor& k, const Tensor& blocked) {
  std::vector<Tensor> heads;
  for (int64_t h = 0; h < c.H; ++h) heads.push_back(select(k, 1, h / (c.H / c.Hkv)));
  Tensor kr = stack(heads, 1);  // (B, H, Lk, d)
  Tensor s = mul(matmul(q, transpose(kr, 2, 3)), 1.0 / std::sqrt(static_cast<double>(c.d)));
  Tensor has_key = logical_not(eq(sum(blocked.to(kFloat64), {3}, true), static_cast<double>(c.Lk)));  // (B,1,Lq,1)
  Tensor eff = logical_and(blocked, has_key);
  Tensor p = softmax(masked_fill(s, eff, -INFINITY), 3);
  Tensor plogp = mul(p, log(where(gt(p, 0.0), p, 1.0)));
  return mul(neg(sum(plogp, {3})), squeeze(has_key.to(kFloat64), 3));  // (B, H, Lq)
}

struct Fused {
  Tensor out, ent, dq, dk, dv;
};

// The fused op; the backward of sum(out * g) (when g is defined) + sum(entropy * ge) (when ge is defined).
Fused fused(const Case& c, const AttentionOptions& o, Dtype dt, const Tensor& g, const Tensor& ge) {
  Generator gen(5);
  Tensor q = randn({c.B, c.H, c.Lq, c.d}, gen, {.dtype = dt}).requires_grad_();
  Tensor k = randn({c.B, c.Hkv, c.Lk, c.d}, gen, {.dtype = dt}).requires_grad_();
  Tensor v = randn({c.B, c.Hkv, c.Lk, c.d}, gen, {.dtype = dt}).requires_grad_();
  AttentionOptions oo = o;
  Generator drop(77);
  oo.generator = &drop;
  AttentionResult r = scaled_dot_product_attention(q, k, v, oo);
  Tensor loss;
  if (g.defined()) loss = sum(mul(r.output, g.to(dt)));
  if (ge.defined()) {
    Tensor le = sum(mul(r.entropy, ge.to(dt)));
    loss = loss.defined() ? add(loss, le) : le;
  }
  loss.backward();
  return {r.output, r.entropy, q.grad(), k.grad(), v.grad()};
}

class AttentionEntropy : public ::testing::TestWithParam<Case> {};

// Forward and the entropy's gradients equal the composed float64 reference; v gets exactly no gradient from it.
TEST_P(AttentionEntropy, EqualsComposedReference) {
  const Case& c = GetParam();
  const AttentionOptions o = options_of(c);
  Generator gen(5);
  Tensor q = randn({c.B, c.H, c.Lq, c.d}, gen, {.dtype = kFloat64}).requires_grad_();
  Tensor k = randn({c.B, c.Hkv, c.Lk, c.d}, gen, {.dtype = kFloat64}).requires_grad_();
  Generator g2(9);
  Tensor ge = randn({c.B, c.H, c.Lq}, g2, {.dtype = kFloat64});
  Tensor ref = reference_entropy(c, q, k, blocked_of(c, o));
  sum(mul(ref, ge)).backward();

  Fused f = fused(c, o, kFloat64, Tensor(), ge);
  ASSERT_EQ(f.ent.shape(), Shape({c.B, c.H, c.Lq}));
  EXPECT_TRUE(all_close(f.ent, ref, 1e-12, 1e-12));
  EXPECT_TRUE(all_close(f.dq, q.grad(), 1e-12, 1e-10));
  EXPECT_TRUE(all_close(f.dk, k.grad(), 1e-12, 1e-10));
  EXPECT_EQ(max(abs(f.dv)).item<double>(), 0.0);
  // Not vacuous: the rows do spread (entropy well above 0) and the gradient is there.
  EXPECT_GT(max(f.ent).item<double>(), 1.0);
  EXPECT_GT(max(abs(f.dq)).item<double>(), 1e-3);
  if (c.user_mask) {  // row 3 of batch 0 sees no key: entropy 0, zero gradient
    for (int64_t h = 0; h < c.H; ++h) {
      EXPECT_EQ(f.ent.data<double>()[h * c.Lq + 3], 0.0);
      for (int64_t x = 0; x < c.d; ++x) EXPECT_EQ(f.dq.data<double>()[(h * c.Lq + 3) * c.d + x], 0.0);
    }
  }
}

// The output's and the entropy's gradients in one backward equal the sum of each alone (output alone through the
// fused op, entropy alone through the reference).
TEST_P(AttentionEntropy, CombinedGradientIsTheSum) {
  const Case& c = GetParam();
  const AttentionOptions o = options_of(c);
  Generator g2(9);
  Tensor ge = randn({c.B, c.H, c.Lq}, g2, {.dtype = kFloat64});
  Tensor g = randn({c.B, c.H, c.Lq, c.d}, g2, {.dtype = kFloat64});
  Fused both = fused(c, o, kFloat64, g, ge), out_only = fused(c, o, kFloat64, g, Tensor()),
      ent_only = fused(c, o, kFloat64, Tensor(), ge);
  EXPECT_TRUE(all_close(both.dq, add(out_only.dq, ent_only.dq), 1e-12, 1e-11));
  EXPECT_TRUE(all_close(both.dk, add(out_only.dk, ent_only.dk), 1e-12, 1e-11));
  EXPECT_TRUE(bitwise_equal(both.dv, out_only.dv));
}

// With the option on and only the output used, output and gradients are bitwise those without the option.
TEST_P(AttentionEntropy, OutputUnchangedByTheOption) {
  const Case& c = GetParam();
  AttentionOptions on = options_of(c), off = on;
  off.need_entropy = false;
  Generator g2(9);
  Tensor g = randn({c.B, c.H, c.Lq, c.d}, g2, {.dtype = kFloat32});
  Fused a = fused(c, on, kFloat32, g, Tensor()), b = fused(c, off, kFloat32, g, Tensor());
  EXPECT_FALSE(b.ent.defined());
  EXPECT_TRUE(bitwise_equal(a.out, b.out));
  EXPECT_TRUE(bitwise_equal(a.dq, b.dq));
  EXPECT_TRUE(bitwise_equal(a.dk, b.dk));
  EXPECT_TRUE(bitwise_equal(a.dv, b.dv));
}

// The same bits for 1 and 2 threads; float32 close to float64.
TEST_P(AttentionEntropy, SameBitsForAnyThreadCountAndFloat32Close) {
  const Case& c = GetParam();
  const AttentionOptions o = options_of(c);
  Generator g2(9);
  Tensor ge = randn({c.B, c.H, c.Lq}, g2, {.dtype = kFloat64});
  Tensor g = randn({c.B, c.H, c.Lq, c.d}, g2, {.dtype = kFloat64});
  const int before = get_num_threads();
  set_num_threads(1);
  Fused a = fused(c, o, kFloat32, g, ge);
  set_num_threads(2);
  Fused b = fused(c, o, kFloat32, g, ge);
  set_num_threads(before);
  EXPECT_TRUE(bitwise_equal(a.ent, b.ent));
  EXPECT_TRUE(bitwise_equal(a.dq, b.dq));
  EXPECT_TRUE(bitwise_equal(a.dk, b.dk));
  EXPECT_TRUE(bitwise_equal(a.dv, b.dv));
  Fused d = fused(c, o, kFloat64, g, ge);
  EXPECT_TRUE(all_close(a.ent.to(kFloat64), d.ent, 1e-5, 1e-5));
  EXPECT_TRUE(all_close(a.dq.to(kFloat64), d.dq, 1e-4, 1e-3));
  EXPECT_TRUE(all_close(a.dk.to(kFloat64), d.dk, 1e-4, 1e-3));
}

INSTANTIATE_TEST_SUITE_P(Cases, AttentionEntropy, ::testing::ValuesIn(cases()),
                         [](const auto& info) { return info.param.name; });

// The backward that recomputes the probabilities gives the same bits as the one that reads the kept ones.
TEST(AttentionEntropyOp, KeptAndRecomputedProbabilitiesAgree) {
  const Case& c = cases()[0];  // dense_short: kept by default
  const AttentionOptions o = options_of(c);
  Generator g2(9);
  Tensor ge = randn({c.B, c.H, c.Lq}, g2, {.dtype = kFloat64});
  Tensor g = randn({c.B, c.H, c.Lq, c.d}, g2, {.dtype = kFloat64});
  Fused kept = fused(c, o, kFloat32, g, ge);
  const int64_t before = detail::attention_saved_probs_limit();
  detail::attention_saved_probs_limit() = 0;
  Fused rec = fused(c, o, kFloat32, g, ge);
  detail::attention_saved_probs_limit() = before;
  EXPECT_TRUE(bitwise_equal(kept.ent, rec.ent));
  EXPECT_TRUE(bitwise_equal(kept.dq, rec.dq));
  EXPECT_TRUE(bitwise_equal(kept.dk, rec.dk));
}

TEST(AttentionEntropyOp, Gradcheck) {
  Generator gen(31);
  Tensor q = rand_leaf({1, 4, 7, 3}, gen), k = rand_leaf({1, 2, 9, 3}, gen), v = rand_leaf({1, 2, 9, 2}, gen);
  Tensor mask = zeros({7, 9}, {.dtype = kBool});
  for (int64_t j = 0; j < 9; ++j) mask.data<bool>()[2 * 9 + j] = true;  // row 2 blocked
  mask.data<bool>()[4 * 9 + 1] = true;
  auto dense = [&]() {
    AttentionResult r = scaled_dot_product_attention(q, k, v, {.attn_mask = mask, .need_entropy = true});
    return add(sum(mul(r.entropy, r.entropy)), sum(mul(r.output, r.output)));
  };
  EXPECT_GRADCHECK(dense, {q, k, v});
  auto window = [&]() {
    return scaled_dot_product_attention(q, k, v, {.is_causal = true, .window = 3, .need_entropy = true}).entropy;
  };
  EXPECT_GRADCHECK(window, {q, k, v});
}

// multi_head_attention, packed_self_attention and 3-D inputs return the same entropies as the 4-D op.
TEST(AttentionEntropyOp, EntryPointsAgree) {
  Generator gen(3);
  const int64_t B = 2, H = 4, Hkv = 2, L = 12, d = 3;
  Tensor q = randn({B, L, H * d}, gen, {.dtype = kFloat64}), k = randn({B, L, Hkv * d}, gen, {.dtype = kFloat64}),
         v = randn({B, L, Hkv * d}, gen, {.dtype = kFloat64});
  AttentionOptions o{.is_causal = true, .num_kv_heads = Hkv, .need_entropy = true};
  Tensor mha = multi_head_attention(q, k, v, H, o).entropy;
  Tensor packed = packed_self_attention(cat({q, k, v}, 2), H, o).entropy;
  auto heads = [&](const Tensor& x, int64_t h) { return transpose(reshape(x, {B, L, h, d}), 1, 2); };
  AttentionOptions o4 = o;
  o4.num_kv_heads = 0;
  Tensor ref = scaled_dot_product_attention(heads(q, H), heads(k, Hkv), heads(v, Hkv), o4).entropy;
  ASSERT_EQ(mha.shape(), Shape({B, H, L}));
  EXPECT_TRUE(bitwise_equal(mha, ref));
  EXPECT_TRUE(bitwise_equal(packed, ref));
  Tensor e3 = scaled_dot_product_attention(select(heads(q, H), 1, 0), select(heads(k, Hkv), 1, 0),
                                           select(heads(v, Hkv), 1, 0), o4)
                  .entropy;
  ASSERT_EQ(e3.shape(), Shape({B, L}));
  EXPECT_TRUE(bitwise_equal(e3, select(ref, 1, 0)));
  // Causal row 0 sees one key: entropy exactly 0; row i <= log(i + 1).
  for (int64_t i = 0; i < L; ++i) EXPECT_LE(ref.data<double>()[i], std::log(static_cast<double>(i + 1)) + 1e-12);
  EXPECT_EQ(ref.data<double>()[0], 0.0);
}

Tensor bools(std::initializer_list<int> v, const Shape& shape) {
  Tensor t = zeros(shape, {.dtype = kBool});
  int64_t x = 0;
  for (int b : v) t.data<bool>()[x++] = b != 0;
  return t;
}

TEST(AttentionEntropyLoss, SignMeanAndMaskedRows) {
  Tensor e = from_vector<double>({1.0, 2.0, 0.0, 3.0}, {2, 2}).requires_grad_();
  Tensor l = attention_entropy_loss(e, 0.5);
  EXPECT_DOUBLE_EQ(l.item<double>(), -0.5 * 1.5);
  Tensor has = bools({1, 1, 0, 1}, {2, 2});
  Tensor lm = attention_entropy_loss(e, 0.5, has);
  EXPECT_DOUBLE_EQ(lm.item<double>(), -0.5 * 2.0);
  lm.backward();
  EXPECT_TRUE(all_close(e.grad(), from_vector<double>({-0.5 / 3, -0.5 / 3, 0.0, -0.5 / 3}, {2, 2}), 1e-15));
  EXPECT_EQ(attention_entropy_loss(e, 0.5, bools({0, 0, 0, 0}, {2, 2})).item<double>(),
            0.0);
  EXPECT_THROW(attention_entropy_loss(e, NAN), Error);
  EXPECT_THROW(attention_entropy_loss(e, 1.0, e), Error);
}

// A gradient step on the regulariser with lambda > 0 raises the mean entropy (and lambda < 0 lowers it).
TEST(AttentionEntropyLoss, PositiveLambdaRaisesEntropy) {
  Generator gen(11);
  Tensor q0 = mul(randn({1, 2, 16, 4}, gen, {.dtype = kFloat64}), 3.0), k = randn({1, 2, 16, 4}, gen, {.dtype = kFloat64}),
         v = randn({1, 2, 16, 4}, gen, {.dtype = kFloat64});
  auto step = [&](double lambda) {
    Tensor q = q0.detach().requires_grad_();
    AttentionResult r = scaled_dot_product_attention(q, k, v, {.need_entropy = true});
    const double before = mean(r.entropy).item<double>();
    attention_entropy_loss(r.entropy, lambda).backward();
    Tensor q1 = sub(q.detach(), mul(q.grad(), 0.5));
    const double after = mean(scaled_dot_product_attention(q1, k, v, {.need_entropy = true}).entropy).item<double>();
    return after - before;
  };
  EXPECT_GT(step(1.0), 1e-3);
  EXPECT_LT(step(-1.0), -1e-3);
}

}  // namespace
