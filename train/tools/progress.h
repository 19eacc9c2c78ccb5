#pragma once
// A training progress display (attograd::train): on a terminal, one status line redrawn in place with '\r'
//     [########>...........]  500/2000  25% loss 0.4013 acc 75.6% 12.3k tok/s ETA 0:45
// and, when the output is not a terminal (a pipe, a log file, CI), plain lines every few steps:
//     step 500/2000 (25%) | loss 0.4013 | acc 75.6% | 12.3k tok/s | elapsed 0:15 | ETA 0:45
// "loss" is an exponential moving average (factor 0.9) of the per-step training loss, "acc" the last held-out
// accuracy reported (or "-"), "tok/s" the tokens reported since the bar started per wall-clock second, and the ETA
// extrapolates the mean time per step so far.

#include <cstdint>
#include <cstdio>
#include <functional>
#include <string>

namespace attograd::train {

/// What a progress display shows at one moment.
struct ProgressState {
  int64_t step = 0;               ///< steps done
  int64_t total = 0;              ///< steps planned
  double loss = 0;                ///< (smoothed) training loss
  double accuracy = -1;           ///< held-out accuracy in [0, 1]; negative or NaN: none yet
  double tokens_per_second = 0;   ///< throughput
  double elapsed_seconds = 0;     ///< since the display started
  double eta_seconds = -1;        ///< remaining; negative or NaN: unknown
};

/// "0:07", "1:05", "1:02:03"; "-" for negative or non-finite seconds.
std::string format_duration(double seconds);
/// "950", "12.3k", "4.56M" (for rates and counts).
std::string format_si(double value);
/// The plain (non-terminal) line, without a newline (see the file comment).
std::string format_progress_line(const ProgressState& s);
/// The terminal status line with a bar of `bar_width` characters, without '\r' or newline.
std::string format_progress_bar(const ProgressState& s, int bar_width = 20);

/// How a ProgressBar writes.
struct ProgressOptions {
  std::FILE* out = stdout;        ///< where to write
  int tty = -1;                   ///< 1: redraw in place; 0: plain lines; -1: isatty(out)
  int64_t line_every = 0;         ///< plain mode: a line every this many steps (0: total / 10), plus the first and last
  double redraw_seconds = 0.1;    ///< terminal mode: at most one redraw per interval (the last step always redraws)
  int bar_width = 20;             ///< characters of the bar
  std::function<double()> clock;  ///< seconds since some origin; empty: std::chrono::steady_clock
};

/// Shows training progress (see the file comment). Not thread-safe.
class ProgressBar {
 public:
  /// A display for steps start_step + 1 .. total (start_step > 0 when resuming).
  explicit ProgressBar(int64_t total, ProgressOptions options = {}, int64_t start_step = 0);
  /// Clears a pending terminal line (as finish()).
  ~ProgressBar();
  ProgressBar(const ProgressBar&) = delete;
  ProgressBar& operator=(const ProgressBar&) = delete;

  /// Records step `step` (its training loss and the target tokens it processed) and redraws or prints a line
  /// when due.
  void update(int64_t step, double loss, int64_t tokens);
  /// Sets the accuracy shown from now on (e.g. after an evaluation), in [0, 1].
  void set_accuracy(double accuracy);
  /// Prints a line of its own (e.g. an evaluation result) without garbling the terminal bar.
  void message(const std::string& line);
  /// Ends the display: on a terminal, the last bar stays and a newline follows. Idempotent.
  void finish();
  /// Whether the display redraws in place.
  bool is_tty() const { return tty_; }
  /// What the display would show now.
  ProgressState state() const;

 private:
  double now() const;
  void draw();

  int64_t total_;
  ProgressOptions opts_;
  bool tty_;
  int64_t start_step_;
  int64_t step_;
  double start_time_;
  double last_draw_ = -1e300;
  double loss_ema_ = 0;
  bool have_loss_ = false;
  double accuracy_ = -1;
  int64_t tokens_ = 0;
  bool bar_pending_ = false;  // a terminal line is on screen without its newline
  bool finished_ = false;
};

}  // namespace attograd::train
