// The attention explorer page (train/tools/explorer.h): visible token labels, script-safe JSON, the per-head
// statistics, and a page that holds every layer, head, token and weight and nothing that reaches the network.
// The page's behaviour in a browser is tested by tests/cli/test_cli_view.cpp (headless Chromium).

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "attograd.h"
#include "testing.h"

namespace attograd {
namespace {

size_t count(const std::string& s, const std::string& what) {
  size_t n = 0;
  for (size_t p = s.find(what); p != std::string::npos; p = s.find(what, p + what.size())) ++n;
  return n;
}

// The base64 float32 weights of the page's row `r` (0-based), decoded.
std::vector<float> row_weights(const std::string& html, int r) {
  size_t p = 0;
  for (int i = 0; i <= r; ++i) p = html.find("\"w\":\"", p) + 5;
  const std::string b64 = html.substr(p, html.find('"', p) - p);
  auto val = [](char c) -> uint32_t {
    if (c >= 'A' && c <= 'Z') return static_cast<uint32_t>(c - 'A');
    if (c >= 'a' && c <= 'z') return static_cast<uint32_t>(c - 'a' + 26);
    if (c >= '0' && c <= '9') return static_cast<uint32_t>(c - '0' + 52);
    return c == '+' ? 62u : 63u;
  };
  std::string bytes;
  for (size_t i = 0; i + 3 < b64.size(); i += 4) {
    const uint32_t w = val(b64[i]) << 18 | val(b64[i + 1]) << 12 | (b64[i + 2] == '=' ? 0 : val(b64[i + 2]) << 6) |
                       (b64[i + 3] == '=' ? 0 : val(b64[i + 3]));
    bytes += static_cast<char>(w >> 16 & 0xFF);
    if (b64[i + 2] != '=') bytes += static_cast<char>(w >> 8 & 0xFF);
    if (b64[i + 3] != '=') bytes += static_cast<char>(w & 0xFF);
  }
  std::vector<float> out(bytes.size() / 4);
  for (size_t i = 0; i < out.size(); ++i) {
    uint32_t u = 0;
    for (int k = 0; k < 4; ++k) u |= static_cast<uint32_t>(static_cast<unsigned char>(bytes[4 * i + k])) << (8 * k);
    std::memcpy(&out[i], &u, 4);
  }
  return out;
}

TEST(Explorer, VisibleTokenDrawsWhitespaceAndControlsAndKeepsOtherScripts) {
  EXPECT_EQ(report::visible_token(" "), "\u2423");
  EXPECT_EQ(report::visible_token("\n"), "\u21B5");
  EXPECT_EQ(report::visible_token("\t"), "\u2192");
  EXPECT_EQ(report::visible_token("\r"), "\u240D");
  EXPECT_EQ(report::visible_token(std::string(1, '\x01')), "\u2401");
  EXPECT_EQ(report::visible_token(std::string(1, '\0')), "\u2400");
  EXPECT_EQ(report::visible_token("\x7f"), "\u2421");
  EXPECT_EQ(report::visible_token(""), "\u2205");
  EXPECT_EQ(report::visible_token("a b"), "a\u2423b");
  EXPECT_EQ(report::visible_token("猫坐"), "猫坐");
  EXPECT_EQ(report::visible_token("é😀"), "é😀");
  EXPECT_EQ(report::visible_token("\xe7\x8c"), "\uFFFD\uFFFD");  // a truncated three-byte sequence
  EXPECT_EQ(report::visible_token("\xc0\xaf"), "\uFFFD\uFFFD");  // an overlong '/'
}

TEST(Explorer, JsonStringIsSafeInsideAScript) {
  EXPECT_EQ(report::json_string("</script>"), "\"\\u003c/script\\u003e\"");
  EXPECT_EQ(report::json_string("a\"b\\c\nd\te"), "\"a\\\"b\\\\c\\nd\\te\"");
  EXPECT_EQ(report::json_string("&"), "\"\\u0026\"");
  EXPECT_EQ(report::json_string(std::string(1, '\x02')), "\"\\u0002\"");
  EXPECT_EQ(report::json_string("\u2028"), "\"\\u2028\"");
  EXPECT_EQ(report::json_string("猫"), "\"猫\"");
  EXPECT_EQ(report::json_string("\xff"), "\"\\ufffd\"");
  EXPECT_EQ(report::html_escape("<a href='x'>&\"</a>"), "&lt;a href=&#39;x&#39;&gt;&amp;&quot;&lt;/a&gt;");
}

// Uniform causal attention over 3 positions, 2 heads; head 1 puts everything on the previous position (row 0 on
// itself). A fourth query row of zeros (sees nothing) is left out of the means.
report::AttentionRow uniform_row() {
  std::vector<double> w = {1, 0, 0, 0.5, 0.5, 0, 1. / 3, 1. / 3, 1. / 3, 0, 0, 0,  // head 0
                           1, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0, 0};                    // head 1
  return {"layer 0", from_vector(w, {1, 2, 4, 3}), {"a", " ", "\n", "x"}, {"a", " ", "\n"}};
}

TEST(Explorer, HeadStatsAreMeanRowEntropySinkAndPreviousShare) {
  const std::vector<report::HeadStats> s = report::head_stats(uniform_row());
  ASSERT_EQ(s.size(), 2u);
  EXPECT_NEAR(s[0].entropy, (0 + std::log(2.0) + std::log(3.0)) / 3, 1e-6);
  EXPECT_NEAR(s[0].sink, (1 + 0.5 + 1. / 3) / 3, 1e-6);
  EXPECT_NEAR(s[0].previous, (0.5 + 1. / 3) / 2, 1e-6);
  EXPECT_NEAR(s[1].entropy, 0, 1e-12);
  EXPECT_NEAR(s[1].sink, 2. / 3, 1e-6);
  EXPECT_NEAR(s[1].previous, 1, 1e-6);
  report::AttentionRow bad = uniform_row();
  bad.weights = zeros({2, 3});
  EXPECT_THROW(report::head_stats(bad), Error);
}

TEST(Explorer, PageHoldsEveryLayerHeadTokenAndWeight) {
  report::ExplorerPage page;
  page.title = "a <title> & more";
  page.rows = {uniform_row(), uniform_row()};
  page.rows[1].label = "layer 1";
  page.rows[1].queries = {"</script>", "猫", "\t", "y"};
  page.row_notes = {"", "explicit weights"};
  page.config = {{"lr", "0.005"}, {"task", "<text>"}};
  const std::string html = report::explorer_html(page);
  EXPECT_EQ(html.rfind("<!DOCTYPE html>", 0), 0u);
  EXPECT_NE(html.find("<meta charset=\"utf-8\">"), std::string::npos);
  EXPECT_NE(html.find("Content-Security-Policy\" content=\"default-src 'none'"), std::string::npos);
  EXPECT_NE(html.find("<h1>a &lt;title&gt; &amp; more</h1>"), std::string::npos);
  // Two scripts (the data, the code) and no token that closes one early.
  EXPECT_EQ(count(html, "</script>"), 2u);
  EXPECT_EQ(count(html, "<script"), 2u);
  EXPECT_NE(html.find("\"\\u003c/script\\u003e\""), std::string::npos);
  // Both rows with their heads and statistics; labels visible, Chinese as UTF-8; the shared key list once.
  EXPECT_NE(html.find("\"label\":\"layer 0\",\"heads\":2,\"lq\":4,\"lk\":3"), std::string::npos);
  EXPECT_NE(html.find("\"label\":\"layer 1\",\"heads\":2,\"lq\":4,\"lk\":3"), std::string::npos);
  EXPECT_NE(html.find("[\"a\",\"\u2423\",\"\u21B5\",\"x\"]"), std::string::npos);
  EXPECT_NE(html.find("[\"\\u003c/script\\u003e\",\"猫\",\"\u2192\",\"y\"]"), std::string::npos);
  EXPECT_EQ(count(html, "[\"a\",\"\u2423\",\"\u21B5\"]"), 1u);
  EXPECT_NE(html.find("\"note\":\"explicit weights\""), std::string::npos);
  EXPECT_NE(html.find("\"sink\":[0.611111,0.666667]"), std::string::npos);
  EXPECT_NE(html.find("<td>task</td><td>&lt;text&gt;</td>"), std::string::npos);
  // The weights round-trip exactly as float32.
  for (int r = 0; r < 2; ++r) {
    const std::vector<float> w = row_weights(html, r);
    const std::vector<double> want = page.rows[static_cast<size_t>(r)].weights.to_vector<double>();
    ASSERT_EQ(w.size(), want.size());
    for (size_t i = 0; i < w.size(); ++i) EXPECT_EQ(w[i], static_cast<float>(want[i])) << i;
  }
  // Nothing that loads from anywhere: no src or href attribute, no URL.
  EXPECT_EQ(html.find(" src="), std::string::npos);
  EXPECT_EQ(html.find(" href="), std::string::npos);
  EXPECT_EQ(html.find("http:"), std::string::npos);
  EXPECT_EQ(html.find("https:"), std::string::npos);
}

TEST(Explorer, PageWithCurvesAndWithoutRows) {
  report::ExplorerPage page;
  page.title = "no attention";
  page.note = "This model keeps no attention weights to show.";
  std::vector<train::StepMetrics> h(3);
  for (int i = 0; i < 3; ++i) h[static_cast<size_t>(i)].step = i + 1, h[static_cast<size_t>(i)].loss = 1.0 / (i + 1);
  page.curves_svg = report::curves_svg(h) + report::curves_svg(h);
  const std::string html = report::explorer_html(page);
  EXPECT_NE(html.find("<section id=\"curves\"><h2>Training curves</h2>"), std::string::npos);
  EXPECT_EQ(count(html, "<svg xmlns"), 2u);
  EXPECT_NE(html.find("Learning rate"), std::string::npos);
  EXPECT_NE(html.find("\"rows\":[]"), std::string::npos);
  EXPECT_NE(html.find("<p class=\"note\" id=\"page-note\">This model keeps no attention weights"), std::string::npos);
}

TEST(Explorer, MismatchedLabelsOrNotesAreErrors) {
  report::ExplorerPage page;
  page.rows = {uniform_row()};
  page.rows[0].keys.pop_back();
  EXPECT_THROW(report::explorer_html(page), Error);
  page.rows = {uniform_row()};
  page.row_notes = {"a", "b"};
  EXPECT_THROW(report::explorer_html(page), Error);
  page.row_notes = {};
  page.rows[0].weights = Tensor();
  EXPECT_THROW(report::explorer_html(page), Error);
}

// Every attention variant of the decoder-only model gives a row per layer; MLA and linear attention say what their
// weights are, and every row of weights of a causal model is a distribution over the keys at or before the query.
TEST(Explorer, EveryAttentionVariantHasRows) {
  for (const char* kind : {"mha", "gqa", "local", "mla", "linear"}) {
    nn::ModelSpec spec;
    spec.vocab = 12;
    spec.d_model = 16;
    spec.heads = 2;
    spec.layers = 2;
    spec.d_ff = 32;
    spec.max_source_len = 6;
    spec.max_target_len = 6;
    spec.attention.kind = kind;
    if (std::string(kind) == "gqa") spec.attention.kv_heads = 1;
    if (std::string(kind) == "local") spec.attention.window = 3;
    Generator gen(3);
    std::shared_ptr<nn::SequenceModel> m = nn::make_model("lm", spec, gen);
    const report::ExplorerPage page =
        report::explorer_page(*m, {4, 5, 6, 7}, {8, 9}, [](int64_t t) { return std::to_string(t); });
    ASSERT_EQ(page.rows.size(), 2u) << kind;
    ASSERT_EQ(page.row_notes.size(), 2u);
    const bool explained = std::string(kind) == "mla" || std::string(kind) == "linear";
    EXPECT_EQ(page.row_notes[0].empty(), !explained) << kind;
    const report::AttentionRow& r = page.rows[1];
    ASSERT_EQ(r.weights.shape(), (Shape{1, 2, 7, 7})) << kind;  // 4 + SEP + 2
    const std::vector<double> w = r.weights.to_vector<double>();
    for (int64_t h = 0; h < 2; ++h)
      for (int64_t i = 0; i < 7; ++i) {
        double sum = 0;
        for (int64_t j = 0; j < 7; ++j) {
          const double v = w[static_cast<size_t>((h * 7 + i) * 7 + j)];
          if (j > i) {
            EXPECT_EQ(v, 0) << kind;
          }
          EXPECT_GE(v, 0) << kind;
          sum += v;
        }
        EXPECT_NEAR(sum, 1, 1e-4) << kind << " head " << h << " row " << i;
      }
    EXPECT_NE(report::explorer_html(page).find("\"label\":\"layer 1\""), std::string::npos);
  }
}

}  // namespace
}  // namespace attograd
