#pragma once
// The seed's encoder-decoder Transformer ("Attention Is All You Need"): jadore801120/attention-is-all-you-need-pytorch,
// transformer/Layers.py (EncoderLayer, DecoderLayer) and transformer/Models.py (Encoder, Decoder, Transformer), with
// the seed's module names, so that named_parameters() lists the seed's names in the seed's order:
// encoder.src_word_emb, encoder.layer_stack.<i>.slf_attn / .pos_ffn, encoder.layer_norm, decoder.trg_word_emb,
// decoder.layer_stack.<i>.slf_attn / .enc_attn / .pos_ffn, decoder.layer_norm, trg_word_prj (weights files and the
// PyTorch goldens key on these names). Built from the seed's attention sublayer (seed::AttentionSublayer,
// nn/seed/attention.h; the self-attention as an AttentionLayer of the kind "seed-mha" from make_attention) and PositionwiseFeedForward (nn/feedforward.h, residual_norm: post-LN, LayerNorm eps 1e-6).
// Encoder/decoder input: embedding (times sqrt(d_model) with scale_embedding), + sinusoidal positions, dropout,
// LayerNorm, then the layers (the seed's order: its stacks normalise the input, not the output). xavier_uniform_ on
// every parameter with more than one dimension (embeddings included, so that, as in the seed, the padding row is
// not zero; it gets no gradient through the lookup). Position table: buffer "position_enc.pe" (the seed's
// "position_enc.pos_table", same values).
//
// Masks follow nn/masks.h (Bool, TRUE = BLOCKED). Attention weights for visualisation: after store_attention(true)
// every layer keeps its last per-head probabilities (B, H, Lq, Lk); off by default (no cost). Dropout masks come
// from default_generator() until Module::set_generator() points every dropout of the model at another generator.

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "nn/feedforward.h"
#include "nn/layers.h"
#include "nn/module.h"
#include "nn/positional.h"
#include "nn/seed/attention.h"
#include "nn/sequence_model.h"

namespace attograd::nn::seed {

/// Options of Transformer (plain fields): Transformer({.src_vocab = 100, .tgt_vocab = 100, .d_model = 64}).
/// The defaults are the paper's base model (and the seed's), not attograd's training defaults: d_k and d_v stay 64
/// whatever d_model is. make_model("seq2seq", spec) (what Trainer and `attograd train` use) derives every field
/// from one ModelSpec instead: d_k = d_v = d_model / heads, n_position = max(max_source_len, max_target_len + 1).
struct TransformerOptions {
  int64_t src_vocab = 0;          ///< source vocabulary size
  int64_t tgt_vocab = 0;          ///< target vocabulary size
  int64_t d_model = 512;          ///< model width (= the seed's d_word_vec)
  int64_t n_head = 8;             ///< attention heads
  int64_t d_k = 64;               ///< per-head query/key size
  int64_t d_v = 64;               ///< per-head value size
  int64_t d_inner = 2048;         ///< hidden size of the feed-forward blocks
  int64_t n_layers = 6;           ///< encoder layers and decoder layers (each)
  double dropout = 0.1;           ///< every dropout (embeddings, attention probabilities, sublayer outputs)
  int64_t pad_idx = 0;            ///< padding token of both vocabularies (a blocked key, no lookup gradient); < 0: none
  int64_t n_position = 200;       ///< longest source or target sequence (rows of the position table)
  bool share_embeddings = false;  ///< one embedding for source and target (needs src_vocab == tgt_vocab)
  bool tie_output = false;        ///< output projection weight = the target embedding (no separate weight)
  bool scale_embedding = false;   ///< with tie_output: embeddings times sqrt(d_model) (the seed's 'emb')
  bool scale_projection = false;  ///< with tie_output: logits times d_model^-0.5 (the seed's 'prj')
  Dtype dtype = kFloat32;         ///< parameter and buffer dtype (drawn as float32, then converted, as to() does)
  // Attention variants (not the seed's; off by default, which is exactly the seed's model; docs/ATTENTION.md).
  int64_t n_kv_head = 0;   ///< key/value heads of every attention (0 = n_head; must divide it): grouped-query
  int64_t enc_window = 0;  ///< encoder self-attention sliding window (0 = off): keys |i - j| <= enc_window
  int64_t enc_block = 0;   ///< encoder self-attention block-sparse (0 = off): BigBird blocks, 1 local + 1 global
  bool checkpoint = false; ///< gradient checkpointing of every encoder and decoder layer but each stack's last
};

/// The seed's EncoderLayer: slf_attn (an AttentionLayer: the AttentionSublayer of the kind "seed-mha", post-LN)
/// then pos_ffn (PositionwiseFeedForward with residual_norm).
class EncoderLayer : public Module {
 public:
  /// Draws initial weights from `gen` (slf_attn, then pos_ffn).
  EncoderLayer(int64_t d_model, int64_t d_inner, int64_t n_head, int64_t d_k, int64_t d_v, double dropout = 0.1,
               Generator& gen = default_generator(), const AttentionSublayerVariants& variants = {});
  /// "EncoderLayer".
  std::string type_name() const override { return "EncoderLayer"; }
  /// x (B, S, d_model) -> (B, S, d_model), no mask.
  Tensor forward(const Tensor& x) override;
  /// x (B, S, d_model) -> (B, S, d_model); mask Bool TRUE = BLOCKED broadcastable to (B, H, S, S) (see
  /// AttentionSublayer::forward; a mask needs slf_attn to be an AttentionSublayer), or undefined (no mask).
  Tensor forward(const Tensor& x, const Tensor& slf_attn_mask);
  /// x (B, S, d_model) -> (B, S, d_model), the self-attention through the AttentionLayer interface with `call`
  /// (its key padding mask and is_causal; need_weights and need_entropy are the layer's own switches).
  Tensor forward(const Tensor& x, const AttentionCall& call);
  /// Keeps (true) or stops keeping and drops (false) the attention weights of the last forward.
  void set_store_attention(bool on);
  /// Self-attention probabilities (B, H, S, S) of the last forward; undefined unless stored.
  const Tensor& last_attention() const { return last_attention_; }
  /// Keeps (true) or stops keeping and drops (false) the row entropies of the forwards that follow.
  void set_track_entropy(bool on);
  /// Self-attention row entropies (B, H, S) of the last forward, with history; undefined unless tracked.
  const Tensor& last_entropy() const { return last_entropy_; }

