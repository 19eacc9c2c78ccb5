// Attention kind "prefix-lm": a prefix language model (Raffel et al.'s T5 "prefix LM", UniLM): a MultiheadAttention
// whose queries in a row's prompt see the whole prompt (bidirectional), and whose later queries are causal. Made of
// a mask_mod only (autograd/flex.h's prefix_lm_mask, one prefix per batch row; docs/ATTENTION.md, "Score and mask
// functions").
// The prefix of row b is the prompt the model tells the attention (AttentionCall::prompt_lengths: CausalLM's src SEP,
// up to and including the first SEP), or, with the kind's option "prefix" N > 0, the first N positions of every row
// (for a model without a prompt: a stream/text model). Without either, forward refuses. Cached decoding prefills a
// row's whole prompt in one step with its bidirectional block and is causal afterwards; with a fixed "prefix" the
// kind decodes by recomputing (a prompt shorter than N would change positions already cached).

#include <algorithm>
#include <cmath>

#include "autograd/flex.h"
#include "nn/attention/builtin.h"

namespace attograd::nn::detail {

namespace {

constexpr const char* kKind = "prefix-lm";

// The option "prefix" (0 = the model's prompt lengths).
int64_t fixed_prefix(const AttentionSpec& s) {
  const double p = attention_option(s, "prefix", 0.0);
  ATTO_CHECK(p >= 0 && std::floor(p) == p && p < 1e15, "AttentionSpec",
             "prefix-lm needs options.prefix a whole number >= 0 (0: the model's prompt lengths), got ", p);
  return static_cast<int64_t>(p);
}

class PrefixLMAttention : public MultiheadAttention {
 public:
  PrefixLMAttention(const MultiheadAttentionOptions& o, int64_t prefix, Generator& gen)
      : MultiheadAttention(o, gen), prefix_(prefix) {}

  AttentionOutput forward(const Tensor& x, const AttentionCall& call) override {
    ATTO_CHECK(x.defined() && x.dim() == 3, kKind, "expected x of shape (B, L, D), got ",
               x.defined() ? x.shape() : Shape{});
    ATTO_CHECK(call.is_causal, kKind,
               "a prefix LM is causal after its prefix; a bidirectional call (is_causal false) is not one");
    const int64_t B = x.size(0);
    std::vector<int64_t> prefix =
        prefix_ > 0 ? std::vector<int64_t>(static_cast<size_t>(B), prefix_) : call.prompt_lengths;
    ATTO_CHECK(!prefix.empty(), kKind,
               "no prefix: the model passes no prompt lengths (a stream/text model has no prompt); set options.prefix "
               "N for a fixed prefix of N positions");
    ATTO_CHECK(static_cast<int64_t>(prefix.size()) == B, kKind, "prompt_lengths has ", prefix.size(),
               " rows for a batch of ", B);
    MhaResult r = MultiheadAttention::forward(x, x, x,
                                              {.key_padding_mask = call.key_padding_mask,
                                               .need_weights = call.need_weights,
                                               .average_attn_weights = false,
                                               .is_causal = false,  // the mask is causal after the prefix
                                               .need_entropy = call.need_entropy,
                                               .rope_offset = call.rope_offset,
                                               .mask_mod = prefix_lm_mask(std::move(prefix))});
    return {.output = std::move(r.output), .weights = std::move(r.weights), .entropy = std::move(r.entropy)};
  }
  using AttentionLayer::forward;

  std::shared_ptr<AttentionCache> make_cache(int64_t B, int64_t C) const override {
    if (prefix_ > 0) return nullptr;  // a fixed prefix: decode by recomputing (see the file comment)
    return MultiheadAttention::make_cache(B, C);
  }

  Tensor forward_cached(const Tensor& x, AttentionCache& cache, const CachedAttentionRows& rows) override {
    const size_t A = rows.cache_row.size();
    ATTO_CHECK(rows.prompt_lengths.size() == A, kKind,
               "decoding needs each row's prompt length (CachedAttentionRows::prompt_lengths), got ",
               rows.prompt_lengths.size(), " for ", A, " rows");
    // A row's prompt is prefilled whole in one step (its queries see keys after them, all written by this step),
    // or is already cached (then the row is causal).
    bool any_prefix = false;
    int64_t rows_max = 0;
    for (size_t a = 0; a < A; ++a) {
      const int64_t p = rows.prompt_lengths[a], start = rows.start[a], end = start + rows.count[a];
      ATTO_CHECK(start >= p || (start == 0 && end >= p), kKind, "row ", a, " feeds positions [", start, ", ", end,
                 ") of a prompt of ", p, ": a prompt is decoded in one step (prefilled whole)");
      any_prefix = any_prefix || start < p;
      rows_max = std::max(rows_max, rows.cache_row[a] + 1);
    }
    if (!any_prefix) return forward_cached_masked(x, cache, rows, MaskMod(), true);
    // By cache row: its prefix (0 for a row not fed), and the bidirectional block within it.
    std::vector<int64_t> prefix(static_cast<size_t>(rows_max), 0);
    for (size_t a = 0; a < A; ++a) prefix[static_cast<size_t>(rows.cache_row[a])] = rows.prompt_lengths[a];
    return forward_cached_masked(x, cache, rows, prefix_lm_mask(std::move(prefix)), false);
  }

 private:
  int64_t prefix_ = 0;
};

}  // namespace

AttentionKindEntry prefix_lm_attention_kind() {
  AttentionKindInfo info{.description =
                             "prefix LM: bidirectional over each row's prompt (src SEP), causal after; option prefix "
                             "N: the first N positions instead",
                         .fields = {"rope"},
                         .validate = [](const AttentionSpec& s, int64_t) { fixed_prefix(s); },
                         .facts =
                             [](const AttentionSpec& s, const AttentionConfig& c) {
                               AttentionFacts f = softmax_attention_facts(c);
                               f.own_positions = s.rope;
                               return f;
                             }};
  AttentionFactory factory = [](const AttentionSpec& s, const AttentionConfig& c, Generator& gen) {
    return std::make_shared<PrefixLMAttention>(base_multihead_options(s, c), fixed_prefix(s), gen);
  };
  return {kKind, std::move(factory), std::move(info)};
}

}  // namespace attograd::nn::detail
