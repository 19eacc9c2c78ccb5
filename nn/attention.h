#pragma once
// MultiheadAttention: torch.nn.MultiheadAttention (PyTorch's parameters, names and masks), always batch-first, built
// on the fused scaled_dot_product_attention op. (The seed's attention sublayer, with its residual and post-LayerNorm,
// is seed::AttentionSublayer in nn/seed/attention.h.)
//
// Mask convention everywhere at this API: a Bool entry TRUE means BLOCKED ("do not attend"), as in PyTorch's
// nn.MultiheadAttention (and the opposite of F.scaled_dot_product_attention's mask, where true means "attend"). A
// float mask is added to the scores (-inf blocks).
// A query whose keys are ALL blocked attends to nothing: its attention output is zero (so MultiheadAttention
// returns out_proj.bias for it), its weights are zero and every gradient through it is finite (zero), never NaN.
// PyTorch 1.13 gives NaN there; the seed (masked_fill -1e9) gives uniform weights over the blocked keys.

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "autograd/flex.h"
#include "autograd/random.h"
#include "autograd/tensor.h"
#include "nn/attention_layer.h"
#include "nn/feedforward.h"
#include "nn/layers.h"
#include "nn/module.h"
#include "nn/positional.h"

namespace attograd::nn {

struct KeyValueCache;

/// Constructor options of MultiheadAttention (torch.nn.MultiheadAttention's keyword arguments):
/// MultiheadAttention({.embed_dim = 64, .num_heads = 4, .dropout = 0.1}).
struct MultiheadAttentionOptions {
  int64_t embed_dim = 0;       ///< E, the model width (query features and output features)
  int64_t num_heads = 0;       ///< H; must divide embed_dim (head_dim = E / H)
  double dropout = 0.0;        ///< dropout on the attention probabilities in training mode, in [0, 1)
  bool bias = true;            ///< in_proj_bias and out_proj.bias
  bool add_bias_kv = false;    ///< learned bias_k, bias_v appended as one extra key/value position
  bool add_zero_attn = false;  ///< a zero key/value appended (after projection and bias_kv)
  int64_t kdim = 0;            ///< key features; 0 means embed_dim
  int64_t vdim = 0;            ///< value features; 0 means embed_dim
  Dtype dtype = kFloat32;      ///< parameter dtype (initialised in float32, then converted: see nn/layers.h)
  // Attention variants (docs/ATTENTION.md); PyTorch's nn.MultiheadAttention has none of them.
  int64_t num_kv_heads = 0;  ///< H_kv key/value heads (0 = num_heads; must divide it): grouped-query attention
  int64_t window = 0;        ///< sliding window (0 = off): causal i - window < j <= i, else |i - j| <= window
  int64_t block_size = 0;    ///< block-sparse attention with a BigBird layout of blocks of this size (0 = off)
  int64_t block_local = 1;   ///< BigBird layout: key blocks on each side of a query block's own
  int64_t block_global = 0;  ///< BigBird layout: global blocks (the first ones, seen by and seeing every block)
  int64_t block_random = 0;  ///< BigBird layout: random key blocks per query block
  uint64_t block_seed = 0;   ///< BigBird layout: seed of the random blocks (fixed: the same layout every call)
  bool rope = false;            ///< rotary position embeddings (autograd/rope.h, interleaved pairs) on each head's
                                ///< queries and keys after the in-projection; needs an even head_dim
  int64_t rope_max_len = 2048;  ///< RoPE: positions in its cos/sin tables (later ones are computed per call)
  double rope_base = 10000.0;   ///< RoPE: theta_i = rope_base^(-2i / head_dim)
  /// FlexAttention's mask_mod (autograd/flex.h) in every forward, e.g. prefix_lm_mask(P): TRUE = the score EXISTS
  /// (the OPPOSITE of attn_mask's Bool). Its block mask is built once per shape and cached. Not with add_bias_kv /
  /// add_zero_attn.
  MaskMod mask_mod = {};
  /// FlexAttention's score_mod in every forward (e.g. alibi(H), softcap(50)) on scale * q . k before the masks and
  /// the softmax; its captured tensors get gradients. Not with add_bias_kv / add_zero_attn.
  ScoreMod score_mod = {};
};

/// Per-call options of MultiheadAttention::forward (PyTorch's forward keyword arguments).
struct MhaForwardOptions {
  /// (B, Lk): Bool (true = that key is padding, BLOCKED) or float additive (query's dtype).
  Tensor key_padding_mask = {};
  /// (Lq, Lk) or (B * H, Lq, Lk) (index b * H + h): Bool (true = BLOCKED) or float additive.
  Tensor attn_mask = {};
  /// Also return the attention probabilities.
  bool need_weights = true;
  /// Average the returned weights over heads: (B, Lq, Lk) instead of (B, H, Lq, Lk).
  bool average_attn_weights = true;
  /// Also block key j > query i (over the given keys; bias_kv / zero-attn keys stay visible). Combines with
  /// the masks above (PyTorch 1.13 has no is_causal: pass the causal attn_mask there).
  bool is_causal = false;
  /// Also return each query row's attention entropy (differentiable; for attention_entropy_loss).
  bool need_entropy = false;
  /// RoPE (options().rope): the position of the first query and key (queries and keys at rope_offset .. + L - 1).
  int64_t rope_offset = 0;
  /// A mask_mod of this call only (e.g. document_mask of this batch's sequence ids; TRUE = attended), combined with
  /// options().mask_mod by and_masks (a per-call mask builds its block mask in every call).
  MaskMod mask_mod = {};
  /// A score_mod of this call only, applied after options().score_mod (compose_score_mods).
  ScoreMod score_mod = {};
  /// The absolute position of the first query as the mods see it (q_idx = mod_q_offset + i; keys at 0 .. Lk - 1).
  int64_t mod_q_offset = 0;
  /// A sliding window of this call only (0 = none), combined with options().window (the smaller applies): the
  /// reference of a ring decode past the context (AttentionCall::window).
  int64_t window = 0;
};

/// What MultiheadAttention::forward returns.
struct MhaResult {
  Tensor output;  ///< (B, Lq, E)
  /// (B, Lq, Lk') averaged over heads, or (B, H, Lq, Lk'); Lk' counts bias_kv / zero-attn keys. Undefined
  /// unless need_weights. After dropout in training (as PyTorch 1.13). Not differentiable (no history).
  Tensor weights;
  /// (B, H, Lq): -sum_j p_ij log p_ij of each head's row before dropout (0 for a row with no visible key), with
  /// history back to the projections. Undefined unless need_entropy.
  Tensor entropy = {};
};

/// torch.nn.MultiheadAttention with batch_first=True (always: inputs and outputs are (B, L, features)).
/// Parameters, in PyTorch's named_parameters() order: in_proj_weight (3E, E) — or q_proj_weight (E, E),
/// k_proj_weight (E, kdim), v_proj_weight (E, vdim) when kdim or vdim differs from E —, in_proj_bias (3E),
/// bias_k (1, 1, E), bias_v (1, 1, E), out_proj.weight (E, E), out_proj.bias (E). Init as PyTorch: xavier_uniform_
/// on the in-projections, zeros on in_proj_bias and out_proj.bias, xavier_normal_ on bias_k/bias_v, out_proj.weight
/// as Linear's default. out = out_proj(concat_h softmax(q_h k_h^T / sqrt(E / H) + mask) v_h).
/// Deviations from PyTorch, all off by default (then parameters and results are exactly as above):
/// - num_kv_heads = H_kv < H (grouped-query; 1 = multi-query): the key and value projections have H_kv * head_dim
///   outputs, so in_proj_weight is ((H + 2 H_kv) head_dim, E) rows [W_q; W_k; W_v] (k_proj_weight, v_proj_weight
///   (H_kv head_dim, kdim / vdim)), in_proj_bias ((H + 2 H_kv) head_dim), bias_k / bias_v (1, 1, H_kv head_dim);
///   query head h reads key/value head h / (H / H_kv). Init as above: xavier_uniform_ on the whole in_proj_weight
///   (fan_in E, fan_out (H + 2 H_kv) head_dim) or on each of q/k/v_proj_weight.
/// - window, block_size (BigBird layout from block_local, block_global, block_random, block_seed): the fused op's
///   sliding-window and block-sparse attention (see autograd/attention.h); not with add_bias_kv / add_zero_attn.
/// - rope: the queries and keys of every head rotated by RoPE (nn::RotaryEmbedding: interleaved pairs (2i, 2i+1),
///   angle p * rope_base^(-2i / head_dim)) at positions rope_offset + 0 .. L-1 after the in-projection (and its
///   bias), before the attention; no parameters (the tables are not buffers). Self-attention or equal lengths
///   (one position per query and key); not with add_bias_kv / add_zero_attn.
/// As an AttentionLayer (nn/attention_layer.h) it is the kinds mha, gqa, local and block-sparse: self-attention
/// forward(x, call), and a KeyValueCache of its H_kv heads for decoding.
class MultiheadAttention : public AttentionLayer {
 public:
  /// Creates the parameters, drawing their initial values from `gen`.
  explicit MultiheadAttention(const MultiheadAttentionOptions& options, Generator& gen = default_generator());

