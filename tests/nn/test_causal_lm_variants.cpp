// The MultiheadAttention variants inside the decoder-only CausalLM (ModelSpec::attention: gqa, local, block-sparse,
// RoPE, checkpointing): key/value-cached decoding equals the recomputation for each (float32 and float64, mixed
// prompt lengths, the crop beyond max_len; the tolerances of test_kv_cache.cpp) with a cache of H_kv heads; tracked
// entropies equal those of the block's module called directly (bitwise); gradient checkpointing gives bitwise the
// gradients of the model without it (dropout 0.1 in training mode) and a lower allocator peak; and the
// combinations that are refused say so.

#include <algorithm>
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "autograd/attention.h"
#include "autograd/indexing.h"
#include "autograd/loss.h"
#include "autograd/memory.h"
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
  AttentionSpec spec;
};

// Each MultiheadAttention kind, small enough that windows and blocks cut the sequence: 4 heads of 8 features.
const std::vector<Variant> kVariants = {
    {"gqa", {.kind = "gqa", .kv_heads = 2}},
    {"mqa", {.kind = "gqa", .kv_heads = 1}},
    {"rope", {.kind = "mha", .rope = true}},
    {"gqa+rope", {.kind = "gqa", .kv_heads = 2, .rope = true}},
    {"local", {.kind = "local", .window = 3}},
    {"local+rope", {.kind = "local", .window = 3, .rope = true}},
    {"block-sparse", {.kind = "block-sparse", .block = 2}},
    {"block-sparse+gqa-free rope", {.kind = "block-sparse", .block = 3, .rope = true}},
    // The kinds made of a score_mod: the mod sees each cached query's absolute position.
    {"alibi", {.kind = "alibi"}},
    {"softcap+rope", {.kind = "softcap", .rope = true, .options = R"({"cap":0.5})"}},
};

std::shared_ptr<CausalLM> make_lm(const AttentionSpec& a, Dtype dtype, int64_t max_len = 24, uint64_t seed = 5,
                                  double dropout = 0.1, int64_t layers = 2) {
  Generator gen(seed);
  auto m = std::make_shared<CausalLM>(CausalLMOptions{.vocab = 13,
                                                      .d_model = 32,
                                                      .n_head = 4,
                                                      .d_ff = 48,
                                                      .n_layers = layers,
                                                      .dropout = dropout,
                                                      .max_len = max_len,
                                                      .dtype = dtype,
                                                      .attention = a},
                                      gen);
  m->eval();
  return m;
}

const TokenRows& kSources = kDecodeSources;

int64_t kv_heads(const AttentionSpec& a) { return a.kind == "gqa" ? a.kv_heads : 4; }

}  // namespace

TEST(CausalLMVariants, CachedEqualsRecomputedMixedLengthsFloat32AndFloat64) {
  for (const Variant& v : kVariants)
    for (Dtype dt : {kFloat32, kFloat64}) {
      SCOPED_TRACE(std::string(v.name) + " " + dtype_name(dt));
      auto m = make_lm(v.spec, dt);
      const int64_t steps = m->max_decode_len() - 1;
      const DecodeTrace cached = run_greedy(*m, kSources, steps, true, {steps, 3, steps, 7});
      const DecodeTrace full = run_greedy(*m, kSources, steps, false, {steps, 3, steps, 7});
      ASSERT_EQ(cached.cache_blocks, 2u);  // the variant has a cache path: nothing recomputes
      EXPECT_EQ(cached.cache_heads, kv_heads(v.spec));
      expect_same_decode(cached, full, dt);
    }
}

TEST(CausalLMVariants, CachedCropBeyondMaxLen) {
  // max_len 8: the rows run past the model's window; beyond it they recompute their last 8 tokens (positions, and
  // RoPE angles, restarting at 0), before it they decode from the cache.
  for (const Variant& v : kVariants)
    for (Dtype dt : {kFloat32, kFloat64}) {
      SCOPED_TRACE(std::string(v.name) + " " + dtype_name(dt));
      auto m = make_lm(v.spec, dt, 8);
      expect_same_decode(run_greedy(*m, kSources, 14, true), run_greedy(*m, kSources, 14, false), dt);
    }
}

