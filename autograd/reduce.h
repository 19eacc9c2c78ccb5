#pragma once
// Reductions: sum, mean, max and argmax, over all elements or over chosen dimensions.

#include <vector>

#include "autograd/tensor.h"

namespace attograd {

/// Sum of all elements, as a 0-d tensor.
Tensor sum(const Tensor& x);
/// Sum over `dims` (negative dims count from the end; an empty list reduces every dim, as PyTorch 1.13);
/// keepdim leaves the reduced dims with size 1.
Tensor sum(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim = false);
/// Mean of all elements, as a 0-d tensor (nan for an empty tensor).
Tensor mean(const Tensor& x);
/// Mean over `dims` (like sum); a mean over a zero-size dimension is nan, as in PyTorch.
Tensor mean(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim = false);

/// Result of max over a dimension.
struct MaxResult {
  Tensor values;   ///< the maxima (differentiable)
  Tensor indices;  ///< Int64 position of the first maximum along the dimension
};

/// Maximum along `dim` and its first index; the gradient flows to that index only.
MaxResult max(const Tensor& x, int64_t dim, bool keepdim = false);
/// Maximum of all elements, as a 0-d tensor; the gradient flows to the first maximum.
Tensor max(const Tensor& x);
/// Int64 index of the first maximum along `dim`.
Tensor argmax(const Tensor& x, int64_t dim, bool keepdim = false);
/// Int64 flat (row-major) index of the first maximum of all elements, as a 0-d tensor.
Tensor argmax(const Tensor& x);

}  // namespace attograd
