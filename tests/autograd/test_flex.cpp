// mask_mod / score_mod in the fused attention (autograd/flex.h): block masks, the dedicated causal / window / block
// layouts re-expressed as mask_mods (equal to 1e-12 in float64, forward and gradients), gradchecks through q, k, v and
// captured tensors, PyTorch 1.13 goldens of the library mods (tests/autograd/golden_flex.py), cached decoding offsets
// and the errors.

#include <atomic>
#include <vector>

#include "autograd/attention.h"
#include "autograd/flex.h"
#include "testing.h"

using namespace attograd;
using namespace attograd::testing;

namespace {

struct Grads {
  Tensor out, dq, dk, dv;
};

// Output and q, k, v gradients under a fixed upstream gradient go.
Grads run(const Tensor& q0, const Tensor& k0, const Tensor& v0, const Tensor& go, const AttentionOptions& o) {
  Tensor q = q0.detach().requires_grad_(), k = k0.detach().requires_grad_(), v = v0.detach().requires_grad_();
  Tensor out = scaled_dot_product_attention(q, k, v, o).output;
  out.backward(go);
  return {out.detach(), q.grad(), k.grad(), v.grad()};
}

void expect_same(const Grads& a, const Grads& b, double tol) {
  EXPECT_TRUE(all_close(a.out, b.out, tol));
  EXPECT_TRUE(all_close(a.dq, b.dq, tol));
  EXPECT_TRUE(all_close(a.dk, b.dk, tol));
  EXPECT_TRUE(all_close(a.dv, b.dv, tol));
}

// A (B, H, L, d) float64 leaf.
Tensor input(int64_t B, int64_t H, int64_t L, int64_t d, Generator& gen) { return rand_leaf({B, H, L, d}, gen); }

}  // namespace

TEST(BlockMask, ClassifiesBlocksAndMatchesTheMask) {
  const BlockMask bm = create_block_mask(causal_mask(), 0, 0, 10, 10, 4);
  ASSERT_EQ(bm.q_blocks(), 3);
  ASSERT_EQ(bm.kv_blocks(), 3);
  // Diagonal blocks partial, below full, above empty.
  EXPECT_EQ(bm.kind(0, 0, 0, 0), BlockKind::Partial);
  EXPECT_EQ(bm.kind(0, 0, 1, 0), BlockKind::Full);
  EXPECT_EQ(bm.kind(0, 0, 0, 1), BlockKind::Empty);
  EXPECT_EQ(bm.kind(0, 0, 2, 2), BlockKind::Partial);  // ragged 2 x 2
  const auto c = bm.counts();
  EXPECT_EQ(c[0], 3);
  EXPECT_EQ(c[1], 3);
  EXPECT_EQ(c[2], 3);
  const Tensor dense = bm.to_dense();
  ASSERT_EQ(dense.shape(), Shape({1, 1, 10, 10}));
  for (int64_t i = 0; i < 10; ++i)
    for (int64_t j = 0; j < 10; ++j) EXPECT_EQ(dense.data<bool>()[i * 10 + j], j <= i) << i << "," << j;
  // A query offset shifts the positions mask_mod sees: queries 6..9 over keys 0..13.
  const BlockMask off = create_block_mask(causal_mask(), 0, 0, 4, 14, 4, 6);
  EXPECT_EQ(off.kind(0, 0, 0, 0), BlockKind::Full);     // keys 0..3
  EXPECT_EQ(off.kind(0, 0, 0, 1), BlockKind::Partial);  // keys 4..7: query 6 sees 4..6
  EXPECT_EQ(off.kind(0, 0, 0, 2), BlockKind::Partial);  // keys 8..11: query 9 sees 8, 9
  EXPECT_EQ(off.kind(0, 0, 0, 3), BlockKind::Empty);    // keys 12, 13
}

