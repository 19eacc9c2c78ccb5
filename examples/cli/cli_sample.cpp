// `attograd sample`: continues a prompt by sampling from a saved model (temperature, top-k, top-p), printing each
// token as it is produced.

#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "cli.h"
#include "train/data/text.h"
#include "train/decode.h"

namespace attograd::cli {

namespace {

struct SampleArgs {
  std::string weights, prompt, attention;
  CLI::Option* prompt_opt = nullptr;
  int64_t tokens = 200;
  double temperature = 1.0, top_p = 1.0;
  int64_t top_k = 0;
  uint64_t seed = 1;
  bool no_kv_cache = false;
  std::string precision;  // "": the training run's
};

int run_sample(const SampleArgs& a) {
  std::unique_ptr<train::Trainer> t = load_model(a.weights);
  const Autocast autocast(use_precision(*t, a.precision));
  const data::Dataset& data = t->dataset();
  nn::SequenceModel& model = t->model();
  std::vector<int64_t> prompt;
  if (a.prompt_opt->count() > 0) {
    prompt = data.parse_source(a.prompt);
  } else {
    // No prompt: a newline when the text has one (nanoGPT's start), else the text's first character.
    const auto* text = dynamic_cast<const data::TextDataset*>(&data);
    ATTO_CHECK(text != nullptr, "sample", "--prompt is required for a model not trained on a text file");
    const std::optional<int64_t> newline = text->vocabulary().find("\n");
    // A subword tokenizer encodes any text: its newline.
    prompt = text->tokenizer() ? text->parse_source("\n")
                               : std::vector<int64_t>{newline ? *newline : data::Vocabulary::kReserved};
  }
  const int64_t budget = std::min(a.tokens, model.max_decode_len());
  const int64_t eos = model.special_tokens().eos;
  if (a.prompt_opt->count() > 0) std::printf("%s", a.prompt.c_str());
  Generator gen(a.seed);
  std::vector<int64_t> produced;
  // A text's tokens are decoded together until they make whole characters (a subword tokenizer's byte pieces: at
  // most 4 for one character; U+FFFD stands for a part of one).
  std::vector<int64_t> pending;
  auto flush = [&] {
    const std::string piece = data.to_text(pending);
    std::fwrite(piece.data(), 1, piece.size(), stdout);
    std::fflush(stdout);
    pending.clear();
  };
  train::sample(model, {prompt}, budget, {.temperature = a.temperature, .top_k = a.top_k, .top_p = a.top_p}, gen,
                [&](int64_t, int64_t token) {
                  if (model.spec().stream || token != eos) produced.push_back(token);
                  if (!model.spec().stream && token == eos) return;
                  if (data.stream()) {
                    pending.push_back(token);
                    if (pending.size() >= 4 || data.to_text(pending).find("\xEF\xBF\xBD") == std::string::npos)
                      flush();
                    return;
                  }
                  std::string piece = data.to_text({token});
                  if (!piece.empty()) piece = " " + piece;  // words and numbers apart
                  std::fwrite(piece.data(), 1, piece.size(), stdout);
                  std::fflush(stdout);
                },
                {.use_cache = !a.no_kv_cache});
  if (!pending.empty()) flush();
  std::printf("\n");
  std::fflush(stdout);
  if (!a.attention.empty()) {  // the prompt and its continuation (a text model: the last context characters)
    if (!model.spec().stream) produced.resize(std::min(produced.size(), static_cast<size_t>(data.max_target_len())));
    write_attention(a.attention, *t, prompt, produced);
  }
  return kExitOk;
}

}  // namespace

Command add_sample(CLI::App& app) {
  CLI::App* sub = app.add_subcommand("sample", "Continue a prompt by sampling from a saved model, streaming the text");
  auto a = std::make_shared<SampleArgs>();
  sub->add_option("-w,--weights", a->weights, "weights file (model.attograd) or checkpoint")
      ->required()
      ->check(CLI::ExistingFile);
  a->prompt_opt = sub->add_option("-p,--prompt", a->prompt,
                                  "text to continue (default: a newline, or the first token of the vocabulary)");
  sub->add_option("-n,--tokens", a->tokens, "tokens to generate")
      ->check(integer_in(1, 1'000'000))
      ->capture_default_str();
  sub->add_option("-t,--temperature", a->temperature, "divides the logits; 0: greedy (always the most likely token)")
      ->check(CLI::Validator(
          [](std::string& v) -> std::string {
            char* end = nullptr;
            const double x = std::strtod(v.c_str(), &end);
            return !v.empty() && end && *end == '\0' && std::isfinite(x) && x >= 0
                       ? ""
                       : "'" + v + "' is not a finite number >= 0";
          },
          "NUMBER >= 0"))
      ->capture_default_str();
  sub->add_option("-k,--top-k", a->top_k, "keep only the K most likely tokens (0: off)")
      ->check(integer_in(0, 1'000'000))
      ->capture_default_str();
  sub->add_option("--top-p", a->top_p,
                  "nucleus sampling: keep the most likely tokens up to cumulative probability P (1: off)")
      ->check(CLI::Validator(
          [](std::string& v) -> std::string {
            char* end = nullptr;
            const double x = std::strtod(v.c_str(), &end);
            return !v.empty() && end && *end == '\0' && x > 0 && x <= 1 ? "" : "'" + v + "' is not in (0, 1]";
          },
          "NUMBER in (0, 1]"))
      ->capture_default_str();
  sub->add_option("--seed", a->seed, "seed of the draws (the same seed gives the same text)")
      ->check(unsigned64())
      ->capture_default_str();
  add_precision_option(sub, a->precision);
  sub->add_flag("--no-kv-cache", a->no_kv_cache,
                "recompute every step instead of using the key/value cache (the same text, slower)");
  sub->add_option("--attention", a->attention,
                  "also write the attention of the prompt and its continuation: the explorer page for FILE.html "
                  "(as `attograd view`), else heatmaps as SVG");
  sub->footer(
      "Prints the prompt and its continuation, flushing after every token. A prompt character that is not in\n"
      "the model's vocabulary is an error naming it. A text model continues for exactly --tokens tokens (past\n"
      "the context a model with a position table sees the last context characters; one with rope or no\n"
      "positions slides its key/value cache, every layer attending to its last context positions); another\n"
      "model stops at its end token.\n\n"
      "Examples:\n"
      "  attograd sample --weights runs/poem-lm/model.attograd --prompt \"The \" --tokens 300\n"
      "  attograd sample -w runs/poem-lm/model.attograd -t 0.8 --top-k 10 --seed 7\n"
      "  attograd sample -w runs/poem-lm/model.attograd -p \"The \" -n 100 --attention sample.html");
  return {sub, [a] { return run_sample(*a); }};
}

}  // namespace attograd::cli
