// The toy-task training loop: config validation and JSON, the Trainer's step/train/evaluate, and bit-exact
// checkpoints through train/io/serialize.h.

#include "train/trainer.h"

#include "autograd/parallel.h"

#include <nlohmann/json.hpp>

#include <sys/resource.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <limits>
#include <optional>
#include <sstream>
#include <string_view>
#include <type_traits>

#include "autograd/hooks.h"
#include "autograd/loss.h"
#include "autograd/shape.h"
#include "nn/attention_layer.h"
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
  f("beta1", c.beta1);
  f("beta2", c.beta2);
  f("adam_eps", c.adam_eps);
  f("decay", c.decay);
  f("min_lr", c.min_lr);
  f("decay_steps", c.decay_steps);
  f("warmup_style", c.warmup_style);
  f("clip", c.clip);
  f("label_smoothing", c.label_smoothing);
  f("seed", c.seed);
  f("eval_every", c.eval_every);
  f("eval_size", c.eval_size);
  f("threads", c.threads);
  f("precision", c.precision);
  f("grad_accum", c.grad_accum);
  f("attention", c.attention);
  f("kv_heads", c.kv_heads);
  f("kv_rank", c.kv_rank);
  f("q_rank", c.q_rank);
  f("window", c.window);
  f("block", c.block);
  f("attention_options", c.attention_options);
  f("rope", c.rope);
  f("checkpoint_activations", c.checkpoint_activations);
  f("entropy_reg", c.entropy_reg);
  f("log_entropy", c.log_entropy);
  f("positions", c.positions);
  f("activation", c.activation);
  f("norm", c.norm);
  f("norm_eps", c.norm_eps);
  f("bias", c.bias);
  f("embed_scale", c.embed_scale);
  f("init", c.init);
  f("head", c.head);
  f("recipe", c.recipe);
}

// The fields written only when they differ from the default (so that older configurations read and hash as before).
constexpr const char* kOptionalFields[] = {
    "precision", "grad_accum", "attention", "kv_heads", "kv_rank", "q_rank", "window", "block", "attention_options",
    "rope", "checkpoint_activations", "entropy_reg", "log_entropy",
    // the optimizer's recipe
    "beta1", "beta2", "adam_eps", "decay", "min_lr", "decay_steps", "warmup_style",
    // the architecture's recipe
    "positions", "activation", "norm", "norm_eps", "bias", "embed_scale", "init", "head", "recipe"};

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
  } else if constexpr (std::is_same_v<T, bool>) {
    ATTO_CHECK(v.is_boolean(), kConfig, "field \"", name, "\" must be true or false, got ", excerpt(v));
    out = v.get<bool>();
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
// The header since the training-loss estimate (written); kCsvHeader, before it, is still read.
constexpr const char* kCsvHeaderV3 =
    "step,loss,lr,grad_norm,tokens,seconds,eval_n,eval_token_accuracy,eval_sequence_accuracy,eval_loss,val_loss,"
    "val_bpc,train_loss";
// The header of a text's run, whose tokens know their bytes: val_bpb, the val loss in bits per byte, too.
constexpr const char* kCsvHeaderV4 =
    "step,loss,lr,grad_norm,tokens,seconds,eval_n,eval_token_accuracy,eval_sequence_accuracy,eval_loss,val_loss,"
    "val_bpc,train_loss,val_bpb";
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
  // A single-process, textbook-attention config reads (and hashes) as before.
  const TrainConfig defaults;
  for (const char* name : kOptionalFields) {
    bool is_default = false;
    for_each_field(defaults, [&](const char* n, const auto& v) {
      if (std::string_view(n) == name) is_default = j[name] == json(v);
    });
    if (is_default) j.erase(name);
  }
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

namespace {

// The optimizer-recipe fields (beta1 ... warmup_style): each error names the field and its flag. A field that the
// configured optimizer or schedule does not use is an error when it is not its default.
void validate_optimizer_recipe(const TrainConfig& c) {
  const TrainConfig d;
  ATTO_CHECK(c.beta1 >= 0 && c.beta1 < 1, kConfig, "beta1 (--beta1) must be in [0, 1), got ", c.beta1);
  ATTO_CHECK(c.beta2 >= 0 && c.beta2 < 1, kConfig, "beta2 (--beta2) must be in [0, 1), got ", c.beta2);
  ATTO_CHECK(std::isfinite(c.adam_eps) && c.adam_eps > 0, kConfig, "adam_eps (--adam-eps) must be > 0, got ",
             c.adam_eps);
  if (c.optimizer == "sgd") {
    const char* set = c.beta1 != d.beta1         ? "beta1 (--beta1)"
                      : c.beta2 != d.beta2       ? "beta2 (--beta2)"
                      : c.adam_eps != d.adam_eps ? "adam_eps (--adam-eps)"
                                                 : nullptr;
    ATTO_CHECK(!set, kConfig, set, " applies to the adam and adamw optimizers, not sgd");
  }
  ATTO_CHECK(one_of(c.decay, {"all", "matrices"}), kConfig, "decay (--decay) must be all or matrices, got \"",
             excerpt(c.decay), "\"");
  ATTO_CHECK(one_of(c.warmup_style, {"from-zero", "nanogpt"}), kConfig,
             "warmup_style (--warmup-style) must be from-zero or nanogpt, got \"", excerpt(c.warmup_style), "\"");
  ATTO_CHECK(std::isfinite(c.min_lr) && c.min_lr >= 0 && c.min_lr <= c.lr, kConfig,
             "min_lr (--min-lr) must be in [0, lr] = [0, ", c.lr, "], got ", c.min_lr);
  ATTO_CHECK(c.decay_steps >= 0, kConfig, "decay_steps (--decay-steps) must be >= 0 (0: steps), got ", c.decay_steps);
  ATTO_CHECK(c.decay_steps <= c.steps, kConfig, "decay_steps (--decay-steps) must not exceed steps (", c.steps,
             "), got ", c.decay_steps);
  if (c.schedule != "cosine") {
    const char* set = c.min_lr != d.min_lr               ? "min_lr (--min-lr)"
                      : c.decay_steps != d.decay_steps   ? "decay_steps (--decay-steps)"
                      : c.warmup_style != d.warmup_style ? "warmup_style (--warmup-style)"
                                                         : nullptr;
    ATTO_CHECK(!set, kConfig, set, " applies to the cosine schedule, not ", excerpt(c.schedule));
  } else {
    ATTO_CHECK(c.decay_steps == 0 || c.decay_steps >= c.warmup, kConfig,
               "decay_steps (--decay-steps) must be >= ", "warmup (", c.warmup, "), got ", c.decay_steps);
  }
}

// The architecture fields (positions ... head), with the flag of each: every error names both.
struct ArchitectureField {
  const char* name;
  const char* flag;
};
constexpr ArchitectureField kArchitectureFields[] = {
    {"positions", "--positions"},     {"activation", "--activation"}, {"norm", "--norm"},
    {"norm_eps", "--norm-eps"},       {"bias", "--no-bias"},          {"embed_scale", "--embed-scale"},
    {"init", "--init"},               {"head", "--head"}};

void validate_architecture(const TrainConfig& c) {
  auto check = [](const std::string& v, const char* what, std::initializer_list<const char*> options) {
    std::string list;
    for (const char* o : options) list += (list.empty() ? "" : ", ") + std::string(o);
    ATTO_CHECK(one_of(v, options), kConfig, what, " must be one of ", list, ", got \"", excerpt(v), "\"");
  };
  check(c.positions, "positions (--positions)", {"sinusoidal", "learned", "rope", "none"});
  check(c.activation, "activation (--activation)", {"relu", "gelu", "gelu-tanh", "swiglu"});
  check(c.norm, "norm (--norm)", {"layernorm", "rmsnorm"});
  check(c.embed_scale, "embed_scale (--embed-scale)", {"sqrt", "none"});
  check(c.init, "init (--init)", {"default", "gpt2"});
  check(c.head, "head (--head)", {"default", "tied", "untied"});
  ATTO_CHECK(std::isfinite(c.norm_eps) && c.norm_eps >= 0, kConfig,
             "norm_eps (--norm-eps) must be finite and > 0 (or 0: the model's own), got ", c.norm_eps);
  ATTO_CHECK(!c.rope || one_of(c.positions, {"sinusoidal", "rope"}), kConfig,
             "rope (--rope) is --positions rope; it cannot be combined with positions (--positions) \"", c.positions,
             "\"");
  ATTO_CHECK(c.model != "encoder" || (c.positions != "rope" && !c.rope), kConfig,
             "positions (--positions) rope: the encoder model's positions are sinusoidal, learned or none");
  // The seq2seq model keeps its own recipe: the first option that differs, named by its flag.
  if (c.model == "seq2seq") {
    const std::vector<std::string> d = c.architecture_spec().differences();
    if (!d.empty()) {
      const std::string name = d.front().substr(0, d.front().find('='));
      const char* flag = "";
      for (const ArchitectureField& f : kArchitectureFields)
        if (name == f.name) flag = f.flag;
      ATTO_CHECK(false, kConfig, name, " (", flag, ") = ", d.front().substr(name.size() + 1),
                 c.recipe.empty() ? "" : " (from --recipe " + c.recipe + ")",
                 " applies to the lm and encoder models; model seq2seq keeps the paper's recipe and takes no "
                 "architecture option");
    }
  }
}

}  // namespace

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
  validate_optimizer_recipe(*this);
  ATTO_CHECK(one_of(precision, {"fp32", "bf16"}), kConfig, "precision (--precision) must be fp32 or bf16, got \"",
             excerpt(precision), "\"");
  ATTO_CHECK(std::isfinite(clip) && clip >= 0, kConfig, "clip must be >= 0 (0 disables), got ", clip);
  ATTO_CHECK(label_smoothing >= 0 && label_smoothing < 1, kConfig, "label_smoothing must be in [0, 1), got ",
             label_smoothing);
  ATTO_CHECK(eval_every >= 0, kConfig, "eval_every must be >= 0 (0: only at the end), got ", eval_every);
  positive(grad_accum, "grad_accum");
  ATTO_CHECK(batch % grad_accum == 0, kConfig, "batch (", batch, ") must be divisible by grad_accum (", grad_accum,
             ")");
  // The attention variant: AttentionSpec's checks name the field (kv_heads, window, ...) and the kind it applies to.
  // Which model kinds support which variant is the model's to say (an Error when the Trainer builds it).
  attention_spec().validate(heads);
  ATTO_CHECK(std::isfinite(entropy_reg), kConfig, "entropy_reg must be finite, got ", entropy_reg);
  validate_architecture(*this);
}