TEST(BlockMask, BuiltOncePerShapeAndCached) {
  auto calls = std::make_shared<std::atomic<int64_t>>(0);
  MaskMod m([calls](int64_t, int64_t, int64_t q, int64_t kv) {
    ++*calls;
    return kv <= q;
  });
  Generator gen(1);
  const int64_t L = 200;
  Tensor q = input(1, 2, L, 4, gen), k = input(1, 2, L, 4, gen), v = input(1, 2, L, 4, gen);
  NoGradGuard ng;
  scaled_dot_product_attention(q, k, v, {.mask_mod = m});
  const int64_t first = calls->load();
  EXPECT_GE(first, L * L);  // the block mask's classification (once for both heads: the mask ignores h)
  scaled_dot_product_attention(q, k, v, {.mask_mod = m});
  // The second call calls mask_mod no more: the block mask kept its partial blocks' elements.
  EXPECT_EQ(calls->load(), first);
  // Without kept elements (a new MaskMod, so a new cache), the per-element test of the partial blocks (the diagonal
  // ones, per head) calls it 2 (3 * 64^2 + 8^2) times per call, fewer than one sweep of the scores.
  const int64_t saved = detail::block_mask_bits_limit();
  detail::block_mask_bits_limit() = 0;
  auto calls2 = std::make_shared<std::atomic<int64_t>>(0);
  MaskMod m2([calls2](int64_t, int64_t, int64_t q, int64_t kv) {
    ++*calls2;
    return kv <= q;
  });
  const Tensor o1 = scaled_dot_product_attention(q, k, v, {.mask_mod = m2}).output;
  const int64_t first2 = calls2->load();
  const Tensor o2 = scaled_dot_product_attention(q, k, v, {.mask_mod = m2}).output;
  detail::block_mask_bits_limit() = saved;
  EXPECT_EQ(calls2->load() - first2, 2 * (3 * 64 * 64 + 8 * 8));
  EXPECT_TRUE(bitwise_equal(o2, scaled_dot_product_attention(q, k, v, {.mask_mod = m}).output));
  const MaskMod copy = m;  // copies share the cache: no new sweep
  const int64_t before = calls->load();
  EXPECT_EQ(copy.block_mask(1, 2, L, L, 0).counts(), m.block_mask(1, 2, L, L, 0).counts());
  EXPECT_EQ(calls->load(), before);
}

// The dedicated paths against their mask_mods, float64, forward and gradients to 1e-12, at a length whose
// probabilities are recomputed (77 * 77 > 64 * 64) and one whose are kept by the forward.
class FlexEquals : public ::testing::TestWithParam<int64_t> {};

TEST_P(FlexEquals, CausalWindowAndBlockLayout) {
  const int64_t L = GetParam();
  Generator gen(7);
  Tensor q = input(2, 2, L, 8, gen), k = input(2, 2, L, 8, gen), v = input(2, 2, L, 8, gen),
         go = input(2, 2, L, 8, gen);
  expect_same(run(q, k, v, go, {.mask_mod = causal_mask()}), run(q, k, v, go, {.is_causal = true}), 1e-12);
  expect_same(run(q, k, v, go, {.mask_mod = sliding_window_mask(9, true)}),
              run(q, k, v, go, {.is_causal = true, .window = 9}), 1e-12);
  expect_same(run(q, k, v, go, {.mask_mod = sliding_window_mask(5, false)}), run(q, k, v, go, {.window = 5}), 1e-12);
  const int64_t bs = 8, nb = (L + bs - 1) / bs;
  const Tensor layout = bigbird_block_layout({.q_blocks = nb, .k_blocks = nb, .random_blocks = 1, .seed = 3});
  expect_same(run(q, k, v, go, {.mask_mod = block_layout_mask(layout, bs)}),
              run(q, k, v, go, {.block_size = bs, .block_layout = layout}), 1e-12);
  // Calling mask_mod per element instead of reading the kept elements gives the same.
  const int64_t saved = detail::block_mask_bits_limit();
  detail::block_mask_bits_limit() = 0;
  const Grads no_bits = run(q, k, v, go, {.mask_mod = sliding_window_mask(9, true)});
  detail::block_mask_bits_limit() = saved;
  expect_same(no_bits, run(q, k, v, go, {.is_causal = true, .window = 9}), 1e-12);
  // A prebuilt block mask of another block size gives the same.
  expect_same(run(q, k, v, go, {.block_mask = create_block_mask(causal_mask(), 0, 0, L, L, 16)}),
              run(q, k, v, go, {.is_causal = true}), 1e-12);
  // A mod together with the dedicated options and a float mask: both apply.
  const Tensor bias = rand_leaf({L, L}, gen).detach();
  expect_same(run(q, k, v, go, {.attn_mask = bias, .mask_mod = causal_mask()}),
              run(q, k, v, go, {.attn_mask = bias, .is_causal = true}), 1e-12);
}

