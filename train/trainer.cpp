// The toy-task training loop: config validation and JSON, the Trainer's step/train/evaluate, and bit-exact
// checkpoints through train/io/serialize.h.

#include "train/trainer.h"

#include "autograd/parallel.h"

#include <nlohmann/json.hpp>

#include <sys/resource.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <limits>
#include <sstream>
#include <type_traits>

#include "autograd/loss.h"
#include "autograd/shape.h"
#include "train/data/text.h"
#include "train/io/serialize.h"

namespace attograd::train {

namespace {

using json = nlohmann::ordered_json;
constexpr const char* kConfig = "TrainConfig";

// Calls f(name, field) for every TrainConfig field, in declaration order (the JSON order).
template <class C, class F>
void for_each_field(C& c, F&& f) {
  f("task", c.task);
  f("model", c.model);
  f("layers", c.layers);
  f("d_model", c.d_model);
  f("heads", c.heads);
  f("d_ff", c.d_ff);
  f("dropout", c.dropout);
  f("min_len", c.min_len);
  f("max_len", c.max_len);
  f("num_symbols", c.num_symbols);
  f("batch", c.batch);
  f("steps", c.steps);
  f("optimizer", c.optimizer);
  f("lr", c.lr);
  f("weight_decay", c.weight_decay);
  f("momentum", c.momentum);
  f("schedule", c.schedule);
  f("warmup", c.warmup);
  f("clip", c.clip);
  f("label_smoothing", c.label_smoothing);
  f("seed", c.seed);
  f("eval_every", c.eval_every);
  f("eval_size", c.eval_size);
  f("threads", c.threads);
}

// A JSON value for an error message: its text, cut to 60 characters (the input is the user's, of any size).
std::string excerpt(const json& v) {
  std::string s = v.dump();
  if (s.size() > 60) s = s.substr(0, 57) + "...";
  return s;
}

// A key for an error message, cut likewise.
std::string excerpt(const std::string& key, size_t max = 60) {
  return key.size() > max ? key.substr(0, max - 3) + "..." : key;
}

// Stores JSON value v into a field, checking its type; errors name the field.
template <class T>
void read_field(const json& v, const std::string& name, T& out) {
  if constexpr (std::is_same_v<T, std::string>) {
    ATTO_CHECK(v.is_string(), kConfig, "field \"", name, "\" must be a string, got ", excerpt(v));
    out = v.get<std::string>();
  } else if constexpr (std::is_same_v<T, double>) {
    ATTO_CHECK(v.is_number(), kConfig, "field \"", name, "\" must be a number, got ", excerpt(v));
    out = v.get<double>();
  } else if constexpr (std::is_same_v<T, uint64_t>) {
    ATTO_CHECK(v.is_number_unsigned(), kConfig, "field \"", name, "\" must be a non-negative integer, got ",
               excerpt(v));
    out = v.get<uint64_t>();
  } else {
    static_assert(std::is_same_v<T, int64_t>);
    ATTO_CHECK(v.is_number_integer() &&
                   (!v.is_number_unsigned() ||
                    v.get<uint64_t>() <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max())),
               kConfig, "field \"", name, "\" must be an integer, got ", excerpt(v));
    out = v.get<int64_t>();
  }
}

bool one_of(const std::string& v, std::initializer_list<const char*> options) {
  for (const char* o : options)
    if (v == o) return true;
  return false;
}

// A number printed so that strtod reads back the same double.
std::string exact(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.17g", v);
  return buf;
}

constexpr const char* kCsvHeader =
    "step,loss,lr,grad_norm,tokens,seconds,eval_n,eval_token_accuracy,eval_sequence_accuracy,eval_loss,val_loss,"
    "val_bpc";
// The header before the val_loss and val_bpc columns (still read).
constexpr const char* kCsvHeaderV1 =
    "step,loss,lr,grad_norm,tokens,seconds,eval_n,eval_token_accuracy,eval_sequence_accuracy,eval_loss";

}  // namespace

static_assert(data::kMaxContext == kMaxSequenceLen, "a data file's lengths share the configuration's limit");

