#pragma once
// The training loop (attograd::train): a configuration with JSON round trip, and a Trainer that trains any
// sequence model (nn/sequence_model.h) on any dataset (train/data/dataset.h): it owns the optimizer, the schedule and
// every random generator, steps, evaluates, logs per-step metrics and saves/restores bit-exact checkpoints.
// Trainer(config) builds the built-in task config.task and the registered model kind config.model; Trainer(config,
// dataset[, model]) trains a user's data (and a user's model: any registered kind, or a model built by hand).
//
// Randomness comes only from three generators the Trainer owns, all derived from config.seed:
//   "init"    draws the initial weights (used once, at construction, when the Trainer builds the model),
//   "dropout" draws every dropout mask (the model is pointed at it),
//   "data"    seeds the dataset's training stream (its position is saved in checkpoints).
// Held-out examples come from a fourth stream with a different seed, re-created for each evaluation (so the
// evaluation set is always the same first n held-out examples and evaluating never disturbs training).
// With the same config and build, two runs give bit-identical losses and weights, and a run resumed from a
// checkpoint continues bit-identically.

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "autograd/autocast.h"
#include "autograd/random.h"
#include "autograd/tensor.h"
#include "nn/sequence_model.h"
#include "train/data/dataset.h"
#include "train/data/tasks.h"
#include "train/decode.h"
#include "train/dist/communicator.h"
#include "train/optim/optimizers.h"
#include "train/optim/schedule.h"

namespace attograd::io {
struct Checkpoint;
}  // namespace attograd::io

