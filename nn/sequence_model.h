#pragma once
// The sequence-model interface: what Trainer, greedy decoding, evaluation, the reports, checkpoints and the CLI
// know of a model. CausalLM (decoder-only), the seed's seed::Transformer (encoder-decoder, nn/seed/transformer.h),
// EncoderTagger (encoder-only, a head per position) and a user's own model implement it; nothing outside a model's
// own file knows which one it is.
//
// A model sees examples as token rows (source, target; no special tokens) and frames them itself:
//   make_batch(examples)   -> the tensors its forward reads and the target aligned with its logits,
//   forward_batch(batch)   -> logits (B, T, V), trained with cross_entropy(logits, batch.target, ignore_index),
//   begin_decode(sources)  -> the state of an incremental decode (encoder output, prompts, key/value cache),
//   decode_step(state)     -> the next token's logits for every row still decoding (from a key/value cache of
//                             the positions seen so far unless state.use_cache is false).
// Greedy decoding (train/decode.h) appends argmax tokens to state.decoded until a row emits special_tokens().eos.
//
// Models are built by kind through a registry ("lm", "seq2seq", "encoder" and whatever a user registers) from one
// ModelSpec, which is what a training run saves beside its weights: a saved model is rebuilt by kind and spec.

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "autograd/random.h"
#include "autograd/tensor.h"
#include "nn/module.h"

