// TransformerEncoderLayer / TransformerDecoderLayer self-attention through the AttentionLayer interface
// (nn/attention_layer.h): the registry's kind under the child name "self_attn", PyTorch's names and initial draws for
// the default, a variant equal to the MultiheadAttention the layers built before, a user's kind called with the
// layer's key padding mask and is_causal, attn masks only for MultiheadAttention kinds, and the decoder's
// cross-attention left a MultiheadAttention.

#include <memory>
#include <string>
#include <type_traits>
#include <vector>

#include "autograd/activation.h"
#include "autograd/shape.h"
#include "nn/attention_layer.h"
#include "nn/encoder_tagger.h"
#include "nn/masks.h"
#include "nn/transformer.h"
#include "testing.h"

using namespace attograd;
using namespace attograd::testing;
using namespace attograd::nn;

namespace {

// What the last forward of a ProbeAttention was asked.
struct ProbeLog {
  int calls = 0;
  bool is_causal = false;
  bool key_padding = false;
  bool need_weights = false;
};
ProbeLog probe_log;

// A user's kind that is not a MultiheadAttention: x -> proj(x) (no mixing of positions), recording each call.
class ProbeAttention : public AttentionLayer {
 public:
  ProbeAttention(int64_t D, Generator& gen) {
    proj = register_module("proj", std::make_shared<Linear>(D, D, true, gen));
  }
  AttentionOutput forward(const Tensor& x, const AttentionCall& call) override {
    ++probe_log.calls;
    probe_log.is_causal = call.is_causal;
    probe_log.key_padding = call.key_padding_mask.defined();
    probe_log.need_weights = call.need_weights;
    return {.output = proj->forward(x)};
  }
  using AttentionLayer::forward;
  std::shared_ptr<Linear> proj;
};

void register_probe() {
  register_attention(
      "test-layer-probe",
      [](const AttentionSpec&, const AttentionConfig& c, Generator& gen) {
        return std::make_shared<ProbeAttention>(c.d_model, gen);
      },
      "test: a per-position projection that records its calls");
}

// (B, L) Bool, true at positions >= lengths[b] (blocked padding keys).
Tensor lengths_to_padding_mask(const std::vector<int64_t>& lengths, int64_t L) {
  Tensor m = zeros({static_cast<int64_t>(lengths.size()), L}, {.dtype = kBool});
  for (size_t b = 0; b < lengths.size(); ++b)
    for (int64_t j = lengths[b]; j < L; ++j) m.set({static_cast<int64_t>(b), j}, 1);
  return m;
}

std::vector<std::string> names(const Module& m) {
  std::vector<std::string> out;
  for (const auto& [name, p] : m.named_parameters()) out.push_back(name);
  return out;
}

}  // namespace

TEST(TransformerLayerAttention, DefaultIsTheRegistrysMhaWithPyTorchsNamesAndDraws) {
  const int64_t D = 8, H = 2, F = 16;
  Generator g1(5), g2(5);
  TransformerEncoderLayer layer({.d_model = D, .nhead = H, .dim_feedforward = F}, g1);
  EXPECT_EQ(layer.self_attn->kind(), "mha");
  ASSERT_NE(layer.attention<MultiheadAttention>(), nullptr);
  EXPECT_EQ(names(layer), (std::vector<std::string>{"self_attn.in_proj_weight", "self_attn.in_proj_bias",
                                                    "self_attn.out_proj.weight", "self_attn.out_proj.bias",
                                                    "linear1.weight", "linear1.bias", "linear2.weight", "linear2.bias",
                                                    "norm1.weight", "norm1.bias", "norm2.weight", "norm2.bias"}));
  // The draws of PyTorch's order: self_attn (a MultiheadAttention as the layer built it before), linear1, linear2.
  MultiheadAttention mha({.embed_dim = D, .num_heads = H, .dropout = 0.1}, g2);
  Linear linear1(D, F, true, g2), linear2(F, D, true, g2);
  const auto& sa = *layer.attention<MultiheadAttention>();
  EXPECT_TRUE(bitwise_equal(sa.in_proj_weight, mha.in_proj_weight));
  EXPECT_TRUE(bitwise_equal(sa.out_proj->weight, mha.out_proj->weight));
  EXPECT_TRUE(bitwise_equal(layer.linear1->weight, linear1.weight));
  EXPECT_TRUE(bitwise_equal(layer.linear2->weight, linear2.weight));
  EXPECT_TRUE(bitwise_equal(layer.self_attn->output_projection(), sa.out_proj->weight));
  // The decoder's: self_attn from the registry, then multihead_attn, then the feed-forward block.
  Generator g3(6), g4(6);
  TransformerDecoderLayer dec({.d_model = D, .nhead = H, .dim_feedforward = F}, g3);
  MultiheadAttention self_ref({.embed_dim = D, .num_heads = H, .dropout = 0.1}, g4);
  MultiheadAttention cross_ref({.embed_dim = D, .num_heads = H, .dropout = 0.1}, g4);
  EXPECT_EQ(dec.self_attn->kind(), "mha");
  EXPECT_TRUE(bitwise_equal(dec.attention<MultiheadAttention>()->in_proj_weight, self_ref.in_proj_weight));
  EXPECT_TRUE(bitwise_equal(dec.multihead_attn->in_proj_weight, cross_ref.in_proj_weight));
  EXPECT_EQ(names(dec).at(4), "multihead_attn.in_proj_weight");
}