namespace attograd::train {

/// The generator streams a Trainer derives from its seed (see derive_seed).
enum class Stream : uint64_t { Init = 0, Dropout = 1, Data = 2, Heldout = 3 };
/// The seed of one stream: a SplitMix64 hash of (seed, stream), so the streams of one seed are unrelated.
uint64_t derive_seed(uint64_t seed, Stream stream);

/// Limits TrainConfig::validate() enforces, so that a run ends in bounded time and memory (docs/CLI.md lists them).
inline constexpr int64_t kMaxThreads = 1024;           ///< threads (ATTOGRAD_NUM_THREADS has the same maximum)
inline constexpr int64_t kMaxSteps = 1'000'000'000;    ///< optimizer steps
inline constexpr int64_t kMaxSequenceLen = 256;        ///< max_len (greedy decoding costs about max_len^3)
inline constexpr int64_t kMaxSymbols = 1'000'000;      ///< num_symbols
inline constexpr int64_t kMaxEvalSize = 100'000'000;   ///< eval_size
inline constexpr int64_t kMaxModelSize = 1'000'000;    ///< layers, d_model, heads, d_ff and batch, each

/// A lower bound of what a built-in model ("lm", "seq2seq", "encoder") of a configuration needs, computed in
/// floating point (no overflow); zeros for another kind.
struct MemoryEstimate {
  double parameters = 0;   ///< parameters (at least)
  double model_bytes = 0;  ///< weights, gradients and optimizer state
  double batch_bytes = 0;  ///< activations and logits of one training batch
};

/// Everything that defines a training run (plain fields; to_json()/from_json() round-trip exactly).
/// With the defaults (only task and model changed) both models reach at least 99.9% exact-sequence accuracy on
/// 1,000 held-out sequences of copy, reverse and sort, lengths 1..12, in 1,500 steps; batch and steps are tuned for the
/// wall time to 99% on the default reverse task (docs/TRAINING.md, bench/time_to_accuracy).
struct TrainConfig {
  std::string task = "reverse";     ///< "copy", "reverse", "sort" or "add"; with a user's dataset, its label
  std::string model = "lm";         ///< a registered model kind: "lm" (decoder-only CausalLM), "seq2seq" (the seed's
                                    ///< encoder-decoder Transformer), "encoder" (EncoderTagger), or a user's
  int64_t layers = 2;               ///< blocks (lm, encoder) or encoder and decoder layers each (seq2seq)
  int64_t d_model = 64;             ///< model width
  int64_t heads = 4;                ///< attention heads; must divide d_model
  int64_t d_ff = 256;               ///< feed-forward hidden size
  double dropout = 0.0;             ///< every dropout probability, in [0, 1)
  int64_t min_len = 1;              ///< shortest source payload
  int64_t max_len = 12;             ///< longest source payload
  int64_t num_symbols = 10;         ///< payload alphabet size
  int64_t batch = 32;               ///< sequences per step
  int64_t steps = 1500;             ///< optimizer steps of train()
  std::string optimizer = "adamw";  ///< "adam", "adamw" or "sgd" (Adam/AdamW: betas (beta1, beta2), eps adam_eps)
  double lr = 5e-3;                 ///< peak learning rate; for "noam" the seed's lr_mul
  double weight_decay = 0.0;        ///< AdamW's decoupled decay, or the L2 term of Adam and SGD
  double momentum = 0.9;            ///< SGD momentum (ignored by Adam/AdamW)
  std::string schedule = "cosine";  ///< "noam", "cosine" (linear warm-up, cosine to min_lr), "constant", "step"
  int64_t warmup = 100;             ///< warm-up steps (noam, cosine; ignored by constant and step)
  // The optimizer's recipe (docs/TRAINING.md); each in JSON only when not its default, so that the configurations
  // and checkpoints from before these fields stay byte-identical.
  double beta1 = 0.9;               ///< Adam/AdamW: decay rate of the first moment, in [0, 1)
  double beta2 = 0.98;              ///< Adam/AdamW: decay rate of the second moment, in [0, 1) (the seed's 0.98)
  double adam_eps = 1e-9;           ///< Adam/AdamW: eps, > 0 (the seed's 1e-9)
  std::string decay = "all";        ///< which parameters weight_decay applies to: "all", or "matrices" (tensors of
                                    ///< two or more dimensions, nanoGPT's rule: two parameter groups)
  double min_lr = 0.0;              ///< cosine: the floor the cosine decays to, in [0, lr]
  int64_t decay_steps = 0;          ///< cosine: the step at which the cosine reaches min_lr (nanoGPT's
                                    ///< lr_decay_iters), in [warmup, steps]; min_lr after it; 0: steps
  std::string warmup_style = "from-zero";  ///< cosine: "from-zero" (lr * s / warmup after s steps: the first update
                                           ///< uses 0) or "nanogpt" (lr * (s + 1) / (warmup + 1): get_lr)
  double clip = 1.0;                ///< max total gradient 2-norm; 0 disables clipping
  double label_smoothing = 0.0;     ///< cross-entropy label smoothing in [0, 1)
  uint64_t seed = 1;                ///< seeds every generator (init, dropout, data, held-out)
  int64_t eval_every = 250;         ///< evaluate every this many steps in train(); 0: only at the end
  int64_t eval_size = 1000;         ///< held-out examples per evaluation
  int64_t threads = 1;              ///< threads of the engine's pool (set_num_threads); results depend on it
  std::string precision = "fp32";   ///< "fp32" or "bf16": the forward's matmuls, linears and attention under
                                    ///< Autocast (autograd/autocast.h; docs/CPU.md); in JSON only when not fp32
  int64_t grad_accum = 1;           ///< micro-batches per step and rank (batch stays the global batch; see
                                    ///< Trainer::set_communicator); in JSON only when not 1
  // The attention variant (nn::AttentionSpec, docs/ATTENTION.md); each in JSON only when not its default, so that
  // the configurations and checkpoints of the textbook model stay byte-identical.
  std::string attention = "mha";    ///< a registered attention kind (nn::register_attention): "mha", "gqa", "mla",
                                    ///< "local", "block-sparse", "linear" or a user's
  std::string attention_options = "";  ///< a user's kind's own options: a JSON object (nn::AttentionSpec::options)
  int64_t kv_heads = 0;             ///< gqa: key/value heads (divides heads, below it)
  int64_t kv_rank = 0;              ///< mla: kv_lora_rank (0 = d_model / 4)
  int64_t q_rank = 0;               ///< mla: q_lora_rank (0 = no query compression)
  int64_t window = 0;               ///< local: keys i - window < j <= i
  int64_t block = 0;                ///< block-sparse: block size of the BigBird layout
  bool rope = false;                ///< rotary position embeddings instead of the sinusoidal table
  bool checkpoint_activations = false;  ///< gradient checkpointing of every block but the last
  double entropy_reg = 0.0;         ///< lambda of the attention-entropy regulariser added to the training loss
                                    ///< (-lambda * mean row entropy; > 0 discourages over-concentrated heads)
  bool log_entropy = false;         ///< log the per-layer, per-head attention entropies without regularising
  // The model's recipe (nn::ArchitectureSpec, docs/TRAINING.md "The recipe"; the lm and encoder models take every
  // option (the encoder: positions other than rope), seq2seq none); each in JSON only when not its default, so that the textbook model's files stay
  // byte-identical.
  std::string positions = "sinusoidal";  ///< "sinusoidal", "learned" (GPT-2's wpe), "rope" (as rope) or "none"
  std::string activation = "relu";  ///< feed-forward: "relu", "gelu" (erf), "gelu-tanh" or "swiglu" (3 D d_ff weights)
  std::string norm = "layernorm";   ///< every norm: "layernorm" or "rmsnorm"
  double norm_eps = 0.0;            ///< every norm's eps; 0: the model's own (lm 1e-6, encoder 1e-5; nanoGPT's 1e-5)
  bool bias = true;                 ///< biases in every Linear and LayerNorm (false: --no-bias, nanoGPT's bias=False)
  std::string embed_scale = "sqrt"; ///< token embedding times sqrt(d_model) ("sqrt") or not ("none")
  std::string init = "default";     ///< initial weights: "default" (each module's own) or "gpt2"
  std::string head = "default";     ///< output head: "default" (the kind's own), "tied" or "untied"
  std::string recipe = "";          ///< the named recipe the options came from ("nanogpt"; --recipe), for summaries

