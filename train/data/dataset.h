#pragma once
// The data interface (attograd::data): what Trainer knows of its data. A Dataset is a seeded, resumable stream of
// training examples plus a fixed held-out set, and describes its token space (vocabulary size, the longest source
// and target, the special tokens) so that a model can be built for it. The built-in toy tasks (train/data/tasks.h) are
// one implementation; a user's task is another (examples/custom_task.cpp).
//
// Most synthetic tasks only need to say how to draw one example from a generator: derive from GeneratedDataset and
// implement generate(). Its held-out examples come from a separate seed, drawn afresh for each evaluation, so the
// evaluation set is always the same and evaluating never disturbs training.

#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "autograd/random.h"
#include "nn/sequence_model.h"

namespace attograd::data {

/// One example: source and target tokens without specials.
using nn::Example;
/// Token rows, one per sequence.
using nn::TokenRows;

/// Where a dataset's training stream stands (saved in checkpoints).
struct DataPosition {
  GeneratorState generator = {};  ///< the stream's generator
  int64_t offset = 0;             ///< examples drawn since the stream was seeded
  /// Field-wise equality.
  bool operator==(const DataPosition&) const = default;
};

/// A seeded, resumable source of examples (see the file comment).
class Dataset {
 public:
  virtual ~Dataset() = default;
  /// A short name for logs and reports ("reverse", "my-task").
  virtual std::string name() const = 0;
  /// Restarts the training stream from `seed` (Trainer passes the seed of its "data" stream).
  virtual void seed(uint64_t seed) = 0;
  /// The next training example.
  virtual Example next() = 0;
  /// The first n held-out examples for `seed` (the same every call; disjoint in purpose from training).
  virtual std::vector<Example> heldout(int64_t n, uint64_t seed) const = 0;
  /// The most examples heldout() gives, whatever n (default: no limit, as a generated set; a file's held-out part
  /// is finite, and 0 for a dataset opened without its file).
  virtual int64_t heldout_size() const { return std::numeric_limits<int64_t>::max(); }
  /// The training stream's position.
  virtual DataPosition position() const = 0;
  /// Continues the training stream from a position returned by position().
  virtual void set_position(const DataPosition& position) = 0;

  /// Vocabulary size (special tokens included).
  virtual int64_t vocab_size() const = 0;
  /// Longest source the stream produces.
  virtual int64_t max_source_len() const = 0;
  /// Longest target the stream produces (without EOS).
  virtual int64_t max_target_len() const = 0;
  /// Whether every target has its source's length (a per-position tagger can learn it).
  virtual bool aligned() const { return false; }
  /// Whether the data is one text stream to model (ModelSpec::stream; default false).
  virtual bool stream() const { return false; }
  /// The settings to save beside a model trained on this data, as JSON (data::DataSpec for a file); empty (the
  /// default) for data that a TrainConfig alone describes.
  virtual std::string describe() const { return {}; }
  /// Reserved token ids (the built-in tasks' by default).
  virtual nn::SpecialTokens special_tokens() const { return {}; }
  /// A token as text (default: its id).
  virtual std::string token_text(int64_t token) const;
  /// Tokens as text (default: token_text of each, separated by spaces).
  virtual std::string to_text(const std::vector<int64_t>& tokens) const;
  /// Parses a source typed by a user (default: token ids separated by spaces; Error naming a bad word).
  virtual std::vector<int64_t> parse_source(const std::string& text) const;
  /// The UTF-8 bytes of the text a token stands for, for val bits per byte (default 0: unknown, no bits per byte;
  /// a text file's tokens know theirs, the reserved ids have 0).
  virtual int64_t token_bytes(int64_t /*token*/) const { return 0; }
  /// The model spec for this data: sizes from `base` (layers, d_model, heads, d_ff, dropout), the token space and
  /// stream() from the dataset.
  nn::ModelSpec model_spec(const nn::ModelSpec& base) const;
};

/// A Dataset whose examples are drawn one at a time from a generator: implement generate() and the token space.
class GeneratedDataset : public Dataset {
 public:
  /// Seeds the training stream.
  explicit GeneratedDataset(uint64_t seed = 0) : gen_(seed) {}
  /// Draws one example from `gen`.
  virtual Example generate(Generator& gen) const = 0;

  /// Re-seeds the training stream.
  void seed(uint64_t seed) override;
  /// generate() from the training stream.
  Example next() override;
  /// n examples generated from a fresh generator seeded with `seed`.
  std::vector<Example> heldout(int64_t n, uint64_t seed) const override;
  /// The generator's state and the examples drawn.
  DataPosition position() const override { return {gen_.get_state(), offset_}; }
  /// Restores position().
  void set_position(const DataPosition& p) override;
  /// The training stream's generator.
  Generator& generator() { return gen_; }

 private:
  Generator gen_;
  int64_t offset_ = 0;
};

}  // namespace attograd::data