namespace attograd::nn {

/// Token rows, one per sequence.
using TokenRows = std::vector<std::vector<int64_t>>;

/// One example as token ids without special tokens: a source and the target the model should produce for it.
struct Example {
  std::vector<int64_t> src = {};  ///< source tokens
  std::vector<int64_t> tgt = {};  ///< target tokens
  /// Field-wise equality.
  bool operator==(const Example&) const = default;
};

/// The token ids a model reserves (the built-in tasks' values by default).
struct SpecialTokens {
  int64_t pad = 0;             ///< padding (a blocked key, no loss)
  int64_t bos = 1;             ///< start of a target sequence (encoder-decoder)
  int64_t eos = 2;             ///< end of a target sequence: decoding stops after it
  int64_t sep = 3;             ///< separates source and target (decoder-only) / ends the source (encoder-only)
  int64_t ignore_index = -100; ///< target label that carries no loss (cross_entropy's ignore_index)
  /// Field-wise equality.
  bool operator==(const SpecialTokens&) const = default;
};

/// The attention variant and position scheme of a model (docs/ATTENTION.md). The defaults are the textbook model:
/// multi-head softmax attention and, in the decoder-only model, the sinusoidal position table. A model kind states
/// which variants it supports and refuses the others with an Error naming the kind and the variant.
struct AttentionSpec {
  std::string kind = "mha";  ///< a registered kind (nn/attention_layer.h): "mha", "gqa", "mla", "local",
                             ///< "block-sparse", "linear" or a user's
  int64_t kv_heads = 0;      ///< gqa: key/value heads (must divide heads and be below it; 1 = multi-query)
  int64_t kv_rank = 0;       ///< mla: kv_lora_rank, the cached latent's width (0 = d_model / 4)
  int64_t q_rank = 0;        ///< mla: q_lora_rank, the query latent's width (0 = no query compression)
  int64_t rope_dim = 0;      ///< mla: qk_rope_head_dim, the decoupled RoPE features (0 = head size / 2)
  int64_t window = 0;        ///< local: keys i - window < j <= i (required > 0 for "local")
  int64_t block = 0;         ///< block-sparse: block size of the BigBird layout (required > 0 for "block-sparse")
  bool rope = false;         ///< rotary position embeddings on queries and keys instead of the sinusoidal table
                             ///< (mla always uses its own decoupled RoPE)
  bool checkpoint = false;   ///< gradient checkpointing: every block but the last recomputes its activations in
                             ///< the backward instead of keeping them (the same gradients, bitwise)
  /// A user's kind's own options: a JSON object (e.g. {"slopes": 0.5}), "" for none; read them with
  /// attention_option(). In the JSON as the object "options", only when not empty.
  std::string options = "";
  /// The spec as a JSON object (every field; "options" only when not empty), as in ModelSpec's JSON.
  std::string to_json() const;
  /// Error for an unknown kind (listing the registered ones), a field that the kind does not read, options that
  /// are not a JSON object, or what the kind's own checks refuse (heads is the model's, to check kv_heads).
  void validate(int64_t heads) const;
  /// Field-wise equality.
  bool operator==(const AttentionSpec&) const = default;
};

/// A model's recipe beyond its sizes and attention: the choices of nanoGPT's GPTConfig and of GPT-2 / LLaMA-style
/// models (docs/TRAINING.md, "The recipe"). The defaults are attograd's textbook recipe, what every model was before
/// these options existed. The decoder-only ("lm") and encoder-only ("encoder") kinds take every option; the seq2seq
/// kind keeps the paper's recipe and refuses any other with an Error naming the option.
struct ArchitectureSpec {
  /// Where positions come from: "sinusoidal" (the fixed table added to the input), "learned" (GPT-2's wpe: an
  /// Embedding (max_len, D) "pos_embed" added to the input), "rope" (rotary embeddings on queries and keys; the
  /// same as AttentionSpec::rope, which it sets) or "none" (a causal model can still infer positions).
  std::string positions = "sinusoidal";
  /// The feed-forward block: "relu", "gelu" (erf), "gelu-tanh" (GPT-2's tanh approximation) or "swiglu" (LLaMA's
  /// gated form linear2(silu(linear1 x) * linear3 x): d_ff is the width of the gate linear1 and of linear3, so the
  /// block holds 3 D F weights where the others hold 2 D F; LLaMA passes 2/3 of 4 D).
  std::string activation = "relu";
  std::string norm = "layernorm";    ///< every norm: "layernorm" or "rmsnorm" (no mean, no bias)
  /// Every norm's eps; 0 (the default): the kind's own (lm 1e-6, the seed's; encoder 1e-5, PyTorch's, as nanoGPT's)
  double norm_eps = 0.0;
  bool bias = true;                  ///< biases in every Linear (attention projections, feed-forward) and LayerNorm
  std::string embed_scale = "sqrt";  ///< token embeddings times sqrt(d_model) ("sqrt", the paper's) or not ("none")
  /// Initial weights: "default" (each module's own, docs/TRAINING.md has the table) or "gpt2" (every weight matrix
  /// and embedding N(0, 0.02), the residual output projections N(0, 0.02 / sqrt(2 layers)), biases zero, norms one).
  std::string init = "default";
  /// The output head: "default" (the kind's own: lm ties it to the token embedding, encoder has its own Linear
  /// with bias), "tied" (logits = h embed.weight^T) or "untied" (a Linear "head" (vocab, D), with a bias when bias).
  std::string head = "default";
  std::string recipe = "";           ///< the named recipe these options came from ("nanogpt"), for summaries
  /// norm_eps, or `kind_default` when it is 0.
  double eps_or(double kind_default) const { return norm_eps > 0.0 ? norm_eps : kind_default; }
  /// The spec as a JSON object (every field).
  std::string to_json() const;
  /// Error naming the field and its value for an unknown positions, activation, norm, embed_scale, init or head, or
  /// a norm_eps that is negative or not finite.
  void validate() const;
  /// The options that differ from the defaults, as "name=value" (recipe excluded), in declaration order.
  std::vector<std::string> differences() const;
  /// Field-wise equality.
  bool operator==(const ArchitectureSpec&) const = default;
};

/// Everything a model kind needs to be built, and what a training run saves beside the weights (as JSON). The
/// size defaults are attograd's training defaults (TrainConfig's, `attograd train`'s).
struct ModelSpec {
  int64_t vocab = 0;           ///< vocabulary size (special tokens included)
  int64_t layers = 2;          ///< blocks (decoder-only, encoder-only) or encoder and decoder layers each
  int64_t d_model = 64;        ///< model width
  int64_t heads = 4;           ///< attention heads; must divide d_model (head size d_model / heads)
  int64_t d_ff = 256;          ///< feed-forward hidden size
  double dropout = 0.0;        ///< every dropout probability
  int64_t max_source_len = 0;  ///< longest source the model must accept
  int64_t max_target_len = 0;  ///< longest target (without EOS) the model must produce
  bool aligned = false;        ///< every target has its source's length (what a per-position tagger needs)
  SpecialTokens specials = {}; ///< reserved token ids
  /// Language modelling of a text stream (decoder-only): an example is the sequence src ++ tgt, inputs seq[:-1],
  /// targets seq[1:] with loss at EVERY position, no SEP and no EOS; a decoding prompt is the source without SEP,
  /// decoding never stops on EOS, and a sequence longer than the model's window is cropped to its last tokens.
  bool stream = false;
  /// The attention variant (in the JSON as an object "attention", only when it is not the default).
  AttentionSpec attention = {};
  /// The recipe's architecture options (in the JSON as an object "architecture", only when not the default).
  ArchitectureSpec architecture = {};
  /// The spec as a JSON object (every field; "attention" and "architecture" only when not the default, so that
  /// older readers and files stay unchanged).
  std::string to_json() const;
  /// Parses to_json()'s output (Error naming an unknown field or a wrong type).
  static ModelSpec from_json(const std::string& text);
  /// Field-wise equality.
  bool operator==(const ModelSpec&) const = default;
};

class SequenceModel;
class AttentionCache;

/// One attention layer's decoding cache: the state an AttentionLayer made for itself (nn/attention_layer.h: keys
/// and values, latents or running sums, whatever its kind needs), or plain per-head keys and values of a model's
/// own softmax attention (the seq2seq decoder's; see cached_attention in nn/attention.h).
struct KVCache {
  Tensor key = {};    ///< (B, H, d_k, C): keys stored transposed, C = the cache's positions; undefined unless used
  Tensor value = {};  ///< (B, H, C, d_v)
  std::shared_ptr<AttentionCache> layer = {};  ///< an AttentionLayer's own state (AttentionLayer::make_cache)
};

/// The state of an incremental decode. The decoding loop owns `decoded`, `active` and `use_cache`; the model owns
/// the rest.
///
/// Key/value caching: with use_cache (the default) a model that supports it keeps each attention layer's keys and
/// values in `cache` (allocated by begin_decode) and, per row, how many positions of the row's sequence are in it
/// (`cached`); decode_step then runs the model only on the positions not yet cached (all of the prompt at the first
/// step, then the token appended since) and reads the earlier ones from the cache. Appending several tokens to
/// decoded[b] before a step feeds them together (the same logits as feeding them one by one). Set use_cache to
/// false before the first decode_step to recompute the whole sequence at every step (the reference path).
struct DecodeState {
  TokenRows sources = {};                ///< the sources, one per row
  TokenRows decoded = {};                ///< per row, the tokens produced so far (greedy decoding appends to them)
  std::vector<int64_t> active = {};      ///< rows still decoding, ascending; decode_step returns their logits in order
  std::vector<Tensor> memory = {};       ///< model-specific tensors computed once (e.g. the encoder output)
  bool use_cache = true;                 ///< decode from the key/value cache (false: recompute every step)
  std::vector<KVCache> cache = {};       ///< model-specific caches (e.g. per attention layer); empty without a cache
  std::vector<int64_t> cached = {};      ///< per row, the positions of its sequence fed through `cache` (all held,
                                         ///< or for a ring, AttentionCache::ring, the last of them)
  // Who began the decode, set by start(model, sources) and checked by validate(): a built-in model's decode_step
  // refuses a state that its own begin_decode did not make, or whose rows changed since.
  const SequenceModel* model = nullptr;  ///< the model whose begin_decode made the state (compared, never followed)
  std::string model_kind = {};           ///< that model's kind (for messages)
  int64_t rows = -1;                     ///< sources.size() at begin_decode (-1: not begun by a model)
  uint64_t sources_hash = 0;             ///< a hash of `sources` at begin_decode
  /// A state for `sources`: nothing decoded, every row active, no memory or cache yet, no model.
  static DecodeState start(const TokenRows& sources);
  /// start(sources) begun by `model` (what its begin_decode starts from): records the model, rows and sources.
  static DecodeState start(const SequenceModel& model, const TokenRows& sources);
  /// Error naming `who` and the offending value unless `model` began this state (start(model, ...)), its sources
  /// are unchanged, decoded and cached hold one entry per row, cached counts are >= 0, active rows are ascending,
  /// distinct and in [0, rows), and each active row's last decoded token is in [0, model.vocab_size()) (the model
  /// checks the tokens it reads).
  void validate(const SequenceModel& model, const char* who) const;
};

/// A model's training batch.
struct SequenceBatch {
  std::vector<Tensor> inputs = {};      ///< what forward_batch reads, model-specific (e.g. {src, tgt_in})
  Tensor target = {};                   ///< (B, T) Int64 labels aligned with the logits; ignore_index where no loss
  std::vector<Example> examples = {};   ///< the examples it was made from
};

/// One softmax attention layer's row entropies from the last forward (see SequenceModel::track_attention_entropy).
struct AttentionEntropy {
  std::string label = {};  ///< the layer, as a metrics column stem: "layer0" (decoder-only), "enc0", "dec0.self", ...
  Tensor entropy = {};     ///< (B, H, Lq): -sum_j p_ij log p_ij per head and query row, with history (differentiable)
  Tensor rows = {};        ///< (B, Lq) Bool, TRUE where the query row is a real token (not padding); undefined: all
};

/// One attention layer's probabilities for a figure, with the tokens along both axes.
struct AttentionMap {
  std::string label = {};              ///< e.g. "layer 0", "decoder 1 cross"
  Tensor weights = {};                 ///< (1, H, Lq, Lk)
  std::vector<int64_t> queries = {};   ///< Lq tokens (rows)
  std::vector<int64_t> keys = {};      ///< Lk tokens (columns)
  std::string note = {};               ///< what the weights are when not softmax probabilities the layer forms
                                       ///< (linear attention's explicit weights, MLA's plain path); else empty
};

/// The interface of a trainable sequence model (see the file comment). Implementations are Modules.
class SequenceModel : public Module {
 public:
  /// The registry kind this model is built by ("lm", "seq2seq", "encoder", or a user's).
  virtual std::string kind() const = 0;
  /// The spec the model was built from (saved beside its weights).
  virtual const ModelSpec& spec() const = 0;
  /// Vocabulary size.
  int64_t vocab_size() const { return spec().vocab; }
  /// Reserved token ids.
  const SpecialTokens& special_tokens() const { return spec().specials; }