TEST(TransformerLayerAttention, VariantsEqualTheMultiheadAttentionWithThoseOptions) {
  const int64_t D = 16, H = 4, L = 7;
  struct Case {
    AttentionSpec spec;
    MultiheadAttentionOptions mha;
  };
  const MultiheadAttentionOptions base{.embed_dim = D, .num_heads = H, .dropout = 0.0};
  auto with = [&](auto f) {
    MultiheadAttentionOptions o = base;
    f(o);
    return o;
  };
  const std::vector<Case> cases = {
      {{.kind = "gqa", .kv_heads = 2}, with([](auto& o) { o.num_kv_heads = 2; })},
      {{.kind = "local", .window = 2}, with([](auto& o) { o.window = 2; })},
      {{.kind = "block-sparse", .block = 2}, with([](auto& o) {
         o.block_size = 2;
         o.block_local = 1;
         o.block_global = 1;
       })}};
  Generator gx(11);
  const Tensor x = randn({2, L, D}, gx, {.dtype = kFloat64});              // (B, L, D)
  const Tensor kpm = lengths_to_padding_mask({L, L - 2}, L);              // (B, L)
  for (const Case& c : cases) {
    SCOPED_TRACE(c.spec.kind);
    Generator g1(3), g2(3);
    TransformerEncoderLayer layer({.d_model = D, .nhead = H, .dim_feedforward = 32, .dropout = 0.0,
                                   .dtype = kFloat64, .attention = c.spec},
                                  g1);
    MultiheadAttention ref(c.mha, g2);
    ref.to(kFloat64);
    EXPECT_EQ(layer.self_attn->kind(), c.spec.kind);
    EXPECT_EQ(layer.self_attn->spec(), c.spec);
    const auto& sa = *layer.attention<MultiheadAttention>();
    EXPECT_TRUE(bitwise_equal(sa.in_proj_weight, ref.in_proj_weight));
    EXPECT_EQ(names(layer).at(0), "self_attn.in_proj_weight");
    // The layer's call (bidirectional, padding blocked) is MultiheadAttention's with the same masks.
    layer.set_store_attention(true);
    Tensor y = layer.forward(x, {.src_key_padding_mask = kpm});
    MhaResult r = ref.forward(x, x, x, {.key_padding_mask = kpm, .need_weights = true, .average_attn_weights = false});
    EXPECT_TRUE(bitwise_equal(layer.last_attention(), r.weights));
    Tensor n = layer.norm1->forward(x + r.output);
    Tensor h = layer.linear2->forward(relu(layer.linear1->forward(n)));
    EXPECT_TRUE(bitwise_equal(y, layer.norm2->forward(n + h)));
  }
  Generator g(1);
  TransformerEncoderLayer gqa({.d_model = D, .nhead = H, .attention = {.kind = "gqa", .kv_heads = 2}}, g);
  EXPECT_NE(gqa.to_string().find("attention=gqa (kv_heads 2)"), std::string::npos) << gqa.to_string();
  // The decoder's self-attention takes the kind; its cross-attention keeps every head.
  TransformerDecoderLayer dec({.d_model = D, .nhead = H, .attention = {.kind = "gqa", .kv_heads = 1}}, g);
  EXPECT_EQ(dec.attention<MultiheadAttention>()->num_kv_heads(), 1);
  EXPECT_EQ(dec.multihead_attn->num_kv_heads(), H);
  static_assert(std::is_same_v<decltype(dec.multihead_attn), std::shared_ptr<MultiheadAttention>>);
}

