// `attograd train`: trains a transformer on a toy task with a progress bar, then writes the weights, a
// checkpoint, the metrics, the config, curves and attention pictures and sample predictions to one directory.

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <map>
#include <set>

#include <nlohmann/json.hpp>

#include "cli.h"
#include "nn/module.h"
#include "nn/sequence_model.h"
#include "train/data/pairs.h"
#include "train/data/text.h"
#include "train/data/tokens.h"
#include "train/decode.h"
#include "train/tools/progress.h"
#include "train/tools/report.h"
#include "train/io/serialize.h"
#include "train/dist/communicator.h"
#if ATTOGRAD_HAS_MPI
#include "train/dist/mpi.h"
#endif

namespace attograd::cli {

namespace {

namespace fs = std::filesystem;
using train::TrainConfig;

struct TrainArgs {
  TrainConfig flags;  // bound to the flags; only the ones given override the base config
  std::vector<std::function<void(TrainConfig&)>> overrides;
  CLI::Option* warmup = nullptr;
  std::map<std::string, CLI::Option*> by_flag;  // every TrainConfig flag, for --recipe: was it given?
  std::string recipe;                           // --recipe
  CLI::Option* recipe_opt = nullptr;
  bool no_bias = false;                         // --no-bias (TrainConfig::bias = false)
  std::string out, resume, config_file;
  std::string text, pairs, tokenize = "char";  // a data file instead of a built-in task
  std::string data_dir;                         // a directory written by attograd prepare
  int64_t context = 64;
  double val_fraction = 0.1;
  std::string tokenizer = "char";  // --text: char, or a SentencePiece bpe / unigram tokenizer of vocab_size pieces
  int64_t vocab_size = data::kDefaultSubwordVocab;
  CLI::Option *context_opt = nullptr, *val_fraction_opt = nullptr, *tokenize_opt = nullptr, *tokenizer_opt = nullptr,
              *vocab_size_opt = nullptr;
  int64_t samples = 8;
  bool json = false, quiet = false;
  // Data-parallel training under mpirun (docs/DISTRIBUTED.md).
  std::string allreduce = "fixed";
  int64_t hash_every = 100;
  double bucket_mb = 4;
  bool no_overlap = false;
};

// Binds --name to one TrainConfig field; when given on the command line it overrides the base config.
template <class T>
CLI::Option* field(CLI::App* sub, const std::shared_ptr<TrainArgs>& a, const std::string& name, T TrainConfig::*member,
                   const std::string& help) {
  CLI::Option* opt = sub->add_option(name, a->flags.*member, help)->capture_default_str();
  a->by_flag[name] = opt;
  TrainArgs* args = a.get();  // a raw pointer: the lambda lives inside *a
  a->overrides.push_back([opt, member, args](TrainConfig& c) {
    if (opt->count() > 0) c.*member = args->flags.*member;
  });
  return opt;
}

// Binds a boolean --name to one TrainConfig field (a flag: given = true), overriding the base config when given.
CLI::Option* flag_field(CLI::App* sub, const std::shared_ptr<TrainArgs>& a, const std::string& name,
                        bool TrainConfig::*member, const std::string& help) {
  CLI::Option* opt = sub->add_flag(name, a->flags.*member, help);
  a->by_flag[name] = opt;
  TrainArgs* args = a.get();
  a->overrides.push_back([opt, member, args](TrainConfig& c) {
    if (opt->count() > 0) c.*member = args->flags.*member;
  });
  return opt;
}

std::string percent(double f) { return strf("%.2f%%", 100 * f); }

// The fields a recipe sets (TrainConfig::apply_recipe), each with its flag and JSON key.
struct RecipeField {
  const char* flag;
  const char* key;
  void (*copy)(TrainConfig& to, const TrainConfig& from);
};
#define ATTOGRAD_RECIPE_FIELD(flag, member) \
  RecipeField { flag, #member, [](TrainConfig& to, const TrainConfig& from) { to.member = from.member; } }
const RecipeField kRecipeFields[] = {
    ATTOGRAD_RECIPE_FIELD("--positions", positions),     ATTOGRAD_RECIPE_FIELD("--activation", activation),
    ATTOGRAD_RECIPE_FIELD("--norm", norm),               ATTOGRAD_RECIPE_FIELD("--norm-eps", norm_eps),
    ATTOGRAD_RECIPE_FIELD("--no-bias", bias),            ATTOGRAD_RECIPE_FIELD("--embed-scale", embed_scale),
    ATTOGRAD_RECIPE_FIELD("--init", init),               ATTOGRAD_RECIPE_FIELD("--head", head),
    ATTOGRAD_RECIPE_FIELD("--decay", decay),             ATTOGRAD_RECIPE_FIELD("--beta1", beta1),
    ATTOGRAD_RECIPE_FIELD("--beta2", beta2),             ATTOGRAD_RECIPE_FIELD("--min-lr", min_lr),
    ATTOGRAD_RECIPE_FIELD("--warmup-style", warmup_style), ATTOGRAD_RECIPE_FIELD("--weight-decay", weight_decay),
    ATTOGRAD_RECIPE_FIELD("--adam-eps", adam_eps)};
#undef ATTOGRAD_RECIPE_FIELD

// --recipe NAME over cfg (the base configuration with the flags given already applied): every field the recipe sets
// that was not given explicitly, as a flag or as a key of the --config file (`file_keys`), takes the recipe's value.
// min_lr = lr / 10 reads the final lr. The recipe's cosine settings (min-lr, warm-up style) are left out when the
// schedule is not the cosine, its betas when the optimizer is sgd, and its positions when --rope is on: those are
// what the user chose instead.
void apply_recipe_flag(const TrainArgs& a, const std::set<std::string>& file_keys, TrainConfig& cfg) {
  TrainConfig recipe = cfg;
  recipe.apply_recipe(a.recipe);
  for (const RecipeField& f : kRecipeFields) {
    const auto opt = a.by_flag.find(f.flag);
    const bool given = (opt != a.by_flag.end() && opt->second->count() > 0) || file_keys.count(f.key) > 0;
    if (given) continue;
    const std::string key = f.key;
    if ((key == "min_lr" || key == "warmup_style") && cfg.schedule != "cosine") continue;
    if ((key == "beta1" || key == "beta2" || key == "adam_eps") && cfg.optimizer == "sgd") continue;
    if (key == "positions" && cfg.rope) continue;
    f.copy(cfg, recipe);
  }
  cfg.recipe = recipe.recipe;
}

// A held-out example for the attention picture: the first of a middling length (short enough to read); for a text
// stream the first 24 characters of the first held-out window.
data::Example attention_sample(train::Trainer& t) {
  const std::vector<data::Example> ex = t.heldout_examples(200);
  if (t.model().spec().stream) {
    data::Example e = ex.front();
    if (e.src.size() > 24) e.src.resize(24);
    return e;
  }
  const int64_t want = std::clamp<int64_t>(6, t.config().min_len, t.config().max_len);
  for (const data::Example& e : ex)
    if (static_cast<int64_t>(e.src.size()) == want) return e;
  return ex.front();
}

// The first n held-out examples; none for n = 0 (--samples 0).
std::vector<data::Example> some_heldout(const train::Trainer& t, int64_t n) {
  return n > 0 ? t.heldout_examples(n) : std::vector<data::Example>{};
}

// The data named by --text, --pairs or --data (null without any), or the checkpoint's when resuming.
std::shared_ptr<data::Dataset> file_dataset(const TrainArgs& a, const std::optional<io::FileInfo>& resume_info,
                                            TrainConfig& cfg) {
  const bool text = !a.text.empty(), pairs = !a.pairs.empty(), tokens = !a.data_dir.empty();
  ATTO_CHECK(int{text} + int{pairs} + int{tokens} <= 1, "train", "--text, --pairs and --data exclude each other");
  ATTO_CHECK(text || tokens || a.context_opt->count() == 0, "train", "--context is for --text and --data");
  ATTO_CHECK(pairs || a.tokenize_opt->count() == 0, "train", "--tokenize is for --pairs");
  ATTO_CHECK(text || a.tokenizer_opt->count() == 0, "train", "--tokenizer is for --text",
             pairs    ? " (a pairs file keeps its char or word tokens: --tokenize)"
             : tokens ? " (--data has the tokenizer `attograd prepare --tokenizer` trained)"
                      : "");
  ATTO_CHECK(a.tokenizer != "char" || a.vocab_size_opt->count() == 0, "train",
             "--vocab-size is for --tokenizer bpe or unigram (char has a token per character of the file)");
  ATTO_CHECK(text || pairs || a.val_fraction_opt->count() == 0, "train",
             tokens ? "--val-fraction is for --text and --pairs (--data holds out what `attograd prepare "
                      "--val-fraction` split off)"
                    : "--val-fraction is for --text and --pairs");
  if (resume_info) {
    ATTO_CHECK(!text && !pairs && !tokens, "train",
               "--resume continues on the checkpoint's own data (saved in it); leave out --text, --pairs and --data");
    const train::RunMetadata run = train::parse_run_metadata(resume_info->metadata, "'" + a.resume + "'");
    return run.data.empty() ? nullptr : train::run_dataset(run);
  }
  if (!text && !pairs && !tokens) return nullptr;
  ATTO_CHECK(!(text || tokens) || cfg.model == "lm", "train", text ? "--text" : "--data",
             " trains the decoder-only model (--model lm); --model ", cfg.model, " cannot model a text stream");
  const std::string& path = text ? a.text : pairs ? a.pairs : a.data_dir;
  data::DataSpec spec{.format = text ? "text" : pairs ? "pairs" : "tokens",
                      // absolute: eval and --resume find it from any directory
                      .path = fs::absolute(path).lexically_normal().string(),
                      .tokenize = pairs ? a.tokenize : "char",
                      .context = a.context,
                      .val_fraction = a.val_fraction,
                      .tokenizer = text ? a.tokenizer : "char",
                      .vocab_size = text && a.tokenizer != "char" ? a.vocab_size : 0};
  cfg.task = pairs ? "pairs" : "text";  // a label: the data comes from the file (a token directory is text too)
  return data::open_data(spec);
}

// --bucket-mb in floats.
int64_t bucket_floats(const TrainArgs& a) {
  return std::max<int64_t>(1, static_cast<int64_t>(a.bucket_mb * (1 << 18)));
}

int run(TrainArgs& a, const std::shared_ptr<dist::Communicator>& comm) {
  const auto start = std::chrono::steady_clock::now();
  const bool distributed = comm->size() > 1, rank0 = comm->rank() == 0;
  // With several ranks, every rank reads its configuration and builds its Trainer; an error any rank has is raised
  // on every rank (agree), so rank 0 reports it and nothing is written.
  std::string setup_error;
  std::unique_ptr<train::Trainer> trainer_ptr;
  TrainConfig cfg;
  fs::path out;
  std::shared_ptr<data::Dataset> file_data;  // --text / --pairs (or the checkpoint's data file), else null
  std::string run_name;                       // the task, or the data file's stem
  try {
    // Base configuration: the --config file, else the checkpoint's when resuming, else the defaults.
    bool warmup_set = a.warmup->count() > 0;
    std::set<std::string> file_keys;  // the fields the --config file sets: as explicit as flags
    if (!a.config_file.empty()) {
      const std::string text = read_text(a.config_file, "train");
      cfg = TrainConfig::from_json(text);
      const nlohmann::json j = nlohmann::json::parse(text, nullptr, false);
      if (j.is_object())
        for (const auto& item : j.items()) file_keys.insert(item.key());
      warmup_set = warmup_set || file_keys.count("warmup") > 0;
    }
    std::optional<io::FileInfo> resume_info;
    if (a.config_file.empty() && !a.resume.empty()) {
      const io::FileInfo& info = resume_info.emplace(io::inspect(a.resume));
      ATTO_CHECK(info.kind == "checkpoint", "train", "--resume needs a checkpoint, '", a.resume, "' is a ", info.kind,
                 " file");
      ATTO_CHECK(info.checksum_ok, "train", "'", a.resume, "' is corrupt: checksum mismatch");
      cfg = config_from_metadata(info.metadata, a.resume);
      warmup_set = true;
    }
    for (auto& apply : a.overrides) apply(cfg);
    if (a.recipe_opt->count() > 0) {
      ATTO_CHECK(a.resume.empty(), "train",
                 "--recipe sets up a new run; --resume continues with the checkpoint's own recipe (leave out --recipe)");
      apply_recipe_flag(a, file_keys, cfg);
    }
    // A short run without an explicit warm-up: scale the default warm-up down to a tenth of the cosine's length.
    const int64_t cosine_end = std::min(cfg.decay_end(), cfg.steps);
    if (!warmup_set && cfg.schedule == "cosine" && cfg.warmup > cosine_end) cfg.warmup = cosine_end / 10;
    cfg.validate();
    if (resume_info)  // before building the model
      check_config_against_tensors(cfg, *resume_info, a.resume,
                                   train::parse_run_metadata(resume_info->metadata, "'" + a.resume + "'").data);
    file_data = file_dataset(a, resume_info, cfg);
    run_name = file_data ? fs::path(file_data->name()).stem().string() : cfg.task;

    out = !a.out.empty()      ? fs::path(a.out)
          : !a.resume.empty() ? fs::path(a.resume).parent_path()
                              : fs::path("runs") / (run_name + "-" + cfg.model);
    if (!distributed) {
      std::error_code ec;
      fs::create_directories(out.empty() ? fs::path(".") : out, ec);
      ATTO_CHECK(!ec, "train", "cannot create the output directory '", out.string(), "': ", ec.message());
    }

    trainer_ptr = file_data ? std::make_unique<train::Trainer>(cfg, file_data) : std::make_unique<train::Trainer>(cfg);
    if (!a.resume.empty()) trainer_ptr->load_checkpoint(a.resume);
  } catch (const Error& e) {
    if (!distributed) throw;
    setup_error = e.what();
  }
  if (distributed) {
    comm->agree("train", setup_error);
    trainer_ptr->set_communicator(comm, {.order = dist::parse_reduce_order(a.allreduce),
                                         .hash_every = a.hash_every,
                                         .overlap = !a.no_overlap,
                                         .bucket_floats = bucket_floats(a)});
    if (rank0) {  // rank 0 alone writes
      std::error_code ec;
      fs::create_directories(out.empty() ? fs::path(".") : out, ec);
      ATTO_CHECK(!ec, "train", "cannot create the output directory '", out.string(), "': ", ec.message());
    }
  }
  train::Trainer& trainer = *trainer_ptr;
  const auto* text_data = dynamic_cast<const data::TextDataset*>(file_data.get());
  const auto* pairs_data = dynamic_cast<const data::PairsDataset*>(file_data.get());
  const auto* token_data = dynamic_cast<const data::TokenFileDataset*>(file_data.get());
  const int64_t first_step = trainer.step_count();
  const int64_t params = trainer.model().num_parameters();
  const bool stream = trainer.model().spec().stream;
  // What a text model's token is: a character, or a subword piece.
  const char* unit = text_data && text_data->tokenizer() ? "token" : "character";
  std::string data_line;
  if (text_data && text_data->tokenizer())
    data_line = strf("text file %s (%s %s tokens: %s training, %s held-out; vocabulary %lld = %lld pieces + %lld "
                     "reserved, trained on the training part; context %lld)",
                     text_data->spec().path.c_str(), thousands(text_data->train_size() + text_data->val_size()).c_str(),
                     text_data->spec().tokenizer.c_str(), thousands(text_data->train_size()).c_str(),
                     thousands(text_data->val_size()).c_str(), static_cast<long long>(text_data->vocab_size()),
                     static_cast<long long>(text_data->spec().vocab_size),
                     static_cast<long long>(data::Vocabulary::kReserved),
                     static_cast<long long>(text_data->spec().context));
  else if (text_data)
    data_line = strf("text file %s (%s characters: %s training, %s held-out; vocabulary %lld, context %lld)",
                     text_data->spec().path.c_str(), thousands(text_data->train_size() + text_data->val_size()).c_str(),
                     thousands(text_data->train_size()).c_str(), thousands(text_data->val_size()).c_str(),
                     static_cast<long long>(text_data->vocab_size()),
                     static_cast<long long>(text_data->spec().context));
  else if (token_data)
    data_line = strf("token directory %s (%s tokens: %s training, %s held-out; vocabulary %lld, context %lld)",
                     token_data->spec().path.c_str(),
                     thousands(token_data->train_size() + token_data->val_size()).c_str(),
                     thousands(token_data->train_size()).c_str(), thousands(token_data->val_size()).c_str(),
                     static_cast<long long>(token_data->vocab_size()),
                     static_cast<long long>(token_data->spec().context));
  else if (pairs_data)
    data_line = strf("pairs file %s (%s lines: %s training, %s held-out; %s tokens, vocabulary %lld, sources up to "
                     "%lld, targets up to %lld)",
                     pairs_data->spec().path.c_str(),
                     thousands(pairs_data->train_size() + pairs_data->val_size()).c_str(),
                     thousands(pairs_data->train_size()).c_str(), thousands(pairs_data->val_size()).c_str(),
                     pairs_data->spec().tokenize.c_str(), static_cast<long long>(pairs_data->vocab_size()),
                     static_cast<long long>(pairs_data->max_source_len()),
                     static_cast<long long>(pairs_data->max_target_len()));
  else
    data_line = strf("%s task (lengths %lld-%lld, %lld symbols)", cfg.task.c_str(), static_cast<long long>(cfg.min_len),
                     static_cast<long long>(cfg.max_len), static_cast<long long>(cfg.num_symbols));
  std::printf("attograd train: %s\n", data_line.c_str());
  std::printf("  %s model: layers %lld, d_model %lld, heads %lld, d_ff %lld, dropout %g (%s parameters)\n",
              cfg.model.c_str(), static_cast<long long>(cfg.layers), static_cast<long long>(cfg.d_model),
              static_cast<long long>(cfg.heads), static_cast<long long>(cfg.d_ff), cfg.dropout,
              thousands(params).c_str());
  std::printf("  %lld steps of %lld sequences, %s lr %g (%s, warm-up %lld), seed %llu%s%s -> %s/\n",
              static_cast<long long>(cfg.steps), static_cast<long long>(cfg.batch), cfg.optimizer.c_str(), cfg.lr,
              cfg.schedule.c_str(), static_cast<long long>(cfg.warmup), static_cast<unsigned long long>(cfg.seed),
              cfg.precision == "fp32" ? "" : (", " + cfg.precision + " mixed precision").c_str(),
              first_step > 0 ? strf(", resumed at step %lld", static_cast<long long>(first_step)).c_str() : "",
              out.string().c_str());
  if (const std::string recipe = describe_optimizer_recipe(cfg); !recipe.empty())
    std::printf("  optimizer: %s\n", recipe.c_str());
  if (const std::string arch = describe_architecture(cfg); !arch.empty())
    std::printf("  architecture: %s\n", arch.c_str());
  if (cfg.attention_spec() != nn::AttentionSpec{} || cfg.tracks_entropy())
    std::printf("  attention: %s\n", describe_attention(cfg).c_str());
  if (distributed || cfg.grad_accum > 1)
    std::printf("  data-parallel: %d process%s (%s), grad-accum %lld, %s-order all-reduce%s\n", comm->size(),
                comm->size() > 1 ? "es" : "", comm->name().c_str(), static_cast<long long>(cfg.grad_accum),
                a.allreduce.c_str(), distributed && !a.no_overlap ? " overlapping the backward" : "");
  std::fflush(stdout);

  // Train.
  train::ProgressOptions popts;
  if (a.quiet) popts.tty = 0;  // and no updates: nothing is printed
  train::ProgressBar bar(cfg.steps, popts, first_step);
  double train_seconds = 0;
  int64_t tokens = 0;
  std::optional<train::EvalResult> final_eval;
  double final_train_loss = 0;
  bool initial_shown = false;
  trainer.train([&](const train::StepMetrics& m) {
    train_seconds += m.seconds;
    tokens += m.tokens;
    if (!a.quiet && !initial_shown && trainer.initial_evaluation() && first_step == 0)
      bar.message(strf("eval @ step 0: train loss %.4f, %s loss %.4f (before the first update)",
                       trainer.initial_evaluation()->train_loss, stream ? "val" : "held-out",
                       trainer.initial_evaluation()->eval.loss));
    initial_shown = true;
    if (!a.quiet) bar.update(m.step, m.loss, m.tokens);
    if (!m.evaluated) return;
    bar.set_accuracy(m.eval.token_accuracy);
    if (!a.quiet && stream)
      bar.message(strf("eval @ step %lld: train loss %.4f, val loss %.4f, %.3f bits per %s%s, next-%s "
                       "accuracy %s (%lld held-out windows)",
                       static_cast<long long>(m.step), m.train_loss, m.eval.loss, m.eval.loss / std::log(2.0), unit,
                       m.eval.bits_per_byte > 0 ? strf(", %.3f bits per byte", m.eval.bits_per_byte).c_str() : "",
                       unit, percent(m.eval.token_accuracy).c_str(), static_cast<long long>(m.eval.n)));
    else if (!a.quiet)
      bar.message(strf("eval @ step %lld: token accuracy %s, sequence accuracy %s, loss %.4f (%lld held-out), train "
                       "loss %.4f",
                       static_cast<long long>(m.step), percent(m.eval.token_accuracy).c_str(),
                       percent(m.eval.sequence_accuracy).c_str(), m.eval.loss, static_cast<long long>(m.eval.n),
                       m.train_loss));
    if (m.step == cfg.steps) final_eval = m.eval, final_train_loss = m.train_loss;
  });
  bar.finish();
  if (!rank0) {  // the others only take part in the checkpoint's replica check
    trainer.save_checkpoint((out / "checkpoint.attograd").string());
    return kExitOk;
  }
  if (!final_eval) {  // nothing left to train (resumed at the end)
    final_eval = trainer.evaluate();
    final_train_loss = trainer.estimate_train_loss();
  }
  const double final_loss = trainer.history().empty() ? 0.0 : trainer.history().back().loss;

  // Outputs.
  const std::string weights = (out / "model.attograd").string(), checkpoint = (out / "checkpoint.attograd").string(),
                    metrics = (out / "metrics.csv").string(), config = (out / "config.json").string(),
                    curves = (out / "curves.svg").string(), attention = (out / "attention.svg").string(),
                    samples = (out / "samples.txt").string(), html = (out / "report.html").string();
  io::save(trainer.model(), weights, trainer.metadata());
  trainer.save_checkpoint(checkpoint);
  trainer.write_metrics_csv(metrics);
  report::write_text_file(config, cfg.to_json() + "\n");
  report::write_text_file(
      curves, report::curves_svg(trainer.history(),
                                strf("%s, %s model: %lld steps", run_name.c_str(), cfg.model.c_str(),
                                     static_cast<long long>(cfg.steps)),
                                stream));
  {
    const data::Example e = attention_sample(trainer);
    std::vector<int64_t> pred = trainer.predict(e.src);
    pred.resize(std::min(pred.size(), static_cast<size_t>(trainer.dataset().max_target_len())));
    report::AttentionFigure fig = report::attention_figure(
        trainer.model(), e.src, pred, [&](int64_t token) { return trainer.dataset().token_text(token); });
    fig.title = run_name + " (" + cfg.model + "): " + fig.title;
    const char* none = "no attention probabilities to draw: this attention (mla, linear) keeps none";
    report::write_text_file(attention,
                            fig.rows.empty() ? report::note_svg(fig.title, none) : report::attention_svg(fig));
  }
  {
    // report.html: the explorer on a held-out example (a text model: the whole first held-out window), the curves
    // and the configuration.
    data::Example e = attention_sample(trainer);
    std::vector<int64_t> pred;
    if (stream) {
      e = trainer.heldout_examples(1).front();
    } else {
      pred = trainer.predict(e.src);
      pred.resize(std::min(pred.size(), static_cast<size_t>(trainer.dataset().max_target_len())));
    }
    report::ExplorerPage page = explorer_for(trainer, e.src, pred);
    page.title = run_name + " (" + cfg.model + "): training report";
    page.curves_svg = report::curves_svg(trainer.history(), "", stream);
    page.config = config_table(cfg);
    report::write_text_file(html, report::explorer_html(page));
  }
  if (stream) {
    // Continuations of the beginnings of held-out windows, sampled at temperature 1 with the run's seed.
    const data::Dataset& d = trainer.dataset();
    std::string text = strf("# %lld held-out prompts of %s continued by 200 sampled characters (temperature 1, seed "
                            "%llu) after %lld steps\n\n",
                            static_cast<long long>(a.samples), run_name.c_str(),
                            static_cast<unsigned long long>(cfg.seed), static_cast<long long>(trainer.step_count()));
    Generator gen(cfg.seed);
    for (const data::Example& e : some_heldout(trainer, a.samples)) {
      const std::vector<int64_t> prompt(e.src.begin(), e.src.begin() + std::min<std::ptrdiff_t>(32, std::ssize(e.src)));
      const train::TokenRows more = train::sample(trainer.model(), {prompt}, 200, {}, gen);
      text += "prompt: " + d.to_text(prompt) + "\n";
      text += "sample: " + d.to_text(more[0]) + "\n\n";
    }
    report::write_text_file(samples, text);
  } else {
    const std::string what = file_data ? strf("%s", file_data->name().c_str())
                                       : strf("the %s task (lengths %lld-%lld)", cfg.task.c_str(),
                                              static_cast<long long>(cfg.min_len), static_cast<long long>(cfg.max_len));
    std::string text = strf("# %lld held-out examples of %s, greedy decoding by the %s model after %lld steps\n\n",
                            static_cast<long long>(a.samples), what.c_str(), cfg.model.c_str(),
                            static_cast<long long>(trainer.step_count()));
    for (const data::Example& e : some_heldout(trainer, a.samples)) {
      const std::vector<int64_t> pred = trainer.predict(e.src);
      const data::Dataset& d = trainer.dataset();
      text += "input:      " + d.to_text(e.src) + "\n";
      text += "target:     " + d.to_text(e.tgt) + "\n";
      text += "prediction: " + (pred.empty() ? std::string("(nothing)") : d.to_text(pred)) + "\n";
      text += std::string("result:     ") + (pred == e.tgt ? "correct" : "WRONG") + "\n\n";
    }
    report::write_text_file(samples, text);
  }

  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const double tps = train_seconds > 0 ? static_cast<double>(tokens) / train_seconds : 0;
  const double rss = peak_rss_mb();
  if (a.json) {
    nlohmann::ordered_json j;
    j["task"] = cfg.task;
    j["model"] = cfg.model;
    j["parameters"] = params;
    if (cfg.attention_spec() != nn::AttentionSpec{} || cfg.tracks_entropy()) {
      j["attention"] = cfg.attention;
      j["attention_spec"] = nlohmann::ordered_json::parse(
          nn::ModelSpec{.attention = cfg.attention_spec()}.to_json())["attention"];
    }
    if (const nn::ArchitectureSpec arch = cfg.architecture_spec(); arch != nn::ArchitectureSpec{}) {
      // The recipe's name ("default" when options were set one by one) and every option that differs, as values.
      j["recipe"] = cfg.recipe.empty() ? "default" : cfg.recipe;
      const nlohmann::ordered_json mine = nlohmann::ordered_json::parse(arch.to_json()),
                                   base = nlohmann::ordered_json::parse(nn::ArchitectureSpec{}.to_json());
      j["architecture"] = nlohmann::ordered_json::object();
      for (const auto& item : mine.items())
        if (item.key() != "recipe" && item.value() != base[item.key()]) j["architecture"][item.key()] = item.value();
      const std::string optim = describe_optimizer_recipe(cfg);
      if (!optim.empty()) j["optimizer_recipe"] = optim;
    }
    if (cfg.tracks_entropy()) {
      j["entropy_reg"] = cfg.entropy_reg;
      j["entropy"] = trainer.history().empty() ? 0.0 : trainer.history().back().entropy;
    }
    j["steps"] = trainer.step_count();
    j["final_loss"] = final_loss;
    j["eval_loss"] = final_eval->loss;
    j["train_loss"] = final_train_loss;
    j["token_accuracy"] = final_eval->token_accuracy;
    j["sequence_accuracy"] = final_eval->sequence_accuracy;
    if (stream) {
      j["val_loss"] = final_eval->loss;
      j["val_bpc"] = final_eval->loss / std::log(2.0);
      if (final_eval->bits_per_byte > 0) j["val_bpb"] = final_eval->bits_per_byte;
    }
    if (file_data)
      j["data"] = text_data    ? text_data->spec().path
                  : pairs_data ? pairs_data->spec().path
                  : token_data ? token_data->spec().path
                               : "";
    if (text_data) j["tokenizer"] = text_data->spec().tokenizer;
    if (token_data) j["tokenizer"] = token_data->spec().tokenizer;
    if (file_data) j["vocab"] = file_data->vocab_size();
    j["eval_size"] = final_eval->n;
    j["seed"] = cfg.seed;
    j["wall_seconds"] = wall;
    j["train_seconds"] = train_seconds;
    j["tokens_per_second"] = tps;
    j["peak_rss_mb"] = rss;
    if (distributed || cfg.grad_accum > 1) {
      j["ranks"] = comm->size();
      j["grad_accum"] = cfg.grad_accum;
      j["allreduce"] = a.allreduce;
      j["overlap"] = distributed && !a.no_overlap;
      j["allreduce_seconds"] = comm->reduce_seconds();
    }
    j["paths"] = {{"dir", out.string()},         {"weights", weights}, {"checkpoint", checkpoint},
                  {"metrics", metrics},          {"config", config},   {"curves", curves},
                  {"attention", attention},      {"samples", samples}, {"report", html}};
    std::printf("%s\n", j.dump().c_str());
    return kExitOk;
  }
  std::printf("\n");
  if (file_data)
    std::printf("  data          %s\n", data_line.c_str());
  else
    std::printf("  task          %s (lengths %lld-%lld)\n", cfg.task.c_str(), static_cast<long long>(cfg.min_len),
                static_cast<long long>(cfg.max_len));
  std::printf("  model         %s, %s parameters\n", cfg.model.c_str(), thousands(params).c_str());
  if (const std::string recipe = describe_optimizer_recipe(cfg); !recipe.empty())
    std::printf("  optimizer     %s %s\n", cfg.optimizer.c_str(), recipe.c_str());
  if (const std::string arch = describe_architecture(cfg); !arch.empty())
    std::printf("  architecture  %s\n", arch.c_str());
  if (cfg.attention_spec() != nn::AttentionSpec{} || cfg.tracks_entropy())
    std::printf("  attention     %s\n", describe_attention(cfg).c_str());
  if (cfg.tracks_entropy() && !trainer.history().empty())
    std::printf("  entropy       %.4f nats mean attention row entropy (last training batch; loss above is the "
                "cross-entropy alone)\n",
                trainer.history().back().entropy);
  std::printf("  steps         %lld (%lld in this run)\n", static_cast<long long>(trainer.step_count()),
              static_cast<long long>(trainer.step_count() - first_step));
  std::printf("  final loss    %.4f (training batch), train estimate %.4f, held-out %.4f\n", final_loss,
              final_train_loss, final_eval->loss);
  if (stream)
    std::printf("  held-out      val loss %.4f, %.3f bits per %s%s, next-%s accuracy %s (%lld windows)\n",
                final_eval->loss, final_eval->loss / std::log(2.0), unit,
                final_eval->bits_per_byte > 0 ? strf(", %.4f bits per byte", final_eval->bits_per_byte).c_str() : "",
                unit, percent(final_eval->token_accuracy).c_str(), static_cast<long long>(final_eval->n));
  else
    std::printf("  held-out      token accuracy %s, sequence accuracy %s (%lld sequences, seed %llu)\n",
                percent(final_eval->token_accuracy).c_str(), percent(final_eval->sequence_accuracy).c_str(),
                static_cast<long long>(final_eval->n), static_cast<unsigned long long>(cfg.seed));
  std::printf("  time          %.1f s wall, %.1f s in training steps, %s tokens/s\n", wall, train_seconds,
              train::format_si(tps).c_str());
  std::printf("  peak memory   %.1f MB%s\n", rss, distributed ? " (rank 0)" : "");
  if (distributed)
    std::printf("  all-reduce    %.2f s of %.1f s in training steps (%s floats summed per rank)\n",
                comm->reduce_seconds(), train_seconds, thousands(comm->reduced_floats()).c_str());
  std::printf("  outputs       %s/\n", out.string().c_str());
  std::printf("                model.attograd (weights + config)  checkpoint.attograd (--resume)  metrics.csv\n");
  std::printf("                config.json  curves.svg  attention.svg  samples.txt  report.html\n");
  return kExitOk;
}

// Runs `attograd train` alone, or as one rank of the processes an MPI launcher started: errors every rank raised
// alike end every rank normally (rank 0 reports, every rank exits 2); an error of one rank alone ends the whole job
// (MPI_Abort, exit 2).
int run_distributed(TrainArgs& a) {
  const int launched = dist::launcher_world_size();
  std::shared_ptr<dist::Communicator> comm;
  if (launched > 0) {
#if ATTOGRAD_HAS_MPI
    comm = dist::mpi_world({.bucket_floats = bucket_floats(a)});
#else
    ATTO_CHECK(launched == 1, "train", "started by an MPI launcher as one of ", launched,
               " processes, but this attograd was built without MPI (install libopenmpi-dev and rebuild)");
#endif
  }
  if (!comm || comm->size() == 1) return run(a, comm ? comm : std::make_shared<dist::SingleProcess>());
  if (comm->rank() != 0) {
    a.quiet = true;
    if (!std::freopen("/dev/null", "w", stdout)) return kExitError;  // rank 0 alone prints
  }
  try {
    return run(a, comm);
  } catch (const std::exception& e) {
    if (comm->failed_together()) {
      // Every rank has the error, raised at the same point of the run: rank 0 reports it, then every rank exits 2.
      // The others wait in one more collective until rank 0 has printed: mpirun ends the whole job as soon as one
      // process exits with an error.
      if (comm->rank() == 0) {
        std::fprintf(stderr, "attograd train: error: %s\n", e.what());
        std::fflush(stderr);
      }
      try {
        comm->allgather("");
      } catch (const std::exception&) {  // the line is out; the status is what is left to give
      }
      return kExitError;
    }
    std::fprintf(stderr, "attograd train: rank %d: %s\n", comm->rank(), e.what());
    std::fflush(stderr);
    comm->abort(kExitError);
  }
  return kExitError;  // not reached: abort() ends the process
}

}  // namespace

Command add_train(CLI::App& app) {
  CLI::App* sub =
      app.add_subcommand("train", "Train a transformer on a toy sequence task or on your own text or pairs file");
  auto a = std::make_shared<TrainArgs>();
  sub->option_defaults()->always_capture_default();
  field(sub, a, "--task", &TrainConfig::task, "copy, reverse, sort or add")
      ->check(CLI::IsMember({"copy", "reverse", "sort", "add"}));
  std::vector<std::string> kinds;
  for (const auto& [kind, _] : nn::registered_models()) kinds.push_back(kind);
  field(sub, a, "--model", &TrainConfig::model,
        "lm (decoder-only), seq2seq (encoder-decoder) or encoder (encoder-only tagger: copy, reverse, sort)")
      ->check(CLI::IsMember(kinds));
  field(sub, a, "--layers", &TrainConfig::layers,
        "blocks (lm, encoder) or encoder and decoder layers each (seq2seq)")
      ->check(integer_in(1, train::kMaxModelSize));
  field(sub, a, "--d-model", &TrainConfig::d_model, "model width")->check(integer_in(1, train::kMaxModelSize));
  field(sub, a, "--heads", &TrainConfig::heads, "attention heads (must divide --d-model)")
      ->check(integer_in(1, train::kMaxModelSize));
  field(sub, a, "--d-ff", &TrainConfig::d_ff, "feed-forward hidden size")->check(integer_in(1, train::kMaxModelSize));
  field(sub, a, "--dropout", &TrainConfig::dropout, "dropout probability");
  field(sub, a, "--min-len", &TrainConfig::min_len, "shortest source sequence")
      ->check(integer_in(1, train::kMaxSequenceLen));
  field(sub, a, "--max-len", &TrainConfig::max_len,
        "longest source sequence (at most 256: greedy decoding costs about max-len^3)")
      ->check(integer_in(1, train::kMaxSequenceLen));
  field(sub, a, "--symbols", &TrainConfig::num_symbols, "alphabet size (symbols 0 .. N-1)")
      ->check(integer_in(2, train::kMaxSymbols));
  field(sub, a, "--batch", &TrainConfig::batch, "sequences per step")->check(integer_in(1, train::kMaxModelSize));
  field(sub, a, "--steps", &TrainConfig::steps, "optimizer steps (the total, when resuming)")
      ->check(integer_in(1, train::kMaxSteps));
  field(sub, a, "--optimizer", &TrainConfig::optimizer, "adam, adamw or sgd")
      ->check(CLI::IsMember({"adam", "adamw", "sgd"}));
  field(sub, a, "--lr", &TrainConfig::lr, "peak learning rate (the seed's lr_mul for noam)");
  field(sub, a, "--weight-decay", &TrainConfig::weight_decay, "weight decay");
  field(sub, a, "--momentum", &TrainConfig::momentum, "SGD momentum");
  field(sub, a, "--schedule", &TrainConfig::schedule, "noam, cosine, constant or step")
      ->check(CLI::IsMember({"noam", "cosine", "constant", "step"}));
  a->warmup = field(sub, a, "--warmup", &TrainConfig::warmup,
                    "warm-up steps (cosine: lowered to steps/10 for short runs unless given)")
                  ->check(integer_in(0, train::kMaxSteps));
  field(sub, a, "--warmup-style", &TrainConfig::warmup_style,
        "cosine warm-up: from-zero (lr x s/warmup after s steps: the first step uses 0) or nanogpt "
        "(lr x (s+1)/(warmup+1), nanoGPT's get_lr)")
      ->check(CLI::IsMember({"from-zero", "nanogpt"}));
  field(sub, a, "--min-lr", &TrainConfig::min_lr, "cosine: the floor the cosine decays to (nanoGPT's min_lr)");
  field(sub, a, "--decay-steps", &TrainConfig::decay_steps,
        "cosine: the step where it reaches --min-lr, then stays there (nanoGPT's lr_decay_iters; 0: --steps)")
      ->check(integer_in(0, train::kMaxSteps));
  field(sub, a, "--beta1", &TrainConfig::beta1, "adam, adamw: beta1");
  field(sub, a, "--beta2", &TrainConfig::beta2, "adam, adamw: beta2");
  field(sub, a, "--adam-eps", &TrainConfig::adam_eps, "adam, adamw: eps");
  field(sub, a, "--decay", &TrainConfig::decay,
        "which parameters --weight-decay applies to: all, or matrices (tensors of 2+ dimensions, nanoGPT's rule)")
      ->check(CLI::IsMember({"all", "matrices"}));
  field(sub, a, "--clip", &TrainConfig::clip, "max gradient norm (0: no clipping)");
  field(sub, a, "--label-smoothing", &TrainConfig::label_smoothing, "cross-entropy label smoothing");
  field(sub, a, "--seed", &TrainConfig::seed, "seed of every random stream (weights, dropout, data, held-out)")
      ->check(unsigned64());
  field(sub, a, "--threads", &TrainConfig::threads,
        "threads for the engine's kernels, at most 1024 (a run is bit-reproducible for a given count)")
      ->check(integer_in(1, train::kMaxThreads));
  field(sub, a, "--precision", &TrainConfig::precision,
        "fp32, or bf16: mixed precision (torch.autocast's bfloat16): matmuls, linears and attention take bfloat16 "
        "operands with float32 accumulation; weights, optimizer state, norms, softmax and loss stay float32 "
        "(docs/CPU.md)")
      ->check(CLI::IsMember({"fp32", "bf16"}));
  field(sub, a, "--eval-every", &TrainConfig::eval_every, "evaluate every N steps (0: only at the end)")
      ->check(integer_in(0, train::kMaxSteps));
  field(sub, a, "--eval-size", &TrainConfig::eval_size, "held-out sequences per evaluation")
      ->check(integer_in(1, train::kMaxEvalSize));
  field(sub, a, "--grad-accum", &TrainConfig::grad_accum,
        "micro-batches per step and process (--batch stays the global batch; must divide it)")
      ->check(integer_in(1, train::kMaxModelSize));
  field(sub, a, "--attention", &TrainConfig::attention,
        "attention variant (lm; any registered kind: " + nn::attention_kinds_list() +
            "): mha, gqa (--kv-heads), mla (--kv-rank, --q-rank), local (--window), block-sparse (--block), linear")
      ->check(attention_kind());
  field(sub, a, "--attention-options", &TrainConfig::attention_options,
        "a registered kind's own options, a JSON object (e.g. '{\"gain\": 0.5}')");
  field(sub, a, "--kv-heads", &TrainConfig::kv_heads, "--attention gqa: key/value heads (divides --heads, below it)")
      ->check(integer_in(1, train::kMaxModelSize));
  field(sub, a, "--kv-rank", &TrainConfig::kv_rank, "--attention mla: kv_lora_rank, the cached latent (0: d_model/4)")
      ->check(integer_in(0, train::kMaxModelSize));
  field(sub, a, "--q-rank", &TrainConfig::q_rank, "--attention mla: q_lora_rank (0: no query compression)")
      ->check(integer_in(0, train::kMaxModelSize));
  field(sub, a, "--window", &TrainConfig::window, "--attention local: each query sees its last N positions")
      ->check(integer_in(1, train::kMaxModelSize));
  field(sub, a, "--block", &TrainConfig::block, "--attention block-sparse: block size of the BigBird layout")
      ->check(integer_in(1, train::kMaxModelSize));
  flag_field(sub, a, "--rope", &TrainConfig::rope,
             "rotary position embeddings instead of the sinusoidal table (mha, gqa, local, block-sparse; mla: only its decoupled RoPE)");
  field(sub, a, "--positions", &TrainConfig::positions,
        "lm, encoder: sinusoidal (the fixed table), learned (GPT-2's position embedding), rope (lm; as --rope) or none")
      ->check(CLI::IsMember({"sinusoidal", "learned", "rope", "none"}));
  field(sub, a, "--activation", &TrainConfig::activation,
        "lm, encoder: the feed-forward activation: relu, gelu (exact, erf), gelu-tanh (GPT-2's) or swiglu (gated, LLaMA's: "
        "three D x d-ff matrices)")
      ->check(CLI::IsMember({"relu", "gelu", "gelu-tanh", "swiglu"}));
  field(sub, a, "--norm", &TrainConfig::norm, "lm, encoder: every norm: layernorm or rmsnorm")
      ->check(CLI::IsMember({"layernorm", "rmsnorm"}));
  field(sub, a, "--norm-eps", &TrainConfig::norm_eps, "lm, encoder: every norm's eps (default 0: the model's own, lm 1e-6, encoder 1e-5; nanoGPT: 1e-5)");
  {
    CLI::Option* opt = sub->add_flag("--no-bias", a->no_bias,
                                     "lm, encoder: no bias in any Linear or LayerNorm (nanoGPT's bias=False)");
    a->by_flag["--no-bias"] = opt;
    a->overrides.push_back([opt](TrainConfig& c) {
      if (opt->count() > 0) c.bias = false;
    });
  }
  field(sub, a, "--embed-scale", &TrainConfig::embed_scale,
        "lm: token embeddings times sqrt(d-model) (sqrt, the paper's) or not (none, GPT-2's)")
      ->check(CLI::IsMember({"sqrt", "none"}));
  field(sub, a, "--init", &TrainConfig::init,
        "lm: initial weights: default (each module's own, docs/TRAINING.md) or gpt2 (N(0, 0.02), residual "
        "projections N(0, 0.02/sqrt(2 layers)), zero biases)")
      ->check(CLI::IsMember({"default", "gpt2"}));
  field(sub, a, "--head", &TrainConfig::head,
        "lm, encoder: output head: default (lm: tied to the token embedding; encoder: its own Linear), tied, or untied")
      ->check(CLI::IsMember({"default", "tied", "untied"}));
  a->recipe_opt = sub->add_option("--recipe", a->recipe,
                                  "default, or nanogpt: nanoGPT's model.py and train.py at once (--positions learned "
                                  "--activation gelu --no-bias --norm-eps 1e-5 --embed-scale none --init gpt2 --head "
                                  "tied --decay matrices --weight-decay 0.1 --beta1 0.9 --beta2 0.95 --adam-eps 1e-8 "
                                  "--min-lr lr/10 --warmup-style nanogpt); flags given explicitly override it")
                      ->check(CLI::IsMember({"default", "nanogpt"}));
  a->by_flag["--recipe"] = a->recipe_opt;
  flag_field(sub, a, "--checkpoint-activations", &TrainConfig::checkpoint_activations,
             "gradient checkpointing: every block but the last recomputes its activations in the backward");
  field(sub, a, "--entropy-reg", &TrainConfig::entropy_reg,
        "attention-entropy regulariser: adds -LAMBDA x mean attention row entropy to the loss (> 0 spreads heads)");
  flag_field(sub, a, "--log-entropy", &TrainConfig::log_entropy,
             "log per-layer, per-head attention entropies to metrics.csv (implied by --entropy-reg)");
  sub->add_option("--allreduce", a->allreduce,
                  "with several MPI processes: fixed (rank-order sum, bitwise equal to --grad-accum) or any "
                  "(MPI_Allreduce)")
      ->check(CLI::IsMember({"fixed", "any"}));
  sub->add_option("--hash-every", a->hash_every,
                  "with several MPI processes: compare the ranks' parameter hashes every N steps (0: at checkpoints)")
      ->check(integer_in(0, train::kMaxSteps));
  sub->add_option("--bucket-mb", a->bucket_mb,
                  "with several MPI processes: megabytes of gradients per bucket (one reduction each)")
      ->check(CLI::Range(0.001, 4096.0));
  sub->add_flag("--no-overlap", a->no_overlap,
                "with several MPI processes: reduce the gradients after the backward instead of during it");
  sub->add_option("--out", a->out, "output directory (default: runs/<task>-<model>, or the checkpoint's directory)")
      ->always_capture_default(false);
  sub->add_option("--resume", a->resume, "continue from a checkpoint (e.g. runs/reverse-lm/checkpoint.attograd)")
      ->check(CLI::ExistingFile);
  sub->add_option("--config", a->config_file, "read the configuration from a JSON file (flags override it)")
      ->check(CLI::ExistingFile);
  sub->add_option("--text", a->text,
                  "train the decoder-only model on a UTF-8 text file, one token per character (instead of --task)")
      ->check(CLI::ExistingFile);
  sub->add_option("--pairs", a->pairs, "train on a file of source<TAB>target lines (instead of --task)")
      ->check(CLI::ExistingFile);
  sub->add_option("--data", a->data_dir,
                  "train the decoder-only model on a directory written by `attograd prepare` (token files read from "
                  "disk: a corpus of any size)")
      ->check(CLI::ExistingDirectory);
  a->tokenize_opt = sub->add_option("--tokenize", a->tokenize, "--pairs: tokens are characters (char) or words (word)")
                        ->check(CLI::IsMember({"char", "word"}));
  a->tokenizer_opt =
      sub->add_option("--tokenizer", a->tokenizer,
                      "--text: a token per character (char, the default), or a SentencePiece subword tokenizer (bpe, "
                      "unigram) trained on the training part and saved in the weights")
          ->check(CLI::IsMember({"char", "bpe", "unigram"}));
  a->vocab_size_opt = sub->add_option("--vocab-size", a->vocab_size,
                                      "--tokenizer bpe|unigram: SentencePiece's pieces (the model has 4 more ids for "
                                      "the reserved tokens; default " +
                                          std::to_string(data::kDefaultSubwordVocab) + ")")
                          ->check(integer_in(1, data::kMaxVocabulary - data::Vocabulary::kReserved));
  a->context_opt = sub->add_option("--context", a->context, "--text, --data: tokens the model sees (window length)")
                       ->check(integer_in(1, data::kMaxTextContext));
  a->val_fraction_opt =
      sub->add_option("--val-fraction", a->val_fraction,
                      "--text, --pairs: share held out for evaluation (the end of a text; a fixed draw of lines)")
          ->check(CLI::Validator(
              [](std::string& v) -> std::string {
                char* end = nullptr;
                const double x = std::strtod(v.c_str(), &end);
                return !v.empty() && end && *end == '\0' && x > 0 && x < 1 ? "" : "'" + v + "' is not in (0, 1)";
              },
              "NUMBER in (0, 1)"));
  sub->add_option("--samples", a->samples, "held-out examples written to samples.txt (0: none, no sampling time)")
      ->check(CLI::Range(0, 10000));
  sub->add_flag("--json", a->json, "print the summary as one JSON object on the last line");
  sub->add_flag("-q,--quiet", a->quiet, "no progress bar or evaluation lines");
  sub->footer(
      "Writes model.attograd, checkpoint.attograd, metrics.csv, config.json, curves.svg, attention.svg,\n"
      "samples.txt and report.html (the attention explorer of `attograd view` on a held-out example, the curves\n"
      "and the configuration) to the output directory. With no flags it trains a 2-layer decoder-only model to reverse\n"
      "sequences of 1-12 digits (about a minute on 2 cores).\n\n"
      "Examples:\n"
      "  attograd train\n"
      "  attograd train --task sort --model seq2seq --steps 3000 --out runs/sort\n"
      "  attograd train --config runs/reverse-lm/config.json --seed 2 --json\n"
      "  attograd train --resume runs/reverse-lm/checkpoint.attograd --steps 4000\n"
      "  attograd train --text poem.txt --context 64 --steps 500     # then: attograd sample -w runs/poem-lm/...\n"
      "  attograd train --text poem.txt --recipe nanogpt --lr 1e-3   (docs/TRAINING.md)\n"
      "  attograd train --pairs pairs.tsv --tokenize word --model seq2seq\n"
      "  mpirun -np 4 attograd train --batch 64 --out runs/dp   (data-parallel, docs/DISTRIBUTED.md)");
  return {sub, [a] { return run_distributed(*a); }};
}

}  // namespace attograd::cli