  std::shared_ptr<AttentionLayer> slf_attn;          ///< "slf_attn": kind "seed-mha" (an AttentionSublayer)
  std::shared_ptr<PositionwiseFeedForward> pos_ffn;  ///< "pos_ffn"

 private:
  friend class Encoder;  // a checkpointed forward hands the entropies with history back through last_entropy_
  // The post-attention rest: stores what the call returned, then pos_ffn.
  Tensor finish(AttentionOutput a);
  bool store_attention_ = false;
  Tensor last_attention_;
  bool track_entropy_ = false;
  Tensor last_entropy_;
};

/// The seed's DecoderLayer: slf_attn (an AttentionLayer of the kind "seed-mha"), enc_attn (an AttentionSublayer:
/// queries from the decoder, keys/values from the encoder output), pos_ffn; each post-LN.
class DecoderLayer : public Module {
 public:
  /// Draws initial weights from `gen` (slf_attn, enc_attn, pos_ffn). pad_idx: the token whose keys the
  /// self-attention's own decoding cache blocks (-1: none).
  DecoderLayer(int64_t d_model, int64_t d_inner, int64_t n_head, int64_t d_k, int64_t d_v, double dropout = 0.1,
               Generator& gen = default_generator(), const AttentionSublayerVariants& variants = {},
               int64_t pad_idx = -1);
  /// "DecoderLayer".
  std::string type_name() const override { return "DecoderLayer"; }
  /// dec_input (B, T, d_model), enc_output (B, S, d_model) -> (B, T, d_model); masks Bool TRUE = BLOCKED
  /// broadcastable to (B, H, T, T) and (B, H, T, S), or undefined.
  Tensor forward(const Tensor& dec_input, const Tensor& enc_output, const Tensor& slf_attn_mask = Tensor(),
                 const Tensor& dec_enc_attn_mask = Tensor());
  /// Same, the self-attention through the AttentionLayer interface with `self_call` (key padding mask (B, T),
  /// is_causal) instead of a mask.
  Tensor forward(const Tensor& dec_input, const Tensor& enc_output, const AttentionCall& self_call,
                 const Tensor& dec_enc_attn_mask);
  using Module::forward;
  /// forward() with the encoder output given twice, as the cross-attention's keys (memory_k) and values
  /// (memory_v): the same values; checkpointing passes two inputs so that the memory's gradient adds its terms in
  /// the order of the plain backward (bitwise equal gradients).
  Tensor forward_memory(const Tensor& dec_input, const Tensor& memory_k, const Tensor& memory_v,
                        const Tensor& slf_attn_mask, const Tensor& dec_enc_attn_mask);
  /// forward_memory() with the self-attention through the AttentionLayer interface (`self_call`).
  Tensor forward_memory(const Tensor& dec_input, const Tensor& memory_k, const Tensor& memory_v,
                        const AttentionCall& self_call, const Tensor& dec_enc_attn_mask);
  /// Decoding with key/value caches (eval mode, no gradients): x (A, N, d_model) holds the new positions of A rows
  /// (see CachedAttentionRows); self_cache gets their keys and values, cross_cache holds the encoder output's
  /// (computed once). Self-attention keys are blocked where target_tokens[b][j] == pad, cross-attention keys where
  /// the source has padding (sources[b] shorter than the cache, or pad) -> (A, N, d_model), as forward() gives.
  /// A self_cache with a layer state (self_cache.layer, from slf_attn->make_cache) is read through the
  /// AttentionLayer interface (slf_attn->forward_cached; the pad keys from rows.tokens, and slf_attn's pad);
  /// otherwise self_cache.key / value are used directly (slf_attn must then be an AttentionSublayer).
  Tensor forward_cached(const Tensor& x, KVCache& self_cache, KVCache& cross_cache, const CachedAttentionRows& rows,
                        const std::vector<std::vector<int64_t>>& target_tokens,
                        const std::vector<std::vector<int64_t>>& sources, int64_t pad);
  /// Keeps (true) or stops keeping and drops (false) the attention weights of the last forward.
  void set_store_attention(bool on);
  /// Self-attention probabilities (B, H, T, T) of the last forward; undefined unless stored.
  const Tensor& last_self_attention() const { return last_self_attention_; }
  /// Encoder-decoder attention probabilities (B, H, T, S) of the last forward; undefined unless stored.
  const Tensor& last_cross_attention() const { return last_cross_attention_; }
  /// Keeps (true) or stops keeping and drops (false) the row entropies of the forwards that follow.
  void set_track_entropy(bool on);
  /// Self-attention row entropies (B, H, T) of the last forward, with history; undefined unless tracked.
  const Tensor& last_self_entropy() const { return last_self_entropy_; }
  /// Encoder-decoder attention row entropies (B, H, T) of the last forward, with history; undefined unless tracked.
  const Tensor& last_cross_entropy() const { return last_cross_entropy_; }