INSTANTIATE_TEST_SUITE_P(Lengths, FlexEquals, ::testing::Values<int64_t>(20, 77));

TEST(Flex, QueryOffsetSeesAbsolutePositions) {
  // Queries at absolute positions 5..8 over keys 0..8, causal: the same as a bool mask blocking j > 5 + i.
  Generator gen(2);
  Tensor q = input(1, 2, 4, 8, gen), k = input(1, 2, 9, 8, gen), v = input(1, 2, 9, 8, gen),
         go = input(1, 2, 4, 8, gen);
  Tensor blocked = zeros({4, 9}, {.dtype = kBool});
  for (int64_t i = 0; i < 4; ++i)
    for (int64_t j = 0; j < 9; ++j) blocked.data<bool>()[i * 9 + j] = j > 5 + i;
  expect_same(run(q, k, v, go, {.mask_mod = causal_mask(), .mod_q_offset = 5}),
              run(q, k, v, go, {.attn_mask = blocked}), 1e-12);
  // ALiBi sees the offset too: bias slope * (j - (5 + i)).
  const Tensor slopes = alibi_slopes(2);
  Tensor bias = zeros({1, 2, 4, 9}, {.dtype = kFloat64});
  for (int64_t h = 0; h < 2; ++h)
    for (int64_t i = 0; i < 4; ++i)
      for (int64_t j = 0; j < 9; ++j)
        bias.data<double>()[(h * 4 + i) * 9 + j] = slopes.data<double>()[h] * static_cast<double>(j - 5 - i);
  expect_same(run(q, k, v, go, {.score_mod = alibi(slopes), .mod_q_offset = 5}),
              run(q, k, v, go, {.attn_mask = bias}), 1e-12);
}

TEST(Flex, AlibiSlopes) {
  EXPECT_TRUE(all_close(alibi_slopes(4), from_vector<double>({0.25, 0.0625, 0.015625, 0.00390625}, {4}), 0));
  // H = 6: the 4 slopes of 4 heads, then every other slope of 8 heads (2^-1, 2^-3).
  EXPECT_TRUE(all_close(alibi_slopes(6),
                        from_vector<double>({0.25, 0.0625, 0.015625, 0.00390625, 0.5, 0.125}, {6}), 0));
}

// PyTorch 1.13 with the dense equivalent of each library mod.
class FlexGolden : public ::testing::TestWithParam<std::string> {};

TEST_P(FlexGolden, MatchesPyTorch) {
  auto g = load_golden("autograd/flex_" + GetParam() + ".golden");
  const int64_t* cfg = g["config"].data<int64_t>();
  const int64_t H = cfg[1], prefix = cfg[4];
  AttentionOptions o;
  const std::string c = GetParam();
  if (c.rfind("alibi", 0) == 0) {
    EXPECT_TRUE(all_close(alibi_slopes(H), g["slopes"], 1e-15));
    o.score_mod = alibi(H);
    o.mask_mod = causal_mask();
  } else if (c == "softcap") {
    o.score_mod = softcap(2.0);
  } else if (c == "prefix_lm") {
    o.mask_mod = prefix_lm_mask(prefix);
  } else if (c == "prefix_lm_rows") {
    o.mask_mod = prefix_lm_mask(g["prefixes"].to_vector<int64_t>());
  } else if (c == "document" || c == "document_rows") {
    o.mask_mod = document_mask(g["doc_ids"]);
  }
  const auto expect_golden = [&](const AttentionOptions& opts) {
    const Grads r = run(g["q"], g["k"], g["v"], g["grad_output"], opts);
    EXPECT_TRUE(all_close(r.out, g["output"], 1e-13, 1e-12));
    EXPECT_TRUE(all_close(r.dq, g["grad.q"], 1e-13, 1e-12));
    EXPECT_TRUE(all_close(r.dk, g["grad.k"], 1e-13, 1e-12));
    EXPECT_TRUE(all_close(r.dv, g["grad.v"], 1e-13, 1e-12));
  };
  expect_golden(o);
  if (c.ends_with("_rows")) {
    // The same through a block mask of 4 x 4 blocks per batch row: some blocks are fully masked (skipped), among
    // them one below the diagonal that causality alone would compute.
    const int64_t B = cfg[0], L = cfg[2];
    const BlockMask bm = create_block_mask(o.mask_mod, B, 0, L, L, 4);
    EXPECT_GT(bm.counts()[0], 0);
    bool below = false;
    for (int64_t b = 0; b < B; ++b)
      for (int64_t qb = 0; qb < bm.q_blocks(); ++qb)
        for (int64_t kb = 0; kb < qb; ++kb) below = below || bm.kind(b, 0, qb, kb) == BlockKind::Empty;
    EXPECT_EQ(below, c == "document_rows");
    expect_golden({.block_mask = bm});
  }
}

