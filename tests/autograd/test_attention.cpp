#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "autograd/allocator.h"
#include "autograd/attention.h"
#include "testing.h"

using namespace attograd;
using namespace attograd::testing;

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// ---------------------------------------------------------------------------------------------
// The reference: naive softmax(Q K^T * scale + mask) V in double with plain loops, holding the full
// Lq x Lk probability matrix, and the textbook softmax backward (not the flash-style D_i shortcut).

struct Ref {
  std::vector<double> out;    // (B, H, Lq, dv)
  std::vector<double> probs;  // (B, H, Lq, Lk), before dropout
  std::vector<double> dq, dk, dv;
};

// Flat index into a mask of shape `ms` broadcast (right-aligned) against `target`, at full index `idx`.
int64_t mask_index(const Shape& ms, const Shape& target, const std::vector<int64_t>& idx) {
  int64_t flat = 0;
  const size_t off = target.size() - ms.size();
  for (size_t d = 0; d < ms.size(); ++d) flat = flat * ms[d] + (ms[d] == 1 ? 0 : idx[off + d]);
  return flat;
}

// `dout` may be empty (no gradients); `keep` (B*H*Lq*Lk multipliers applied to the probabilities, i.e. the
// dropout mask times 1/(1-p)) may be empty.
Ref reference(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask, bool causal, double scale,
              const std::vector<double>& dout = {}, const std::vector<double>& keep = {}) {
  const bool three = q.dim() == 3;
  const int64_t B = q.size(0), H = three ? 1 : q.size(1), Lq = q.size(-2), Lk = k.size(-2), dk = q.size(-1),
                dv = v.size(-1);
  if (scale == 0) scale = 1.0 / std::sqrt(static_cast<double>(dk));
  auto Q = q.to_vector<double>(), K = k.to_vector<double>(), V = v.to_vector<double>();
  std::vector<double> M = mask.defined() ? mask.to_vector<double>() : std::vector<double>{};
  const bool is_bool = mask.defined() && mask.dtype() == kBool;
  Shape target = three ? Shape{B, Lq, Lk} : Shape{B, H, Lq, Lk};
  Ref r;
  r.out.assign(B * H * Lq * dv, 0.0);
  r.probs.assign(B * H * Lq * Lk, 0.0);
  const bool grads = !dout.empty();
  if (grads) {
    r.dq.assign(Q.size(), 0.0);
    r.dk.assign(K.size(), 0.0);
    r.dv.assign(V.size(), 0.0);
  }
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h) {
      const int64_t bh = b * H + h;
      for (int64_t i = 0; i < Lq; ++i) {
        std::vector<double> s(Lk);
        for (int64_t j = 0; j < Lk; ++j) {
          double dot = 0;
          for (int64_t c = 0; c < dk; ++c) dot += Q[(bh * Lq + i) * dk + c] * K[(bh * Lk + j) * dk + c];
          s[j] = dot * scale;
          if (mask.defined()) {
            std::vector<int64_t> idx = three ? std::vector<int64_t>{b, i, j} : std::vector<int64_t>{b, h, i, j};
            double mv = M[mask_index(mask.shape(), target, idx)];
            if (is_bool) {
              if (mv != 0) s[j] = -kInf;
            } else {
              s[j] += mv;
            }
          }
          if (causal && j > i) s[j] = -kInf;
        }
        double m = -kInf;
        for (double x : s) m = std::max(m, x);
        std::vector<double> p(Lk, 0.0), pd(Lk, 0.0);
        if (m != -kInf) {
          double sum = 0;
          for (int64_t j = 0; j < Lk; ++j) sum += (p[j] = std::exp(s[j] - m));
          for (int64_t j = 0; j < Lk; ++j) p[j] /= sum;
        }
        for (int64_t j = 0; j < Lk; ++j) {
          const int64_t e = (bh * Lq + i) * Lk + j;
          r.probs[e] = p[j];
          pd[j] = p[j] * (keep.empty() ? 1.0 : keep[e]);
          for (int64_t c = 0; c < dv; ++c) r.out[(bh * Lq + i) * dv + c] += pd[j] * V[(bh * Lk + j) * dv + c];
        }
        if (!grads) continue;
        const double* dO = &dout[(bh * Lq + i) * dv];
        std::vector<double> dp(Lk);
        double pdp = 0;
        for (int64_t j = 0; j < Lk; ++j) {
          double x = 0;
          for (int64_t c = 0; c < dv; ++c) x += dO[c] * V[(bh * Lk + j) * dv + c];
          dp[j] = x * (keep.empty() ? 1.0 : keep[(bh * Lq + i) * Lk + j]);
          pdp += p[j] * dp[j];
        }
        for (int64_t j = 0; j < Lk; ++j) {
          const double ds = p[j] * (dp[j] - pdp);
          for (int64_t c = 0; c < dk; ++c) {
            r.dq[(bh * Lq + i) * dk + c] += scale * ds * K[(bh * Lk + j) * dk + c];
            r.dk[(bh * Lk + j) * dk + c] += scale * ds * Q[(bh * Lq + i) * dk + c];
          }
          for (int64_t c = 0; c < dv; ++c) r.dv[(bh * Lk + j) * dv + c] += pd[j] * dO[c];
        }
      }
    }
  return r;
}

Tensor as_tensor(const std::vector<double>& values, const Shape& shape) {
  return from_vector<double>(values, shape, {.dtype = kFloat64});
}

std::vector<double> random_values(int64_t n, Generator& gen) {
  std::vector<double> out(n);
  for (auto& x : out) x = gen.uniform(-1.0, 1.0);
  return out;
}

// A copy of x in another dtype, a fresh leaf requiring grad.
Tensor leaf_as(const Tensor& x, Dtype dtype) {
  Tensor y = x.detach().to(dtype).detach();
  return y.requires_grad_(true);
}