  std::shared_ptr<AttentionLayer> slf_attn;          ///< "slf_attn": kind "seed-mha" (an AttentionSublayer)
  std::shared_ptr<AttentionSublayer> enc_attn;       ///< "enc_attn" (cross-attention: not an interface call)
  std::shared_ptr<PositionwiseFeedForward> pos_ffn;  ///< "pos_ffn"

 private:
  friend class Decoder;  // a checkpointed forward hands the entropies with history back (last_*_entropy_)
  // The cross-attention and pos_ffn after the self-attention's result `a`.
  Tensor finish(AttentionOutput a, const Tensor& memory_k, const Tensor& memory_v, const Tensor& dec_enc_attn_mask);
  bool store_attention_ = false;
  Tensor last_self_attention_;
  Tensor last_cross_attention_;
  bool track_entropy_ = false;
  Tensor last_self_entropy_;
  Tensor last_cross_entropy_;
};

/// The seed's Encoder: src_word_emb, position_enc, layer_stack (EncoderLayer list), layer_norm (eps 1e-6).
class Encoder : public Module {
 public:
  /// Built from options (src_vocab); uses `word_emb` as its embedding when given (shared with the decoder).
  Encoder(const TransformerOptions& options, Generator& gen = default_generator(),
          std::shared_ptr<Embedding> word_emb = nullptr);
  /// "Encoder".
  std::string type_name() const override { return "Encoder"; }
  /// src_seq (B, S) Int64, src_mask Bool (B, 1, 1, S) TRUE = BLOCKED (or undefined) -> (B, S, d_model).
  Tensor forward(const Tensor& src_seq, const Tensor& src_mask);
  /// Same, the layers' self-attention through the AttentionLayer interface with `call` (the model's: key padding
  /// mask (B, S), not causal).
  Tensor forward(const Tensor& src_seq, const AttentionCall& call);
  using Module::forward;

  std::shared_ptr<Embedding> src_word_emb;           ///< (src_vocab, d_model), padding_idx = pad_idx
  std::shared_ptr<PositionalEncoding> position_enc;  ///< sinusoidal table (n_position rows) + dropout
  std::shared_ptr<ModuleList> layer_stack;           ///< n_layers EncoderLayer
  std::shared_ptr<LayerNorm> layer_norm;             ///< applied before the layers (the seed's order)

