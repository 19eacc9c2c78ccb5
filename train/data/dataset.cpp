// The data interface's shared parts and GeneratedDataset.

#include "train/data/dataset.h"

#include <cstdlib>
#include <sstream>

namespace attograd::data {

std::string Dataset::token_text(int64_t token) const { return std::to_string(token); }

std::string Dataset::to_text(const std::vector<int64_t>& tokens) const {
  std::string s;
  for (size_t i = 0; i < tokens.size(); ++i) s += (i ? " " : "") + token_text(tokens[i]);
  return s;
}

std::vector<int64_t> Dataset::parse_source(const std::string& text) const {
  std::istringstream is(text);
  std::vector<int64_t> out;
  std::string w;
  const int64_t vocab = vocab_size();
  while (is >> w) {
    char* end = nullptr;
    const long long v = std::strtoll(w.c_str(), &end, 10);
    ATTO_CHECK(end && *end == '\0' && v >= 0 && v < vocab, "parse_source", "'", w,
               "' is not a token id (expected an integer in [0, ", vocab, "))");
    out.push_back(v);
  }
  ATTO_CHECK(!out.empty(), "parse_source", "no tokens in '", text, "'");
  return out;
}

nn::ModelSpec Dataset::model_spec(const nn::ModelSpec& base) const {
  nn::ModelSpec s = base;
  s.vocab = vocab_size();
  s.max_source_len = max_source_len();
  s.max_target_len = max_target_len();
  s.aligned = aligned();
  s.specials = special_tokens();
  s.stream = stream();
  return s;
}

void GeneratedDataset::seed(uint64_t seed) {
  gen_.manual_seed(seed);
  offset_ = 0;
}

Example GeneratedDataset::next() {
  ++offset_;
  return generate(gen_);
}

std::vector<Example> GeneratedDataset::heldout(int64_t n, uint64_t seed) const {
  ATTO_CHECK(n >= 1, name(), "held-out example count must be >= 1, got ", n);
  Generator g(seed);
  std::vector<Example> ex;
  ex.reserve(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) ex.push_back(generate(g));
  return ex;
}

void GeneratedDataset::set_position(const DataPosition& p) {
  ATTO_CHECK(p.offset >= 0, name(), "data position offset must be >= 0, got ", p.offset);
  gen_.set_state(p.generator);
  offset_ = p.offset;
}

}  // namespace attograd::data
