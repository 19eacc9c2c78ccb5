#pragma once
// CausalLM, a decoder-only (GPT-style) pre-LN language model (not from the seed; the seed's encoder-decoder
// Transformer is seed::Transformer in nn/seed/transformer.h, included below for convenience):
//      x = dropout(embed(tokens) * sqrt(d_model) + pe[:L])
//      per block: x = x + dropout1(self_attn(norm1(x), causal));  x = x + dropout2(ff(norm2(x)))
//      logits = norm(x) embed.weight^T                 (output projection tied to the embedding, no bias)
//    self_attn is torch.nn.MultiheadAttention's formulation (q, k, v, o projections with bias, attention
//    dropout); ff = linear2(dropout(relu(linear1(x)))); every LayerNorm has eps 1e-6.
//    That is the default recipe; options.architecture (ArchitectureSpec, nn/sequence_model.h) changes it: learned
//    (pos_embed), rotary or no positions, GELU / GELU-tanh / SwiGLU, RMSNorm and the norms' eps, no biases, no
//    embedding scale, GPT-2's init and an untied head (docs/TRAINING.md, "The recipe").
//    options.attention picks the variant (docs/ATTENTION.md, "In the models"): grouped-query heads, a sliding
//    window, a BigBird block layout, RoPE on q and k instead of pe (then no pe), mla or linear attention, and
//    gradient checkpointing of every block but the last (bitwise the same gradients).
//
// Masks inside the model follow nn/masks.h (Bool, TRUE = BLOCKED). Attention weights for visualisation: after
// store_attention(true) every block keeps its last per-head probabilities (B, H, Lq, Lk) (mla: those of its plain
// path; linear attention, which forms none: the explicit weights of LinearAttention::attention_weights); off by
// default (no cost). Dropout masks come from default_generator() until Module::set_generator() points every
// dropout of the model at another generator.

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "nn/attention.h"
#include "nn/attention_layer.h"
#include "nn/feedforward.h"
#include "nn/layers.h"
#include "nn/linear_attention.h"
#include "nn/mla.h"
#include "nn/module.h"
#include "nn/positional.h"
#include "nn/seed/transformer.h"
#include "nn/sequence_model.h"

namespace attograd::nn {

// ---------------------------------------------------------------------------------------------
// Decoder-only causal language model

/// Options of CausalLM (plain fields): CausalLM({.vocab = 256, .d_model = 128}, gen). The defaults are a small
/// GPT-style model, not attograd's training defaults; make_model("lm", spec) (what Trainer and `attograd train`
/// use) derives every field from one ModelSpec: max_len = max_source_len + max_target_len + 1 (src SEP tgt).
struct CausalLMOptions {
  int64_t vocab = 0;      ///< vocabulary size
  int64_t d_model = 128;  ///< model width D
  int64_t n_head = 4;     ///< attention heads; must divide d_model
  int64_t d_ff = 512;     ///< feed-forward hidden size F
  int64_t n_layers = 2;   ///< blocks
  double dropout = 0.1;   ///< every dropout (embedding, attention probabilities, residual branches, FFN hidden)
  int64_t max_len = 512;  ///< longest sequence (rows of the position table)
  int64_t pad_idx = 0;    ///< padding token, masked as a key by forward(tokens, true); < 0: none
  Dtype dtype = kFloat32; ///< parameter and buffer dtype (drawn as float32, then converted, as to() does)
  AttentionSpec attention = {};  ///< the attention variant and position scheme (docs/ATTENTION.md)
  ArchitectureSpec architecture = {};  ///< the recipe: positions, activation, norm, bias, scale, init, head
};

/// One pre-LN block of CausalLM: x + dropout1(self_attn(norm1(x))) with a causal mask, then
/// x + dropout2(ff(norm2(x))). Children: norm1, self_attn, dropout1, norm2, ff (PositionwiseFeedForward: ff.linear1,
/// ff.dropout, ff.linear2), dropout2. The child "self_attn" is the AttentionLayer that the registry builds for
/// options.attention (nn/attention_layer.h): a MultiheadAttention (mha, gqa, local, block-sparse), a
/// MultiHeadLatentAttention (mla), a LinearAttention (linear) or a user's kind.
class CausalLMBlock : public Module {
 public:
  /// Draws initial weights from `gen` (self_attn, then ff).
  explicit CausalLMBlock(const CausalLMOptions& options, Generator& gen = default_generator());
  /// "CausalLMBlock".
  std::string type_name() const override { return "CausalLMBlock"; }
  /// x (B, L, D) -> (B, L, D), causal.
  Tensor forward(const Tensor& x) override;
  /// x (B, L, D) -> (B, L, D), causal, with keys blocked where key_padding_mask (B, L) Bool is TRUE (or undefined).
  Tensor forward(const Tensor& x, const Tensor& key_padding_mask);
  /// x (B, L, D) -> (B, L, D) with the attention call's key padding mask, causality, RoPE offset and window (the
  /// reference of a ring decode: positions first .. first + L - 1, each query over its last max_len keys) and what
  /// it tells the attention of the rows (AttentionCall::tokens, prompt_lengths); weights and entropies as the block
  /// keeps them.
  Tensor forward(const Tensor& x, AttentionCall call);
  /// Decoding with the attention's own cache (eval mode, no gradients): x (A, N, D) holds the new positions of A
  /// rows (see CachedAttentionRows); the attention keeps what it needs of them in `cache` (made by
  /// self_attn->make_cache) and the queries attend to every cached position up to their own -> (A, N, D), the
  /// rows' values at those positions as forward() gives them.
  Tensor forward_cached(const Tensor& x, AttentionCache& cache, const CachedAttentionRows& rows);
  /// Keeps (true) or stops keeping and drops (false) the attention weights of the last forward.
  void set_store_attention(bool on);
  /// Self-attention probabilities (B, H, L, L) of the last forward; undefined unless stored.
  const Tensor& last_attention() const { return last_attention_; }
  /// Keeps (true) or stops keeping and drops (false) the row entropies of the forwards that follow.
  void set_track_entropy(bool on);
  /// Row entropies (B, H, L) of the last forward, with history; undefined unless tracked.
  const Tensor& last_entropy() const { return last_entropy_; }
  /// The attention as its implementation's type (null when it is another): block->attention<MultiheadAttention>().
  template <class A>
  std::shared_ptr<A> attention() const {
    return std::dynamic_pointer_cast<A>(self_attn);
  }

