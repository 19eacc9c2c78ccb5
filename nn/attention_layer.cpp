// The attention registry, AttentionSpec's checks and the AttentionLayer defaults (see nn/attention_layer.h).

#include "nn/attention_layer.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <mutex>

#include "nn/attention.h"
#include "nn/attention/builtin.h"

namespace attograd::nn {

namespace {

using detail::AttentionKindEntry;

// The registry, with the built-in kinds first; guarded by a mutex (registration may happen from any thread).
struct Registry {
  std::mutex mutex;
  std::vector<AttentionKindEntry> entries;
  Registry() {
    entries.push_back(detail::mha_attention_kind());
    entries.push_back(detail::gqa_attention_kind());
    entries.push_back(detail::mla_attention_kind());
    entries.push_back(detail::local_attention_kind());
    entries.push_back(detail::block_sparse_attention_kind());
    entries.push_back(detail::linear_attention_kind());
    entries.push_back(detail::alibi_attention_kind());
    entries.push_back(detail::softcap_attention_kind());
    entries.push_back(detail::prefix_lm_attention_kind());
    entries.push_back(detail::document_attention_kind());
    entries.push_back(detail::seed_attention_kind());  // internal: not listed
  }
};

Registry& registry() {
  static Registry r;
  return r;
}

std::string kinds_of(const std::vector<AttentionKindEntry>& entries) {
  std::string s;
  for (const AttentionKindEntry& e : entries)
    if (!e.info.internal) s += (s.empty() ? "" : ", ") + e.kind;
  return s;
}

// A copy of the entry of `kind`, or false.
bool find_kind(const std::string& kind, AttentionKindEntry* out) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  for (const AttentionKindEntry& e : r.entries)
    if (e.kind == kind) {
      *out = e;
      return true;
    }
  return false;
}

AttentionKindEntry kind_entry(const std::string& kind, const char* me) {
  AttentionKindEntry e;
  if (!find_kind(kind, &e))
    throw Error(me, str_cat("unknown attention \"", kind, "\" (registered: ", attention_kinds_list(), ")"));
  return e;
}

bool reads(const AttentionKindEntry& e, const std::string& field) {
  return std::find(e.info.fields.begin(), e.info.fields.end(), field) != e.info.fields.end();
}

// The registered kinds that read `field`, comma-separated.
std::string kinds_reading(const std::string& field) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  std::string s;
  for (const AttentionKindEntry& e : r.entries)
    if (reads(e, field) && !e.info.internal) s += (s.empty() ? "" : ", ") + e.kind;
  return s.empty() ? "none" : s;
}

// The kind-specific integer fields of a spec, in declaration order.
std::vector<std::pair<const char*, int64_t>> size_fields(const AttentionSpec& s) {
  return {{"kv_heads", s.kv_heads}, {"kv_rank", s.kv_rank}, {"q_rank", s.q_rank},
          {"rope_dim", s.rope_dim}, {"window", s.window},   {"block", s.block}};
}

