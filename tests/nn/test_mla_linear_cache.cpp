// CausalLM with multi-head latent attention (mla) and linear attention: cached incremental decoding (MLA's latent
// cache through the absorbed and the plain path, linear attention's running sums) against the full recomputation,
// as tests/nn/test_kv_cache.cpp checks it for mha: the same greedy tokens and logits within the same tolerances
// (float32 and float64), mixed prompt lengths, rows finishing early, several new positions at once and the crop
// beyond max_len; the caches' bytes per token; MLA's attention entropies and attention dropout inside the model.

#include <algorithm>
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "autograd/elementwise.h"
#include "autograd/matmul.h"
#include "autograd/reduce.h"
#include "autograd/rope.h"
#include "autograd/shape.h"
#include "nn/models.h"
#include "decode_testing.h"
#include "testing.h"

using namespace attograd;
using namespace attograd::testing;
using namespace attograd::nn;

namespace {

struct Variant {
  const char* name;
  AttentionSpec attention;
  bool absorbed = true;  // mla: the decoding path
};

const std::vector<Variant> kVariants = {
    {"mla absorbed", {.kind = "mla"}, true},
    {"mla plain", {.kind = "mla"}, false},
    {"mla q_rank absorbed", {.kind = "mla", .kv_rank = 6, .q_rank = 5, .rope_dim = 2}, true},
    {"mla q_rank plain", {.kind = "mla", .kv_rank = 6, .q_rank = 5, .rope_dim = 2}, false},
    {"linear", {.kind = "linear"}, true},
    {"mla rope only absorbed", {.kind = "mla", .rope = true}, true},  // DeepSeek's form: no position table
};

std::shared_ptr<CausalLM> make_lm(const Variant& v, Dtype dtype, int64_t max_len = 24, uint64_t seed = 5) {
  Generator gen(seed);
  auto m = std::make_shared<CausalLM>(CausalLMOptions{.vocab = 13,
                                                      .d_model = 32,
                                                      .n_head = 4,
                                                      .d_ff = 48,
                                                      .n_layers = 2,
                                                      .dropout = 0.1,
                                                      .max_len = max_len,
                                                      .dtype = dtype,
                                                      .attention = v.attention},
                                      gen);
  m->set_mla_absorbed_decode(v.absorbed);
  m->eval();
  return m;
}

const TokenRows& kSources = kDecodeSources;

// expect_same_decode, and the recomputation never decoded from a cache.
void expect_same(const DecodeTrace& cached, const DecodeTrace& full, Dtype dt) {
  expect_same_decode(cached, full, dt);
  EXPECT_EQ(full.cached_steps, 0);
}

}  // namespace

TEST(MlaLinearCache, BeginDecodeAllocatesTheVariantsCache) {
  for (Dtype dt : {kFloat32, kFloat64}) {
    auto mla = make_lm(kVariants[2], dt);
    DecodeState st = mla->begin_decode(kSources);
    ASSERT_EQ(st.cache.size(), 2u);
    for (const KVCache& kc : st.cache) {
      EXPECT_FALSE(kc.key.defined());
      const auto* c = dynamic_cast<const MlaLayerCache*>(kc.layer.get());
      ASSERT_TRUE(c != nullptr);
      // (B, C, kv_rank + rope_dim): capacity = longest prompt (5 + SEP) + max_decode_len (24) capped at max_len 24.
      EXPECT_EQ(c->cache.latent.shape(), (Shape{4, 24, 6 + 2}));
      EXPECT_EQ(c->cache.latent.dtype(), dt);
      EXPECT_EQ(c->capacity(), 24);
    }
    auto lin = make_lm(kVariants[4], dt);
    st = lin->begin_decode(kSources);
    ASSERT_EQ(st.cache.size(), 2u);
    for (const KVCache& kc : st.cache) {
      EXPECT_FALSE(kc.key.defined());
      const auto* c = dynamic_cast<const LinearAttentionState*>(kc.layer.get());
      ASSERT_TRUE(c != nullptr);
      EXPECT_EQ(c->state.shape(), (Shape{4, 4, 8, 8}));  // (B, H, d, d): no position axis
      EXPECT_EQ(c->normalizer.shape(), (Shape{4, 4, 8}));
      EXPECT_EQ(c->capacity(), 24);  // as far as begin_decode planned
    }
  }
}