  /// The configuration as a JSON object (every field, in declaration order; grad_accum, the attention, optimizer
  /// recipe and architecture fields only when not their defaults), indented
  /// by `indent` (-1: one line).
  std::string to_json(int indent = 2) const;
  /// Parses to_json()'s output; missing fields keep their defaults. Error naming the field on an unknown field
  /// or a value of the wrong type, and on invalid JSON. Does not validate() the values.
  static TrainConfig from_json(const std::string& text);
  /// Throws an Error naming the field and its value for any invalid value (unknown model kind, optimizer or
  /// schedule; non-positive sizes; heads not dividing d_model; probabilities out of range; ...). The task is
  /// checked when the Trainer builds the built-in dataset (Trainer(config)), not here.
  void validate() const;
  /// A lower bound of the run's memory (see MemoryEstimate), from the fields alone (the built-in task's token
  /// space: 5 + num_symbols tokens, sequences of 2 max_len + 1).
  MemoryEstimate estimate_memory() const;
  /// The same for the data actually trained on: `vocab` tokens (special tokens included) and sequences of `length`
  /// tokens (the Trainer passes its dataset's vocab_size() and longest model input).
  MemoryEstimate estimate_memory(int64_t vocab, int64_t length) const;
  /// Throws an Error saying how much memory the run needs when estimate_memory() exceeds this machine's physical
  /// memory (or the address-space limit, when one is set).
  void check_fits_in_memory() const;
  /// check_fits_in_memory() for estimate_memory(vocab, length); the Trainer checks it with its dataset's token
  /// space before building the model.
  void check_fits_in_memory(int64_t vocab, int64_t length) const;
  /// The attention fields as a spec (checkpoint_activations as AttentionSpec::checkpoint).
  nn::AttentionSpec attention_spec() const;
  /// The architecture fields (positions ... recipe) as a spec.
  nn::ArchitectureSpec architecture_spec() const;
  /// Sets every field of a named recipe: "default" (the defaults of the architecture and optimizer-recipe fields
  /// and recipe "") or "nanogpt" (nanoGPT's model.py and train.py: learned positions, gelu, no bias, norm_eps 1e-5,
  /// embed_scale none, init gpt2, head tied, decay matrices, weight_decay 0.1, betas (0.9, 0.95), adam_eps 1e-8,
  /// min_lr = lr / 10, warmup_style
  /// nanogpt, recipe "nanogpt"). Reads lr as it is (set it first). Error naming --recipe for another name.
  void apply_recipe(const std::string& name);
  /// Whether the Trainer tracks attention entropies (entropy_reg != 0 or log_entropy).
  bool tracks_entropy() const { return entropy_reg != 0 || log_entropy; }
  /// The step at which the cosine schedule reaches min_lr: decay_steps, or steps when it is 0.
  int64_t decay_end() const { return decay_steps > 0 ? decay_steps : steps; }
  /// The model-size fields as a spec (layers, d_model, heads, d_ff, dropout, attention_spec(),
  /// architecture_spec()); the token space comes from data.
  nn::ModelSpec model_sizes() const;
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
  double entropy = 0;      ///< when entropies are tracked: mean attention row entropy (nats) over layers, heads and
                           ///< the batch's real query rows (else 0)
  std::vector<double> entropies = {};  ///< when tracked: per layer and head (layer-major), the mean entropy over
                                       ///< the batch's real query rows (Trainer::entropy_columns() names them)
  bool evaluated = false;  ///< whether train() evaluated after this step (eval holds the result)
  EvalResult eval;         ///< the held-out evaluation after this step, when evaluated
  double train_loss = 0;   ///< when evaluated: the training-loss estimate (Trainer::estimate_train_loss; NaN in
                           ///< logs from before it)
};

/// Data-parallel options of a Trainer (see Trainer::set_communicator).
struct DistOptions {
  dist::ReduceOrder order = dist::ReduceOrder::Fixed;  ///< how the ranks' gradients are added
  int64_t hash_every = 100;  ///< compare the ranks' parameter hashes every this many steps (0: only at checkpoints)
  bool overlap = true;       ///< reduce gradients in buckets while the backward runs (else after it, at once)
  int64_t bucket_floats = 1 << 20;  ///< gradient floats per bucket when overlapping (4 MB)
};

/// Trains a sequence model on a dataset as configured. Not copyable or movable (the model points at the Trainer's
/// dropout generator).
class Trainer {
 public:
  /// Called after every step of train() (after its evaluation, if any).
  using StepCallback = std::function<void(const StepMetrics&)>;

