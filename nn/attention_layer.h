#pragma once
// The attention-layer interface of the models' self-attention, and the registry of attention kinds.
//
// A model asks for its self-attention by AttentionSpec::kind: make_attention(spec, config, gen) builds a layer of any
// registered kind ("mha", "gqa", "mla", "local", "block-sparse", "linear" and whatever a user registers with
// register_attention, as register_model does for models). The model then only talks to the AttentionLayer:
//   forward(x, call)                 -> output (B, L, D), and the weights / row entropies the call asks for,
//   make_cache(rows, capacity)       -> the layer's own decoding state (null: decode by recomputing),
//   forward_cached(x, cache, rows)   -> the new positions' outputs, reading and extending that state,
//   make_ring_cache(rows, span)      -> a state that slides past the model's max_len (null: the kind cannot),
// and the kind's facts (AttentionFacts: weights, cache per token, whether it encodes positions itself, ...) come
// from the registry without building a layer (memory estimates, benchmarks). Nothing outside a kind's own file asks
// which kind it is. docs/ATTENTION.md, "Write your own attention", walks through a user's kind.

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "autograd/random.h"
#include "autograd/tensor.h"
#include "nn/module.h"
#include "nn/sequence_model.h"

namespace attograd::nn {

struct MultiheadAttentionOptions;

/// Which cache rows and positions one cached decoding step serves: a step feeds A rows of N new positions each
/// (right-padded: row a's first count[a] positions are real). Row a lives in cache row cache_row[a]; its new
/// positions are start[a] ... start[a] + count[a] - 1.
struct CachedAttentionRows {
  std::vector<int64_t> cache_row = {};  ///< per fed row a: its row in the cache
  std::vector<int64_t> start = {};      ///< per a: the position of its first new query (= positions already cached)
  std::vector<int64_t> count = {};      ///< per a: its real new positions (the rest of the N are padding)
  // What a model knows of the rows beyond their features, for kinds whose masks depend on it (prefix-lm,
  // document); a kind that needs one refuses a call without it. Set by CausalLM; other models leave them empty.
  /// (A, N) Int64: the new positions' tokens (padding past count[a]); undefined when the model has none.
  Tensor tokens = {};
  /// Per a: its row's prompt length P (positions [0, P) are the prompt: CausalLM's src SEP); empty: no prompt.
  std::vector<int64_t> prompt_lengths = {};
};

/// What a model tells an attention kind about the layer it asks for.
struct AttentionConfig {
  int64_t d_model = 0;    ///< D, input and output features
  int64_t heads = 0;      ///< H, the model's heads (divides d_model)
  double dropout = 0.0;   ///< dropout on the attention probabilities in training mode
  int64_t max_len = 0;    ///< the longest sequence the layer sees (RoPE tables); for facts: the sequence length
  bool bias = true;       ///< biases in the layer's projections (a kind without any ignores it)
};

/// Per-call options of AttentionLayer::forward.
struct AttentionCall {
  Tensor key_padding_mask = {};  ///< (B, L) Bool, TRUE = that key is padding (blocked); undefined: none
  bool is_causal = true;         ///< query i sees keys j <= i (a kind may support only causal or only not)
  bool need_weights = false;     ///< also return the per-head probabilities (B, H, L, L) (softmax kinds)
  bool need_entropy = false;     ///< also return each head's row entropies (B, H, L), with history
  int64_t rope_offset = 0;       ///< kinds with RoPE: the position of the first query and key
  /// A sliding window of this call only (0 = none): causal query i also sees only keys i - window < j, on top of
  /// the kind's own rule. The model's reference of a ring decode (AttentionFacts::slides) passes its max_len here;
  /// a kind that slides honours it.
  int64_t window = 0;
  // What a model knows of the rows beyond their features, for kinds whose masks depend on it (prefix-lm,
  // document); a kind that needs one refuses a call without it. Set by CausalLM; other models leave them empty.
  /// (B, L) Int64: the input tokens, position l of row b at x[b, l]; undefined when the model has none.
  Tensor tokens = {};
  /// Per row b: its prompt length P (positions [0, P) are the prompt: CausalLM's src SEP, found as the first SEP);
  /// empty: no prompt (a stream/text model).
  std::vector<int64_t> prompt_lengths = {};
};

/// What AttentionLayer::forward returns.
struct AttentionOutput {
  Tensor output;        ///< (B, L, D)
  Tensor weights = {};  ///< (B, H, L, L), not differentiable; undefined unless asked for and the kind has them
  Tensor entropy = {};  ///< (B, H, L), -sum_j p_ij log p_ij per head and query row; undefined unless asked for
};

/// One layer's decoding state (keys and values, latents, running sums: whatever its kind needs), made by
/// AttentionLayer::make_cache for B rows and C positions, written in place by forward_cached.
class AttentionCache {
 public:
  virtual ~AttentionCache() = default;
  /// The positions a row can hold (a row longer than this is recomputed by the model).
  virtual int64_t capacity() const = 0;
  /// The bytes it holds.
  virtual int64_t bytes() const = 0;
  /// The rows B it was made for (set by the model that asked make_cache for it; a decode state checks it).
  int64_t rows = 0;
  /// Made by make_ring_cache: a ring of capacity() slots (position p in slot p mod capacity()) that rows run past.
  bool ring = false;
};

/// A kind's facts from its spec and the model's sizes alone, without building a layer (memory estimates, the
/// benchmark's FLOPs and cache sizes). Element counts; the defaults are multi-head softmax attention's.
struct AttentionFacts {
  double weights = 0;          ///< weights of one layer (no biases, no norms)
  double kept_per_row = 0;     ///< attention probabilities kept per query row and head (training memory)
  double flops = 0;            ///< forward FLOPs of the attention itself (not the projections), one causal
                               ///< sequence of config.max_len positions, all heads
  double cache_per_token = 0;  ///< decoding cache elements one layer keeps per row and position
  double state_per_row = 0;    ///< decoding state elements one layer keeps per row whatever the length
  bool own_positions = false;  ///< positions come from inside the attention (RoPE): the model adds no table
  bool softmax = true;         ///< softmax rows: attention weights and row entropies exist
  bool key_padding = true;     ///< forward takes a key padding mask
  /// Its decoding cache can slide as a ring past the model's max_len (AttentionLayer::make_ring_cache): its scores
  /// depend on positions only through the distance q - kv (RoPE, ALiBi, a window) or not at all, and forward
  /// honours AttentionCall::window. A model without an absolute position table then decodes every query over its
  /// last max_len keys instead of cropping (docs/ATTENTION.md, "Decoding past the context"). Off by default: a kind
  /// says so itself.
  bool slides = false;
};

/// The facts of multi-head softmax attention with `kv_heads` key/value heads (0 = config.heads) over `pairs`
/// causal query-key pairs (< 0: all of them, L (L + 1) / 2) keeping `kept` probabilities per row (< 0: L).
AttentionFacts softmax_attention_facts(const AttentionConfig& config, int64_t kv_heads = 0, double pairs = -1,
                                       double kept = -1);

/// The interface of a self-attention layer (see the file comment). MultiheadAttention, MultiHeadLatentAttention
/// and LinearAttention implement it; a user's kind derives from it (or from one of them) and registers a factory.
class AttentionLayer : public Module {
 public:
  /// x (B, L, D) -> output (B, L, D) and what `call` asks for. Error naming the kind for an option it cannot give.
  virtual AttentionOutput forward(const Tensor& x, const AttentionCall& call) = 0;
  /// Causal self-attention of x (B, L, D) with the default call.
  Tensor forward(const Tensor& x) override { return forward(x, AttentionCall{}).output; }

