#pragma once
// A sequence task of one's own (attograd::data): a UTF-8 file of `source<TAB>target` lines, one example per line,
// tokenised by character (default) or by whitespace-separated word, with a vocabulary built from the file
// (train/data/text.h). Empty lines are skipped; every other line must hold exactly one tab, a non-empty source and
// target, each at most kMaxContext tokens (errors name the line). A fixed pseudo-random val_fraction of the lines
// (at least one; the same permutation on every machine) is held out; training examples are drawn uniformly from the
// other lines by the seeded stream.

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "train/data/text.h"

namespace attograd::data {

/// One parsed line of a pairs file.
struct PairLine {
  int64_t line = 0;  ///< 1-based line number in the file
  Example example;   ///< its tokens
};

/// Parses pairs text (see the file comment) with `vocab`, or, when `vocab` is null, with a vocabulary built from
/// the text and returned through `built`. Errors name `origin` and the line.
std::vector<PairLine> parse_pairs(const std::string& text, const std::string& origin, Tokenize tokenize,
                                  const Vocabulary* vocab, Vocabulary* built = nullptr,
                                  int64_t max_vocab = kMaxVocabulary);

/// Examples of `source<TAB>target` lines (see the file comment).
class PairsDataset : public Dataset {
 public:
  /// Reads spec.path (see open_data); spec.format must be "pairs".
  explicit PairsDataset(const DataSpec& spec, bool read_file = true);
  /// The file's name.
  std::string name() const override;
  /// Restarts the stream.
  void seed(uint64_t seed) override;
  /// A random training line.
  Example next() override;
  /// The first n held-out lines (fewer when there are fewer); the seed is not used.
  std::vector<Example> heldout(int64_t n, uint64_t seed) const override;
  /// The held-out pairs.
  int64_t heldout_size() const override { return val_size(); }
  /// The stream's position.
  DataPosition position() const override { return {gen_.get_state(), offset_}; }
  /// Restores position().
  void set_position(const DataPosition& p) override;
  /// The vocabulary's size.
  int64_t vocab_size() const override { return vocab_.size(); }
  /// The longest source in the file.
  int64_t max_source_len() const override { return spec_.max_source_len; }
  /// The longest target in the file.
  int64_t max_target_len() const override { return spec_.max_target_len; }
  /// Whether every target has its source's length.
  bool aligned() const override { return aligned_; }
  /// The token's text.
  std::string token_text(int64_t token) const override { return vocab_.token(token); }
  /// Characters concatenated, or words joined by spaces.
  std::string to_text(const std::vector<int64_t>& tokens) const override { return vocab_.decode(tokens); }
  /// Raw source text as ids (Error naming a token outside the vocabulary).
  std::vector<int64_t> parse_source(const std::string& text) const override;
  /// The spec with the vocabulary, lengths and hash filled in.
  std::string describe() const override { return spec_.to_json(); }
  /// The spec with the vocabulary, lengths and hash filled in.
  const DataSpec& spec() const { return spec_; }
  /// The vocabulary.
  const Vocabulary& vocabulary() const { return vocab_; }
  /// Training lines.
  int64_t train_size() const { return static_cast<int64_t>(train_.size()); }
  /// Held-out lines.
  int64_t val_size() const { return static_cast<int64_t>(val_.size()); }

 private:
  DataSpec spec_;
  Vocabulary vocab_;
  std::vector<Example> train_, val_;
  bool aligned_ = false;
  Generator gen_;
  int64_t offset_ = 0;
};

}  // namespace attograd::data
