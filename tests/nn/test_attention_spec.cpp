// ModelSpec::attention: its JSON (nested, only when not the default), its validation, and the decoder-only model
// built with each variant: the child "self_attn" holds the variant's module, and the model runs forward and backward.

#include <cmath>
#include <set>
#include <string>

#include "autograd/loss.h"
#include "autograd/reduce.h"
#include "autograd/shape.h"
#include "nn/models.h"
#include "testing.h"

using namespace attograd;
using namespace attograd::nn;
using namespace attograd::testing;

namespace {

ModelSpec lm_spec(AttentionSpec a) {
  return {.vocab = 11, .layers = 2, .d_model = 16, .heads = 4, .d_ff = 32, .max_source_len = 5, .max_target_len = 5,
          .attention = std::move(a)};
}

}  // namespace

TEST(AttentionSpec, JsonOmitsTheDefaultAndRoundTripsEveryField) {
  const ModelSpec plain = lm_spec({});
  EXPECT_EQ(plain.to_json().find("attention"), std::string::npos);
  EXPECT_EQ(ModelSpec::from_json(plain.to_json()), plain);
  const ModelSpec mla = lm_spec({.kind = "mla", .kv_rank = 6, .q_rank = 5, .rope_dim = 2, .checkpoint = true});
  const std::string j = mla.to_json();
  EXPECT_NE(j.find("\"attention\":{\"kind\":\"mla\",\"kv_heads\":0,\"kv_rank\":6,\"q_rank\":5"), std::string::npos) << j;
  EXPECT_EQ(ModelSpec::from_json(j), mla);
  EXPECT_EQ(ModelSpec::from_json(lm_spec({.kind = "local", .window = 3, .rope = true}).to_json()).attention,
            (AttentionSpec{.kind = "local", .window = 3, .rope = true}));
  EXPECT_ATTO_ERROR(ModelSpec::from_json(R"({"attention": {"kind": "mha", "bogus": 1}})"),
                    "unknown field \"attention.bogus\"");
  EXPECT_ATTO_ERROR(ModelSpec::from_json(R"({"attention": {"kind": 3}})"), "attention.kind");
  EXPECT_ATTO_ERROR(ModelSpec::from_json(R"({"attention": {"window": true}})"), "attention.window");
}

TEST(AttentionSpec, ValidateNamesTheBadField) {
  EXPECT_ATTO_ERROR((AttentionSpec{.kind = "flash"}.validate(4)), "unknown attention \"flash\"");
  EXPECT_ATTO_ERROR((AttentionSpec{.kind = "gqa"}.validate(4)), "kv_heads");
  EXPECT_ATTO_ERROR((AttentionSpec{.kind = "gqa", .kv_heads = 3}.validate(4)), "kv_heads=3");
  EXPECT_ATTO_ERROR((AttentionSpec{.kind = "gqa", .kv_heads = 4}.validate(4)), "kv_heads=4");
  EXPECT_ATTO_ERROR((AttentionSpec{.kind = "mha", .kv_heads = 2}.validate(4)), "applies to attention gqa");
  EXPECT_ATTO_ERROR((AttentionSpec{.kind = "local"}.validate(4)), "--window");
  EXPECT_ATTO_ERROR((AttentionSpec{.kind = "block-sparse"}.validate(4)), "--block");
  EXPECT_ATTO_ERROR((AttentionSpec{.kind = "mha", .window = 4}.validate(4)), "applies to attention local");
  AttentionSpec{.kind = "mla", .rope = true}.validate(4);  // DeepSeek's form: positions only from its decoupled RoPE
  EXPECT_ATTO_ERROR((AttentionSpec{.kind = "linear", .rope = true}.validate(4)), "rope");
  EXPECT_ATTO_ERROR((AttentionSpec{.kind = "local", .window = -1}.validate(4)), "window=-1");
  AttentionSpec{.kind = "gqa", .kv_heads = 1}.validate(4);
  AttentionSpec{.kind = "block-sparse", .block = 4, .checkpoint = true}.validate(4);
  EXPECT_ATTO_ERROR(make_model("lm", lm_spec({.kind = "gqa", .kv_heads = 3})), "kv_heads=3");
}