  /// A decoding state for B rows and C positions in the parameters' dtype; null (the default) when the kind
  /// decodes by recomputing.
  virtual std::shared_ptr<AttentionCache> make_cache(int64_t B, int64_t C) const;
  /// Decoding step (eval mode, no gradients): x (A, N, D) holds the new positions of A rows (see
  /// CachedAttentionRows); writes what the cache keeps of them and returns their outputs (A, N, D), each query
  /// over the cached positions up to its own (as forward() gives them, within rounding). Default: Error.
  virtual Tensor forward_cached(const Tensor& x, AttentionCache& cache, const CachedAttentionRows& rows);
  /// A decoding state for B rows that slides (a kind whose facts say `slides`): it keeps each row's last `span`
  /// positions (fewer when the kind's own window is shorter) in a ring (AttentionCache::ring), and forward_cached's
  /// query at position p attends to the kept keys p - span < j <= p (within its own window), at any p: rows run
  /// past `span` without recomputing. Null (the default) when the kind cannot.
  virtual std::shared_ptr<AttentionCache> make_ring_cache(int64_t B, int64_t span) const;

  /// What forward's weights are when they are not softmax probabilities the layer forms (an explicit path for a
  /// figure: linear attention, MLA's plain path); empty (the default) for softmax kinds.
  virtual std::string weights_note() const { return {}; }
  /// The weight of the projection that writes into the residual stream (GPT-2's attn.c_proj, which the gpt2 init
  /// draws with a smaller std); default: the parameter "out_proj.weight" when there is one, else undefined.
  virtual Tensor output_projection() const;

