// `attograd predict`: the next-token distribution of saved weights after a prompt (the top K with probabilities;
// with --json also every logit), so a learner sees what the model expects and can compare with PyTorch.

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numeric>

#include "autograd/autograd.h"
#include "cli.h"
#include "train/tools/explorer.h"

namespace attograd::cli {

namespace {

struct PredictArgs {
  std::string weights, prompt;
  int64_t top = 10;
  bool json = false;
  std::string precision;  // "": the training run's
};

int run_predict(const PredictArgs& a) {
  std::unique_ptr<train::Trainer> t = load_model(a.weights);
  const Autocast autocast(use_precision(*t, a.precision));
  const data::Dataset& data = t->dataset();
  nn::SequenceModel& model = t->model();
  const std::vector<int64_t> src = data.parse_source(a.prompt);
  std::vector<double> logits;
  {
    // One decoding step from the prompt (eval mode, no gradients, training flag restored): the logits of the first
    // token after it (a task model: the first output token).
    const bool was_training = model.is_training();
    model.eval();
    try {
      NoGradGuard no_grad;
      nn::DecodeState st = model.begin_decode({src});
      st.use_cache = false;
      logits = model.decode_step(st).to_vector<double>();
    } catch (...) {
      model.train(was_training);
      throw;
    }
    model.train(was_training);
  }
  ATTO_CHECK(static_cast<int64_t>(logits.size()) == model.vocab_size(), "predict", "the model returned ",
             logits.size(), " logits for a vocabulary of ", model.vocab_size());
  const double mx = *std::max_element(logits.begin(), logits.end());
  double z = 0;
  for (double l : logits) z += std::exp(l - mx);
  const double log_z = mx + std::log(z);
  std::vector<int64_t> order(logits.size());
  std::iota(order.begin(), order.end(), int64_t{0});
  const size_t k = std::min(order.size(), static_cast<size_t>(a.top));
  std::partial_sort(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(k), order.end(),
                    [&](int64_t x, int64_t y) { return logits[x] > logits[y] || (logits[x] == logits[y] && x < y); });
  if (a.json) {
    nlohmann::ordered_json j;
    j["prompt"] = a.prompt;
    j["tokens"] = src;
    nlohmann::ordered_json top = nlohmann::ordered_json::array();
    for (size_t i = 0; i < k; ++i) {
      const int64_t tok = order[i];
      top.push_back({{"token", tok}, {"text", data.token_text(tok)}, {"prob", std::exp(logits[tok] - log_z)},
                     {"logit", logits[tok]}});
    }
    j["top"] = top;
    j["logits"] = logits;
    std::printf("%s\n", j.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace).c_str());
    return kExitOk;
  }
  std::printf("next token after %lld prompt tokens (vocabulary %lld):\n", static_cast<long long>(src.size()),
              static_cast<long long>(model.vocab_size()));
  std::printf("  rank  token       probability   logit\n");
  for (size_t i = 0; i < k; ++i) {
    const int64_t tok = order[i];
    std::string text = report::visible_token(data.token_text(tok));
    size_t width = 0;  // characters, not bytes (UTF-8 continuation bytes do not count)
    for (char c : text) width += (static_cast<unsigned char>(c) & 0xC0) != 0x80;
    if (width < 8) text.append(8 - width, ' ');
    std::printf("  %4zu  %-4lld %s %10.6f  %8.4f\n", i + 1, static_cast<long long>(tok), text.c_str(),
                std::exp(logits[tok] - log_z), logits[tok]);
  }
  return kExitOk;
}

}  // namespace

Command add_predict(CLI::App& app) {
  CLI::App* sub = app.add_subcommand("predict", "The next-token distribution of saved weights after a prompt");
  auto a = std::make_shared<PredictArgs>();
  sub->add_option("-w,--weights", a->weights, "weights file (model.attograd), checkpoint or safetensors with config")
      ->required()
      ->check(CLI::ExistingFile);
  sub->add_option("-p,--prompt", a->prompt,
                  "the prompt: text for a text or pairs model, symbols separated by spaces for a task model")
      ->required();
  sub->add_option("-k,--top", a->top, "how many of the most likely tokens to list")
      ->check(integer_in(1, 1'000'000))
      ->capture_default_str();
  add_precision_option(sub, a->precision);
  sub->add_flag("--json", a->json, "print one JSON object: the top K (token, text, prob, logit) and every logit");
  sub->footer(
      "One forward pass (eval mode): the probabilities of the token that follows the prompt (a text model: its\n"
      "last context characters; a task or pairs model: the first output token), as PyTorch's\n"
      "softmax(model(x)[0, -1]).\n\n"
      "Examples:\n"
      "  attograd predict --weights runs/poem-lm/model.attograd --prompt \"Shall I compare thee to a summer\" --top 5\n"
      "  attograd predict -w runs/reverse-lm/model.attograd -p \"3 1 4\" --json");
  return {sub, [a] { return run_predict(*a); }};
}

}  // namespace attograd::cli
