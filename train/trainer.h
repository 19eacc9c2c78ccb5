#pragma once
// The training loop for the toy tasks (attograd::train): a configuration with JSON round trip, and a Trainer
// that owns the data, the model, the optimizer, the schedule and every random generator, steps, evaluates,
// logs per-step metrics and saves/restores bit-exact checkpoints.
//
// Randomness comes only from three generators the Trainer owns, all derived from config.seed:
//   "init"    draws the initial weights (used once, at construction),
//   "dropout" draws every dropout mask (the model is pointed at it),
//   "data"    is the training TaskDataset's generator.
// Held-out examples come from a fourth stream with a different seed, re-created for each evaluation (so the
// evaluation set is always the same first n held-out examples and evaluating never disturbs training).
// With the same config and build, two runs give bit-identical losses and weights, and a run resumed from a
// checkpoint continues bit-identically.

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "autograd/random.h"
#include "autograd/tensor.h"
#include "nn/models.h"
#include "train/decode.h"
#include "train/optim.h"
#include "train/schedule.h"
#include "train/tasks.h"

namespace attograd::train {

/// The generator streams a Trainer derives from its seed (see derive_seed).
enum class Stream : uint64_t { Init = 0, Dropout = 1, Data = 2, Heldout = 3 };
/// The seed of one stream: a SplitMix64 hash of (seed, stream), so the streams of one seed are unrelated.
uint64_t derive_seed(uint64_t seed, Stream stream);

/// Everything that defines a training run (plain fields; to_json()/from_json() round-trip exactly).
/// With the defaults (only task and model changed) both models reach 100% exact-sequence accuracy on 1,000
/// held-out sequences of copy, reverse and sort, lengths 1..12, in 1,000 steps (docs/TRAINING.md).
struct TrainConfig {
  std::string task = "reverse";     ///< "copy", "reverse", "sort" or "add"
  std::string model = "lm";         ///< "lm" (decoder-only CausalLM) or "seq2seq" (encoder-decoder Transformer)
  int64_t layers = 2;               ///< blocks (lm) or encoder and decoder layers each (seq2seq)
  int64_t d_model = 64;             ///< model width
  int64_t heads = 4;                ///< attention heads; must divide d_model
  int64_t d_ff = 256;               ///< feed-forward hidden size
  double dropout = 0.0;             ///< every dropout probability, in [0, 1)
  int64_t min_len = 1;              ///< shortest source payload
  int64_t max_len = 12;             ///< longest source payload
  int64_t num_symbols = 10;         ///< payload alphabet size
  int64_t batch = 64;               ///< sequences per step
  int64_t steps = 1000;             ///< optimizer steps of train()
  std::string optimizer = "adamw";  ///< "adam", "adamw" or "sgd" (Adam/AdamW: betas (0.9, 0.98), eps 1e-9)
  double lr = 5e-3;                 ///< peak learning rate; for "noam" the seed's lr_mul
  double weight_decay = 0.0;        ///< AdamW's decoupled decay, or the L2 term of Adam and SGD
  double momentum = 0.9;            ///< SGD momentum (ignored by Adam/AdamW)
  std::string schedule = "cosine";  ///< "noam", "cosine" (linear warm-up, cosine to 0), "constant", "step"
  int64_t warmup = 100;             ///< warm-up steps (noam, cosine; ignored by constant and step)
  double clip = 1.0;                ///< max total gradient 2-norm; 0 disables clipping
  double label_smoothing = 0.0;     ///< cross-entropy label smoothing in [0, 1)
  uint64_t seed = 1;                ///< seeds every generator (init, dropout, data, held-out)
  int64_t eval_every = 250;         ///< evaluate every this many steps in train(); 0: only at the end
  int64_t eval_size = 1000;         ///< held-out examples per evaluation
  int64_t threads = 1;              ///< threads of the engine's pool (set_num_threads); results depend on it

  /// The configuration as a JSON object (every field, in declaration order), indented by `indent` (-1: one line).
  std::string to_json(int indent = 2) const;
  /// Parses to_json()'s output; missing fields keep their defaults. Error naming the field on an unknown field
  /// or a value of the wrong type, and on invalid JSON. Does not validate() the values.
  static TrainConfig from_json(const std::string& text);
  /// Throws an Error naming the field and its value for any invalid value (unknown task, model, optimizer or
  /// schedule; non-positive sizes; heads not dividing d_model; probabilities out of range; ...).
  void validate() const;
  /// Field-wise equality.
  bool operator==(const TrainConfig&) const = default;
};

/// What one optimizer step did.
struct StepMetrics {
  int64_t step = 0;        ///< the step's number, counted from 1
  double loss = 0;         ///< training loss of the batch (label-smoothed cross-entropy per target token)
  double lr = 0;           ///< learning rate the step used
  double grad_norm = 0;    ///< total gradient 2-norm before clipping
  int64_t tokens = 0;      ///< target tokens in the batch (positions that carry loss)
  double seconds = 0;      ///< wall time of the step
  bool evaluated = false;  ///< whether train() evaluated after this step (eval holds the result)
  EvalResult eval;         ///< the held-out evaluation after this step, when evaluated
};

/// Trains a toy-task model as configured. Not copyable or movable (the model points at the Trainer's
/// dropout generator).
class Trainer {
 public:
  /// Called after every step of train() (after its evaluation, if any).
  using StepCallback = std::function<void(const StepMetrics&)>;

