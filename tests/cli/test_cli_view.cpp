// `attograd view` and train's report.html (train/tools/explorer.h), and the page in a real browser: headless
// Chromium loads it from file:// with "#selftest", the page simulates a hover and a click and writes what changed
// into <pre id="selftest">, and --dump-dom hands that back. Without Chromium (Debian's `chromium`, which
// scripts/lib.sh installs) the browser tests skip with a message saying so; ATTOGRAD_CHROMIUM names another binary.

#include <cstdlib>

#include "cli/cli_testing.h"

namespace {

// A text with a Chinese line, markup and whitespace: what the page must draw visibly and escape.
const std::string& text_path() {
  static const std::string path = [] {
    std::string t;
    for (int i = 0; i < 200; ++i)
      t += "the cat sat on the mat.\t</script> <b>\n猫坐在垫子上。\n";
    const std::string p = (scratch() / "view_text.txt").string();
    std::ofstream(p, std::ios::binary) << t;
    return p;
  }();
  return path;
}

// Trains a small model once per name: a text model with a 256-character context, or with extra flags.
std::string trained(const std::string& name, const std::string& flags) {
  const std::string dir = (scratch() / name).string();
  if (!fs::exists(dir + "/model.attograd")) {
    const CliRun r = attograd("train " + flags + " --steps 3 --d-model 16 --heads 2 --layers 2 --d-ff 32 --out " +
                              quote(dir));
    EXPECT_EQ(r.status, 0) << r.out << r.err;
  }
  return dir;
}
std::string text_model(const std::string& name = "text", const std::string& extra = "") {
  return trained(name, "--text " + quote(text_path()) + " --context 256 " + extra) + "/model.attograd";
}

// The prompt of the page tests: 256 characters (the whole context) with every kind of character of the text.
std::string long_prompt() {
  std::string p;
  const std::string piece = "the cat sat on the mat.\t</script> <b>\n猫坐在垫子上。\n";
  while (p.size() < 1000) p += piece;
  return p;
}

std::string view(const std::string& weights, const std::string& how, const std::string& name) {
  const std::string out = (scratch() / name).string();
  const CliRun r = attograd("view -w " + quote(weights) + " " + how + " --out " + quote(out));
  EXPECT_EQ(r.status, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("wrote " + out), std::string::npos) << r.out;
  return out;
}

size_t count(const std::string& s, const std::string& what) {
  size_t n = 0;
  for (size_t p = s.find(what); p != std::string::npos; p = s.find(what, p + what.size())) ++n;
  return n;
}

TEST(CliView, TextPageHoldsEveryLayerHeadAndTheLastContextCharacters) {
  if (!kCli) GTEST_SKIP() << "the attograd tool is not built";
  const std::string html = slurp(view(text_model(), "--prompt " + quote("the cat sat\t</script> <b>\n猫坐"), "t.html"));
  EXPECT_EQ(html.rfind("<!DOCTYPE html>", 0), 0u);
  EXPECT_EQ(count(html, "</script>"), 2u);  // the data and the code; the prompt's "</script>" is escaped
  EXPECT_NE(html.find("\"label\":\"layer 0\",\"heads\":2,\"lq\":28,\"lk\":28"), std::string::npos);
  EXPECT_NE(html.find("\"label\":\"layer 1\",\"heads\":2,\"lq\":28,\"lk\":28"), std::string::npos);
  EXPECT_NE(html.find("[\"t\",\"h\",\"e\",\"\u2423\",\"c\""), std::string::npos);
  EXPECT_NE(html.find("\"\u2192\",\"\\u003c\",\"/\",\"s\""), std::string::npos);  // tab, then </script> escaped
  EXPECT_NE(html.find("\"\u21B5\",\"猫\",\"坐\"]"), std::string::npos);
  EXPECT_NE(html.find("<td>task</td><td>text</td>"), std::string::npos);
  EXPECT_EQ(html.find("<td>num_symbols</td>"), std::string::npos);  // a toy task's field, not a text run's
  EXPECT_EQ(html.find("https:"), std::string::npos);
  EXPECT_EQ(html.find(" src="), std::string::npos);
  // A prompt longer than the context: the page shows its last 256 characters and says so.
  const CliRun r = attograd("view -w " + quote(text_model()) + " --prompt " + quote(long_prompt()) + " --out " +
                            quote((scratch() / "long.html").string()));
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.err.find("the page shows the last 256"), std::string::npos) << r.err;
  EXPECT_NE(r.out.find("256 tokens"), std::string::npos) << r.out;
}

