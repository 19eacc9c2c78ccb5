#pragma once
// Inverted dropout with a replayable mask drawn from a seeded Generator.

#include "autograd/random.h"
#include "autograd/tensor.h"

namespace attograd {

/// The dropout keep mask for `shape`: element i (row-major) is kept when the i-th of numel 32-bit draws
/// gen.next_u32() is >= round(p * 2^32), i.e. with probability 1 - p (no draws when p is 0 or 1). For a float dtype the
/// values are 1 / (1 - p) (kept) or 0 (dropped), so x * mask is the dropout of x; for kBool they are
/// true (kept) or false. The same generator state always gives the same mask: a fused op that draws its
/// mask here with a copy of the generator reproduces dropout()'s mask exactly. p must lie in [0, 1].
Tensor dropout_mask(const Shape& shape, double p, Generator& gen, Dtype dtype);

/// Inverted dropout: in training, zeros each element with probability p and scales the kept ones by
/// 1 / (1 - p), using dropout_mask(x.shape(), p, gen, kBool). Returns x itself when !training or p == 0
/// (no draws), zeros (with zero gradient, no draws) when p == 1. p outside [0, 1] is an error. The mask is not
/// kept: the backward draws it again from a copy of the generator state the forward started from.
Tensor dropout(const Tensor& x, double p, bool training = true, Generator& gen = default_generator());

/// dropout(relu(x), p, training, gen) as one op: the same values and the same mask draws as the two ops, in one
/// pass, saving only its output (the gradient is g / (1 - p) where the output is positive, 0 elsewhere) and no
/// mask. relu(x) when !training or p == 0; zeros when p == 1.
Tensor relu_dropout(const Tensor& x, double p, bool training = true, Generator& gen = default_generator());
/// The same, writing the result over x's storage when x is a temporary nothing else can see (the FFN's hidden layer).
Tensor relu_dropout(Tensor&& x, double p, bool training = true, Generator& gen = default_generator());

/// x + dropout(y, p, training, gen) as one op (a residual connection): the same mask draws and gradients, one pass,
/// no intermediate tensor; the values may differ from the two ops' by the last bit, x + y / (1 - p) being rounded
/// once where the compiler fuses the multiply-add. x and y have the same shape and dtype.
Tensor dropout_add(const Tensor& x, const Tensor& y, double p, bool training = true,
                   Generator& gen = default_generator());
/// The same, writing the result over y's storage when y is a temporary nothing else can see (a residual branch).
Tensor dropout_add(const Tensor& x, Tensor&& y, double p, bool training = true, Generator& gen = default_generator());

}  // namespace attograd