// Runs the op on random inputs in float64 (and float32), comparing output, weights and all three gradients
// with the reference.
void check_against_reference(const Shape& qs, const Shape& ks, const Shape& vs, AttentionOptions opts,
                             uint64_t seed = 1, double atol = 1e-12, bool also_float32 = true) {
  Generator gen(seed);
  Tensor q = rand_leaf(qs, gen), k = rand_leaf(ks, gen), v = rand_leaf(vs, gen);
  opts.need_weights = true;
  AttentionResult res = scaled_dot_product_attention(q, k, v, opts);
  std::vector<double> dout = random_values(shape_numel(res.output.shape()), gen);
  Ref ref = reference(q, k, v, opts.attn_mask, opts.is_causal, opts.scale, dout);
  Shape ws = qs;
  ws.back() = ks[ks.size() - 2];
  Shape os = qs;
  os.back() = vs.back();
  EXPECT_TRUE(all_close(res.output, as_tensor(ref.out, os), atol, 1e-12));
  EXPECT_TRUE(all_close(res.weights, as_tensor(ref.probs, ws), atol, 1e-12));
  res.output.backward(as_tensor(dout, os));
  EXPECT_TRUE(all_close(q.grad(), as_tensor(ref.dq, qs), atol, 1e-10));
  EXPECT_TRUE(all_close(k.grad(), as_tensor(ref.dk, ks), atol, 1e-10));
  EXPECT_TRUE(all_close(v.grad(), as_tensor(ref.dv, vs), atol, 1e-10));

  if (!also_float32) return;
  // float32 through the same code.
  Tensor qf = leaf_as(q, kFloat32), kf = leaf_as(k, kFloat32), vf = leaf_as(v, kFloat32);
  AttentionOptions of = opts;
  if (opts.attn_mask.defined() && opts.attn_mask.dtype() == kFloat64) of.attn_mask = opts.attn_mask.to(kFloat32);
  AttentionResult rf = scaled_dot_product_attention(qf, kf, vf, of);
  EXPECT_EQ(rf.output.dtype(), kFloat32);
  EXPECT_TRUE(all_close(rf.output, as_tensor(ref.out, os), 2e-6, 1e-5));
  EXPECT_TRUE(all_close(rf.weights, as_tensor(ref.probs, ws), 2e-6, 1e-5));
  rf.output.backward(as_tensor(dout, os).to(kFloat32));
  EXPECT_TRUE(all_close(qf.grad(), as_tensor(ref.dq, qs), 1e-5, 1e-4));
  EXPECT_TRUE(all_close(kf.grad(), as_tensor(ref.dk, ks), 1e-5, 1e-4));
  EXPECT_TRUE(all_close(vf.grad(), as_tensor(ref.dv, vs), 1e-5, 1e-4));
}

// Gradcheck (float64, PyTorch defaults) of the output with respect to q, k and v.
void check_gradients(const Shape& qs, const Shape& ks, const Shape& vs, const AttentionOptions& opts,
                     uint64_t seed = 2) {
  Generator gen(seed);
  Tensor q = rand_leaf(qs, gen), k = rand_leaf(ks, gen), v = rand_leaf(vs, gen);
  auto f = [&]() { return scaled_dot_product_attention(q, k, v, opts).output; };
  EXPECT_GRADCHECK(f, {q, k, v});
}

Tensor bool_tensor(const std::vector<int>& values, const Shape& shape) {
  Tensor t = empty(shape, {.dtype = kBool});
  bool* p = t.data<bool>();
  for (size_t i = 0; i < values.size(); ++i) p[i] = values[i] != 0;
  return t;
}

// A random bool mask (true = blocked) with about `frac` blocked entries, but never a fully blocked row of
// the trailing (rows, cols) matrix.
Tensor random_bool_mask(const Shape& shape, double frac, Generator& gen) {
  Tensor t = empty(shape, {.dtype = kBool});
  bool* p = t.data<bool>();
  const int64_t cols = shape.back();
  for (int64_t e = 0; e < t.numel(); ++e) p[e] = gen.uniform() < frac;
  for (int64_t row = 0; row < t.numel() / cols; ++row) p[row * cols + row % cols] = false;
  return t;
}

// ---------------------------------------------------------------------------------------------
// Values

TEST(Attention, HandComputedValue) {
  Tensor q = from_vector<double>({1, 0}, {1, 1, 1, 2});
  Tensor k = from_vector<double>({1, 0, 0, 1}, {1, 1, 2, 2});
  Tensor v = from_vector<double>({1, 2, 3, 4}, {1, 1, 2, 2});
  AttentionResult r = scaled_dot_product_attention(q, k, v, {.scale = 1.0, .need_weights = true});
  // scores [1, 0] -> p = [e/(e+1), 1/(e+1)]
  EXPECT_NEAR(r.weights.at({0, 0, 0, 0}), 0.7310585786300049, 1e-15);
  EXPECT_NEAR(r.weights.at({0, 0, 0, 1}), 0.2689414213699951, 1e-15);
  EXPECT_NEAR(r.output.at({0, 0, 0, 0}), 1.5378828427399902, 1e-15);
  EXPECT_NEAR(r.output.at({0, 0, 0, 1}), 2.5378828427399902, 1e-15);
  // Default scale 1/sqrt(2): scores [0.7071, 0].
  AttentionResult d = scaled_dot_product_attention(q, k, v);
  double p0 = 1.0 / (1.0 + std::exp(-1.0 / std::sqrt(2.0)));
  EXPECT_NEAR(d.output.at({0, 0, 0, 0}), p0 * 1 + (1 - p0) * 3, 1e-15);
  EXPECT_FALSE(d.weights.defined());
}

TEST(Attention, NoMaskMatchesReference) { check_against_reference({2, 3, 5, 4}, {2, 3, 5, 4}, {2, 3, 5, 4}, {}); }

TEST(Attention, BoolMaskMatchesReference) {
  Generator gen(11);
  AttentionOptions o;
  o.attn_mask = random_bool_mask({5, 6}, 0.4, gen);
  check_against_reference({2, 2, 5, 3}, {2, 2, 6, 3}, {2, 2, 6, 3}, o);
}

TEST(Attention, FullBoolMaskMatchesReference) {
  Generator gen(12);
  AttentionOptions o;
  o.attn_mask = random_bool_mask({2, 3, 4, 5}, 0.5, gen);
  check_against_reference({2, 3, 4, 3}, {2, 3, 5, 3}, {2, 3, 5, 2}, o);
}

TEST(Attention, KeyPaddingMaskMatchesReference) {
  AttentionOptions o;
  // batch 0 pads its last two keys, batch 1 pads nothing
  o.attn_mask = bool_tensor({0, 0, 0, 1, 1, 0, 0, 0, 0, 0}, {2, 1, 1, 5});
  check_against_reference({2, 2, 4, 3}, {2, 2, 5, 3}, {2, 2, 5, 3}, o);
}

TEST(Attention, FloatMaskMatchesReference) {
  Generator gen(13);
  AttentionOptions o;
  Tensor m = rand({1, 2, 4, 6}, gen, {.dtype = kFloat64});
  for (int64_t e = 0; e < m.numel(); ++e) m.data<double>()[e] = 4 * m.data<double>()[e] - 2;
  m.set({0, 1, 2, 3}, -kInf);  // a -inf entry blocks like a bool one
  m.set({0, 0, 0, 5}, -kInf);
  o.attn_mask = m;
  check_against_reference({3, 2, 4, 3}, {3, 2, 6, 3}, {3, 2, 6, 3}, o);
}

