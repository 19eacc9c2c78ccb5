#pragma once
// Selection by mask (where, masked_fill), comparisons and logic on Bool tensors, and embedding
// lookup. Comparisons and logic produce Bool tensors and are never recorded.

#include <cstdint>

#include "autograd/tensor.h"

namespace attograd {

/// cond ? a : b elementwise, numpy broadcasting of all three; cond is Bool, a and b share a dtype.
/// Gradients: to a where cond holds, to b elsewhere, each summed back to its input's shape.
Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b);
/// cond ? a : b with a constant b; the result has the broadcast shape of cond and a.
Tensor where(const Tensor& cond, const Tensor& a, double b);
/// x with `value` (may be -inf) where `mask` (Bool, broadcastable to x's shape) is true; gradient 0 there.
Tensor masked_fill(const Tensor& x, const Tensor& mask, double value);

/// a == s elementwise (Bool).
Tensor eq(const Tensor& a, double s);
/// a != s elementwise (Bool).
Tensor ne(const Tensor& a, double s);
/// a < s elementwise (Bool).
Tensor lt(const Tensor& a, double s);
/// a <= s elementwise (Bool).
Tensor le(const Tensor& a, double s);
/// a > s elementwise (Bool).
Tensor gt(const Tensor& a, double s);
/// a >= s elementwise (Bool).
Tensor ge(const Tensor& a, double s);
/// a == b with broadcasting (same dtype; Bool result).
Tensor eq(const Tensor& a, const Tensor& b);
/// a != b with broadcasting (same dtype; Bool result).
Tensor ne(const Tensor& a, const Tensor& b);
/// a < b with broadcasting (same dtype; Bool result).
Tensor lt(const Tensor& a, const Tensor& b);
/// a <= b with broadcasting (same dtype; Bool result).
Tensor le(const Tensor& a, const Tensor& b);
/// a > b with broadcasting (same dtype; Bool result).
Tensor gt(const Tensor& a, const Tensor& b);
/// a >= b with broadcasting (same dtype; Bool result).
Tensor ge(const Tensor& a, const Tensor& b);

/// !x for a Bool tensor.
Tensor logical_not(const Tensor& x);
/// a && b for Bool tensors, with broadcasting.
Tensor logical_and(const Tensor& a, const Tensor& b);
/// a || b for Bool tensors, with broadcasting.
Tensor logical_or(const Tensor& a, const Tensor& b);

/// Rows of `weight` (num, dim) picked by Int64 `indices` (any shape) -> indices.shape + [dim].
/// The gradient scatter-adds into weight's rows (repeats accumulate); rows equal to padding_idx
/// get none (padding_idx < 0: no padding row).
Tensor embedding(const Tensor& weight, const Tensor& indices, int64_t padding_idx = -1);

}  // namespace attograd
