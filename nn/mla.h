#pragma once
// MultiHeadLatentAttention: DeepSeek-V2's multi-head latent attention (MLA; arXiv 2405.04434, sections 2.1.2-2.1.3),
// with the parameter names, layout and RMSNorms of DeepSeek-V3's inference/model.py (class MLA). Causal
// self-attention; for x (B, L, D), heads h = 0 .. H-1, d_qk = qk_nope_head_dim + qk_rope_head_dim:
//   q        = wq(x)                                  (q_lora_rank == 0)
//            = wq_b(q_norm(wq_a(x)))                  (query compression: c_Q = q_norm(W_DQ x), rank q_lora_rank)
//   q_h      = [q_C,h | q_R,h],  q_R,h = RoPE(q_R,h)  (per head: d_nope features, then d_rope features)
//   [c | r]  = wkv_a(x);  c_KV = kv_norm(c) (B, L, kv_lora_rank);  k_R = RoPE(r) (B, L, d_rope), shared by the heads
//   [k_C,h | v_h] = wkv_b(c_KV) per head (W_UK rows then W_UV rows of each head: (H (d_nope + d_v), kv_lora_rank))
//   k_h      = [k_C,h | k_R]
//   out      = wo(concat_h dropout(softmax(q_h k_h^T / sqrt(d_qk) + causal)) v_h)
// Attention dropout (options.dropout, training mode only) on the probabilities, as MultiheadAttention's (DeepSeek's
// inference code has none; 0 by default).
// RoPE is autograd/rope.h's interleaved pairing (2i, 2i+1), as DeepSeek-V3's complex-number apply_rotary_emb. The
// norms are RMSNorm (eps 1e-6, weight ones) on the latents, as DeepSeek-V2/V3 (kv_a_layernorm / kv_norm); the
// key/value cache holds the NORMALISED latent. No biases anywhere (DeepSeek's Linear has none).
// Init: xavier_uniform_ (gain 1) on every projection weight except wo (wq or wq_a, wq_b, wkv_a, wkv_b: each its own
// fan_in / fan_out), as MultiheadAttention's in_proj_weight; wo as Linear's default (kaiming_uniform_(a = sqrt(5))),
// as MultiheadAttention's out_proj; RMSNorm weights ones. Drawn in registration order from `gen`.
//
// Incremental decoding (eval, no gradients): an MlaCache holds per row and position only [c_KV | k_R]
// (kv_lora_rank + d_rope numbers, vs 2 H d for MultiheadAttention). Two paths, equal within rounding:
// - plain: expand the cached latents through wkv_b into per-head keys and values, then attend;
// - absorbed: fold W_UK into the query (q'_h = q_C,h W_UK,h, (kv_lora_rank)) and W_UV after the attention, so the
//   heads attend to the latent directly: scores_h = q'_h c_KV^T + q_R,h k_R^T, o_h = (softmax(scores_h) c_KV)
//   W_UV,h^T — multi-query attention over the cache with key [c_KV | k_R] and value c_KV.
// decode() takes the rows of a batched decode as the key/value cache of MultiheadAttention does
// (CachedAttentionRows, nn/attention.h): each fed row has its own cache row, first position and count of real
// (not padding) new positions, so rows with different prompt lengths decode together.

#include <cstdint>
#include <memory>
#include <string>
#include <utility>

#include "autograd/random.h"
#include "autograd/tensor.h"
#include "nn/attention.h"
#include "nn/layers.h"
#include "nn/module.h"

namespace attograd::nn {

/// Root-mean-square layer norm over the last dimension (Zhang & Sennrich 2019; torch.nn.RMSNorm of PyTorch 2.4,
/// DeepSeek's RMSNorm): y = x / sqrt(mean(x^2) + eps) * weight. Parameter "weight" (dim), ones.
class RMSNorm : public Module {
 public:
  /// Normalises the last dimension of size dim (> 0); eps > 0.
  explicit RMSNorm(int64_t dim, double eps = 1e-6, Dtype dtype = kFloat32);
  /// "RMSNorm".
  std::string type_name() const override { return "RMSNorm"; }
  /// x (..., dim) -> x's shape.
  Tensor forward(const Tensor& x) override;