  std::shared_ptr<Module> norm1;                  ///< before self-attention: a LayerNorm (eps 1e-6) or RMSNorm
  std::shared_ptr<AttentionLayer> self_attn;     ///< causal self-attention of options.attention's kind
  std::shared_ptr<Dropout> dropout1;              ///< on the attention branch
  std::shared_ptr<Module> norm2;                  ///< before the feed-forward block (as norm1)
  std::shared_ptr<PositionwiseFeedForward> ff;    ///< Linear(D, F), ReLU (or the recipe's), Dropout, Linear(F, D)
  std::shared_ptr<Dropout> dropout2;              ///< on the feed-forward branch

 private:
  friend class CausalLM;  // a checkpointed forward hands the entropies with history back through last_entropy_
  bool store_attention_ = false;
  Tensor last_attention_;
  bool track_entropy_ = false;
  Tensor last_entropy_;
};

/// Decoder-only pre-LN language model (see the file comment). Parameters: embed.weight (vocab, D) ~ N(0, 1/D)
/// (so that the scaled embedding has unit variance and the tied logits start near unit scale), the blocks
/// (MultiheadAttention and Linear initialised as PyTorch's), norm.weight, norm.bias; buffer "pe" (max_len, D).
/// Right padding under the causal mask never changes earlier positions (a query only sees keys at or before it),
/// so padding needs no mask for training with ignore_index on padded targets; forward(tokens, true) also blocks
/// pad keys, which only changes the outputs at padded positions (and, with left padding, leaves a query that sees
/// only padding attending to nothing).
class CausalLM : public SequenceModel {
 public:
  /// The options type.
  using Options = CausalLMOptions;
  /// Builds the model, drawing every initial weight from `gen`.
  explicit CausalLM(const CausalLMOptions& options, Generator& gen = default_generator());
  /// Kind "lm" from a spec: n_head = heads, n_layers = layers, max_len = max_source_len + max_target_len + 1
  /// (src SEP tgt; a stream spec: max(1, max_source_len + max_target_len - 1), the input (src tgt)[:-1]),
  /// pad_idx = specials.pad.
  static std::shared_ptr<SequenceModel> build(const ModelSpec& spec, Generator& gen);
  /// "CausalLM".
  std::string type_name() const override { return "CausalLM"; }
  /// tokens (B, L) Int64 with L <= max_len and ids in [0, vocab) -> logits (B, L, vocab). Every block's attention
  /// is told the tokens and each row's prompt length, up to and including its first SEP (0 without one; none at all
  /// for a stream model): AttentionCall::tokens and prompt_lengths, which kinds such as prefix-lm and document read.
  Tensor forward(const Tensor& tokens) override;
  /// Same; with mask_padding, keys equal to pad_idx are also blocked (Error for linear attention, which has no
  /// per-key weights to block).
  Tensor forward(const Tensor& tokens, bool mask_padding);
  /// Keeps (true) or stops keeping (false) every block's last attention weights.
  void store_attention(bool on);
  /// Per block: its last self-attention probabilities (B, H, L, L) (undefined unless stored).
  std::vector<Tensor> attention_weights() const;
  /// Block i (negative counts from the end).
  std::shared_ptr<CausalLMBlock> block(int64_t i) const { return blocks->at<CausalLMBlock>(i); }

