#pragma once
// Pictures of a training run as standalone SVG files (attograd::report): no dependency, any browser shows them.
//
//  - curves_svg: two stacked panels from a Trainer's metrics history: the training loss of every step (log
//    scale; plus the held-out loss and the training-loss estimate at each evaluation) and the held-out token and sequence accuracy at each
//    evaluation (0..100 %); for a text stream a third panel of validation bits per character. Axes with "nice" ticks (1, 2, 5 x 10^k), tick labels, axis labels and a legend.
//    Then a panel of the learning rate of every step. With 20 steps or more the loss axis covers the steps after the
//    first 5 % (and every held-out loss): the first steps' larger losses are clipped, not allowed to flatten the rest.
//    Every series is one <path> with one point per record (so the training-loss path has one point per step),
//    clipped to its plot area. With attention entropies in the history (--entropy-reg, --log-entropy), a last panel
//    of the mean row entropy.
//  - attention_svg: one heatmap per head for each attention "row" (a layer, or for the encoder-decoder one
//    row per layer and kind: encoder self, decoder self, decoder cross), laid out rows x heads, tokens on both
//    axes (queries down the left, keys along the top), colours on a fixed 0..1 viridis scale with a colour bar.
//    Every cell is one <rect> inside the heatmap's <g class="cells"> group, with its value as a <title>
//    tooltip.
//  - attention_figure: runs a model once on a source and its decoded output with stored attention and
//    gathers every layer's per-head probabilities with the token labels.

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "autograd/tensor.h"
#include "train/trainer.h"

namespace attograd::nn {
class SequenceModel;
}  // namespace attograd::nn

namespace attograd::report {

/// One line of a plot: points (x[i], y[i]); non-finite y values are skipped.
struct Series {
  std::string label = {};     ///< legend text
  std::vector<double> x = {};  ///< abscissas
  std::vector<double> y = {};  ///< ordinates (same length as x)
  std::string color = "#1f77b4";  ///< any CSS colour
  bool markers = false;   ///< also draw a dot at every point (for sparse series such as evaluations)
};

/// One panel of a plot: axes, ticks, labels and a legend around some series.
struct Panel {
  std::string title = {};           ///< above the panel
  std::string x_label = {};         ///< under the x axis
  std::string y_label = {};         ///< left of the y axis (rotated)
  std::vector<Series> series = {};  ///< drawn in order
  bool log_y = false;           ///< logarithmic y axis (non-positive values are skipped)
  bool fixed_x = false;         ///< use [x_min, x_max] instead of the data's range
  double x_min = 0;             ///< with fixed_x
  double x_max = 1;             ///< with fixed_x
  bool fixed_y = false;         ///< use [y_min, y_max] instead of the data's range
  double y_min = 0;             ///< with fixed_y
  double y_max = 1;             ///< with fixed_y
};

/// Panels stacked vertically in one SVG document of the given width; each panel is panel_height tall.
std::string plot_svg(const std::vector<Panel>& panels, const std::string& title = "", int width = 760,
                     int panel_height = 300);

/// The loss panel, the accuracy panel and the learning-rate panel of a metrics history (see the file comment). For a stream model (a text
/// file: teacher-forced evaluation) the held-out series are the val loss and the next-character accuracy, and a
/// panel of validation bits per character sits between them.
std::string curves_svg(const std::vector<train::StepMetrics>& history, const std::string& title = "",
                       bool stream = false);

/// About `target` "nice" tick values (1, 2 or 5 times a power of ten apart) covering [lo, hi].
std::vector<double> nice_ticks(double lo, double hi, int target = 6);

/// Tick values for a log axis over [lo, hi] (lo > 0): powers of ten, with 2 and 5 between them on short ranges.
std::vector<double> log_ticks(double lo, double hi);

/// A colour of the viridis map for v in [0, 1] (clamped), as "#rrggbb".
std::string viridis(double v);

/// One grid row of an attention figure: the per-head probabilities of one attention layer.
struct AttentionRow {
  std::string label = {};                 ///< e.g. "layer 0" or "decoder 1 cross"
  Tensor weights = {};                    ///< (H, Lq, Lk) or (1, H, Lq, Lk), float32 or float64
  std::vector<std::string> queries = {};  ///< Lq labels (down the left of each heatmap)
  std::vector<std::string> keys = {};     ///< Lk labels (along the top of each heatmap)
};

/// Everything attention_svg draws.
struct AttentionFigure {
  std::string title = {};               ///< above the grid
  std::vector<AttentionRow> rows = {};  ///< one grid row each
};

/// The heatmap grid (rows x heads) of a figure, with a colour bar (see the file comment). Error if a row's
/// weights are not (H, Lq, Lk) / (1, H, Lq, Lk) or its labels do not match Lq and Lk.
std::string attention_svg(const AttentionFigure& figure);
/// A small figure of a title and one line of text, in place of a heatmap when a model keeps no attention
/// probabilities (multi-head latent and linear attention).
std::string note_svg(const std::string& title, const std::string& note);

/// A token as text, for axis labels.
using TokenLabel = std::function<std::string(int64_t)>;

/// Runs a model once on `src` and its decoded `output` (without EOS) with attention stored (the model's
/// attention_maps: eval mode, no gradients, training flag restored) and returns one row per attention layer, tokens
/// labelled by `label` (default: the built-in tasks' token names).
AttentionFigure attention_figure(nn::SequenceModel& model, const std::vector<int64_t>& src,
                                 const std::vector<int64_t>& output, const TokenLabel& label = {});

/// Writes text to a file (Error naming the path on failure).
void write_text_file(const std::string& path, const std::string& text);

/// `s` with &, <, >, " and ' escaped for XML.
std::string xml_escape(const std::string& s);

namespace detail {
/// `in` with & < > " escaped as entities and ' as `apostrophe` (xml_escape: "&apos;", html_escape: "&#39;").
std::string escape_markup(const std::string& in, const char* apostrophe);
}  // namespace detail

}  // namespace attograd::report