  /// Validates the config, then builds the datasets, the model (weights from the init generator), the
  /// optimizer and the schedule.
  explicit Trainer(const TrainConfig& config);
  /// Builds a Trainer from the config stored in a checkpoint and loads the checkpoint into it.
  static std::unique_ptr<Trainer> from_checkpoint(const std::string& path);
  ~Trainer();
  Trainer(const Trainer&) = delete;
  Trainer& operator=(const Trainer&) = delete;

  /// One optimizer step: zero_grad, next batch, forward, cross-entropy (ignore_index, label smoothing),
  /// backward, clip, optimizer step, schedule step. Appends the record to history(). Error if the loss is
  /// not finite.
  StepMetrics step();
  /// Steps until step_count() reaches config().steps, evaluating every eval_every steps and after the last
  /// step; calls on_step after each step.
  void train(const StepCallback& on_step = {});
  /// Greedy-decoding accuracy and loss on the first n held-out examples (n <= 0: config().eval_size).
  EvalResult evaluate(int64_t n = 0);
  /// The decoded target for one source (symbol tokens), without the trailing EOS.
  std::vector<int64_t> predict(const std::vector<int64_t>& src);

  /// Saves weights, optimizer state, schedule position, every generator's state, the step count, the
  /// metrics so far and the config (as metadata) to `path`, atomically.
  void save_checkpoint(const std::string& path);
  /// Restores a checkpoint saved by a Trainer with the same model, data and optimizer settings (Error
  /// naming any differing field); the run then continues bit-identically.
  void load_checkpoint(const std::string& path);

  /// Completed optimizer steps.
  int64_t step_count() const { return step_; }
  /// The configuration.
  const TrainConfig& config() const { return config_; }
  /// One record per step so far (restored from checkpoints).
  const std::vector<StepMetrics>& history() const { return history_; }
  /// The history as CSV: step,loss,lr,grad_norm,tokens,seconds,eval_token_accuracy,eval_sequence_accuracy,
  /// eval_loss (eval columns empty when not evaluated); numbers printed to round-trip exactly.
  std::string metrics_csv() const;
  /// Writes metrics_csv() to a file.
  void write_metrics_csv(const std::string& path) const;

  /// The model (a Transformer or a CausalLM).
  nn::Module& model();
  /// The encoder-decoder, or null when config().model is "lm".
  nn::Transformer* transformer() { return transformer_.get(); }
  /// The decoder-only model, or null when config().model is "seq2seq".
  nn::CausalLM* causal_lm() { return causal_lm_.get(); }
  /// The optimizer.
  optim::Optimizer& optimizer() { return *optimizer_; }
  /// The learning-rate schedule.
  optim::LRScheduler& scheduler() { return *scheduler_; }
  /// The task options derived from the config.
  const data::TaskOptions& task_options() const { return task_; }
  /// The training data stream.
  data::TaskDataset& train_data() { return train_data_; }
  /// The first n held-out examples (the same every call).
  std::vector<data::Example> heldout_examples(int64_t n) const;
  /// The generator that drew the initial weights.
  Generator& init_generator() { return init_gen_; }
  /// The generator every dropout mask is drawn from.
  Generator& dropout_generator() { return dropout_gen_; }

 private:
  TrainConfig config_;
  data::TaskOptions task_;
  Generator init_gen_;
  Generator dropout_gen_;
  data::TaskDataset train_data_;
  uint64_t heldout_seed_;
  std::shared_ptr<nn::Transformer> transformer_;
  std::shared_ptr<nn::CausalLM> causal_lm_;
  std::unique_ptr<optim::Optimizer> optimizer_;
  std::unique_ptr<optim::LRScheduler> scheduler_;
  int64_t step_ = 0;
  std::vector<StepMetrics> history_;
};

/// Parses Trainer::metrics_csv() back into records (Error naming the line on malformed input).
std::vector<StepMetrics> parse_metrics_csv(const std::string& csv);

}  // namespace attograd::train
