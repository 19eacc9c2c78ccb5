#pragma once
// EncoderTagger: an encoder-only (BERT-style) model with a per-position head, for tasks whose output aligns with
// the input (tagging: one output token per input token). Kind "encoder".
//
//   tokens = src SEP                                   (SEP ends the source; the model emits EOS there)
//   x      = dropout(embed(tokens) * sqrt(d_model) + pe[:L])
//   x      = layers(x)    (PyTorch's TransformerEncoderLayer, pre-LN (norm_first), bidirectional: every position
//                          sees every other one; padding keys blocked)
//   logits = head(norm(x))                             (B, L, vocab), position i predicts target token i
// That is the default recipe; options.architecture changes it as for the decoder-only model (learned or no positions,
// GELU / GELU-tanh / SwiGLU, RMSNorm and eps, no biases, no embedding scale, GPT-2's init, a tied head; not RoPE).
// The target of src is tgt EOS, so |tgt| must equal |src| (make_batch names an example that breaks this).
// Decoding is one forward: begin_decode runs the encoder once and decode_step reads position |decoded| of each row.

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "nn/layers.h"
#include "nn/positional.h"
#include "nn/sequence_model.h"
#include "nn/transformer.h"

namespace attograd::nn {

/// Options of EncoderTagger (plain fields): EncoderTagger({.vocab = 15, .d_model = 64}, gen). The defaults are
/// attograd's training defaults (`attograd train --model encoder`), not BERT's sizes.
struct EncoderTaggerOptions {
  int64_t vocab = 0;      ///< vocabulary size (input and output tokens share it)
  int64_t d_model = 64;   ///< model width D
  int64_t n_head = 4;     ///< attention heads; must divide d_model
  int64_t d_ff = 256;     ///< feed-forward hidden size
  int64_t n_layers = 2;   ///< encoder layers
  double dropout = 0.0;   ///< every dropout (embedding, attention probabilities, residual branches, FFN hidden)
  int64_t max_len = 512;  ///< longest input, SEP included (rows of the position table)
  int64_t pad_idx = 0;    ///< padding token (a blocked key); < 0: none
  int64_t sep_idx = 3;    ///< the token appended to every source
  Dtype dtype = kFloat32; ///< parameter and buffer dtype (drawn as float32, then converted, as to() does)
  /// The attention variant (docs/ATTENTION.md), every layer's TransformerEncoderLayerOptions::attention (its
  /// self_attn is the AttentionLayer make_attention builds, called non-causally: a window sees keys |i - j| <=
  /// window): mha, gqa, local, block-sparse, a user's MultiheadAttention kind; checkpoint (every layer but the
  /// last). An Error naming the model and the kind, when the model is built, for a kind that is not a
  /// MultiheadAttention (mla: causal only; linear: no key padding mask), a score/mask-function kind (alibi,
  /// softcap) and rope.
  AttentionSpec attention = {};
  /// The recipe (ArchitectureSpec, nn/sequence_model.h): positions sinusoidal, learned or none (rope: Error), the
  /// layers' activation, norm and eps (default 1e-5, PyTorch's), biases, the embedding scale, init and the head
  /// (default: its own Linear).
  ArchitectureSpec architecture = {};
};

/// Encoder-only model with a per-position head (see the file comment). Parameters: embed.weight (vocab, D)
/// ~ N(0, 1/D), layers.<i>.* (PyTorch's TransformerEncoderLayer init), norm.weight/bias, head.weight/bias
/// (Linear's default init); buffer pos.pe.
class EncoderTagger : public SequenceModel {
 public:
  /// The options type.
  using Options = EncoderTaggerOptions;
  /// Builds the model, drawing every initial weight from `gen`.
  explicit EncoderTagger(const EncoderTaggerOptions& options, Generator& gen = default_generator());
  /// Kind "encoder" from a spec (Error unless spec.aligned): n_head = heads, n_layers = layers, max_len =
  /// max_source_len + 1, pad_idx / sep_idx from the specials.
  static std::shared_ptr<SequenceModel> build(const ModelSpec& spec, Generator& gen);
  /// "EncoderTagger".
  std::string type_name() const override { return "EncoderTagger"; }
  /// tokens (B, L) Int64 (src SEP, right-padded) -> logits (B, L, vocab).
  Tensor forward(const Tensor& tokens) override;
  /// Keeps (true) or stops keeping (false) every layer's last attention weights.
  void store_attention(bool on);

  /// "encoder".
  std::string kind() const override { return "encoder"; }
  /// The spec (from build(), or derived from the options: max_source_len = max_target_len = max_len - 1).
  const ModelSpec& spec() const override { return spec_; }
  /// inputs {src SEP (B, L)}, target (B, L) = tgt EOS (ignore_index on padding). Error unless |tgt| == |src|.
  SequenceBatch make_batch(const std::vector<Example>& examples) const override;
  /// forward(inputs[0]) -> (B, L, vocab).
  Tensor forward_batch(const SequenceBatch& batch) override;
  /// Runs the encoder once over every source (memory[0] = logits (B, L, vocab)).
  DecodeState begin_decode(const TokenRows& sources) override;
  /// Position |decoded| of each active row; past its SEP a row's only choice is EOS.
  Tensor decode_step(DecodeState& state) override;
  /// One map per layer over src SEP.
  std::vector<AttentionMap> attention_maps(const std::vector<int64_t>& src,
                                           const std::vector<int64_t>& output) override;

  const EncoderTaggerOptions options;   ///< the options it was built with
  std::shared_ptr<Embedding> embed;     ///< "embed" (vocab, D)
  std::shared_ptr<PositionalEncoding> pos;  ///< "pos": sinusoidal table (max_len rows) + embedding dropout; null
                                            ///< unless positions are sinusoidal
  std::shared_ptr<Embedding> pos_embed; ///< "pos_embed" (max_len, D) with learned positions, else null
  std::shared_ptr<Dropout> dropout;     ///< "dropout" on the embedded input when there is no "pos", else null
  std::shared_ptr<ModuleList> layers;   ///< "layers": n_layers TransformerEncoderLayer (norm_first)
  std::shared_ptr<Module> norm;         ///< final norm: LayerNorm (eps 1e-5) or the recipe's
  std::shared_ptr<Linear> head;         ///< "head": D -> vocab, per position; null with a tied head (embed.weight)

 protected:
  /// "vocab=.., d_model=.., ...".
  std::string extra_repr() const override;
  /// Remembers `gen` for checkpointing (the recomputation replays its draws).
  void set_own_generator(Generator& gen) override { generator_ = &gen; }

 private:
  Tensor input_tokens(const TokenRows& sources) const;  // (B, L) src SEP, padded
  ModelSpec spec_;
  Generator* generator_ = nullptr;
};

}  // namespace attograd::nn