  /// The registered kind it was built as (empty when built directly, not by make_attention).
  const std::string& kind() const { return spec_.kind; }
  /// The spec it was built from (by make_attention).
  const AttentionSpec& spec() const { return spec_; }
  /// The model's sizes it was built for.
  const AttentionConfig& config() const { return config_; }
  /// Its kind's facts (the registry's, from spec() and config()).
  AttentionFacts facts() const;
  /// Bytes one decoding cache of it keeps per row and position (facts().cache_per_token times the parameters'
  /// element size), or, for a kind whose state does not grow with the length, its state per row.
  int64_t cache_bytes_per_token() const;
  /// Its spec as a JSON object (the "attention" object of ModelSpec's JSON, every field).
  std::string options_json() const;
  /// Records the spec and sizes it was built for (make_attention calls it after the factory).
  void set_origin(const AttentionSpec& spec, const AttentionConfig& config);

 private:
  AttentionSpec spec_ = {.kind = ""};
  AttentionConfig config_ = {};
};

/// Builds a layer of one kind, drawing its initial weights from the generator.
using AttentionFactory =
    std::function<std::shared_ptr<AttentionLayer>(const AttentionSpec&, const AttentionConfig&, Generator&)>;

/// Everything the registry knows of a kind beyond its factory (all optional).
struct AttentionKindInfo {
  std::string description = {};  ///< one line for --help and docs
  /// The built-in AttentionSpec fields the kind reads ("kv_heads", "kv_rank", "q_rank", "rope_dim", "window",
  /// "block", "rope"); validate() refuses any other that is set. ("checkpoint" and "options" are always allowed.)
  std::vector<std::string> fields = {};
  /// Extra checks of a spec for `heads` heads (Error naming the field); run after the field checks.
  std::function<void(const AttentionSpec&, int64_t heads)> validate = {};
  /// The kind's facts; default: softmax_attention_facts(config).
  std::function<AttentionFacts(const AttentionSpec&, const AttentionConfig&)> facts = {};
  /// For a kind that IS a MultiheadAttention with some options (mha, gqa, local, block-sparse): those options. The
  /// encoder-only and seq2seq models accept the kinds that have this and no score or mask function
  /// (detail::plain_multihead_attention).
  std::function<MultiheadAttentionOptions(const AttentionSpec&, const AttentionConfig&)> multihead = {};
  /// A model's own layer (the seq2seq model's "seed-mha"): make_attention builds it, but registered_attentions,
  /// attention_kinds_list, has_attention and the errors' lists of kinds leave it out, so that --attention, the
  /// benchmarks and the gradcheck registry do not offer it to the other models.
  bool internal = false;
};

/// Registers an attention kind (a user's included) so that AttentionSpec::kind, the models, Trainer, the gradcheck
/// registry and `--attention` build it by name. Re-registering a kind replaces it.
void register_attention(const std::string& kind, AttentionFactory factory, const std::string& description = "");
/// Same, with the kind's fields, checks and facts.
void register_attention(const std::string& kind, AttentionFactory factory, AttentionKindInfo info);
/// Builds a layer of spec.kind (Error listing the registered kinds when unknown); validates the spec first.
std::shared_ptr<AttentionLayer> make_attention(const AttentionSpec& spec, const AttentionConfig& config,
                                               Generator& gen = default_generator());
/// Whether a kind is registered (and not internal: AttentionKindInfo::internal).
bool has_attention(const std::string& kind);
/// The registered kinds with their descriptions, built-in ones first (internal kinds left out).
std::vector<std::pair<std::string, std::string>> registered_attentions();
/// The registered kinds' names, comma-separated ("mha, gqa, ...").
std::string attention_kinds_list();
/// The facts of spec.kind for a model of these sizes (Error when unknown).
AttentionFacts attention_facts(const AttentionSpec& spec, const AttentionConfig& config);
/// The kind's MultiheadAttention options when it is one (see AttentionKindInfo::multihead); false when it is not.
/// `supported` (optional) receives the kinds that are, comma-separated, for an error message.
bool attention_as_multihead(const AttentionSpec& spec, const AttentionConfig& config, MultiheadAttentionOptions* out,
                            std::string* supported = nullptr);
/// A short description of the spec's kind-specific fields, as " (kv_heads 2)" or " (window 4)": every field its
/// kind reads but rope; empty when none.
std::string attention_fields_words(const AttentionSpec& spec);

/// spec.options (a JSON object) field `name` as a number, or `fallback` when absent (Error when not a number).
double attention_option(const AttentionSpec& spec, const std::string& name, double fallback);

}  // namespace attograd::nn
