// The model registry, ModelSpec's JSON, and the helpers every SequenceModel shares.

#include "nn/sequence_model.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <mutex>
#include <type_traits>

#include "nn/encoder_tagger.h"
#include "nn/models.h"

namespace attograd::nn {

namespace {

using json = nlohmann::ordered_json;
constexpr const char* kSpec = "ModelSpec";

// Calls f(name, field) for every ModelSpec field, in declaration order (the JSON order).
template <class S, class F>
void for_each_field(S& s, F&& f) {
  f("vocab", s.vocab);
  f("layers", s.layers);
  f("d_model", s.d_model);
  f("heads", s.heads);
  f("d_ff", s.d_ff);
  f("dropout", s.dropout);
  f("max_source_len", s.max_source_len);
  f("max_target_len", s.max_target_len);
  f("aligned", s.aligned);
  f("pad", s.specials.pad);
  f("bos", s.specials.bos);
  f("eos", s.specials.eos);
  f("sep", s.specials.sep);
  f("ignore_index", s.specials.ignore_index);
  f("stream", s.stream);
}

template <class T>
void read_field(const json& v, const std::string& name, T& out) {
  if constexpr (std::is_same_v<T, bool>) {
    ATTO_CHECK(v.is_boolean(), kSpec, "field \"", name, "\" must be true or false");
    out = v.get<bool>();
  } else if constexpr (std::is_same_v<T, double>) {
    ATTO_CHECK(v.is_number(), kSpec, "field \"", name, "\" must be a number");
    out = v.get<double>();
  } else {
    static_assert(std::is_same_v<T, int64_t>);
    ATTO_CHECK(v.is_number_integer() &&
                   (!v.is_number_unsigned() ||
                    v.get<uint64_t>() <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max())),
               kSpec, "field \"", name, "\" must be an integer");
    out = v.get<int64_t>();
  }
}

struct Entry {
  std::string kind;
  ModelFactory factory;
  std::string description;
};

// The registry, with the built-in kinds first; guarded by a mutex (registration may happen from any thread).
struct Registry {
  std::mutex mutex;
  std::vector<Entry> entries;
  Registry() {
    entries.push_back({"lm", CausalLM::build, "decoder-only pre-LN language model (src SEP tgt, causal)"});
    entries.push_back({"seq2seq", seed::Transformer::build,
                       "the seed's encoder-decoder Transformer (attention-is-all-you-need-pytorch)"});
    entries.push_back({"encoder", EncoderTagger::build,
                       "encoder-only model with a per-position head (BERT-style tagging; targets aligned with sources)"});
  }
};

Registry& registry() {
  static Registry r;
  return r;
}

std::string kinds_list(const std::vector<Entry>& entries) {
  std::string s;
  for (const Entry& e : entries) s += (s.empty() ? "" : ", ") + e.kind;
  return s;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// ModelSpec

namespace {

// Calls f(name, field) for every AttentionSpec field, in declaration order (the JSON order).
template <class S, class F>
void for_each_attention_field(S& s, F&& f) {
  f("kind", s.kind);
  f("kv_heads", s.kv_heads);
  f("kv_rank", s.kv_rank);
  f("q_rank", s.q_rank);
  f("rope_dim", s.rope_dim);
  f("window", s.window);
  f("block", s.block);
  f("rope", s.rope);
  f("checkpoint", s.checkpoint);
}

// Calls f(name, field) for every ArchitectureSpec field, in declaration order (the JSON order).
template <class S, class F>
void for_each_architecture_field(S& s, F&& f) {
  f("positions", s.positions);
  f("activation", s.activation);
  f("norm", s.norm);
  f("norm_eps", s.norm_eps);
  f("bias", s.bias);
  f("embed_scale", s.embed_scale);
  f("init", s.init);
  f("head", s.head);
  f("recipe", s.recipe);
}

// Reads one field of a nested spec object ("attention.kind", "architecture.norm", ...).
template <class T>
void read_nested(const json& value, const std::string& name, T& field) {
  if constexpr (std::is_same_v<T, std::string>) {
    ATTO_CHECK(value.is_string(), kSpec, "field \"", name, "\" must be a string");
    field = value.template get<std::string>();
  } else {
    read_field(value, name, field);
  }
}

}  // namespace

namespace {

void read_architecture(const json& v, ArchitectureSpec& a) {
  ATTO_CHECK(v.is_object(), kSpec, "field \"architecture\" must be an object");
  for (const auto& item : v.items()) {
    bool known = false;
    for_each_architecture_field(a, [&](const char* name, auto& field) {
      if (item.key() != name) return;
      read_nested(item.value(), "architecture." + item.key(), field);
      known = true;
    });
    ATTO_CHECK(known, kSpec, "unknown field \"architecture.", item.key(), "\"");
  }
}

void read_attention(const json& v, AttentionSpec& a) {
  ATTO_CHECK(v.is_object(), kSpec, "field \"attention\" must be an object");
  for (const auto& item : v.items()) {
    const std::string& key = item.key();
    if (key == "options") {  // a user's kind's own options: any JSON object, kept as its compact text
      ATTO_CHECK(item.value().is_object(), kSpec, "field \"attention.options\" must be an object");
      a.options = item.value().dump();
      continue;
    }
    bool known = false;
    for_each_attention_field(a, [&](const char* name, auto& field) {
      if (key != name) return;
      read_nested(item.value(), "attention." + key, field);
      known = true;
    });
    ATTO_CHECK(known, kSpec, "unknown field \"attention.", key, "\"");
  }
}

// The attention object of the JSON: every field, then "options" when not empty.
json attention_json(const AttentionSpec& attention) {
  json a = json::object();
  for_each_attention_field(attention, [&](const char* name, const auto& v) { a[name] = v; });
  if (!attention.options.empty()) {
    const json o = json::parse(attention.options, nullptr, false);
    ATTO_CHECK(!o.is_discarded() && o.is_object(), kSpec, "attention.options must be a JSON object, got ",
               attention.options);
    a["options"] = o;
  }
  return a;
}

}  // namespace

std::string AttentionSpec::to_json() const { return attention_json(*this).dump(); }

namespace {

json architecture_json(const ArchitectureSpec& a) {
  json j = json::object();
  for_each_architecture_field(a, [&](const char* name, const auto& v) { j[name] = v; });
  return j;
}

void check_one_of(const std::string& field, const std::string& value, std::initializer_list<const char*> allowed) {
  std::string list;
  for (const char* a : allowed) {
    if (value == a) return;
    list += (list.empty() ? "" : ", ") + std::string(a);
  }
  ATTO_CHECK(false, "ArchitectureSpec", field, " must be one of ", list, ", got '", value, "'");
}

}  // namespace

std::string ArchitectureSpec::to_json() const { return architecture_json(*this).dump(); }

void ArchitectureSpec::validate() const {
  check_one_of("positions", positions, {"sinusoidal", "learned", "rope", "none"});
  check_one_of("activation", activation, {"relu", "gelu", "gelu-tanh", "swiglu"});
  check_one_of("norm", norm, {"layernorm", "rmsnorm"});
  check_one_of("embed_scale", embed_scale, {"sqrt", "none"});
  check_one_of("init", init, {"default", "gpt2"});
  check_one_of("head", head, {"default", "tied", "untied"});
  ATTO_CHECK(std::isfinite(norm_eps) && norm_eps >= 0.0, "ArchitectureSpec",
             "norm_eps must be finite and positive (or 0: the model kind's own), got ", norm_eps);
}

std::vector<std::string> ArchitectureSpec::differences() const {
  const json mine = architecture_json(*this), base = architecture_json(ArchitectureSpec{});
  std::vector<std::string> out;
  for_each_architecture_field(*this, [&](const char* name, const auto&) {
    if (std::string(name) == "recipe" || mine[name] == base[name]) return;
    out.push_back(std::string(name) + "=" + (mine[name].is_string() ? mine[name].get<std::string>() : mine[name].dump()));
  });
  return out;
}

std::string ModelSpec::to_json() const {
  json j = json::object();
  for_each_field(*this, [&](const char* name, const auto& v) { j[name] = v; });
  if (attention != AttentionSpec{}) j["attention"] = attention_json(attention);
  if (architecture != ArchitectureSpec{}) j["architecture"] = architecture_json(architecture);
  return j.dump();
}

ModelSpec ModelSpec::from_json(const std::string& text) {
  const json j = json::parse(text, nullptr, false);
  ATTO_CHECK(!j.is_discarded() && j.is_object(), kSpec, "not a JSON object");
  ModelSpec s;
  for (const auto& item : j.items()) {
    const std::string& key = item.key();
    const json& value = item.value();
    if (key == "attention") {
      read_attention(value, s.attention);
      continue;
    }
    if (key == "architecture") {
      read_architecture(value, s.architecture);
      continue;
    }
    bool known = false;
    for_each_field(s, [&](const char* name, auto& field) {
      if (key != name) return;
      read_field(value, key, field);
      known = true;
    });
    ATTO_CHECK(known, kSpec, "unknown field \"", key, "\"");
  }
  return s;
}

// ---------------------------------------------------------------------------------------------
// SequenceModel

DecodeState DecodeState::start(const TokenRows& sources) {
  DecodeState st;
  st.sources = sources;
  st.decoded.resize(sources.size());
  st.cached.assign(sources.size(), 0);
  for (size_t b = 0; b < sources.size(); ++b) st.active.push_back(static_cast<int64_t>(b));
  return st;
}

namespace {

// FNV-1a over the row count, each row's length and its tokens.
uint64_t hash_rows(const TokenRows& rows) {
  uint64_t h = 14695981039346656037ull;
  auto mix = [&h](uint64_t v) {
    for (int i = 0; i < 8; ++i) {
      h ^= (v >> (8 * i)) & 0xff;
      h *= 1099511628211ull;
    }
  };
  mix(rows.size());
  for (const auto& r : rows) {
    mix(r.size());
    for (int64_t t : r) mix(static_cast<uint64_t>(t));
  }
  return h;
}

}  // namespace

DecodeState DecodeState::start(const SequenceModel& model, const TokenRows& sources) {
  DecodeState st = start(sources);
  st.model = &model;
  st.model_kind = model.kind();
  st.rows = static_cast<int64_t>(sources.size());
  st.sources_hash = hash_rows(sources);
  return st;
}

void DecodeState::validate(const SequenceModel& m, const char* who) const {
  ATTO_CHECK(model != nullptr && rows >= 0, who, "the decode state was not made by this ", m.kind(),
             " model's begin_decode (call begin_decode(sources) first, and decode_step with the state it returns)");
  ATTO_CHECK(model == &m, who, "the decode state was begun by another model (a ", model_kind, ", not this ", m.kind(),
             "): decode a state only with the model whose begin_decode made it");
  ATTO_CHECK(static_cast<int64_t>(sources.size()) == rows, who, "the decode state has ", sources.size(),
             " source rows, but begin_decode made it for ", rows, " rows");
  ATTO_CHECK(hash_rows(sources) == sources_hash, who,
             "the decode state's sources changed since begin_decode (begin a new decode for other sources)");
  ATTO_CHECK(static_cast<int64_t>(decoded.size()) == rows, who, "the decode state has ", decoded.size(),
             " decoded rows for its ", rows, " rows");
  ATTO_CHECK(static_cast<int64_t>(cached.size()) == rows, who, "the decode state has ", cached.size(),
             " cached counts for its ", rows, " rows");
  for (size_t b = 0; b < cached.size(); ++b)
    ATTO_CHECK(cached[b] >= 0, who, "row ", b, " has a cached count of ", cached[b], " (must be >= 0)");
  const int64_t V = m.vocab_size();
  int64_t previous = -1;
  for (size_t i = 0; i < active.size(); ++i) {
    const int64_t b = active[i];
    ATTO_CHECK(b >= 0 && b < rows, who, "active[", i, "] is row ", b, ", outside [0, ", rows, ")");
    ATTO_CHECK(b > previous, who, "active rows must be ascending and distinct, got row ", b, " after row ", previous,
               " at active[", i, "]");
    previous = b;
    // The token appended last (O(1) per row: a stream decode grows without bound); the models check the tokens
    // they read as they embed them.
    const std::vector<int64_t>& d = decoded[static_cast<size_t>(b)];
    if (!d.empty())
      ATTO_CHECK(d.back() >= 0 && d.back() < V, who, "row ", b, " has decoded token ", d.back(), " at position ",
                 d.size() - 1, " outside [0, ", V, ")");
  }
}

std::vector<AttentionMap> SequenceModel::attention_maps(const std::vector<int64_t>&, const std::vector<int64_t>&) {
  return {};
}

void SequenceModel::track_attention_entropy(bool on) {
  ATTO_CHECK(!on, "SequenceModel", "model kind \"", kind(), "\" does not report attention entropies");
}

void SequenceModel::check_examples(const std::vector<Example>& examples, const char* what) const {
  const ModelSpec& s = spec();
  ATTO_CHECK(!examples.empty(), what, "empty batch");
  for (size_t i = 0; i < examples.size(); ++i) {
    const Example& e = examples[i];
    ATTO_CHECK(!e.src.empty(), what, "example ", i, " has an empty source (every example needs at least one token)");
    ATTO_CHECK(static_cast<int64_t>(e.src.size()) <= s.max_source_len, what, "example ", i, ": source length ",
               e.src.size(), " exceeds the model's max_source_len ", s.max_source_len);
    ATTO_CHECK(static_cast<int64_t>(e.tgt.size()) <= s.max_target_len, what, "example ", i, ": target length ",
               e.tgt.size(), " exceeds the model's max_target_len ", s.max_target_len);
    for (const auto* row : {&e.src, &e.tgt})
      for (int64_t t : *row)
        ATTO_CHECK(t >= 0 && t < s.vocab, what, "example ", i, " has token ", t, " outside [0, ", s.vocab, ")");
  }
}

// ---------------------------------------------------------------------------------------------
// Registry

void register_model(const std::string& kind, ModelFactory factory, const std::string& description) {
  ATTO_CHECK(!kind.empty(), "register_model", "the kind must not be empty");
  ATTO_CHECK(static_cast<bool>(factory), "register_model", "no factory given for kind \"", kind, "\"");
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  for (Entry& e : r.entries)
    if (e.kind == kind) {
      e = {kind, std::move(factory), description};
      return;
    }
  r.entries.push_back({kind, std::move(factory), description});
}

std::shared_ptr<SequenceModel> make_model(const std::string& kind, const ModelSpec& spec, Generator& gen) {
  ModelFactory factory;
  {
    Registry& r = registry();
    std::lock_guard<std::mutex> lock(r.mutex);
    for (const Entry& e : r.entries)
      if (e.kind == kind) factory = e.factory;
    ATTO_CHECK(static_cast<bool>(factory), "make_model", "unknown model kind \"", kind, "\" (registered: ",
               kinds_list(r.entries), ")");
  }
  ATTO_CHECK(spec.vocab >= 1, "make_model", kind, ": vocab must be positive, got ", spec.vocab);
  ATTO_CHECK(spec.max_source_len >= 0 && spec.max_target_len >= 0, "make_model", kind,
             ": max_source_len and max_target_len must be >= 0, got ", spec.max_source_len, " and ",
             spec.max_target_len);
  std::shared_ptr<SequenceModel> m = factory(spec, gen);
  ATTO_CHECK(m != nullptr, "make_model", "the factory of \"", kind, "\" returned no model");
  return m;
}

bool has_model(const std::string& kind) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  return std::any_of(r.entries.begin(), r.entries.end(), [&](const Entry& e) { return e.kind == kind; });
}

std::vector<std::pair<std::string, std::string>> registered_models() {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  std::vector<std::pair<std::string, std::string>> out;
  for (const Entry& e : r.entries) out.emplace_back(e.kind, e.description);
  return out;
}

// ---------------------------------------------------------------------------------------------
// Helpers

Tensor pack_rows(const TokenRows& rows, int64_t width, int64_t pad) {
  const auto B = static_cast<int64_t>(rows.size());
  Tensor t = full({B, width}, static_cast<double>(pad), {.dtype = kInt64});  // (B, width)
  int64_t* p = t.data<int64_t>();
  for (int64_t b = 0; b < B; ++b) {
    const auto& row = rows[static_cast<size_t>(b)];
    const int64_t n = std::min<int64_t>(width, static_cast<int64_t>(row.size()));
    std::copy(row.begin(), row.begin() + n, p + b * width);
  }
  return t;
}

Tensor gather_positions(const Tensor& logits, const std::vector<std::pair<int64_t, int64_t>>& positions) {
  const char* me = "gather_positions";
  ATTO_CHECK(logits.dim() == 3 && (logits.dtype() == kFloat32 || logits.dtype() == kFloat64), me,
             "logits must be (B, L, V) float32 or float64, got ", shape_str(logits.shape()), " ",
             dtype_name(logits.dtype()));
  const Tensor& c = logits;
  const int64_t B = c.size(0), L = c.size(1), V = c.size(2);
  const auto A = static_cast<int64_t>(positions.size());
  Tensor out = empty({A, V}, {.dtype = c.dtype()});  // (A, V)
  const size_t bytes = static_cast<size_t>(V) * dtype_size(c.dtype());
  const auto* src = static_cast<const uint8_t*>(c.const_raw_data());
  auto* dst = static_cast<uint8_t*>(out.raw_data());
  for (int64_t i = 0; i < A; ++i) {
    const auto [b, t] = positions[static_cast<size_t>(i)];
    ATTO_CHECK(b >= 0 && b < B && t >= 0 && t < L, me, "position (", b, ", ", t, ") outside (", B, ", ", L, ")");
    std::memcpy(dst + static_cast<size_t>(i) * bytes, src + static_cast<size_t>(b * L + t) * bytes, bytes);
  }
  return out;
}

}  // namespace attograd::nn