TEST(TransformerLayerAttention, UserKindIsCalledWithTheLayersMasks) {
  register_probe();
  const int64_t D = 8, L = 5;
  Generator g(2);
  TransformerEncoderLayer enc({.d_model = D, .nhead = 2, .dim_feedforward = 8, .dropout = 0.0,
                               .attention = {.kind = "test-layer-probe"}},
                              g);
  EXPECT_EQ(enc.attention<MultiheadAttention>(), nullptr);
  ASSERT_NE(enc.attention<ProbeAttention>(), nullptr);
  EXPECT_EQ(names(enc).at(0), "self_attn.proj.weight");
  const Tensor x = randn({2, L, D}, g);
  const Tensor kpm = lengths_to_padding_mask({L, 3}, L);  // (B, L)
  probe_log = {};
  enc.set_store_attention(true);
  Tensor y = enc.forward(x, {.src_key_padding_mask = kpm});
  EXPECT_EQ(y.shape(), Shape({2, L, D}));
  EXPECT_EQ(probe_log.calls, 1);
  EXPECT_FALSE(probe_log.is_causal);
  EXPECT_TRUE(probe_log.key_padding);
  EXPECT_TRUE(probe_log.need_weights);
  EXPECT_FALSE(enc.last_attention().defined());  // the kind has no weights
  enc.forward(x, {.is_causal = true});
  EXPECT_TRUE(probe_log.is_causal);
  EXPECT_FALSE(probe_log.key_padding);
  // An attn mask goes only to a MultiheadAttention kind.
  EXPECT_ATTO_ERROR(enc.forward(x, {.src_mask = causal_mask(L)}),
                    "attention test-layer-probe takes no attn mask (src_mask)");
  // The decoder's self-attention gets tgt_is_causal and the target's padding; the cross-attention is its own.
  TransformerDecoderLayer dec({.d_model = D, .nhead = 2, .dim_feedforward = 8, .dropout = 0.0,
                               .attention = {.kind = "test-layer-probe"}},
                              g);
  probe_log = {};
  Tensor t = dec.forward(x, x, {.tgt_key_padding_mask = kpm, .tgt_is_causal = true});
  EXPECT_EQ(t.shape(), Shape({2, L, D}));
  EXPECT_EQ(probe_log.calls, 1);
  EXPECT_TRUE(probe_log.is_causal);
  EXPECT_TRUE(probe_log.key_padding);
  EXPECT_ATTO_ERROR(dec.forward(x, x, {.tgt_mask = causal_mask(L)}),
                    "attention test-layer-probe takes no attn mask (tgt_mask)");
}

TEST(TransformerLayerAttention, EncoderModelPassesItsSpecAndRefusesCausalOnlyKindsWhenBuilt) {
  Generator g(4);
  const AttentionSpec local{.kind = "local", .window = 2, .checkpoint = true};
  EncoderTagger m({.vocab = 9, .d_model = 16, .n_head = 4, .d_ff = 16, .n_layers = 2, .max_len = 8,
                   .attention = local},
                  g);
  for (int64_t i = 0; i < 2; ++i) {
    const auto& layer = *m.layers->at<TransformerEncoderLayer>(i);
    EXPECT_EQ(layer.self_attn->spec(), local);
    EXPECT_EQ(layer.self_attn->config().max_len, 8);
    EXPECT_EQ(layer.attention<MultiheadAttention>()->options().window, 2);
  }
  for (const char* kind : {"mla", "linear"}) {
    SCOPED_TRACE(kind);
    EXPECT_ATTO_ERROR(EncoderTagger({.vocab = 9, .d_model = 16, .n_head = 4, .attention = {.kind = kind}}, g),
                      str_cat("model kind \"encoder\" does not support attention ", kind,
                              " (supported: mha, gqa, local, block-sparse"));
  }
  // The list names the kinds it takes: not the score/mask-function kinds, which are refused for their mods.
  EXPECT_ATTO_ERROR(EncoderTagger({.vocab = 9, .d_model = 16, .n_head = 4, .attention = {.kind = "softcap"}}, g),
                    "does not support attention softcap (a score_mod / mask_mod kind");
}
