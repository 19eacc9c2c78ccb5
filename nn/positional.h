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
