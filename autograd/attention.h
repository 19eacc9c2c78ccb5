#pragma once
// Fused scaled-dot-product attention: out = softmax(q k^T * scale + mask) v, with a memory-efficient
// (flash-attention style) backward that recomputes the probabilities block by block.

#include "autograd/flex.h"
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
  /// Sliding window (0 = off; Longformer, Mistral): with is_causal query i sees keys i - window < j <= i, without it
  /// keys |i - j| <= window. Key blocks outside every row's window are skipped (time and memory O(L * window)).
  int64_t window = 0;
  /// Block-sparse attention (0 = off): the side b of the square blocks of block_layout.
  int64_t block_size = 0;
  /// Bool (ceil(Lq / b), ceil(Lk / b)) with TRUE = the block of scores IS COMPUTED (the convention of block-sparse
  /// layouts, the opposite of attn_mask): query i sees key j only when block (i / b, j / b) is true. False blocks are
  /// skipped; the last blocks may be ragged. bigbird_block_layout() builds one. Combines with everything above.
  Tensor block_layout = {};
  /// Key/value heads H_kv of multi_head_attention and packed_self_attention (0 = num_heads); must divide num_heads
  /// (grouped-query attention; 1 = multi-query). scaled_dot_product_attention reads H_kv from k's shape instead.
  int64_t num_kv_heads = 0;
  /// Also return each query row's attention entropy H_i = -sum_j P_ij log P_ij (natural log, 0 log 0 = 0) of the
  /// probabilities BEFORE dropout, computed by the fused kernel from each row's probabilities (never an Lq x Lk
  /// tensor) and differentiable through q and k (its gradient joins the output's in the same fused backward; v gets
  /// none from it). A fully blocked row has entropy 0 and no gradient. Off by default (the results are then unchanged).
  bool need_entropy = false;
  /// FlexAttention's mask_mod (autograd/flex.h): TRUE = the score EXISTS (the OPPOSITE of attn_mask's Bool). The
  /// kernel builds its block mask once per shape (cached in the MaskMod): empty blocks are skipped, full blocks skip
  /// the per-element test, partial blocks call mask_mod per element. Combines with everything above.
  MaskMod mask_mod = {};
  /// A prebuilt block mask (create_block_mask, for these Lq, Lk, mod_q_offset) instead of mask_mod; not both.
  BlockMask block_mask = {};
  /// FlexAttention's score_mod (autograd/flex.h) on scale * q . k before attn_mask and the softmax; differentiable
  /// through q, k and its captured tensors (inputs of the op).
  ScoreMod score_mod = {};
  /// Absolute position of query row 0 as the mods see it (q_idx = mod_q_offset + row; kv_idx = the key's row):
  /// decoding's or RoPE's offset. Only the mods read it (is_causal, window and block_layout stay top-left aligned).
  int64_t mod_q_offset = 0;
};

/// What scaled_dot_product_attention returns.
struct AttentionResult {
  Tensor output;   ///< (B, H, Lq, d_v), or (N, Lq, d_v) for 3-D inputs
  Tensor weights;  ///< (B, H, Lq, Lk) or (N, Lq, Lk) when need_weights, else undefined
  Tensor entropy = {};  ///< (B, H, Lq) or (N, Lq) when need_entropy (differentiable), else undefined
};

/// The attention-entropy regulariser: -lambda * mean of the entropies (as AttentionResult::entropy) over the rows that
/// have at least one visible key (`has_keys`, bool broadcastable to entropies; undefined = every row). A POSITIVE lambda
/// rewards higher entropy when the term is added to the loss being minimised (it discourages over-concentrated heads);
/// a negative one sharpens them. A scalar; 0 when no row has a key.
Tensor attention_entropy_loss(const Tensor& entropies, double lambda, const Tensor& has_keys = {});

