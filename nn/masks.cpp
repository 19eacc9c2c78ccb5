#include "nn/masks.h"

namespace attograd::nn {

Tensor padding_mask(const Tensor& tokens, int64_t pad_idx) {
  ATTO_CHECK(tokens.defined(), "padding_mask", "called with an undefined tensor");
  ATTO_CHECK(tokens.dtype() == kInt64 && tokens.dim() == 2, "padding_mask",
             "expected int64 tokens of shape (B, L), got ", dtype_name(tokens.dtype()), " of shape ", tokens.shape());
  const int64_t B = tokens.size(0), L = tokens.size(1);
  Tensor mask = empty({B, 1, 1, L}, {.dtype = kBool});
  const int64_t* t = tokens.data<int64_t>();
  bool* m = mask.data<bool>();
  for (int64_t i = 0; i < B * L; ++i) m[i] = t[i] == pad_idx;
  return mask;
}

Tensor causal_mask(int64_t L) {
  ATTO_CHECK(L >= 0, "causal_mask", "length must be non-negative, got ", L);
  Tensor mask = empty({L, L}, {.dtype = kBool});
  bool* m = mask.data<bool>();
  for (int64_t i = 0; i < L; ++i)
    for (int64_t j = 0; j < L; ++j) m[i * L + j] = j > i;
  return mask;
}

Tensor subsequent_mask(int64_t L) { return causal_mask(L); }

}  // namespace attograd::nn
