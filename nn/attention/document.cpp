// Attention kind "document": document masking for packed sequences, a MultiheadAttention whose query sees only the
// keys of its own document, causally (FlexAttention's document mask; autograd/flex.h's document_mask). Made of a
// mask_mod only (docs/ATTENTION.md, "Score and mask functions").
// A document ends at a separator token (the kind's option "separator", default 2 = <eos>): the separator belongs to
// the document it ends, and the next position starts a new one. The documents come from the tokens the model tells
// the attention (AttentionCall::tokens; in decoding CachedAttentionRows::tokens), so a model that passes none is
// refused. The decoding cache keeps, besides the keys and values, each cached position's document.

#include <cmath>

#include "autograd/flex.h"
#include "nn/attention/builtin.h"

namespace attograd::nn::detail {

namespace {

constexpr const char* kKind = "document";
constexpr double kDefaultSeparator = 2.0;  // <eos>, SpecialTokens::eos

int64_t separator_of(const AttentionSpec& s) {
  const double t = attention_option(s, "separator", kDefaultSeparator);
  ATTO_CHECK(t >= 0 && std::floor(t) == t && t < 1e15, "AttentionSpec",
             "document needs options.separator a token id (a whole number >= 0), got ", t);
  return static_cast<int64_t>(t);
}

// The keys and values, and per cache row and position its document (the number of separators before it).
struct DocumentCache : KeyValueCache {
  std::vector<std::vector<int64_t>> doc;   // (B, C)
  std::vector<std::vector<uint8_t>> ends;  // (B, C): 1 where the token is a separator
  int64_t bytes() const override {
    int64_t n = KeyValueCache::bytes();
    for (size_t b = 0; b < doc.size(); ++b) n += static_cast<int64_t>(doc[b].size() * sizeof(int64_t) + ends[b].size());
    return n;
  }
};

class DocumentAttention : public MultiheadAttention {
 public:
  DocumentAttention(const MultiheadAttentionOptions& o, int64_t separator, Generator& gen)
      : MultiheadAttention(o, gen), sep_(separator) {}

  AttentionOutput forward(const Tensor& x, const AttentionCall& call) override {
    ATTO_CHECK(x.defined() && x.dim() == 3, kKind, "expected x of shape (B, L, D), got ",
               x.defined() ? x.shape() : Shape{});
    const Tensor& t = call.tokens;
    ATTO_CHECK(t.defined(), kKind,
               "no tokens: document masking finds the documents in the input tokens, and the model passes none "
               "(AttentionCall::tokens)");
    const int64_t B = x.size(0), L = x.size(1);
    ATTO_CHECK(t.dtype() == kInt64 && t.dim() == 2 && t.size(0) == B && t.size(1) == L, kKind,
               "tokens must be Int64 (B, L) = (", B, ", ", L, "), got ", dtype_name(t.dtype()), " ", t.shape());
    // doc[b, l] = the separators in tokens[b, 0 .. l - 1].
    Tensor doc = empty({B, L}, {.dtype = kInt64});  // (B, L)
    const Tensor& tc = t;                           // contiguous (every Tensor is)
    const int64_t* tp = tc.data<int64_t>();
    int64_t* d = doc.data<int64_t>();
    for (int64_t b = 0; b < B; ++b) {
      int64_t id = 0;
      for (int64_t l = 0; l < L; ++l) {
        d[b * L + l] = id;
        id += tp[b * L + l] == sep_;
      }
    }
    MhaResult r = MultiheadAttention::forward(x, x, x,
                                              {.key_padding_mask = call.key_padding_mask,
                                               .need_weights = call.need_weights,
                                               .average_attn_weights = false,
                                               .is_causal = call.is_causal,
                                               .need_entropy = call.need_entropy,
                                               .rope_offset = call.rope_offset,
                                               .mask_mod = document_mask(doc, call.is_causal)});
    return {.output = std::move(r.output), .weights = std::move(r.weights), .entropy = std::move(r.entropy)};
  }
  using AttentionLayer::forward;