TEST(CliView, TaskModelShowsTheInputAndItsDecoding) {
  if (!kCli) GTEST_SKIP() << "the attograd tool is not built";
  const std::string w = trained("task", "--task reverse") + "/model.attograd";
  const std::string html = slurp(view(w, "--input \"3 1 4 1 5\"", "task.html"));
  EXPECT_NE(html.find("[\"3\",\"1\",\"4\",\"1\",\"5\","), std::string::npos);  // the input, then SEP and output
  EXPECT_NE(html.find("reverse, lm model"), std::string::npos);
}

TEST(CliView, MlaAndLinearAttentionSayWhatTheyShow) {
  if (!kCli) GTEST_SKIP() << "the attograd tool is not built";
  const std::string mla = slurp(view(text_model("mla", "--attention mla"), "--prompt \"the cat\"", "mla.html"));
  EXPECT_NE(mla.find("the softmax probabilities of the plain path"), std::string::npos);
  EXPECT_NE(mla.find("\"label\":\"layer 1\",\"heads\":2"), std::string::npos);
  const std::string lin = slurp(view(text_model("linear", "--attention linear"), "--prompt \"the cat\"", "lin.html"));
  EXPECT_NE(lin.find("linear attention has no softmax"), std::string::npos);
  EXPECT_NE(lin.find("\"label\":\"layer 1\",\"heads\":2"), std::string::npos);
}

TEST(CliView, BadArgumentsAreOneLineErrors) {
  if (!kCli) GTEST_SKIP() << "the attograd tool is not built";
  const std::string w = quote(text_model());
  expect_one_line_error(attograd("view -w " + w), "give exactly one of --prompt", "no input");
  expect_one_line_error(attograd("view -w " + w + " --prompt a --input b"), "give exactly one of", "both");
  expect_one_line_error(attograd("view -w " + w + " --prompt \"xyz\""), "the prompt", "characters not in the text");
  expect_one_line_error(attograd("view -w " + w + " --prompt the --out /nonexistent/dir/x.html"), "/nonexistent",
                        "unwritable output");
}

TEST(CliView, TrainWritesReportHtml) {
  if (!kCli) GTEST_SKIP() << "the attograd tool is not built";
  const std::string html = slurp(fs::path(text_model()).parent_path().string() + "/report.html");
  EXPECT_NE(html.find("<section id=\"curves\"><h2>Training curves</h2>"), std::string::npos);
  EXPECT_NE(html.find("Validation bits per character"), std::string::npos);
  EXPECT_NE(html.find("Learning rate"), std::string::npos);
  EXPECT_NE(html.find("<h2>Configuration</h2>"), std::string::npos);
  EXPECT_NE(html.find("\"lq\":256,\"lk\":256"), std::string::npos);  // a whole held-out window
  EXPECT_EQ(count(html, "</script>"), 2u);
  const std::string task = slurp(trained("task", "--task reverse") + "/report.html");
  EXPECT_NE(task.find("Held-out accuracy (greedy decoding)"), std::string::npos);
  EXPECT_NE(task.find("<td>num_symbols</td>"), std::string::npos);
}

