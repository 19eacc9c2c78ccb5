// Helpers shared by the whole models (see nn/model_helpers.h).
#include "nn/model_helpers.h"

#include <algorithm>
#include <cmath>

#include "autograd/autograd.h"
#include "nn/init.h"
#include "nn/layers.h"
#include "nn/mla.h"

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

std::shared_ptr<Module> make_norm(const ArchitectureSpec& a, int64_t d, double default_eps) {
  const double eps = a.eps_or(default_eps);
  if (a.norm == "rmsnorm") return std::make_shared<RMSNorm>(d, eps);
  return std::make_shared<LayerNorm>(d, LayerNormOptions{.eps = eps, .bias = a.bias});
}

void gpt2_init(Module& model, const std::vector<Tensor>& residual, int64_t layers, Generator& gen) {
  NoGradGuard no_grad;
  const double std_residual = 0.02 / std::sqrt(2.0 * static_cast<double>(std::max<int64_t>(layers, 1)));
  for (auto& named : model.named_parameters()) {
    const std::string& name = named.first;
    Tensor& p = named.second;
    const bool is_residual = std::any_of(residual.begin(), residual.end(), [&](const Tensor& r) { return r.is_same(p); });
    if (is_residual)
      init::normal_(p, 0.0, std_residual, gen);
    else if (p.dim() >= 2)
      init::normal_(p, 0.0, 0.02, gen);
    else if (name.size() >= 4 && name.compare(name.size() - 4, 4, "bias") == 0)
      init::zeros_(p);
  }
}

MultiheadAttentionOptions plain_multihead_attention(const AttentionSpec& spec, const AttentionConfig& config,
                                                    const char* me, const char* model, const char* mods) {
  // The kinds it takes: those the registry says are a MultiheadAttention, without score or mask functions.
  auto plain = [&](const AttentionSpec& s, MultiheadAttentionOptions* out) {
    return attention_as_multihead(s, config, out) && !out->mask_mod && !out->score_mod;
  };
  MultiheadAttentionOptions mo;
  if (plain(spec, &mo)) return mo;
  const bool multihead = attention_as_multihead(spec, config, &mo);
  ATTO_CHECK(!multihead, me, "model kind \"", model, "\" does not support attention ", spec.kind,
             " (a score_mod / mask_mod kind: ", mods, "; use the lm model)");
  std::string supported;
  for (const auto& [kind, description] : registered_attentions()) {
    MultiheadAttentionOptions o;
    if (plain({.kind = kind}, &o)) supported += (supported.empty() ? "" : ", ") + kind;
  }
  ATTO_CHECK(false, me, "model kind \"", model, "\" does not support attention ", spec.kind, " (supported: ", supported,
             "; use the lm model)");
  return mo;
}

void refuse_architecture(const ArchitectureSpec& a, const char* kind, const char* keeps) {
  const std::vector<std::string> d = a.differences();
  ATTO_CHECK(d.empty(), "ModelSpec", "model kind \"", kind, "\" keeps ", keeps, " and does not take the architecture option ",
             d.empty() ? "" : d.front(), " (the lm model takes every option)");
}

std::string architecture_words(const ArchitectureSpec& a) {
  std::string s;
  for (const std::string& d : a.differences()) s += (s.empty() ? "" : ", ") + d;
  return s;
}

}  // namespace attograd::nn::detail