TEST(AttentionSpec, EveryVariantBuildsRunsAndKeepsItsModuleUnderSelfAttn) {
  const std::vector<std::pair<AttentionSpec, std::string>> variants = {
      {{}, "blocks.0.self_attn.in_proj_weight"},
      {{.kind = "gqa", .kv_heads = 2}, "blocks.0.self_attn.in_proj_weight"},
      {{.kind = "local", .window = 3}, "blocks.0.self_attn.in_proj_weight"},
      {{.kind = "block-sparse", .block = 2}, "blocks.0.self_attn.in_proj_weight"},
      {{.kind = "mla"}, "blocks.0.self_attn.wkv_a.weight"},
      {{.kind = "mla", .rope = true}, "blocks.0.self_attn.wkv_a.weight"},
      {{.kind = "linear"}, "blocks.0.self_attn.in_proj_weight"},
  };
  for (const auto& [a, key] : variants) {
    SCOPED_TRACE(a.kind);
    Generator gen(3);
    auto model = make_model("lm", lm_spec(a), gen);
    std::set<std::string> names;
    for (const auto& [name, t] : model->state_dict()) names.insert(name);
    EXPECT_TRUE(names.count(key)) << key;
    // The sinusoidal table for every kind (mla too: its decoupled RoPE alone cannot learn reverse, docs/ATTENTION.md);
    // rope: positions only from the attention's RoPE, no table.
    EXPECT_EQ(names.count("pe"), a.rope ? 0u : 1u);
    const SequenceBatch b = model->make_batch({{.src = {4, 5, 6}, .tgt = {6, 5, 4}}, {.src = {7}, .tgt = {7}}});
    const Tensor logits = model->forward_batch(b);  // (2, 7, 11)
    EXPECT_EQ(logits.shape(), (Shape{2, 7, 11}));
    Tensor loss = cross_entropy(reshape(logits, {-1, 11}), reshape(b.target, {-1}));
    EXPECT_TRUE(std::isfinite(loss.item()));
    loss.backward();
    for (const auto& [name, p] : model->named_parameters()) EXPECT_TRUE(p.grad().defined()) << name;
  }
  const auto gqa = std::dynamic_pointer_cast<CausalLM>(make_model("lm", lm_spec({.kind = "gqa", .kv_heads = 2})));
  ASSERT_NE(gqa, nullptr);
  EXPECT_EQ(gqa->block(0)->attention<MultiheadAttention>()->in_proj_weight.shape(), (Shape{(4 + 2 * 2) * 4, 16}));
}

TEST(AttentionSpec, TrackedEntropiesArePerBlockAndDifferentiable) {
  Generator gen(5);
  auto model = make_model("lm", lm_spec({.kind = "gqa", .kv_heads = 2}), gen);
  EXPECT_TRUE(model->attention_entropies().empty());
  model->track_attention_entropy(true);
  const SequenceBatch b = model->make_batch({{.src = {4, 5, 6}, .tgt = {6, 5, 4}}, {.src = {7}, .tgt = {7}}});
  model->forward_batch(b);
  const std::vector<AttentionEntropy> e = model->attention_entropies();
  ASSERT_EQ(e.size(), 2u);
  EXPECT_EQ(e[1].label, "layer1");
  ASSERT_EQ(e[0].entropy.shape(), (Shape{2, 4, 7}));  // (B, H, L)
  EXPECT_EQ(e[0].rows.shape(), (Shape{2, 7}));
  EXPECT_EQ(e[0].rows.data<bool>()[7 + 3], false);  // row 1 = 7 SEP 7 then padding
  const Tensor& h = e[1].entropy;
  for (int64_t i = 0; i < h.numel(); ++i) {
    const int64_t l = i % 7;  // a causal query at position l sees l + 1 keys
    EXPECT_GE(h.data<float>()[i], 0.0f);
    EXPECT_LE(h.data<float>()[i], std::log(static_cast<float>(l + 1)) + 1e-5f);
    if (l == 0) {
      EXPECT_EQ(h.data<float>()[i], 0.0f);
    }
  }
  sum(e[0].entropy).backward();
  EXPECT_TRUE(std::dynamic_pointer_cast<CausalLM>(model)->block(0)->attention<MultiheadAttention>()->in_proj_weight.grad().defined());
  model->track_attention_entropy(false);
  EXPECT_TRUE(model->attention_entropies().empty());
  auto linear = make_model("lm", lm_spec({.kind = "linear"}));
  EXPECT_ATTO_ERROR(linear->track_attention_entropy(true), "linear attention has no softmax rows");
}