TEST(CliView, SampleAndGenerateDrawTheAttentionOfATextModel) {
  if (!kCli) GTEST_SKIP() << "the attograd tool is not built";
  const std::string w = quote(text_model());
  const std::string page = (scratch() / "sample.html").string(), svg = (scratch() / "sample.svg").string();
  CliRun r = attograd("sample -w " + w + " -p \"the \" -n 12 --attention " + quote(page));
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.err.find("attention picture written to " + page), std::string::npos);
  std::string html = slurp(page);
  EXPECT_NE(html.find("\"lq\":16,\"lk\":16"), std::string::npos);  // the prompt's 4 characters and 12 more
  EXPECT_NE(html.find("[\"t\",\"h\",\"e\",\"\u2423\","), std::string::npos);
  r = attograd("sample -w " + w + " -p \"the \" -n 12 --attention " + quote(svg));
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(count(slurp(svg), "class=\"heatmap\""), 4u);  // 2 layers x 2 heads
  EXPECT_NE(slurp(svg).find(">\u2423</text>"), std::string::npos);  // a space drawn visibly
  // generate continues a text model greedily by --tokens characters.
  const std::string g = (scratch() / "generate.html").string();
  r = attograd("generate -w " + w + " -i \"the \" -n 5 --attention " + quote(g));
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(lines(r.out).size(), 1u);
  EXPECT_EQ(lines(r.out)[0].size() >= 5u, true) << r.out;
  EXPECT_NE(slurp(g).find("\"lq\":9,\"lk\":9"), std::string::npos);
  expect_one_line_error(attograd("generate -w " + quote(trained("task", "--task reverse") + "/model.attograd") +
                                 " -i \"1 2\" -n 3"),
                        "--tokens is for a text model", "--tokens on a task model");
}

TEST(CliPredict, TheMostLikelyTokenIsWhatGreedyDecodingProduces) {
  if (!kCli) GTEST_SKIP() << "the attograd tool is not built";
  const std::string w = quote(text_model());
  CliRun r = attograd("predict -w " + w + " -p \"the ca\" --top 3 --json");
  ASSERT_EQ(r.status, 0) << r.err;
  const json j = last_line_json(r.out);
  ASSERT_TRUE(j.is_object()) << r.out;
  ASSERT_EQ(j["top"].size(), 3u);
  const json& logits = j["logits"];
  double z = 0, best = -1e300;
  for (const json& l : logits) z += std::exp(l.get<double>()), best = std::max(best, l.get<double>());
  EXPECT_EQ(j["top"][0]["logit"].get<double>(), best);
  EXPECT_NEAR(j["top"][0]["prob"].get<double>(), std::exp(best) / z, 1e-9);
  EXPECT_GE(j["top"][0]["prob"].get<double>(), j["top"][1]["prob"].get<double>());
  EXPECT_EQ(logits[j["top"][0]["token"].get<size_t>()].get<double>(), best);
  // The greedy continuation by one character is the top token.
  r = attograd("generate -w " + w + " -i \"the ca\" -n 1");
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(r.out, j["top"][0]["text"].get<std::string>() + "\n");
  // The human table: a header and K rows.
  r = attograd("predict -w " + w + " -p \"the ca\" -k 4");
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(lines(r.out).size(), 2u + 4u) << r.out;
  expect_one_line_error(attograd("predict -w " + w + " -p \"xyz\""), "the prompt", "a character outside the text");
  expect_one_line_error(attograd("predict -w " + w + " -p a -k 0"), "--top", "top 0");
}

TEST(CliTrain, SamplesZeroWritesNoSamples) {
  if (!kCli) GTEST_SKIP() << "the attograd tool is not built";
  const std::string dir = (scratch() / "samples0").string();
  const CliRun r = attograd("train --text " + quote(text_path()) + " --context 32 --steps 2 --d-model 16 --heads 2 "
                            "--layers 1 --d-ff 32 --samples 0 --out " + quote(dir));
  ASSERT_EQ(r.status, 0) << r.err;
  const std::string text = slurp(dir + "/samples.txt");
  EXPECT_EQ(text.rfind("# 0 held-out prompts", 0), 0u) << text;
  EXPECT_EQ(text.find("prompt:"), std::string::npos);
  expect_one_line_error(attograd("train --steps 2 --samples -1 --out " + quote(dir)), "--samples", "negative");
}

TEST(CliEval, ThreadsOverrideTheRunsCountWithTheSameResult) {
  if (!kCli) GTEST_SKIP() << "the attograd tool is not built";
  const std::string w = quote(trained("task", "--task reverse") + "/model.attograd");
  const CliRun one = attograd("eval -w " + w + " --eval-size 64 --json");
  const CliRun two = attograd("eval -w " + w + " --eval-size 64 --json --threads 2");
  ASSERT_EQ(one.status, 0) << one.err;
  ASSERT_EQ(two.status, 0) << two.err;
  const json a = last_line_json(one.out), b = last_line_json(two.out);
  EXPECT_EQ(a["threads"], 1);
  EXPECT_EQ(b["threads"], 2);
  EXPECT_EQ(a["token_accuracy"], b["token_accuracy"]);
  EXPECT_NEAR(a["loss"].get<double>(), b["loss"].get<double>(), 1e-6);
  expect_one_line_error(attograd("eval -w " + w + " --threads 0"), "--threads", "zero threads");
}

