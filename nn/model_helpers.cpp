// Helpers shared by the whole models (see nn/model_helpers.h).
#include "nn/model_helpers.h"

namespace attograd::nn::detail {

void check_tokens(const Tensor& tokens, int64_t vocab, int64_t max_len, const char* me, const char* what,
                  const char* max_name) {
  ATTO_CHECK(tokens.defined(), me, what, " is undefined");
  ATTO_CHECK(tokens.dtype() == kInt64, me, what, " must be int64 token ids, got ", dtype_name(tokens.dtype()),
             " of shape ", tokens.shape());
  ATTO_CHECK(tokens.dim() == 2, me, "expected ", what, " of shape (B, L), got ", tokens.shape());
  const int64_t L = tokens.size(1);
  ATTO_CHECK(L <= max_len, me, what, " length L=", L, " (shape ", tokens.shape(), ") exceeds ", max_name, "=", max_len);
  const int64_t* t = tokens.data<int64_t>();
  const int64_t n = tokens.numel();
  for (int64_t i = 0; i < n; ++i)
    ATTO_CHECK(t[i] >= 0 && t[i] < vocab, me, "token id ", t[i], " at ", Shape({i / L, i % L}), " of ", what, " ",
               tokens.shape(), " is out of range for vocab size ", vocab);
}

Tensor key_padding_mask(const Tensor& tokens, int64_t pad_idx) {
  Tensor mask = empty(tokens.shape(), {.dtype = kBool});  // (B, L)
  const int64_t* t = tokens.data<int64_t>();
  bool* m = mask.data<bool>();
  for (int64_t i = 0; i < tokens.numel(); ++i) m[i] = t[i] == pad_idx;
  return mask;
}

Tensor row_tensor(const std::vector<int64_t>& tokens) {
  return from_vector(tokens, {1, static_cast<int64_t>(tokens.size())});  // (1, L)
}

}  // namespace attograd::nn::detail
