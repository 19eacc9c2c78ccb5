// Attention kind "mha": multi-head softmax attention, a MultiheadAttention (nn/attention.h), and
// MultiheadAttention's AttentionLayer implementation, shared by the kinds that are one (gqa, local, block-sparse).

#include <algorithm>
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
                         .rope_offset = call.rope_offset,
                         .window = call.window});
  return {.output = std::move(r.output), .weights = std::move(r.weights), .entropy = std::move(r.entropy)};
}

std::shared_ptr<AttentionCache> MultiheadAttention::make_cache(int64_t B, int64_t C) const {
  // A BigBird layout with random blocks depends on the sequence length, so such a layer recomputes instead; a
  // local window caches the whole sequence here (cached_attention reads only the window); make_ring_cache keeps
  // only the window.
  if (opts_.block_random > 0 || opts_.add_bias_kv || opts_.add_zero_attn || !same_embed_) return nullptr;
  auto c = std::make_shared<KeyValueCache>();
  std::tie(c->key, c->value) = make_kv_cache(B, num_kv_heads(), C, head_dim(), head_dim(), in_proj_weight.dtype());
  return c;
}

std::shared_ptr<AttentionCache> MultiheadAttention::make_ring_cache(int64_t B, int64_t span) const {
  ATTO_CHECK(span > 0, "MultiheadAttention::make_ring_cache", "span must be positive, got ", span);
  // A block layout is fixed from position 0 (its global block): it cannot slide.
  if (opts_.block_size > 0) return nullptr;
  const int64_t slots = opts_.window > 0 ? std::min(opts_.window, span) : span;
  auto c = std::dynamic_pointer_cast<KeyValueCache>(make_cache(B, slots));
  if (c != nullptr) c->ring = true;
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
  const double scale = 1.0 / std::sqrt(static_cast<double>(d));
  if (cache->ring) return decode_linear(ring_attention(qkv, *cache, rows, scale), out_proj->weight, out_proj->bias);
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
  Tensor heads = cached_attention(qkv, 0, cache->key, cache->value, rows, scale, causal, nullptr, -1, variants);  // (A, N, E)
  return decode_linear(heads, out_proj->weight, out_proj->bias);  // (A, N, E)
}

Tensor MultiheadAttention::ring_attention(const Tensor& qkv, KeyValueCache& cache, const CachedAttentionRows& rows,
                                          double scale) const {
  const int64_t E = opts_.embed_dim, H = opts_.num_heads, Ekv = num_kv_heads() * head_dim();
  const int64_t C = cache.capacity(), A = qkv.size(0), N = qkv.size(1);
  // Each query reads its last C positions (the ring's slots: min(span, window)), wherever the row is.
  const CachedAttentionOptions variants{
      .num_heads = H, .window = C, .mask_mod = opts_.mask_mod, .score_mod = opts_.score_mod, .ring = true};
  bool wraps = false;  // some row writes a slot that a query of this step still reads
  for (size_t a = 0; a < rows.start.size(); ++a) wraps = wraps || rows.start[a] + rows.count[a] > C;
  if (!wraps || N == 1) {  // every position at once (the slots written are never read by an earlier query)
    write_kv_cache(cache.key, cache.value, qkv, E, qkv, E + Ekv, rows, true);
    return cached_attention(qkv, 0, cache.key, cache.value, rows, scale, true, nullptr, -1, variants);  // (A, N, E)
  }
  // One position at a time: writing position p overwrites p - C, which no query at p or later reads.
  Tensor heads = empty({A, N, E}, {.dtype = qkv.dtype()});  // (A, N, E)
  for (int64_t i = 0; i < N; ++i) {
    CachedAttentionRows at{.cache_row = rows.cache_row, .start = rows.start, .count = rows.count};
    for (size_t a = 0; a < at.start.size(); ++a) {
      at.start[a] += i;
      at.count[a] = i < rows.count[a] ? 1 : 0;
    }
    const Tensor q = narrow(qkv, 1, i, 1);  // (A, 1, W)
    write_kv_cache(cache.key, cache.value, q, E, q, E + Ekv, at, true);
    const Tensor h = cached_attention(q, 0, cache.key, cache.value, at, scale, true, nullptr, -1, variants);
    dispatch_float(qkv.dtype(), "MultiheadAttention::forward_cached", [&]<typename T>() {
      const T* src = h.data<T>();
      T* dst = heads.data<T>();
      for (int64_t a = 0; a < A; ++a) std::copy(src + a * E, src + (a + 1) * E, dst + (a * N + i) * E);
    });
  }
  return heads;
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
                    f.slides = true;  // RoPE is relative; without it the scores have no positions in them
                    return f;
                  },
              .multihead = base_multihead_options});
}

}  // namespace detail

}  // namespace attograd::nn