void add_entry(AttentionKindEntry entry) {
  ATTO_CHECK(!entry.kind.empty(), "register_attention", "the kind must not be empty");
  ATTO_CHECK(static_cast<bool>(entry.factory), "register_attention", "no factory given for kind \"", entry.kind,
             "\"");
  static const char* known[] = {"kv_heads", "kv_rank", "q_rank", "rope_dim", "window", "block", "rope"};
  for (const std::string& f : entry.info.fields)
    ATTO_CHECK(std::find(std::begin(known), std::end(known), f) != std::end(known), "register_attention", "kind \"",
               entry.kind, "\": unknown AttentionSpec field \"", f,
               "\" (expected kv_heads, kv_rank, q_rank, rope_dim, window, block or rope; a kind's own options go in "
               "AttentionSpec::options)");
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  for (AttentionKindEntry& e : r.entries)
    if (e.kind == entry.kind) {
      e = std::move(entry);
      return;
    }
  r.entries.push_back(std::move(entry));
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// AttentionSpec

void AttentionSpec::validate(int64_t heads) const {
  const char* me = "AttentionSpec";
  const AttentionKindEntry e = kind_entry(kind, me);
  ATTO_CHECK(kv_heads >= 0 && kv_rank >= 0 && q_rank >= 0 && rope_dim >= 0 && window >= 0 && block >= 0, me,
             "sizes must be non-negative, got kv_heads=", kv_heads, ", kv_rank=", kv_rank, ", q_rank=", q_rank,
             ", rope_dim=", rope_dim, ", window=", window, ", block=", block);
  if (!options.empty()) {
    const auto o = nlohmann::json::parse(options, nullptr, false);
    ATTO_CHECK(!o.is_discarded() && o.is_object(), me, "options must be a JSON object, got ", options);
  }
  for (const auto& [field, value] : size_fields(*this))
    ATTO_CHECK(value == 0 || reads(e, field), me, field, " applies to attention ", kinds_reading(field), ", not ",
               kind);
  if (e.info.validate) e.info.validate(*this, heads);
  ATTO_CHECK(!rope || reads(e, "rope"), me, "rope applies to softmax attention with a query/key per head (",
             kinds_reading("rope"), "), not ", kind);
}

// ---------------------------------------------------------------------------------------------
// The registry

void register_attention(const std::string& kind, AttentionFactory factory, const std::string& description) {
  add_entry({kind, std::move(factory), AttentionKindInfo{.description = description}});
}

void register_attention(const std::string& kind, AttentionFactory factory, AttentionKindInfo info) {
  add_entry({kind, std::move(factory), std::move(info)});
}

std::shared_ptr<AttentionLayer> make_attention(const AttentionSpec& spec, const AttentionConfig& config,
                                               Generator& gen) {
  const char* me = "make_attention";
  const AttentionKindEntry e = kind_entry(spec.kind, me);
  ATTO_CHECK(config.d_model > 0 && config.heads > 0 && config.d_model % config.heads == 0, me, spec.kind,
             ": d_model must be a positive multiple of heads, got d_model=", config.d_model, ", heads=",
             config.heads);
  spec.validate(config.heads);
  std::shared_ptr<AttentionLayer> layer = e.factory(spec, config, gen);
  ATTO_CHECK(layer != nullptr, me, "the factory of attention \"", spec.kind, "\" returned no layer");
  layer->set_origin(spec, config);
  return layer;
}

bool has_attention(const std::string& kind) {
  AttentionKindEntry e;
  return find_kind(kind, &e) && !e.info.internal;
}

std::vector<std::pair<std::string, std::string>> registered_attentions() {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  std::vector<std::pair<std::string, std::string>> out;
  for (const AttentionKindEntry& e : r.entries)
    if (!e.info.internal) out.emplace_back(e.kind, e.info.description);
  return out;
}

std::string attention_kinds_list() {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  return kinds_of(r.entries);
}

AttentionFacts softmax_attention_facts(const AttentionConfig& c, int64_t kv_heads, double pairs, double kept) {
  const double D = static_cast<double>(c.d_model), H = static_cast<double>(c.heads);
  const double L = static_cast<double>(c.max_len), d = D / H;
  AttentionFacts f;
  const bool grouped = kv_heads > 0 && kv_heads != c.heads;
  f.weights = grouped ? 2 * D * D + 2 * D * static_cast<double>(kv_heads) * d : 4 * D * D;  // q, o; k, v
  if (pairs < 0) pairs = L * (L + 1) / 2;
  f.flops = 2 * 2 * D * pairs;  // Q K^T and P V over the computed pairs, all heads
  f.kept_per_row = kept < 0 ? L : kept;
  f.cache_per_token = 2 * static_cast<double>(kv_heads > 0 ? kv_heads : c.heads) * d;
  return f;
}

AttentionFacts attention_facts(const AttentionSpec& spec, const AttentionConfig& config) {
  const AttentionKindEntry e = kind_entry(spec.kind, "attention_facts");
  if (e.info.facts) return e.info.facts(spec, config);
  AttentionFacts f = softmax_attention_facts(config);
  f.own_positions = spec.rope;
  return f;
}

bool attention_as_multihead(const AttentionSpec& spec, const AttentionConfig& config, MultiheadAttentionOptions* out,
                            std::string* supported) {
  const AttentionKindEntry e = kind_entry(spec.kind, "attention_as_multihead");
  if (supported != nullptr) {
    Registry& r = registry();
    std::lock_guard<std::mutex> lock(r.mutex);
    supported->clear();
    for (const AttentionKindEntry& k : r.entries)
      if (k.info.multihead && !k.info.internal) *supported += (supported->empty() ? "" : ", ") + k.kind;
  }
  if (!e.info.multihead) return false;
  *out = e.info.multihead(spec, config);
  return true;
}

std::string attention_fields_words(const AttentionSpec& spec) {
  AttentionKindEntry e;
  if (!find_kind(spec.kind, &e)) return "";
  std::string s;
  for (const auto& [field, value] : size_fields(spec))
    if (reads(e, field)) s += str_cat(s.empty() ? "" : ", ", field, " ", value);
  return s.empty() ? s : " (" + s + ")";
}

double attention_option(const AttentionSpec& spec, const std::string& name, double fallback) {
  if (spec.options.empty()) return fallback;
  const auto o = nlohmann::json::parse(spec.options, nullptr, false);
  ATTO_CHECK(!o.is_discarded() && o.is_object(), "attention_option", "options must be a JSON object, got ",
             spec.options);
  const auto it = o.find(name);
  if (it == o.end()) return fallback;
  ATTO_CHECK(it->is_number(), "attention_option", "attention \"", spec.kind, "\": option \"", name,
             "\" must be a number, got ", it->dump());
  return it->get<double>();
}

// ---------------------------------------------------------------------------------------------
// AttentionLayer

std::shared_ptr<AttentionCache> AttentionLayer::make_cache(int64_t, int64_t) const { return nullptr; }
std::shared_ptr<AttentionCache> AttentionLayer::make_ring_cache(int64_t, int64_t) const { return nullptr; }

Tensor AttentionLayer::forward_cached(const Tensor&, AttentionCache&, const CachedAttentionRows&) {
  throw Error(type_name(), str_cat("attention \"", kind(), "\" has no decoding cache (decode by recomputing)"));
}

void AttentionLayer::set_origin(const AttentionSpec& spec, const AttentionConfig& config) {
  spec_ = spec;
  config_ = config;
}

AttentionFacts AttentionLayer::facts() const {
  if (spec_.kind.empty()) return softmax_attention_facts(config_);
  return attention_facts(spec_, config_);
}

int64_t AttentionLayer::cache_bytes_per_token() const {
  const std::vector<Tensor> p = parameters();
  const double es = p.empty() ? 4.0 : static_cast<double>(dtype_size(p.front().dtype()));
  const AttentionFacts f = facts();
  return static_cast<int64_t>((f.cache_per_token > 0 ? f.cache_per_token : f.state_per_row) * es);
}

std::string AttentionLayer::options_json() const { return spec_.to_json(); }

Tensor AttentionLayer::output_projection() const {
  for (const auto& [name, p] : named_parameters())
    if (name == "out_proj.weight") return p;
  return {};
}

}  // namespace attograd::nn