TEST(CausalLMVariants, CacheBytesPerTokenFollowKvHeads) {
  // Per block and token: 2 (key and value) * H_kv * head_dim elements.
  for (const Variant& v : kVariants) {
    SCOPED_TRACE(v.name);
    auto m = make_lm(v.spec, kFloat32);
    NoGradGuard no_grad;
    DecodeState st = m->begin_decode({{4, 5}});
    ASSERT_EQ(st.cache.size(), 2u);
    const auto* kv = dynamic_cast<const KeyValueCache*>(st.cache[0].layer.get());  // MultiheadAttention's state
    ASSERT_TRUE(kv != nullptr);
    const int64_t C = kv->value.size(2);
    EXPECT_EQ(kv->capacity(), C);
    EXPECT_EQ(kv->key.numel() + kv->value.numel(), 2 * kv_heads(v.spec) * 8 * C);
    EXPECT_EQ(kv->bytes(), (kv->key.numel() + kv->value.numel()) * 4);
  }
}

TEST(CausalLMVariants, SeveralNewPositionsAtOnceEqualTheRecomputation) {
  // Several new positions per row fed at once against the cache (the prompt, then three decoded tokens for row 0
  // and one for row 1) equal the recomputation of the same rows, for the rules that depend on the position (RoPE,
  // window, blocks).
  for (const Variant& v : kVariants) {
    SCOPED_TRACE(v.name);
    auto m = make_lm(v.spec, kFloat64);
    NoGradGuard no_grad;
    DecodeState st = m->begin_decode({{4, 5, 6, 7, 8, 9, 10}, {11, 12}});
    m->decode_step(st);                 // every prompt position at once
    st.decoded[0] = {5, 6, 7};         // three new positions for row 0, one for row 1
    st.decoded[1] = {9};
    Tensor cached = m->decode_step(st);
    DecodeState re = m->begin_decode({{4, 5, 6, 7, 8, 9, 10}, {11, 12}});
    re.use_cache = false;
    re.decoded = st.decoded;
    EXPECT_TRUE(all_close(cached, m->decode_step(re), 1e-11, 1e-11));
  }
}

TEST(CausalLMVariants, RopeModelHasNoPositionTableAndDependsOnOrder) {
  // One block: its last position attends to the SET of earlier tokens, so only positions can tell an order.
  auto m = make_lm({.kind = "gqa", .kv_heads = 2, .rope = true}, kFloat64, 24, 5, 0.1, 1);
  EXPECT_FALSE(m->pe.defined());
  EXPECT_EQ(m->named_buffers().size(), 0u);
  ASSERT_TRUE(m->block(0)->attention<MultiheadAttention>()->rotary() != nullptr);
  EXPECT_EQ(m->block(0)->attention<MultiheadAttention>()->rotary()->max_len, 24);
  NoGradGuard no_grad;
  // Without positions a causal model's last logit would not see the order of the earlier tokens; RoPE does.
  const Tensor a = m->forward(pack_rows({{4, 5, 6}}, 3, 0)), b = m->forward(pack_rows({{5, 4, 6}}, 3, 0));
  EXPECT_FALSE(all_close(gather_positions(a, {{0, 2}}), gather_positions(b, {{0, 2}}), 1e-6, 1e-6));
  // The same model without RoPE (no positions at all) cannot tell them apart.
  auto flat = make_lm({.kind = "gqa", .kv_heads = 2}, kFloat64, 24, 5, 0.1, 1);
  std::fill(flat->pe.data<double>(), flat->pe.data<double>() + flat->pe.numel(), 0.0);
  const Tensor fa = flat->forward(pack_rows({{4, 5, 6}}, 3, 0)), fb = flat->forward(pack_rows({{5, 4, 6}}, 3, 0));
  EXPECT_TRUE(all_close(gather_positions(fa, {{0, 2}}), gather_positions(fb, {{0, 2}}), 1e-12, 1e-12));
}

