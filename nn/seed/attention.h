#pragma once
// The seed's multi-head attention sublayer: jadore801120/attention-is-all-you-need-pytorch, transformer/SubLayers.py,
// class MultiHeadAttention (there: projections, scaled dot-product attention, fc, dropout, + residual, post-LayerNorm).
// Named AttentionSublayer here, so that it does not differ by one capital letter from PyTorch's MultiheadAttention
// (nn/attention.h); its parameter names are the seed's (w_qs, w_ks, w_vs, fc, layer_norm).
//
// Masks at this API follow nn/attention.h: a Bool entry TRUE means BLOCKED (the seed's mask means the opposite:
// 1 = attend), a float mask is added to the scores. A query whose keys are all blocked attends to nothing (zero
// output before the residual, finite gradients); the seed's masked_fill(-1e9) gives uniform weights there.
//
// It is an AttentionLayer (nn/attention_layer.h) of the kind "seed-mha", which the seq2seq model builds its
// self-attention from through make_attention (forward(x, call) with the key padding mask and is_causal, its own
// decoding cache): the layer's output is the seed's, residual and post-LN included, so the kind is the seq2seq
// model's own and is not listed among the kinds a user picks (AttentionKindInfo::internal). The cross-attention
// (enc_attn) takes keys and values from the encoder output and is called through forward(q, k, v, mask).

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "autograd/random.h"
#include "autograd/tensor.h"
#include "nn/attention.h"
#include "nn/attention_layer.h"
#include "nn/layers.h"
#include "nn/module.h"

namespace attograd::nn::seed {

/// What AttentionSublayer::forward returns.
struct AttentionSublayerResult {
  Tensor output;  ///< (B, Lq, d_model)
  Tensor attn;    ///< (B, H, Lq, Lk) probabilities after attention dropout (no history); undefined unless need_weights
  Tensor entropy = {};  ///< (B, H, Lq) row entropies with history (autograd/attention.h); undefined unless asked
};

/// Attention variants of AttentionSublayer (not the seed's; all off by default, which is exactly the seed's layer).
struct AttentionSublayerVariants {
  int64_t n_kv_head = 0;   ///< key/value heads H_kv (0 = n_head; must divide it): grouped-query attention
  int64_t window = 0;      ///< sliding window (0 = off): the fused op's rule (|i - j| <= window without is_causal)
  int64_t block_size = 0;  ///< block-sparse (0 = off): BigBird layout, 1 local and 1 global block
};

/// The decoding state of AttentionSublayer's self-attention (make_cache): the keys and values of KeyValueCache, and
/// per cache row the token at every position written (CachedAttentionRows::tokens), whose keys are blocked where
/// they are the layer's pad token (as the key padding mask blocks them in forward).
struct SeedKeyValueCache : KeyValueCache {
  std::vector<std::vector<int64_t>> tokens;  ///< per cache row, the token at each position written so far
};

/// The seed's multi-head attention sublayer (its transformer/SubLayers.py MultiHeadAttention):
///   q_h = w_qs(q), k_h = w_ks(k), v_h = w_vs(v)            (bias-free; per-head sizes d_k, d_k, d_v)
///   a   = dropout(softmax(q_h k_h^T / sqrt(d_k) + mask)) v_h  (per head)
///   out = layer_norm(dropout(fc(concat_h a)) + q)           (post-LN, LayerNorm(d_model, eps = 1e-6))
/// Parameters: w_qs.weight (H d_k, d_model), w_ks.weight (H d_k, d_model), w_vs.weight (H d_v, d_model),
/// fc.weight (d_model, H d_v), layer_norm.weight, layer_norm.bias; xavier_uniform_ on the four weights (as the
/// seed's model does for every parameter with more than one dimension). One dropout probability serves both the
/// attention probabilities and the output (the seed hard-wires 0.1 for the former, equal to the default).
class AttentionSublayer : public AttentionLayer {
 public:
  /// n_head heads of query/key size d_k and value size d_v (need not be d_model / n_head); parameters in
  /// `dtype` (initialised in float32, then converted: see nn/layers.h).
  /// With variants.n_kv_head = H_kv < n_head, w_ks and w_vs have H_kv d_k and H_kv d_v outputs (the same
  /// xavier_uniform_ init, over their own fans); query head h reads key/value head h / (n_head / H_kv).
  AttentionSublayer(int64_t n_head, int64_t d_model, int64_t d_k, int64_t d_v, double dropout = 0.1,
                    Generator& gen = default_generator(), Dtype dtype = kFloat32,
                    const AttentionSublayerVariants& variants = {});