TEST(Attention, CausalMatchesReference) {
  AttentionOptions o{.is_causal = true};
  check_against_reference({2, 2, 6, 4}, {2, 2, 6, 4}, {2, 2, 6, 4}, o);
  // Top-left aligned with Lq != Lk, both ways.
  check_against_reference({1, 2, 4, 3}, {1, 2, 7, 3}, {1, 2, 7, 3}, o);
  check_against_reference({1, 2, 7, 3}, {1, 2, 4, 3}, {1, 2, 4, 3}, o);
}

TEST(Attention, CausalWithPaddingMaskMatchesReference) {
  AttentionOptions o{.is_causal = true};
  o.attn_mask = bool_tensor({0, 0, 0, 0, 1, 0, 1, 0, 0, 0}, {2, 1, 1, 5});
  check_against_reference({2, 2, 5, 3}, {2, 2, 5, 3}, {2, 2, 5, 3}, o);
}

TEST(Attention, CrossAttentionAndDvDiffersFromDk) {
  check_against_reference({2, 2, 7, 4}, {2, 2, 11, 4}, {2, 2, 11, 6}, {});
  check_against_reference({1, 1, 3, 5}, {1, 1, 2, 5}, {1, 1, 2, 1}, {.scale = 0.37});
}

TEST(Attention, ThreeDInputs) {
  check_against_reference({3, 4, 5}, {3, 6, 5}, {3, 6, 2}, {});
  Generator gen(14);
  AttentionOptions o{.is_causal = true};
  o.attn_mask = random_bool_mask({3, 4, 6}, 0.3, gen);  // (N, Lq, Lk)
  check_against_reference({3, 4, 5}, {3, 6, 5}, {3, 6, 2}, o);
  AttentionResult r =
      scaled_dot_product_attention(rand({3, 4, 5}, gen, {.dtype = kFloat64}), rand({3, 6, 5}, gen, {.dtype = kFloat64}),
                                   rand({3, 6, 2}, gen, {.dtype = kFloat64}), {.need_weights = true});
  EXPECT_EQ(r.output.shape(), (Shape{3, 4, 2}));
  EXPECT_EQ(r.weights.shape(), (Shape{3, 4, 6}));
}

TEST(Attention, LongSequencesCrossBlockBoundaries) {
  // 150 rows = blocks of 64, 64 and 22 query rows.
  Generator gen(15);
  AttentionOptions o{.is_causal = true};
  Tensor pad = zeros({2, 1, 1, 150}, {.dtype = kBool});
  for (int64_t j = 120; j < 150; ++j) pad.set({1, 0, 0, j}, 1);  // batch 1 pads its last 30 keys
  o.attn_mask = pad;
  check_against_reference({2, 2, 150, 8}, {2, 2, 150, 8}, {2, 2, 150, 5}, o, 3, 1e-11);
  check_against_reference({1, 2, 150, 8}, {1, 2, 150, 8}, {1, 2, 150, 8}, {}, 4, 1e-11);
  // Cross attention with causal masking: key blocks beyond a query block are skipped.
  check_against_reference({1, 1, 150, 4}, {1, 1, 130, 4}, {1, 1, 130, 3}, {.is_causal = true}, 5, 1e-11);
  Tensor fm = randn({150, 130}, gen, {.dtype = kFloat64});
  check_against_reference({1, 2, 150, 4}, {1, 2, 130, 4}, {1, 2, 130, 3}, {.attn_mask = fm}, 6, 1e-11);
}

TEST(Attention, FullyBlockedRowGivesZerosAndZeroGradients) {
  // Query row 1 of every head sees no key; row 0 and 2 see some.
  Tensor mask = bool_tensor({0, 1, 0, 1, 1, 1, 1, 0, 1}, {3, 3});
  for (Dtype dt : {kFloat64, kFloat32}) {
    Generator gen(16);
    Tensor q = leaf_as(rand_leaf({2, 2, 3, 4}, gen), dt), k = leaf_as(rand_leaf({2, 2, 3, 4}, gen), dt),
           v = leaf_as(rand_leaf({2, 2, 3, 4}, gen), dt);
    AttentionResult r = scaled_dot_product_attention(q, k, v, {.attn_mask = mask, .need_weights = true});
    for (int64_t b = 0; b < 2; ++b)
      for (int64_t h = 0; h < 2; ++h) {
        for (int64_t c = 0; c < 4; ++c) EXPECT_EQ(r.output.at({b, h, 1, c}), 0.0);
        double s0 = 0, s1 = 0;
        for (int64_t j = 0; j < 3; ++j) s0 += r.weights.at({b, h, 0, j}), s1 += r.weights.at({b, h, 1, j});
        EXPECT_NEAR(s0, 1.0, 1e-6);
        EXPECT_EQ(s1, 0.0);
      }
    r.output.backward(ones(r.output.shape(), {.dtype = dt}));
    for (const Tensor& t : {r.output, q.grad(), k.grad(), v.grad()})
      for (double x : t.to_vector<double>()) EXPECT_TRUE(std::isfinite(x));
    for (int64_t b = 0; b < 2; ++b)
      for (int64_t h = 0; h < 2; ++h)
        for (int64_t c = 0; c < 4; ++c) EXPECT_EQ(q.grad().at({b, h, 1, c}), 0.0);
  }
  // Same through the reference (incl. k/v gradients) and with -inf in a float mask.
  check_against_reference({2, 2, 3, 4}, {2, 2, 3, 4}, {2, 2, 3, 4}, {.attn_mask = mask});
  Tensor fm = zeros({3, 3}, {.dtype = kFloat64});
  for (int64_t j = 0; j < 3; ++j) fm.set({2, j}, -kInf);
  check_against_reference({2, 1, 3, 4}, {2, 1, 3, 4}, {2, 1, 3, 4}, {.attn_mask = fm});
  // Every row blocked.
  Tensor all = ones({1, 1, 1, 3}, {.dtype = kBool});
  check_against_reference({1, 2, 3, 4}, {1, 2, 3, 4}, {1, 2, 3, 4}, {.attn_mask = all});
}