nn::ArchitectureSpec TrainConfig::architecture_spec() const {
  return {.positions = positions,
          .activation = activation,
          .norm = norm,
          .norm_eps = norm_eps,
          .bias = bias,
          .embed_scale = embed_scale,
          .init = init,
          .head = head,
          .recipe = recipe};
}

void TrainConfig::apply_recipe(const std::string& name) {
  ATTO_CHECK(one_of(name, {"default", "nanogpt"}), kConfig, "recipe (--recipe) must be default or nanogpt, got \"",
             excerpt(name), "\"");
  const TrainConfig d;
  const nn::ArchitectureSpec a;
  positions = a.positions, activation = a.activation, norm = a.norm, norm_eps = a.norm_eps, bias = a.bias;
  embed_scale = a.embed_scale, init = a.init, head = a.head, recipe = "";
  beta1 = d.beta1, beta2 = d.beta2, decay = d.decay, min_lr = d.min_lr, warmup_style = d.warmup_style;
  weight_decay = d.weight_decay, adam_eps = d.adam_eps;
  if (name == "default") return;
  // nanoGPT's model.py (GPTConfig with bias=False, as its README's CPU run and shakespeare_char's config use;
  // nn.GELU(), LayerNorm(eps 1e-5), wte without a scale tied to lm_head, _init_weights) and train.py
  // (configure_optimizers' two groups, weight_decay 1e-1, betas (0.9, 0.95) and torch.optim.AdamW's eps 1e-8,
  // min_lr = learning_rate / 10, get_lr's warm-up).
  positions = "learned", activation = "gelu", norm = "layernorm", norm_eps = 1e-5, bias = false;
  embed_scale = "none", init = "gpt2", head = "tied", recipe = "nanogpt";
  decay = "matrices", beta1 = 0.9, beta2 = 0.95, min_lr = lr / 10, warmup_style = "nanogpt";
  weight_decay = 0.1, adam_eps = 1e-8;
}

nn::AttentionSpec TrainConfig::attention_spec() const {
  return {.kind = attention,
          .kv_heads = kv_heads,
          .kv_rank = kv_rank,
          .q_rank = q_rank,
          .window = window,
          .block = block,
          .rope = rope,
          .checkpoint = checkpoint_activations,
          .options = attention_options};
}

MemoryEstimate TrainConfig::estimate_memory() const { return estimate_memory(5 + num_symbols, 2 * max_len + 1); }

