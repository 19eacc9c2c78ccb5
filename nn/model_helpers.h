#pragma once
// Internal (not installed): helpers that the whole models (nn/models.cpp, nn/encoder_tagger.cpp,
// nn/seed/transformer.cpp) share.

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "autograd/random.h"
#include "autograd/tensor.h"
#include "nn/attention.h"
#include "nn/attention_layer.h"
#include "nn/module.h"
#include "nn/sequence_model.h"

namespace attograd::nn::detail {

/// Error unless tokens is (B, L) Int64 with L <= max_len and every id in [0, vocab); messages name the model `me`,
/// the tensor `what`, its shape and the offending value (max_name names the length limit).
void check_tokens(const Tensor& tokens, int64_t vocab, int64_t max_len, const char* me, const char* what,
                  const char* max_name);

/// tokens (B, L) Int64 -> (B, L) Bool, true where tokens == pad_idx: a key padding mask for the attention layers.
Tensor key_padding_mask(const Tensor& tokens, int64_t pad_idx);

/// One row of tokens as a (1, L) Int64 tensor.
Tensor row_tensor(const std::vector<int64_t>& tokens);

/// The norm an architecture asks for over the last d features: LayerNorm(d, eps, bias = architecture.bias) or
/// RMSNorm(d, eps), eps = architecture.eps_or(default_eps).
std::shared_ptr<Module> make_norm(const ArchitectureSpec& architecture, int64_t d, double default_eps);

/// GPT-2's initialisation (nanoGPT's _init_weights and its c_proj rule) over model.named_parameters(), drawn in that
/// order from `gen`: a tensor in `residual` ~ N(0, 0.02 / sqrt(2 layers)); every other parameter of two or more
/// dimensions (Linear and Embedding weights, fused projections) ~ N(0, 0.02); a parameter whose name ends in "bias"
/// zero; the rest (norm weights, other 1-D parameters) unchanged.
void gpt2_init(Module& model, const std::vector<Tensor>& residual, int64_t layers, Generator& gen);

/// The architecture options that differ from the defaults, as " (positions=learned, norm=rmsnorm)"; empty when
/// none (for extra_repr).
std::string architecture_words(const ArchitectureSpec& architecture);

/// Error naming the model kind and the first architecture option that differs from the default, for a kind that
/// keeps its own fixed recipe (`keeps` says which, e.g. "the paper's recipe").
void refuse_architecture(const ArchitectureSpec& architecture, const char* kind, const char* keeps);

/// The MultiheadAttention options of `spec` for a model whose self-attention must be a plain MultiheadAttention kind
/// (one without score or mask functions: the encoder-only model, which calls it bidirectionally, and the seq2seq
/// model, which maps its options onto the seed's sublayers). Error naming the model `me` (kind `model`) and the
/// attention kind otherwise, listing the registered kinds it takes; `mods` says why a score/mask-function kind is not
/// taken.
MultiheadAttentionOptions plain_multihead_attention(const AttentionSpec& spec, const AttentionConfig& config,
                                                    const char* me, const char* model, const char* mods);

/// "True" or "False", as Python's repr prints a bool.
inline const char* py_bool(bool b) { return b ? "True" : "False"; }

/// Puts a model in eval mode with its attention stored for the scope; restores its training flag and stops storing
/// attention afterwards.
template <class M>
class AttentionScope {
 public:
  /// Switches `m` to eval mode and turns on store_attention.
  explicit AttentionScope(M& m) : m_(m), was_training_(m.is_training()) {
    m_.eval();
    m_.store_attention(true);
  }
  /// Turns store_attention off and restores the training flag.
  ~AttentionScope() {
    m_.store_attention(false);
    m_.train(was_training_);
  }
  AttentionScope(const AttentionScope&) = delete;
  AttentionScope& operator=(const AttentionScope&) = delete;

 private:
  M& m_;
  bool was_training_;
};

}  // namespace attograd::nn::detail
