#pragma once
// Shape ops: reshape and views, transpose/permute, slicing, concatenation and splitting.
// Tensors are always contiguous: reshape/view/flatten/unsqueeze/squeeze share the input's storage
// (writing through one is visible through the other); every other op here copies.

#include <vector>

#include "autograd/tensor.h"

namespace attograd {

/// Same data with a new shape (shares storage); one entry may be -1 and is inferred.
Tensor reshape(const Tensor& x, const Shape& shape);
/// Same as reshape (every tensor is contiguous, so a view always exists).
Tensor view(const Tensor& x, const Shape& shape);
/// Merges dims start_dim..end_dim into one (shares storage); a 0-d tensor becomes shape [1].
Tensor flatten(const Tensor& x, int64_t start_dim = 0, int64_t end_dim = -1);
/// Inserts a dimension of size 1 at `dim` (in [-dim()-1, dim()]); shares storage.
Tensor unsqueeze(const Tensor& x, int64_t dim);
/// Removes `dim` if its size is 1, otherwise returns the same shape (as PyTorch); shares storage.
Tensor squeeze(const Tensor& x, int64_t dim);
/// Removes every dimension of size 1; shares storage.
Tensor squeeze(const Tensor& x);

/// Swaps two dimensions (copies; blocked fast path for the last two dims).
Tensor transpose(const Tensor& x, int64_t dim0, int64_t dim1);
/// Reorders the dimensions: output dim i is input dim dims[i] (copies).
Tensor permute(const Tensor& x, const std::vector<int64_t>& dims);

/// x[..., start:end:step, ...] along `dim` with PyTorch's clamping of start and end; step > 0 (copies).
Tensor slice(const Tensor& x, int64_t dim, int64_t start, int64_t end, int64_t step = 1);
/// x[..., start:start+length, ...] along `dim`; the range must lie inside the dimension (copies).
Tensor narrow(const Tensor& x, int64_t dim, int64_t start, int64_t length);
/// x[..., index, ...] along `dim`, removing that dimension (copies).
Tensor select(const Tensor& x, int64_t dim, int64_t index);

/// Concatenates along `dim`; all other sizes and the dtype must match (zero-size pieces allowed).
Tensor cat(const std::vector<Tensor>& tensors, int64_t dim = 0);
/// Stacks equal-shaped tensors along a new dimension `dim` (in [-dim()-1, dim()]).
Tensor stack(const std::vector<Tensor>& tensors, int64_t dim = 0);

/// Splits into pieces of `split_size` along `dim` (the last may be smaller).
std::vector<Tensor> split(const Tensor& x, int64_t split_size, int64_t dim = 0);
/// Splits into pieces of the given sizes along `dim`; the sizes must sum to x.size(dim).
std::vector<Tensor> split(const Tensor& x, const std::vector<int64_t>& sizes, int64_t dim);
/// Splits into at most `chunks` pieces of ceil(size / chunks) along `dim` (PyTorch semantics).
std::vector<Tensor> chunk(const Tensor& x, int64_t chunks, int64_t dim = 0);

}  // namespace attograd
