// train/report (SVG curves and attention heatmaps) and train/progress (the progress display).

#include <cmath>
#include <cstdio>
#include <regex>
#include <string>
#include <vector>

#include "nn/models.h"
#include "testing.h"
#include "train/tools/progress.h"
#include "train/tools/report.h"

namespace attograd {
namespace {

using report::AttentionFigure;
using report::AttentionRow;

size_t count(const std::string& s, const std::string& what) {
  size_t n = 0;
  for (size_t p = s.find(what); p != std::string::npos; p = s.find(what, p + what.size())) ++n;
  return n;
}

// The d attribute of the <path> whose data-label is `label` ("" when absent).
std::string path_of(const std::string& svg, const std::string& label) {
  const size_t at = svg.find("data-label=\"" + label + "\"");
  if (at == std::string::npos) return "";
  const size_t d = svg.find(" d=\"", at);
  return svg.substr(d + 4, svg.find('"', d + 4) - d - 4);
}

// Number of points in an SVG path written as "Mx,y Lx,y Lx,y ...".
size_t points_in(const std::string& d) { return d.empty() ? 0 : count(d, "M") + count(d, "L"); }

// Number of <rect> elements inside every <g class="cells"> group.
size_t heatmap_cells(const std::string& svg) {
  size_t n = 0;
  for (size_t p = svg.find("<g class=\"cells\">"); p != std::string::npos;
       p = svg.find("<g class=\"cells\">", p + 1)) {
    const size_t end = svg.find("</g>", p);
    n += count(svg.substr(p, end - p), "<rect ");
  }
  return n;
}

std::vector<train::StepMetrics> history(int64_t steps, int64_t eval_every) {
  std::vector<train::StepMetrics> h;
  for (int64_t s = 1; s <= steps; ++s) {
    train::StepMetrics m;
    m.step = s;
    m.loss = 3.0 / static_cast<double>(s);
    m.tokens = 100;
    if (s % eval_every == 0) {
      m.evaluated = true;
      m.eval = {.token_accuracy = 0.1 * static_cast<double>(s / eval_every), .sequence_accuracy = 0.05, .loss = 1.0 / s,
                .n = 10};
    }
    h.push_back(m);
  }
  return h;
}

TEST(Report, NiceTicks) {
  const std::vector<double> t = report::nice_ticks(0, 1, 5);
  ASSERT_EQ(t.size(), 6u);
  for (size_t i = 0; i < t.size(); ++i) EXPECT_NEAR(t[i], 0.2 * static_cast<double>(i), 1e-12);
  EXPECT_EQ(report::nice_ticks(1, 1000, 8), (std::vector<double>{200, 400, 600, 800, 1000}));
  EXPECT_EQ(report::nice_ticks(3, 3), (std::vector<double>{3}));
  EXPECT_TRUE(report::nice_ticks(2, 1).empty());
  // A range below the values' precision (a step that cannot advance) gives its ends, not an endless loop.
  const double lo = 3.5, hi = std::nextafter(std::nextafter(3.5, 4.0), 4.0);
  EXPECT_EQ(report::nice_ticks(lo - 1e-17, hi, 6), (std::vector<double>{lo - 1e-17, hi}));
}

TEST(Report, BitsPerByteEqualToBitsPerCharacterDrawsAFlatPanel) {
  // ASCII text by character: bits per byte and per character agree but for rounding (issue seen: an endless loop).
  std::vector<train::StepMetrics> h;
  for (int s = 0; s <= 2; ++s) {
    train::StepMetrics m;
    m.step = s;
    m.loss = 2.0;
    m.evaluated = true;
    m.eval.loss = 2.4889;
    m.eval.bits_per_byte = std::nextafter(2.4889 / std::log(2.0), 10.0);
    h.push_back(m);
  }
  const std::string svg = report::curves_svg(h, "flat", true);
  EXPECT_NE(svg.find("val bits per byte"), std::string::npos);
  EXPECT_NE(svg.find("Validation bits per character and per byte"), std::string::npos);
}

TEST(Report, LogTicks) {
  const std::vector<double> t = report::log_ticks(0.001, 10);
  ASSERT_EQ(t.size(), 5u);
  EXPECT_NEAR(t[0], 0.001, 1e-15);
  EXPECT_NEAR(t[4], 10, 1e-12);
  // A short range gets 1, 2, 5 per decade.
  const std::vector<double> s = report::log_ticks(0.3, 8);  // two decades or less: 1, 2, 5 in each
  ASSERT_EQ(s.size(), 4u);
  EXPECT_NEAR(s[0], 0.5, 1e-15);
  EXPECT_NEAR(s[3], 5, 1e-12);
  EXPECT_EQ(report::log_ticks(0.5, 30).size(), 2u);  // longer ranges: powers of ten only (1, 10)
  EXPECT_TRUE(report::log_ticks(0, 1).empty());
}

TEST(Report, Viridis) {
  EXPECT_EQ(report::viridis(0), "#440154");
  EXPECT_EQ(report::viridis(1), "#fde725");
  EXPECT_EQ(report::viridis(0.5), "#21918c");
  EXPECT_EQ(report::viridis(-3), "#440154");
  EXPECT_EQ(report::viridis(7), "#fde725");
}

TEST(Report, CurvesHaveOnePointPerMetricRow) {
  const std::vector<train::StepMetrics> h = history(37, 10);
  const std::string svg = report::curves_svg(h, "a <run> & more");
  EXPECT_EQ(svg.rfind("<svg xmlns=\"http://www.w3.org/2000/svg\"", 0), 0u);
  EXPECT_NE(svg.find("</svg>"), std::string::npos);
  EXPECT_EQ(points_in(path_of(svg, "training loss")), 37u);
  EXPECT_EQ(points_in(path_of(svg, "held-out loss")), 3u);
  EXPECT_EQ(points_in(path_of(svg, "token accuracy")), 3u);
  EXPECT_EQ(points_in(path_of(svg, "sequence accuracy")), 3u);
  EXPECT_EQ(count(svg, "<circle"), 3u * 3 + 3);  // markers of the three evaluation series + their legend dots
  EXPECT_NE(svg.find("a &lt;run&gt; &amp; more"), std::string::npos);
  EXPECT_NE(svg.find("cross-entropy (log scale)"), std::string::npos);
  EXPECT_NE(svg.find(">step<"), std::string::npos);
  EXPECT_NE(svg.find(">100<"), std::string::npos);  // accuracy axis tick
}

TEST(Report, CurvesHaveALearningRatePanelAndALossAxisNotDominatedByTheFirstSteps) {
  std::vector<train::StepMetrics> h = history(100, 10);
  for (auto& m : h) m.lr = m.step <= 10 ? 1e-3 * static_cast<double>(m.step) / 10 : 1e-3;  // warmup, then flat
  const std::string svg = report::curves_svg(h);
  EXPECT_NE(svg.find(">Learning rate</text>"), std::string::npos);
  EXPECT_EQ(points_in(path_of(svg, "learning rate")), 100u);
  // loss 3 / step: the axis starts after the first 5 steps, so the loss of steps 1-5 (3 .. 0.6) is clipped.
  EXPECT_NE(svg.find("Loss (axis from step 6 on: earlier points above it are clipped)"), std::string::npos);
  EXPECT_EQ(points_in(path_of(svg, "training loss")), 100u);  // still every point, clipped to the plot area
  EXPECT_EQ(count(svg, "<clipPath id=\"plot"), 3u);
  EXPECT_NE(svg.find("clip-path=\"url(#plot"), std::string::npos);
  // A flat loss, or fewer than 20 steps: the axis covers every point.
  for (auto& m : h) m.loss = 2.0;
  EXPECT_EQ(report::curves_svg(h).find("clipped"), std::string::npos);
  EXPECT_EQ(report::curves_svg(history(19, 10)).find("clipped"), std::string::npos);
}

TEST(Report, CurvesAddAnEntropyPanelOnlyWhenEntropiesWereTracked) {
  std::vector<train::StepMetrics> h = history(12, 5);
  EXPECT_EQ(report::curves_svg(h).find("Attention entropy"), std::string::npos);
  for (size_t i = 4; i < h.size(); ++i) {  // tracked from step 5 on (e.g. a resumed run)
    h[i].entropies = {1.0, 2.0};
    h[i].entropy = 1.5;
  }
  const std::string svg = report::curves_svg(h);
  EXPECT_NE(svg.find("Attention entropy"), std::string::npos);
  EXPECT_EQ(points_in(path_of(svg, "mean attention row entropy")), 8u);
  EXPECT_EQ(points_in(path_of(svg, "training loss")), 12u);
}

TEST(Report, CurvesWithoutEvaluationsOrData) {
  const std::string one = report::curves_svg(history(5, 100));
  EXPECT_EQ(points_in(path_of(one, "training loss")), 5u);
  EXPECT_EQ(path_of(one, "token accuracy"), "");
  EXPECT_NE(one.find("no data"), std::string::npos);  // the accuracy panel
  const std::string none = report::curves_svg({});
  EXPECT_EQ(count(none, "no data"), 3u);  // loss, accuracy, learning rate
  // A non-positive loss switches the loss axis to linear.
  std::vector<train::StepMetrics> h = history(4, 100);
  h[2].loss = 0;
  const std::string lin = report::curves_svg(h);
  EXPECT_EQ(lin.find("log scale"), std::string::npos);
  EXPECT_EQ(points_in(path_of(lin, "training loss")), 4u);
}

TEST(Report, PlotSkipsNonFinitePoints) {
  report::Panel p;
  report::Series s;
  s.label = "s";
  s.x = {1, 2, 3, 4};
  s.y = {1, std::nan(""), 3, INFINITY};
  p.series = {s};
  EXPECT_EQ(points_in(path_of(report::plot_svg({p}), "s")), 2u);
}

AttentionFigure figure(int64_t rows, int64_t heads, int64_t lq, int64_t lk) {
  Generator gen(3);
  AttentionFigure f;
  f.title = "test";
  for (int64_t r = 0; r < rows; ++r) {
    AttentionRow row;
    row.label = str_cat("layer ", r);
    row.weights = softmax(rand({1, heads, lq, lk}, gen), -1);
    for (int64_t i = 0; i < lq; ++i) row.queries.push_back(i == 0 ? "<sep>" : std::to_string(i));
    for (int64_t j = 0; j < lk; ++j) row.keys.push_back(std::to_string(j));
    f.rows.push_back(row);
  }
  return f;
}

TEST(Report, AttentionHasOneCellPerWeight) {
  const std::string svg = report::attention_svg(figure(2, 3, 4, 5));
  EXPECT_EQ(heatmap_cells(svg), 2u * 3 * 4 * 5);
  EXPECT_EQ(count(svg, "class=\"heatmap\""), 6u);
  EXPECT_EQ(count(svg, ">head 2<"), 2u);
  EXPECT_NE(svg.find(">layer 1<"), std::string::npos);
  EXPECT_NE(svg.find("&lt;sep&gt;"), std::string::npos);
  EXPECT_EQ(svg.find("<sep>"), std::string::npos);
  EXPECT_NE(svg.find("class=\"colorbar\""), std::string::npos);
  EXPECT_EQ(count(svg, "<stop "), 11u);
}

TEST(Report, AttentionRowsMayDiffer) {
  AttentionFigure f = figure(1, 2, 3, 3);
  AttentionFigure g = figure(1, 2, 4, 3);  // cross attention: 4 queries over 3 keys, 3-D weights
  g.rows[0].weights = reshape(g.rows[0].weights, {2, 4, 3});
  f.rows.push_back(g.rows[0]);
  EXPECT_EQ(heatmap_cells(report::attention_svg(f)), 2u * 9 + 2u * 12);
}

TEST(Report, AttentionErrors) {
  AttentionFigure f = figure(1, 2, 3, 3);
  f.rows[0].queries.pop_back();
  EXPECT_ATTO_ERROR(report::attention_svg(f), "2 query and 3 key labels");
  EXPECT_ATTO_ERROR(report::attention_svg(AttentionFigure{}), "no rows");
  AttentionFigure g = figure(1, 2, 3, 3);
  g.rows[0].weights = Tensor();
  EXPECT_ATTO_ERROR(report::attention_svg(g), "no weights");
  AttentionFigure h = figure(1, 2, 3, 3);
  h.rows[0].weights = zeros({2, 2, 3, 3});
  EXPECT_ATTO_ERROR(report::attention_svg(h), "batch size 1");
}

TEST(Report, AttentionFigureOfCausalLM) {
  Generator gen(5);
  nn::CausalLM lm({.vocab = 15, .d_model = 8, .n_head = 2, .d_ff = 16, .n_layers = 3, .max_len = 16}, gen);
  lm.train();
  const AttentionFigure f = report::attention_figure(lm, {5, 6, 7}, {7, 6});
  ASSERT_EQ(f.rows.size(), 3u);
  EXPECT_EQ(f.rows[0].weights.shape(), (Shape{1, 2, 6, 6}));  // 5 6 7 <sep> 7 6
  EXPECT_EQ(f.rows[2].queries, (std::vector<std::string>{"0", "1", "2", "<sep>", "2", "1"}));
  EXPECT_TRUE(lm.is_training());                 // restored
  EXPECT_FALSE(lm.attention_weights()[0].defined());  // storing switched off again
  // Causal: nothing above the diagonal; every row sums to 1.
  const Tensor w = f.rows[1].weights;
  for (int64_t i = 0; i < 6; ++i) {
    double rowsum = 0;
    for (int64_t j = 0; j < 6; ++j) {
      if (j > i) {
        EXPECT_EQ(w.at({0, 1, i, j}), 0.0);
      }
      rowsum += w.at({0, 1, i, j});
    }
    EXPECT_NEAR(rowsum, 1.0, 1e-5);
  }
  EXPECT_EQ(heatmap_cells(report::attention_svg(f)), 3u * 2 * 36);
}

TEST(Report, AttentionFigureOfTransformer) {
  Generator gen(6);
  nn::seed::Transformer t(
      {.src_vocab = 15, .tgt_vocab = 15, .d_model = 8, .n_head = 2, .d_k = 4, .d_v = 4, .d_inner = 16, .n_layers = 2,
       .n_position = 16},
      gen);
  t.eval();
  const AttentionFigure f = report::attention_figure(t, {5, 6, 7, 8}, {8, 7});
  ASSERT_EQ(f.rows.size(), 6u);  // encoder 0, encoder 1, decoder 0 self, decoder 0 cross, decoder 1 self, cross
  EXPECT_EQ(f.rows[0].label, "encoder 0 self");
  EXPECT_EQ(f.rows[0].weights.shape(), (Shape{1, 2, 4, 4}));
  EXPECT_EQ(f.rows[2].label, "decoder 0 self");
  EXPECT_EQ(f.rows[2].weights.shape(), (Shape{1, 2, 3, 3}));  // <bos> 8 7
  EXPECT_EQ(f.rows[3].label, "decoder 0 cross");
  EXPECT_EQ(f.rows[3].weights.shape(), (Shape{1, 2, 3, 4}));
  EXPECT_EQ(f.rows[3].queries.front(), "<bos>");
  EXPECT_FALSE(t.is_training());
  EXPECT_EQ(heatmap_cells(report::attention_svg(f)), 2u * (2 * 16 + 2 * 9 + 2 * 12));
}

TEST(Report, WriteTextFile) {
  const std::string path = ::testing::TempDir() + "report_test.svg";
  report::write_text_file(path, "<svg/>");
  std::ifstream f(path);
  std::string s;
  std::getline(f, s);
  EXPECT_EQ(s, "<svg/>");
  std::remove(path.c_str());
  // Written atomically: the temporary file next to it cannot be created; the message names errno.
  EXPECT_ATTO_ERROR(report::write_text_file("/nonexistent-dir/x.svg", ""), "No such file or directory");
}

// ---------------------------------------------------------------------------------------------
// progress

TEST(Progress, Formats) {
  EXPECT_EQ(train::format_duration(5.4), "0:05");
  EXPECT_EQ(train::format_duration(65), "1:05");
  EXPECT_EQ(train::format_duration(3723), "1:02:03");
  EXPECT_EQ(train::format_duration(-1), "-");
  EXPECT_EQ(train::format_duration(NAN), "-");
  EXPECT_EQ(train::format_si(950), "950");
  EXPECT_EQ(train::format_si(1234), "1.23k");
  EXPECT_EQ(train::format_si(12345), "12.3k");
  EXPECT_EQ(train::format_si(4.56e6), "4.56M");
  train::ProgressState s{.step = 500, .total = 2000, .loss = 0.40131, .accuracy = 0.7563,
                         .tokens_per_second = 12345, .elapsed_seconds = 15, .eta_seconds = 45};
  EXPECT_EQ(train::format_progress_line(s),
            "step 500/2000 (25%) | loss 0.4013 | acc 75.6% | 12.3k tok/s | elapsed 0:15 | ETA 0:45");
  EXPECT_EQ(train::format_progress_bar(s, 20),
            "[#####>..............]  500/2000  25% loss 0.4013 acc 75.6% 12.3k tok/s ETA 0:45");
  s.accuracy = -1;
  s.eta_seconds = -1;
  s.step = 2000;
  EXPECT_EQ(train::format_progress_bar(s, 4), "[####] 2000/2000 100% loss 0.4013 acc - 12.3k tok/s ETA -");
}

// Runs a progress display over `steps` steps writing into memory, one simulated second per step.
std::string run_bar(int tty, int64_t total, int64_t start, int64_t line_every = 0) {
  char* buf = nullptr;
  size_t len = 0;
  std::FILE* out = open_memstream(&buf, &len);
  double clock = 0;
  {
    train::ProgressBar bar(total,
                           {.out = out, .tty = tty, .line_every = line_every, .redraw_seconds = 0.0,
                            .clock = [&] { return clock; }},
                           start);
    for (int64_t s = start + 1; s <= total; ++s) {
      clock += 1.0;
      bar.update(s, 2.0, 100);
      if (s == total / 2) {
        bar.set_accuracy(0.5);
        bar.message("eval line");
      }
    }
    bar.finish();
    bar.finish();  // idempotent
  }
  std::fclose(out);
  std::string text(buf, len);
  std::free(buf);
  return text;
}

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> lines;
  size_t start = 0;
  for (size_t p = text.find('\n'); p != std::string::npos; p = text.find('\n', start)) {
    lines.push_back(text.substr(start, p - start));
    start = p + 1;
  }
  if (start < text.size()) lines.push_back(text.substr(start));
  return lines;
}

TEST(Progress, PlainLinesWhenNotATerminal) {
  const std::string text = run_bar(0, 20, 0);
  EXPECT_EQ(text.find('\r'), std::string::npos);
  EXPECT_EQ(text.find('\033'), std::string::npos);
  const std::vector<std::string> lines = lines_of(text);
  // Step 1, then every 2 steps (20 / 10) up to 20, and the message line.
  ASSERT_EQ(lines.size(), 1u + 10u + 1u);
  EXPECT_EQ(lines[0], "step 1/20 (5%) | loss 2.0000 | acc - | 100 tok/s | elapsed 0:01 | ETA 0:19");
  EXPECT_EQ(lines[1], "step 2/20 (10%) | loss 2.0000 | acc - | 100 tok/s | elapsed 0:02 | ETA 0:18");
  EXPECT_EQ(lines[6], "eval line");
  EXPECT_EQ(lines.back(), "step 20/20 (100%) | loss 2.0000 | acc 50.0% | 100 tok/s | elapsed 0:20 | ETA 0:00");
  const std::regex line_re(R"(step \d+/20 \(\d+%\) \| loss \d+\.\d{4} \| acc (-|\d+\.\d%) \| \d+ tok/s \| elapsed \d+:\d\d \| ETA \d+:\d\d)");
  for (const std::string& l : lines)
    if (l != "eval line") {
      EXPECT_TRUE(std::regex_match(l, line_re)) << l;
    }
}

TEST(Progress, PlainLinesWhenResuming) {
  const std::vector<std::string> lines = lines_of(run_bar(0, 30, 20, 5));
  // Steps 21 (the first), 25 and 30, plus the message at step 15? No: the message is at total / 2 = 15 < 21.
  ASSERT_EQ(lines.size(), 3u);
  EXPECT_EQ(lines[0].rfind("step 21/30 (70%)", 0), 0u);
  EXPECT_EQ(lines[2].rfind("step 30/30 (100%)", 0), 0u);
  EXPECT_NE(lines[2].find("elapsed 0:10 | ETA 0:00"), std::string::npos);
}

TEST(Progress, RedrawsInPlaceOnATerminal) {
  const std::string text = run_bar(1, 10, 0);
  EXPECT_NE(text.find("\r[####################] 10/10 100%"), std::string::npos);
  EXPECT_NE(text.find("\r\033[Keval line\n"), std::string::npos);
  EXPECT_EQ(text.back(), '\n');
  EXPECT_EQ(count(text, "\n"), 2u);  // the message and the final newline only
}

TEST(Progress, State) {
  double clock = 100;
  train::ProgressBar bar(10, {.out = stderr, .tty = 0, .line_every = 1000, .clock = [&] { return clock; }});
  EXPECT_EQ(bar.state().eta_seconds, -1);
  clock = 102;
  bar.update(1, 4.0, 50);  // prints the first line to stderr
  clock = 104;
  bar.update(2, 2.0, 50);
  const train::ProgressState s = bar.state();
  EXPECT_EQ(s.step, 2);
  EXPECT_DOUBLE_EQ(s.loss, 0.9 * 4.0 + 0.1 * 2.0);
  EXPECT_DOUBLE_EQ(s.tokens_per_second, 100.0 / 4.0);
  EXPECT_DOUBLE_EQ(s.eta_seconds, 2.0 * 8);
  EXPECT_FALSE(bar.is_tty());
}

}  // namespace

TEST(Report, StreamCurvesShowValLossBitsPerCharacterAndNextCharacterAccuracy) {
  const std::vector<train::StepMetrics> h = history(37, 10);
  const std::string svg = report::curves_svg(h, "poems", /*stream=*/true);
  EXPECT_EQ(points_in(path_of(svg, "training loss")), 37u);
  EXPECT_EQ(points_in(path_of(svg, "val loss")), 3u);
  EXPECT_EQ(points_in(path_of(svg, "val bits per character")), 3u);
  EXPECT_EQ(points_in(path_of(svg, "next-character accuracy")), 3u);
  EXPECT_EQ(path_of(svg, "sequence accuracy"), "");  // a text window has no "sequence" to get right
  EXPECT_NE(svg.find("Validation bits per character"), std::string::npos);
  EXPECT_NE(svg.find("teacher-forced"), std::string::npos);
  EXPECT_EQ(count(svg, "<circle"), 3u * 3 + 3);
}

}  // namespace attograd