 protected:
  /// Remembers `gen` for checkpointing (the recomputation replays its draws).
  void set_own_generator(Generator& gen) override { generator_ = &gen; }

 private:
  // Embedding, positions, norm, then `layer(l, x)` per layer (checkpointed as the options say).
  Tensor run(const Tensor& src_seq, const std::function<Tensor(EncoderLayer&, const Tensor&)>& layer);

  double scale_;  // sqrt(d_model) with scale_embedding and tie_output, else 1
  bool checkpoint_;
  Generator* generator_ = nullptr;
};

/// The seed's Decoder: trg_word_emb, position_enc, layer_stack (DecoderLayer list), layer_norm (eps 1e-6).
class Decoder : public Module {
 public:
  /// Built from options (tgt_vocab); uses `word_emb` as its embedding when given (shared with the encoder).
  Decoder(const TransformerOptions& options, Generator& gen = default_generator(),
          std::shared_ptr<Embedding> word_emb = nullptr);
  /// "Decoder".
  std::string type_name() const override { return "Decoder"; }
  /// trg_seq (B, T) Int64, trg_mask Bool broadcastable to (B, 1, T, T), enc_output (B, S, d_model), src_mask
  /// Bool (B, 1, 1, S) (masks TRUE = BLOCKED, or undefined) -> (B, T, d_model).
  Tensor forward(const Tensor& trg_seq, const Tensor& trg_mask, const Tensor& enc_output, const Tensor& src_mask);
  /// Same, the layers' self-attention through the AttentionLayer interface with `self_call` (the model's: key
  /// padding mask (B, T), causal).
  Tensor forward(const Tensor& trg_seq, const AttentionCall& self_call, const Tensor& enc_output,
                 const Tensor& src_mask);
  using Module::forward;

  std::shared_ptr<Embedding> trg_word_emb;           ///< (tgt_vocab, d_model), padding_idx = pad_idx
  std::shared_ptr<PositionalEncoding> position_enc;  ///< sinusoidal table (n_position rows) + dropout
  std::shared_ptr<ModuleList> layer_stack;           ///< n_layers DecoderLayer
  std::shared_ptr<LayerNorm> layer_norm;             ///< applied before the layers (the seed's order)

 protected:
  /// Remembers `gen` for checkpointing (the recomputation replays its draws).
  void set_own_generator(Generator& gen) override { generator_ = &gen; }

 private:
  // A decoder layer's forward_memory(x, memory_k, memory_v, <the self-attention's call or mask>, src_mask).
  using LayerForward = std::function<Tensor(DecoderLayer&, const Tensor&, const Tensor&, const Tensor&)>;
  // Embedding, positions, norm, then `layer` per layer (checkpointed as the options say).
  Tensor run(const Tensor& trg_seq, const Tensor& enc_output, const LayerForward& layer);

  double scale_;  // sqrt(d_model) with scale_embedding and tie_output, else 1
  bool checkpoint_;
  Generator* generator_ = nullptr;
};

/// The seed's encoder-decoder Transformer (see the file comment). Padding and causal masks are built inside from
/// the tokens and pad_idx. A query whose keys are all padding attends to nothing (zeros; the seed's -1e9 fill
/// gives uniform weights there): only a source of nothing but padding, or a target starting with pad_idx.
class Transformer : public SequenceModel {
 public:
  /// The options type.
  using Options = TransformerOptions;
  /// Builds the model, drawing every initial weight from `gen`.
  explicit Transformer(const TransformerOptions& options, Generator& gen = default_generator());
  /// Kind "seq2seq" from a spec: src_vocab = tgt_vocab = vocab, d_k = d_v = d_model / heads, d_inner = d_ff,
  /// n_position = max(max_source_len, max_target_len + 1), pad_idx = specials.pad, no sharing or tying. Attention:
  /// gqa (n_kv_head = kv_heads, every attention), local / block-sparse (the encoder's self-attention), checkpoint;
  /// an Error naming the option for rope, mla and linear.
  static std::shared_ptr<SequenceModel> build(const ModelSpec& spec, Generator& gen);
  /// "Transformer".
  std::string type_name() const override { return "Transformer"; }
  /// src (B, S) Int64, tgt_in (B, T) Int64 -> logits (B, T, tgt_vocab) (the seed returns them as (B*T, V)).
  Tensor forward(const Tensor& src, const Tensor& tgt_in);
  using Module::forward;
  /// src (B, S) Int64 -> memory (B, S, d_model), the encoder output.
  Tensor encode(const Tensor& src);
  /// tgt_in (B, T) Int64, memory (B, S, d_model) from encode(src), src (B, S) (for its padding mask) -> logits
  /// (B, T, tgt_vocab). forward(src, tgt) == decode(tgt, encode(src), src).
  Tensor decode(const Tensor& tgt_in, const Tensor& memory, const Tensor& src);
  /// The output projection weight (tgt_vocab, d_model): trg_word_prj.weight, or the target embedding when tied.
  Tensor output_weight() const;

