// Training progress display: a terminal bar redrawn in place, or plain periodic lines (see train/tools/progress.h).

#include "train/tools/progress.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>

namespace attograd::train {

namespace {

double steady_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

std::string percent_of(int64_t step, int64_t total) {
  const double f = total > 0 ? 100.0 * static_cast<double>(step) / static_cast<double>(total) : 0.0;
  char buf[16];
  std::snprintf(buf, sizeof buf, "%3.0f%%", std::clamp(f, 0.0, 100.0));
  return buf;
}

std::string accuracy_text(double a) {
  if (!(a >= 0)) return "-";
  char buf[16];
  std::snprintf(buf, sizeof buf, "%.1f%%", 100 * a);
  return buf;
}

std::string loss_text(double loss) {
  char buf[32];
  std::snprintf(buf, sizeof buf, std::isfinite(loss) && std::fabs(loss) < 1e4 ? "%.4f" : "%.3g", loss);
  return buf;
}

}  // namespace

std::string format_duration(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return "-";
  const long long t = std::llround(seconds);
  char buf[32];
  if (t >= 3600)
    std::snprintf(buf, sizeof buf, "%lld:%02lld:%02lld", t / 3600, t / 60 % 60, t % 60);
  else
    std::snprintf(buf, sizeof buf, "%lld:%02lld", t / 60, t % 60);
  return buf;
}

std::string format_si(double v) {
  char buf[32];
  if (!std::isfinite(v)) return "-";
  const double a = std::fabs(v);
  if (a >= 1e9) std::snprintf(buf, sizeof buf, "%.2fG", v / 1e9);
  else if (a >= 1e6) std::snprintf(buf, sizeof buf, "%.2fM", v / 1e6);
  else if (a >= 1e4) std::snprintf(buf, sizeof buf, "%.1fk", v / 1e3);
  else if (a >= 1e3) std::snprintf(buf, sizeof buf, "%.2fk", v / 1e3);
  else std::snprintf(buf, sizeof buf, "%.0f", v);
  return buf;
}

std::string format_progress_line(const ProgressState& s) {
  return "step " + std::to_string(s.step) + "/" + std::to_string(s.total) + " (" +
         [&] {
           std::string p = percent_of(s.step, s.total);
           return p.erase(0, p.find_first_not_of(' '));
         }() +
         ") | loss " + loss_text(s.loss) + " | acc " + accuracy_text(s.accuracy) + " | " +
         format_si(s.tokens_per_second) + " tok/s | elapsed " + format_duration(s.elapsed_seconds) + " | ETA " +
         format_duration(s.eta_seconds);
}

std::string format_progress_bar(const ProgressState& s, int bar_width) {
  bar_width = std::max(bar_width, 1);
  const double f = s.total > 0 ? std::clamp(static_cast<double>(s.step) / static_cast<double>(s.total), 0.0, 1.0) : 0;
  const int filled = static_cast<int>(f * bar_width);
  std::string bar = "[" + std::string(static_cast<size_t>(filled), '#');
  if (filled < bar_width) bar += '>' + std::string(static_cast<size_t>(bar_width - filled - 1), '.');
  bar += "]";
  const std::string total = std::to_string(s.total);
  std::string step = std::to_string(s.step);
  if (step.size() < total.size()) step.insert(0, total.size() - step.size(), ' ');
  return bar + " " + step + "/" + total + " " + percent_of(s.step, s.total) + " loss " + loss_text(s.loss) +
         " acc " + accuracy_text(s.accuracy) + " " + format_si(s.tokens_per_second) + " tok/s ETA " +
         format_duration(s.eta_seconds);
}

ProgressBar::ProgressBar(int64_t total, ProgressOptions options, int64_t start_step)
    : total_(total), opts_(std::move(options)), start_step_(start_step), step_(start_step) {
  if (!opts_.out) opts_.out = stdout;
  tty_ = opts_.tty >= 0 ? opts_.tty == 1 : ::isatty(::fileno(opts_.out)) == 1;
  if (opts_.line_every <= 0) opts_.line_every = std::max<int64_t>(1, (total_ - start_step_) / 10);
  start_time_ = now();
}

ProgressBar::~ProgressBar() {
  if (bar_pending_) {
    std::fputc('\n', opts_.out);
    std::fflush(opts_.out);
  }
}

double ProgressBar::now() const { return opts_.clock ? opts_.clock() : steady_seconds(); }

ProgressState ProgressBar::state() const {
  ProgressState s;
  s.step = step_;
  s.total = total_;
  s.loss = loss_ema_;
  s.accuracy = accuracy_;
  s.elapsed_seconds = std::max(0.0, now() - start_time_);
  s.tokens_per_second = s.elapsed_seconds > 0 ? static_cast<double>(tokens_) / s.elapsed_seconds : 0;
  const int64_t done = step_ - start_step_;
  s.eta_seconds = done > 0 ? s.elapsed_seconds / static_cast<double>(done) * static_cast<double>(total_ - step_) : -1;
  return s;
}

void ProgressBar::update(int64_t step, double loss, int64_t tokens) {
  step_ = step;
  tokens_ += tokens;
  loss_ema_ = have_loss_ ? 0.9 * loss_ema_ + 0.1 * loss : loss;
  have_loss_ = true;
  const bool last = step >= total_;
  if (tty_) {
    const double t = now();
    if (last || t - last_draw_ >= opts_.redraw_seconds) {
      last_draw_ = t;
      draw();
    }
  } else if (last || step == start_step_ + 1 || (step - start_step_) % opts_.line_every == 0) {
    draw();
  }
}

void ProgressBar::set_accuracy(double accuracy) { accuracy_ = accuracy; }

void ProgressBar::draw() {
  const ProgressState s = state();
  if (tty_) {
    std::fprintf(opts_.out, "\r%s\033[K", format_progress_bar(s, opts_.bar_width).c_str());
    bar_pending_ = true;
  } else {
    std::fprintf(opts_.out, "%s\n", format_progress_line(s).c_str());
  }
  std::fflush(opts_.out);
}

void ProgressBar::message(const std::string& line) {
  if (tty_ && bar_pending_) {
    std::fprintf(opts_.out, "\r\033[K%s\n", line.c_str());
    draw();  // the bar goes back under the message
  } else {
    std::fprintf(opts_.out, "%s\n", line.c_str());
    std::fflush(opts_.out);
  }
}

void ProgressBar::finish() {
  if (finished_) return;
  finished_ = true;
  if (tty_) {
    draw();  // the final state stays on screen
    std::fputc('\n', opts_.out);
    bar_pending_ = false;
    std::fflush(opts_.out);
  }
}

}  // namespace attograd::train
