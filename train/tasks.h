#pragma once
// Toy sequence tasks (copy, reverse, sort, add) with their own seeded generator, in the two
// framings the models use: source/target pairs for the encoder-decoder Transformer, and one
// "src SEP tgt" sequence with the loss on the target part only for the decoder-only model.

#include <string>
#include <vector>

#include "autograd/autograd.h"

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

/// One example as token ids (no specials).
struct Example {
  std::vector<int64_t> src;  ///< source tokens
  std::vector<int64_t> tgt;  ///< target tokens
};

/// Encoder-decoder batch.
struct Seq2SeqBatch {
  Tensor src;      ///< (B, S) Int64, right-padded with kPad
  Tensor tgt_in;   ///< (B, T) Int64: kBos then the target, padded
  Tensor tgt_out;  ///< (B, T) Int64: the target then kEos, padded with kIgnore
  std::vector<Example> examples;  ///< the examples, for decoding and accuracy
};

/// Decoder-only batch: input = src SEP tgt EOS (shifted), loss only where the next token is target.
struct LMBatch {
  Tensor input;   ///< (B, L) Int64: src SEP tgt, right-padded with kPad
  Tensor target;  ///< (B, L) Int64: next token where it belongs to tgt or is the final EOS, else kIgnore
  std::vector<Example> examples;  ///< the examples
};

/// Generates examples of a task from its own seeded generator; its state can be saved and restored.
class TaskDataset {
 public:
  /// Validates options (Error on min_len < 1, max_len < min_len, num_symbols < 2).
  TaskDataset(TaskOptions opts, uint64_t seed);
  /// The next example.
  Example next_example();
  /// The next batch in the encoder-decoder framing.
  Seq2SeqBatch next_seq2seq(int64_t batch_size);
  /// The next batch in the decoder-only framing.
  LMBatch next_lm(int64_t batch_size);
  /// The options.
  const TaskOptions& options() const { return opts_; }
  /// The generator (its state is the data position).
  Generator& generator() { return gen_; }

 private:
  TaskOptions opts_;
  Generator gen_;
};

/// The target a task prescribes for a source.
std::vector<int64_t> solve(const TaskOptions& opts, const std::vector<int64_t>& src);
/// Builds an encoder-decoder batch from examples.
Seq2SeqBatch make_seq2seq_batch(const std::vector<Example>& examples);
/// Builds a decoder-only batch from examples.
LMBatch make_lm_batch(const std::vector<Example>& examples);
/// Token ids as text: digits as numbers, specials as <pad> <bos> <eos> <sep> +.
std::string tokens_to_string(const std::vector<int64_t>& tokens);
/// Parses "3 1 4" into symbol tokens; Error on anything that is not a symbol below num_symbols.
std::vector<int64_t> parse_symbols(const std::string& text, int64_t num_symbols);

}  // namespace attograd::data