  /// "lm".
  std::string kind() const override { return "lm"; }
  /// The spec (from build(), or derived from the options: max_source_len = max_target_len = max_len - 1).
  const ModelSpec& spec() const override { return spec_; }
  /// inputs {src SEP tgt (B, L)}, target (B, L): the next token where it is a target token or the final EOS.
  /// A stream model (spec().stream): inputs {(src tgt)[:-1]}, target (src tgt)[1:] at every position.
  SequenceBatch make_batch(const std::vector<Example>& examples) const override;
  /// forward(inputs[0]) -> (B, L, vocab).
  Tensor forward_batch(const SequenceBatch& batch) override;
  /// Prompts src SEP (a stream model: src alone), one per row; asks every block's attention for its cache
  /// (make_cache) for every row and min(max_len, longest prompt + max_decode_len()) positions; when one gives none,
  /// the model decodes by recomputing. A model that slides (no absolute position table, and a kind whose facts say
  /// `slides`: RoPE, ALiBi, a window, or no positions) asks for rings of max_len keys (make_ring_cache) instead.
  DecodeState begin_decode(const TokenRows& sources) override;
  /// The spec's max_target_len + 1; unbounded for a stream model (sampling asks for any number of tokens).
  int64_t max_decode_len() const override;
  /// The active rows' next-token logits (A, vocab). A row's sequence is its prompt + decoded. Past max_len:
  /// - a model with an absolute position table (sinusoidal or learned) sees the row's last max_len tokens
  ///   (nanoGPT's crop: the window slides and positions restart at 0 for it). With state.use_cache, a row whose
  ///   sequence fits the cache runs only its new positions against the cached keys and values; a longer row
  ///   recomputes its cropped window (all such rows in one batched pass per step).
  /// - a model that slides (see begin_decode) keeps every position at its true place, and every layer's query
  ///   attends to that layer's last max_len keys (a rolling window per layer, as Mistral's rolling buffer; for one
  ///   layer exactly the crop, for more layers not: older keys were computed over their own windows). With
  ///   state.use_cache, every row runs only its new positions against its rings, at any length.
  /// Without state.use_cache, every active row recomputes (right-padded: the causal mask keeps padding out of a
  /// row's last position): its cropped window, or for a sliding model its last n_layers (max_len - 1) + 1 tokens
  /// (all the last position depends on) at their true positions under a sliding-window mask of max_len. Both give
  /// the same tokens.
  Tensor decode_step(DecodeState& state) override;
  /// Every block computes its self-attention row entropies (on) or stops (off); softmax attention only (Error for
  /// linear attention). With attention.checkpoint the entropies of the checkpointed blocks come out of the
  /// recomputation with their history (bitwise those of the model without checkpointing).
  void track_attention_entropy(bool on) override;
  /// Per block ("layer0", ...): its entropies (B, H, L) from the last forward, rows = the non-padding tokens.
  std::vector<AttentionEntropy> attention_entropies() const override;
  /// Bytes one block's decoding cache keeps per token: the attention kind's facts (AttentionFacts::cache_per_token)
  /// times the parameters' element size es: mha, local, block-sparse 2 H d es; gqa 2 H_kv d es; mla (kv_rank +
  /// rope_dim) es. A kind without a per-token cache (linear attention: running sums of H d (d + 1) es per ROW
  /// whatever the length) returns its state per row. The whole model keeps n_layers times this.
  int64_t kv_cache_bytes_per_token() const;
  /// mla: decode through the absorbed path (true, the default: the up-projections folded into the query and the
  /// output) or the plain one (false: the cached latents expanded into per-head keys and values); the same tokens.
  void set_mla_absorbed_decode(bool absorbed);
  /// One map per block over src SEP output.
  std::vector<AttentionMap> attention_maps(const std::vector<int64_t>& src,
                                           const std::vector<int64_t>& output) override;

  const CausalLMOptions options;       ///< the options it was built with
  std::shared_ptr<Embedding> embed;    ///< "embed" (vocab, D), also the output projection unless the head is untied
  Tensor pe;                           ///< "pe" buffer (max_len, D), the sinusoidal table; undefined (no buffer)
                                       ///< when positions are not sinusoidal or come from the attention (RoPE)
  std::shared_ptr<Embedding> pos_embed;  ///< "pos_embed" (max_len, D) with learned positions (GPT-2's wpe), else null
  std::shared_ptr<Dropout> dropout;    ///< on the embedded input
  std::shared_ptr<ModuleList> blocks;  ///< "blocks": n_layers CausalLMBlock
  std::shared_ptr<Module> norm;        ///< final norm: LayerNorm (eps 1e-6) or the recipe's
  std::shared_ptr<Linear> head;        ///< "head" (vocab, D) with an untied head, else null (logits use embed.weight)