  /// query (B, Lq, E), key (B, Lk, kdim), value (B, Lk, vdim) -> output (B, Lq, E) and weights. Passing the same
  /// tensor as query, key and value is self-attention (its gradient accumulates all three uses).
  MhaResult forward(const Tensor& query, const Tensor& key, const Tensor& value, const MhaForwardOptions& opts = {});
  /// Calls forward(query, key, value, opts).
  MhaResult operator()(const Tensor& query, const Tensor& key, const Tensor& value,
                       const MhaForwardOptions& opts = {}) {
    return forward(query, key, value, opts);
  }
  /// Self-attention: forward(x, x, x) with call's key padding mask, causality, RoPE offset, per-head weights
  /// (not averaged) and entropies.
  AttentionOutput forward(const Tensor& x, const AttentionCall& call) override;
  using AttentionLayer::forward;
  /// A KeyValueCache of H_kv heads for B rows and C positions (null, decode by recomputing, for random BigBird
  /// blocks, bias_kv / zero-attn keys or kdim / vdim other than E).
  std::shared_ptr<AttentionCache> make_cache(int64_t B, int64_t C) const override;
  /// A KeyValueCache ring (AttentionCache::ring) of min(span, window) slots (span without a window): each query at
  /// position p attends to p - slots < j <= p, RoPE at the true positions, the mods at the true distances. Null
  /// with a block layout (its blocks are fixed from position 0) and where make_cache gives none.
  std::shared_ptr<AttentionCache> make_ring_cache(int64_t B, int64_t span) const override;
  /// Decoding step (see AttentionLayer::forward_cached): causal, through cached_attention with the layer's
  /// grouped heads, window or block layout, RoPE at each row's absolute positions. A ring writes and attends one
  /// position at a time once a row's positions wrap (each query still finds its last `slots` keys).
  Tensor forward_cached(const Tensor& x, AttentionCache& cache, const CachedAttentionRows& rows) override;

