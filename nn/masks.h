#pragma once
// Attention masks. Convention (public, everywhere in attograd): a Bool mask entry TRUE means BLOCKED
// ("do not attend"), as in PyTorch's nn.MultiheadAttention attn_mask / key_padding_mask. Note that
// the seed's get_pad_mask / get_subsequent_mask use the opposite polarity (true = may attend), and so
// does F.scaled_dot_product_attention. Masks combine with logical_or and broadcast to (B, H, Lq, Lk).

#include <cstdint>

#include "autograd/tensor.h"

namespace attograd::nn {

/// tokens (B, L) Int64 -> Bool (B, 1, 1, L), true where tokens == pad_idx (padding keys are blocked).
Tensor padding_mask(const Tensor& tokens, int64_t pad_idx);

/// Bool (L, L), true above the diagonal (key j > query i is blocked): a decoder's causal mask.
Tensor causal_mask(int64_t L);

/// The seed's name for causal_mask (get_subsequent_mask). Same polarity as causal_mask (true =
/// blocked), i.e. the logical NOT of the seed's own mask, and shape (L, L) instead of its (1, L, L).
Tensor subsequent_mask(int64_t L);

}  // namespace attograd::nn
