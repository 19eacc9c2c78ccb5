// Attention kind "mha": multi-head softmax attention, a MultiheadAttention (nn/attention.h), and
// MultiheadAttention's AttentionLayer implementation, shared by the kinds that are one (gqa, local, block-sparse).

#include <cmath>

#include "autograd/attention.h"
#include "nn/attention/builtin.h"

namespace attograd::nn {

int64_t KeyValueCache::bytes() const {
  return static_cast<int64_t>((key.numel() * dtype_size(key.dtype())) + (value.numel() * dtype_size(value.dtype())));
}

AttentionOutput MultiheadAttention::forward(const Tensor& x, const AttentionCall& call) {
  MhaResult r = forward(x, x, x,
                        {.key_padding_mask = call.key_padding_mask,
                         .need_weights = call.need_weights,
                         .average_attn_weights = false,
                         .is_causal = call.is_causal,
                         .need_entropy = call.need_entropy,
                         .rope_offset = call.rope_offset});
  return {.output = std::move(r.output), .weights = std::move(r.weights), .entropy = std::move(r.entropy)};
}

std::shared_ptr<AttentionCache> MultiheadAttention::make_cache(int64_t B, int64_t C) const {
  // A BigBird layout with random blocks depends on the sequence length, so such a layer recomputes instead; a
  // local window also caches the whole sequence, not a ring (cached_attention reads only the window).
  if (opts_.block_random > 0 || opts_.add_bias_kv || opts_.add_zero_attn || !same_embed_) return nullptr;
  auto c = std::make_shared<KeyValueCache>();
  std::tie(c->key, c->value) = make_kv_cache(B, num_kv_heads(), C, head_dim(), head_dim(), in_proj_weight.dtype());
  return c;
}

Tensor MultiheadAttention::forward_cached(const Tensor& x, AttentionCache& cache_in, const CachedAttentionRows& rows) {
  return forward_cached_masked(x, cache_in, rows, MaskMod(), true);
}

Tensor MultiheadAttention::forward_cached_masked(const Tensor& x, AttentionCache& cache_in,
                                                 const CachedAttentionRows& rows, const MaskMod& step_mask,
                                                 bool causal) {
  auto* cache = dynamic_cast<KeyValueCache*>(&cache_in);
  ATTO_CHECK(cache != nullptr && in_proj_weight.defined(), "MultiheadAttention::forward_cached",
             "needs the KeyValueCache that make_cache gave (attention \"", kind(), "\")");
  const MultiheadAttentionOptions& ao = opts_;
  const int64_t E = ao.embed_dim, H = ao.num_heads, Hkv = num_kv_heads(), d = head_dim();
  const int64_t Ekv = Hkv * d;
  Tensor qkv = decode_linear(x, in_proj_weight, in_proj_bias);  // (A, N, E + 2 Ekv) [q | k | v]
  // RoPE: q and k are H + H_kv adjacent heads, each row rotated at its own absolute positions start[a] + i.
  if (rotary_) rotate_cached_rows_(qkv, 0, H + Hkv, *rotary_, rows);
  write_kv_cache(cache->key, cache->value, qkv, E, qkv, E + Ekv, rows);  // H_kv heads
  const MaskMod mask = !step_mask ? ao.mask_mod : ao.mask_mod ? and_masks(ao.mask_mod, step_mask) : step_mask;
  CachedAttentionOptions variants{
      .num_heads = H, .window = ao.window, .mask_mod = mask, .score_mod = ao.score_mod, .written_only = !causal};
  if (ao.block_size > 0) {
    // No random blocks (make_cache gives none otherwise), so a layout over the cache's positions agrees, block for
    // block, with the one forward() builds for any shorter length.
    const int64_t C = cache->value.size(2), nb = (C + ao.block_size - 1) / ao.block_size;
    variants.block_size = ao.block_size;
    variants.block_layout = bigbird_block_layout({.q_blocks = nb,
                                                  .k_blocks = nb,
                                                  .local_blocks = ao.block_local,
                                                  .global_blocks = ao.block_global,
                                                  .random_blocks = ao.block_random,
                                                  .seed = ao.block_seed});
  }
  Tensor heads = cached_attention(qkv, 0, cache->key, cache->value, rows, 1.0 / std::sqrt(static_cast<double>(d)),
                                  causal, nullptr, -1, variants);  // (A, N, E)
  return decode_linear(heads, out_proj->weight, out_proj->bias);  // (A, N, E)
}

namespace detail {

MultiheadAttentionOptions base_multihead_options(const AttentionSpec& spec, const AttentionConfig& c) {
  return {.embed_dim = c.d_model,
          .num_heads = c.heads,
          .dropout = c.dropout,
          .bias = c.bias,
          .block_local = 1,
          .rope = spec.rope,
          .rope_max_len = c.max_len};
}

AttentionKindEntry multihead_attention_kind(const std::string& kind, AttentionKindInfo info) {
  auto options = info.multihead;
  AttentionFactory factory = [options](const AttentionSpec& spec, const AttentionConfig& c, Generator& gen) {
    return std::make_shared<MultiheadAttention>(options(spec, c), gen);
  };
  return {kind, std::move(factory), std::move(info)};
}

AttentionKindEntry mha_attention_kind() {
  return multihead_attention_kind(
      "mha", {.description = "multi-head softmax attention (torch.nn.MultiheadAttention)",
              .fields = {"rope"},
              .facts =
                  [](const AttentionSpec& spec, const AttentionConfig& c) {
                    AttentionFacts f = softmax_attention_facts(c);
                    f.own_positions = spec.rope;
                    return f;
                  },
              .multihead = base_multihead_options});
}

}  // namespace detail

}  // namespace attograd::nn