  /// q (B, Lq, d_model), k (B, Lk, d_model), v (B, Lk, d_model); mask Bool with TRUE = BLOCKED, or float additive,
  /// either (B, Lq or 1, Lk) — the seed's shape: the head axis is inserted as the seed does —, (Lq, Lk), or 4-D
  /// broadcastable to (B, H, Lq, Lk). The seed's mask means the opposite (1 = attend, blocked where mask == 0):
  /// pass logical_not(seed_mask) (or eq(seed_mask, 0) for a numeric one).
  AttentionSublayerResult forward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask = Tensor(),
                                  bool need_weights = true, bool need_entropy = false);
  /// Calls forward(q, k, v, mask, need_weights).
  AttentionSublayerResult operator()(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask = Tensor(),
                                     bool need_weights = true) {
    return forward(q, k, v, mask, need_weights);
  }
  /// Self-attention through the AttentionLayer interface: x (B, L, d_model) -> forward(x, x, x, mask), the mask
  /// blocking call.key_padding_mask's keys (B, L) (as padding_mask gives them, (B, 1, 1, L)) and, with
  /// call.is_causal, the later keys (logical_or with causal_mask(L)). Error for rope_offset or a call window.
  AttentionOutput forward(const Tensor& x, const AttentionCall& call) override;
  /// Causal self-attention of x (B, L, d_model) (AttentionLayer's default call).
  Tensor forward(const Tensor& x) override { return AttentionLayer::forward(x); }

  /// A SeedKeyValueCache of H_kv heads for B rows and C positions in the parameters' dtype; null (decode by
  /// recomputing) with a window or block_size.
  std::shared_ptr<AttentionCache> make_cache(int64_t B, int64_t C) const override;
  /// Causal decoding step of the self-attention (AttentionLayer::forward_cached): x (A, N, d_model) -> (A, N,
  /// d_model), forward_cached(x, x, ...) below over the cache's keys and values, keys blocked where their token
  /// (recorded from rows.tokens, which must be given when pad >= 0) is `pad`.
  Tensor forward_cached(const Tensor& x, AttentionCache& cache, const CachedAttentionRows& rows) override;

  /// Decoding with a key/value cache (eval mode, no gradients; see cached_attention in nn/attention.h): q (A, N,
  /// d_model) holds the new positions of A rows; when kv is defined (A, N, d_model), its keys and values are first
  /// written into the caches (key_cache (B, H, d_k, C), value_cache (B, H, C, d_v)) at the rows' new positions;
  /// then the queries attend to the cache (causal: up to their own position; else all of it, e.g. an encoder
  /// output cached once), keys blocked by key_tokens / pad -> (A, N, d_model), what forward() gives there. The
  /// caches hold H_kv heads. Not with a window or block_size (the seq2seq model uses them in the encoder only).
  Tensor forward_cached(const Tensor& q, const Tensor& kv, Tensor& key_cache, Tensor& value_cache,
                        const CachedAttentionRows& rows, bool causal,
                        const std::vector<std::vector<int64_t>>* key_tokens = nullptr, int64_t pad = -1);

  /// "AttentionSublayer".
  std::string type_name() const override { return "AttentionSublayer"; }

  int64_t n_head;                         ///< H
  int64_t d_model;                        ///< model width
  int64_t d_k;                            ///< per-head query/key size
  int64_t d_v;                            ///< per-head value size
  AttentionSublayerVariants variants;     ///< grouped-query heads, window, block-sparse (all off: the seed's)
  /// The token whose keys the interface's cached decoding blocks (forward_cached with rows.tokens); -1: none. The
  /// seq2seq model sets its pad_idx (the "pad" option of the kind "seed-mha").
  int64_t pad = -1;
  std::shared_ptr<Linear> w_qs;           ///< d_model -> H d_k, no bias
  std::shared_ptr<Linear> w_ks;           ///< d_model -> H_kv d_k, no bias (H_kv = H unless grouped-query)
  std::shared_ptr<Linear> w_vs;           ///< d_model -> H_kv d_v, no bias
  std::shared_ptr<Linear> fc;             ///< H d_v -> d_model, no bias
  std::shared_ptr<Dropout> dropout;       ///< on fc's output
  std::shared_ptr<LayerNorm> layer_norm;  ///< LayerNorm(d_model, eps = 1e-6)

 protected:
  /// Draws future attention-dropout masks from `gen` (set_generator's hook; the child "dropout" has its own).
  void set_own_generator(Generator& gen) override { dropout_gen_ = &gen; }

 private:
  double attn_dropout_;
  Generator* dropout_gen_ = nullptr;
};

}  // namespace attograd::nn::seed