// ------------------------------------------------------------------------------------------------
// Entropy tracking

TEST(CausalLMVariants, TrackedEntropiesEqualTheModuleCalledDirectly) {
  for (const Variant& v : kVariants) {
    SCOPED_TRACE(v.name);
    auto m = make_lm(v.spec, kFloat64, 24, 5, 0.0);
    m->train();  // history and dropout 0: the blocks' inputs are reproducible outside the model
    m->track_attention_entropy(true);
    const Tensor tokens = pack_rows({{4, 5, 6, 7, 8, 9}, {7, 8, 9}}, 6, 0);  // (2, 6), right-padded
    m->forward(tokens);
    const std::vector<AttentionEntropy> got = m->attention_entropies();
    ASSERT_EQ(got.size(), 2u);
    // The model's input, then each block: norm1, the attention module called as the block calls it.
    const double scale = std::sqrt(32.0);
    Tensor x = embedding(m->embed->weight, tokens) * scale;  // (B, L, D)
    if (m->pe.defined()) x = x + narrow(m->pe, 0, 0, 6);
    for (int64_t i = 0; i < 2; ++i) {
      std::shared_ptr<CausalLMBlock> blk = m->block(i);
      Tensor h = blk->norm1->forward(x);
      MhaResult r = blk->attention<MultiheadAttention>()->forward(
          h, h, h, {.need_weights = false, .is_causal = true, .need_entropy = true});
      EXPECT_EQ(got[static_cast<size_t>(i)].label, "layer" + std::to_string(i));
      // Bitwise where the model's input is embedding * sqrt(D) alone (RoPE); with the table the model's fused input
      // op may contract the multiply-add (an FMA), so the input here differs in the last bit.
      if (v.spec.rope)
        EXPECT_TRUE(bitwise_equal(got[static_cast<size_t>(i)].entropy, r.entropy)) << "block " << i;
      else
        EXPECT_TRUE(all_close(got[static_cast<size_t>(i)].entropy, r.entropy, 1e-13, 1e-13)) << "block " << i;
      EXPECT_TRUE(got[static_cast<size_t>(i)].entropy.requires_grad());
      x = blk->forward(x);
    }
  }
}

// ------------------------------------------------------------------------------------------------
// Gradient checkpointing

namespace {

// Gradients of every parameter after one training-mode backward with dropout 0.1, dropout drawn from `gen`; with
// `entropy_reg`, the loss adds the entropy regulariser of every block (lambda 0.1) and the entropies come last.
std::vector<std::pair<std::string, Tensor>> gradients(AttentionSpec a, bool checkpoint, bool own_generator,
                                                      bool entropy_reg = false) {
  a.checkpoint = checkpoint;
  auto m = make_lm(a, kFloat32, 24, 11, 0.1, 3);
  m->train();
  if (entropy_reg) m->track_attention_entropy(true);
  Generator g(123);
  if (own_generator) m->set_generator(g);
  default_generator().manual_seed(77);
  const Tensor tokens = pack_rows({{4, 5, 6, 7, 8, 9, 10, 11}, {7, 8, 9}}, 8, 0);
  Tensor logits = m->forward(tokens);  // (2, 8, 13)
  Tensor loss = cross_entropy(reshape(logits, {16, 13}), reshape(tokens, {16}));
  std::vector<std::pair<std::string, Tensor>> out;
  if (entropy_reg)
    for (const AttentionEntropy& e : m->attention_entropies()) {
      loss = loss + attention_entropy_loss(e.entropy, 0.1, unsqueeze(e.rows, 1));
      out.emplace_back(e.label, e.entropy.detach());
    }
  loss.backward();
  for (auto& [n, p] : m->named_parameters()) out.emplace_back(n, p.grad());
  return out;
}

}  // namespace

