// SVG pictures of a training run: loss/accuracy curves and attention heatmaps (see train/tools/report.h).

#include "train/tools/report.h"

#include <algorithm>
#include <cmath>
#include <optional>
#include <cstdio>
#include <fstream>
#include <limits>

#include "nn/sequence_model.h"
#include "train/data/tasks.h"
#include "train/io/serialize.h"

namespace attograd::report {

namespace {

// printf into a std::string.
template <class... A>
std::string fmt(const char* f, A... a) {
  char buf[512];
  const int n = std::snprintf(buf, sizeof buf, f, a...);
  if (n < static_cast<int>(sizeof buf)) return std::string(buf, static_cast<size_t>(std::max(n, 0)));
  std::string s(static_cast<size_t>(n) + 1, '\0');
  std::snprintf(s.data(), s.size(), f, a...);
  s.resize(static_cast<size_t>(n));
  return s;
}

constexpr const char* kFont = "font-family=\"Helvetica,Arial,sans-serif\"";

std::string svg_open(int width, int height) {
  return fmt(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" viewBox=\"0 0 %d %d\" %s "
      "font-size=\"11\">\n<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n",
      width, height, width, height, kFont);
}

// A tick label: as many decimals as the tick spacing needs.
std::string tick_label(double v, double step) {
  if (std::fabs(v) < 1e-12 * std::max(1.0, step)) v = 0;
  int decimals = 0;
  if (step > 0 && step < 1) decimals = std::min(10, static_cast<int>(std::ceil(-std::log10(step) - 1e-9)));
  if (std::fabs(v) >= 1e6 || (v != 0 && std::fabs(v) < 1e-4)) return fmt("%.0e", v);
  return fmt("%.*f", decimals, v);
}

std::string log_tick_label(double v) {
  if (v >= 1e-3 && v < 1e5) {
    std::string s = fmt("%.6f", v);
    s.erase(s.find_last_not_of('0') + 1);
    if (!s.empty() && s.back() == '.') s.pop_back();
    return s;
  }
  return fmt("%.0e", v);
}

// Draws one panel with its top-left corner at (0, top).
std::string draw_panel(const Panel& p, int width, int top, int height) {
  const double left = 72, right = width - 190.0, plot_top = top + 30.0, plot_bottom = top + height - 44.0;
  std::string s;
  s += fmt("<g class=\"panel\">\n<text x=\"%.1f\" y=\"%d\" font-size=\"13\" font-weight=\"bold\">%s</text>\n", left,
           top + 18, xml_escape(p.title).c_str());

  // Data ranges.
  double xlo = std::numeric_limits<double>::infinity(), xhi = -xlo, ylo = xlo, yhi = -xlo;
  size_t points = 0;
  for (const Series& ser : p.series) {
    const size_t n = std::min(ser.x.size(), ser.y.size());
    for (size_t i = 0; i < n; ++i) {
      const double x = ser.x[i], y = ser.y[i];
      if (!std::isfinite(x) || !std::isfinite(y) || (p.log_y && y <= 0)) continue;
      xlo = std::min(xlo, x), xhi = std::max(xhi, x), ylo = std::min(ylo, y), yhi = std::max(yhi, y);
      ++points;
    }
  }
  if (points == 0) xlo = 0, xhi = 1, ylo = p.log_y ? 0.1 : 0, yhi = 1;
  if (p.fixed_x) xlo = p.x_min, xhi = p.x_max;
  if (xhi - xlo <= 0) xlo -= 1, xhi += 1;
  if (p.fixed_y) {
    ylo = p.y_min, yhi = p.y_max;
  } else if (p.log_y) {
    if (yhi / ylo < 10) {  // at least a decade, centred on the data
      const double mid = std::sqrt(ylo * yhi);
      ylo = std::min(ylo, mid / std::sqrt(10.0)), yhi = std::max(yhi, mid * std::sqrt(10.0));
    }
  } else {
    // A range of a few ulps (two series equal but for rounding) is a flat line too.
    if (yhi - ylo <= 1e-9 * std::max(std::fabs(ylo), std::fabs(yhi))) ylo -= 0.5, yhi += 0.5;
    const double pad = 0.05 * (yhi - ylo);
    ylo -= pad, yhi += pad;
  }
  auto X = [&](double x) { return left + (x - xlo) / (xhi - xlo) * (right - left); };
  auto Y = [&](double y) {
    const double f = p.log_y ? (std::log10(y) - std::log10(ylo)) / (std::log10(yhi) - std::log10(ylo))
                             : (y - ylo) / (yhi - ylo);
    return plot_bottom - f * (plot_bottom - plot_top);
  };

  // Grid, ticks and tick labels.
  const std::vector<double> xt = nice_ticks(xlo, xhi, 8);
  const double xstep = xt.size() > 1 ? xt[1] - xt[0] : 1;
  for (double t : xt) {
    const double x = X(t);
    s += fmt("<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#e5e5e5\"/>", x, plot_top, x, plot_bottom);
    s += fmt("<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#333\"/>", x, plot_bottom, x,
             plot_bottom + 5);
    s += fmt("<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">%s</text>\n", x, plot_bottom + 17,
             tick_label(t, xstep).c_str());
  }
  const std::vector<double> yt = p.log_y ? log_ticks(ylo, yhi) : nice_ticks(ylo, yhi, 6);
  const double ystep = yt.size() > 1 ? yt[1] - yt[0] : 1;
  for (double t : yt) {
    const double y = Y(t);
    s += fmt("<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#e5e5e5\"/>", left, y, right, y);
    s += fmt("<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#333\"/>", left - 5, y, left, y);
    s += fmt("<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"end\">%s</text>\n", left - 8, y + 4,
             (p.log_y ? log_tick_label(t) : tick_label(t, ystep)).c_str());
  }
  // Axes and axis labels.
  s += fmt("<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" fill=\"none\" stroke=\"#333\"/>\n", left,
           plot_top, right - left, plot_bottom - plot_top);
  s += fmt("<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">%s</text>\n", (left + right) / 2, plot_bottom + 36,
           xml_escape(p.x_label).c_str());
  const double ymid = (plot_top + plot_bottom) / 2;
  s += fmt("<text x=\"16\" y=\"%.1f\" text-anchor=\"middle\" transform=\"rotate(-90 16 %.1f)\">%s</text>\n", ymid,
           ymid, xml_escape(p.y_label).c_str());
  if (points == 0)
    s += fmt("<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\" fill=\"#888\">no data</text>\n", (left + right) / 2,
             ymid);

  // Series: one path each (one point per finite record), optional markers, and a legend entry; clipped to the plot
  // area (a fixed range may leave points outside it).
  s += fmt("<clipPath id=\"plot%d\"><rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\"/></clipPath>\n", top, left,
           plot_top, right - left, plot_bottom - plot_top);
  int legend_row = 0;
  for (const Series& ser : p.series) {
    const size_t n = std::min(ser.x.size(), ser.y.size());
    std::string d, dots;
    for (size_t i = 0; i < n; ++i) {
      const double x = ser.x[i], y = ser.y[i];
      if (!std::isfinite(x) || !std::isfinite(y) || (p.log_y && y <= 0)) continue;
      d += fmt(d.empty() ? "M%.1f,%.1f" : " L%.1f,%.1f", X(x), Y(y));
      if (ser.markers)
        dots += fmt("<circle cx=\"%.1f\" cy=\"%.1f\" r=\"3\" fill=\"%s\"/>", X(x), Y(y), ser.color.c_str());
    }
    if (!d.empty())
      s += fmt("<g clip-path=\"url(#plot%d)\"><path class=\"series\" data-label=\"%s\" fill=\"none\" stroke=\"%s\" "
               "stroke-width=\"1.5\" stroke-linejoin=\"round\" d=\"",
               top, xml_escape(ser.label).c_str(), ser.color.c_str()) +
           d + "\"/>\n" + dots + "</g>\n";
    const double ly = plot_top + 8 + 18.0 * legend_row++;
    s += fmt("<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"%s\" stroke-width=\"2\"/>", right + 14,
             ly, right + 38, ly, ser.color.c_str());
    if (ser.markers) s += fmt("<circle cx=\"%.1f\" cy=\"%.1f\" r=\"3\" fill=\"%s\"/>", right + 26, ly, ser.color.c_str());
    s += fmt("<text x=\"%.1f\" y=\"%.1f\">%s</text>\n", right + 44, ly + 4, xml_escape(ser.label).c_str());
  }
  s += "</g>\n";
  return s;
}

}  // namespace

namespace detail {

std::string escape_markup(const std::string& in, const char* apostrophe) {
  std::string s;
  s.reserve(in.size());
  for (char c : in) {
    switch (c) {
      case '&': s += "&amp;"; break;
      case '<': s += "&lt;"; break;
      case '>': s += "&gt;"; break;
      case '"': s += "&quot;"; break;
      case '\'': s += apostrophe; break;
      default: s += c;
    }
  }
  return s;
}

}  // namespace detail

std::string xml_escape(const std::string& in) { return detail::escape_markup(in, "&apos;"); }

std::vector<double> nice_ticks(double lo, double hi, int target) {
  std::vector<double> out;
  if (!std::isfinite(lo) || !std::isfinite(hi) || hi < lo) return out;
  if (hi == lo) return {lo};
  const double raw = (hi - lo) / std::max(1, target);
  const double mag = std::pow(10.0, std::floor(std::log10(raw)));
  const double r = raw / mag;
  const double step = (r <= 1 ? 1 : r <= 2 ? 2 : r <= 5 ? 5 : 10) * mag;
  const double first = std::ceil(lo / step - 1e-9) * step;
  if (!(first + step > first) || (hi - lo) / step > 1000) return {lo, hi};  // a step below the values' precision
  for (double t = first; t <= hi + 1e-9 * step; t += step) out.push_back(std::fabs(t) < 1e-12 * step ? 0.0 : t);
  return out;
}

std::vector<double> log_ticks(double lo, double hi) {
  std::vector<double> out;
  if (!(lo > 0) || !(hi >= lo) || !std::isfinite(hi)) return out;
  const int a = static_cast<int>(std::floor(std::log10(lo))), b = static_cast<int>(std::ceil(std::log10(hi)));
  const bool fine = b - a <= 2;  // short range: 1, 2, 5 per decade
  for (int e = a; e <= b; ++e) {
    for (double m : {1.0, 2.0, 5.0}) {
      if (m != 1.0 && !fine) continue;
      const double t = m * std::pow(10.0, e);
      if (t >= lo * (1 - 1e-9) && t <= hi * (1 + 1e-9)) out.push_back(t);
    }
  }
  return out;
}

std::string viridis(double v) {
  static constexpr unsigned char kStops[11][3] = {
      {0x44, 0x01, 0x54}, {0x48, 0x24, 0x75}, {0x41, 0x44, 0x87}, {0x35, 0x5f, 0x8d}, {0x2a, 0x78, 0x8e},
      {0x21, 0x91, 0x8c}, {0x22, 0xa8, 0x84}, {0x44, 0xbf, 0x70}, {0x7a, 0xd1, 0x51}, {0xbd, 0xdf, 0x26},
      {0xfd, 0xe7, 0x25}};
  if (!std::isfinite(v)) v = 0;
  v = std::clamp(v, 0.0, 1.0) * 10;
  const int i = std::min(9, static_cast<int>(v));
  const double f = v - i;
  int c[3];
  for (int k = 0; k < 3; ++k) c[k] = static_cast<int>(std::lround(kStops[i][k] + f * (kStops[i + 1][k] - kStops[i][k])));
  return fmt("#%02x%02x%02x", c[0], c[1], c[2]);
}

std::string plot_svg(const std::vector<Panel>& panels, const std::string& title, int width, int panel_height) {
  const int head = title.empty() ? 0 : 28;
  const int height = head + panel_height * static_cast<int>(std::max<size_t>(1, panels.size()));
  std::string s = svg_open(width, height);
  if (!title.empty())
    s += fmt("<text x=\"%d\" y=\"20\" font-size=\"15\" font-weight=\"bold\">%s</text>\n", 12,
             xml_escape(title).c_str());
  for (size_t i = 0; i < panels.size(); ++i)
    s += draw_panel(panels[i], width, head + static_cast<int>(i) * panel_height, panel_height);
  return s + "</svg>\n";
}

std::string curves_svg(const std::vector<train::StepMetrics>& history, const std::string& title, bool stream) {
  auto make_series = [](const char* label, const char* color, bool markers) {
    Series ser;
    ser.label = label;
    ser.color = color;
    ser.markers = markers;
    return ser;
  };
  Series loss = make_series("training loss", "#1f77b4", false);
  Series eval_loss = make_series(stream ? "val loss" : "held-out loss", "#ff7f0e", true);
  Series train_est = make_series("train loss (estimate)", "#9467bd", true);
  Series tok = make_series(stream ? "next-character accuracy" : "token accuracy", "#2ca02c", true);
  Series seq = make_series("sequence accuracy", "#d62728", true);
  std::optional<Panel> extra;  // a stream model's bits-per-character panel
  bool all_positive = true;
  for (const train::StepMetrics& m : history) {
    loss.x.push_back(static_cast<double>(m.step));
    loss.y.push_back(m.loss);
    all_positive = all_positive && !(m.loss <= 0);
    if (!m.evaluated) continue;
    const double x = static_cast<double>(m.step);
    eval_loss.x.push_back(x), eval_loss.y.push_back(m.eval.loss);
    all_positive = all_positive && !(m.eval.loss <= 0);
    if (std::isfinite(m.train_loss) && m.train_loss > 0)  // NaN in logs from before the estimate
      train_est.x.push_back(x), train_est.y.push_back(m.train_loss);
    tok.x.push_back(x), tok.y.push_back(100 * m.eval.token_accuracy);
    seq.x.push_back(x), seq.y.push_back(100 * m.eval.sequence_accuracy);
  }
  Panel lp;
  lp.title = "Loss";
  lp.x_label = "step";
  lp.y_label = all_positive ? "cross-entropy (log scale)" : "cross-entropy";
  lp.series = {loss, eval_loss};
  if (!train_est.x.empty()) lp.series.push_back(train_est);
  lp.log_y = all_positive;
  // Not dominated by the first steps: with 20 steps or more, the y range covers the training loss after the first
  // 5 % of the steps and every held-out loss; the early points above it are clipped (and the title says so).
  if (all_positive && history.size() >= 20) {
    const size_t skip = std::max<size_t>(1, history.size() / 20);
    double lo = std::numeric_limits<double>::infinity(), hi = 0;
    for (size_t i = skip; i < history.size(); ++i)
      if (std::isfinite(history[i].loss)) lo = std::min(lo, history[i].loss), hi = std::max(hi, history[i].loss);
    for (const Series* ser : {&eval_loss, &train_est})
      for (double v : ser->y)
        if (std::isfinite(v)) lo = std::min(lo, v), hi = std::max(hi, v);
    double early = 0;
    for (size_t i = 0; i < skip; ++i)
      if (std::isfinite(history[i].loss)) early = std::max(early, history[i].loss);
    if (hi > 0 && early > hi * 1.05) {
      lp.fixed_y = true;
      lp.y_min = lo / 1.1;
      lp.y_max = hi * 1.1;
      if (lp.y_max / lp.y_min < 10) {  // at least a decade, centred on the data (as an automatic log axis)
        const double mid = std::sqrt(lp.y_min * lp.y_max);
        lp.y_min = std::min(lp.y_min, mid / std::sqrt(10.0)), lp.y_max = std::max(lp.y_max, mid * std::sqrt(10.0));
      }
      if (early > lp.y_max)
        lp.title = fmt("Loss (axis from step %lld on: earlier points above it are clipped)",
                       static_cast<long long>(history[skip].step));
    }
  }
  if (stream) {
    // The same validation loss in bits per character (loss / ln 2) on a linear axis of its own.
    Series bpc = make_series("val bits per character", "#9467bd", true);
    for (size_t i = 0; i < eval_loss.x.size(); ++i)
      bpc.x.push_back(eval_loss.x[i]), bpc.y.push_back(eval_loss.y[i] / std::log(2.0));
    // And, when the data knows its tokens' bytes (a text file), in bits per byte: comparable across tokenizers.
    Series bpb = make_series("val bits per byte", "#8c564b", true);
    for (const train::StepMetrics& m : history)
      if (m.evaluated && m.eval.bits_per_byte > 0)
        bpb.x.push_back(static_cast<double>(m.step)), bpb.y.push_back(m.eval.bits_per_byte);
    Panel bp;
    // (A subword model's "character" is its token.)
    bp.title = bpb.x.empty() ? "Validation bits per character" : "Validation bits per character and per byte";
    bp.x_label = "step";
    bp.y_label = bpb.x.empty() ? "bits per character" : "bits";
    bp.series = {bpc};
    if (!bpb.x.empty()) bp.series.push_back(bpb);
    extra = bp;
  }
  Panel ap;
  ap.title = stream ? "Held-out next-character accuracy (teacher-forced)" : "Held-out accuracy (greedy decoding)";
  ap.x_label = "step";
  ap.y_label = "accuracy (%)";
  ap.series = stream ? std::vector<Series>{tok} : std::vector<Series>{tok, seq};
  ap.fixed_y = true;
  ap.y_min = 0;
  ap.y_max = 100;
  if (!history.empty()) {  // the same step axis on both panels
    lp.fixed_x = ap.fixed_x = true;
    const int64_t first = history.front().step, last = std::max(history.back().step, first + 1);
    lp.x_min = ap.x_min = static_cast<double>(first);
    lp.x_max = ap.x_max = static_cast<double>(last);
    if (extra) {
      extra->fixed_x = true;
      extra->x_min = lp.x_min;
      extra->x_max = lp.x_max;
    }
  }
  std::vector<Panel> panels = {lp};
  if (extra) panels.push_back(*extra);
  panels.push_back(ap);
  // The learning rate of every step (warmup and schedule), on the same step axis.
  Series lr = make_series("learning rate", "#17becf", false);
  for (const train::StepMetrics& m : history) lr.x.push_back(static_cast<double>(m.step)), lr.y.push_back(m.lr);
  Panel rp;
  rp.title = "Learning rate";
  rp.x_label = "step";
  rp.y_label = "lr";
  rp.series = {lr};
  rp.fixed_x = lp.fixed_x;
  rp.x_min = lp.x_min;
  rp.x_max = lp.x_max;
  panels.push_back(rp);
  // Steps that tracked attention entropies (--entropy-reg, --log-entropy): their mean row entropy.
  Series ent = make_series("mean attention row entropy", "#8c564b", false);
  for (const train::StepMetrics& m : history)
    if (!m.entropies.empty()) ent.x.push_back(static_cast<double>(m.step)), ent.y.push_back(m.entropy);
  if (!ent.x.empty()) {
    Panel ep;
    ep.title = "Attention entropy (training batches)";
    ep.x_label = "step";
    ep.y_label = "nats";
    ep.series = {ent};
    ep.fixed_x = lp.fixed_x;
    ep.x_min = lp.x_min;
    ep.x_max = lp.x_max;
    panels.push_back(ep);
  }
  return plot_svg(panels, title);
}

// ---------------------------------------------------------------------------------------------
// Attention heatmaps

std::string note_svg(const std::string& title, const std::string& note) {
  const double width = 16 + 7.0 * static_cast<double>(std::max(title.size(), note.size()));
  return fmt("<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" height=\"64\" font-family=\"sans-serif\" "
             "font-size=\"12\">\n<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n"
             "<text x=\"8\" y=\"22\" font-size=\"13\" font-weight=\"bold\">%s</text>\n"
             "<text x=\"8\" y=\"46\">%s</text>\n</svg>\n",
             width, xml_escape(title).c_str(), xml_escape(note).c_str());
}

std::string attention_svg(const AttentionFigure& figure) {
  const char* me = "attention_svg";
  ATTO_CHECK(!figure.rows.empty(), me, "the figure has no rows");
  struct RowInfo {
    int64_t heads, lq, lk;
    std::vector<double> w;  // (H, Lq, Lk)
  };
  std::vector<RowInfo> info;
  size_t max_label = 1, max_row_label = 1;
  int64_t max_len = 1, max_heads = 1, max_lk = 1;
  for (const AttentionRow& r : figure.rows) {
    ATTO_CHECK(r.weights.defined(), me, "row '", r.label, "' has no weights (was attention stored?)");
    Shape sh = r.weights.shape();
    if (sh.size() == 4) {
      ATTO_CHECK(sh[0] == 1, me, "row '", r.label, "': weights of shape ", sh, " must have batch size 1");
      sh.erase(sh.begin());
    }
    ATTO_CHECK(sh.size() == 3, me, "row '", r.label, "': weights must be (H, Lq, Lk) or (1, H, Lq, Lk), got ",
               r.weights.shape());
    ATTO_CHECK(static_cast<int64_t>(r.queries.size()) == sh[1] && static_cast<int64_t>(r.keys.size()) == sh[2], me,
               "row '", r.label, "': ", r.queries.size(), " query and ", r.keys.size(), " key labels for weights ",
               r.weights.shape());
    info.push_back({sh[0], sh[1], sh[2], r.weights.to_vector<double>()});
    for (const auto& q : r.queries) max_label = std::max(max_label, q.size());
    for (const auto& k : r.keys) max_label = std::max(max_label, k.size());
    max_row_label = std::max(max_row_label, r.label.size());
    max_len = std::max({max_len, sh[1], sh[2]});
    max_heads = std::max(max_heads, sh[0]);
    max_lk = std::max(max_lk, sh[2]);
  }

  // Layout (integer pixels): every heatmap has a label gutter on the left (queries) and on top (keys).
  const int cell = static_cast<int>(std::clamp<int64_t>(260 / max_len, 7, 22));
  const int label_w = 8 + 6 * static_cast<int>(max_label);   // query labels, font-size 9
  const int label_h = 8 + 6 * static_cast<int>(max_label);   // rotated key labels
  const int row_label_w = 16 + 7 * static_cast<int>(max_row_label);
  const int col_w = label_w + cell * static_cast<int>(max_lk) + 18;
  const int title_h = figure.title.empty() ? 12 : 34;
  const int bar_w = 80;
  std::vector<int> row_top;
  int y = title_h;
  for (const RowInfo& r : info) {
    row_top.push_back(y);
    y += 16 + label_h + cell * static_cast<int>(r.lq) + 16;
  }
  const int width = row_label_w + col_w * static_cast<int>(max_heads) + bar_w;
  const int height = std::max(y + 8, title_h + 240);

  std::string s = svg_open(width, height);
  if (!figure.title.empty())
    s += fmt("<text x=\"12\" y=\"22\" font-size=\"14\" font-weight=\"bold\">%s</text>\n",
             xml_escape(figure.title).c_str());
  for (size_t r = 0; r < info.size(); ++r) {
    const RowInfo& ri = info[r];
    const AttentionRow& row = figure.rows[r];
    const int top = row_top[r];
    const int mid = top + 16 + label_h + cell * static_cast<int>(ri.lq) / 2;
    s += fmt("<text x=\"8\" y=\"%d\" font-size=\"12\" font-weight=\"bold\">%s</text>\n", mid + 4,
             xml_escape(row.label).c_str());
    for (int64_t h = 0; h < ri.heads; ++h) {
      const int x0 = row_label_w + col_w * static_cast<int>(h);
      s += fmt("<g class=\"heatmap\" data-row=\"%s\" data-head=\"%lld\" transform=\"translate(%d,%d)\">\n",
               xml_escape(row.label).c_str(), static_cast<long long>(h), x0, top);
      s += fmt("<text x=\"%d\" y=\"12\" font-size=\"11\">head %lld</text>\n", label_w,
               static_cast<long long>(h));
      const int grid_top = 16 + label_h;
      s += "<g font-size=\"9\" font-family=\"monospace\">";
      for (int64_t j = 0; j < ri.lk; ++j) {  // key labels, rotated, reading upwards
        const int cx = label_w + cell * static_cast<int>(j) + cell / 2 + 3;
        s += fmt("<text transform=\"translate(%d,%d) rotate(-90)\">%s</text>", cx, grid_top - 4,
                 xml_escape(row.keys[static_cast<size_t>(j)]).c_str());
      }
      for (int64_t i = 0; i < ri.lq; ++i)  // query labels, right-aligned
        s += fmt("<text x=\"%d\" y=\"%d\" text-anchor=\"end\">%s</text>", label_w - 4,
                 grid_top + cell * static_cast<int>(i) + cell / 2 + 3,
                 xml_escape(row.queries[static_cast<size_t>(i)]).c_str());
      s += "</g>\n<g class=\"cells\">\n";
      const double* w = ri.w.data() + h * ri.lq * ri.lk;
      for (int64_t i = 0; i < ri.lq; ++i) {
        for (int64_t j = 0; j < ri.lk; ++j) {
          const double v = w[i * ri.lk + j];
          s += fmt("<rect x=\"%d\" y=\"%d\" width=\"%d\" height=\"%d\" fill=\"%s\"><title>%.3f</title></rect>",
                   label_w + cell * static_cast<int>(j), grid_top + cell * static_cast<int>(i), cell, cell,
                   viridis(v).c_str(), v);
        }
        s += "\n";
      }
      s += fmt("</g>\n<rect class=\"frame\" x=\"%d\" y=\"%d\" width=\"%d\" height=\"%d\" fill=\"none\" "
               "stroke=\"#999\"/>\n</g>\n",
               label_w, grid_top, cell * static_cast<int>(ri.lk), cell * static_cast<int>(ri.lq));
    }
  }

  // Colour bar: the fixed 0..1 probability scale.
  const int bx = width - bar_w + 14, by = title_h + 30, bh = 180;
  s += "<defs><linearGradient id=\"viridis\" x1=\"0\" y1=\"1\" x2=\"0\" y2=\"0\">";
  for (int k = 0; k <= 10; ++k) s += fmt("<stop offset=\"%.1f\" stop-color=\"%s\"/>", k / 10.0, viridis(k / 10.0).c_str());
  s += "</linearGradient></defs>\n";
  s += fmt("<g class=\"colorbar\"><text x=\"%d\" y=\"%d\" font-size=\"10\">probability</text>", bx - 4, by - 10);
  s += fmt("<rect x=\"%d\" y=\"%d\" width=\"14\" height=\"%d\" fill=\"url(#viridis)\" stroke=\"#999\"/>", bx, by, bh);
  for (int k = 0; k <= 4; ++k) {
    const int ty = by + bh - bh * k / 4;
    s += fmt("<line x1=\"%d\" y1=\"%d\" x2=\"%d\" y2=\"%d\" stroke=\"#333\"/><text x=\"%d\" y=\"%d\" "
             "font-size=\"10\">%.2f</text>",
             bx + 14, ty, bx + 18, ty, bx + 21, ty + 4, k / 4.0);
  }
  s += "</g>\n</svg>\n";
  return s;
}


AttentionFigure attention_figure(nn::SequenceModel& model, const std::vector<int64_t>& src,
                                 const std::vector<int64_t>& output, const TokenLabel& label) {
  auto text = [&](const std::vector<int64_t>& tokens) {
    std::string s;
    for (size_t i = 0; i < tokens.size(); ++i)
      s += (i ? " " : "") + (label ? label(tokens[i]) : data::tokens_to_string({tokens[i]}));
    return s;
  };
  auto labels = [&](const std::vector<int64_t>& tokens) {
    std::vector<std::string> out;
    for (int64_t t : tokens) out.push_back(label ? label(t) : data::tokens_to_string({t}));
    return out;
  };
  AttentionFigure fig;
  fig.title = "attention for input \"" + text(src) + "\" \u2192 output \"" +
              (output.empty() ? std::string("(nothing)") : text(output)) + "\" (rows: queries, columns: keys)";
  for (nn::AttentionMap& m : model.attention_maps(src, output))
    fig.rows.push_back(AttentionRow{m.label, m.weights, labels(m.queries), labels(m.keys)});
  return fig;
}

void write_text_file(const std::string& path, const std::string& text) {
  // Atomically, as the weights: a temporary file next to it, fsync'ed and renamed; errors name errno.
  io::detail::AtomicFile f(path, "write_text_file");
  f.write(text.data(), text.size());
  f.commit();
}

}  // namespace attograd::report