  /// Validates the config, then builds the built-in task config.task (data::TaskDataset), the model of kind
  /// config.model (weights from the init generator), the optimizer and the schedule.
  explicit Trainer(const TrainConfig& config);
  /// Trains on a user's dataset (re-seeded from the config's "data" stream). Without a model, builds the
  /// registered kind config.model for the dataset's token space; with one (built by hand, any SequenceModel),
  /// trains it as it is. config.task and the task-length fields are then only labels.
  Trainer(const TrainConfig& config, std::shared_ptr<data::Dataset> dataset,
          std::shared_ptr<nn::SequenceModel> model = nullptr);
  /// Builds a Trainer from the metadata stored in a checkpoint (a built-in task, or a data file: re-read and checked
  /// against the saved data settings) and loads the checkpoint into it.
  static std::unique_ptr<Trainer> from_checkpoint(const std::string& path);
  ~Trainer();
  Trainer(const Trainer&) = delete;
  Trainer& operator=(const Trainer&) = delete;

  /// One optimizer step: zero_grad, next batch (config.batch examples framed by the model), forward,
  /// cross-entropy (ignore_index, label smoothing) plus, when config.entropy_reg != 0, the attention-entropy
  /// regulariser (the mean over the tracked layers of attention_entropy_loss(entropy, entropy_reg, real rows)),
  /// backward, clip, optimizer step, schedule step. The recorded loss is the cross-entropy alone. Appends the
  /// record to history(). Error if the loss is not finite.
  StepMetrics step();
  /// Steps until step_count() reaches config().steps, evaluating every eval_every steps and after the last
  /// step; calls on_step after each step.
  void train(const StepCallback& on_step = {});
  /// Greedy-decoding accuracy and loss on the first n held-out examples (n <= 0: config().eval_size).
  EvalResult evaluate(int64_t n = 0, const DecodeOptions& decode = {});
  /// nanoGPT's training-loss estimate beside the val loss: the teacher-forced loss (eval mode, no label smoothing,
  /// no decoding) on a fixed subset of the training split, the first n examples (n <= 0: config().eval_size; at
  /// most the data's held-out size, as the evaluation) of the training stream from the run's data seed, drawn once
  /// without moving the stream (no random stream is consumed: the run's weights do not change).
  double estimate_train_loss(int64_t n = 0);
  /// The evaluation before the first update (step 0: loss and train_loss hold the training-loss estimate, no
  /// update was taken), when train() made one (eval_every > 0) or a resumed log holds one.
  const std::optional<StepMetrics>& initial_evaluation() const { return initial_; }
  /// Examples per forward of an evaluation: a training micro-batch (config().batch / grad_accum, at least 1), at
  /// most 250, so that evaluating never holds more activations than a training step.
  int64_t eval_batch() const;
  /// The precision of the following steps, evaluations and predictions (Autocast around each; default: config's
  /// precision). Evaluating saved weights in another precision than they were trained in sets it.
  void set_precision(Precision p) { precision_ = p; }
  /// The precision set_precision() gave (config().precision until then).
  Precision precision() const { return precision_; }
  /// The decoded target for one source (tokens without specials), without the trailing EOS.
  std::vector<int64_t> predict(const std::vector<int64_t>& src, const DecodeOptions& decode = {});