INSTANTIATE_TEST_SUITE_P(Mods, FlexGolden,
                         ::testing::Values("alibi_h4", "alibi_h6", "softcap", "prefix_lm", "document",
                                           "prefix_lm_rows", "document_rows"));

// prefix_lm_mask (one length per row) and document_mask equal attention under the explicit dense Bool mask they
// stand for (TRUE = blocked, per batch row), float64, forward and gradients, to 1e-12; at a length whose
// probabilities the kernel recomputes (77) and one it keeps (20).
TEST(Flex, PrefixLmAndDocumentEqualDenseMasks) {
  for (const int64_t L : {20, 77}) {
    SCOPED_TRACE(L);
    Generator gen(19);
    const int64_t B = 3, H = 2;
    Tensor q = input(B, H, L, 4, gen), k = input(B, H, L, 4, gen), v = input(B, H, L, 4, gen),
           go = input(B, H, L, 4, gen);
    const std::vector<int64_t> prefix = {0, 7, L};
    std::vector<int64_t> ids(static_cast<size_t>(B * L));
    for (int64_t b = 0; b < B; ++b)
      for (int64_t l = 0; l < L; ++l) ids[static_cast<size_t>(b * L + l)] = l / (b + 3 + l / 11);  // ragged runs
    const Tensor doc = from_vector<int64_t>(ids, {B, L});
    Tensor prefix_blocked = zeros({B, 1, L, L}, {.dtype = kBool}), doc_blocked = zeros({B, 1, L, L}, {.dtype = kBool});
    for (int64_t b = 0; b < B; ++b)
      for (int64_t i = 0; i < L; ++i)
        for (int64_t j = 0; j < L; ++j) {
          const auto p = prefix[static_cast<size_t>(b)];
          prefix_blocked.data<bool>()[(b * L + i) * L + j] = !((i < p && j < p) || j <= i);
          doc_blocked.data<bool>()[(b * L + i) * L + j] =
              !(j <= i && ids[static_cast<size_t>(b * L + i)] == ids[static_cast<size_t>(b * L + j)]);
        }
    expect_same(run(q, k, v, go, {.mask_mod = prefix_lm_mask(prefix)}), run(q, k, v, go, {.attn_mask = prefix_blocked}),
                1e-12);
    expect_same(run(q, k, v, go, {.mask_mod = document_mask(doc)}), run(q, k, v, go, {.attn_mask = doc_blocked}),
                1e-12);
  }
}

// float64 gradchecks through q, k, v and the captured tensors.
TEST(FlexGradcheck, AlibiWithLearnedSlopes) {
  Generator gen(11);
  Tensor q = input(1, 3, 9, 4, gen), k = input(1, 3, 9, 4, gen), v = input(1, 3, 9, 4, gen);
  Tensor slopes = alibi_slopes(3).requires_grad_();
  EXPECT_TRUE(gradcheck_ok(
      [&](const std::vector<Tensor>& in) {
        return scaled_dot_product_attention(in[0], in[1], in[2],
                                            {.mask_mod = causal_mask(), .score_mod = alibi(in[3])})
            .output;
      },
      {q, k, v, slopes}));
}

TEST(FlexGradcheck, Softcap) {
  Generator gen(12);
  Tensor q = rand_leaf({2, 2, 7, 4}, gen, -2, 2), k = rand_leaf({2, 2, 8, 4}, gen, -2, 2), v = input(2, 2, 8, 3, gen);
  EXPECT_TRUE(gradcheck_ok(
      [&](const std::vector<Tensor>& in) {
        return scaled_dot_product_attention(in[0], in[1], in[2], {.score_mod = softcap(1.5)}).output;
      },
      {q, k, v}));
}