// ---- in a browser ------------------------------------------------------------------------------------------------

std::string chromium() {
  if (const char* env = std::getenv("ATTOGRAD_CHROMIUM")) return env;
  for (const char* name : {"chromium", "chromium-browser", "google-chrome"}) {
    const std::string cmd = std::string("command -v ") + name + " >/dev/null 2>&1";
    if (std::system(cmd.c_str()) == 0) return name;
  }
  return "";
}

struct Browser {
  int status = -1;
  std::string dom, log;
};

// Runs headless Chromium on a page from file:// with "#selftest" (--dump-dom), or takes a screenshot.
Browser run_browser(const std::string& page, const std::string& mode, bool self_test = true) {
  const std::string log = (scratch() / "chromium.log").string();
  const std::string cmd = "timeout -k 10 180 " + chromium() +
                          " --headless --no-sandbox --disable-gpu --no-first-run --hide-scrollbars"
                          " --enable-logging=stderr --v=0 --user-data-dir=" +
                          quote((scratch() / "chromium-profile").string()) + " " + mode + " " +
                          quote("file://" + fs::absolute(page).string() + (self_test ? "#selftest" : "")) + " 2>" + quote(log);
  Browser b;
  std::FILE* p = ::popen(cmd.c_str(), "r");
  if (!p) return b;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) b.dom.append(buf, n);
  const int st = ::pclose(p);
  b.status = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  b.log = slurp(log);
  return b;
}

// The self-test's JSON from a dumped DOM (HTML-unescaped).
json selftest(const std::string& dom) {
  const std::string open = "<pre id=\"selftest\">";
  const size_t a = dom.find(open);
  if (a == std::string::npos) return json();
  const size_t b = dom.find("</pre>", a);
  std::string t = dom.substr(a + open.size(), b - a - open.size()), out;
  for (size_t i = 0; i < t.size(); ++i) {
    if (t[i] != '&') {
      out += t[i];
      continue;
    }
    const size_t semi = t.find(';', i);
    const std::string e = t.substr(i, semi - i + 1);
    out += e == "&lt;" ? "<" : e == "&gt;" ? ">" : e == "&amp;" ? "&" : e == "&quot;" ? "\"" : e;
    i = semi;
  }
  return json::parse(out, nullptr, false);
}

void expect_page_works(const std::string& page, int64_t panels, const std::vector<std::string>& first_tokens) {
  const Browser b = run_browser(page, "--dump-dom");
  ASSERT_EQ(b.status, 0) << b.log;
  const json r = selftest(b.dom);
  ASSERT_TRUE(r.is_object()) << "no self-test result in the dumped DOM of " << page << "\n" << b.log;
  EXPECT_TRUE(r["errors"].empty()) << r.dump();
  EXPECT_EQ(r["panels"], panels) << r.dump();
  for (const auto& [name, ok] : r["checks"].items()) EXPECT_EQ(ok, true) << name << ": " << r.dump();
  EXPECT_GE(r["checks"].size(), 9u);
  EXPECT_GT(r["hover_query_highlighted"].get<int>(), 0);
  EXPECT_EQ(r["ok"], true) << r.dump();
  const json& toks = r["query_tokens"];
  ASSERT_GE(toks.size(), first_tokens.size());
  for (size_t i = 0; i < first_tokens.size(); ++i) EXPECT_EQ(toks[i], first_tokens[i]) << i;
  // No console message of any level (Chromium logs them as CONSOLE lines): no error, no CSP violation.
  EXPECT_EQ(b.log.find("CONSOLE"), std::string::npos) << b.log;
  // Not a freeze: generous bounds (a shared machine), far below what a frozen page takes.
  EXPECT_LT(r["init_ms"].get<int>(), 20000) << r.dump();
  EXPECT_LT(r["hover_ms"].get<int>(), 5000) << r.dump();
  std::printf("%s: init %d ms, hover %d ms\n", page.c_str(), r["init_ms"].get<int>(), r["hover_ms"].get<int>());
}

