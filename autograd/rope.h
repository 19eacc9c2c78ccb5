#pragma once
// Rotary position embeddings (RoPE; Su et al., RoFormer, arXiv 2104.09864), with the INTERLEAVED pairing of the
// paper and of Meta's llama (apply_rotary_emb): features (2i, 2i+1) of a row at position p are rotated by the
// angle p * theta_i, theta_i = base^(-2i / d), i = 0 .. d/2 - 1:
//   out[2i]     = x[2i] cos(p theta_i) - x[2i+1] sin(p theta_i)
//   out[2i + 1] = x[2i] sin(p theta_i) + x[2i+1] cos(p theta_i)
// (GPT-NeoX and Hugging Face pair i with i + d/2 instead: a permutation of the features, not the same function.)
// The backward is the rotation by -p theta_i of the gradient. Angles, cos and sin are computed in double, then
// rounded to the tensor's dtype, so a slice of positions [t, t + n) rotates bit for bit as in the full sequence.

#include <cstdint>

#include "autograd/tensor.h"

namespace attograd {

/// The cos and sin tables of positions offset .. offset + len - 1: each (len, dim / 2) in `dtype`, entry (l, i) of
/// the angle (offset + l) * base^(-2i / dim). dim must be even and > 0, len >= 0, offset >= 0, base > 0.
std::pair<Tensor, Tensor> rotary_cos_sin(int64_t len, int64_t dim, int64_t offset = 0, double base = 10000.0,
                                         Dtype dtype = kFloat32);

/// RoPE with precomputed tables: x (..., L, d) (e.g. (B, H, L, d)) or head-interleaved (..., L, n * d) (e.g.
/// (B, L, H * d) as projections give, every group of d features rotated alike), cos and sin (L, d / 2) of x's dtype
/// (from rotary_cos_sin; constants, they must not require grad) -> x's shape, pairs (2i, 2i+1) rotated.
Tensor apply_rotary_emb(const Tensor& x, const Tensor& cos, const Tensor& sin);

/// RoPE of x at positions offset .. offset + L - 1 (a decode step at position t passes offset = t): x (..., L, d)
/// with head_dim 0 (d = the last dim), or (..., L, n * head_dim) head-interleaved.
Tensor apply_rotary_emb(const Tensor& x, int64_t offset = 0, double base = 10000.0, int64_t head_dim = 0);

}  // namespace attograd
