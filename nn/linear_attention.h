#pragma once
// LinearAttention: multi-head linear attention (Katharopoulos et al. 2020, autograd/linear_attention.h) with
// MultiheadAttention's projections, names and initialisation, so that it is a drop-in replacement for self-attention
// (the same state_dict keys and shapes): in_proj_weight (3E, E) = [W_q; W_k; W_v], in_proj_bias (3E),
// out_proj.weight (E, E), out_proj.bias (E).
// Init (as torch.nn.MultiheadAttention's _reset_parameters): xavier_uniform_ (gain 1) on in_proj_weight as one
// (3E, E) matrix (fan_in E, fan_out 3E), zeros on in_proj_bias and out_proj.bias, out_proj.weight as Linear's default
// (kaiming_uniform_(a = sqrt(5)), drawn first, as PyTorch builds out_proj before resetting).
//   out = out_proj(concat_h linear_attention(q_h, k_h, v_h, causal)),  q_h, k_h, v_h (B, H, L, E/H)
// No softmax, so no 1/sqrt(d) scale, no attention weights and no attention dropout; masks: only causal.
//
// Incremental causal decoding (eval, no gradients): the causal form is a recurrence, so the state of a row is the
// running sums S = sum_j phi(k_j) v_j^T (H, d, d) and z = sum_j phi(k_j) (H, d) over the positions seen so far;
// a new position adds its key and value to them and reads out_i = phi(q_i)^T S / (phi(q_i)^T z + eps), the causal
// forward's exact formula in its order of operations. A token costs O(H d^2) whatever its position, and the state
// is H d (d + 1) numbers per row, not per position.

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

/// Constructor options of LinearAttention: LinearAttention({.embed_dim = 64, .num_heads = 4, .causal = true}, gen).
struct LinearAttentionOptions {
  int64_t embed_dim = 0;   ///< E
  int64_t num_heads = 0;   ///< H; must divide E
  bool bias = true;        ///< in_proj_bias and out_proj.bias
  bool causal = false;     ///< forward(x)'s mask: query i sees keys j <= i
  double eps = 1e-6;       ///< added to every denominator
  Dtype dtype = kFloat32;  ///< parameter dtype (initialised in float32, then converted)
};

/// LinearAttention's decoding state: the running sums of make_state (no position axis).
struct LinearAttentionState : AttentionCache {
  Tensor state;            ///< (B, H, d_k, d_v), S = sum_j phi(k_j) v_j^T over the cached positions
  Tensor normalizer;       ///< (B, H, d_k), z = sum_j phi(k_j)
  int64_t positions = 0;   ///< the positions the decode planned for (capacity())
  /// The planned positions (the sums themselves hold any number).
  int64_t capacity() const override { return positions; }
  /// The bytes of state and normalizer.
  int64_t bytes() const override;
};

/// Multi-head linear attention (see the file comment).
/// As an AttentionLayer (nn/attention_layer.h) it is the kind "linear": causal self-attention without key padding
/// masks or entropies, decoding from a LinearAttentionState (the running sums).
class LinearAttention : public AttentionLayer {
 public:
  /// Creates the parameters, drawing their initial values from `gen`.
  explicit LinearAttention(const LinearAttentionOptions& options, Generator& gen = default_generator());
  /// "LinearAttention".
  std::string type_name() const override { return "LinearAttention"; }
  /// Self-attention: x (B, L, E) -> (B, L, E), causal when options.causal.
  Tensor forward(const Tensor& x) override { return forward(x, x, x, opts_.causal); }
  /// query (B, Lq, E), key and value (B, Lk, E) -> (B, Lq, E); causal needs Lq == Lk.
  Tensor forward(const Tensor& query, const Tensor& key, const Tensor& value, bool is_causal);
  /// Self-attention through the AttentionLayer interface (Error for a key padding mask, weights or entropies).
  AttentionOutput forward(const Tensor& x, const AttentionCall& call) override;
  /// The weights forward gives: attention_weights' explicit path (see weights_note's text).
  std::string weights_note() const override;
  /// A LinearAttentionState for B rows (make_state); C is only what capacity() reports.
  std::shared_ptr<AttentionCache> make_cache(int64_t B, int64_t C) const override;
  /// decode() on a LinearAttentionState.
  Tensor forward_cached(const Tensor& x, AttentionCache& cache, const CachedAttentionRows& rows) override;
  /// The weights this layer's causal self-attention applies to the values of x (B, L, E), by an explicit path (the
  /// layer itself never forms them): (B, H, L, L) with w_ij = phi(q_i).phi(k_j) / (sum_{j' <= i} phi(q_i).phi(k_j')
  /// + eps) for j <= i, else 0, so that each head's output before out_proj is exactly sum_j w_ij v_j. Without
  /// history, in the parameters' dtype; for a figure.
  Tensor attention_weights(const Tensor& x) const;
  /// The constructor options.
  const LinearAttentionOptions& options() const { return opts_; }

  /// An empty decoding state for B rows: {S (B, H, d, d), z (B, H, d)}, zeros in the parameters' dtype.
  std::pair<Tensor, Tensor> make_state(int64_t B) const;
  /// Bytes of one row's decoding state: H d (d + 1) * element size, whatever the number of positions.
  int64_t state_bytes_per_row() const;
  /// Causal decoding step (no gradients): x (A, N, E) holds A rows' new positions, right-padded (see
  /// CachedAttentionRows in nn/attention.h: row a's first rows.count[a] positions are real and continue the sums of
  /// state row rows.cache_row[a]; rows.start is not needed, the sums carry the past). Adds each real position's
  /// phi(k) v^T and phi(k) to state (B, H, d, d) and normalizer (B, H, d) in place and returns (A, N, E): each real
  /// position's output as the causal forward gives it; padding positions give out_proj.bias and change no sum.
  Tensor decode(const Tensor& x, Tensor& state, Tensor& normalizer, const CachedAttentionRows& rows) const;

  Tensor in_proj_weight;             ///< (3E, E) rows [W_q; W_k; W_v]
  Tensor in_proj_bias;               ///< (3E), undefined when !bias
  std::shared_ptr<Linear> out_proj;  ///< E -> E

 protected:
  /// "embed_dim=64, num_heads=4, causal=false".
  std::string extra_repr() const override;

 private:
  LinearAttentionOptions opts_;
};

}  // namespace attograd::nn