MemoryEstimate TrainConfig::estimate_memory(int64_t vocab_size, int64_t length) const {
  MemoryEstimate e;
  if (!one_of(model, {"lm", "seq2seq", "encoder"})) return e;
  const double d = static_cast<double>(d_model), ff = static_cast<double>(d_ff), h = static_cast<double>(heads);
  const double n_layers = static_cast<double>(layers) * (model == "seq2seq" ? 2 : 1);
  const double vocab = static_cast<double>(vocab_size);
  const double len = static_cast<double>(length);  // at least the source and the target
  // Each block: attention projections (the kind's facts: 4 d^2 for the textbook attention) and the feed-forward
  // layers (2 d d_ff); one embedding table. The attention probabilities kept per query row and head (at least):
  // the kind's facts for a sequence of `len` positions.
  const nn::AttentionFacts facts = nn::attention_facts(
      attention_spec(), {.d_model = d_model, .heads = heads, .dropout = dropout, .max_len = length});
  const double attention_weights = facts.weights;
  const double keys_per_row = facts.kept_per_row;
  e.parameters = n_layers * (attention_weights + 2 * d * ff) + vocab * d;
  // The architecture's own weights (the lm and encoder models; seq2seq refuses the options): a learned position
  // table of the model's positions, SwiGLU's third matrix, an untied head (with its bias when biases are on).
  // The encoder's table has max_source_len + 1 rows, about half of `length` (source and target).
  if (positions == "learned") e.parameters += (model == "encoder" ? std::floor((len + 1) / 2) : len) * d;
  if (activation == "swiglu") e.parameters += n_layers * d * ff;
  if (head == "untied") e.parameters += vocab * d + (bias ? vocab : 0);
  const double copies = optimizer != "sgd" ? 4 : momentum > 0 ? 3 : 2;  // weights, gradients, optimizer state
  e.model_bytes = e.parameters * 4 * copies;
  // Saved per token and block: the feed-forward hidden layer, a few d_model-wide values, the attention rows; the
  // logits and their gradient per token. With checkpointing, every block but the last keeps only its input.
  const double per_block = ff + 4 * d + h * keys_per_row;
  const double saved = model == "lm" && checkpoint_activations && n_layers > 1 ? per_block + (n_layers - 1) * d
                                                                                 : n_layers * per_block;
  e.batch_bytes = static_cast<double>(batch) * len * (saved + 2 * vocab) * 4;
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

// Error unless the held-out examples an evaluation of n draws (at most the dataset's held-out part) fit in half
// the memory: two token rows each, with their vector headers.
void check_heldout_fits(const data::Dataset& data, int64_t n, const char* op) {
  const int64_t count = std::min(n, data.heldout_size());
  const double bytes = static_cast<double>(count) *
                       (16.0 * static_cast<double>(data.max_source_len() + data.max_target_len()) + 128);
  const double have = available_memory();
  ATTO_CHECK(have <= 0 || bytes <= have / 2, op, count, " held-out examples need about ", gigabytes(bytes),
             " of memory, more than half of the ", gigabytes(have), " available; evaluate fewer (eval_size)");
}

}  // namespace

void TrainConfig::check_fits_in_memory() const { check_fits_in_memory(5 + num_symbols, 2 * max_len + 1); }

void TrainConfig::check_fits_in_memory(int64_t vocab, int64_t length) const {
  const MemoryEstimate e = estimate_memory(vocab, length);
  const double have = available_memory();
  if (have <= 0 || e.model_bytes + e.batch_bytes <= have) return;
  throw Error(kConfig, str_cat("the run needs at least ", gigabytes(e.model_bytes + e.batch_bytes), " of memory (",
                           gigabytes(e.model_bytes), " for ", std::llround(e.parameters),
                           " parameters with their gradients and optimizer state, ", gigabytes(e.batch_bytes),
                           " for a batch of ", batch, " sequences of ", length, " tokens over a vocabulary of ",
                           vocab, "), more than the ", gigabytes(have),
                           " available; reduce d_model, d_ff, layers or batch"));
}

