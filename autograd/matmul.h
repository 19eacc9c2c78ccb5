#pragma once
// Matrix products: torch.matmul (with batch broadcasting) and the fused linear layer x W^T + b.

#include "autograd/tensor.h"

namespace attograd {

/// torch.matmul. 1-D x 1-D: dot product (0-d result). 2-D x 2-D: matrix product (m, k) x (k, n) -> (m, n).
/// A 1-D first operand is treated as (1, k) and a 1-D second operand as (k, 1); the added dimension is
/// removed from the result. N-D operands multiply their last two dimensions and broadcast the rest:
/// (2, 1, m, k) x (5, k, n) -> (2, 5, m, n). When the second operand has no batch (e.g. (B, L, k) x (k, n)),
/// all leading dimensions are folded into one GEMM. Gradients of broadcast batch dims are summed back.
Tensor matmul(const Tensor& a, const Tensor& b);

/// Fused linear layer: x (..., in), weight (out, in), bias (out) or undefined -> (..., out) = x W^T + b,
/// computed as one GEMM over all leading dimensions of x (so is its backward).
Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias = Tensor());

}  // namespace attograd