TEST(MlaLinearCache, CachedEqualsRecomputedMixedLengthsFloat32AndFloat64) {
  for (const Variant& v : kVariants)
    for (Dtype dt : {kFloat32, kFloat64}) {
      SCOPED_TRACE(std::string(v.name) + " " + dtype_name(dt));
      auto m = make_lm(v, dt);
      const int64_t steps = m->max_decode_len() - 1;
      const DecodeTrace cached = run_greedy(*m, kSources, steps, true);
      EXPECT_EQ(cached.cached_steps, steps);  // every step decoded from the cache
      expect_same(cached, run_greedy(*m, kSources, steps, false), dt);
    }
}

TEST(MlaLinearCache, RowsFinishingEarly) {
  for (const Variant& v : kVariants) {
    SCOPED_TRACE(v.name);
    auto m = make_lm(v, kFloat32);
    const std::vector<int64_t> stop = {2, 5, 1, 9};
    const DecodeTrace cached = run_greedy(*m, kSources, 12, true, stop), full = run_greedy(*m, kSources, 12, false, stop);
    expect_same(cached, full, kFloat32);
    for (size_t b = 0; b < stop.size(); ++b) EXPECT_EQ(static_cast<int64_t>(cached.decoded[b].size()), stop[b]);
  }
}

TEST(MlaLinearCache, AbsorbedAndPlainGiveTheSameTokens) {
  for (const Variant& v : {kVariants[0], kVariants[2]})
    for (Dtype dt : {kFloat32, kFloat64}) {
      SCOPED_TRACE(std::string(v.name) + " " + dtype_name(dt));
      auto m = make_lm(v, dt);
      m->set_mla_absorbed_decode(true);
      const DecodeTrace absorbed = run_greedy(*m, kSources, 16, true);
      m->set_mla_absorbed_decode(false);
      const DecodeTrace plain = run_greedy(*m, kSources, 16, true);
      EXPECT_EQ(absorbed.cached_steps, 16);
      EXPECT_EQ(plain.cached_steps, 16);
      EXPECT_EQ(absorbed.decoded, plain.decoded);
      ASSERT_EQ(absorbed.logits.size(), plain.logits.size());
      for (size_t s = 0; s < plain.logits.size(); ++s)
        EXPECT_TRUE(all_close(absorbed.logits[s], plain.logits[s], decode_tolerance(dt), decode_tolerance(dt))) << "step " << s;
    }
}

// test_kv_cache.cpp's: n tokens at once == n - 1 then 1 resumed == a prefill then the n as new positions == full.
TEST(MlaLinearCache, SeveralTokensAtOnceEqualOneByOneResumed) {
  for (const Variant& v : kVariants)
    for (Dtype dt : {kFloat32, kFloat64}) {
      SCOPED_TRACE(std::string(v.name) + " " + dtype_name(dt));
      auto m = make_lm(v, dt);
      const TokenRows next = {{3, 9, 4, 7}, {0, 6, 11, 2}, {10, 10, 5, 8}, {12, 1, 3, 4}};
      const std::vector<int64_t> cached = expect_new_positions_at_once(*m, kSources, next, dt);
      for (size_t b = 0; b < next.size(); ++b)
        EXPECT_EQ(cached[b], static_cast<int64_t>(kSources[b].size() + 1 + next[b].size()));
    }
}