 protected:
  /// "vocab=.., d_model=.., ...".
  std::string extra_repr() const override;
  /// Remembers `gen` for checkpointing (the recomputation replays its draws).
  void set_own_generator(Generator& gen) override { generator_ = &gen; }

 private:
  // The prompt row of a source: src SEP, or src alone for a stream model (the one place that frames a prompt).
  std::vector<int64_t> prompt_tokens(const std::vector<int64_t>& src) const;
  // Row b's whole sequence so far: prompt_tokens(source) + decoded.
  std::vector<int64_t> sequence(const DecodeState& state, int64_t b) const;
  // The visible-window rule: the index of the first token the model recomputes of a sequence of `length` tokens
  // (length - max_len when longer than max_len, else 0; a sliding model: length - sliding_history()).
  int64_t window_start(int64_t length) const;
  // Whether decoding slides past max_len: no absolute position table, and the kind's facts say `slides`.
  bool slides() const;
  // The tokens the last position's logits depend on in a sliding model: n_layers (max_len - 1) + 1.
  int64_t sliding_history() const;
  // Logits (B, L, V) of tokens (B, L) at positions first .. first + L - 1, each query over its last max_len keys
  // (L may exceed max_len; forward(tokens) itself when first == 0 and L <= max_len). Sliding models only.
  Tensor sliding_forward(const Tensor& tokens, int64_t first);
  // Logits (A, V) of the listed rows' last positions, recomputed over each row's visible window.
  Tensor recompute_logits(const DecodeState& state, const std::vector<int64_t>& rows);
  // Logits (A, V) of the listed rows' last positions from the cache, feeding only their new positions.
  Tensor cached_logits(DecodeState& state, const std::vector<int64_t>& rows);
  /// Error unless this model's begin_decode made `state` (DecodeState::validate) and its caches are the ones
  /// begin_decode made.
  void check_decode_state(const DecodeState& state) const;
  // Whether the input adds the sinusoidal table (else positions are learned, none, or come from inside the
  // attention: its facts).
  bool uses_position_table() const;
  // The table added to the input (pe, pos_embed's weight, or undefined).
  Tensor position_table() const;
  // The attention spec the blocks are built with: options.attention, with rope on for positions "rope".
  AttentionSpec block_attention() const;
  // The token embedding's scale: sqrt(D), or 1 for embed_scale "none".
  double embedding_scale() const;
  // Logits (..., V) of final hidden states h (..., D): the tied embedding or the head; `decode` uses the decoding
  // kernel (no graph).
  Tensor output_logits(const Tensor& h, bool decode) const;
  // The sizes the blocks' attention is built for.
  AttentionConfig attention_config() const;
  // The positions a decode of `sources` can reach: min(max_len, longest prompt + max_decode_len()).
  int64_t decode_capacity(const TokenRows& sources) const;
  // The positions st.cache can hold.
  int64_t cache_capacity(const DecodeState& st) const;
  // Block i of forward(): x (B, L, D) -> (B, L, D), under checkpoint() when options.attention.checkpoint asks.
  Tensor forward_block(int64_t i, const Tensor& x, const AttentionCall& call);
  // What the attention is told of the rows: the tokens and, unless a stream model, each row's prompt length (up to
  // and including its first SEP; 0 without one).
  AttentionCall rows_call(const Tensor& tokens, const Tensor& kpm) const;
  // The prompt length of a row of n tokens: the index of its first SEP + 1 (0 without one, or for a stream model).
  int64_t prompt_length(const int64_t* row, int64_t n) const;
  // The batch of token sequences `seqs`: inputs seq[:-1] right-padded to L with pad, targets seq[1:] where the
  // target position is at least first_target[i] (ignore_index elsewhere).
  SequenceBatch shifted_batch(const TokenRows& seqs, const std::vector<size_t>& first_target, size_t L,
                              const std::vector<Example>& ex) const;
  // make_batch for a stream model.
  SequenceBatch make_stream_batch(const std::vector<Example>& examples) const;

  ModelSpec spec_;
  Generator* generator_ = nullptr;  // the one set_generator() gave (the blocks' dropouts draw from it)
  bool track_entropy_ = false;
  Tensor entropy_rows_;  // (B, L) Bool of the last forward's non-padding tokens, when tracking
  bool slides_ = false;  // slides(), fixed at construction (the table and the kind's facts)
};

}  // namespace attograd::nn