TEST(Attention, HugeScoresStayFinite) {
  // scale 1e4: scores up to ~1e4, softmax nearly one-hot.
  check_against_reference({1, 2, 5, 4}, {1, 2, 7, 4}, {1, 2, 7, 3}, {.scale = 1e4}, 7, 1e-9, false);
  // float32 against the reference on the same (float-representable) inputs. This is ill-conditioned in
  // float32 for any softmax backward (PyTorch's too): in a saturated row dS_max = P_max (dP_max - D) with
  // dP_max - D ~ 1e-7 computed from O(1) float32 values, so dS carries absolute errors ~ FLT_EPSILON * |dO| |V|,
  // which S = scale * Q K^T amplifies by scale into dQ and dK. Output and dV only see the saturated
  // probabilities and stay accurate.
  {
    Generator g32(7);
    Tensor q = leaf_as(leaf_as(rand_leaf({1, 2, 5, 4}, g32), kFloat32), kFloat64);
    Tensor k = leaf_as(leaf_as(rand_leaf({1, 2, 7, 4}, g32), kFloat32), kFloat64);
    Tensor v = leaf_as(leaf_as(rand_leaf({1, 2, 7, 3}, g32), kFloat32), kFloat64);
    std::vector<double> dout = random_values(1 * 2 * 5 * 3, g32);
    Ref ref = reference(q, k, v, Tensor(), false, 1e4, dout);
    Tensor qf = leaf_as(q, kFloat32), kf = leaf_as(k, kFloat32), vf = leaf_as(v, kFloat32);
    Tensor out = scaled_dot_product_attention(qf, kf, vf, {.scale = 1e4}).output;
    out.backward(as_tensor(dout, out.shape()).to(kFloat32));
    double e_out = 0, e_dq = 0, e_dk = 0, e_dv = 0, m_dq = 0, m_dk = 0;
    auto o = out.to_vector<double>(), gq = qf.grad().to_vector<double>(), gk = kf.grad().to_vector<double>(),
         gv = vf.grad().to_vector<double>();
    for (size_t i = 0; i < o.size(); ++i) e_out = std::max(e_out, std::fabs(o[i] - ref.out[i]));
    for (size_t i = 0; i < gq.size(); ++i)
      e_dq = std::max(e_dq, std::fabs(gq[i] - ref.dq[i])), m_dq = std::max(m_dq, std::fabs(ref.dq[i]));
    for (size_t i = 0; i < gk.size(); ++i)
      e_dk = std::max(e_dk, std::fabs(gk[i] - ref.dk[i])), m_dk = std::max(m_dk, std::fabs(ref.dk[i]));
    for (size_t i = 0; i < gv.size(); ++i) e_dv = std::max(e_dv, std::fabs(gv[i] - ref.dv[i]));
    // Seed 7 has a probability ~1e-7 next to a saturated one, giving q/k gradients ~4e-3.
    EXPECT_GT(m_dq, 1e-3);
    EXPECT_GT(m_dk, 1e-3);
    EXPECT_LT(e_out, 1e-6);
    EXPECT_LT(e_dv, 1e-6);
    EXPECT_LT(e_dq, 1e4 * FLT_EPSILON);
    EXPECT_LT(e_dk, 1e4 * FLT_EPSILON);
  }
  Generator gen(17);
  Tensor q = leaf_as(rand_leaf({2, 2, 70, 8}, gen), kFloat32), k = leaf_as(rand_leaf({2, 2, 70, 8}, gen), kFloat32),
         v = leaf_as(rand_leaf({2, 2, 70, 8}, gen), kFloat32);
  AttentionResult r = scaled_dot_product_attention(q, k, v, {.is_causal = true, .scale = 1e4, .need_weights = true});
  r.output.backward(ones(r.output.shape()));
  for (const Tensor& t : {r.output, r.weights, q.grad(), k.grad(), v.grad()})
    for (double x : t.to_vector<double>()) ASSERT_TRUE(std::isfinite(x));
  // Rows of the weights still sum to 1.
  auto w = r.weights.to_vector<double>();
  for (int64_t row = 0; row < 2 * 2 * 70; ++row) {
    double s = 0;
    for (int64_t j = 0; j < 70; ++j) s += w[row * 70 + j];
    EXPECT_NEAR(s, 1.0, 1e-5);
  }
}

TEST(Attention, NeedWeightsRowsSumToOneWithoutHistory) {
  Generator gen(18);
  Tensor q = rand_leaf({2, 3, 5, 4}, gen), k = rand_leaf({2, 3, 6, 4}, gen), v = rand_leaf({2, 3, 6, 4}, gen);
  Tensor pad = bool_tensor({0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1}, {2, 1, 1, 6});  // batch 1: all keys blocked
  AttentionResult r = scaled_dot_product_attention(q, k, v, {.attn_mask = pad, .need_weights = true});
  EXPECT_EQ(r.weights.shape(), (Shape{2, 3, 5, 6}));
  EXPECT_FALSE(r.weights.requires_grad());
  EXPECT_TRUE(r.weights.is_leaf());
  EXPECT_TRUE(r.output.requires_grad());
  Ref ref = reference(q, k, v, pad, false, 0.0);
  EXPECT_TRUE(all_close(r.weights, as_tensor(ref.probs, {2, 3, 5, 6}), 1e-14));
  auto w = r.weights.to_vector<double>();
  for (int64_t row = 0; row < 2 * 3 * 5; ++row) {
    double s = 0;
    for (int64_t j = 0; j < 6; ++j) s += w[row * 6 + j];
    EXPECT_NEAR(s, row < 15 ? 1.0 : 0.0, 1e-14);
    EXPECT_EQ(w[row * 6 + 5], 0.0);  // padded key: exactly zero
  }
}

TEST(Attention, EvalModeGivesTheSameOutput) {
  Generator gen(19);
  Tensor q = rand_leaf({2, 2, 70, 4}, gen), k = rand_leaf({2, 2, 70, 4}, gen), v = rand_leaf({2, 2, 70, 4}, gen);
  Tensor a = scaled_dot_product_attention(q, k, v, {.is_causal = true}).output;
  Tensor b;
  {
    NoGradGuard ng;
    b = scaled_dot_product_attention(q, k, v, {.is_causal = true}).output;
  }
  EXPECT_TRUE(a.requires_grad());
  EXPECT_FALSE(b.requires_grad());
  EXPECT_EQ(a.to_vector<double>(), b.to_vector<double>());
}

TEST(Attention, FloatMaskGetsNoGradient) {
  Generator gen(20);
  Tensor q = rand_leaf({1, 2, 3, 4}, gen), k = rand_leaf({1, 2, 3, 4}, gen), v = rand_leaf({1, 2, 3, 4}, gen);
  Tensor m = rand_leaf({3, 3}, gen);
  Tensor out = scaled_dot_product_attention(q, k, v, {.attn_mask = m}).output;
  out.backward(ones(out.shape(), {.dtype = kFloat64}));
  EXPECT_FALSE(m.grad().defined());
  EXPECT_TRUE(q.grad().defined());
}