TEST(MlaLinearCache, RowDecodedAloneEqualsRowInBatch) {
  // A row's cache row, start and count are its own: alone or among rows of other lengths, the same tokens and
  // logits within 1e-12 (float64).
  for (const Variant& v : kVariants) {
    SCOPED_TRACE(v.name);
    auto m = make_lm(v, kFloat64);
    const DecodeTrace all = run_greedy(*m, kSources, 6, true);
    for (size_t b = 0; b < kSources.size(); ++b) {
      const DecodeTrace one = run_greedy(*m, {kSources[b]}, 6, true);
      EXPECT_EQ(one.decoded[0], all.decoded[b]);
      for (size_t s = 0; s < one.logits.size(); ++s) {
        const std::vector<double> a = all.logits[s].to_vector<double>(), o = one.logits[s].to_vector<double>();
        const size_t V = static_cast<size_t>(all.logits[s].size(1));
        for (size_t i = 0; i < V; ++i) EXPECT_NEAR(a[b * V + i], o[i], 1e-12) << "row " << b << " step " << s;
      }
    }
  }
}

TEST(MlaLinearCache, CropBeyondMaxLen) {
  // max_len 8: beyond it the model sees the last 8 tokens (positions restarting at 0), recomputed in the cached
  // path too (the latents' RoPE positions and linear attention's sums no longer hold for the slid window).
  for (const Variant& v : kVariants)
    for (Dtype dt : {kFloat32, kFloat64}) {
      SCOPED_TRACE(std::string(v.name) + " " + dtype_name(dt));
      auto m = make_lm(v, dt, 8);
      const DecodeTrace cached = run_greedy(*m, kSources, 14, true), full = run_greedy(*m, kSources, 14, false);
      EXPECT_GT(cached.cached_steps, 0);
      expect_same(cached, full, dt);
      std::vector<int64_t> seq = kSources[0];
      seq.push_back(SpecialTokens{}.sep);
      seq.insert(seq.end(), full.decoded[0].begin(), full.decoded[0].end() - 1);
      ASSERT_GT(seq.size(), 8u);
      const std::vector<int64_t> window(seq.end() - 8, seq.end());
      NoGradGuard no_grad;
      const Tensor l = m->forward(pack_rows({window}, 8, 0));  // (1, 8, V)
      const std::vector<double> want = gather_positions(l, {{0, 7}}).to_vector<double>();
      const std::vector<double> got = cached.logits.back().to_vector<double>();  // row 0 first
      for (size_t i = 0; i < want.size(); ++i) EXPECT_NEAR(got[i], want[i], decode_tolerance(dt)) << i;
    }
}

TEST(MlaLinearCache, BytesPerToken) {
  auto bytes = [](AttentionSpec a, Dtype dt = kFloat32, int64_t D = 32) {
    Generator gen(1);
    return CausalLM({.vocab = 7, .d_model = D, .n_head = 4, .d_ff = 8, .n_layers = 1, .dtype = dt, .attention = a}, gen)
        .kv_cache_bytes_per_token();
  };
  // D = 32, H = 4, d = 8.
  EXPECT_EQ(bytes({}), 2 * 4 * 8 * 4);
  EXPECT_EQ(bytes({}, kFloat64), 2 * 4 * 8 * 8);
  EXPECT_EQ(bytes({.kind = "local", .window = 3}), 2 * 4 * 8 * 4);
  EXPECT_EQ(bytes({.kind = "block-sparse", .block = 2}), 2 * 4 * 8 * 4);
  EXPECT_EQ(bytes({.kind = "gqa", .kv_heads = 2}), 2 * 2 * 8 * 4);
  EXPECT_EQ(bytes({.kind = "mla"}), (32 / 4 + 8 / 2) * 4);  // kv_rank d_model / 4, rope_dim head / 2
  EXPECT_EQ(bytes({.kind = "mla", .kv_rank = 6, .q_rank = 5, .rope_dim = 2}, kFloat64), (6 + 2) * 8);
  EXPECT_EQ(bytes({.kind = "linear"}), 4 * 8 * (8 + 1) * 4);  // per row
  // The target at D = 256, H = 4: MLA's cache at most a quarter of MHA's (96 vs 512 numbers).
  EXPECT_EQ(bytes({.kind = "mla"}, kFloat32, 256), (64 + 32) * 4);
  EXPECT_LE(4 * bytes({.kind = "mla"}, kFloat32, 256), bytes({}, kFloat32, 256));
  // ... and what begin_decode allocates agrees.
  for (Dtype dt : {kFloat32, kFloat64}) {
    auto mla = make_lm(kVariants[0], dt), lin = make_lm(kVariants[4], dt);
    const KVCache c = mla->begin_decode(kSources).cache[0];
    const Tensor& latent = dynamic_cast<const MlaLayerCache&>(*c.layer).cache.latent;
    EXPECT_EQ(latent.size(2) * static_cast<int64_t>(dtype_size(dt)), mla->kv_cache_bytes_per_token());
    EXPECT_EQ(mla->block(0)->self_attn->cache_bytes_per_token(), mla->kv_cache_bytes_per_token());
    const KVCache s = lin->begin_decode(kSources).cache[0];
    const auto& sums = dynamic_cast<const LinearAttentionState&>(*s.layer);
    EXPECT_EQ((sums.state.numel() + sums.normalizer.numel()) / 4 * static_cast<int64_t>(dtype_size(dt)),
              lin->kv_cache_bytes_per_token());
    EXPECT_EQ(lin->block(0)->self_attn->cache_bytes_per_token(), lin->kv_cache_bytes_per_token());
  }
}