/// out = softmax(q k^T * scale + mask) v over the last two dims, optionally with causal masking and dropout.
/// q (B, H, Lq, d_k), k (B, H_kv, Lk, d_k), v (B, H_kv, Lk, d_v); 3-D inputs (N, L, d) are treated as H = 1 and
/// give 3-D results. H_kv dividing H is grouped-query attention: query head h reads key/value head h / (H / H_kv),
/// in place (PyTorch: k.repeat_interleave(H / H_kv, dim=-3), the same for v; no copy here), and the gradient of a
/// shared head sums over its query heads in a fixed order (the same bits for any thread count). window and
/// block_layout skip the blocks of scores no query can see (docs/ATTENTION.md). Blocked scores are -inf. A query
/// row whose keys are ALL blocked gives a zero output row and zero gradients (never NaN; PyTorch 1.13 gives NaN there). Saves q, k, v, the output and per-row
/// softmax statistics (memory linear in L); the backward recomputes the probabilities in blocks of query
/// rows, except for short sequences (Lq * Lk <= detail::attention_saved_probs_limit(), 64 * 64 by default), whose
/// probabilities the forward keeps (4 Lq Lk bytes per head in float32) so that the backward reads them. The
/// dropout mask is replayed from a counter-based hash of (seed, flat index of (b, h, i, j)), where
/// the seed is drawn once per call from the generator: the same generator state replays the same mask.
AttentionResult scaled_dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v,
                                             const AttentionOptions& opts = {});

/// Multi-head attention on head-interleaved tensors, as linear projections produce them: q (B, Lq, H * d_k),
/// k (B, Lk, H_kv * d_k), v (B, Lk, H_kv * d_v) -> output (B, Lq, H * d_v) (H_kv = opts.num_kv_heads, default H;
/// query head h reads key/value head h / (H / H_kv)), head h reading and writing features
/// [h d, (h + 1) d). The same result (bit for bit, dropout mask included) as splitting the heads
/// (reshape to (B, L, H, d), transpose(1, 2)), scaled_dot_product_attention, and merging them back, without the
/// transposes' copies. attn_mask broadcasts to (B, H, Lq, Lk); weights are (B, H, Lq, Lk).
AttentionResult multi_head_attention(const Tensor& q, const Tensor& k, const Tensor& v, int64_t num_heads,
                                     const AttentionOptions& opts = {});

/// Self-attention from one packed projection qkv (B, L, 3 * E) holding [q | k | v] along its last dimension
/// (x in_proj_weight^T + in_proj_bias, E = H * d) -> output (B, L, E). With opts.num_kv_heads = H_kv < H, qkv is
/// (B, L, (H + 2 H_kv) d) holding [q (H d) | k (H_kv d) | v (H_kv d)]. The same result as multi_head_attention on
/// the three slices; the gradient reaches qkv as one (B, L, 3 * E) tensor, so no slice or concatenation is copied.
AttentionResult packed_self_attention(const Tensor& qkv, int64_t num_heads, const AttentionOptions& opts = {});

/// Options of bigbird_block_layout (BigBird, Zaheer et al. 2020, in blocks).
struct BigBirdLayoutOptions {
  int64_t q_blocks = 0;       ///< rows of the layout: ceil(Lq / block_size)
  int64_t k_blocks = 0;       ///< columns of the layout: ceil(Lk / block_size)
  int64_t local_blocks = 1;   ///< query block r sees key blocks r - local_blocks ... r + local_blocks (a band)
  int64_t global_blocks = 0;  ///< the first global_blocks key blocks are seen by every query block, and the first
                              ///< global_blocks query blocks see every key block
  int64_t random_blocks = 0;  ///< further key blocks per query block, drawn without replacement from the rest
  uint64_t seed = 0;          ///< seed of the random blocks (the same seed gives the same layout)
};

/// A Bool block layout (q_blocks, k_blocks) for AttentionOptions::block_layout, TRUE = computed: local band + global
/// rows and columns + random blocks. Combine with is_causal for a causal pattern (blocks past the diagonal are then
/// skipped, not computed).
Tensor bigbird_block_layout(const BigBirdLayoutOptions& opts);

namespace detail {
/// Largest Lq * Lk whose probabilities attention keeps for its backward instead of recomputing them (default
/// 64 * 64; 0 always recomputes). Either way the gradients are bitwise the same.
int64_t& attention_saved_probs_limit();
/// Whether rows of at most 64 keys take the one-pass row kernels (default true; false runs the separate passes, for
/// tests: the results are bitwise the same).
bool& attention_one_pass_rows();
}  // namespace detail

}  // namespace attograd