  /// What a weights file or checkpoint of this run stores as metadata: run_metadata(config, dataset().describe()).
  std::string metadata() const;
  /// Saves weights, optimizer state, schedule position, every generator's state, the data position, the step
  /// count, the metrics so far and metadata() to `path`, atomically. With several ranks: collective; checks the
  /// replicas, and rank 0 alone writes.
  void save_checkpoint(const std::string& path);
  /// Restores a checkpoint saved by a Trainer with the same model, data and optimizer settings (Error
  /// naming any differing field, or saying that the data file's tokens differ); the run then continues
  /// bit-identically.
  void load_checkpoint(const std::string& path);

  // ---- Data-parallel training and gradient accumulation (docs/DISTRIBUTED.md) ----
  // With grad_accum K and N ranks, every rank draws the whole global batch of config.batch examples from the one
  // seeded stream and keeps its contiguous share (rank r: examples [r B/N, (r+1) B/N)), cut into K micro-batches
  // the same way; micro-batch j of the N K is forwarded with dropout drawn from a generator seeded by (seed, step,
  // j), its summed cross-entropy is divided by the global count of target tokens, and the micro-batch gradients are
  // added in order (the first a copy), then across ranks in rank order (ReduceOrder::Fixed). So N ranks give bit
  // for bit the weights of one process with grad_accum N, and within rounding those of one process with K = 1.
  // With entropy_reg, each micro-batch also adds its own regulariser (the mean over its real query rows) weighted
  // 1 / (N K), so N ranks still equal grad_accum N bit for bit (docs/TRAINING.md).

  /// Trains with the ranks of `comm` (collective: every rank calls it, before any other collective of the run).
  /// First the ranks agree on agreement_settings() (dist::agree_on_settings: fixed-size exchanges that do not
  /// depend on any option, so ranks that differ in how to communicate still meet). Errors, raised on every rank
  /// alike: "ranks disagree on --bucket-mb: rank 0 has 25, rank 2 has 4" (the first setting that differs, and every
  /// rank whose value is not rank 0's); then options out of range, config.batch not divisible by size() x grad_accum.
  void set_communicator(std::shared_ptr<dist::Communicator> comm, const DistOptions& options = {});
  /// What set_communicator compares, in order, each named by attograd train's flag for it: the build, the resumed
  /// checkpoint (--resume: none, or its step and an XXH64 of its contents), the data file (its format and XXH64 of
  /// its bytes, then --tokenize, --context, --val-fraction and the rest of its settings but the path), every
  /// TrainConfig field (--lr, --symbols, --grad-accum, ...), the model's kind and size, the DistOptions
  /// (--allreduce, --hash-every, --no-overlap, --bucket-mb), comm's protocol_settings(), and an XXH64 of the
  /// starting weights, optimizer state, generators and data position.
  std::vector<dist::Setting> agreement_settings(const dist::Communicator& comm, const DistOptions& options);
  /// The communicator (a SingleProcess unless set_communicator was called).
  dist::Communicator& communicator() { return *comm_; }
  /// XXH64 of every parameter's bytes, in named_parameters() order.
  uint64_t parameter_hash();
  /// Compares the ranks' parameter hashes (collective); Error on every rank naming the first rank whose parameters
  /// differ from rank 0's. step() calls it every hash_every steps, save_checkpoint() always.
  void check_replicas();

  /// Completed optimizer steps.
  int64_t step_count() const { return step_; }
  /// The configuration.
  const TrainConfig& config() const { return config_; }
  /// One record per step so far (restored from checkpoints).
  const std::vector<StepMetrics>& history() const { return history_; }
  /// The history as CSV: step,loss,lr,grad_norm,tokens,seconds,eval_n,eval_token_accuracy,eval_sequence_accuracy,
  /// eval_loss,val_loss,val_bpc,train_loss (eval columns empty when not evaluated; val_loss = eval_loss and val_bpc =
  /// eval_loss / ln 2 only for a stream model, whose evaluation is teacher-forced), then val_bpb (EvalResult::
  /// bits_per_byte) for a stream whose dataset knows its tokens' bytes (a text file), then, when entropies are
  /// tracked, entropy and one column per layer and head (entropy_columns()); numbers printed to round-trip exactly.
  std::string metrics_csv() const;
  /// The per-layer, per-head entropy columns of metrics.csv ("entropy.layer0.h0", ...; from the model's
  /// AttentionEntropy labels); empty until a step tracked entropies (or a checkpoint with them was loaded).
  const std::vector<std::string>& entropy_columns() const { return entropy_columns_; }
  /// Writes metrics_csv() to a file.
  void write_metrics_csv(const std::string& path) const;