namespace {

// MLA's attention row entropies recomputed from its probabilities, composed from the module's parameters by the
// formula of nn/mla.h: x (B, L, D) (the block's norm1 output) -> (B, H, L) as doubles.
std::vector<double> mla_entropy_reference(MultiHeadLatentAttention& m, const Tensor& x) {
  NoGradGuard no_grad;
  const MlaOptions& o = m.options();
  const int64_t B = x.size(0), L = x.size(1), H = o.n_heads, dn = o.qk_nope_head_dim, dr = o.qk_rope_head_dim;
  const int64_t dc = o.kv_lora_rank, dv = o.v_head_dim, dq = dn + dr;
  Tensor q = o.q_lora_rank == 0 ? linear(x, m.wq->weight)
                                : linear(m.q_norm->forward(linear(x, m.wq_a->weight)), m.wq_b->weight);
  q = reshape(q, {B, L, H, dq});
  Tensor q_pe =
      reshape(apply_rotary_emb(reshape(narrow(q, -1, dn, dr), {B, L, H * dr}), 0, o.rope_base, dr), {B, L, H, dr});
  const std::vector<double> qn = narrow(q, -1, 0, dn).to_vector<double>(), qr = q_pe.to_vector<double>();
  Tensor kv = linear(x, m.wkv_a->weight);
  Tensor c = m.kv_norm->forward(narrow(kv, -1, 0, dc));
  const std::vector<double> kr = apply_rotary_emb(narrow(kv, -1, dc, dr), 0, o.rope_base).to_vector<double>();
  const std::vector<double> kn =
      narrow(reshape(linear(c, m.wkv_b->weight), {B, L, H, dn + dv}), -1, 0, dn).to_vector<double>();
  const double scale = 1.0 / std::sqrt(static_cast<double>(dq));
  std::vector<double> out(static_cast<size_t>(B * H * L));
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t i = 0; i < L; ++i) {
        std::vector<double> s(static_cast<size_t>(i + 1));
        for (int64_t j = 0; j <= i; ++j) {
          double acc = 0;
          for (int64_t e = 0; e < dn; ++e)
            acc += qn[static_cast<size_t>(((b * L + i) * H + h) * dn + e)] *
                   kn[static_cast<size_t>(((b * L + j) * H + h) * dn + e)];
          for (int64_t e = 0; e < dr; ++e)
            acc +=
                qr[static_cast<size_t>(((b * L + i) * H + h) * dr + e)] * kr[static_cast<size_t>((b * L + j) * dr + e)];
          s[static_cast<size_t>(j)] = acc * scale;
        }
        const double mx = *std::max_element(s.begin(), s.end());
        double z = 0;
        for (double& e : s) z += (e = std::exp(e - mx));
        double ent = 0;
        for (double e : s) ent -= e / z * std::log(e / z);
        out[static_cast<size_t>((b * H + h) * L + i)] = ent;
      }
  return out;
}

}  // namespace