TEST(FlexGradcheck, PrefixLmAndDocumentMask) {
  Generator gen(13);
  Tensor q = input(2, 2, 10, 4, gen), k = input(2, 2, 10, 4, gen), v = input(2, 2, 10, 4, gen);
  EXPECT_TRUE(gradcheck_ok(
      [&](const std::vector<Tensor>& in) {
        return scaled_dot_product_attention(in[0], in[1], in[2], {.mask_mod = prefix_lm_mask({3, 6})}).output;
      },
      {q, k, v}));
  const Tensor doc = from_vector<int64_t>({0, 0, 0, 1, 1, 2, 2, 2, 2, 3, 0, 1, 1, 1, 1, 1, 2, 2, 3, 3}, {2, 10});
  EXPECT_TRUE(gradcheck_ok(
      [&](const std::vector<Tensor>& in) {
        return scaled_dot_product_attention(in[0], in[1], in[2], {.mask_mod = document_mask(doc)}).output;
      },
      {q, k, v}));
}

TEST(FlexGradcheck, RelativePositionBiasTable) {
  // A learned (H, 2 D + 1) table, D = 3 (farther offsets share the end entries), with grouped-query heads, a
  // sliding window and the entropy: gradients reach the table from every path.
  Generator gen(14);
  Tensor q = input(2, 4, 9, 4, gen), k = input(2, 2, 9, 4, gen), v = input(2, 2, 9, 4, gen);
  Tensor table = rand_leaf({4, 7}, gen);
  EXPECT_TRUE(gradcheck_ok(
      [&](const std::vector<Tensor>& in) {
        AttentionResult r = scaled_dot_product_attention(
            in[0], in[1], in[2],
            {.is_causal = true, .window = 6, .need_entropy = true, .score_mod = relative_position_bias(in[3])});
        return add(sum(r.output), sum(mul(r.entropy, 0.3)));
      },
      {q, k, v, table}));
  // Only the table wants a gradient: it still gets one (the same as above).
  Tensor t2 = table.detach().requires_grad_();
  Tensor out = scaled_dot_product_attention(q.detach(), k.detach(), v.detach(),
                                            {.score_mod = relative_position_bias(t2)})
                   .output;
  sum(out).backward();
  Tensor t3 = table.detach().requires_grad_(), q3 = q.detach().requires_grad_();
  sum(scaled_dot_product_attention(q3, k.detach(), v.detach(), {.score_mod = relative_position_bias(t3)}).output)
      .backward();
  EXPECT_TRUE(all_close(t2.grad(), t3.grad(), 0));
  EXPECT_GT(sum(abs(t2.grad())).item<double>(), 0.0);
}

TEST(FlexGradcheck, MultiHeadAndPackedEntryPoints) {
  Generator gen(15);
  Tensor q = rand_leaf({2, 8, 6}, gen), k = rand_leaf({2, 8, 6}, gen), v = rand_leaf({2, 8, 6}, gen);
  Tensor qkv = rand_leaf({2, 8, 18}, gen);
  Tensor slopes = alibi_slopes(3).requires_grad_();
  EXPECT_TRUE(gradcheck_ok(
      [&](const std::vector<Tensor>& in) {
        return multi_head_attention(in[0], in[1], in[2], 3,
                                    {.mask_mod = prefix_lm_mask(3), .score_mod = alibi(in[3])})
            .output;
      },
      {q, k, v, slopes}));
  EXPECT_TRUE(gradcheck_ok(
      [&](const std::vector<Tensor>& in) {
        return packed_self_attention(in[0], 3, {.mask_mod = causal_mask(), .score_mod = softcap(1.0)}).output;
      },
      {qkv}));
}

TEST(Flex, Float32AgreesWithFloat64) {
  Generator gen(16);
  Tensor q = input(2, 4, 70, 8, gen), k = input(2, 4, 70, 8, gen), v = input(2, 4, 70, 8, gen),
         go = input(2, 4, 70, 8, gen);
  Tensor slopes = alibi_slopes(4).requires_grad_();
  Tensor slopes32 = alibi_slopes(4).to(kFloat32).requires_grad_();
  const AttentionOptions o64{.mask_mod = document_mask(from_vector<int64_t>(std::vector<int64_t>(140, 0), {2, 70})),
                             .score_mod = alibi(slopes)};
  const Grads r64 = run(q, k, v, go, o64);
  AttentionOptions o32 = o64;
  o32.score_mod = alibi(slopes32);
  const Grads r32 = run(q.to(kFloat32), k.to(kFloat32), v.to(kFloat32), go.to(kFloat32), o32);
  EXPECT_TRUE(all_close(r32.out.to(kFloat64), r64.out, 1e-5));
  EXPECT_TRUE(all_close(r32.dq.to(kFloat64), r64.dq, 1e-4));
  EXPECT_TRUE(all_close(r32.dk.to(kFloat64), r64.dk, 1e-4));
  EXPECT_TRUE(all_close(r32.dv.to(kFloat64), r64.dv, 1e-4));
  EXPECT_EQ(slopes32.grad().dtype(), kFloat32);
  EXPECT_TRUE(all_close(slopes32.grad().to(kFloat64), slopes.grad(), 1e-3, 1e-4));
}