TEST(Attention, ZeroSizeDimensions) {
  Generator gen(21);
  // B = 0
  {
    Tensor q = rand_leaf({0, 2, 3, 4}, gen), k = rand_leaf({0, 2, 5, 4}, gen), v = rand_leaf({0, 2, 5, 3}, gen);
    Tensor out = scaled_dot_product_attention(q, k, v).output;
    EXPECT_EQ(out.shape(), (Shape{0, 2, 3, 3}));
    out.backward(zeros(out.shape(), {.dtype = kFloat64}));
    EXPECT_EQ(q.grad().shape(), q.shape());
  }
  // Lq = 0: no queries, zero gradients for k and v.
  {
    Tensor q = rand_leaf({1, 2, 0, 4}, gen), k = rand_leaf({1, 2, 5, 4}, gen), v = rand_leaf({1, 2, 5, 3}, gen);
    Tensor out = scaled_dot_product_attention(q, k, v, {.is_causal = true}).output;
    EXPECT_EQ(out.shape(), (Shape{1, 2, 0, 3}));
    out.backward(zeros(out.shape(), {.dtype = kFloat64}));
    for (double x : k.grad().to_vector<double>()) EXPECT_EQ(x, 0.0);
    for (double x : v.grad().to_vector<double>()) EXPECT_EQ(x, 0.0);
  }
  // Lk = 0: every row blocked -> zero output and gradients.
  {
    Tensor q = rand_leaf({1, 2, 3, 4}, gen), k = rand_leaf({1, 2, 0, 4}, gen), v = rand_leaf({1, 2, 0, 3}, gen);
    AttentionResult r = scaled_dot_product_attention(q, k, v, {.need_weights = true});
    EXPECT_EQ(r.output.shape(), (Shape{1, 2, 3, 3}));
    EXPECT_EQ(r.weights.shape(), (Shape{1, 2, 3, 0}));
    for (double x : r.output.to_vector<double>()) EXPECT_EQ(x, 0.0);
    r.output.backward(ones(r.output.shape(), {.dtype = kFloat64}));
    for (double x : q.grad().to_vector<double>()) EXPECT_EQ(x, 0.0);
    EXPECT_EQ(k.grad().shape(), k.shape());
  }
}

// ---------------------------------------------------------------------------------------------
// Gradchecks (float64, PyTorch's default tolerances)

TEST(AttentionGradcheck, NoMask) { check_gradients({2, 2, 3, 4}, {2, 2, 4, 4}, {2, 2, 4, 3}, {}); }

TEST(AttentionGradcheck, BoolMask) {
  Generator gen(30);
  AttentionOptions o;
  o.attn_mask = random_bool_mask({3, 4}, 0.4, gen);
  check_gradients({2, 2, 3, 3}, {2, 2, 4, 3}, {2, 2, 4, 2}, o);
}

TEST(AttentionGradcheck, KeyPaddingMask) {
  AttentionOptions o;
  o.attn_mask = bool_tensor({0, 0, 1, 1, 0, 0, 0, 0}, {2, 1, 1, 4});
  check_gradients({2, 2, 3, 3}, {2, 2, 4, 3}, {2, 2, 4, 2}, o);
}

TEST(AttentionGradcheck, FloatMask) {
  Generator gen(31);
  AttentionOptions o;
  Tensor m = randn({2, 1, 3, 4}, gen, {.dtype = kFloat64});
  m.set({1, 0, 2, 0}, -kInf);
  o.attn_mask = m;
  check_gradients({2, 2, 3, 3}, {2, 2, 4, 3}, {2, 2, 4, 2}, o);
}

TEST(AttentionGradcheck, Causal) {
  check_gradients({2, 2, 4, 3}, {2, 2, 4, 3}, {2, 2, 4, 2}, {.is_causal = true});
  check_gradients({1, 2, 5, 3}, {1, 2, 3, 3}, {1, 2, 3, 2}, {.is_causal = true});
  AttentionOptions o{.is_causal = true};
  o.attn_mask = bool_tensor({0, 0, 0, 1, 0, 1, 0, 0}, {2, 1, 1, 4});
  check_gradients({2, 1, 4, 3}, {2, 1, 4, 3}, {2, 1, 4, 2}, o);
}

TEST(AttentionGradcheck, FullyBlockedRow) {
  AttentionOptions o;
  o.attn_mask = bool_tensor({0, 1, 0, 1, 1, 1, 1, 1, 1, 1, 0, 0}, {3, 4});
  check_gradients({1, 2, 3, 3}, {1, 2, 4, 3}, {1, 2, 4, 2}, o);
}

TEST(AttentionGradcheck, ThreeDAndCustomScale) { check_gradients({2, 3, 4}, {2, 5, 4}, {2, 5, 3}, {.scale = 0.8}); }

TEST(AttentionGradcheck, AcrossBlockBoundary) {
  // 70 query rows = blocks of 64 and 6; causal so the second block sees more keys.
  Generator gen(32);
  Tensor q = rand_leaf({1, 1, 70, 2}, gen), k = rand_leaf({1, 1, 70, 2}, gen), v = rand_leaf({1, 1, 70, 2}, gen);
  auto f = [&]() { return scaled_dot_product_attention(q, k, v, {.is_causal = true}).output; };
  EXPECT_GRADCHECK(f, {q, k, v});
}

TEST(AttentionGradcheck, ReusedInput) {
  Generator gen(33);
  Tensor x = rand_leaf({1, 2, 4, 3}, gen);
  auto f = [&]() { return scaled_dot_product_attention(x, x, x, {.is_causal = true}).output; };
  EXPECT_GRADCHECK(f, {x});
}

TEST(AttentionGradcheck, OnlySomeInputsRequireGrad) {
  Generator gen(35);
  Tensor q = rand_leaf({1, 2, 3, 3}, gen), k = rand_leaf({1, 2, 4, 3}, gen), v = rand_leaf({1, 2, 4, 2}, gen);
  Tensor kc = k.detach(), vc = v.detach(), qc = q.detach();
  auto fq = [&]() { return scaled_dot_product_attention(q, kc, vc, {.is_causal = true}).output; };
  EXPECT_GRADCHECK(fq, {q});
  auto fk = [&]() { return scaled_dot_product_attention(qc, k, vc).output; };
  EXPECT_GRADCHECK(fk, {k});
  auto fv = [&]() { return scaled_dot_product_attention(qc, kc, v, {.dropout_p = 0.5}).output; };
  // v alone with dropout: the mask is fixed by re-seeding the default generator.
  auto fv_seeded = [&]() {
    manual_seed(3);
    return fv();
  };
  EXPECT_GRADCHECK(fv_seeded, {v});
}