TEST(MlaLinearCache, MlaEntropiesEqualTheProbabilitiesReference) {
  for (const Variant& v : {kVariants[0], kVariants[2], kVariants[5]})
    for (Dtype dt : {kFloat32, kFloat64}) {
      SCOPED_TRACE(std::string(v.name) + " " + dtype_name(dt));
      auto m = make_lm(v, dt);
      m->track_attention_entropy(true);
      const Tensor tokens = pack_rows({{4, 5, 6, 3, 7, 8}, {9, 3, 2, 0, 0, 0}}, 6, 0);  // (2, 6)
      m->forward(tokens);
      const std::vector<AttentionEntropy> e = m->attention_entropies();
      ASSERT_EQ(e.size(), 2u);
      ASSERT_EQ(e[0].entropy.shape(), (Shape{2, 4, 6}));  // (B, H, L)
      ASSERT_EQ(e[1].entropy.shape(), (Shape{2, 4, 6}));
      EXPECT_EQ(e[0].rows.data<bool>()[6 + 3], false);  // padding
      // Block 0's input: embed * sqrt(D) plus the sinusoidal table (none with rope: positions only from the
      // decoupled RoPE), then norm1.
      Tensor h;
      {
        NoGradGuard no_grad;
        Tensor x = mul(m->embed->forward(tokens), std::sqrt(32.0));  // (2, 6, 32)
        EXPECT_EQ(m->pe.defined(), !v.attention.rope);
        if (m->pe.defined()) x = add(x, narrow(m->pe, 0, 0, 6));
        h = m->block(0)->norm1->forward(x);
      }
      const std::vector<double> want = mla_entropy_reference(*m->block(0)->attention<MultiHeadLatentAttention>(), h);
      const std::vector<double> got = e[0].entropy.to_vector<double>();
      ASSERT_EQ(got.size(), want.size());
      const double tol = dt == kFloat64 ? 1e-12 : 1e-5;
      for (size_t i = 0; i < want.size(); ++i) EXPECT_NEAR(got[i], want[i], tol) << i;
      EXPECT_EQ(got[0], 0.0);  // position 0 sees one key
      // Differentiable back to the projections.
      sum(e[1].entropy).backward();
      EXPECT_TRUE(m->block(1)->attention<MultiHeadLatentAttention>()->wkv_a->weight.grad().defined());
      m->track_attention_entropy(false);
      EXPECT_TRUE(m->attention_entropies().empty());
    }
}

TEST(MlaLinearCache, MlaAttentionDropoutInTheModel) {
  // The block's dropout applies to MLA's probabilities in training mode (as MultiheadAttention's): the same
  // generator replays the same output, another seed gives another one, eval mode has none.
  Generator gen(3);
  MultiHeadLatentAttention m({.d_model = 16,
                              .n_heads = 2,
                              .qk_nope_head_dim = 8,
                              .qk_rope_head_dim = 4,
                              .v_head_dim = 8,
                              .kv_lora_rank = 4,
                              .dropout = 0.5},
                             gen);
  const Tensor x = randn({2, 5, 16}, gen);
  Generator g1(7), g2(7), g3(8);
  m.set_generator(g1);
  const Tensor a = m.forward(x);
  m.set_generator(g2);
  const Tensor b = m.forward(x);
  m.set_generator(g3);
  const Tensor c = m.forward(x);
  EXPECT_TRUE(bitwise_equal(a, b));
  EXPECT_FALSE(all_close(a, c, 1e-3, 1e-3));
  m.eval();
  const Tensor e1 = m.forward(x), e2 = m.forward(x);
  EXPECT_TRUE(bitwise_equal(e1, e2));
  EXPECT_FALSE(all_close(e1, a, 1e-3, 1e-3));
  EXPECT_ATTO_ERROR((MultiHeadLatentAttention({.d_model = 16,
                                               .n_heads = 2,
                                               .qk_nope_head_dim = 8,
                                               .qk_rope_head_dim = 4,
                                               .v_head_dim = 8,
                                               .kv_lora_rank = 4,
                                               .dropout = 1.0})),
                    "dropout must be in [0, 1)");
  // In the model, the block's dropout is MLA's.
  auto lm = make_lm(kVariants[0], kFloat32);
  EXPECT_EQ(lm->block(0)->attention<MultiHeadLatentAttention>()->options().dropout, 0.1);
}