  /// Keeps (true) or stops keeping (false) every layer's last attention weights.
  void store_attention(bool on);
  /// Per encoder layer: its last self-attention probabilities (B, H, S, S) (undefined unless stored).
  std::vector<Tensor> encoder_attention() const;
  /// Per decoder layer: its last self-attention probabilities (B, H, T, T).
  std::vector<Tensor> decoder_self_attention() const;
  /// Per decoder layer: its last encoder-decoder attention probabilities (B, H, T, S).
  std::vector<Tensor> decoder_cross_attention() const;

  /// "seq2seq".
  std::string kind() const override { return "seq2seq"; }
  /// The spec (from build(), or derived from the options: vocab = max(src_vocab, tgt_vocab), max_source_len =
  /// n_position, max_target_len = n_position - 1; attention names one variant of the options, as a spec can:
  /// enc_block, else enc_window, else n_kv_head, and checkpoint).
  const ModelSpec& spec() const override { return spec_; }
  /// inputs {src (B, S), tgt_in (B, T) = BOS tgt}, target (B, T) = tgt EOS (ignore_index after it).
  SequenceBatch make_batch(const std::vector<Example>& examples) const override;
  /// forward(inputs[0], inputs[1]) -> (B, T, tgt_vocab).
  Tensor forward_batch(const SequenceBatch& batch) override;
  /// Encodes the padded sources once (memory[0] = src (B, S), memory[1] = encoder output (B, S, d_model)) and
  /// makes the key/value caches: cache[l].layer the decoder layer l's self-attention state (its make_cache, n_position
  /// positions), cache[L + l].key / value its cross-attention keys and values of the encoder output, computed here
  /// once.
  DecodeState begin_decode(const TokenRows& sources) override;
  /// With state.use_cache: runs the decoder on the active rows' new positions only (BOS + decoded past
  /// state.cached) against the caches. Without: runs the decoder over BOS + decoded for every row (finished rows
  /// padded). Either way returns the active rows' last-position logits.
  Tensor decode_step(DecodeState& state) override;
  /// n_position (the decoder reads BOS plus at most n_position - 1 tokens).
  int64_t max_decode_len() const override { return options.n_position; }
  /// Every attention computes its row entropies (on) or stops (off); with checkpointing, the checkpointed layers'
  /// entropies come out of the recomputation with their history.
  void track_attention_entropy(bool on) override;
  /// "enc0", ... (rows: real source tokens), then "dec0.self", "dec0.cross", ... (rows: real target inputs).
  std::vector<AttentionEntropy> attention_entropies() const override;
  /// Encoder self-attention per layer, then decoder self and cross attention per layer.
  std::vector<AttentionMap> attention_maps(const std::vector<int64_t>& src,
                                           const std::vector<int64_t>& output) override;

  const TransformerOptions options;      ///< the options it was built with
  std::shared_ptr<Encoder> encoder;      ///< "encoder"
  std::shared_ptr<Decoder> decoder;      ///< "decoder"
  std::shared_ptr<Linear> trg_word_prj;  ///< d_model -> tgt_vocab, no bias; null with tie_output

 protected:
  /// "src_vocab=.., tgt_vocab=.., d_model=.., ...".
  std::string extra_repr() const override;

 private:
  // Logits (A, V) of the active rows' last positions from the caches, feeding only their new positions.
  Tensor cached_logits(DecodeState& state);
  /// Error unless this model's begin_decode made `state` (DecodeState::validate), its memory and caches are the
  /// ones begin_decode computed, and every active row fits n_position with its BOS.
  void check_decode_state(const DecodeState& state) const;

  ModelSpec spec_;
  bool track_entropy_ = false;
  Tensor enc_rows_, dec_rows_;  // (B, S), (B, T) Bool real tokens of the last forward, when tracking
};

}  // namespace attograd::nn::seed
