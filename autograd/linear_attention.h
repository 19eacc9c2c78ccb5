#pragma once
// Linear attention (Katharopoulos et al., "Transformers are RNNs", ICML 2020) with the feature map
// phi(x) = elu(x) + 1 (x + 1 for x > 0, exp(x) otherwise; positive, so every denominator is > 0):
//   non-causal: out_i = phi(q_i)^T S / (phi(q_i)^T z + eps),   S = sum_j phi(k_j) v_j^T,  z = sum_j phi(k_j)
//   causal:     out_i = phi(q_i)^T S_i / (phi(q_i)^T z_i + eps), S_i, z_i the same sums over j <= i
// eps = 1e-6 by default (fast-transformers' LinearAttention), added to the denominator. Time O(L d_k d_v) per head,
// no L x L matrix; the backward is hand-written: it keeps only q, k, v (and S, z in the non-causal case), and the
// causal backward rebuilds S_i, z_i in a forward sweep and runs the gradient sums over i >= j in a reverse sweep.

#include "autograd/tensor.h"

namespace attograd {

/// Linear attention (see the file comment): q (..., Lq, d_k), k (..., Lk, d_k), v (..., Lk, d_v) with the same
/// leading dims and dtype -> (..., Lq, d_v). causal needs Lq == Lk (query i sees keys j <= i). eps > 0.
Tensor linear_attention(const Tensor& q, const Tensor& k, const Tensor& v, bool causal = false, double eps = 1e-6);

}  // namespace attograd