TEST(Flex, FullyMaskedRowsGiveZerosNotNaN) {
  // A mask_mod that leaves query 2 without keys: zero output row and finite gradients.
  Generator gen(17);
  Tensor q = input(1, 1, 5, 4, gen), k = input(1, 1, 5, 4, gen), v = input(1, 1, 5, 4, gen);
  MaskMod m([](int64_t, int64_t, int64_t qi, int64_t kv) { return qi != 2 && kv <= qi; });
  Tensor out = scaled_dot_product_attention(q, k, v, {.mask_mod = m, .score_mod = softcap(3.0)}).output;
  sum(out).backward();
  for (int64_t x = 0; x < 4; ++x) EXPECT_EQ(out.data<double>()[2 * 4 + x], 0.0);
  for (double g : q.grad().to_vector<double>()) EXPECT_TRUE(std::isfinite(g));
}

TEST(Flex, Errors) {
  Generator gen(18);
  Tensor q = input(1, 2, 6, 4, gen), k = input(1, 2, 6, 4, gen), v = input(1, 2, 6, 4, gen);
  // Both a mask_mod and a block mask.
  EXPECT_THROW(scaled_dot_product_attention(
                   q, k, v, {.mask_mod = causal_mask(), .block_mask = create_block_mask(causal_mask(), 0, 0, 6, 6)}),
               Error);
  // A block mask of other lengths or another offset.
  EXPECT_THROW(scaled_dot_product_attention(q, k, v, {.block_mask = create_block_mask(causal_mask(), 0, 0, 5, 6)}),
               Error);
  EXPECT_THROW(scaled_dot_product_attention(q, k, v, {.block_mask = create_block_mask(causal_mask(), 0, 0, 6, 6),
                                                      .mod_q_offset = 2}),
               Error);
  // A capture read out of range, with the wrong number of indices, or not captured at all.
  ScoreMod bad{.fn = [](const Score& s, int64_t, int64_t h, int64_t, int64_t, const Captures& c) {
                 return s + c[0](h + 5);
               },
               .captures = {zeros({2}, {.dtype = kFloat64})}};
  EXPECT_THROW(scaled_dot_product_attention(q, k, v, {.score_mod = bad}), Error);
  ScoreMod rank{.fn = [](const Score& s, int64_t, int64_t h, int64_t, int64_t, const Captures& c) {
                  return s + c[0](h, 0);
                },
                .captures = {zeros({2}, {.dtype = kFloat64})}};
  EXPECT_THROW(scaled_dot_product_attention(q, k, v, {.score_mod = rank}), Error);
  ScoreMod none{.fn = [](const Score& s, int64_t, int64_t, int64_t, int64_t, const Captures& c) {
    return s + c[1]();
  }};
  EXPECT_THROW(scaled_dot_product_attention(q, k, v, {.score_mod = none}), Error);
  // An Int64 capture, captures without a function, a negative offset, a document mask too short.
  EXPECT_THROW(scaled_dot_product_attention(
                   q, k, v, {.score_mod = {.fn = bad.fn, .captures = {zeros({2}, {.dtype = kInt64})}}}),
               Error);
  EXPECT_THROW(scaled_dot_product_attention(q, k, v, {.score_mod = {.captures = {zeros({2})}}}), Error);
  EXPECT_THROW(scaled_dot_product_attention(q, k, v, {.mask_mod = causal_mask(), .mod_q_offset = -1}), Error);
  EXPECT_THROW(scaled_dot_product_attention(q, k, v, {.mask_mod = document_mask(zeros({1, 4}, {.dtype = kInt64}))}),
               Error);
  EXPECT_THROW(create_block_mask(MaskMod(), 0, 0, 4, 4), Error);
  EXPECT_THROW(softcap(0.0), Error);
  EXPECT_THROW(alibi_slopes(0), Error);
}
