// The attention explorer page (see train/tools/explorer.h). Its script and style are train/tools/explorer.js and
// explorer.css, embedded at build time (cmake/explorer_assets.cpp.in).

#include "train/tools/explorer.h"

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <map>

#include "autograd/error.h"
#include "nn/sequence_model.h"

namespace attograd::report {

namespace detail {
extern const char* const kExplorerScript;  // explorer.js
extern const char* const kExplorerStyle;   // explorer.css
}  // namespace detail

namespace {

// The next code point of s at i (advancing i), or -1 for an invalid or truncated UTF-8 sequence (advancing one byte).
int32_t next_code_point(const std::string& s, size_t& i) {
  const auto b = [&](size_t k) { return static_cast<unsigned char>(s[k]); };
  const unsigned char c = b(i);
  if (c < 0x80) return ++i, c;
  int n = 0;
  int32_t cp = 0, min = 0;
  if ((c & 0xE0) == 0xC0) n = 1, cp = c & 0x1F, min = 0x80;
  else if ((c & 0xF0) == 0xE0) n = 2, cp = c & 0x0F, min = 0x800;
  else if ((c & 0xF8) == 0xF0) n = 3, cp = c & 0x07, min = 0x10000;
  else return ++i, -1;
  for (int k = 1; k <= n; ++k) {
    if (i + k >= s.size() || (b(i + k) & 0xC0) != 0x80) return ++i, -1;
    cp = (cp << 6) | (b(i + k) & 0x3F);
  }
  if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return ++i, -1;
  i += static_cast<size_t>(n) + 1;
  return cp;
}

void append_utf8(std::string& out, int32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

std::string num(double v) {
  if (!std::isfinite(v)) return "null";
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.6g", v);
  return buf;
}

// float32 values as base64 of their little-endian bytes.
std::string base64_float32(const std::vector<double>& values) {
  static constexpr char kAlphabet[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string bytes;
  bytes.reserve(values.size() * 4);
  for (double v : values) {
    const float f = static_cast<float>(v);
    uint32_t u;
    std::memcpy(&u, &f, 4);
    for (int k = 0; k < 4; ++k) bytes += static_cast<char>((u >> (8 * k)) & 0xFF);
  }
  std::string out;
  out.reserve((bytes.size() + 2) / 3 * 4);
  for (size_t i = 0; i < bytes.size(); i += 3) {
    const size_t n = std::min<size_t>(3, bytes.size() - i);
    uint32_t w = 0;
    for (size_t k = 0; k < 3; ++k)
      w = (w << 8) | (k < n ? static_cast<unsigned char>(bytes[i + k]) : 0u);
    out += kAlphabet[(w >> 18) & 63];
    out += kAlphabet[(w >> 12) & 63];
    out += n > 1 ? kAlphabet[(w >> 6) & 63] : '=';
    out += n > 2 ? kAlphabet[w & 63] : '=';
  }
  return out;
}

// A row's weights as (H, Lq, Lk) doubles, after the shape checks of attention_svg.
struct RowData {
  int64_t heads = 0, lq = 0, lk = 0;
  std::vector<double> w;
};

RowData row_data(const AttentionRow& r, const char* me) {
  ATTO_CHECK(r.weights.defined(), me, "row '", r.label, "' has no weights (was attention stored?)");
  Shape sh = r.weights.shape();
  if (sh.size() == 4) {
    ATTO_CHECK(sh[0] == 1, me, "row '", r.label, "': weights of shape ", sh, " must have batch size 1");
    sh.erase(sh.begin());
  }
  ATTO_CHECK(sh.size() == 3, me, "row '", r.label, "': weights must be (H, Lq, Lk) or (1, H, Lq, Lk), got ",
             r.weights.shape());
  return {sh[0], sh[1], sh[2], r.weights.to_vector<double>()};
}

}  // namespace

std::string visible_token(const std::string& token) {
  if (token.empty()) return "\u2205";
  std::string out;
  for (size_t i = 0; i < token.size();) {
    const int32_t cp = next_code_point(token, i);
    if (cp < 0) out += "\uFFFD";
    else if (cp == ' ') out += "\u2423";
    else if (cp == '\n') out += "\u21B5";
    else if (cp == '\t') out += "\u2192";
    else if (cp < 0x20) append_utf8(out, 0x2400 + cp);
    else if (cp == 0x7F) out += "\u2421";
    else append_utf8(out, cp);
  }
  return out;
}

std::string json_string(const std::string& s) {
  std::string out = "\"";
  for (size_t i = 0; i < s.size();) {
    const int32_t cp = next_code_point(s, i);
    char buf[16];
    if (cp < 0) {
      out += "\\ufffd";
    } else if (cp == '"') {
      out += "\\\"";
    } else if (cp == '\\') {
      out += "\\\\";
    } else if (cp == '\n') {
      out += "\\n";
    } else if (cp == '\t') {
      out += "\\t";
    } else if (cp < 0x20 || cp == '<' || cp == '>' || cp == '&' || cp == 0x7F || cp == 0x2028 || cp == 0x2029) {
      std::snprintf(buf, sizeof buf, "\\u%04x", static_cast<unsigned>(cp));
      out += buf;
    } else {
      append_utf8(out, cp);
    }
  }
  return out + "\"";
}

std::string html_escape(const std::string& in) { return detail::escape_markup(in, "&#39;"); }

std::vector<HeadStats> head_stats(const AttentionRow& row) {
  const RowData d = row_data(row, "head_stats");
  std::vector<HeadStats> out(static_cast<size_t>(d.heads));
  for (int64_t h = 0; h < d.heads; ++h) {
    double ent = 0, sink = 0, prev = 0;
    int64_t rows = 0, prev_rows = 0;
    for (int64_t i = 0; i < d.lq; ++i) {
      const double* p = d.w.data() + (h * d.lq + i) * d.lk;
      double total = 0, e = 0;
      for (int64_t j = 0; j < d.lk; ++j) {
        total += p[j];
        if (p[j] > 0) e -= p[j] * std::log(p[j]);
      }
      if (!(total > 0)) continue;  // a query that sees no key
      ++rows;
      ent += e;
      sink += d.lk > 0 ? p[0] : 0;
      if (i >= 1 && i - 1 < d.lk) prev += p[i - 1], ++prev_rows;
    }
    HeadStats& s = out[static_cast<size_t>(h)];
    s.entropy = rows ? ent / static_cast<double>(rows) : 0;
    s.sink = rows ? sink / static_cast<double>(rows) : 0;
    s.previous = prev_rows ? prev / static_cast<double>(prev_rows) : 0;
  }
  return out;
}

std::string explorer_html(const ExplorerPage& page) {
  const char* me = "explorer_html";
  ATTO_CHECK(page.row_notes.empty() || page.row_notes.size() == page.rows.size(), me, page.row_notes.size(),
             " row notes for ", page.rows.size(), " rows (give none or one per row)");
  // Distinct label lists (a decoder-only model's rows share one), each label drawn visibly.
  std::map<std::vector<std::string>, size_t> label_index;
  std::vector<const std::vector<std::string>*> label_lists;
  auto labels_of = [&](const std::vector<std::string>& labels) {
    auto [it, fresh] = label_index.emplace(labels, label_lists.size());
    if (fresh) label_lists.push_back(&it->first);
    return it->second;
  };
  std::string rows = "[";
  for (size_t r = 0; r < page.rows.size(); ++r) {
    const AttentionRow& row = page.rows[r];
    const RowData d = row_data(row, me);
    ATTO_CHECK(static_cast<int64_t>(row.queries.size()) == d.lq && static_cast<int64_t>(row.keys.size()) == d.lk, me,
               "row '", row.label, "': ", row.queries.size(), " query and ", row.keys.size(),
               " key labels for weights ", row.weights.shape());
    const std::vector<HeadStats> stats = head_stats(row);
    std::string ent, sink, prev;
    for (const HeadStats& s : stats) {
      ent += (ent.empty() ? "" : ",") + num(s.entropy);
      sink += (sink.empty() ? "" : ",") + num(s.sink);
      prev += (prev.empty() ? "" : ",") + num(s.previous);
    }
    rows += (r ? ",\n{" : "\n{");
    rows += "\"label\":" + json_string(row.label) + ",\"heads\":" + std::to_string(d.heads) +
            ",\"lq\":" + std::to_string(d.lq) + ",\"lk\":" + std::to_string(d.lk) +
            ",\"q\":" + std::to_string(labels_of(row.queries)) + ",\"k\":" + std::to_string(labels_of(row.keys)) +
            ",\"note\":" + json_string(page.row_notes.empty() ? std::string() : page.row_notes[r]) +
            ",\"entropy\":[" + ent + "],\"sink\":[" + sink + "],\"previous\":[" + prev + "]" +
            ",\"w\":\"" + base64_float32(d.w) + "\"}";
  }
  rows += "]";
  std::string labels = "[";
  for (size_t l = 0; l < label_lists.size(); ++l) {
    labels += l ? ",\n[" : "\n[";
    const std::vector<std::string>& list = *label_lists[l];
    for (size_t i = 0; i < list.size(); ++i) labels += (i ? "," : "") + json_string(visible_token(list[i]));
    labels += "]";
  }
  labels += "]";
  const std::string data = "{\"title\":" + json_string(page.title) + ",\"subtitle\":" + json_string(page.subtitle) +
                           ",\"note\":" + json_string(page.note) + ",\"labels\":" + labels +
                           ",\"rows\":" + rows + "}";

  std::string s =
      "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
      "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; script-src 'unsafe-inline'; "
      "style-src 'unsafe-inline'; img-src data:\">\n"
      "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n<title>" +
      html_escape(page.title) + "</title>\n<style>\n" + detail::kExplorerStyle + "</style>\n</head>\n<body>\n";
  s += "<header><h1>" + html_escape(page.title) + "</h1>";
  if (!page.subtitle.empty()) s += "<p class=\"subtitle\">" + html_escape(page.subtitle) + "</p>";
  if (!page.note.empty()) s += "<p class=\"note\" id=\"page-note\">" + html_escape(page.note) + "</p>";
  s += "</header>\n<main id=\"app\"><noscript>This page draws with JavaScript.</noscript></main>\n";
  if (!page.curves_svg.empty()) {
    std::string svg = page.curves_svg;
    if (svg.rfind("<?xml", 0) == 0) svg.erase(0, svg.find('\n') + 1);
    s += "<section id=\"curves\"><h2>Training curves</h2>\n" + svg + "</section>\n";
  }
  if (!page.config.empty()) {
    s += "<section id=\"config\"><h2>Configuration</h2>\n<table class=\"config\">\n";
    for (const auto& [key, value] : page.config)
      s += "<tr><td>" + html_escape(key) + "</td><td>" + html_escape(value) + "</td></tr>\n";
    s += "</table></section>\n";
  }
  s += "<pre id=\"selftest\" hidden></pre>\n";
  s += "<script type=\"application/json\" id=\"attograd-data\">" + data + "</script>\n";
  s += "<script>\n" + std::string(detail::kExplorerScript) + "</script>\n</body>\n</html>\n";
  return s;
}

ExplorerPage explorer_page(nn::SequenceModel& model, const std::vector<int64_t>& src_in,
                           const std::vector<int64_t>& output_in, const TokenLabel& label) {
  std::vector<int64_t> src = src_in, output = output_in;
  std::string cut;
  if (model.spec().stream && std::ssize(src) + std::ssize(output) > kExplorerMaxTokens) {
    // A text model reads its input as one stream: show the last kExplorerMaxTokens tokens of prompt + output.
    src.insert(src.end(), output.begin(), output.end());
    output.clear();
    cut = "The input has " + std::to_string(src.size()) + " tokens; this page shows the attention over its last " +
          std::to_string(kExplorerMaxTokens) + " (all of them would make a page of layers x heads x " +
          std::to_string(src.size()) + "\u00b2 weights).";
    src.erase(src.begin(), src.end() - kExplorerMaxTokens);
  }
  auto text = [&](const std::vector<int64_t>& tokens) {
    std::string s;
    for (int64_t t : tokens) s += label(t);
    return s;
  };
  ExplorerPage page;
  page.title = "attention of a " + model.kind() + " model";
  page.subtitle = "input \u201c" + visible_token(text(src)) + "\u201d (" + std::to_string(src.size()) + " tokens)";
  if (!output.empty())
    page.subtitle += " \u2192 output \u201c" + visible_token(text(output)) + "\u201d (" +
                     std::to_string(output.size()) + " tokens)";
  for (nn::AttentionMap& m : model.attention_maps(src, output)) {
    AttentionRow row{m.label, m.weights, {}, {}};
    for (int64_t t : m.queries) row.queries.push_back(label(t));
    for (int64_t t : m.keys) row.keys.push_back(label(t));
    page.rows.push_back(std::move(row));
    page.row_notes.push_back(m.note);
  }
  if (page.rows.empty()) page.note = "This model keeps no attention weights to show.";
  else if (!cut.empty()) page.note = cut;
  return page;
}

}  // namespace attograd::report