  /// The model.
  nn::SequenceModel& model() { return *model_; }
  /// The optimizer.
  optim::Optimizer& optimizer() { return *optimizer_; }
  /// The learning-rate schedule.
  optim::LRScheduler& scheduler() { return *scheduler_; }
  /// The dataset.
  data::Dataset& dataset() { return *data_; }
  /// The first n held-out examples (the same every call).
  std::vector<data::Example> heldout_examples(int64_t n) const;
  /// The generator that drew the initial weights.
  Generator& init_generator() { return init_gen_; }
  /// The generator every dropout mask is drawn from.
  Generator& dropout_generator() { return dropout_gen_; }

 private:
  // The model, optimizer state, generators and counters as a checkpoint (no metadata, lr or metrics): what
  // save_checkpoint() writes and what the ranks' agreement hashes.
  io::Checkpoint training_state() const;
  void build_optimizer();
  StepMetrics accumulated_step();  // step() with grad_accum > 1 or several ranks
  // The regulariser of the last forward (undefined when entropy_reg is 0), scaled by `scale`; adds the per-head
  // entropy sums and real-row counts of the last forward to sums/counts (layer-major) and sets entropy_columns_.
  Tensor entropy_term(double scale, std::vector<double>& sums, std::vector<double>& counts);
  // Fills m.entropies and m.entropy from per-head sums and counts.
  static void finish_entropy(StepMetrics& m, const std::vector<double>& sums, const std::vector<double>& counts);
  std::vector<std::string> entropy_columns_;

  std::shared_ptr<dist::Communicator> comm_ = std::make_shared<dist::SingleProcess>();
  DistOptions dist_;
  // The checkpoint load_checkpoint() read last (path empty: none), for agreement_settings().
  std::string resumed_path_;
  int64_t resumed_step_ = 0;
  uint64_t resumed_digest_ = 0;
  std::vector<float> flat_grad_;  // the accumulated gradients of accumulated_step(), every parameter in turn

  TrainConfig config_;
  Precision precision_ = Precision::float32;
  Generator init_gen_;
  Generator dropout_gen_;
  std::shared_ptr<data::Dataset> data_;
  uint64_t heldout_seed_;
  std::shared_ptr<nn::SequenceModel> model_;
  std::unique_ptr<optim::Optimizer> optimizer_;
  std::unique_ptr<optim::LRScheduler> scheduler_;
  int64_t step_ = 0;
  std::vector<StepMetrics> history_;
  std::optional<StepMetrics> initial_;          // the evaluation at step 0 (initial_evaluation())
  std::vector<data::Example> train_subset_;    // estimate_train_loss's examples, drawn once
};

/// The built-in task a config names (config.task with its lengths and symbols), seeded from the config's data
/// stream. Error listing the tasks when config.task is not one.
std::shared_ptr<data::TaskDataset> task_dataset(const TrainConfig& config);

/// What a training run stores as a file's metadata. For data a TrainConfig describes (a built-in task): the
/// config's JSON alone (as before file datasets); with data settings (Dataset::describe(), a data::DataSpec):
/// {"attograd_config": config JSON, "attograd_data": data JSON}, both as strings (safetensors' convention).
std::string run_metadata(const TrainConfig& config, const std::string& data = {});
/// A run's metadata parsed back.
struct RunMetadata {
  TrainConfig config;   ///< the configuration
  std::string data;     ///< the data settings (JSON), empty for a built-in task
};
/// Parses run_metadata()'s output (or safetensors metadata with an "attograd_config"); Error naming `origin` when
/// there is no configuration.
RunMetadata parse_run_metadata(const std::string& metadata, const std::string& origin);
/// The dataset a run's metadata describes: the built-in task of the config, or the data file (re-read, checked
/// against the saved settings; with read_file false, only its token space, from the saved vocabulary).
std::shared_ptr<data::Dataset> run_dataset(const RunMetadata& run, bool read_file = true);

/// Parses Trainer::metrics_csv() back into records (Error naming the line on malformed input); files without the
/// entropy columns, without val_bpb (bits_per_byte 0), without train_loss (train_loss NaN), or with only the first 10
/// columns (before val_loss) still parse. A row of step 0 is the evaluation before the first update (Trainer::initial_evaluation()). `entropy_columns`, when given,
/// receives the per-layer, per-head entropy column names.
std::vector<StepMetrics> parse_metrics_csv(const std::string& csv,
                                           std::vector<std::string>* entropy_columns = nullptr);

}  // namespace attograd::train
