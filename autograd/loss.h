#pragma once
// Fused losses with closed-form backwards: cross_entropy (log-sum-exp with the max shifted out,
// ignore_index, label smoothing) and mse_loss. The backward sits under the forward in loss.cpp.

#include <cstdint>

#include "autograd/tensor.h"

namespace attograd {

/// How a loss reduces its per-element values (PyTorch's reduction="none" / "mean" / "sum").
enum class Reduction { None, Mean, Sum };

/// Options of cross_entropy, named as PyTorch's keyword arguments.
struct CrossEntropyOptions {
  int64_t ignore_index = -100;         ///< targets equal to this contribute neither loss nor count
  double label_smoothing = 0.0;        ///< s in [0, 1]: mixes the one-hot target with the uniform distribution
  Reduction reduction = Reduction::Mean;  ///< None returns per-element losses shaped like target
};

/// torch.nn.functional.cross_entropy with class-index targets. input (N, C) with target (N), or
/// (N, C, d1, ...) with target (N, d1, ...) (classes on dim 1), or (C) with a 0-d target; target is Int64.
/// Per element: loss = (1 - s) * (lse - x_t) + s * (lse - mean_c x_c), lse = log(sum_c exp(x_c)).
/// Mean divides by the number of non-ignored targets; when every target is ignored it returns 0 with a
/// zero gradient (PyTorch 1.13 returns nan). Backward: dx = (softmax(x) - (1 - s) * onehot - s / C) * g / count.
/// Out-of-range targets and label_smoothing outside [0, 1] are errors.
Tensor cross_entropy(const Tensor& input, const Tensor& target, CrossEntropyOptions opts = {});

/// Mean squared error (input - target)^2, reduced; input and target must have the same shape and dtype.
/// Gradients flow to both. A Mean over zero elements is nan, as torch.mean of an empty tensor.
Tensor mse_loss(const Tensor& input, const Tensor& target, Reduction reduction = Reduction::Mean);

}  // namespace attograd