  Tensor weight;  ///< (dim), ones
  double eps;     ///< added to the mean square

 protected:
  /// "dim=64, eps=1e-06".
  std::string extra_repr() const override;
};

/// Constructor options of MultiHeadLatentAttention (DeepSeek-V3's ModelArgs names).
struct MlaOptions {
  int64_t d_model = 0;           ///< D, input and output features
  int64_t n_heads = 0;           ///< H
  int64_t qk_nope_head_dim = 0;  ///< d_nope, per-head query/key features without position (from the latent)
  int64_t qk_rope_head_dim = 0;  ///< d_rope, per-head RoPE query features and the shared RoPE key (even, > 0)
  int64_t v_head_dim = 0;        ///< d_v, per-head value features
  int64_t kv_lora_rank = 0;      ///< d_c, the joint key/value latent (what the cache holds, with k_R)
  int64_t q_lora_rank = 0;       ///< d_c', the query latent; 0 = no query compression (one wq)
  double rope_base = 10000.0;    ///< RoPE theta base
  double norm_eps = 1e-6;        ///< eps of kv_norm and q_norm
  double dropout = 0.0;          ///< dropout on the attention probabilities in training mode, in [0, 1)
  Dtype dtype = kFloat32;        ///< parameter dtype (initialised in float32, then converted)
};

/// The key/value cache of one MLA layer: per row and position only the latent and the RoPE key.
struct MlaCache {
  Tensor latent;  ///< (B, C, kv_lora_rank + d_rope): [c_KV | k_R] of every cached position
};

/// MultiHeadLatentAttention's decoding state as an AttentionCache.
struct MlaLayerCache : AttentionCache {
  MlaCache cache;  ///< the latents
  /// C.
  int64_t capacity() const override { return cache.latent.size(1); }
  /// The latents' bytes.
  int64_t bytes() const override;
};

/// Multi-head latent attention (see the file comment).
/// As an AttentionLayer (nn/attention_layer.h) it is the kind "mla": causal self-attention with its own RoPE, decoding
/// from an MlaLayerCache through the absorbed (absorbed_decode, the default) or the plain path.
class MultiHeadLatentAttention : public AttentionLayer {
 public:
  /// Creates the parameters, drawing their initial values from `gen`. Errors name the bad option.
  explicit MultiHeadLatentAttention(const MlaOptions& options, Generator& gen = default_generator());
  /// "MultiHeadLatentAttention".
  std::string type_name() const override { return "MultiHeadLatentAttention"; }
  /// Causal self-attention of x (B, L, D) at positions 0 .. L-1 -> (B, L, D), through the fused
  /// multi_head_attention op (differentiable).
  Tensor forward(const Tensor& x) override;
  /// Same, with keys blocked where key_padding_mask (B, L) Bool is TRUE (undefined: none); a query whose every
  /// visible key is blocked gives wo(0) = 0.
  Tensor forward(const Tensor& x, const Tensor& key_padding_mask);
  /// forward(x, key_padding_mask) and each head's attention row entropies -sum_j p_ij log p_ij (B, H, L) before
  /// dropout (the fused op's need_entropy; both with history).
  std::pair<Tensor, Tensor> forward_with_entropy(const Tensor& x, const Tensor& key_padding_mask = Tensor());
  /// Causal self-attention through the AttentionLayer interface (Error for is_causal false or a RoPE offset; no
  /// weights).
  AttentionOutput forward(const Tensor& x, const AttentionCall& call) override;
  /// The weights forward gives: the plain path's probabilities (see weights_note's text).
  std::string weights_note() const override;
  /// wo.weight (DeepSeek's output projection, GPT-2's c_proj for the gpt2 init).
  Tensor output_projection() const override;
  /// An MlaLayerCache (make_latent_cache(B, C)).
  std::shared_ptr<AttentionCache> make_cache(int64_t B, int64_t C) const override;
  /// decode(x, cache, rows, absorbed_decode) on an MlaLayerCache.
  Tensor forward_cached(const Tensor& x, AttentionCache& cache, const CachedAttentionRows& rows) override;
  /// forward_cached's path: absorbed (true, the default) or plain (false); the same tokens.
  bool absorbed_decode = true;
  /// forward(x, key_padding_mask) and the attention probabilities (B, H, L, L) of the plain path (each head's keys
  /// expanded from the latent; after dropout, without history, as MultiheadAttention's need_weights): for a figure.
  std::pair<Tensor, Tensor> forward_with_weights(const Tensor& x, const Tensor& key_padding_mask = Tensor());
  /// The constructor options.
  const MlaOptions& options() const { return opts_; }

