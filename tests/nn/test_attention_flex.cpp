// MultiheadAttention's mask_mod / score_mod options (autograd/flex.h) against the equivalent dense masks, gradients
// into a captured relative-position table through the module, and cached decoding with mods at the queries' absolute
// positions (nn/attention.h cached_attention).

#include <vector>

#include "autograd/attention.h"
#include "autograd/flex.h"
#include "nn/attention.h"
#include "testing.h"

using namespace attograd;
using namespace attograd::nn;
using namespace attograd::testing;

TEST(MultiheadAttentionFlex, AlibiAndCausalEqualTheDenseMask) {
  const int64_t B = 2, L = 11, E = 12, H = 3;
  Generator gen(1);
  MultiheadAttention plain({.embed_dim = E, .num_heads = H, .dtype = kFloat64}, gen);
  MultiheadAttention flex({.embed_dim = E, .num_heads = H, .dtype = kFloat64, .mask_mod = causal_mask(),
                           .score_mod = alibi(H)});
  flex.load_state_dict(plain.state_dict());
  Tensor x = rand_leaf({B, L, E}, gen);
  // The dense equivalent: (B * H, L, L) float mask slope[h] * (j - i), -inf above the diagonal.
  const Tensor slopes = alibi_slopes(H);
  Tensor mask = zeros({B * H, L, L}, {.dtype = kFloat64});
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t i = 0; i < L; ++i)
        for (int64_t j = 0; j < L; ++j)
          mask.data<double>()[((b * H + h) * L + i) * L + j] =
              j > i ? -std::numeric_limits<double>::infinity() : slopes.data<double>()[h] * static_cast<double>(j - i);
  MhaResult a = plain(x, x, x, {.attn_mask = mask, .average_attn_weights = false});
  MhaResult f = flex(x, x, x, {.average_attn_weights = false});
  EXPECT_TRUE(all_close(f.output, a.output, 1e-12));
  EXPECT_TRUE(all_close(f.weights, a.weights, 1e-12));
  sum(a.output).backward();
  Tensor gx = x.grad().detach();
  x.zero_grad();
  sum(f.output).backward();
  EXPECT_TRUE(all_close(x.grad(), gx, 1e-12));
  EXPECT_TRUE(all_close(flex.in_proj_weight.grad(), plain.in_proj_weight.grad(), 1e-12));
}

TEST(MultiheadAttentionFlex, PerCallDocumentMaskAndRelativeBiasGradcheck) {
  const int64_t B = 2, L = 7, E = 8, H = 2;
  Generator gen(2);
  Tensor table = rand_leaf({H, 5}, gen);  // D = 2
  MultiheadAttention mha({.embed_dim = E, .num_heads = H, .dtype = kFloat64,
                          .score_mod = relative_position_bias(table)},
                         gen);
  const Tensor doc = from_vector<int64_t>({0, 0, 0, 1, 1, 1, 1, 0, 1, 1, 2, 2, 2, 3}, {B, L});
  Tensor x = rand_leaf({B, L, E}, gen);
  EXPECT_TRUE(gradcheck_ok(
      [&](const std::vector<Tensor>&) {
        return mha(x, x, x, {.need_weights = false, .mask_mod = document_mask(doc), .score_mod = softcap(2.0)})
            .output;
      },
      {x, table, mha.in_proj_weight}));
}

TEST(MultiheadAttentionFlex, ModsRejectExtraKeys) {
  EXPECT_THROW(MultiheadAttention({.embed_dim = 4, .num_heads = 2, .add_zero_attn = true, .score_mod = alibi(2)}),
               Error);
  MultiheadAttention m({.embed_dim = 4, .num_heads = 2, .add_bias_kv = true});
  Tensor x = zeros({1, 3, 4});
  EXPECT_THROW(m(x, x, x, {.mask_mod = causal_mask()}), Error);
  MultiheadAttention ok({.embed_dim = 4, .num_heads = 2});
  EXPECT_THROW(ok(x, x, x, {.mask_mod = causal_mask(), .mod_q_offset = -1}), Error);
}

// cached_attention with mods equals the fused op over the whole sequence at the decoded rows: the mods see the
// queries' absolute positions.
TEST(CachedAttentionFlex, DecodedRowsEqualTheFullSequence) {
  const int64_t B = 2, L = 12, H = 2, d = 4, N = 3, start = L - N;
  Generator gen(3);
  for (Dtype dt : {kFloat64, kFloat32}) {
    Tensor q = rand_leaf({B, L, H * d}, gen).detach().to(dt), k = rand_leaf({B, L, H * d}, gen).detach().to(dt),
           v = rand_leaf({B, L, H * d}, gen).detach().to(dt);
    const Tensor doc = from_vector<int64_t>({0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 2, 2, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1},
                                            {B, L});
    struct Case {
      MaskMod mask;
      ScoreMod score;
      bool causal;
    };
    const std::vector<Case> cases = {{causal_mask(), alibi(H), false},
                                     {document_mask(doc), softcap(1.5), true},
                                     {prefix_lm_mask(4), relative_position_bias(rand_leaf({H, 7}, gen).detach()), false}};
    for (const Case& c : cases) {
      NoGradGuard ng;
      const Tensor full = multi_head_attention(q, k, v, H, {.mask_mod = c.mask, .score_mod = c.score}).output;
      auto [kc, vc] = make_kv_cache(B, H, L, d, d, dt);
      write_kv_cache(kc, vc, k, 0, v, 0, {.cache_row = {0, 1}, .start = {0, 0}, .count = {L, L}});
      const Tensor qn = narrow(q, 1, start, N);
      const Tensor out = cached_attention(qn, 0, kc, vc, {.cache_row = {0, 1}, .start = {start, start}, .count = {N, N}},
                                          1.0 / std::sqrt(static_cast<double>(d)), c.causal, nullptr, -1,
                                          {.mask_mod = c.mask, .score_mod = c.score});
      EXPECT_TRUE(all_close(out, narrow(full, 1, start, N), dt == kFloat64 ? 1e-12 : 1e-5));
    }
  }
}
