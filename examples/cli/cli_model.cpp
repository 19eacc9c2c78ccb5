// `attograd eval`, `attograd generate`, `attograd export` and `attograd import`: the commands that use a saved
// model.

#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>

#include <nlohmann/json.hpp>

#include "cli.h"
#include "autograd/parallel.h"
#include "nn/module.h"
#include "train/data/pairs.h"
#include "train/data/text.h"
#include "train/decode.h"
#include "train/tools/report.h"
#include "train/io/nanogpt.h"
#include "train/io/safetensors.h"
#include "train/io/serialize.h"

namespace attograd::cli {

namespace {

struct EvalArgs {
  std::string weights, pairs;
  int64_t eval_size = 0;
  uint64_t seed = 0;
  CLI::Option* seed_opt = nullptr;
  bool json = false;
  bool no_kv_cache = false;
  int64_t threads = 0;  // 0: the training run's
  std::string precision;  // "": the training run's
};

int run_eval(const EvalArgs& a) {
  const auto start = std::chrono::steady_clock::now();
  std::optional<uint64_t> seed;
  if (a.seed_opt->count() > 0) seed = a.seed;
  std::unique_ptr<train::Trainer> t = load_model(a.weights, seed, a.pairs.empty());
  if (a.threads > 0) set_num_threads(static_cast<int>(a.threads));  // after the Trainer set the run's count
  const Autocast autocast(use_precision(*t, a.precision));
  const train::TrainConfig& cfg = t->config();
  const int64_t n = a.eval_size > 0 ? a.eval_size : cfg.eval_size;
  const bool stream = t->model().spec().stream;
  std::string data_name = cfg.task;
  train::EvalResult r;
  if (!a.pairs.empty()) {
    // Every line of another pairs file, tokenised with the model's vocabulary.
    const auto* saved = dynamic_cast<const data::PairsDataset*>(&t->dataset());
    ATTO_CHECK(saved != nullptr, "eval", "--pairs needs a model trained on a pairs file; '", a.weights,
               "' was trained on ", t->dataset().describe().empty() ? "a built-in task" : "a text file");
    const std::string origin = "'" + a.pairs + "'";
    const std::vector<data::PairLine> lines =
        data::parse_pairs(data::read_data_file(a.pairs, saved->spec().max_bytes), origin,
                          saved->vocabulary().tokenize(), &saved->vocabulary());
    std::vector<data::Example> examples;
    for (const data::PairLine& p : lines) {
      ATTO_CHECK(static_cast<int64_t>(p.example.src.size()) <= saved->max_source_len() &&
                     static_cast<int64_t>(p.example.tgt.size()) <= saved->max_target_len(),
                 "eval", origin, " line ", p.line, ": a source of ", p.example.src.size(), " and a target of ",
                 p.example.tgt.size(), " tokens do not fit the model (at most ", saved->max_source_len(), " and ",
                 saved->max_target_len(), ")");
      if (static_cast<int64_t>(examples.size()) < n) examples.push_back(p.example);
    }
    r = train::evaluate(t->model(), examples, t->eval_batch(), {.use_cache = !a.no_kv_cache});
    data_name = a.pairs;
  } else {
    r = t->evaluate(n, {.use_cache = !a.no_kv_cache});
    if (!t->dataset().describe().empty()) data_name = data::DataSpec::from_json(t->dataset().describe()).path;
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (a.json) {
    nlohmann::ordered_json j;
    j["weights"] = a.weights;
    j["task"] = cfg.task;
    if (!t->dataset().describe().empty()) j["data"] = data_name;
    j["model"] = cfg.model;
    if (stream) {
      j["val_loss"] = r.loss;
      j["val_bpc"] = r.loss / std::log(2.0);
      if (r.bits_per_byte > 0) j["val_bpb"] = r.bits_per_byte;
    }
    j["token_accuracy"] = r.token_accuracy;
    j["sequence_accuracy"] = r.sequence_accuracy;
    j["loss"] = r.loss;
    j["n"] = r.n;
    j["seed"] = cfg.seed;
    j["seconds"] = seconds;
    j["threads"] = get_num_threads();
    std::printf("%s\n", j.dump().c_str());
    return kExitOk;
  }
  std::printf("weights            %s\n", a.weights.c_str());
  if (!t->dataset().describe().empty()) {
    std::printf("data, model        %s file %s, %s with %s parameters\n", cfg.task.c_str(), data_name.c_str(),
                cfg.model.c_str(), thousands(t->model().num_parameters()).c_str());
  } else {
    std::printf("task, model        %s (lengths %lld-%lld), %s with %s parameters\n", cfg.task.c_str(),
                static_cast<long long>(cfg.min_len), static_cast<long long>(cfg.max_len), cfg.model.c_str(),
                thousands(t->model().num_parameters()).c_str());
  }
  if (stream) {
    std::printf("held-out windows   %lld\n", static_cast<long long>(r.n));
    std::printf("val loss           %.4f\n", r.loss);
    std::printf("bits per character %.4f\n", r.loss / std::log(2.0));
    if (r.bits_per_byte > 0) std::printf("bits per byte      %.4f\n", r.bits_per_byte);
    std::printf("next-character acc %.2f%%\n", 100 * r.token_accuracy);
    std::printf("time               %.2f s\n", seconds);
    return kExitOk;
  }
  if (!t->dataset().describe().empty())  // a data file's held-out lines are fixed; the seed plays no part
    std::printf("%s %lld\n", a.pairs.empty() ? "held-out sequences" : "sequences         ",
                static_cast<long long>(r.n));
  else
    std::printf("held-out sequences %lld (seed %llu)\n", static_cast<long long>(r.n),
                static_cast<unsigned long long>(cfg.seed));
  std::printf("token accuracy     %.2f%%\n", 100 * r.token_accuracy);
  std::printf("sequence accuracy  %.2f%%\n", 100 * r.sequence_accuracy);
  std::printf("loss               %.4f\n", r.loss);
  std::printf("time               %.2f s\n", seconds);
  return kExitOk;
}

struct GenerateArgs {
  std::string weights, input, attention;
  bool no_kv_cache = false;
  int64_t tokens = 100;
  CLI::Option* tokens_opt = nullptr;
  std::string precision;  // "": the training run's
};

int run_generate(const GenerateArgs& a) {
  std::unique_ptr<train::Trainer> t = load_model(a.weights);
  const Autocast autocast(use_precision(*t, a.precision));
  const data::Dataset& data = t->dataset();
  const bool stream = t->model().spec().stream;
  ATTO_CHECK(stream || a.tokens_opt->count() == 0, "generate", "--tokens is for a text model (another model stops "
             "at its end token)");
  const std::vector<int64_t> src = data.parse_source(a.input);
  std::vector<int64_t> out;
  if (stream) {  // a text model: the greedy continuation of --tokens characters (sample at temperature 0)
    Generator unused(0);
    out = train::sample(t->model(), {src}, a.tokens, {.temperature = 0}, unused, {},
                        {.use_cache = !a.no_kv_cache})[0];
  } else {
    out = t->predict(src, {.use_cache = !a.no_kv_cache});
  }
  std::printf("%s\n", data.to_text(out).c_str());
  std::fflush(stdout);
  if (!a.attention.empty()) {
    if (!stream) out.resize(std::min(out.size(), static_cast<size_t>(data.max_target_len())));
    write_attention(a.attention, *t, src, out);
  }
  return kExitOk;
}

struct ExportArgs {
  std::string weights, to;
  std::string names = "attograd";
  bool no_mask_buffer = false;
};

int run_export(const ExportArgs& a) {
  std::unique_ptr<train::Trainer> t = load_model(a.weights);
  std::map<std::string, std::string> meta = {{"attograd_config", t->config().to_json(-1)}, {"format", "pt"}};
  if (!t->dataset().describe().empty()) meta["attograd_data"] = t->dataset().describe();
  if (a.names == "nanogpt") {
    io::export_nanogpt(t->model(), a.to, meta, {.mask_buffer = !a.no_mask_buffer});
    const io::NamedTensors sd = io::nanogpt_state_dict(t->model(), {.mask_buffer = !a.no_mask_buffer});
    std::printf("wrote %zu tensors (%s parameters) from %s to %s under nanoGPT's names (GPTConfig %s)\n", sd.size(),
                thousands(t->model().num_parameters()).c_str(), a.weights.c_str(), a.to.c_str(),
                io::nanogpt_config(t->model()).to_json().c_str());
    return kExitOk;
  }
  io::export_safetensors(t->model(), a.to, meta);
  const io::NamedTensors sd = io::state_dict(t->model());
  std::printf("wrote %zu tensors (%s parameters) from %s to %s\n", sd.size(),
              thousands(t->model().num_parameters()).c_str(), a.weights.c_str(), a.to.c_str());
  return kExitOk;
}

struct ImportArgs {
  std::string from, config, to;
  std::string names = "attograd";
  int64_t heads = 0;
  CLI::Option* heads_opt = nullptr;
};

// The first bytes of a native attograd file (weights or checkpoint).
bool is_attograd_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  char magic[8] = {};
  in.read(magic, 8);
  return in.gcount() == 8 && std::string(magic, 8) == std::string(io::kMagic, 8);
}

// nanoGPT's token id i >= 4 as a character: U+F0000 + i (Supplementary Private Use Area-A), so that a model from a
// bare state dict has a vocabulary of one-character tokens (ids 0-3 are attograd's reserved <pad> <bos> <eos> <sep>).
constexpr char32_t kNanoGPTTokenBase = 0xF0000;

// The run a bare nanoGPT state dict becomes: a text stream of block_size characters, the nanogpt recipe, and a
// vocabulary of placeholder characters (nanoGPT keeps its own in meta.pkl, outside the state dict). The data file is
// the state dict itself: `eval` and training need a real text and say so.
train::RunMetadata bare_nanogpt_run(const io::NanoGPTConfig& c, const std::string& from) {
  ATTO_CHECK(c.block_size <= data::kMaxContext, "import", "'", from, "' holds a GPT with block_size ", c.block_size,
             ", above attograd's longest text context ", data::kMaxContext);
  ATTO_CHECK(c.vocab_size > data::Vocabulary::kReserved && c.vocab_size <= data::kMaxVocabulary, "import", "'", from,
             "' holds a GPT with vocab_size ", c.vocab_size, "; attograd's text vocabularies hold ",
             data::Vocabulary::kReserved + 1, " to ", data::kMaxVocabulary, " tokens");
  data::DataSpec d;
  d.format = "text";
  d.path = from;
  d.context = c.block_size;
  for (int64_t i = data::Vocabulary::kReserved; i < c.vocab_size; ++i)
    d.vocabulary.push_back(data::encode_utf8(kNanoGPTTokenBase + static_cast<char32_t>(i)));
  d.max_source_len = c.block_size;
  d.max_target_len = 1;
  const nn::ModelSpec spec = io::nanogpt_model_spec(c);
  nlohmann::json j = nlohmann::json::parse(train::TrainConfig{}.to_json(-1));
  j["task"] = "text";
  j["model"] = "lm";
  j["layers"] = spec.layers;
  j["d_model"] = spec.d_model;
  j["heads"] = spec.heads;
  j["d_ff"] = spec.d_ff;
  j["dropout"] = spec.dropout;
  // The recipe's fields (TrainConfig names them as ArchitectureSpec does).
  const nlohmann::json arch = nlohmann::json::parse(spec.architecture.to_json());  // held: items() is a view
  for (const auto& [key, value] : arch.items()) j[key] = value;
  train::TrainConfig cfg;
  try {
    cfg = train::TrainConfig::from_json(j.dump());
  } catch (const Error& e) {
    throw Error("import", str_cat("this build's training configuration cannot describe the nanogpt recipe (",
                                  e.what(), "); pass --config"));
  }
  return {cfg, d.to_json()};
}

int run_import_nanogpt(const ImportArgs& a) {
  const std::string origin = "'" + a.from + "'";
  io::NanoGPTFile f = io::read_nanogpt(a.from);
  if (a.heads_opt->count() > 0) {
    ATTO_CHECK(!f.has_n_head || f.config.n_head == a.heads, "import", origin, " holds a GPT with n_head ",
               f.config.n_head, " (its metadata), not --heads ", a.heads);
    f.config.n_head = a.heads;
    f.has_n_head = true;
  }
  train::RunMetadata run;
  if (!a.config.empty() && is_attograd_file(a.config)) {  // a run's weights or checkpoint: its config and data
    run = train::parse_run_metadata(io::inspect(a.config).metadata, "'" + a.config + "'");
  } else if (!a.config.empty()) {
    run = {train::TrainConfig::from_json(read_text(a.config, "import")), {}};
  } else if (f.metadata.count("attograd_config")) {  // written by `attograd export --names nanogpt`
    run = train::parse_run_metadata(nlohmann::json(f.metadata).dump(), origin);
  } else {
    ATTO_CHECK(f.has_n_head, "import", origin,
               " has no GPTConfig in its metadata and no shape holds n_head: pass --heads (or --config)");
    run = bare_nanogpt_run(f.config, a.from);
  }
  run.config.validate();
  train::Trainer t(run.config, train::run_dataset(run, false));
  io::load_nanogpt(t.model(), f, origin);
  io::save(t.model(), a.to, t.metadata());
  std::printf("imported %s (nanoGPT names, GPTConfig %s; %s parameters, %s %s) into %s\n", a.from.c_str(),
              f.config.to_json().c_str(), thousands(t.model().num_parameters()).c_str(), run.config.task.c_str(),
              run.config.model.c_str(), a.to.c_str());
  return kExitOk;
}

int run_import(const ImportArgs& a) {
  const io::FileInfo info = io::inspect(a.from);
  ATTO_CHECK(info.kind == "safetensors", "import", "'", a.from, "' is an attograd ", info.kind,
             " file, not a safetensors file (it needs no import)");
  if (a.names == "nanogpt") return run_import_nanogpt(a);
  ATTO_CHECK(a.heads_opt->count() == 0, "import", "--heads is for --names nanogpt (a GPT's n_head)");
  train::RunMetadata run = train::parse_run_metadata(info.metadata, "'" + a.from + "'");
  if (!a.config.empty()) run = {train::TrainConfig::from_json(read_text(a.config, "import")), {}};
  const train::TrainConfig& cfg = run.config;
  check_config_against_tensors(cfg, info, a.from, run.data);
  train::Trainer t(cfg, train::run_dataset(run, false));
  io::import_safetensors(t.model(), a.from);
  io::save(t.model(), a.to, t.metadata());
  std::printf("imported %s (%s parameters, %s %s) into %s\n", a.from.c_str(),
              thousands(t.model().num_parameters()).c_str(), cfg.task.c_str(), cfg.model.c_str(), a.to.c_str());
  return kExitOk;
}

}  // namespace

Command add_eval(CLI::App& app) {
  CLI::App* sub = app.add_subcommand(
      "eval", "Held-out loss and accuracy of saved weights (held-out sequences, or a text model's windows)");
  auto a = std::make_shared<EvalArgs>();
  sub->add_option("-w,--weights", a->weights, "weights file (model.attograd), checkpoint or safetensors with config")
      ->required()
      ->check(CLI::ExistingFile);
  sub->add_option("--eval-size", a->eval_size,
                  "held-out examples: for a text model, windows of its context (the first N of the held-out part, "
                  "each a context's characters, every position predicting the next character); otherwise sequences "
                  "(default: the training run's eval size)")
      ->check(CLI::Range(int64_t{1}, int64_t{100000000}));
  a->seed_opt = sub->add_option("--seed", a->seed,
                                "seed of the held-out stream (default: the training seed, i.e. the same sequences "
                                "as the training run's evaluations)")
                    ->check(unsigned64());
  sub->add_option("--pairs", a->pairs,
                  "a model trained on a pairs file: evaluate on every line of this file instead of the held-out split")
      ->check(CLI::ExistingFile);
  sub->add_flag("--json", a->json, "print the result as one JSON object");
  sub->add_option("--threads", a->threads, "threads for the engine's kernels (default: the training run's)")
      ->check(integer_in(1, train::kMaxThreads));
  add_precision_option(sub, a->precision);
  sub->add_flag("--no-kv-cache", a->no_kv_cache,
                "decode by recomputing the whole sequence every step instead of from the key/value cache (the same "
                "tokens, slower; for comparison)");
  sub->footer(
      "The model is rebuilt from the configuration stored in the weights file's metadata. A model trained on a\n"
      "data file is evaluated on its held-out split (the file is re-read and must be unchanged) or on --pairs;\n"
      "a text model's evaluation is teacher-forced: val loss, bits per character, next-character accuracy.\n\n"
      "Examples:\n"
      "  attograd eval --weights runs/reverse-lm/model.attograd\n"
      "  attograd eval --weights runs/reverse-lm/model.attograd --eval-size 5000 --seed 7 --json");
  return {sub, [a] { return run_eval(*a); }};
}

Command add_generate(CLI::App& app) {
  CLI::App* sub = app.add_subcommand("generate", "Greedy-decode the output sequence for one input");
  auto a = std::make_shared<GenerateArgs>();
  sub->add_option("-w,--weights", a->weights, "weights file (model.attograd) or checkpoint")
      ->required()
      ->check(CLI::ExistingFile);
  sub->add_option("-i,--input", a->input,
                  "input symbols separated by spaces, e.g. \"3 1 4 1 5\"; for a pairs model its raw source text")
      ->required();
  sub->add_option("--attention", a->attention,
                  "also write the attention of the input and its output: the explorer page for FILE.html (as "
                  "`attograd view`), else heatmaps as SVG");
  a->tokens_opt = sub->add_option("-n,--tokens", a->tokens, "a text model: characters to continue the input by")
                      ->check(integer_in(1, 1'000'000))
                      ->capture_default_str();
  add_precision_option(sub, a->precision);
  sub->add_flag("--no-kv-cache", a->no_kv_cache,
                "decode by recomputing the whole sequence every step instead of from the key/value cache (the same "
                "tokens, slower; for comparison)");
  sub->footer(
      "Prints the decoded sequence (without the end token) on stdout; a text model's greedy continuation of\n"
      "--input by --tokens characters.\n\n"
      "Examples:\n"
      "  attograd generate --weights runs/reverse-lm/model.attograd --input \"3 1 4 1 5\"\n"
      "  attograd generate -w runs/reverse-lm/model.attograd -i \"2 7 1 8\" --attention attention.svg");
  return {sub, [a] { return run_generate(*a); }};
}

Command add_export(CLI::App& app) {
  CLI::App* sub = app.add_subcommand("export", "Write saved weights as safetensors (for PyTorch)");
  auto a = std::make_shared<ExportArgs>();
  sub->add_option("-w,--weights", a->weights, "weights file (model.attograd) or checkpoint")
      ->required()
      ->check(CLI::ExistingFile);
  sub->add_option("--to", a->to, "output .safetensors file")->required();
  CLI::Option* names =
      sub->add_option("--names", a->names,
                      "tensor names: \"attograd\" (the model's state_dict names) or \"nanogpt\" (nanoGPT's GPT: "
                      "transformer.wte.weight, transformer.h.0.attn.c_attn.weight, ..., lm_head.weight; a model of "
                      "the nanogpt recipe)")
          ->check(CLI::IsMember({"attograd", "nanogpt"}))
          ->capture_default_str();
  sub->add_flag("--no-mask-buffer", a->no_mask_buffer,
                "with --names nanogpt: leave out the causal-mask buffers transformer.h.{i}.attn.bias (nanoGPT under "
                "PyTorch >= 2.0 has none; under 1.x it has them and its strict load needs them)")
      ->needs(names);
  sub->footer(
      "Tensor names are the model's state_dict names (PyTorch's for the standard layers); the training\n"
      "configuration goes into the safetensors __metadata__ as \"attograd_config\".\n"
      "--names nanogpt writes nanoGPT's names (docs/ARCHITECTURE.md, \"nanoGPT names\") and its GPTConfig as\n"
      "\"nanogpt_config\", so that GPT(GPTConfig(**config)).load_state_dict(sd) loads the file strictly; a model\n"
      "nanoGPT cannot express (not lm, not mha, positions not learned, not gelu, not layernorm with eps 1e-5, a\n"
      "scaled embedding, an untied head, d_ff not 4 d_model) is refused naming the option.\n\n"
      "Examples:\n"
      "  attograd export --weights runs/reverse-lm/model.attograd --to model.safetensors\n"
      "  python3 -c \"from safetensors.torch import load_file; print(load_file('model.safetensors').keys())\"\n"
      "  attograd export --weights runs/nanogpt/model.attograd --names nanogpt --to gpt.safetensors");
  return {sub, [a] { return run_export(*a); }};
}

Command add_import(CLI::App& app) {
  CLI::App* sub = app.add_subcommand("import", "Turn a safetensors state dict (e.g. from PyTorch) into a weights file");
  auto a = std::make_shared<ImportArgs>();
  sub->add_option("--from", a->from, "input .safetensors file")->required()->check(CLI::ExistingFile);
  sub->add_option("--config", a->config,
                  "training configuration JSON (config.json of a run); default: the file's \"attograd_config\" "
                  "metadata. With --names nanogpt also a run's weights file or checkpoint (its configuration and "
                  "its data: a text model's vocabulary)")
      ->check(CLI::ExistingFile);
  sub->add_option("--to", a->to, "output weights file (.attograd)")->required();
  sub->add_option("--names", a->names,
                  "tensor names of the file: \"attograd\" or \"nanogpt\" (nanoGPT's GPT state dict)")
      ->check(CLI::IsMember({"attograd", "nanogpt"}))
      ->capture_default_str();
  a->heads_opt = sub->add_option("--heads", a->heads,
                                 "with --names nanogpt: the GPT's n_head when the file's metadata has no GPTConfig "
                                 "(no shape holds it)")
                     ->check(CLI::Range(int64_t{1}, int64_t{1} << 20));
  sub->footer(
      "Every tensor of the model must be present with the right shape (float32 or float64).\n"
      "--names nanogpt reads nanoGPT's names (docs/ARCHITECTURE.md, \"nanoGPT names\"): the GPTConfig from the\n"
      "\"nanogpt_config\" metadata or the shapes (n_head from --heads); every name and shape is checked, lm_head\n"
      "must equal wte, the attn.bias mask buffers may be there or not. The configuration: --config, else the file's\n"
      "\"attograd_config\" (what `export --names nanogpt` writes), else a bare state dict becomes a text model of\n"
      "the nanogpt recipe whose vocabulary is placeholder characters (nanoGPT's id i is U+F0000 + i; inspect,\n"
      "export and generate work, eval and train need --config with the real text).\n\n"
      "Examples:\n"
      "  attograd import --from model.safetensors --config runs/reverse-lm/config.json --to imported.attograd\n"
      "  attograd import --names nanogpt --from gpt.safetensors --to gpt.attograd\n"
      "  attograd import --names nanogpt --from ckpt.safetensors --heads 6 --to gpt.attograd");
  return {sub, [a] { return run_import(*a); }};
}

}  // namespace attograd::cli