TEST(AttentionGradcheck, WithDropout) {
  // The generator is re-seeded inside the function, so every evaluation replays the same mask.
  Generator gen(34);
  Tensor q = rand_leaf({2, 2, 4, 3}, gen), k = rand_leaf({2, 2, 5, 3}, gen), v = rand_leaf({2, 2, 5, 2}, gen);
  AttentionOptions o{.dropout_p = 0.3};
  auto f = [&]() {
    Generator g(77);
    AttentionOptions oo = o;
    oo.generator = &g;
    return scaled_dot_product_attention(q, k, v, oo).output;
  };
  EXPECT_GRADCHECK(f, {q, k, v});
  o.is_causal = true;
  o.attn_mask = bool_tensor({0, 0, 0, 0, 1, 0, 1, 0, 0, 0}, {2, 1, 1, 5});
  EXPECT_GRADCHECK(f, {q, k, v});
}

// ---------------------------------------------------------------------------------------------
// Short sequences: the forward keeps the probabilities and the backward reads them instead of recomputing them.

// Sets detail::attention_saved_probs_limit() for one scope.
struct SavedProbsLimit {
  int64_t old;
  explicit SavedProbsLimit(int64_t limit) : old(detail::attention_saved_probs_limit()) {
    detail::attention_saved_probs_limit() = limit;
  }
  ~SavedProbsLimit() { detail::attention_saved_probs_limit() = old; }
};

// A case of the bitwise comparisons below: shapes, causality, the mask, the dropout probability.
struct ProbsCase {
  Shape q, k, v;
  bool causal;
  int mask;  // 0 none, 1 bool with a fully blocked row, 2 float
  double p;

  // The case's mask (undefined for none), drawn from gen; a float mask in dtype dt.
  Tensor make_mask(Generator& gen, Dtype dt) const {
    Shape ms = q;
    ms.back() = k[k.size() - 2];
    if (mask == 1) {
      Tensor m = random_bool_mask(ms, 0.3, gen);
      bool* b = m.data<bool>();
      for (int64_t j = 0; j < ms.back(); ++j) b[j] = true;  // the first row: every key blocked
      return m;
    }
    return mask == 2 ? (rand(ms, gen, {.dtype = kFloat64}) * -3.0).to(dt) : Tensor();
  }
};

TEST(AttentionSavedProbs, SameBitsAsRecomputing) {
  // Every option that touches the probabilities, float32 and float64: kept (default limit) and recomputed (limit
  // 0) give the same output and gradients, bit for bit, and the same generator state afterwards.
  using Case = ProbsCase;
  const std::vector<Case> cases = {
      {{2, 2, 5, 4}, {2, 2, 5, 4}, {2, 2, 5, 3}, false, 0, 0.0},  {{2, 2, 33, 8}, {2, 2, 33, 8}, {2, 2, 33, 8}, true, 0, 0.2},
      {{2, 3, 6, 4}, {2, 3, 7, 4}, {2, 3, 7, 5}, false, 1, 0.3},  {{1, 2, 64, 16}, {1, 2, 64, 16}, {1, 2, 64, 16}, true, 2, 0.1},
      {{3, 7, 4}, {3, 9, 4}, {3, 9, 2}, true, 1, 0.5}};
  for (Dtype dt : {kFloat32, kFloat64}) {
    for (size_t ci = 0; ci < cases.size(); ++ci) {
      const Case& c = cases[ci];
      SCOPED_TRACE("case " + std::to_string(ci) + " " + dtype_name(dt));
      Generator gen(60 + ci);
      Tensor q0 = rand_leaf(c.q, gen), k0 = rand_leaf(c.k, gen), v0 = rand_leaf(c.v, gen);
      const Tensor mask = c.make_mask(gen, dt);
      Tensor dout;
      auto run = [&](int64_t limit) {
        SavedProbsLimit l(limit);
        Tensor q = leaf_as(q0, dt), k = leaf_as(k0, dt), v = leaf_as(v0, dt);
        Generator g(99);
        AttentionResult r = scaled_dot_product_attention(
            q, k, v, {.attn_mask = mask, .is_causal = c.causal, .dropout_p = c.p, .generator = &g});
        if (!dout.defined()) dout = randn(r.output.shape(), gen, {.dtype = dt});
        r.output.backward(dout);
        return std::vector<Tensor>{r.output.detach(), q.grad(), k.grad(), v.grad(),
                                   from_vector<double>({static_cast<double>(g.get_state().state)}, {1})};
      };
      const auto kept = run(1 << 30), recomputed = run(0);
      for (size_t i = 0; i < kept.size(); ++i) EXPECT_TRUE(bitwise_equal(kept[i], recomputed[i])) << "tensor " << i;
    }
  }
}

struct OnePassRows {
  bool old = detail::attention_one_pass_rows();
  explicit OnePassRows(bool on) { detail::attention_one_pass_rows() = on; }
  ~OnePassRows() { detail::attention_one_pass_rows() = old; }
};

TEST(AttentionOnePassRows, SameBitsAsSeparatePasses) {
  // Rows of at most 64 keys: softmax, dropout and the backward's recomputation in one pass per row (avx512 set) give
  // the same output, weights and gradients, bit for bit, as the separate passes, with the probabilities kept or
  // recomputed; every tail of a 16-lane vector, causal blocks, fully blocked rows, masks, dropout, grouped heads.
  using Case = ProbsCase;
  const std::vector<Case> cases = {{{2, 2, 5, 4}, {2, 2, 5, 4}, {2, 2, 5, 3}, false, 0, 0.0},
                                   {{2, 2, 33, 8}, {2, 2, 33, 8}, {2, 2, 33, 8}, true, 0, 0.2},
                                   {{2, 3, 6, 4}, {2, 3, 17, 4}, {2, 3, 17, 5}, false, 1, 0.3},
                                   {{1, 2, 64, 16}, {1, 2, 64, 16}, {1, 2, 64, 16}, true, 2, 0.1},
                                   {{2, 4, 48, 16}, {2, 2, 48, 16}, {2, 2, 48, 16}, true, 0, 0.1},
                                   {{1, 2, 16, 8}, {1, 2, 16, 8}, {1, 2, 16, 8}, false, 1, 0.9},
                                   {{3, 7, 4}, {3, 9, 4}, {3, 9, 2}, true, 1, 0.5},
                                   {{1, 1, 40, 8}, {1, 1, 65, 8}, {1, 1, 65, 8}, false, 0, 0.2}};
  for (size_t ci = 0; ci < cases.size(); ++ci) {
    const Case& c = cases[ci];
    Generator gen(160 + ci);
    Tensor q0 = rand_leaf(c.q, gen), k0 = rand_leaf(c.k, gen), v0 = rand_leaf(c.v, gen);
    const Tensor mask = c.make_mask(gen, kFloat32);
    const Tensor dout = randn(c.q.size() == 4 ? Shape{c.q[0], c.q[1], c.q[2], c.v[3]} : Shape{c.q[0], c.q[1], c.v[2]},
                              gen, {.dtype = kFloat32});
    for (int64_t limit : {int64_t{1} << 30, int64_t{0}}) {
      SCOPED_TRACE("case " + std::to_string(ci) + (limit ? " kept" : " recomputed"));
      auto run = [&](bool one_pass) {
        OnePassRows o(one_pass);
        SavedProbsLimit l(limit);
        Tensor q = leaf_as(q0, kFloat32), k = leaf_as(k0, kFloat32), v = leaf_as(v0, kFloat32);
        Generator g(99);
        AttentionResult r = scaled_dot_product_attention(
            q, k, v,
            {.attn_mask = mask, .is_causal = c.causal, .dropout_p = c.p, .generator = &g, .need_weights = true});
        r.output.backward(dout);
        return std::vector<Tensor>{r.output.detach(), r.weights, q.grad(), k.grad(), v.grad()};
      };
      const auto fused = run(true), separate = run(false);
      for (size_t i = 0; i < fused.size(); ++i) EXPECT_TRUE(bitwise_equal(fused[i], separate[i])) << "tensor " << i;
      const Tensor& dq = fused[2];  // a fresh gradient: contiguous
      const float* g = dq.data<float>();
      EXPECT_TRUE(std::any_of(g, g + dq.numel(), [](float x) { return x != 0.0f; }));  // not trivially equal
    }
  }
}

