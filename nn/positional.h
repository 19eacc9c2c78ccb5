#pragma once
// Sinusoidal position encoding ("Attention Is All You Need", section 3.5):
//   pe[pos, 2i] = sin(pos / 10000^(2i / d_model)),  pe[pos, 2i+1] = cos(pos / 10000^(2i / d_model)),
// computed in double and stored as float32, exactly as the seed's table (odd d_model allowed).

#include <cstdint>
#include <memory>
#include <string>

#include "nn/layers.h"

namespace attograd::nn {

/// The sinusoidal table (max_len, d_model) as float32 (see the file comment).
Tensor sinusoidal_table(int64_t max_len, int64_t d_model);

/// Adds the sinusoidal position table to a batch of embeddings, then applies dropout.
/// Buffer "pe" (1, max_len, d_model) (saved with the weights, never trained); child "dropout".
class PositionalEncoding : public Module {
 public:
  /// Positions 0 .. max_len-1. Dropout masks come from `gen` (must outlive the module; settable with
  /// Module::set_generator). The table is computed in double and rounded to float32, then converted to `dtype`.
  explicit PositionalEncoding(int64_t d_model, int64_t max_len = 5000, double dropout = 0.0,
                              Generator& gen = default_generator(), Dtype dtype = kFloat32);
  /// "PositionalEncoding".
  std::string type_name() const override { return "PositionalEncoding"; }
  /// x (B, L, d_model) -> dropout(x + pe[:, :L]) (B, L, d_model); L > max_len is an error.
  Tensor forward(const Tensor& x) override;

  const int64_t d_model;             ///< embedding size
  const int64_t max_len;             ///< longest sequence supported
  Tensor pe;                         ///< (1, max_len, d_model) buffer
  std::shared_ptr<Dropout> dropout;  ///< "dropout"

 protected:
  /// "d_model=8, max_len=5000".
  std::string extra_repr() const override;
};

}  // namespace attograd::nn

namespace attograd::nn {

/// Rotary position embeddings (autograd/rope.h: interleaved pairs (2i, 2i+1), as RoFormer and Meta's llama) for
/// queries and keys of one head size. The cos/sin tables of positions 0 .. max_len-1 are computed once, in double,
/// and kept in float32 and float64 as plain members, not buffers: nothing is saved with the weights (PyTorch's
/// persistent=False) and a saved model's state_dict keys do not change. No parameters.
class RotaryEmbedding : public Module {
 public:
  /// Tables for head_dim (even) features and positions 0 .. max_len-1, angles p * base^(-2i / head_dim).
  explicit RotaryEmbedding(int64_t head_dim, int64_t max_len = 2048, double base = 10000.0);
  /// "RotaryEmbedding".
  std::string type_name() const override { return "RotaryEmbedding"; }
  /// x (..., L, head_dim) (e.g. (B, H, L, d) queries or keys) rotated at positions 0 .. L-1.
  Tensor forward(const Tensor& x) override { return forward(x, 0); }
  /// x (..., L, head_dim), or head-interleaved (..., L, heads * head_dim), rotated at positions offset ..
  /// offset+L-1 (an incremental decode step at position t passes offset = t); bit for bit the rows offset ..
  /// offset+L-1 of the rotation of a longer sequence. Positions past max_len (a ring decode past the context)
  /// compute their angles on the fly: the same values a longer table would hold.
  Tensor forward(const Tensor& x, int64_t offset);

  const int64_t head_dim;  ///< features rotated (even)
  const int64_t max_len;   ///< positions in the tables (later positions are computed per call)
  const double base;       ///< theta_i = base^(-2i / head_dim)

 protected:
  /// "head_dim=16, max_len=2048, base=10000".
  std::string extra_repr() const override;

 private:
  Tensor cos32_, sin32_, cos64_, sin64_;  // (max_len, head_dim / 2)
};

}  // namespace attograd::nn
