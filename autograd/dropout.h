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
/// (no draws), zeros (with zero gradient, no draws) when p == 1. p outside [0, 1] is an error.
Tensor dropout(const Tensor& x, double p, bool training = true, Generator& gen = default_generator());

}  // namespace attograd
