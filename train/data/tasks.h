#pragma once
// The built-in toy sequence tasks (copy, reverse, sort, add): one Dataset implementation (train/data/dataset.h) with
// its own seeded generator. Each model frames the examples itself (nn/sequence_model.h).

#include <string>
#include <vector>

#include "autograd/autograd.h"
#include "train/data/dataset.h"

namespace attograd::data {

/// Special tokens; digit d is token kFirstSymbol + d.
inline constexpr int64_t kPad = 0;          ///< padding (ignored by the loss, masked in attention)
inline constexpr int64_t kBos = 1;          ///< start of a target sequence
inline constexpr int64_t kEos = 2;          ///< end of a target sequence
inline constexpr int64_t kSep = 3;          ///< separates source and target in the LM framing
inline constexpr int64_t kPlus = 4;         ///< "+" in the add task
inline constexpr int64_t kFirstSymbol = 5;  ///< token of symbol 0
/// Label ignored by cross_entropy (PyTorch's default ignore_index).
inline constexpr int64_t kIgnore = -100;

/// The tasks. Add: src = a "+" b and tgt = a + b, numbers written least significant digit first.
enum class Task { Copy, Reverse, Sort, Add };

/// "copy", "reverse", "sort", "add".
std::string task_name(Task t);
/// Parses a task name; throws an Error listing the valid names.
Task parse_task(const std::string& name);

/// What to generate.
struct TaskOptions {
  Task task = Task::Reverse;  ///< which task
  int64_t min_len = 1;        ///< shortest source payload (digits per operand for add)
  int64_t max_len = 12;       ///< longest source payload (digits per operand for add)
  int64_t num_symbols = 10;   ///< payload alphabet size (digits 0..num_symbols-1)
};

/// Vocabulary size of a task's token space (specials + symbols).
int64_t vocab_size(const TaskOptions& opts);
/// Longest source sequence the options can produce.
int64_t max_src_len(const TaskOptions& opts);
/// Longest target sequence (without BOS/EOS) the options can produce.
int64_t max_tgt_len(const TaskOptions& opts);

/// Generates examples of a task from its own seeded generator; its state can be saved and restored.
class TaskDataset : public GeneratedDataset {
 public:
  /// Validates options (Error on min_len < 1, max_len < min_len, num_symbols < 2).
  TaskDataset(TaskOptions opts, uint64_t seed);
  /// Draws one example: uniform lengths in [min_len, max_len], uniform symbols, the task's target.
  Example generate(Generator& gen) const override;
  /// The task's name ("reverse", ...).
  std::string name() const override { return task_name(opts_.task); }
  /// vocab_size(options()).
  int64_t vocab_size() const override { return data::vocab_size(opts_); }
  /// max_src_len(options()).
  int64_t max_source_len() const override { return max_src_len(opts_); }
  /// max_tgt_len(options()).
  int64_t max_target_len() const override { return max_tgt_len(opts_); }
  /// Copy, reverse and sort (a target as long as its source); not add.
  bool aligned() const override { return opts_.task != Task::Add; }
  /// Digits as numbers, specials as <pad> <bos> <eos> <sep> +.
  std::string token_text(int64_t token) const override;
  /// "3 1 4" (and "+" for add) into symbol tokens (parse_symbols).
  std::vector<int64_t> parse_source(const std::string& text) const override;
  /// The options.
  const TaskOptions& options() const { return opts_; }

 private:
  TaskOptions opts_;
};

/// The target a task prescribes for a source.
std::vector<int64_t> solve(const TaskOptions& opts, const std::vector<int64_t>& src);
/// Token ids as text: digits as numbers, specials as <pad> <bos> <eos> <sep> +.
std::string tokens_to_string(const std::vector<int64_t>& tokens);
/// Parses "3 1 4" into symbol tokens; Error on anything that is not a symbol below num_symbols.
std::vector<int64_t> parse_symbols(const std::string& text, int64_t num_symbols);

}  // namespace attograd::data