  /// The tensors forward_batch reads and the target aligned with its logits. Error naming the example when one
  /// cannot be framed (too long, a token outside the vocabulary, a target this model cannot produce).
  virtual SequenceBatch make_batch(const std::vector<Example>& examples) const = 0;
  /// batch -> logits (B, T, vocab) aligned with batch.target.
  virtual Tensor forward_batch(const SequenceBatch& batch) = 0;

  /// Starts decoding `sources` (state.sources, empty decoded rows, every row active); computes what the whole
  /// decode shares. Called under NoGradGuard in eval mode.
  virtual DecodeState begin_decode(const TokenRows& sources) = 0;
  /// The next token's logits (A, vocab) for the A = state.active.size() rows still decoding, in state.active's
  /// order, given state.decoded.
  virtual Tensor decode_step(DecodeState& state) = 0;
  /// The most tokens decode_step can produce for a row (EOS included).
  virtual int64_t max_decode_len() const { return spec().max_target_len + 1; }

  /// Runs the model once on `src` and its decoded `output` (without EOS) with attention stored, in eval mode
  /// without gradients, and returns every attention layer's probabilities. Default: none.
  virtual std::vector<AttentionMap> attention_maps(const std::vector<int64_t>& src,
                                                   const std::vector<int64_t>& output);