TEST(AttentionSavedProbs, OnlyShortSequencesKeepThem) {
  // The probabilities are kept when Lq * Lk <= the limit: 4 Lq Lk bytes per head more between forward and backward.
  Generator gen(70);
  for (int64_t L : {32, 64, 65}) {
    Tensor q = rand({2, 2, L, 8}, gen).requires_grad_(), k = rand({2, 2, L, 8}, gen), v = rand({2, 2, L, 8}, gen);
    const auto before = static_cast<int64_t>(allocator_stats().requested_bytes);
    Tensor out = scaled_dot_product_attention(q, k, v, {.is_causal = true}).output;
    const int64_t held = static_cast<int64_t>(allocator_stats().requested_bytes) - before;
    const int64_t output = 2 * 2 * L * 8 * 4, stats = 2 * 2 * L * 2 * 4, probs = 2 * 2 * L * L * 4;
    EXPECT_EQ(held, output + stats + (L <= 64 ? probs : 0)) << "L = " << L;
  }
}

TEST(AttentionSavedProbs, GradcheckWhenRecomputing) {
  // The gradchecks above run on short sequences, i.e. with kept probabilities: the recomputing backward too.
  SavedProbsLimit l(0);
  check_gradients({2, 2, 3, 4}, {2, 2, 4, 4}, {2, 2, 4, 3}, {});
  check_gradients({2, 2, 5, 3}, {2, 2, 5, 3}, {2, 2, 5, 2}, {.is_causal = true});
  check_gradients({2, 3, 4}, {2, 5, 4}, {2, 5, 3}, {.attn_mask = bool_tensor({0, 1, 0, 0, 1}, {5})});
}

// ---------------------------------------------------------------------------------------------
// Dropout

TEST(AttentionDropout, SameSeedReplaysBitwise) {
  Generator gen(40);
  Tensor q = rand_leaf({2, 2, 70, 4}, gen), k = rand_leaf({2, 2, 70, 4}, gen), v = rand_leaf({2, 2, 70, 4}, gen);
  auto run = [&](uint64_t seed) {
    Generator g(seed);
    return scaled_dot_product_attention(q, k, v, {.dropout_p = 0.2, .generator = &g}).output.to_vector<double>();
  };
  auto a = run(5), b = run(5), c = run(6);
  ASSERT_EQ(a.size(), b.size());
  EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(double)), 0);
  EXPECT_NE(a, c);
  // One draw per call: two calls on one generator give different masks; the default generator is used
  // when none is given.
  Generator g(5);
  auto d = scaled_dot_product_attention(q, k, v, {.dropout_p = 0.2, .generator = &g}).output.to_vector<double>();
  auto e = scaled_dot_product_attention(q, k, v, {.dropout_p = 0.2, .generator = &g}).output.to_vector<double>();
  EXPECT_EQ(d, a);
  EXPECT_NE(d, e);
  manual_seed(123);
  auto f1 = scaled_dot_product_attention(q, k, v, {.dropout_p = 0.2}).output.to_vector<double>();
  manual_seed(123);
  auto f2 = scaled_dot_product_attention(q, k, v, {.dropout_p = 0.2}).output.to_vector<double>();
  EXPECT_EQ(f1, f2);
}

TEST(AttentionDropout, MaskAppliedConsistentlyInForwardAndBackward) {
  // The weights are P * keep / (1 - p); the output and all gradients match the reference run with the
  // mask read off the weights, so the backward replays exactly the forward's mask.
  Generator gen(41);
  const double p = 0.4;
  Tensor q = rand_leaf({2, 2, 70, 3}, gen), k = rand_leaf({2, 2, 67, 3}, gen), v = rand_leaf({2, 2, 67, 2}, gen);
  Tensor pad = zeros({2, 1, 1, 67}, {.dtype = kBool});
  pad.set({0, 0, 0, 66}, 1);
  Generator g(9);
  AttentionResult r = scaled_dot_product_attention(
      q, k, v, {.attn_mask = pad, .is_causal = true, .dropout_p = p, .generator = &g, .need_weights = true});
  Ref plain = reference(q, k, v, pad, true, 0.0);
  auto w = r.weights.to_vector<double>();
  std::vector<double> keep(w.size());
  int64_t dropped = 0, positive = 0;
  for (size_t e = 0; e < w.size(); ++e) {
    if (plain.probs[e] == 0) {
      EXPECT_EQ(w[e], 0.0);
      keep[e] = 0;  // irrelevant: P is 0
      continue;
    }
    ++positive;
    if (w[e] == 0) {
      ++dropped;
      keep[e] = 0;
    } else {
      EXPECT_NEAR(w[e], plain.probs[e] / (1 - p), 1e-14);
      keep[e] = 1 / (1 - p);
    }
  }
  EXPECT_GT(dropped, 0);
  std::vector<double> dout = random_values(r.output.numel(), gen);
  Ref ref = reference(q, k, v, pad, true, 0.0, dout, keep);
  EXPECT_TRUE(all_close(r.output, as_tensor(ref.out, r.output.shape()), 1e-12));
  r.output.backward(as_tensor(dout, r.output.shape()));
  EXPECT_TRUE(all_close(q.grad(), as_tensor(ref.dq, q.shape()), 1e-12, 1e-10));
  EXPECT_TRUE(all_close(k.grad(), as_tensor(ref.dk, k.shape()), 1e-12, 1e-10));
  EXPECT_TRUE(all_close(v.grad(), as_tensor(ref.dv, v.shape()), 1e-12, 1e-10));
}