TEST(MlaLinearCache, ModuleDecodeRowsMatchForwardAndCheckTheirArguments) {
  // The modules' row-wise decode: two rows of different lengths, fed in two steps with their own starts and a padded
  // position, equal forward() of each row alone (float64); bad rows are errors naming the row.
  Generator gen(4);
  MultiHeadLatentAttention mla({.d_model = 12,
                                .n_heads = 2,
                                .qk_nope_head_dim = 4,
                                .qk_rope_head_dim = 2,
                                .v_head_dim = 3,
                                .kv_lora_rank = 5,
                                .q_lora_rank = 4,
                                .dtype = kFloat64},
                               gen);
  LinearAttention lin({.embed_dim = 12, .num_heads = 3, .causal = true, .dtype = kFloat64}, gen);
  const Tensor x = randn({2, 5, 12}, gen, {.dtype = kFloat64});  // row 0: 5 positions, row 1: the first 3
  NoGradGuard no_grad;
  const Tensor want_mla = mla.forward(x), want_lin = lin.forward(x);  // (2, 5, 12)
  const Tensor want_mla1 = mla.forward(narrow(x, 1, 0, 3)), want_lin1 = lin.forward(narrow(x, 1, 0, 3));
  for (bool absorbed : {true, false}) {
    MlaCache cache = mla.make_latent_cache(2, 6);
    auto [S, z] = lin.make_state(2);
    // Step 1: row 0 positions 0..2, row 1 positions 0..1 (its third slot is padding).
    const CachedAttentionRows first{.cache_row = {0, 1}, .start = {0, 0}, .count = {3, 2}};
    const Tensor a = mla.decode(narrow(x, 1, 0, 3), cache, first, absorbed);
    const Tensor la = lin.decode(narrow(x, 1, 0, 3), S, z, first);
    // Step 2, rows listed in the other order: row 1 position 2, row 0 positions 3..4.
    const Tensor x2 = cat({narrow(narrow(x, 0, 1, 1), 1, 2, 2), narrow(narrow(x, 0, 0, 1), 1, 3, 2)}, 0);  // (2, 2, 12)
    const CachedAttentionRows second{.cache_row = {1, 0}, .start = {2, 3}, .count = {1, 2}};
    const Tensor b = mla.decode(x2, cache, second, absorbed);
    const Tensor lb = lin.decode(x2, S, z, second);
    auto at = [](const Tensor& t, int64_t r, int64_t i) { return narrow(narrow(t, 0, r, 1), 1, i, 1); };
    for (int64_t i = 0; i < 3; ++i) {
      EXPECT_TRUE(all_close(at(a, 0, i), at(want_mla, 0, i), 1e-12, 1e-12)) << absorbed << " " << i;
      EXPECT_TRUE(all_close(at(la, 0, i), at(want_lin, 0, i), 1e-12, 1e-12)) << i;
    }
    for (int64_t i = 0; i < 2; ++i) {
      EXPECT_TRUE(all_close(at(a, 1, i), at(want_mla1, 1, i), 1e-12, 1e-12)) << absorbed << " " << i;
      EXPECT_TRUE(all_close(at(la, 1, i), at(want_lin1, 1, i), 1e-12, 1e-12)) << i;
      EXPECT_TRUE(all_close(at(b, 1, i), at(want_mla, 0, 3 + i), 1e-12, 1e-12)) << absorbed << " " << i;
      EXPECT_TRUE(all_close(at(lb, 1, i), at(want_lin, 0, 3 + i), 1e-12, 1e-12)) << i;
    }
    EXPECT_TRUE(all_close(at(b, 0, 0), at(want_mla1, 1, 2), 1e-12, 1e-12)) << absorbed;
    EXPECT_TRUE(all_close(at(lb, 0, 0), at(want_lin1, 1, 2), 1e-12, 1e-12));
    // Padding positions are not cached: cache row 1 position 3 onward is still zero.
    EXPECT_EQ(sum(narrow(narrow(cache.latent, 0, 1, 1), 1, 3, 3)).item(), 0.0);
  }
  MlaCache cache = mla.make_latent_cache(2, 4);
  auto [S, z] = lin.make_state(2);
  const Tensor x1 = narrow(x, 1, 0, 2);  // (2, 2, 12)
  EXPECT_ATTO_ERROR(mla.decode(x1, cache, CachedAttentionRows{.cache_row = {0, 2}, .start = {0, 0}, .count = {2, 2}}),
                    "row 1: cache row 2 is outside the cache's 2 rows");
  EXPECT_ATTO_ERROR(mla.decode(x1, cache, CachedAttentionRows{.cache_row = {0, 1}, .start = {0, 3}, .count = {2, 2}}),
                    "row 1: positions [3, 5) fall outside the cache's 4 positions");
  EXPECT_ATTO_ERROR(mla.decode(x1, cache, CachedAttentionRows{.cache_row = {0, 1}, .start = {0, 0}, .count = {3, 2}}),
                    "row 0: count 3 must be in [0, N=2]");
  EXPECT_ATTO_ERROR(mla.decode(x1, cache, CachedAttentionRows{.cache_row = {0}, .start = {0}, .count = {2}}),
                    "for each of the 2 input rows");
  EXPECT_ATTO_ERROR(lin.decode(x1, S, z, CachedAttentionRows{.cache_row = {0, 5}, .start = {0, 0}, .count = {2, 2}}),
                    "row 1: state row 5 is outside the state's 2 rows");
  Tensor bad = zeros({2, 3, 4, 3}, {.dtype = kFloat64});
  EXPECT_ATTO_ERROR(lin.decode(x1, bad, z, CachedAttentionRows{.cache_row = {0, 1}, .start = {0, 0}, .count = {2, 2}}),
                    "state must be (B, H=3, 4, 4)");
  EXPECT_EQ(lin.state_bytes_per_row(), 3 * 4 * 5 * 8);
}