uint64_t derive_seed(uint64_t seed, Stream stream) {
  // SplitMix64 (Steele, Lea and Flood) of seed advanced by (stream + 1) golden-ratio increments.
  uint64_t z = seed + 0x9E3779B97F4A7C15ull * (static_cast<uint64_t>(stream) + 1);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// ---------------------------------------------------------------------------------------------
// TrainConfig

std::string TrainConfig::to_json(int indent) const {
  json j = json::object();
  for_each_field(*this, [&](const char* name, const auto& v) { j[name] = v; });
  return j.dump(indent);
}

TrainConfig TrainConfig::from_json(const std::string& text) {
  io::check_json_depth(text, kConfig, "the configuration");  // before parsing: messages below dump parts of it
  json j;
  try {
    j = json::parse(text);
  } catch (const json::exception& e) {
    throw Error(kConfig, str_cat("invalid JSON: ", excerpt(std::string(e.what()), 240)));
  }
  ATTO_CHECK(j.is_object(), kConfig, "JSON must be an object, got ", excerpt(j));
  TrainConfig c;
  for (const auto& item : j.items()) {
    // No structured bindings here: clang before 16 cannot capture them in the lambda below.
    const std::string& key = item.key();
    const json& value = item.value();
    bool known = false;
    for_each_field(c, [&](const char* name, auto& field) {
      if (key != name) return;
      read_field(value, key, field);
      known = true;
    });
    ATTO_CHECK(known, kConfig, "unknown field \"", excerpt(key), "\"");
  }
  return c;
}

void TrainConfig::validate() const {
  if (!nn::has_model(model)) {
    std::string kinds;
    for (const auto& [kind, _] : nn::registered_models()) kinds += (kinds.empty() ? "" : ", ") + kind;
    throw Error(kConfig, str_cat("model must be a registered kind (", kinds, "), got \"", excerpt(model), "\""));
  }
  ATTO_CHECK(one_of(optimizer, {"adam", "adamw", "sgd"}), kConfig, "optimizer must be adam, adamw or sgd, got \"",
             excerpt(optimizer), "\"");
  ATTO_CHECK(one_of(schedule, {"noam", "cosine", "constant", "step"}), kConfig,
             "schedule must be noam, cosine, constant or step, got \"", excerpt(schedule), "\"");
  auto positive = [](int64_t v, const char* name) {
    ATTO_CHECK(v > 0, kConfig, name, " must be positive, got ", v);
  };
  positive(layers, "layers");
  positive(d_model, "d_model");
  positive(heads, "heads");
  positive(d_ff, "d_ff");
  positive(min_len, "min_len");
  positive(max_len, "max_len");
  positive(batch, "batch");
  positive(steps, "steps");
  positive(eval_size, "eval_size");
  positive(threads, "threads");
  auto at_most = [](int64_t v, int64_t max, const char* name) {
    ATTO_CHECK(v <= max, kConfig, name, " must be at most ", max, ", got ", v);
  };
  at_most(layers, kMaxModelSize, "layers");
  at_most(d_model, kMaxModelSize, "d_model");
  at_most(heads, kMaxModelSize, "heads");
  at_most(d_ff, kMaxModelSize, "d_ff");
  at_most(batch, kMaxModelSize, "batch");
  at_most(max_len, kMaxSequenceLen, "max_len");
  at_most(num_symbols, kMaxSymbols, "num_symbols");
  at_most(steps, kMaxSteps, "steps");
  at_most(eval_size, kMaxEvalSize, "eval_size");
  at_most(threads, kMaxThreads, "threads");
  ATTO_CHECK(d_model % heads == 0, kConfig, "heads (", heads, ") must divide d_model (", d_model, ")");
  ATTO_CHECK(max_len >= min_len, kConfig, "max_len (", max_len, ") must be >= min_len (", min_len, ")");
  ATTO_CHECK(num_symbols >= 2, kConfig, "num_symbols must be >= 2, got ", num_symbols);
  ATTO_CHECK(dropout >= 0 && dropout < 1, kConfig, "dropout must be in [0, 1), got ", dropout);
  ATTO_CHECK(std::isfinite(lr) && lr > 0, kConfig, "lr must be positive, got ", lr);
  ATTO_CHECK(std::isfinite(weight_decay) && weight_decay >= 0, kConfig, "weight_decay must be >= 0, got ",
             weight_decay);
  ATTO_CHECK(momentum >= 0 && momentum < 1, kConfig, "momentum must be in [0, 1), got ", momentum);
  ATTO_CHECK(warmup >= 0, kConfig, "warmup must be >= 0, got ", warmup);
  ATTO_CHECK(schedule != "noam" || warmup >= 1, kConfig, "warmup must be >= 1 for the noam schedule, got ", warmup);
  ATTO_CHECK(schedule != "cosine" || warmup <= steps, kConfig, "warmup (", warmup,
             ") must not exceed steps (", steps, ") for the cosine schedule");
  ATTO_CHECK(std::isfinite(clip) && clip >= 0, kConfig, "clip must be >= 0 (0 disables), got ", clip);
  ATTO_CHECK(label_smoothing >= 0 && label_smoothing < 1, kConfig, "label_smoothing must be in [0, 1), got ",
             label_smoothing);
  ATTO_CHECK(eval_every >= 0, kConfig, "eval_every must be >= 0 (0: only at the end), got ", eval_every);
}

MemoryEstimate TrainConfig::estimate_memory() const {
  MemoryEstimate e;
  if (!one_of(model, {"lm", "seq2seq", "encoder"})) return e;
  const double d = static_cast<double>(d_model), ff = static_cast<double>(d_ff), h = static_cast<double>(heads);
  const double n_layers = static_cast<double>(layers) * (model == "seq2seq" ? 2 : 1);
  const double vocab = 5 + static_cast<double>(num_symbols);
  const double len = 2 * static_cast<double>(max_len) + 1;  // at least the source and the target
  // Each block: attention projections (4 d^2) and the feed-forward layers (2 d d_ff); one embedding table.
  e.parameters = n_layers * (4 * d * d + 2 * d * ff) + vocab * d;
  const double copies = optimizer != "sgd" ? 4 : momentum > 0 ? 3 : 2;  // weights, gradients, optimizer state
  e.model_bytes = e.parameters * 4 * copies;
  // Saved per token and block: the feed-forward hidden layer, a few d_model-wide values, the attention rows; the
  // logits and their gradient per token.
  e.batch_bytes = static_cast<double>(batch) * len * (n_layers * (ff + 4 * d + h * len) + 2 * vocab) * 4;
  return e;
}

namespace {

std::string gigabytes(double bytes) { return str_cat(std::round(bytes / 1e8) / 10, " GB"); }

// Physical memory, or the address-space limit when lower (0 when unknown).
double available_memory() {
  double bytes = 0;
  const long pages = ::sysconf(_SC_PHYS_PAGES), page = ::sysconf(_SC_PAGE_SIZE);
  if (pages > 0 && page > 0) bytes = static_cast<double>(pages) * static_cast<double>(page);
  rlimit lim{};
  if (::getrlimit(RLIMIT_AS, &lim) == 0 && lim.rlim_cur != RLIM_INFINITY) {
    const double as = static_cast<double>(lim.rlim_cur);
    bytes = bytes > 0 ? std::min(bytes, as) : as;
  }
  return bytes;
}

}  // namespace

void TrainConfig::check_fits_in_memory() const {
  const MemoryEstimate e = estimate_memory();
  const double have = available_memory();
  if (have <= 0 || e.model_bytes + e.batch_bytes <= have) return;
  throw Error(kConfig, str_cat("the run needs at least ", gigabytes(e.model_bytes + e.batch_bytes), " of memory (",
                           gigabytes(e.model_bytes), " for ", std::llround(e.parameters),
                           " parameters with their gradients and optimizer state, ", gigabytes(e.batch_bytes),
                           " for a batch of ", batch, " sequences), more than the ", gigabytes(have),
                           " available; reduce d_model, d_ff, layers or batch"));
}

nn::ModelSpec TrainConfig::model_sizes() const {
  return {.layers = layers, .d_model = d_model, .heads = heads, .d_ff = d_ff, .dropout = dropout};
}

// ---------------------------------------------------------------------------------------------
// Trainer: construction

namespace {

const TrainConfig& validated(const TrainConfig& c) {
  c.validate();
  return c;
}

}  // namespace

std::shared_ptr<data::TaskDataset> task_dataset(const TrainConfig& c) {
  ATTO_CHECK(one_of(c.task, {"copy", "reverse", "sort", "add"}), kConfig,
             "task must be copy, reverse, sort or add, got \"", excerpt(c.task), "\"");
  return std::make_shared<data::TaskDataset>(
      data::TaskOptions{
          .task = data::parse_task(c.task), .min_len = c.min_len, .max_len = c.max_len, .num_symbols = c.num_symbols},
      derive_seed(c.seed, Stream::Data));
}

Trainer::Trainer(const TrainConfig& config) : Trainer(validated(config), task_dataset(config)) {}

Trainer::Trainer(const TrainConfig& config, std::shared_ptr<data::Dataset> dataset,
                 std::shared_ptr<nn::SequenceModel> model)
    : config_(validated(config)),
      init_gen_(derive_seed(config_.seed, Stream::Init)),
      dropout_gen_(derive_seed(config_.seed, Stream::Dropout)),
      data_(std::move(dataset)),
      heldout_seed_(derive_seed(config_.seed, Stream::Heldout)),
      model_(std::move(model)) {
  ATTO_CHECK(data_ != nullptr, "Trainer", "no dataset given");
  data_->seed(derive_seed(config_.seed, Stream::Data));
  set_num_threads(static_cast<int>(config_.threads));  // the engine's pool (autograd/parallel.h)
  if (!model_) {
    config_.check_fits_in_memory();
    model_ = nn::make_model(config_.model, data_->model_spec(config_.model_sizes()), init_gen_);
  }
  ATTO_CHECK(model_->vocab_size() >= data_->vocab_size(), "Trainer", "the model's vocabulary (",
             model_->vocab_size(), ") is smaller than the dataset's (", data_->vocab_size(), ")");
  model_->set_generator(dropout_gen_);
  build_optimizer();
}

void Trainer::build_optimizer() {
  const TrainConfig& c = config_;
  optim::NamedTensors params = model_->named_parameters();
  const std::pair<double, double> betas{0.9, 0.98};
  if (c.optimizer == "adam")
    optimizer_ = std::make_unique<optim::Adam>(
        params, optim::AdamOptions{.lr = c.lr, .betas = betas, .eps = 1e-9, .weight_decay = c.weight_decay});
  else if (c.optimizer == "adamw")
    optimizer_ = std::make_unique<optim::AdamW>(
        params, optim::AdamWOptions{.lr = c.lr, .betas = betas, .eps = 1e-9, .weight_decay = c.weight_decay});
  else
    optimizer_ = std::make_unique<optim::SGD>(
        params, optim::SGDOptions{.lr = c.lr, .momentum = c.momentum, .weight_decay = c.weight_decay});

  if (c.schedule == "noam")
    scheduler_ = std::make_unique<optim::NoamLR>(*optimizer_, c.lr, c.d_model, c.warmup);
  else if (c.schedule == "cosine")
    scheduler_ = std::make_unique<optim::WarmupCosine>(*optimizer_, c.warmup, c.steps);
  else if (c.schedule == "constant")
    scheduler_ = std::make_unique<optim::ConstantLR>(*optimizer_);
  else
    scheduler_ = std::make_unique<optim::StepLR>(*optimizer_, std::max<int64_t>(1, c.steps / 3), 0.1);
}

Trainer::~Trainer() = default;

// ---------------------------------------------------------------------------------------------
// Trainer: the loop

StepMetrics Trainer::step() {
  const auto start = std::chrono::steady_clock::now();
  model().train();
  optimizer_->zero_grad();

  std::vector<data::Example> examples;
  examples.reserve(static_cast<size_t>(config_.batch));
  for (int64_t i = 0; i < config_.batch; ++i) examples.push_back(data_->next());
  const nn::SequenceBatch b = model_->make_batch(examples);
  const int64_t ignore = model_->special_tokens().ignore_index;
  const Tensor logits = model_->forward_batch(b);  // (B, T, V)
  const Tensor& target = b.target;                 // (B, T)
  const Tensor loss = cross_entropy(reshape(logits, {-1, logits.size(-1)}), reshape(target, {-1}),
                                    {.ignore_index = ignore, .label_smoothing = config_.label_smoothing});

  StepMetrics m;
  m.step = step_ + 1;
  m.loss = loss.item();
  m.lr = optimizer_->lr();
  ATTO_CHECK(std::isfinite(m.loss), "Trainer", "loss is not finite (", m.loss, ") at step ", m.step);
  loss.backward();
  const double max_norm = config_.clip > 0 ? config_.clip : std::numeric_limits<double>::infinity();
  m.grad_norm = optim::clip_grad_norm_(optimizer_->params(), max_norm);
  optimizer_->step();
  scheduler_->step();
  ++step_;

  const int64_t* t = target.data<int64_t>();
  for (int64_t i = 0; i < target.numel(); ++i) m.tokens += t[i] != ignore;
  m.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  history_.push_back(m);
  return m;
}

void Trainer::train(const StepCallback& on_step) {
  while (step_ < config_.steps) {
    StepMetrics m = step();
    const bool last = step_ == config_.steps;
    if (last || (config_.eval_every > 0 && step_ % config_.eval_every == 0)) {
      m.eval = evaluate();
      m.evaluated = true;
      history_.back() = m;
    }
    if (on_step) on_step(m);
  }
}

std::vector<data::Example> Trainer::heldout_examples(int64_t n) const {
  ATTO_CHECK(n >= 1, "Trainer", "held-out example count must be >= 1, got ", n);
  return data_->heldout(n, heldout_seed_);
}

EvalResult Trainer::evaluate(int64_t n) {
  constexpr int64_t kEvalBatch = 250;
  {
    // The held-out examples are drawn at once: two token rows each, with their vector headers.
    const int64_t count = n > 0 ? n : config_.eval_size;
    const double bytes = static_cast<double>(count) *
                         (16.0 * static_cast<double>(data_->max_source_len() + data_->max_target_len()) + 128);
    const double have = available_memory();
    ATTO_CHECK(have <= 0 || bytes <= have / 2, "evaluate", count, " held-out examples need about ", gigabytes(bytes),
               " of memory, more than half of the ", gigabytes(have), " available; evaluate fewer");
  }
  return train::evaluate(*model_, heldout_examples(n > 0 ? n : config_.eval_size), kEvalBatch);
}

std::vector<int64_t> Trainer::predict(const std::vector<int64_t>& src) {
  const char* me = "predict";
  const int64_t longest = model_->spec().max_source_len;
  ATTO_CHECK(!src.empty() && static_cast<int64_t>(src.size()) <= longest, me, "source length must be in [1, ",
             longest, "], got ", src.size());
  const int64_t vocab = model_->vocab_size();
  for (int64_t t : src) ATTO_CHECK(t >= 0 && t < vocab, me, "token ", t, " outside [0, ", vocab, ")");
  const int64_t budget = std::min(model_->spec().max_target_len + 1, model_->max_decode_len());
  return strip_eos(greedy_decode(*model_, {src}, budget)[0], model_->special_tokens().eos);
}

// ---------------------------------------------------------------------------------------------
// Metrics log

std::string Trainer::metrics_csv() const {
  const bool stream = model_->spec().stream;
  std::string s = std::string(kCsvHeader) + "\n";
  for (const StepMetrics& m : history_) {
    s += str_cat(m.step, ",", exact(m.loss), ",", exact(m.lr), ",", exact(m.grad_norm), ",", m.tokens, ",",
             exact(m.seconds));
    if (m.evaluated)
      s += str_cat(",", m.eval.n, ",", exact(m.eval.token_accuracy), ",", exact(m.eval.sequence_accuracy), ",",
               exact(m.eval.loss));
    else
      s += ",,,,";
    if (m.evaluated && stream)
      s += str_cat(",", exact(m.eval.loss), ",", exact(m.eval.loss / std::log(2.0)));
    else
      s += ",,";
    s += "\n";
  }
  return s;
}

void Trainer::write_metrics_csv(const std::string& path) const {
  // Atomically, as the weights: a temporary file next to it, fsync'ed and renamed; errors name errno.
  const std::string csv = metrics_csv();
  io::detail::AtomicFile f(path, "write_metrics_csv");
  f.write(csv.data(), csv.size());
  f.commit();
}

std::vector<StepMetrics> parse_metrics_csv(const std::string& csv) {
  const char* me = "parse_metrics_csv";
  std::istringstream in(csv);
  std::string line;
  ATTO_CHECK(std::getline(in, line) && (line == kCsvHeader || line == kCsvHeaderV1), me,
             "line 1 must be the header \"", kCsvHeader, "\", got \"", line, "\"");
  const size_t fields = line == kCsvHeader ? 12 : 10;
  std::vector<StepMetrics> out;
  for (int64_t line_no = 2; std::getline(in, line); ++line_no) {
    if (line.empty()) continue;
    std::vector<std::string> f;
    std::stringstream ls(line);
    for (std::string cell; std::getline(ls, cell, ',');) f.push_back(cell);
    if (!line.empty() && line.back() == ',') f.emplace_back();
    ATTO_CHECK(f.size() == fields, me, "line ", line_no, " has ", f.size(), " fields, expected ", fields);
    auto num = [&](size_t i) {
      char* end = nullptr;
      const double v = std::strtod(f[i].c_str(), &end);
      ATTO_CHECK(!f[i].empty() && end && *end == '\0', me, "line ", line_no, " field ", i + 1, ": '", f[i],
                 "' is not a number");
      return v;
    };
    auto integer = [&](size_t i) {
      char* end = nullptr;
      const long long v = std::strtoll(f[i].c_str(), &end, 10);
      ATTO_CHECK(!f[i].empty() && end && *end == '\0', me, "line ", line_no, " field ", i + 1, ": '", f[i],
                 "' is not an integer");
      return static_cast<int64_t>(v);
    };
    StepMetrics m;
    m.step = integer(0);
    m.loss = num(1);
    m.lr = num(2);
    m.grad_norm = num(3);
    m.tokens = integer(4);
    m.seconds = num(5);
    m.evaluated = !f[6].empty();
    if (m.evaluated) m.eval = {.token_accuracy = num(7), .sequence_accuracy = num(8), .loss = num(9), .n = integer(6)};
    out.push_back(m);
  }
  return out;
}

// ---------------------------------------------------------------------------------------------
// Checkpoints

void Trainer::save_checkpoint(const std::string& path) {
  io::Checkpoint ck;
  ck.metadata_json = metadata();
  io::add_module_state(ck, *model_, "model.");
  io::add_optimizer_state(ck, *optimizer_, "optim.");
  ck.generators.emplace_back("init", init_gen_.get_state());
  ck.generators.emplace_back("dropout", dropout_gen_.get_state());
  const data::DataPosition position = data_->position();
  ck.generators.emplace_back("data", position.generator);
  ck.counters.emplace_back("step", step_);
  ck.counters.emplace_back("data.offset", position.offset);
  ck.counters.emplace_back("schedule.step_count", scheduler_->step_count());
  ck.scalars.emplace_back("lr", optimizer_->lr());
  ck.metrics_csv = metrics_csv();
  io::save_checkpoint(ck, path);
}

void Trainer::load_checkpoint(const std::string& path) {
  const char* me = "load_checkpoint";
  const io::Checkpoint ck = io::load_checkpoint(path);
  const RunMetadata run = parse_run_metadata(ck.metadata_json, "'" + path + "'");
  const TrainConfig& saved = run.config;
  {
    // A data file's tokens and lengths fix the model's shapes and what the data position means.
    const std::string mine = data_->describe();
    ATTO_CHECK(run.data.empty() == mine.empty(), me, "'", path, "' was saved ",
               run.data.empty() ? "for a built-in task" : "for a data file", ", this trainer trains ",
               mine.empty() ? "a built-in task" : "on a data file");
    if (!mine.empty()) {
      const data::DataSpec a = data::DataSpec::from_json(mine), b = data::DataSpec::from_json(run.data);
      ATTO_CHECK(a.format == b.format && a.vocabulary == b.vocabulary && a.max_source_len == b.max_source_len &&
                     a.max_target_len == b.max_target_len && a.file_hash == b.file_hash,
                 me, "'", path, "' was saved for another data file (", b.format, " '", b.path, "' of ",
                 b.vocabulary.size(), " tokens), this trainer reads ", a.format, " '", a.path, "' of ",
                 a.vocabulary.size(), " tokens");
    }
  }
  // Fields that fix the shapes of the weights, the optimizer state and the data must agree.
  auto same = [&](const char* name, const auto& mine, const auto& theirs) {
    ATTO_CHECK(mine == theirs, me, "'", path, "' was saved with ", name, " = ", theirs, ", this trainer has ", name,
               " = ", mine);
  };
  same("task", config_.task, saved.task);
  same("model", config_.model, saved.model);
  same("layers", config_.layers, saved.layers);
  same("d_model", config_.d_model, saved.d_model);
  same("heads", config_.heads, saved.heads);
  same("d_ff", config_.d_ff, saved.d_ff);
  same("min_len", config_.min_len, saved.min_len);
  same("max_len", config_.max_len, saved.max_len);
  same("num_symbols", config_.num_symbols, saved.num_symbols);
  same("optimizer", config_.optimizer, saved.optimizer);

  // Read everything before changing anything.
  std::vector<StepMetrics> history = parse_metrics_csv(ck.metrics_csv);
  const GeneratorState init = ck.generator("init"), dropout = ck.generator("dropout");
  data::DataPosition position{.generator = ck.generator("data")};
  for (const auto& [name, value] : ck.counters)  // absent in checkpoints from before the data interface
    if (name == "data.offset") position.offset = value;
  const int64_t step = ck.counter("step"), schedule_steps = ck.counter("schedule.step_count");
  ATTO_CHECK(step >= 0 && schedule_steps >= 0, me, "'", path, "' has negative step counts (step ", step,
             ", schedule.step_count ", schedule_steps, ")");

  io::load_module_state(ck, *model_, "model.", true);
  io::load_optimizer_state(ck, *optimizer_, "optim.");
  scheduler_->set_step_count(schedule_steps);
  init_gen_.set_state(init);
  dropout_gen_.set_state(dropout);
  data_->set_position(position);
  step_ = step;
  history_ = std::move(history);
}

std::string Trainer::metadata() const { return run_metadata(config_, data_->describe()); }

std::string run_metadata(const TrainConfig& config, const std::string& data) {
  if (data.empty()) return config.to_json();
  json j = json::object();
  j["attograd_config"] = config.to_json(-1);
  j["attograd_data"] = data;
  return j.dump(2);
}

RunMetadata parse_run_metadata(const std::string& metadata, const std::string& origin) {
  const json j = json::parse(metadata, nullptr, false);
  RunMetadata r;
  if (j.is_object() && j.contains("task") && j.contains("model")) {
    r.config = TrainConfig::from_json(metadata);
    return r;
  }
  ATTO_CHECK(j.is_object() && j.contains("attograd_config") && j["attograd_config"].is_string(), "load", origin,
             " has no training configuration in its metadata (write weights with `attograd train` or "
             "`attograd import --config`)");
  r.config = TrainConfig::from_json(j["attograd_config"].get<std::string>());
  if (j.contains("attograd_data")) {
    ATTO_CHECK(j["attograd_data"].is_string(), "load", origin, ": metadata \"attograd_data\" must be a string");
    r.data = j["attograd_data"].get<std::string>();
  }
  return r;
}

std::shared_ptr<data::Dataset> run_dataset(const RunMetadata& run, bool read_file) {
  if (run.data.empty()) return task_dataset(run.config);
  return data::open_data(data::DataSpec::from_json(run.data), read_file);
}

std::unique_ptr<Trainer> Trainer::from_checkpoint(const std::string& path) {
  const io::Checkpoint ck = io::load_checkpoint(path);
  const RunMetadata run = parse_run_metadata(ck.metadata_json, "'" + path + "'");
  auto t = std::make_unique<Trainer>(run.config, run_dataset(run));
  t->load_checkpoint(path);
  return t;
}

}  // namespace attograd::train