TEST(AttentionDropout, KeepFractionIsOneMinusP) {
  Generator gen(42);
  Tensor q = rand({4, 4, 64, 4}, gen, {.dtype = kFloat32}), k = rand({4, 4, 64, 4}, gen, {.dtype = kFloat32}),
         v = rand({4, 4, 64, 4}, gen, {.dtype = kFloat32});
  for (double p : {0.1, 0.5, 0.9}) {
    Generator g(1000 + static_cast<uint64_t>(p * 10));
    AttentionResult r = scaled_dot_product_attention(q, k, v, {.dropout_p = p, .generator = &g, .need_weights = true});
    auto w = r.weights.to_vector<double>();
    const double n = static_cast<double>(w.size());  // 65536, every P > 0
    double kept = 0;
    for (double x : w) kept += x != 0;
    const double sd = std::sqrt(p * (1 - p) / n);
    EXPECT_NEAR(kept / n, 1 - p, 5 * sd) << "p = " << p;
    // Heads get different masks (the flat index includes b and h).
    int64_t same = 0;
    for (int64_t e = 0; e < 64 * 64; ++e) same += (w[e] != 0) == (w[64 * 64 + e] != 0);
    EXPECT_LT(same, 64 * 64);
  }
}

TEST(AttentionDropout, ZeroProbabilityDrawsNothing) {
  Generator gen(43);
  Tensor q = rand_leaf({1, 1, 3, 2}, gen), k = rand_leaf({1, 1, 3, 2}, gen), v = rand_leaf({1, 1, 3, 2}, gen);
  Generator g(1);
  GeneratorState before = g.get_state();
  scaled_dot_product_attention(q, k, v, {.dropout_p = 0.0, .generator = &g});
  EXPECT_EQ(g.get_state(), before);
  scaled_dot_product_attention(q, k, v, {.dropout_p = 0.5, .generator = &g});
  EXPECT_NE(g.get_state(), before);
}

// ---------------------------------------------------------------------------------------------
// Errors

TEST(Attention, Errors) {
  auto t = [](const Shape& s, Dtype d = kFloat64) { return zeros(s, {.dtype = d}); };
  Tensor q = t({2, 3, 4, 5}), k = t({2, 3, 6, 5}), v = t({2, 3, 6, 7});
  EXPECT_ATTO_ERROR(scaled_dot_product_attention(Tensor(), k, v), "scaled_dot_product_attention: q, k and v must");
  EXPECT_ATTO_ERROR(scaled_dot_product_attention(q, t({2, 6, 5}), v),
                    "scaled_dot_product_attention: q, k and v must all be 4-D (B, H, L, d) or all 3-D (N, L, d), got "
                    "q [2, 3, 4, 5], k [2, 6, 5], v [2, 3, 6, 7]");
  EXPECT_ATTO_ERROR(scaled_dot_product_attention(t({4, 5}), t({6, 5}), t({6, 7})), "all 3-D (N, L, d), got q [4, 5]");
  EXPECT_ATTO_ERROR(scaled_dot_product_attention(t({2, 3, 4, 5}, kInt64), k, v),
                    "must be float32 or float64, got int64");
  EXPECT_ATTO_ERROR(scaled_dot_product_attention(q, t({2, 3, 6, 5}, kFloat32), v),
                    "dtype mismatch: q float64 [2, 3, 4, 5], k float32 [2, 3, 6, 5], v float64 [2, 3, 6, 7]");
  EXPECT_ATTO_ERROR(scaled_dot_product_attention(q, k, t({2, 3, 6, 7}, kFloat32)), "dtype mismatch");
  EXPECT_ATTO_ERROR(scaled_dot_product_attention(q, t({2, 4, 6, 5}), t({2, 4, 6, 7})),
                    "batch/head dimensions differ: q [2, 3, 4, 5], k [2, 4, 6, 5], v [2, 4, 6, 7] (dimension 1");
  EXPECT_ATTO_ERROR(scaled_dot_product_attention(q, k, t({1, 3, 6, 7})), "batch/head dimensions differ");
  EXPECT_ATTO_ERROR(scaled_dot_product_attention(q, t({2, 3, 6, 4}), v),
                    "d_k mismatch: q [2, 3, 4, 5] has d_k = 5 but k [2, 3, 6, 4] has d_k = 4");
  EXPECT_ATTO_ERROR(scaled_dot_product_attention(q, k, t({2, 3, 7, 7})),
                    "Lk mismatch: k [2, 3, 6, 5] has 6 keys but v [2, 3, 7, 7] has 7 values");
  EXPECT_ATTO_ERROR(scaled_dot_product_attention(q, k, v, {.attn_mask = t({4, 5}, kBool)}),
                    "attn_mask of shape [4, 5] does not broadcast to the scores [2, 3, 4, 6] (B, H, Lq, Lk) of q "
                    "[2, 3, 4, 5] and k [2, 3, 6, 5]");
  EXPECT_ATTO_ERROR(scaled_dot_product_attention(q, k, v, {.attn_mask = t({2, 1, 6}, kBool)}), "does not broadcast");
  EXPECT_ATTO_ERROR(scaled_dot_product_attention(q, k, v, {.attn_mask = t({1, 2, 3, 4, 6}, kBool)}),
                    "attn_mask of shape [1, 2, 3, 4, 6] does not broadcast");
  EXPECT_ATTO_ERROR(
      scaled_dot_product_attention(t({2, 4, 5}), t({2, 6, 5}), t({2, 6, 7}), {.attn_mask = t({3, 4, 6}, kBool)}),
      "attn_mask of shape [3, 4, 6] does not broadcast to the scores [2, 4, 6] (N, Lq, Lk)");
  EXPECT_ATTO_ERROR(scaled_dot_product_attention(q, k, v, {.attn_mask = t({4, 6}, kFloat32)}),
                    "attn_mask must be bool or float64 (q's dtype), got float32 attn_mask [4, 6]");
  EXPECT_ATTO_ERROR(scaled_dot_product_attention(q, k, v, {.attn_mask = t({4, 6}, kInt64)}),
                    "attn_mask must be bool or float64");
  EXPECT_ATTO_ERROR(scaled_dot_product_attention(q, k, v, {.dropout_p = -0.1}),
                    "dropout_p must be in [0, 1), got -0.1");
  EXPECT_ATTO_ERROR(scaled_dot_product_attention(q, k, v, {.dropout_p = 1.0}), "dropout_p must be in [0, 1), got 1");
  EXPECT_ATTO_ERROR(scaled_dot_product_attention(q, k, v, {.dropout_p = std::nan("")}), "dropout_p must be in [0, 1)");
  EXPECT_ATTO_ERROR(scaled_dot_product_attention(q, k, v, {.scale = kInf}), "scale must be finite");
}

}  // namespace
