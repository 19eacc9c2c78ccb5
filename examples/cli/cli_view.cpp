// `attograd view`: the attention explorer (train/tools/explorer.h) of saved weights on one input, written as one
// self-contained HTML file; and the configuration table that `attograd train`'s report.html shows too.

#include <nlohmann/json.hpp>

#include <cstdio>
#include <filesystem>

#include "cli.h"
#include "train/tools/explorer.h"

namespace attograd::cli {

std::vector<std::pair<std::string, std::string>> config_table(const train::TrainConfig& cfg) {
  std::vector<std::pair<std::string, std::string>> rows;
  const nlohmann::ordered_json j = nlohmann::ordered_json::parse(cfg.to_json(-1));
  const bool file_data = cfg.task == "text" || cfg.task == "pairs";  // the toy tasks' fields mean nothing there
  for (const auto& [key, value] : j.items()) {
    if (file_data && (key == "min_len" || key == "max_len" || key == "num_symbols")) continue;
    rows.emplace_back(key, value.is_string() ? value.get<std::string>() : value.dump());
  }
  return rows;
}

report::ExplorerPage explorer_for(train::Trainer& t, const std::vector<int64_t>& src,
                                  const std::vector<int64_t>& output) {
  const data::Dataset& data = t.dataset();
  report::ExplorerPage page =
      report::explorer_page(t.model(), src, output, [&](int64_t token) { return data.token_text(token); });
  const train::TrainConfig& cfg = t.config();
  const std::string task = data.describe().empty() ? cfg.task : std::string(t.model().spec().stream ? "text" : "pairs");
  page.subtitle = task + ", " + cfg.model + " model, attention " + describe_attention(cfg) + "; " + page.subtitle;
  return page;
}

void write_attention(const std::string& path, train::Trainer& t, const std::vector<int64_t>& src,
                     const std::vector<int64_t>& output) {
  const std::string ext = std::filesystem::path(path).extension().string();
  if (ext == ".html" || ext == ".htm") {
    report::ExplorerPage page = explorer_for(t, src, output);
    page.title = "attograd: " + std::filesystem::path(path).filename().string();
    page.config = config_table(t.config());
    report::write_text_file(path, report::explorer_html(page));
  } else {
    const data::Dataset& data = t.dataset();
    report::AttentionFigure fig =
        report::attention_figure(t.model(), src, output, [&](int64_t token) { return report::visible_token(data.token_text(token)); });
    fig.title = t.config().task + " (" + t.config().model + "): " + fig.title;
    const char* none = "no attention probabilities to draw: this model keeps none";
    report::write_text_file(path, fig.rows.empty() ? report::note_svg(fig.title, none) : report::attention_svg(fig));
  }
  std::fprintf(stderr, "attention picture written to %s\n", path.c_str());
}

namespace {

struct ViewArgs {
  std::string weights, prompt, input, out = "view.html";
  CLI::Option* prompt_opt = nullptr;
  CLI::Option* input_opt = nullptr;
};

int run_view(const ViewArgs& a) {
  const bool prompt = a.prompt_opt->count() > 0, input = a.input_opt->count() > 0;
  ATTO_CHECK(prompt != input, "view", "give exactly one of --prompt TEXT and --input \"TOKENS\"");
  std::unique_ptr<train::Trainer> t = load_model(a.weights);
  const data::Dataset& data = t->dataset();
  const std::vector<int64_t> src = data.parse_source(prompt ? a.prompt : a.input);
  std::vector<int64_t> out;
  if (!t->model().spec().stream) {  // a task or pairs model: the input and its greedy decoding, as generate
    out = t->predict(src);
    out.resize(std::min(out.size(), static_cast<size_t>(data.max_target_len())));
  }
  report::ExplorerPage page = explorer_for(*t, src, out);
  page.title = "attograd view: " + std::filesystem::path(a.weights).filename().string();
  page.config = config_table(t->config());
  const std::string html = report::explorer_html(page);
  report::write_text_file(a.out, html);
  int64_t heads = 0, tokens = 0;
  for (const report::AttentionRow& r : page.rows) {
    heads += r.weights.size(r.weights.dim() - 3);
    tokens = std::max<int64_t>(tokens, std::ssize(r.queries));
  }
  if (!page.rows.empty() && tokens < std::ssize(src) + std::ssize(out))
    std::fprintf(stderr,
                 "note: the input has %lld tokens: the page shows the last %lld (the model sees at most its context, "
                 "and a page shows at most %lld)\n",
                 static_cast<long long>(std::ssize(src) + std::ssize(out)), static_cast<long long>(tokens),
                 static_cast<long long>(report::kExplorerMaxTokens));
  std::printf("wrote %s: %zu attention layers, %lld heads, %lld tokens (%s bytes)\n", a.out.c_str(), page.rows.size(),
              static_cast<long long>(heads), static_cast<long long>(tokens), thousands(std::ssize(html)).c_str());
  return kExitOk;
}

}  // namespace

Command add_view(CLI::App& app) {
  CLI::App* sub = app.add_subcommand("view", "Write an interactive attention explorer of one input as an HTML file");
  auto a = std::make_shared<ViewArgs>();
  sub->add_option("-w,--weights", a->weights, "weights file (model.attograd), checkpoint or safetensors with config")
      ->required()
      ->check(CLI::ExistingFile);
  a->prompt_opt = sub->add_option("-p,--prompt", a->prompt, "text to look at (a text or pairs model)");
  a->input_opt = sub->add_option("-i,--input", a->input, "input symbols separated by spaces, e.g. \"3 1 4 1 5\"");
  sub->add_option("-o,--out", a->out, "output HTML file")->capture_default_str();
  sub->footer(
      "One self-contained page (every script, style and number inline, no network request; opens from file://):\n"
      "every layer and head as a small heatmap, the head view (hover a token to see what it attends to and what\n"
      "attends to it, click to pin, exact weights on hover), a sortable table of each head's mean row entropy,\n"
      "attention-sink share and previous-token share, and the run's configuration. A task or pairs model is shown\n"
      "on its input followed by its greedy decoding; a text model on the prompt (its last context characters).\n"
      "Linear attention forms no weights: the page shows the explicit weights it applies, and says so.\n\n"
      "Examples:\n"
      "  attograd view --weights runs/reverse-lm/model.attograd --input \"3 1 4 1 5\"\n"
      "  attograd view -w runs/poem-lm/model.attograd --prompt \"The cat sat on the mat.\" --out cat.html");
  return {sub, [a] { return run_view(*a); }};
}

}  // namespace attograd::cli