  std::shared_ptr<AttentionCache> make_cache(int64_t B, int64_t C) const override {
    std::shared_ptr<AttentionCache> base = MultiheadAttention::make_cache(B, C);
    if (base == nullptr) return nullptr;
    auto c = std::make_shared<DocumentCache>();
    auto& kv = static_cast<KeyValueCache&>(*base);
    c->key = kv.key;
    c->value = kv.value;
    c->doc.assign(static_cast<size_t>(B), std::vector<int64_t>(static_cast<size_t>(C), 0));
    c->ends.assign(static_cast<size_t>(B), std::vector<uint8_t>(static_cast<size_t>(C), 0));
    return c;
  }

  Tensor forward_cached(const Tensor& x, AttentionCache& cache_in, const CachedAttentionRows& rows) override {
    auto* cache = dynamic_cast<DocumentCache*>(&cache_in);
    ATTO_CHECK(cache != nullptr, kKind, "forward_cached needs the cache that make_cache gave");
    const Tensor& t = rows.tokens;
    const auto A = static_cast<int64_t>(rows.cache_row.size());
    ATTO_CHECK(t.defined() && t.dtype() == kInt64 && t.dim() == 2 && t.size(0) == A && t.size(1) == x.size(1), kKind,
               "decoding needs the new positions' tokens (CachedAttentionRows::tokens) Int64 (", A, ", ", x.size(1),
               ")", t.defined() ? str_cat(", got ", dtype_name(t.dtype()), " ", t.shape()) : "");
    const Tensor& tc = t;  // contiguous (every Tensor is)
    const int64_t* tp = tc.data<int64_t>();
    const int64_t N = t.size(1), C = cache->capacity();
    for (int64_t a = 0; a < A; ++a) {
      const auto ua = static_cast<size_t>(a);
      const int64_t b = rows.cache_row[ua];
      ATTO_CHECK(b >= 0 && b < static_cast<int64_t>(cache->doc.size()) && rows.start[ua] + rows.count[ua] <= C, kKind,
                 "row ", a, " (cache row ", b, ", positions up to ", rows.start[ua] + rows.count[ua],
                 ") outside the cache of ", cache->doc.size(), " rows and ", C, " positions");
      std::vector<int64_t>& doc = cache->doc[static_cast<size_t>(b)];
      std::vector<uint8_t>& ends = cache->ends[static_cast<size_t>(b)];
      for (int64_t i = 0; i < rows.count[ua]; ++i) {
        const auto p = static_cast<size_t>(rows.start[ua] + i);
        doc[p] = p == 0 ? 0 : doc[p - 1] + ends[p - 1];
        ends[p] = tp[a * N + i] == sep_ ? 1 : 0;
      }
    }
    const std::vector<std::vector<int64_t>>* docs = &cache->doc;  // valid for this call
    MaskMod same_document(
        [docs](int64_t b, int64_t, int64_t q, int64_t kv) {
          const std::vector<int64_t>& d = (*docs)[static_cast<size_t>(b)];
          return d[static_cast<size_t>(kv)] == d[static_cast<size_t>(q)];
        },
        /*per_batch=*/true);
    return forward_cached_masked(x, cache_in, rows, same_document, true);
  }

 private:
  int64_t sep_ = 2;
};

}  // namespace

AttentionKindEntry document_attention_kind() {
  AttentionKindInfo info{.description =
                             "document masking for packed sequences: each query sees its own document causally; a "
                             "document ends at option separator (default 2, <eos>)",
                         .fields = {"rope"},
                         .validate = [](const AttentionSpec& s, int64_t) { separator_of(s); },
                         .facts =
                             [](const AttentionSpec& s, const AttentionConfig& c) {
                               AttentionFacts f = softmax_attention_facts(c);
                               f.own_positions = s.rope;
                               return f;
                             }};
  AttentionFactory factory = [](const AttentionSpec& s, const AttentionConfig& c, Generator& gen) {
    return std::make_shared<DocumentAttention>(base_multihead_options(s, c), separator_of(s), gen);
  };
  return {kKind, std::move(factory), std::move(info)};
}

}  // namespace attograd::nn::detail