  /// Makes every softmax attention layer also compute its rows' entropies in the forwards that follow (on), or
  /// stops (off: no cost). Default: an Error naming the kind when on (a model without attention entropies).
  virtual void track_attention_entropy(bool on);
  /// Per softmax attention layer, in a fixed order, the row entropies of the last forward (empty unless tracked).
  virtual std::vector<AttentionEntropy> attention_entropies() const { return {}; }

 protected:
  /// Error naming the example and `what` unless every token of every example is in [0, vocab) and lengths fit
  /// max_source_len / max_target_len.
  void check_examples(const std::vector<Example>& examples, const char* what) const;
};

/// Builds a model of one kind from a spec, drawing its initial weights from the generator.
using ModelFactory = std::function<std::shared_ptr<SequenceModel>(const ModelSpec&, Generator&)>;

/// Registers a model kind (a user's model included) so that Trainer, checkpoints and the CLI can build it by
/// name. Re-registering a kind replaces it.
void register_model(const std::string& kind, ModelFactory factory, const std::string& description = "");
/// Builds a registered kind (Error listing the registered kinds when unknown).
std::shared_ptr<SequenceModel> make_model(const std::string& kind, const ModelSpec& spec,
                                          Generator& gen = default_generator());
/// Whether a kind is registered.
bool has_model(const std::string& kind);
/// The registered kinds with their descriptions, built-in ones first.
std::vector<std::pair<std::string, std::string>> registered_models();

/// Pads rows on the right to `width` with `pad`: (rows.size(), width) Int64.
Tensor pack_rows(const TokenRows& rows, int64_t width, int64_t pad);
/// Position t of row b of logits (B, L, V) as (V) values: the row copied out of a (B, L, V) tensor into a new
/// (A, V) tensor for the listed (b, t) pairs.
Tensor gather_positions(const Tensor& logits, const std::vector<std::pair<int64_t, int64_t>>& positions);

}  // namespace attograd::nn
