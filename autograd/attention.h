#pragma once
// Fused scaled-dot-product attention: out = softmax(q k^T * scale + mask) v, with a memory-efficient
// (flash-attention style) backward that recomputes the probabilities block by block.

#include "autograd/random.h"
#include "autograd/tensor.h"

namespace attograd {

/// Options of scaled_dot_product_attention.
struct AttentionOptions {
  /// Optional mask, broadcastable (numpy rules, right-aligned) to the scores (B, H, Lq, Lk) — or (N, Lq, Lk)
  /// for 3-D inputs — e.g. (Lq, Lk), (B, 1, 1, Lk), (B, H, Lq, Lk). Bool: true = BLOCKED (the convention of
  /// PyTorch's nn.MultiheadAttention, the opposite of F.scaled_dot_product_attention). Float (q's dtype):
  /// added to the scores (-inf blocks). No gradient flows to a float mask.
  Tensor attn_mask = {};
  /// Block key j > query i (top-left aligned, like PyTorch); may combine with attn_mask.
  bool is_causal = false;
  /// Dropout on the attention probabilities (inverted: kept values are scaled by 1 / (1 - p)); in [0, 1).
  double dropout_p = 0.0;
  /// Multiplier of q k^T; 0 means 1 / sqrt(d_k).
  double scale = 0.0;
  /// Source of the per-call dropout seed (one draw per call when dropout_p > 0); nullptr = default_generator().
  Generator* generator = nullptr;
  /// Also return the (B, H, Lq, Lk) probabilities, after dropout (like PyTorch 1.13's MHA), without history.
  bool need_weights = false;
};

/// What scaled_dot_product_attention returns.
struct AttentionResult {
  Tensor output;   ///< (B, H, Lq, d_v), or (N, Lq, d_v) for 3-D inputs
  Tensor weights;  ///< (B, H, Lq, Lk) or (N, Lq, Lk) when need_weights, else undefined
};

/// out = softmax(q k^T * scale + mask) v over the last two dims, optionally with causal masking and dropout.
/// q (B, H, Lq, d_k), k (B, H, Lk, d_k), v (B, H, Lk, d_v); 3-D inputs (N, L, d) are treated as H = 1 and
/// give 3-D results. Blocked scores are -inf. A query row whose keys are ALL blocked gives a zero output row
/// and zero gradients (never NaN; PyTorch 1.13 gives NaN there). Saves q, k, v, the output and per-row
/// softmax statistics (memory linear in L); the backward recomputes the probabilities in blocks of query
/// rows, except for short sequences (Lq * Lk <= detail::attention_saved_probs_limit(), 64 * 64 by default), whose
/// probabilities the forward keeps (4 Lq Lk bytes per head in float32) so that the backward reads them. The
/// dropout mask is replayed from a counter-based hash of (seed, flat index of (b, h, i, j)), where
/// the seed is drawn once per call from the generator: the same generator state replays the same mask.
AttentionResult scaled_dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v,
                                             const AttentionOptions& opts = {});

/// Multi-head attention on head-interleaved tensors, as linear projections produce them: q (B, Lq, H * d_k),
/// k (B, Lk, H * d_k), v (B, Lk, H * d_v) -> output (B, Lq, H * d_v), head h reading and writing features
/// [h d, (h + 1) d). The same result (bit for bit, dropout mask included) as splitting the heads
/// (reshape to (B, L, H, d), transpose(1, 2)), scaled_dot_product_attention, and merging them back, without the
/// transposes' copies. attn_mask broadcasts to (B, H, Lq, Lk); weights are (B, H, Lq, Lk).
AttentionResult multi_head_attention(const Tensor& q, const Tensor& k, const Tensor& v, int64_t num_heads,
                                     const AttentionOptions& opts = {});

/// Self-attention from one packed projection qkv (B, L, 3 * E) holding [q | k | v] along its last dimension
/// (x in_proj_weight^T + in_proj_bias, E = H * d) -> output (B, L, E). The same result as multi_head_attention on
/// the three slices; the gradient reaches qkv as one (B, L, 3 * E) tensor, so no slice or concatenation is copied.
AttentionResult packed_self_attention(const Tensor& qkv, int64_t num_heads, const AttentionOptions& opts = {});

namespace detail {
/// Largest Lq * Lk whose probabilities attention keeps for its backward instead of recomputing them (default
/// 64 * 64; 0 always recomputes). Either way the gradients are bitwise the same.
int64_t& attention_saved_probs_limit();
}  // namespace detail

}  // namespace attograd