  /// An empty cache for B rows and C positions, in the parameters' dtype.
  MlaCache make_latent_cache(int64_t B, int64_t C) const;
  /// Bytes the cache keeps per row and position: (kv_lora_rank + d_rope) * element size.
  int64_t cache_bytes_per_token() const;
  /// Decoding step (no gradients): x (B, N, D) are the positions start .. start + N - 1 of every row; writes their
  /// [c_KV | k_R] into cache positions [start, start + N) and returns their outputs (B, N, D), each query seeing
  /// cache positions <= its own. absorbed picks the absorbed path, else the plain one (see the file comment).
  Tensor decode(const Tensor& x, MlaCache& cache, int64_t start, bool absorbed = true) const;
  /// Decoding step of a batch of rows (no gradients): x (A, N, D) holds A rows' new positions, right-padded (see
  /// CachedAttentionRows): row a's first rows.count[a] positions are rows.start[a] .. of cache row
  /// rows.cache_row[a]. Writes their [c_KV | k_R] into the cache and returns (A, N, D): each real position's output
  /// over the cache positions <= its own; padding positions give wo(0) = 0 and are not cached.
  Tensor decode(const Tensor& x, MlaCache& cache, const CachedAttentionRows& rows, bool absorbed = true) const;

  std::shared_ptr<Linear> wq;        ///< D -> H d_qk (q_lora_rank == 0), else undefined
  std::shared_ptr<Linear> wq_a;      ///< D -> q_lora_rank (W_DQ), when q_lora_rank > 0
  std::shared_ptr<RMSNorm> q_norm;   ///< on c_Q, when q_lora_rank > 0
  std::shared_ptr<Linear> wq_b;      ///< q_lora_rank -> H d_qk, when q_lora_rank > 0
  std::shared_ptr<Linear> wkv_a;     ///< D -> kv_lora_rank + d_rope ([W_DKV; W_KR])
  std::shared_ptr<RMSNorm> kv_norm;  ///< on c_KV
  std::shared_ptr<Linear> wkv_b;     ///< kv_lora_rank -> H (d_nope + d_v) (per head [W_UK,h; W_UV,h])
  std::shared_ptr<Linear> wo;        ///< H d_v -> D

 protected:
  /// "d_model=256, n_heads=4, qk_nope_head_dim=64, ...".
  std::string extra_repr() const override;
  /// Draws future attention-dropout masks from `gen` (default_generator() until set; set_generator's hook).
  void set_own_generator(Generator& gen) override { dropout_gen_ = &gen; }

 private:
  // {output after wo, weights or undefined, entropy or undefined}
  AttentionResult attend(const Tensor& x, const Tensor& key_padding_mask, bool need_entropy,
                         bool need_weights = false);
  Tensor queries(const Tensor& x) const;  // (B, L, H, d_qk) at positions 0 .. L-1, RoPE applied
  Tensor latents(const Tensor& x) const;  // (B, L, d_c + d_rope) [c_KV | k_R] at positions 0 .. L-1
  MlaOptions opts_;
  Generator* dropout_gen_ = nullptr;
};

}  // namespace attograd::nn
