#pragma once
// The attention explorer (attograd::report): one self-contained, interactive HTML page of a model's attention on one
// input. Every script, style and number is inline; the page makes no network request (its Content-Security-Policy
// forbids any) and opens from file:// in any current browser. It shows
//  - the model view: one small heatmap (a <canvas class="panel">) per attention row (layer) and head;
//  - the head view of the selected layer and head: the queries down the left and the keys down the right, joined by
//    lines whose opacity is the weight; hovering a query shows what it attends to, hovering a key what attends to
//    it (the other side's tokens coloured by the weight, the exact weights in a read-out), a click pins the token;
//    beside it the head's heatmap at full size, the exact weight of the cell under the mouse in the read-out;
//  - a sortable table of every head's mean row entropy, attention-sink share (weight on the first position) and
//    previous-token share;
//  - optionally the training curves (an inline SVG) and the run's configuration as a table.
// Token labels are drawn visibly (visible_token): U+2423 for a space, U+21B5 for a newline, U+2192 for a tab,
// control pictures for other control characters; every other character as it is (UTF-8). Weights travel as
// base64 float32, so a 256-token context stays small and the page draws with canvases, not a DOM node per cell.
// With "#selftest" in its address the page runs a self-test after loading (simulated hover and click) and writes
// the result as JSON into <pre id="selftest">, for a headless browser's --dump-dom (tests/cli/browser_test.sh).

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "train/tools/report.h"

namespace attograd::report {

/// One head's summary statistics over the query rows that attend to anything (a row of zeros, a query that sees
/// no key, is left out).
struct HeadStats {
  double entropy = 0;  ///< mean over rows of -sum_j p_ij log p_ij (nats)
  double sink = 0;     ///< mean over rows of p_i0: the weight on the first position
  double previous = 0; ///< mean over rows i >= 1 of p_i,i-1: the weight on the previous position (0 when Lq == 1)
};

/// Per head, the statistics of a row's weights (H, Lq, Lk) or (1, H, Lq, Lk). Error on another shape.
std::vector<HeadStats> head_stats(const AttentionRow& row);

/// What explorer_html draws (see the file comment).
struct ExplorerPage {
  std::string title = {};                ///< the page's heading and <title>
  std::string subtitle = {};             ///< a line under the heading (model, input), may be empty
  std::vector<AttentionRow> rows = {};   ///< the attention rows (layers); labels as given (raw text)
  std::vector<std::string> row_notes = {};  ///< per row: what its weights are when not softmax probabilities
                                            ///< (empty or as many as rows)
  std::string note = {};                 ///< shown above the views (e.g. why there are no rows); may be empty
  std::string curves_svg = {};           ///< an inline SVG (curves_svg) for a "Training curves" section; may be empty
  std::vector<std::pair<std::string, std::string>> config = {};  ///< (key, value) rows of a "Configuration" table
};

/// The page (see the file comment). Error if a row's weights or labels do not match (as attention_svg).
std::string explorer_html(const ExplorerPage& page);

/// The most tokens a page shows: a page holds layers x heads x L^2 weights (at L = 4,096 and 8 heads, hundreds of
/// MB), so a longer text input is shown through its last kExplorerMaxTokens tokens (the page note says so).
inline constexpr int64_t kExplorerMaxTokens = 512;

/// The rows and row notes of a page for a model run once on `src` and its `output` (the model's attention_maps, as
/// attention_figure), tokens labelled by `label`; a page note when the model has no attention maps. Title and
/// subtitle say what the input was. A text (stream) model's input longer than kExplorerMaxTokens (src and output
/// together) is cut to its last kExplorerMaxTokens tokens, as the model's own window slides.
ExplorerPage explorer_page(nn::SequenceModel& model, const std::vector<int64_t>& src,
                           const std::vector<int64_t>& output, const TokenLabel& label);

/// A token label drawn visibly: space -> U+2423, newline -> U+21B5, tab -> U+2192, carriage return -> U+240D,
/// other C0 controls -> their control pictures (U+2400 + c), DEL -> U+2421, the empty string -> U+2205; invalid
/// UTF-8 bytes -> U+FFFD; everything else unchanged.
std::string visible_token(const std::string& token);

/// `s` as a JSON string literal (with the quotes) that is safe inside an HTML <script>: ", \ and control characters
/// escaped, <, >, & and U+2028/U+2029 as \uXXXX, invalid UTF-8 as U+FFFD; other characters as UTF-8.
std::string json_string(const std::string& s);

/// `s` with &, <, >, " and ' escaped for HTML text and attribute values.
std::string html_escape(const std::string& s);

}  // namespace attograd::report