TEST(Browser, ExplorerWorksInHeadlessChromium) {
  if (!kCli) GTEST_SKIP() << "the attograd tool is not built";
  if (chromium().empty())
    GTEST_SKIP() << "Chromium is not installed (apt-get install chromium, as scripts/lib.sh does; or set "
                    "ATTOGRAD_CHROMIUM): the browser test is skipped";
  // 256 tokens, the whole context, with spaces, tabs, newlines, markup and Chinese.
  expect_page_works(view(text_model(), "--prompt " + quote(long_prompt()), "b_long.html"), 4, {});
  const std::string html = view(text_model(), "--prompt " + quote("the cat\t</script> <b>\n猫坐"), "b_short.html");
  expect_page_works(html, 4,
                    {"t", "h", "e", "\u2423", "c", "a", "t", "\u2192", "<", "/", "s", "c", "r", "i", "p", "t", ">",
                     "\u2423", "<", "b", ">", "\u21B5", "猫", "坐"});
  expect_page_works(view(text_model("linear", "--attention linear"), "--prompt \"the cat\"", "b_lin.html"), 4,
                    {"t", "h", "e"});
  expect_page_works(fs::path(text_model()).parent_path().string() + "/report.html", 4, {});
  // A screenshot (docs/view.png is made the same way).
  const std::string png = (scratch() / "view.png").string();
  const Browser s = run_browser(html, "--window-size=1200,1400 --screenshot=" + quote(png), false);
  EXPECT_EQ(s.status, 0) << s.log;
  const std::string bytes = slurp(png);
  ASSERT_GT(bytes.size(), 10000u);
  EXPECT_EQ(bytes.substr(0, 8), std::string("\x89PNG\r\n\x1a\n", 8));
}

}  // namespace

TEST(CliTrain, LongContextTextModelTrainsEvaluatesSamplesAndViewsItsLastTokens) {
  // Issue 25: a text model's context goes beyond the task limit of 256 (up to 65,536; the memory estimate says what
  // fits). A page holds layers x heads x L^2 weights, so report.html and view show the last 512 tokens of a longer
  // input and say so (a 4,096-character report was 716 MB before).
  if (!kCli) GTEST_SKIP() << "the attograd tool is not built";
  const std::string dir = (scratch() / "long-context").string();
  const CliRun r = attograd("train --text " + quote(text_path()) + " --context 700 --steps 2 --d-model 16 --heads 2 "
                            "--layers 1 --d-ff 32 --batch 2 --eval-size 2 --samples 1 --out " + quote(dir));
  ASSERT_EQ(r.status, 0) << r.err;
  const std::string report = slurp(dir + "/report.html");
  EXPECT_NE(report.find("The input has 700 tokens; this page shows the attention over its last 512"), std::string::npos);
  EXPECT_LT(report.size(), 20u << 20);
  const std::string w = quote(dir + "/model.attograd");
  const CliRun e = attograd("eval -w " + w + " --json");
  ASSERT_EQ(e.status, 0) << e.err;
  EXPECT_GT(last_line_json(e.out)["n"].get<int64_t>(), 0);
  const CliRun s = attograd("sample -w " + w + " --tokens 30 --prompt " + quote(std::string(720, 'a')));
  ASSERT_EQ(s.status, 0) << s.err;
  std::string prompt;
  for (int i = 0; i < 30; ++i) prompt += "the cat sat on the mat. ";
  const CliRun v = attograd("view -w " + w + " --prompt " + quote(prompt) + " --out " +
                            quote((scratch() / "long-context.html").string()));
  ASSERT_EQ(v.status, 0) << v.err;
  EXPECT_NE(v.err.find("the page shows the last 512"), std::string::npos) << v.err;
  // Beyond the limit: one line naming the flag.
  expect_one_line_error(attograd("train --text " + quote(text_path()) + " --context 65537 --out " + quote(dir)),
                        "--context", "--context 65537");
  // A context that does not fit in memory: the estimate says how much it needs.
  expect_one_line_error(attograd("train --text " + quote(text_path()) + " --context 4000 --batch 100000 --out " +
                                 quote(dir)),
                        "GB of memory", "--context 4000 --batch 100000");
}