nn::ModelSpec TrainConfig::model_sizes() const {
  return {.layers = layers, .d_model = d_model, .heads = heads, .d_ff = d_ff, .dropout = dropout,
          .attention = attention_spec(), .architecture = architecture_spec()};
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
      precision_(parse_precision(config_.precision)),
      init_gen_(derive_seed(config_.seed, Stream::Init)),
      dropout_gen_(derive_seed(config_.seed, Stream::Dropout)),
      data_(std::move(dataset)),
      heldout_seed_(derive_seed(config_.seed, Stream::Heldout)),
      model_(std::move(model)) {
  ATTO_CHECK(data_ != nullptr, "Trainer", "no dataset given");
  data_->seed(derive_seed(config_.seed, Stream::Data));
  set_num_threads(static_cast<int>(config_.threads));  // the engine's pool (autograd/parallel.h)
  // Before the first step: the batch over the data's real token space (a model's input: source, separator and
  // target; a text stream's window of context tokens), and the evaluations' held-out examples.
  if (!model_)
    config_.check_fits_in_memory(data_->vocab_size(),
                                 data_->max_source_len() + data_->max_target_len() + (data_->stream() ? -1 : 1));
  check_heldout_fits(*data_, config_.eval_size, "Trainer");
  if (!model_) {
    model_ = nn::make_model(config_.model, data_->model_spec(config_.model_sizes()), init_gen_);
  }
  ATTO_CHECK(model_->vocab_size() >= data_->vocab_size(), "Trainer", "the model's vocabulary (",
             model_->vocab_size(), ") is smaller than the dataset's (", data_->vocab_size(), ")");
  model_->set_generator(dropout_gen_);
  if (config_.tracks_entropy()) {
    try {
      model_->track_attention_entropy(true);
    } catch (const Error& e) {
      const char* field = config_.entropy_reg != 0 ? "entropy_reg (--entropy-reg)" : "log_entropy (--log-entropy)";
      throw Error("Trainer", str_cat(field, " needs attention entropies, which model \"", model_->kind(),
                                     "\" with attention \"", model_->spec().attention.kind, "\" does not report: ",
                                     e.what()));
    }
  }
  build_optimizer();
}

void Trainer::build_optimizer() {
  const TrainConfig& c = config_;
  optim::NamedTensors params = model_->named_parameters();
  // decay "all": one group; "matrices": nanoGPT's two groups, weight_decay on tensors of two or more dimensions only.
  auto groups = [&]<class Group>() {
    if (c.decay == "all") return std::vector<Group>{{.params = params}};
    auto [matrices, others] = optim::split_by_dim(params);
    return std::vector<Group>{{.params = std::move(matrices)}, {.params = std::move(others), .weight_decay = 0.0}};
  };
  const std::pair<double, double> betas{c.beta1, c.beta2};
  if (c.optimizer == "adam")
    optimizer_ = std::make_unique<optim::Adam>(
        groups.template operator()<optim::AdamParamGroup>(),
        optim::AdamOptions{.lr = c.lr, .betas = betas, .eps = c.adam_eps, .weight_decay = c.weight_decay});
  else if (c.optimizer == "adamw")
    optimizer_ = std::make_unique<optim::AdamW>(
        groups.template operator()<optim::AdamParamGroup>(),
        optim::AdamWOptions{.lr = c.lr, .betas = betas, .eps = c.adam_eps, .weight_decay = c.weight_decay});
  else
    optimizer_ = std::make_unique<optim::SGD>(
        groups.template operator()<optim::SGDParamGroup>(),
        optim::SGDOptions{.lr = c.lr, .momentum = c.momentum, .weight_decay = c.weight_decay});

  if (c.schedule == "noam")
    scheduler_ = std::make_unique<optim::NoamLR>(*optimizer_, c.lr, c.d_model, c.warmup);
  else if (c.schedule == "cosine")
    scheduler_ = std::make_unique<optim::WarmupCosine>(*optimizer_, c.warmup, c.decay_end(), c.min_lr,
                                                       optim::parse_warmup_style(c.warmup_style));
  else if (c.schedule == "constant")
    scheduler_ = std::make_unique<optim::ConstantLR>(*optimizer_);
  else
    scheduler_ = std::make_unique<optim::StepLR>(*optimizer_, std::max<int64_t>(1, c.steps / 3), 0.1);
}

Trainer::~Trainer() = default;

// ---------------------------------------------------------------------------------------------
// Trainer: the loop

StepMetrics Trainer::step() {
  if (config_.grad_accum > 1 || comm_->size() > 1) return accumulated_step();
  const Autocast autocast(precision_);
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
  if (config_.tracks_entropy()) {
    std::vector<double> sums, counts;
    const Tensor reg = entropy_term(1.0, sums, counts);
    finish_entropy(m, sums, counts);
    if (reg.defined()) {
      (loss + reg).backward();  // the logged loss stays the cross-entropy
    } else {
      loss.backward();
    }
  } else {
    loss.backward();
  }
  const double max_norm = config_.clip > 0 ? config_.clip : std::numeric_limits<double>::infinity();
  m.grad_norm = optim::clip_grad_norm_(model_->parameters(), max_norm);  // model order, as nanoGPT
  optimizer_->step();
  scheduler_->step();
  ++step_;

  const int64_t* t = target.data<int64_t>();
  for (int64_t i = 0; i < target.numel(); ++i) m.tokens += t[i] != ignore;
  m.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  history_.push_back(m);
  return m;
}

Tensor Trainer::entropy_term(double scale, std::vector<double>& sums, std::vector<double>& counts) {
  const std::vector<nn::AttentionEntropy> layers = model_->attention_entropies();
  ATTO_CHECK(!layers.empty(), "Trainer", "model \"", model_->kind(), "\" reported no attention entropies");
  const bool first = sums.empty();
  std::vector<std::string> columns;
  Tensor reg;
  const double lambda = config_.entropy_reg * scale / static_cast<double>(layers.size());
  size_t col = 0;
  for (const nn::AttentionEntropy& e : layers) {
    ATTO_CHECK(e.entropy.defined() && e.entropy.dim() == 3, "Trainer", "layer ", e.label,
               ": attention entropies must be (B, H, L), got ",
               e.entropy.defined() ? e.entropy.shape() : Shape{});
    const int64_t B = e.entropy.size(0), H = e.entropy.size(1), L = e.entropy.size(2);
    // (B, 1, L): the real query rows, broadcast over the heads.
    const Tensor rows = e.rows.defined() ? reshape(e.rows, {B, 1, L}) : Tensor();
    if (config_.entropy_reg != 0) {
      const Tensor term = attention_entropy_loss(e.entropy, lambda, rows);
      reg = reg.defined() ? reg + term : term;
    }
    // The per-head means for the log, in double, outside the graph.
    const Tensor ent = e.entropy.detach().to(kFloat64);
    const double* p = ent.data<double>();
    const Tensor real = e.rows;
    const bool* r = real.defined() ? real.data<bool>() : nullptr;
    for (int64_t h = 0; h < H; ++h, ++col) {
      double s = 0, c = 0;
      for (int64_t b = 0; b < B; ++b)
        for (int64_t l = 0; l < L; ++l)
          if (r == nullptr || r[b * L + l]) {
            s += p[(b * H + h) * L + l];
            c += 1;
          }
      if (first) {
        sums.push_back(0);
        counts.push_back(0);
      }
      ATTO_CHECK(col < sums.size(), "Trainer", "the model reported a different number of attention heads");
      sums[col] += s;
      counts[col] += c;
      columns.push_back(str_cat("entropy.", e.label, ".h", h));
    }
  }
  if (entropy_columns_.empty()) entropy_columns_ = std::move(columns);
  return reg;
}

void Trainer::finish_entropy(StepMetrics& m, const std::vector<double>& sums, const std::vector<double>& counts) {
  m.entropies.assign(sums.size(), 0.0);
  double total = 0;
  for (size_t i = 0; i < sums.size(); ++i) {
    m.entropies[i] = counts[i] > 0 ? sums[i] / counts[i] : 0.0;
    total += m.entropies[i];
  }
  m.entropy = sums.empty() ? 0.0 : total / static_cast<double>(sums.size());
}

void Trainer::train(const StepCallback& on_step) {
  // The evaluation before the first update (nanoGPT's iter 0), when evaluating every eval_every steps.
  if (step_ == 0 && !initial_ && config_.steps > 0 && config_.eval_every > 0 && comm_->rank() == 0) {
    const auto start = std::chrono::steady_clock::now();
    StepMetrics m;
    m.eval = evaluate();
    m.train_loss = estimate_train_loss();
    m.loss = m.train_loss;
    m.evaluated = true;
    m.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    initial_ = m;
  }
  while (step_ < config_.steps) {
    StepMetrics m = step();
    const bool last = step_ == config_.steps;
    if (comm_->rank() == 0 && (last || (config_.eval_every > 0 && step_ % config_.eval_every == 0))) {
      m.eval = evaluate();
      m.train_loss = estimate_train_loss();
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

EvalResult Trainer::evaluate(int64_t n, const DecodeOptions& decode) {
  const Autocast autocast(precision_);
  check_heldout_fits(*data_, n > 0 ? n : config_.eval_size, "evaluate");  // drawn at once
  // Decoding needs no entropies: stop tracking them while evaluating.
  if (config_.tracks_entropy()) model_->track_attention_entropy(false);
  // In batches of at most the training batch (and 250): evaluating never needs more memory than a training step.
  const std::vector<data::Example> examples = heldout_examples(n > 0 ? n : config_.eval_size);
  EvalResult r = train::evaluate(*model_, examples, eval_batch(), decode);
  if (model_->spec().stream) r.bits_per_byte = bits_per_byte(r, examples, *data_);
  if (config_.tracks_entropy()) model_->track_attention_entropy(true);
  return r;
}

double Trainer::estimate_train_loss(int64_t n) {
  // As many as the held-out evaluation uses (a data file's held-out part may hold fewer than eval_size).
  const int64_t want = std::min(n > 0 ? n : config_.eval_size, std::max<int64_t>(1, data_->heldout_size()));
  if (static_cast<int64_t>(train_subset_.size()) != want) {
    // The first `want` examples of the training stream from the run's data seed; the stream is put back where it
    // was (its generator state and offset), so training draws the same examples as without the estimate.
    const data::DataPosition saved = data_->position();
    data_->seed(derive_seed(config_.seed, Stream::Data));
    std::vector<data::Example> subset;
    subset.reserve(static_cast<size_t>(want));
    for (int64_t i = 0; i < want; ++i) subset.push_back(data_->next());
    data_->set_position(saved);
    train_subset_ = std::move(subset);
  }
  if (config_.tracks_entropy()) model_->track_attention_entropy(false);
  const Autocast autocast(precision_);
  const double loss = teacher_forced_loss(*model_, train_subset_, eval_batch());
  if (config_.tracks_entropy()) model_->track_attention_entropy(true);
  return loss;
}

int64_t Trainer::eval_batch() const {
  constexpr int64_t kMaxEvalBatch = 250;
  return std::clamp<int64_t>(config_.batch / std::max<int64_t>(1, config_.grad_accum), 1, kMaxEvalBatch);
}

std::vector<int64_t> Trainer::predict(const std::vector<int64_t>& src, const DecodeOptions& decode) {
  const char* me = "predict";
  const int64_t longest = model_->spec().max_source_len;
  ATTO_CHECK(!src.empty() && static_cast<int64_t>(src.size()) <= longest, me, "source length must be in [1, ",
             longest, "], got ", src.size());
  const int64_t vocab = model_->vocab_size();
  for (int64_t t : src) ATTO_CHECK(t >= 0 && t < vocab, me, "token ", t, " outside [0, ", vocab, ")");
  const int64_t budget = std::min(model_->spec().max_target_len + 1, model_->max_decode_len());
  const Autocast autocast(precision_);
  return strip_eos(greedy_decode(*model_, {src}, budget, decode)[0], model_->special_tokens().eos);
}

// ---------------------------------------------------------------------------------------------
// Metrics log

std::string Trainer::metrics_csv() const {
  const bool stream = model_->spec().stream;
  // The entropy columns, when entropies are (or were) tracked: the mean, then one per layer and head.
  const bool entropy = config_.tracks_entropy() || !entropy_columns_.empty();
  // A text's run (its tokens know their bytes) has the val_bpb column too.
  bool bpb = false;
  for (int64_t t = 0; stream && !bpb && t < data_->vocab_size(); ++t) bpb = data_->token_bytes(t) > 0;
  std::string s = bpb ? kCsvHeaderV4 : kCsvHeaderV3;
  if (entropy) {
    s += ",entropy";
    for (const std::string& c : entropy_columns_) s += "," + c;
  }
  s += "\n";
  std::vector<const StepMetrics*> rows;
  if (initial_) rows.push_back(&*initial_);
  for (const StepMetrics& m : history_) rows.push_back(&m);
  for (const StepMetrics* row : rows) {
    const StepMetrics& m = *row;
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
    s += m.evaluated && std::isfinite(m.train_loss) ? "," + exact(m.train_loss) : ",";
    if (bpb) s += m.evaluated && m.eval.bits_per_byte > 0 ? "," + exact(m.eval.bits_per_byte) : ",";
    if (entropy) {
      const bool have = !m.entropies.empty() && m.entropies.size() == entropy_columns_.size();
      s += have ? "," + exact(m.entropy) : ",";
      for (size_t i = 0; i < entropy_columns_.size(); ++i) s += have ? "," + exact(m.entropies[i]) : ",";
    }
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

std::vector<StepMetrics> parse_metrics_csv(const std::string& csv, std::vector<std::string>* entropy_columns) {
  const char* me = "parse_metrics_csv";
  std::istringstream in(csv);
  std::string line;
  // The header: the base columns (with train_loss, or without it, or the 10 from before val_loss), then optionally
  // entropy and its per-head columns.
  ATTO_CHECK(std::getline(in, line), me, "line 1 must be the header \"", kCsvHeaderV3, "\", got nothing");
  const std::string v4 = kCsvHeaderV4, v3 = kCsvHeaderV3, v2 = kCsvHeader;
  auto starts = [&](const std::string& base) {
    return line == base || line == base + ",entropy" || line.rfind(base + ",entropy,entropy.", 0) == 0;
  };
  const bool has_bpb = starts(v4);
  const bool has_train_loss = has_bpb || starts(v3);
  ATTO_CHECK(has_train_loss || starts(v2) || line == kCsvHeaderV1, me, "line 1 must be the header \"", kCsvHeaderV3,
             "\" (optionally followed by entropy columns), got \"", line.substr(0, 200), "\"");
  const std::string base = line == kCsvHeaderV1 ? std::string(kCsvHeaderV1) : has_bpb ? v4 : has_train_loss ? v3 : v2;
  const std::string entropy_prefix = base + ",entropy";
  std::vector<std::string> columns;
  if (line.size() > entropy_prefix.size()) {
    std::stringstream hs(line.substr(entropy_prefix.size() + 1));
    for (std::string c; std::getline(hs, c, ',');) {
      ATTO_CHECK(c.rfind("entropy.", 0) == 0, me, "line 1: column '", c, "' after entropy is not an entropy column");
      columns.push_back(c);
    }
  }
  const bool has_entropy = line.size() >= entropy_prefix.size();
  const size_t base_fields = line == kCsvHeaderV1 ? 10 : has_bpb ? 14 : has_train_loss ? 13 : 12;
  const size_t fields = base_fields + (has_entropy ? 1 + columns.size() : 0);
  if (entropy_columns) *entropy_columns = columns;
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
    m.train_loss = has_train_loss && !f[12].empty() ? num(12) : std::numeric_limits<double>::quiet_NaN();
    if (has_bpb && m.evaluated && !f[13].empty()) m.eval.bits_per_byte = num(13);
    if (has_entropy && !f[base_fields].empty()) {
      m.entropy = num(base_fields);
      for (size_t i = 0; i < columns.size(); ++i) m.entropies.push_back(num(base_fields + 1 + i));
    }
    out.push_back(m);
  }
  return out;
}

// ---------------------------------------------------------------------------------------------
// Checkpoints

namespace {

// XXH64 of everything a checkpoint holds (the metadata, every tensor's name, dtype, shape and bytes, the generators,
// counters, scalars and metrics): two copies of one checkpoint agree wherever they are.
uint64_t checkpoint_digest(const io::Checkpoint& ck) {
  XXH64_state_t* state = XXH64_createState();
  ATTO_CHECK(state != nullptr, "checkpoint_digest", "out of memory");
  XXH64_reset(state, 0);
  auto add = [&](const void* data, size_t n) {
    const uint64_t len = n;  // lengths too, so that concatenations cannot collide
    XXH64_update(state, &len, sizeof len);
    XXH64_update(state, data, n);
  };
  auto add_text = [&](const std::string& t) { add(t.data(), t.size()); };
  add_text(ck.metadata_json);
  for (const auto& [name, t] : ck.tensors) {
    add_text(name);
    const int64_t dtype = static_cast<int64_t>(t.dtype());
    add(&dtype, sizeof dtype);
    add(t.shape().data(), t.shape().size() * sizeof(int64_t));
    add(t.const_raw_data(), t.nbytes());
  }
  for (const auto& [name, g] : ck.generators) {
    add_text(name);
    const uint64_t v[2] = {g.state, g.inc};
    add(v, sizeof v);
  }
  for (const auto& [name, c] : ck.counters) {
    add_text(name);
    add(&c, sizeof c);
  }
  for (const auto& [name, x] : ck.scalars) {
    add_text(name);
    add(&x, sizeof x);
  }
  add_text(ck.metrics_csv);
  const uint64_t h = XXH64_digest(state);
  XXH64_freeState(state);
  return h;
}

}  // namespace

io::Checkpoint Trainer::training_state() const {
  io::Checkpoint ck;
  io::add_module_state(ck, *model_, "model.");
  io::add_optimizer_state(ck, *optimizer_, "optim.");
  ck.generators.emplace_back("init", init_gen_.get_state());
  ck.generators.emplace_back("dropout", dropout_gen_.get_state());
  const data::DataPosition position = data_->position();
  ck.generators.emplace_back("data", position.generator);
  ck.counters.emplace_back("step", step_);
  ck.counters.emplace_back("data.offset", position.offset);
  ck.counters.emplace_back("schedule.step_count", scheduler_->step_count());
  return ck;
}

void Trainer::save_checkpoint(const std::string& path) {
  if (comm_->size() > 1) {
    check_replicas();
    if (comm_->rank() != 0) return;
  }
  io::Checkpoint ck = training_state();
  ck.metadata_json = metadata();
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
                     a.max_target_len == b.max_target_len && a.file_hash == b.file_hash &&
                     a.tokenizer_hash == b.tokenizer_hash,
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
  same("attention", config_.attention, saved.attention);
  same("kv_heads", config_.kv_heads, saved.kv_heads);
  same("kv_rank", config_.kv_rank, saved.kv_rank);
  same("q_rank", config_.q_rank, saved.q_rank);
  same("window", config_.window, saved.window);
  same("block", config_.block, saved.block);
  same("attention_options", config_.attention_options, saved.attention_options);
  same("rope", config_.rope, saved.rope);
  same("positions", config_.positions, saved.positions);
  same("activation", config_.activation, saved.activation);
  same("norm", config_.norm, saved.norm);
  same("bias", config_.bias, saved.bias);
  same("head", config_.head, saved.head);

  // Read everything before changing anything.
  std::vector<std::string> entropy_columns;
  std::vector<StepMetrics> history = parse_metrics_csv(ck.metrics_csv, &entropy_columns);
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
  initial_.reset();
  if (!history.empty() && history.front().step == 0) {  // the evaluation before the first update
    initial_ = history.front();
    history.erase(history.begin());
  }
  history_ = std::move(history);
  entropy_columns_ = std::move(entropy_columns);
  resumed_path_ = path;  // for the ranks' agreement (agreement_settings)
  resumed_step_ = step;
  resumed_digest_ = checkpoint_digest(ck);
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

// ---------------------------------------------------------------------------------------------
// Data-parallel training and gradient accumulation (docs/DISTRIBUTED.md)

namespace {

std::string hex64(uint64_t v) {
  char buf[24];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

// The dropout seed of micro-batch j of a step: SplitMix64 of (dropout stream seed, step, j).
uint64_t micro_batch_seed(uint64_t base, int64_t step, int64_t j) {
  uint64_t z =
      base ^ (static_cast<uint64_t>(step) * 0x9E3779B97F4A7C15ull) ^ (static_cast<uint64_t>(j) * 0xD1B54A32D192ED03ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// attograd train's flag for a TrainConfig field: --d-model for d_model (--symbols for num_symbols).
std::string config_flag(const std::string& field) {
  if (field == "num_symbols") return "--symbols";
  if (field == "bias") return "--no-bias";
  std::string flag = "--" + field;
  std::replace(flag.begin(), flag.end(), '_', '-');
  return flag;
}

// The shortest text that reads back as the same double.
std::string shortest(double v) {
  char buf[32];
  for (int digits = 6; digits <= 17; ++digits) {
    std::snprintf(buf, sizeof buf, "%.*g", digits, v);
    if (std::strtod(buf, nullptr) == v) break;
  }
  return buf;
}

}  // namespace

std::vector<dist::Setting> Trainer::agreement_settings(const dist::Communicator& comm, const DistOptions& options) {
  std::vector<dist::Setting> s;
  s.push_back({.name = "the build", .value = dist::build_id()});
  if (resumed_path_.empty())
    s.push_back({.name = "--resume", .value = "none"});
  else
    s.push_back(
        {.name = "--resume",
         .value = str_cat("step ", resumed_step_, ", XXH64 ", hex64(resumed_digest_)),
         .shown = str_cat("'", resumed_path_, "' (step ", resumed_step_, ", XXH64 ", hex64(resumed_digest_), ")")});
  if (const std::string described = data_->describe(); !described.empty()) {
    std::optional<data::DataSpec> spec;
    try {
      spec = data::DataSpec::from_json(described);
    } catch (const Error&) {  // a user's dataset describes itself in its own way: compared as a whole
    }
    if (spec) {
      // The file's bytes, wherever it is (its path is not compared), then the settings that cut it up.
      s.push_back({.name = spec->format == "tokens" ? std::string("--data") : "--" + spec->format,
                   .value = str_cat(spec->format, ", XXH64 ", hex64(spec->file_hash)),
                   .shown = str_cat("'", spec->path, "' (XXH64 ", hex64(spec->file_hash), ")")});
      s.push_back({.name = "--tokenize", .value = spec->tokenize});
      s.push_back({.name = "--context", .value = std::to_string(spec->context)});
      s.push_back({.name = "--val-fraction", .value = shortest(spec->val_fraction)});
      spec->path.clear();
      s.push_back({.name = "the data settings", .value = spec->to_json()});
    } else {
      s.push_back({.name = "the data", .value = described});
    }
  }
  for_each_field(config_, [&](const char* name, const auto& v) {
    const json j = v;
    s.push_back({.name = config_flag(name), .value = j.dump(), .shown = j.is_string() ? j.get<std::string>() : ""});
  });
  s.push_back({.name = "the model", .value = str_cat(model_->kind(), " of ", model_->num_parameters(), " parameters")});
  s.push_back({.name = "--allreduce", .value = dist::to_string(options.order)});
  s.push_back({.name = "--hash-every", .value = std::to_string(options.hash_every)});
  s.push_back({.name = "--no-overlap", .value = options.overlap ? "false" : "true"});
  s.push_back({.name = "--bucket-mb",
               .value = std::to_string(options.bucket_floats),
               .shown = shortest(static_cast<double>(options.bucket_floats) / (1 << 18))});
  for (dist::Setting& p : comm.protocol_settings()) s.push_back(std::move(p));
  // Everything a checkpoint would save but the metadata and metrics: equal unless something above missed a cause.
  const io::Checkpoint state = training_state();
  s.push_back({.name = "the starting weights and optimizer state", .value = hex64(checkpoint_digest(state))});
  return s;
}

void Trainer::set_communicator(std::shared_ptr<dist::Communicator> comm, const DistOptions& options) {
  const char* me = "set_communicator";
  ATTO_CHECK(comm != nullptr, me, "no communicator given");
  // Before any collective that depends on an option: the ranks agree on every one (an error on every rank alike).
  dist::agree_on_settings(*comm, me, agreement_settings(*comm, options));
  // Every rank now makes the same checks on the same values, so every rank raises the same error.
  auto check = [&](bool ok, const std::string& what) {
    if (ok) return;
    comm->set_failed_together();
    throw Error(me, what);
  };
  check(options.hash_every >= 0, str_cat("hash_every must be >= 0, got ", options.hash_every));
  check(options.bucket_floats >= 1, str_cat("bucket_floats must be >= 1, got ", options.bucket_floats));
  const int64_t n = comm->size(), k = config_.grad_accum;
  check(config_.batch % (n * k) == 0,
        str_cat("the global batch (", config_.batch, ") must be divisible by ranks x grad_accum (", n, " x ", k, " = ",
                n * k, ")"));
  comm_ = std::move(comm);
  dist_ = options;
}

uint64_t Trainer::parameter_hash() {
  XXH64_state_t* state = XXH64_createState();
  ATTO_CHECK(state != nullptr, "parameter_hash", "out of memory");
  XXH64_reset(state, 0);
  for (const auto& [name, p] : model_->named_parameters()) {
    XXH64_update(state, name.data(), name.size());
    XXH64_update(state, p.data<float>(), static_cast<size_t>(p.numel()) * sizeof(float));
  }
  const uint64_t h = XXH64_digest(state);
  XXH64_freeState(state);
  return h;
}

void Trainer::check_replicas() {
  if (comm_->size() == 1) return;
  const std::vector<uint64_t> all = comm_->allgather_u64(parameter_hash());
  for (size_t r = 1; r < all.size(); ++r) {
    if (all[r] == all[0]) continue;
    comm_->set_failed_together();
    throw Error("check_replicas", str_cat("the ranks' parameters diverged after step ", step_, ": rank ", r,
                                          " differs from rank 0 (XXH64 ", hex64(all[r]), " vs ", hex64(all[0]), ")"));
  }
}

StepMetrics Trainer::accumulated_step() {
  const Autocast autocast(precision_);
  const auto start = std::chrono::steady_clock::now();
  model().train();
  optimizer_->zero_grad();
  const int64_t ranks = comm_->size(), rank = comm_->rank(), k = config_.grad_accum;
  const int64_t micro = config_.batch / (ranks * k);  // examples per micro-batch

  // The whole global batch, as one process would draw it; its target tokens scale every micro-batch's loss.
  std::vector<data::Example> examples;
  examples.reserve(static_cast<size_t>(config_.batch));
  for (int64_t i = 0; i < config_.batch; ++i) examples.push_back(data_->next());
  const int64_t ignore = model_->special_tokens().ignore_index;
  StepMetrics m;
  m.step = step_ + 1;
  m.lr = optimizer_->lr();
  {
    const Tensor target = model_->make_batch(examples).target;
    const int64_t* t = target.data<int64_t>();
    for (int64_t i = 0; i < target.numel(); ++i) m.tokens += t[i] != ignore;
  }
  if (m.tokens == 0) {
    comm_->set_failed_together();  // every rank drew the same global batch
    throw Error("Trainer", str_cat("the batch of step ", m.step, " has no target tokens"));
  }

  const std::vector<Tensor> params = model_->parameters();  // named_parameters() order, whatever the groups
  int64_t total = 0;
  for (const Tensor& p : params) total += p.numel();
  flat_grad_.resize(static_cast<size_t>(total));
  const uint64_t dropout_base = derive_seed(config_.seed, Stream::Dropout);
  std::vector<double> losses, ent_sums, ent_counts;
  // Where each parameter's gradient goes in flat_grad_ (named_parameters() order).
  std::vector<int64_t> offset(params.size() + 1, 0);
  for (size_t q = 0; q < params.size(); ++q) offset[q + 1] = offset[q] + params[q].numel();
  // Micro-batch gradients add up in order, the first a copy: ((g0 + g1) + g2) + ...
  auto add_grad = [&](size_t q, bool first) {
    const Tensor g = params[q].grad();
    float* acc = flat_grad_.data() + offset[q];
    const int64_t len = params[q].numel();
    if (!g.defined()) {
      if (first) std::fill(acc, acc + len, 0.0f);
      return;
    }
    const float* src = g.data<float>();
    if (first)
      std::copy(src, src + len, acc);
    else
      for (int64_t e = 0; e < len; ++e) acc[e] += src[e];
  };
  // Overlap (DDP's buckets): runs of parameters from the last one back (the backward produces their gradients
  // first), about bucket_floats each; a bucket's reduction starts as soon as the backward has produced all of its
  // gradients, always in bucket order (every rank starts the same reductions in the same order). The sum of each
  // element does not depend on the buckets, so overlapping changes no bit.
  const bool overlap = dist_.overlap && ranks > 1;
  std::vector<std::pair<size_t, size_t>> buckets;  // [first, last) parameter index
  std::vector<size_t> bucket_of(params.size());
  for (size_t hi = params.size(); overlap && hi > 0;) {
    size_t lo = hi;
    int64_t n = 0;
    while (lo > 0 && (n == 0 || n + params[lo - 1].numel() <= dist_.bucket_floats)) n += params[--lo].numel();
    for (size_t q = lo; q < hi; ++q) bucket_of[q] = buckets.size();
    buckets.emplace_back(lo, hi);
    hi = lo;
  }
  for (int64_t i = 0; i < k; ++i) {
    const int64_t j = rank * k + i;  // this micro-batch's place among the ranks x k
    const std::vector<data::Example> part(examples.begin() + j * micro, examples.begin() + (j + 1) * micro);
    dropout_gen_.manual_seed(micro_batch_seed(dropout_base, step_, j));
    const nn::SequenceBatch b = model_->make_batch(part);
    const Tensor logits = model_->forward_batch(b);  // (b, T, V)
    const Tensor sum = cross_entropy(
        reshape(logits, {-1, logits.size(-1)}), reshape(b.target, {-1}),
        {.ignore_index = ignore, .label_smoothing = config_.label_smoothing, .reduction = Reduction::Sum});
    Tensor loss = sum / static_cast<double>(m.tokens);
    losses.push_back(loss.item());
    if (config_.tracks_entropy()) {
      // The regulariser of a micro-batch (its mean over its real rows) weighs 1 / (ranks x K): the same micro-batches
      // with the same weights whether they run on N ranks or as grad_accum N, so the two stay bitwise equal.
      const Tensor reg = entropy_term(1.0 / static_cast<double>(ranks * k), ent_sums, ent_counts);
      if (reg.defined()) loss = loss + reg;
    }
    if (overlap && i == k - 1) {
      std::vector<size_t> waiting(buckets.size());
      for (size_t b = 0; b < buckets.size(); ++b) waiting[b] = buckets[b].second - buckets[b].first;
      std::vector<char> done(params.size(), 0);
      size_t launched = 0;
      auto ready = [&](size_t q) {
        add_grad(q, i == 0);
        done[q] = 1;
        --waiting[bucket_of[q]];
        while (launched < buckets.size() && waiting[launched] == 0) {
          const auto [lo, hi] = buckets[launched++];
          comm_->start_allreduce_sum(flat_grad_.data() + offset[lo], offset[hi] - offset[lo], dist_.order);
        }
        comm_->progress();
      };
      {
        std::vector<GradHookHandle> hooks;
        hooks.reserve(params.size());
        for (size_t q = 0; q < params.size(); ++q)
          hooks.push_back(register_post_accumulate_grad_hook(params[q], [&ready, q](const Tensor&) { ready(q); }));
        loss.backward();
      }
      for (size_t q = params.size(); q-- > 0;)
        if (!done[q]) ready(q);  // parameters this micro-batch did not reach
      comm_->wait_all();
    } else {
      loss.backward();
      for (size_t q = 0; q < params.size(); ++q) add_grad(q, i == 0);
    }
    optimizer_->zero_grad();
  }
  if (!overlap) comm_->allreduce_sum(flat_grad_.data(), total, dist_.order);
  {
    const float* acc = flat_grad_.data();
    for (Tensor p : params) {  // a handle: set_grad changes the parameter itself
      Tensor g = p.grad();
      if (!g.defined()) {
        p.set_grad(zeros_like(p));
        g = p.grad();
      }
      std::copy(acc, acc + p.numel(), g.data<float>());
      acc += p.numel();
    }
  }
  // The loss of the global batch: the micro-batches' losses added in their global order.
  m.loss = 0;
  for (double l : comm_->allgather_f64(losses)) m.loss += l;
  if (config_.tracks_entropy()) {
    // Every rank's per-head sums and counts, added in rank order.
    std::vector<double> mine = ent_sums;
    mine.insert(mine.end(), ent_counts.begin(), ent_counts.end());
    const std::vector<double> all = comm_->allgather_f64(mine);
    const size_t n = ent_sums.size();
    std::vector<double> sums(n, 0.0), counts(n, 0.0);
    for (size_t r = 0; r < all.size() / (2 * std::max<size_t>(n, 1)) && n > 0; ++r)
      for (size_t i = 0; i < n; ++i) {
        sums[i] += all[r * 2 * n + i];
        counts[i] += all[r * 2 * n + n + i];
      }
    finish_entropy(m, sums, counts);
  }
  if (!std::isfinite(m.loss)) {
    comm_->set_failed_together();  // the gathered loss: every rank sees the same one and stops here alike
    throw Error("Trainer", str_cat("loss is not finite (", m.loss, ") at step ", m.step));
  }
  const double max_norm = config_.clip > 0 ? config_.clip : std::numeric_limits<double>::infinity();
  m.grad_norm = optim::clip_grad_norm_(model_->parameters(), max_norm);  // model order, as nanoGPT
  optimizer_->step();
  scheduler_->step();
  ++step_;
  if (comm_->size() > 1 && dist_.hash_every > 0 && step_ % dist_.hash_every == 0) check_replicas();
  m.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  history_.push_back(m);
  return m;
}

std::unique_ptr<Trainer> Trainer::from_checkpoint(const std::string& path) {
  const io::Checkpoint ck = io::load_checkpoint(path);
  const RunMetadata run = parse_run_metadata(ck.metadata_json, "'" + path + "'");
  auto t = std::make_unique<Trainer>(run.config, run_dataset(run));
  t->load_checkpoint(path);
  return t;
}

}  // namespace attograd::train
