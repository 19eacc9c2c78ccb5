// Attention kind "mla": DeepSeek-V2's multi-head latent attention, a MultiHeadLatentAttention (nn/mla.h), and its
// AttentionLayer implementation.

#include <algorithm>

#include "nn/attention/builtin.h"
#include "nn/mla.h"

namespace attograd::nn {

int64_t MlaLayerCache::bytes() const {
  return static_cast<int64_t>(cache.latent.numel() * dtype_size(cache.latent.dtype()));
}

AttentionOutput MultiHeadLatentAttention::forward(const Tensor& x, const AttentionCall& call) {
  ATTO_CHECK(call.is_causal && call.rope_offset == 0 && call.window == 0, "MultiHeadLatentAttention",
             "mla is causal self-attention at positions 0 .. L-1 without a window, got is_causal=", call.is_causal,
             ", rope_offset=", call.rope_offset, ", window=", call.window);
  if (!call.need_entropy && call.need_weights) {  // the plain path's probabilities (B, H, L, L), for a figure
    auto [out, weights] = forward_with_weights(x, call.key_padding_mask);
    return {.output = std::move(out), .weights = std::move(weights)};
  }
  if (!call.need_entropy) return {.output = forward(x, call.key_padding_mask)};
  auto [out, entropy] = forward_with_entropy(x, call.key_padding_mask);  // (B, L, D), (B, H, L)
  return {.output = std::move(out), .entropy = std::move(entropy)};
}

std::string MultiHeadLatentAttention::weights_note() const {
  return "multi-head latent attention: the softmax probabilities of the plain path (each head's keys expanded from "
         "the latent), the path training takes; decoding's absorbed path attends over the latent with the same "
         "probabilities up to rounding";
}

std::shared_ptr<AttentionCache> MultiHeadLatentAttention::make_cache(int64_t B, int64_t C) const {
  auto c = std::make_shared<MlaLayerCache>();
  c->cache = make_latent_cache(B, C);
  return c;
}

Tensor MultiHeadLatentAttention::forward_cached(const Tensor& x, AttentionCache& cache, const CachedAttentionRows& rows) {
  auto* c = dynamic_cast<MlaLayerCache*>(&cache);
  ATTO_CHECK(c != nullptr, "MultiHeadLatentAttention::forward_cached", "needs the MlaLayerCache that make_cache gave");
  return decode(x, c->cache, rows, absorbed_decode);  // (A, N, D)
}

namespace detail {

namespace {

// As the models build it: d_nope = d_v = head size, d_rope = head size / 2 and kv_lora_rank = D / 4 by default.
MlaOptions mla_options(const AttentionSpec& at, const AttentionConfig& c) {
  const int64_t d = c.d_model / c.heads;
  return {.d_model = c.d_model,
          .n_heads = c.heads,
          .qk_nope_head_dim = d,
          .qk_rope_head_dim = at.rope_dim > 0 ? at.rope_dim : d / 2,
          .v_head_dim = d,
          .kv_lora_rank = at.kv_rank > 0 ? at.kv_rank : std::max<int64_t>(1, c.d_model / 4),
          .q_lora_rank = at.q_rank,
          .dropout = c.dropout};
}

}  // namespace

AttentionKindEntry mla_attention_kind() {
  AttentionFactory factory = [](const AttentionSpec& spec, const AttentionConfig& c, Generator& gen) {
    return std::make_shared<MultiHeadLatentAttention>(mla_options(spec, c), gen);
  };
  AttentionKindInfo info{
      .description = "multi-head latent attention (DeepSeek-V2): a cached latent of kv_rank plus a shared RoPE key",
      // rope: positions ONLY from the decoupled RoPE (DeepSeek's form: the model adds no sinusoidal table). Without it
      // the model adds its table as for every other kind: on the default reverse task MLA without a table reaches
      // 43-96% by step 1,500 at any kv_rank from 16 to 64, with it 100% (docs/ATTENTION.md, "MLA at its defaults").
      .fields = {"kv_rank", "q_rank", "rope_dim", "rope"},
      .facts =
          [](const AttentionSpec& s, const AttentionConfig& c) {
            const MlaOptions m = mla_options(s, c);
            const double D = static_cast<double>(c.d_model), h = static_cast<double>(c.heads);
            const double head = static_cast<double>(m.v_head_dim), rope = static_cast<double>(m.qk_rope_head_dim);
            const double kv = static_cast<double>(m.kv_lora_rank), qr = static_cast<double>(s.q_rank);
            AttentionFacts f = softmax_attention_facts(c);
            const double q = s.q_rank > 0 ? D * qr + qr * h * (head + rope) : D * h * (head + rope);
            f.weights = q + D * (kv + rope) + kv * h * 2 * head + h * head * D;
            f.cache_per_token = kv + rope;  // [c_KV | k_R]
            f.own_positions = s.rope;
            f.slides = false;  // its latent cache is not a ring (yet): past the context it recomputes
            return f;
          }};
  return {"mla", std::move(factory), std::move(info)};
}

}  // namespace detail

}  // namespace attograd::nn