TEST(MlaLinearCache, MlaBlocksPadKeysLinearRefusesTheMask) {
  // forward(tokens, true) blocks pad keys in mla: with a LEFT pad, the real tokens' logits are those of the sequence
  // without the pad (MLA's RoPE is relative: only the positions' differences enter the scores), float64 1e-10. So
  // with positions from the decoupled RoPE only (rope: no sinusoidal table, which is absolute).
  const Variant q_rank_rope{"mla q_rank rope only", {.kind = "mla", .kv_rank = 6, .q_rank = 5, .rope_dim = 2, .rope = true}};
  for (const Variant& v : {kVariants[5], q_rank_rope}) {
    SCOPED_TRACE(v.name);
    auto m = make_lm(v, kFloat64);
    NoGradGuard no_grad;
    const Tensor padded = m->forward(pack_rows({{0, 4, 5, 6, 3, 7}}, 6, 0), true);  // (1, 6, V), pad at 0
    const Tensor plain = m->forward(pack_rows({{4, 5, 6, 3, 7}}, 5, 0));            // (1, 5, V)
    EXPECT_TRUE(all_close(narrow(padded, 1, 1, 5), plain, 1e-10, 1e-10));
    const Tensor unmasked = m->forward(pack_rows({{0, 4, 5, 6, 3, 7}}, 6, 0), false);
    EXPECT_FALSE(all_close(narrow(unmasked, 1, 1, 5), plain, 1e-6, 1e-6));  // the mask did something
  }
  auto lin = make_lm(kVariants[4], kFloat32);
  EXPECT_ATTO_ERROR(lin->forward(pack_rows({{4, 0}}, 2, 0), true), "linear attention takes no key padding mask");
  EXPECT_NO_THROW(lin->forward(pack_rows({{4, 0}}, 2, 0), false));
}