  /// The constructor options with kdim/vdim and num_kv_heads resolved (never 0).
  const MultiheadAttentionOptions& options() const { return opts_; }
  /// E / H.
  int64_t head_dim() const { return opts_.embed_dim / opts_.num_heads; }
  /// H_kv (num_heads unless the options ask for grouped-query attention).
  int64_t num_kv_heads() const { return opts_.num_kv_heads; }
  /// "MultiheadAttention".
  std::string type_name() const override { return "MultiheadAttention"; }
  /// The rotary embedding of the queries and keys (options().rope), else null. Not a child: no state.
  const std::shared_ptr<RotaryEmbedding>& rotary() const { return rotary_; }

  Tensor in_proj_weight;             ///< (3E, E) rows [W_q; W_k; W_v] ((H + 2 H_kv) head_dim, E) with grouped-query
                                     ///< attention), or undefined when kdim/vdim differ from E
  Tensor q_proj_weight;              ///< (E, E) when kdim/vdim differ from E, else undefined
  Tensor k_proj_weight;              ///< (E, kdim) when kdim/vdim differ from E, else undefined
  Tensor v_proj_weight;              ///< (E, vdim) when kdim/vdim differ from E, else undefined
  Tensor in_proj_bias;               ///< (3E) [b_q; b_k; b_v], undefined when !bias
  Tensor bias_k;                     ///< (1, 1, E) when add_bias_kv, else undefined
  Tensor bias_v;                     ///< (1, 1, E) when add_bias_kv, else undefined
  std::shared_ptr<Linear> out_proj;  ///< E -> E (with bias when options.bias)