TEST(CausalLMVariants, CheckpointingGivesBitwiseGradientsWithDropout) {
  for (const AttentionSpec& a : {AttentionSpec{}, AttentionSpec{.kind = "gqa", .kv_heads = 2, .rope = true},
                                 AttentionSpec{.kind = "local", .window = 3}})
    for (bool own : {false, true}) {
      SCOPED_TRACE(a.kind + (a.rope ? "+rope" : "") + (own ? " set_generator" : " default generator"));
      const auto plain = gradients(a, false, own), ckpt = gradients(a, true, own);
      ASSERT_EQ(plain.size(), ckpt.size());
      for (size_t i = 0; i < plain.size(); ++i) {
        EXPECT_EQ(plain[i].first, ckpt[i].first);
        ASSERT_TRUE(plain[i].second.defined()) << plain[i].first;
        EXPECT_TRUE(bitwise_equal(ckpt[i].second, plain[i].second)) << plain[i].first;
      }
    }
}

TEST(CausalLMVariants, CheckpointingKeepsStateDictKeys) {
  auto plain = make_lm({}, kFloat32);
  auto ckpt = make_lm({.checkpoint = true}, kFloat32);
  const auto a = plain->state_dict(), b = ckpt->state_dict();
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].first, b[i].first);
    EXPECT_TRUE(bitwise_equal(a[i].second, b[i].second)) << a[i].first;
  }
}

TEST(CausalLMVariants, CheckpointingLowersThePeakAllocation) {
  // 4 blocks at L = 256: without checkpointing every block's activations live until the backward.
  auto peak = [](bool checkpoint) {
    Generator gen(3);
    auto m = std::make_shared<CausalLM>(CausalLMOptions{.vocab = 13,
                                                        .d_model = 32,
                                                        .n_head = 4,
                                                        .d_ff = 128,
                                                        .n_layers = 4,
                                                        .dropout = 0.1,
                                                        .max_len = 256,
                                                        .attention = {.checkpoint = checkpoint}},
                                        gen);
    m->train();
    Generator data(9);
    const Tensor tokens = randint(1, 13, {2, 256}, data);
    empty_cache();
    reset_peak_allocator_stats();
    const size_t before = allocator_stats().allocated_bytes;
    Tensor logits = m->forward(tokens);
    cross_entropy(reshape(logits, {512, 13}), reshape(tokens, {512})).backward();
    return allocator_stats().peak_allocated_bytes - before;
  };
  const size_t plain = peak(false), ckpt = peak(true);
  EXPECT_LT(static_cast<double>(ckpt), 0.75 * static_cast<double>(plain)) << "plain " << plain << " ckpt " << ckpt;
}

TEST(CausalLMVariants, CheckpointingWithTheEntropyRegulariserGivesBitwiseEntropiesAndGradients) {
  // The checkpointed blocks' entropies come out of the recomputation with their history: the regulariser's
  // gradient reaches every parameter exactly as without checkpointing.
  for (const AttentionSpec& a : {AttentionSpec{}, AttentionSpec{.kind = "block-sparse", .block = 2, .rope = true}}) {
    SCOPED_TRACE(a.kind);
    const auto plain = gradients(a, false, true, true), ckpt = gradients(a, true, true, true);
    ASSERT_EQ(plain.size(), ckpt.size());
    ASSERT_EQ(plain[0].first, "layer0");
    for (size_t i = 0; i < plain.size(); ++i) {
      EXPECT_EQ(plain[i].first, ckpt[i].first);
      ASSERT_TRUE(plain[i].second.defined()) << plain[i].first;
      EXPECT_TRUE(bitwise_equal(ckpt[i].second, plain[i].second)) << plain[i].first;
    }
  }
  // The regulariser changes the gradients (it is not a no-op through the checkpoint).
  const auto with = gradients({}, true, true, true), without = gradients({}, true, true, false);
  EXPECT_FALSE(bitwise_equal(with[3].second, without[0].second)) << with[3].first << " vs " << without[0].first;
}
