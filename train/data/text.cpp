// UTF-8, the shared vocabulary, DataSpec and TextDataset (train/data/text.h).

#include "train/data/text.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>
#include <type_traits>

#include "train/data/pairs.h"
#include "train/data/tokens.h"
#include "train/io/serialize.h"

namespace attograd::data {

namespace {

using json = nlohmann::ordered_json;

// "U+4E2D" for an error message.
std::string code_point_name(char32_t c) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "U+%04X", static_cast<unsigned>(c));
  return buf;
}

// "0xff" for an error message.
std::string hex_byte(unsigned char b) {
  char buf[8];
  std::snprintf(buf, sizeof buf, "0x%02x", static_cast<unsigned>(b));
  return buf;
}

// "0123456789abcdef" for an error message.
std::string hex64(uint64_t v) {
  char buf[24];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// UTF-8

std::vector<char32_t> decode_utf8(std::string_view text, const std::string& origin) {
  const char* me = "decode_utf8";
  std::vector<char32_t> out;
  out.reserve(text.size());
  const auto* p = reinterpret_cast<const unsigned char*>(text.data());
  const size_t n = text.size();
  for (size_t i = 0; i < n;) {
    const unsigned char b = p[i];
    ATTO_CHECK(b != 0, me, origin, ": a NUL byte at byte offset ", i, " (binary data, not UTF-8 text)");
    if (b < 0x80) {
      out.push_back(b);
      ++i;
      continue;
    }
    int len = 0;
    char32_t c = 0, min = 0;
    if ((b & 0xE0) == 0xC0)
      len = 2, c = b & 0x1F, min = 0x80;
    else if ((b & 0xF0) == 0xE0)
      len = 3, c = b & 0x0F, min = 0x800;
    else if ((b & 0xF8) == 0xF0)
      len = 4, c = b & 0x07, min = 0x10000;
    ATTO_CHECK(len > 0, me, origin, ": invalid UTF-8 at byte offset ", i, " (byte ", hex_byte(b),
               " cannot start a character)");
    ATTO_CHECK(i + static_cast<size_t>(len) <= n, me, origin, ": invalid UTF-8 at byte offset ", i,
               " (a character cut off by the end of the text)");
    for (int k = 1; k < len; ++k) {
      const unsigned char cb = p[i + static_cast<size_t>(k)];
      ATTO_CHECK((cb & 0xC0) == 0x80, me, origin, ": invalid UTF-8 at byte offset ", i, " (byte ", hex_byte(cb),
                 " at offset ", i + static_cast<size_t>(k), " is not a continuation byte)");
      c = (c << 6) | (cb & 0x3F);
    }
    ATTO_CHECK(c >= min && c <= 0x10FFFF && !(c >= 0xD800 && c <= 0xDFFF), me, origin,
               ": invalid UTF-8 at byte offset ", i, " (", code_point_name(c),
               c < min ? " in an overlong form)" : " is not a Unicode scalar value)");
    out.push_back(c);
    i += static_cast<size_t>(len);
  }
  return out;
}

std::string encode_utf8(char32_t c) {
  std::string s;
  if (c < 0x80) {
    s += static_cast<char>(c);
  } else if (c < 0x800) {
    s += static_cast<char>(0xC0 | (c >> 6));
    s += static_cast<char>(0x80 | (c & 0x3F));
  } else if (c < 0x10000) {
    s += static_cast<char>(0xE0 | (c >> 12));
    s += static_cast<char>(0x80 | ((c >> 6) & 0x3F));
    s += static_cast<char>(0x80 | (c & 0x3F));
  } else {
    s += static_cast<char>(0xF0 | (c >> 18));
    s += static_cast<char>(0x80 | ((c >> 12) & 0x3F));
    s += static_cast<char>(0x80 | ((c >> 6) & 0x3F));
    s += static_cast<char>(0x80 | (c & 0x3F));
  }
  return s;
}

std::string tokenize_name(Tokenize t) { return t == Tokenize::Char ? "char" : "word"; }

Tokenize parse_tokenize(const std::string& name) {
  if (name == "char") return Tokenize::Char;
  if (name == "word") return Tokenize::Word;
  throw Error("tokenize", str_cat("expected \"char\" or \"word\", got \"", name.substr(0, 60), "\""));
}

// ---------------------------------------------------------------------------------------------
// Vocabulary

namespace {

const std::string kReservedNames[Vocabulary::kReserved] = {"<pad>", "<bos>", "<eos>", "<sep>"};

bool is_space(char32_t c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f'; }

}  // namespace

Vocabulary::Vocabulary(std::vector<std::string> tokens, Tokenize tokenize)
    : tokens_(std::move(tokens)), tokenize_(tokenize) {
  for (size_t i = 0; i < tokens_.size(); ++i) {
    ATTO_CHECK(!tokens_[i].empty(), "Vocabulary", "token ", i, " is empty");
    ATTO_CHECK(ids_.emplace(tokens_[i], kReserved + static_cast<int64_t>(i)).second, "Vocabulary", "token \"",
               tokens_[i].substr(0, 60), "\" appears twice");
  }
}

Vocabulary Vocabulary::build(const std::vector<std::string>& pieces, Tokenize tokenize) {
  const std::set<std::string> distinct(pieces.begin(), pieces.end());
  return Vocabulary(std::vector<std::string>(distinct.begin(), distinct.end()), tokenize);
}

std::optional<int64_t> Vocabulary::find(const std::string& token) const {
  const auto it = ids_.find(token);
  if (it == ids_.end()) return std::nullopt;
  return it->second;
}

const std::string& Vocabulary::token(int64_t id) const {
  ATTO_CHECK(id >= 0 && id < size(), "Vocabulary", "token id ", id, " outside [0, ", size(), ")");
  return id < kReserved ? kReservedNames[id] : tokens_[static_cast<size_t>(id - kReserved)];
}

std::vector<std::string> Vocabulary::split(std::string_view text, const std::string& origin) const {
  const std::vector<char32_t> cps = decode_utf8(text, origin);
  std::vector<std::string> out;
  if (tokenize_ == Tokenize::Char) {
    out.reserve(cps.size());
    for (char32_t c : cps) out.push_back(encode_utf8(c));
    return out;
  }
  std::string word;
  for (char32_t c : cps) {
    if (is_space(c)) {
      if (!word.empty()) out.push_back(std::move(word));
      word.clear();
    } else {
      word += encode_utf8(c);
    }
  }
  if (!word.empty()) out.push_back(std::move(word));
  return out;
}

std::vector<int64_t> Vocabulary::encode(std::string_view text, const std::string& origin) const {
  std::vector<int64_t> ids;
  for (const std::string& piece : split(text, origin)) {
    const std::optional<int64_t> id = find(piece);
    if (!id) {
      const std::vector<char32_t> cps = decode_utf8(piece, origin);
      throw Error("Vocabulary",
                  str_cat(origin, ": ", tokenize_ == Tokenize::Char ? "character '" : "word '", piece.substr(0, 60),
                          "'", cps.size() == 1 ? " (" + code_point_name(cps[0]) + ")" : std::string(),
                          " is not in the model's vocabulary of ", size(), " tokens"));
    }
    ids.push_back(*id);
  }
  return ids;
}

std::string Vocabulary::decode(const std::vector<int64_t>& ids) const {
  std::string s;
  bool first = true;
  for (int64_t id : ids) {
    if (id >= 0 && id < kReserved) continue;
    if (tokenize_ == Tokenize::Word && !first) s += ' ';
    s += token(id);
    first = false;
  }
  return s;
}

std::string Vocabulary::to_json() const {
  json j = json::object();
  j["tokenize"] = tokenize_name(tokenize_);
  j["tokens"] = tokens_;
  return j.dump();
}

Vocabulary Vocabulary::from_json(const std::string& text) {
  const json j = json::parse(text, nullptr, false);
  ATTO_CHECK(!j.is_discarded() && j.is_object() && j.contains("tokenize") && j["tokenize"].is_string() &&
                 j.contains("tokens") && j["tokens"].is_array(),
             "Vocabulary", "expected {\"tokenize\": \"char\"|\"word\", \"tokens\": [strings]}");
  std::vector<std::string> tokens;
  for (const json& t : j["tokens"]) {
    ATTO_CHECK(t.is_string(), "Vocabulary", "every token must be a string");
    tokens.push_back(t.get<std::string>());
  }
  return Vocabulary(std::move(tokens), parse_tokenize(j["tokenize"].get<std::string>()));
}

// ---------------------------------------------------------------------------------------------
// DataSpec

namespace {

constexpr const char* kDataSpec = "DataSpec";

template <class S, class F>
void for_each_field(S& s, F&& f) {
  f("format", s.format);
  f("path", s.path);
  f("tokenize", s.tokenize);
  f("context", s.context);
  f("val_fraction", s.val_fraction);
  f("max_bytes", s.max_bytes);
  f("max_vocab", s.max_vocab);
  f("vocabulary", s.vocabulary);
  f("max_source_len", s.max_source_len);
  f("max_target_len", s.max_target_len);
  f("file_hash", s.file_hash);
  f("aligned", s.aligned);
  f("tokenizer", s.tokenizer);
  f("vocab_size", s.vocab_size);
  f("tokenizer_model", s.tokenizer_model);
  f("tokenizer_hash", s.tokenizer_hash);
}

template <class T>
void read_field(const json& v, const std::string& name, T& out) {
  if constexpr (std::is_same_v<T, std::string>) {
    ATTO_CHECK(v.is_string(), kDataSpec, "field \"", name, "\" must be a string");
    out = v.get<std::string>();
  } else if constexpr (std::is_same_v<T, bool>) {
    ATTO_CHECK(v.is_boolean(), kDataSpec, "field \"", name, "\" must be true or false");
    out = v.get<bool>();
  } else if constexpr (std::is_same_v<T, double>) {
    ATTO_CHECK(v.is_number(), kDataSpec, "field \"", name, "\" must be a number");
    out = v.get<double>();
  } else if constexpr (std::is_same_v<T, uint64_t>) {
    ATTO_CHECK(v.is_number_unsigned(), kDataSpec, "field \"", name, "\" must be a non-negative integer");
    out = v.get<uint64_t>();
  } else if constexpr (std::is_same_v<T, int64_t>) {
    ATTO_CHECK(
        v.is_number_integer() && (!v.is_number_unsigned() ||
                                  v.get<uint64_t>() <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max())),
        kDataSpec, "field \"", name, "\" must be an integer");
    out = v.get<int64_t>();
  } else {
    static_assert(std::is_same_v<T, std::vector<std::string>>);
    ATTO_CHECK(v.is_array(), kDataSpec, "field \"", name, "\" must be an array of strings");
    out.clear();
    for (const json& t : v) {
      ATTO_CHECK(t.is_string(), kDataSpec, "field \"", name, "\" must be an array of strings");
      out.push_back(t.get<std::string>());
    }
  }
}

}  // namespace

std::string DataSpec::to_json() const {
  json j = json::object();
  for_each_field(*this, [&](const char* name, const auto& v) { j[name] = v; });
  if (!aligned) j.erase("aligned");  // only when true: a text model's file stays as older readers know it
  // The tokenizer's fields only when not char: a char model's spec stays as before.
  if (tokenizer == "char") j.erase("tokenizer");
  if (vocab_size == 0) j.erase("vocab_size");
  if (tokenizer_model.empty()) j.erase("tokenizer_model");
  if (tokenizer_hash == 0) j.erase("tokenizer_hash");
  return j.dump();
}

DataSpec DataSpec::from_json(const std::string& text) {
  const json j = json::parse(text, nullptr, false);
  ATTO_CHECK(!j.is_discarded() && j.is_object(), kDataSpec, "not a JSON object");
  DataSpec s;
  for (const auto& item : j.items()) {
    bool known = false;
    for_each_field(s, [&](const char* name, auto& field) {
      if (item.key() != name) return;
      read_field(item.value(), item.key(), field);
      known = true;
    });
    ATTO_CHECK(known, kDataSpec, "unknown field \"", item.key().substr(0, 60), "\"");
  }
  return s;
}

void DataSpec::validate() const {
  ATTO_CHECK(format == "text" || format == "pairs" || format == "tokens", kDataSpec,
             "format must be \"text\", \"pairs\" or \"tokens\", got \"", format.substr(0, 60), "\"");
  ATTO_CHECK(tokenize == "char" || tokenize == "word", kDataSpec, "tokenize must be \"char\" or \"word\", got \"",
             tokenize.substr(0, 60), "\"");
  ATTO_CHECK(format == "pairs" || tokenize == "char", kDataSpec,
             "a text file is modelled by character: tokenize must be \"char\", got \"", tokenize, "\"");
  ATTO_CHECK(tokenizer == "char" || tokenizer == "bpe" || tokenizer == "unigram", kDataSpec,
             "tokenizer must be \"char\", \"bpe\" or \"unigram\", got \"", tokenizer.substr(0, 60), "\"");
  ATTO_CHECK(format != "pairs" || tokenizer == "char", kDataSpec,
             "a pairs file keeps its char or word tokens: tokenizer must be \"char\", got \"", tokenizer, "\"");
  if (tokenizer == "char") {
    ATTO_CHECK(vocab_size == 0 && tokenizer_model.empty() && tokenizer_hash == 0, kDataSpec,
               "vocab_size, tokenizer_model and tokenizer_hash are for a subword tokenizer (bpe, unigram), not char");
  } else {
    ATTO_CHECK(vocab_size >= 1 && vocab_size + Vocabulary::kReserved <= max_vocab, kDataSpec,
               "vocab_size must be in [1, ", max_vocab - Vocabulary::kReserved, "] (max_vocab ", max_vocab,
               " less the ", Vocabulary::kReserved, " reserved ids), got ", vocab_size);
    ATTO_CHECK(vocabulary.empty(), kDataSpec, "a ", tokenizer, " tokenizer keeps its pieces in tokenizer_model: "
               "vocabulary must be empty");
  }
  ATTO_CHECK(context >= 1 && context <= kMaxTextContext, kDataSpec, "context must be in [1, ", kMaxTextContext,
             "], got ", context);
  ATTO_CHECK(val_fraction > 0 && val_fraction < 1, kDataSpec, "val_fraction must be in (0, 1), got ", val_fraction);
  ATTO_CHECK(max_vocab > Vocabulary::kReserved && max_vocab <= kMaxVocabulary, kDataSpec, "max_vocab must be in [",
             Vocabulary::kReserved + 1, ", ", kMaxVocabulary, "], got ", max_vocab);
  ATTO_CHECK(max_bytes >= 1 && max_bytes <= io::kMaxFileBytes, kDataSpec, "max_bytes must be in [1, ",
             io::kMaxFileBytes, "], got ", max_bytes);
  ATTO_CHECK(static_cast<int64_t>(vocabulary.size()) + Vocabulary::kReserved <= max_vocab, kDataSpec,
             "a vocabulary of ", vocabulary.size() + Vocabulary::kReserved, " tokens exceeds max_vocab ", max_vocab);
}

std::string read_data_file(const std::string& path, uint64_t max_bytes) {
  const std::vector<uint8_t> bytes = io::detail::read_file(path, "data", max_bytes);
  return std::string(bytes.begin(), bytes.end());
}

std::shared_ptr<Dataset> open_data(const DataSpec& spec, bool read_file) {
  spec.validate();
  if (spec.format == "text") return std::make_shared<TextDataset>(spec, read_file);
  if (spec.format == "tokens") return std::make_shared<TokenFileDataset>(spec, read_file);
  return std::make_shared<PairsDataset>(spec, read_file);
}

std::optional<Tokenizer> saved_tokenizer(const DataSpec& spec) {
  if (spec.tokenizer_model.empty()) return std::nullopt;
  // Its hash is checked before it is parsed.
  const std::string origin = "DataSpec field \"tokenizer_model\"";
  std::string proto = base64_decode(spec.tokenizer_model, origin);
  const uint64_t hash = io::detail::xxh64(proto.data(), proto.size());
  ATTO_CHECK(hash == spec.tokenizer_hash, "tokenizer", origin, " does not match field \"tokenizer_hash\" (",
             hex64(hash), " != ", hex64(spec.tokenizer_hash), "): the saved tokenizer is damaged");
  Tokenizer t = Tokenizer::load(std::move(proto), spec.tokenizer, origin);
  ATTO_CHECK(t.pieces() == spec.vocab_size, "tokenizer", origin, " has ", t.pieces(),
             " pieces, field \"vocab_size\" says ", spec.vocab_size);
  return t;
}

namespace detail {

// The file's text for a spec: read, hashed and checked against a saved hash; CRLF line ends become LF.
std::string read_spec_file(DataSpec& spec) {
  std::error_code ec;
  const auto size = std::filesystem::file_size(spec.path, ec);
  ATTO_CHECK(spec.format != "text" || ec || size <= spec.max_bytes, "data", "'", spec.path, "' is ", size, " bytes, more than the ",
             spec.max_bytes, " bytes read into memory; for a larger corpus run `attograd prepare --text ",
             spec.path, " --out DIR` and train with --data DIR (docs/DATA.md)");
  std::string text = read_data_file(spec.path, spec.max_bytes);
  const uint64_t hash = io::detail::xxh64(text.data(), text.size());
  ATTO_CHECK(spec.file_hash == 0 || spec.file_hash == hash, "data", "'", spec.path,
             "' changed since the model was trained on it (its contents hash differs); give the original file");
  spec.file_hash = hash;
  ATTO_CHECK(!text.empty(), "data", "'", spec.path, "' is empty");
  std::string out;
  out.reserve(text.size());
  for (size_t i = 0; i < text.size(); ++i)
    if (!(text[i] == '\r' && i + 1 < text.size() && text[i + 1] == '\n')) out += text[i];
  return out;
}

// The vocabulary a spec gives, or, when it gives none, `built` (checked against max_vocab).
void check_vocab_size(const Vocabulary& v, const DataSpec& spec) {
  ATTO_CHECK(v.size() <= spec.max_vocab, "data", "'", spec.path, "' has ", v.size() - Vocabulary::kReserved,
             " distinct tokens; with the ", Vocabulary::kReserved, " reserved ids that is ", v.size(),
             ", more than the limit of ", spec.max_vocab);
}

}  // namespace detail

// ---------------------------------------------------------------------------------------------
// TextDataset

TextDataset::TextDataset(const DataSpec& spec, bool read_file) : spec_(spec) {
  const char* me = "TextDataset";
  spec_.validate();
  ATTO_CHECK(spec_.format == "text", me, "spec format must be \"text\", got \"", spec_.format, "\"");
  spec_.max_source_len = spec_.context;
  spec_.max_target_len = 1;
  if (spec_.tokenizer != "char") {
    open_subword(read_file);
    return;
  }
  if (!read_file) {
    ATTO_CHECK(!spec_.vocabulary.empty(), me, "a dataset without its file needs the saved vocabulary");
    vocab_ = Vocabulary(spec_.vocabulary, Tokenize::Char);
    return;
  }
  const std::string text = detail::read_spec_file(spec_);
  const std::vector<char32_t> cps = decode_utf8(text, "'" + spec_.path + "'");
  if (spec_.vocabulary.empty()) {
    std::set<char32_t> distinct(cps.begin(), cps.end());
    std::vector<std::string> tokens;
    for (char32_t c : distinct) tokens.push_back(encode_utf8(c));  // code point order = UTF-8 byte order
    vocab_ = Vocabulary(std::move(tokens), Tokenize::Char);
    detail::check_vocab_size(vocab_, spec_);
    spec_.vocabulary = vocab_.tokens();
  } else {
    vocab_ = Vocabulary(spec_.vocabulary, Tokenize::Char);
  }
  std::unordered_map<char32_t, int32_t> ids;  // code point -> id, without a string per character
  for (size_t i = 0; i < vocab_.tokens().size(); ++i) {
    const std::vector<char32_t> cp = decode_utf8(vocab_.tokens()[i], "the vocabulary");
    ATTO_CHECK(cp.size() == 1, me, "vocabulary token ", i, " is not one character");
    ids.emplace(cp[0], static_cast<int32_t>(Vocabulary::kReserved + static_cast<int64_t>(i)));
  }
  tokens_.reserve(cps.size());
  for (size_t i = 0; i < cps.size(); ++i) {
    const auto it = ids.find(cps[i]);
    ATTO_CHECK(it != ids.end(), me, "'", spec_.path, "': character ", code_point_name(cps[i]), " at character ", i,
               " is not in the model's vocabulary");
    tokens_.push_back(it->second);
  }
  const auto n = static_cast<int64_t>(tokens_.size());
  const auto n_val = static_cast<int64_t>(static_cast<double>(n) * spec_.val_fraction);
  n_train_ = n - n_val;
  ATTO_CHECK(n_train_ >= spec_.context + 1 && n_val >= 2, me, "'", spec_.path, "' has ", n,
             " characters: too few for context ", spec_.context, " and val_fraction ", spec_.val_fraction,
             " (the training part needs at least context + 1 = ", spec_.context + 1,
             ", the held-out part at least 2; it would get ", n_train_, " and ", n_val, ")");
}

void TextDataset::open_subword(bool read_file) {
  const char* me = "TextDataset";
  tokenizer_ = saved_tokenizer(spec_);
  if (!read_file) {
    ATTO_CHECK(tokenizer_.has_value(), me, "a dataset without its file needs the saved tokenizer (tokenizer_model)");
    return;
  }
  const std::string text = detail::read_spec_file(spec_);
  const std::string origin = "'" + spec_.path + "'";
  decode_utf8(text, origin);  // valid UTF-8, no NUL byte
  // The held-out part is the last val_fraction of the bytes (the split moved back to a character's start), so
  // that the tokenizer is trained on the training part alone.
  const auto n_bytes = static_cast<int64_t>(text.size());
  auto split = static_cast<size_t>(n_bytes - static_cast<int64_t>(static_cast<double>(n_bytes) * spec_.val_fraction));
  while (split > 0 && split < text.size() && (static_cast<unsigned char>(text[split]) & 0xC0) == 0x80) --split;
  const std::string_view train_text = std::string_view(text).substr(0, split);
  const std::string_view val_text = std::string_view(text).substr(split);
  if (!tokenizer_) {
    ATTO_CHECK(!train_text.empty(), me, origin, " has ", n_bytes, " bytes: no training part for val_fraction ",
               spec_.val_fraction);
    tokenizer_ = Tokenizer::train(train_text, spec_.tokenizer, spec_.vocab_size);
    spec_.tokenizer_model = base64_encode(tokenizer_->proto());
    spec_.tokenizer_hash = tokenizer_->hash();
  }
  for (int64_t id : tokenizer_->encode(train_text, origin)) tokens_.push_back(static_cast<int32_t>(id));
  n_train_ = static_cast<int64_t>(tokens_.size());
  for (int64_t id : tokenizer_->encode(val_text, origin)) tokens_.push_back(static_cast<int32_t>(id));
  const int64_t n_val = static_cast<int64_t>(tokens_.size()) - n_train_;
  ATTO_CHECK(n_train_ >= spec_.context + 1 && n_val >= 2, me, origin, " has ", tokens_.size(), " ", spec_.tokenizer,
             " tokens: too few for context ", spec_.context, " and val_fraction ", spec_.val_fraction,
             " (the training part needs at least context + 1 = ", spec_.context + 1,
             ", the held-out part at least 2; it would get ", n_train_, " and ", n_val, ")");
}

std::string TextDataset::token_text(int64_t token) const {
  return tokenizer_ ? tokenizer_->token_text(token) : vocab_.token(token);
}

std::string TextDataset::to_text(const std::vector<int64_t>& tokens) const {
  return tokenizer_ ? tokenizer_->decode(tokens) : vocab_.decode(tokens);
}

int64_t TextDataset::token_bytes(int64_t token) const {
  if (tokenizer_) return tokenizer_->token_bytes(token);
  return token < Vocabulary::kReserved ? 0 : static_cast<int64_t>(vocab_.token(token).size());
}

std::string TextDataset::name() const { return std::filesystem::path(spec_.path).filename().string(); }

void TextDataset::seed(uint64_t seed) {
  gen_.manual_seed(seed);
  offset_ = 0;
}

Example TextDataset::next() {
  ATTO_CHECK(!tokens_.empty(), "TextDataset", "no data: the dataset was opened without its file");
  const int64_t start = static_cast<int64_t>(gen_.randint(static_cast<uint64_t>(n_train_ - spec_.context)));
  ++offset_;
  const auto b = tokens_.begin() + start;
  return {.src = std::vector<int64_t>(b, b + spec_.context), .tgt = {*(b + spec_.context)}};
}

std::vector<Example> TextDataset::heldout(int64_t n, uint64_t) const {
  ATTO_CHECK(n >= 1, name(), "held-out example count must be >= 1, got ", n);
  ATTO_CHECK(!tokens_.empty(), "TextDataset", "no data: the dataset was opened without its file");
  std::vector<Example> out;
  const auto total = static_cast<int64_t>(tokens_.size());
  for (int64_t s = n_train_; s + 1 < total && static_cast<int64_t>(out.size()) < n; s += spec_.context) {
    const int64_t e = std::min(total, s + spec_.context + 1);
    out.push_back({.src = std::vector<int64_t>(tokens_.begin() + s, tokens_.begin() + e - 1),
                   .tgt = {tokens_[static_cast<size_t>(e - 1)]}});
  }
  return out;
}

int64_t TextDataset::heldout_size() const {
  // heldout() starts a window at n_train_, n_train_ + context, ... while a target follows (s + 1 < total).
  const int64_t span = static_cast<int64_t>(tokens_.size()) - 1 - n_train_;
  return span > 0 ? (span + spec_.context - 1) / spec_.context : 0;
}

void TextDataset::set_position(const DataPosition& p) {
  ATTO_CHECK(p.offset >= 0, name(), "data position offset must be >= 0, got ", p.offset);
  gen_.set_state(p.generator);
  offset_ = p.offset;
}

std::vector<int64_t> TextDataset::parse_source(const std::string& text) const {
  std::vector<int64_t> ids = tokenizer_ ? tokenizer_->encode(text, "the prompt") : vocab_.encode(text, "the prompt");
  ATTO_CHECK(!ids.empty(), "parse_source", "the prompt is empty");
  return ids;
}

}  // namespace attograd::data
