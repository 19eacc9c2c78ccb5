#pragma once
// The position-wise feed-forward block of a Transformer layer, in two formulations:
//
//  - default (residual_norm = false), PyTorch's TransformerEncoderLayer naming:
//      y = linear2(dropout(activation(linear1(x))))
//    submodules "linear1" (d_model -> d_ff), "dropout", "linear2" (d_ff -> d_model). With activation "swiglu"
//    (LLaMA's gated form, Shazeer 2020) a third Linear "linear3" (d_model -> d_ff) gates it:
//      y = linear2(dropout(silu(linear1(x)) * linear3(x)))
//    (LLaMA's w1, w3 and w2; d_ff is the width of both linear1 and linear3). The residual
//    connection and the LayerNorm belong to the transformer layer that owns this block (pre- or
//    post-LN is that layer's choice), as in PyTorch.
//
//  - residual_norm = true, the seed's (attention-is-all-you-need-pytorch) PositionwiseFeedForward:
//      y = layer_norm(x + dropout(w_2(activation(w_1(x)))))
//    submodules "w_1", "w_2", "layer_norm" (eps 1e-6 by default), "dropout", so that its parameter
//    names (w_1.weight, w_1.bias, w_2.weight, w_2.bias, layer_norm.weight, layer_norm.bias) match the
//    seed's files.
//
// In both, the C++ members are linear1 / linear2 / dropout (and layer_norm, null in the default).

#include <cstdint>
#include <memory>
#include <string>

#include "nn/layers.h"

namespace attograd::nn {

/// Options of PositionwiseFeedForward (read like keyword arguments: {.dropout = 0.0, .activation = "gelu"}).
struct FeedForwardOptions {
  double dropout = 0.1;             ///< drop probability (after the activation, or after w_2 with residual_norm)
  /// "relu", "gelu" (exact, erf), "gelu-tanh" (the tanh approximation, GPT-2's) or "swiglu" (see the file
  /// comment; not with residual_norm)
  std::string activation = "relu";
  bool bias = true;                 ///< biases in the Linear layers
  bool residual_norm = false;       ///< the seed's formulation: + residual, then LayerNorm (see the file comment)
  double layer_norm_eps = 1e-6;     ///< eps of the LayerNorm used with residual_norm (the seed's 1e-6)
  Dtype dtype = kFloat32;           ///< parameter dtype (initialised in float32, then converted: see nn/layers.h)
};

/// Linear(d_model, d_ff) -> activation -> Linear(d_ff, d_model) with dropout; see the file comment.
class PositionwiseFeedForward : public Module {
 public:
  /// Both Linear layers are initialised as PyTorch's (from `gen`: linear1 first). Dropout masks are
  /// drawn from default_generator() until Module::set_generator() is called.
  PositionwiseFeedForward(int64_t d_model, int64_t d_ff, FeedForwardOptions options = {},
                          Generator& gen = default_generator());
  /// "PositionwiseFeedForward".
  std::string type_name() const override { return "PositionwiseFeedForward"; }
  /// x (..., d_model) -> the hidden activation (..., d_ff) before dropout: act(linear1(x)), or
  /// silu(linear1(x)) * linear3(x) for swiglu.
  Tensor activate(const Tensor& x);
  /// x (..., d_model) -> (..., d_model).
  Tensor forward(const Tensor& x) override;

  const int64_t d_model;                  ///< input and output size
  const int64_t d_ff;                     ///< hidden size
  const FeedForwardOptions options;       ///< the options it was built with
  std::shared_ptr<Linear> linear1;        ///< d_model -> d_ff ("linear1", or "w_1" with residual_norm)
  std::shared_ptr<Linear> linear2;        ///< d_ff -> d_model ("linear2", or "w_2" with residual_norm)
  std::shared_ptr<Linear> linear3;        ///< d_model -> d_ff, the gated half of "swiglu" ("linear3"); else null
  std::shared_ptr<Dropout> dropout;       ///< "dropout"
  std::shared_ptr<LayerNorm> layer_norm;  ///< "layer_norm" with residual_norm, else null

 protected:
  /// "activation=relu" (plus ", residual_norm=True" in the seed's formulation).
  std::string extra_repr() const override;
};

}  // namespace attograd::nn