 protected:
  /// Draws future attention-dropout masks from `gen` (default_generator() until set; set_generator's hook).
  void set_own_generator(Generator& gen) override { dropout_gen_ = &gen; }
  /// forward_cached with a mask_mod of this step only (combined with options().mask_mod by and_masks; called as
  /// mask_mod(cache row, query head, the query's position, the key's position)). causal false lets a query see
  /// the positions written so far after its own (CachedAttentionOptions::written_only): how a kind made of a
  /// per-call mask (prefix-lm, document) decodes.
  Tensor forward_cached_masked(const Tensor& x, AttentionCache& cache, const CachedAttentionRows& rows,
                               const MaskMod& step_mask, bool causal);

 private:
  // forward_cached on a ring: the new positions' heads (A, N, E) from qkv (A, N, E + 2 Ekv), RoPE applied.
  Tensor ring_attention(const Tensor& qkv, KeyValueCache& cache, const CachedAttentionRows& rows, double scale) const;

  MultiheadAttentionOptions opts_;
  bool same_embed_ = true;
  Generator* dropout_gen_ = nullptr;
  std::shared_ptr<RotaryEmbedding> rotary_;
};

// ---------------------------------------------------------------------------------------------
// Attention with a key/value cache (incremental decoding, eval mode, no gradients)
//
// A cache holds one attention layer's keys and values for B rows and C positions: key_cache (B, H, d_k, C) (keys
// stored TRANSPOSED, so that a query's scores over the cached keys are contiguous axpy loops), value_cache
// (B, H, C, d_v). A decoding step feeds A rows of N new positions each (right-padded: row a's first count[a]
// positions are real). Row a lives in cache row cache_row[a]; its new positions are start[a] ... start[a] +
// count[a] - 1. Nothing is reallocated or copied per step: each step writes its new keys and values in place.

/// MultiheadAttention's decoding state: the keys and values of its H_kv heads (see the section comment).
struct KeyValueCache : AttentionCache {
  Tensor key;    ///< (B, H_kv, d_k, C), keys stored transposed
  Tensor value;  ///< (B, H_kv, C, d_v)
  /// C.
  int64_t capacity() const override { return value.size(2); }
  /// The bytes of key and value.
  int64_t bytes() const override;
};

/// The attention variants of cached_attention (all off by default: every query head has its own cache head and sees
/// every position the causal rule allows).
struct CachedAttentionOptions {
  /// Query heads H (0 = the cache's heads H_kv); H_kv must divide it: query head h reads cache head h / (H / H_kv)
  /// (grouped-query attention; the cache holds H_kv heads).
  int64_t num_heads = 0;
  /// Sliding window (0 = off; causal only): the query at position p sees cache positions p - window < j <= p.
  int64_t window = 0;
  /// Block-sparse (0 = off; causal only): the query at position p sees key j only where block_layout[p / block_size,
  /// j / block_size] is TRUE (AttentionOptions::block_layout's convention), the layout covering the cache's positions.
  int64_t block_size = 0;
  /// Bool (>= ceil(C / block_size), >= ceil(C / block_size)) when block_size > 0, TRUE = computed.
  Tensor block_layout = {};
  /// FlexAttention's mask_mod (TRUE = attended), called per key as mask_mod(cache row, query head, the query's
  /// absolute position start[a] + i, the key's position): the same scores as MultiheadAttention's forward with it.
  MaskMod mask_mod = {};
  /// FlexAttention's score_mod on scale * q . k, with the same arguments (no gradients here).
  ScoreMod score_mod = {};
  /// Not causal: row a's queries see the positions written so far, [0, start[a] + count[a]), instead of the whole
  /// cache (a mask_mod then picks among them: a prefix LM's prefill, whose queries see the later prompt positions).
  bool written_only = false;
  /// The cache is a ring of C slots (a ring decode past the context, AttentionLayer::make_ring_cache): position j
  /// is in slot j mod C. Needs causal attention and 0 < window <= C (the query at p reads positions p - window < j
  /// <= p, which the writer must still hold: write_kv_cache with ring, one position at a time once it wraps); no
  /// block layout, no key_tokens. The mods see the keys' absolute positions.
  bool ring = false;
};

/// An empty cache for B rows, H heads, C positions: {key (B, H, d_k, C), value (B, H, C, d_v)} in `dtype`.
std::pair<Tensor, Tensor> make_kv_cache(int64_t B, int64_t H, int64_t C, int64_t d_k, int64_t d_v, Dtype dtype);

/// Writes the new positions' keys k (A, N, Wk) features [k_col, k_col + H d_k) and values v (A, N, Wv) features
/// [v_col, v_col + H d_v) (head h in [h d, (h + 1) d) of that range, as a projection writes them) into the caches.
/// Error when a position falls outside the cache's C positions. With `ring`, position p goes to slot p mod C
/// (overwriting position p - C; at most C positions per row and call).
void write_kv_cache(Tensor& key_cache, Tensor& value_cache, const Tensor& k, int64_t k_col, const Tensor& v,
                    int64_t v_col, const CachedAttentionRows& rows, bool ring = false);

/// Attention of the new queries q (A, N, Wq) features [q_col, q_col + H d_k) over the cached keys and values:
/// out (A, N, H d_v) = softmax(q k^T * scale) v per head. causal: query i of row a sees cache positions
/// [0, start[a] + i]; else every position of the cache (e.g. an encoder output cached once). With key_tokens
/// (indexed by cache row), key j is blocked where j >= key_tokens[b].size() or key_tokens[b][j] == pad. A query
/// with every key blocked, and every padding query (i >= count[a]), gives zeros.
/// With `variants`: grouped-query heads, a sliding window or a block layout (see CachedAttentionOptions); q then
/// holds H = variants.num_heads heads and out is (A, N, H d_v).
Tensor cached_attention(const Tensor& q, int64_t q_col, const Tensor& key_cache, const Tensor& value_cache,
                        const CachedAttentionRows& rows, double scale, bool causal,
                        const std::vector<std::vector<int64_t>>* key_tokens = nullptr, int64_t pad = -1,
                        const CachedAttentionOptions& variants = {});

/// RoPE for decoding, in place (no gradients): rotates `heads` groups of head_dim features of x (A, N, W) from
/// feature col, row a's position i at the absolute position rows.start[a] + i (i < rows.count[a]), with the
/// tables of `rotary` (bit for bit what rotary.forward gives at those positions).
void rotate_cached_rows_(Tensor& x, int64_t col, int64_t heads, RotaryEmbedding& rotary,
                         const CachedAttentionRows& rows);

/// linear(x, weight, bias) for decoding (no gradients): x (..., K), weight (N, K), bias (N) or undefined ->
/// (..., N). A few rows (at most 16: one token per row of a small batch) take a matrix-vector product that reads
/// the weight in place once, instead of the GEMM's packing of the whole weight for one row; more rows call
/// linear(). The same values within rounding (not bitwise: another summation order); a row's result does not
/// depend on how many rows come with it. Under Autocast (bfloat16) x and the weight take bf16 values, as linear's
/// operands do; with a DecodeWeightCache alive, the product reads the cache's bf16 copy of the weight (half the
/// bytes of float32 per token), else it is linear()'s bf16 GEMM.
Tensor decode_linear(const Tensor& x, const Tensor& weight, const Tensor& bias = Tensor());

/// While alive on a thread, decode_linear under Autocast (bfloat16) converts each float32 weight it reads to
/// bfloat16 once and reads that copy afterwards: generation (train::sample, greedy_decode, bench --generate) holds
/// one for the whole decode. Copies are keyed by the weight's data and its storage version: a weight changed in
/// place (an optimizer step, copy_) is converted again. Nests (the outermost cache serves).
class DecodeWeightCache {
 public:
  DecodeWeightCache();
  ~DecodeWeightCache();
  DecodeWeightCache(const DecodeWeightCache&) = delete;
  DecodeWeightCache& operator=(const DecodeWeightCache&) = delete;
  /// The bf16 copies held (for tests).
  size_t size() const;
  /// The copies (internal: nn/attention.cpp).
  struct Impl;

 private:
  Impl* impl_;
  bool owner_;
};

/// ff.forward(x) for decoding in eval mode (no gradients; dropout is off): decode_linear for both layers.
Tensor decode_feed_forward(const PositionwiseFeedForward& ff, const Tensor& x);

}  // namespace attograd::nn
