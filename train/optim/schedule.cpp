// Learning-rate schedules: closed-form value functions and the schedulers that apply them.

#include "train/optim/schedule.h"

#include <algorithm>
#include <cmath>
#include <numbers>

namespace attograd::optim {

// ---------------------------------------------------------------------------------------------
// Values

double constant_lr(int64_t step, double base_lr, double factor, int64_t total_iters) {
  ATTO_CHECK(step >= 0, "constant_lr", "step must be >= 0, got ", step);
  ATTO_CHECK(factor >= 0 && factor <= 1, "constant_lr", "factor must be in [0, 1], got ", factor);
  ATTO_CHECK(total_iters >= 0, "constant_lr", "total_iters must be >= 0, got ", total_iters);
  return step < total_iters ? base_lr * factor : base_lr;
}

double step_lr(int64_t step, double base_lr, int64_t step_size, double gamma) {
  ATTO_CHECK(step >= 0, "step_lr", "step must be >= 0, got ", step);
  ATTO_CHECK(step_size >= 1, "step_lr", "step_size must be >= 1, got ", step_size);
  ATTO_CHECK(gamma > 0 && std::isfinite(gamma), "step_lr", "gamma must be finite and > 0, got ", gamma);
  return base_lr * std::pow(gamma, static_cast<double>(step / step_size));
}

double warmup_cosine_lr(int64_t step, double base_lr, int64_t warmup_steps, int64_t total_steps, double min_lr) {
  ATTO_CHECK(step >= 0, "warmup_cosine_lr", "step must be >= 0, got ", step);
  ATTO_CHECK(warmup_steps >= 0, "warmup_cosine_lr", "warmup_steps must be >= 0, got ", warmup_steps);
  ATTO_CHECK(total_steps >= 1 && total_steps >= warmup_steps, "warmup_cosine_lr",
             "total_steps must be >= 1 and >= ", "warmup_steps (", warmup_steps, "), got ", total_steps);
  ATTO_CHECK(min_lr >= 0 && std::isfinite(min_lr), "warmup_cosine_lr", "min_lr must be finite and >= 0, got ", min_lr);
  if (step < warmup_steps) return base_lr * static_cast<double>(step) / static_cast<double>(warmup_steps);
  if (step >= total_steps) return min_lr;
  const double progress = static_cast<double>(step - warmup_steps) / static_cast<double>(total_steps - warmup_steps);
  return min_lr + (base_lr - min_lr) * (1 + std::cos(std::numbers::pi * progress)) / 2;
}

double nanogpt_lr(int64_t it, double learning_rate, int64_t warmup_iters, int64_t lr_decay_iters, double min_lr) {
  ATTO_CHECK(it >= 0, "nanogpt_lr", "it must be >= 0, got ", it);
  ATTO_CHECK(warmup_iters >= 0, "nanogpt_lr", "warmup_iters must be >= 0, got ", warmup_iters);
  ATTO_CHECK(lr_decay_iters >= 1 && lr_decay_iters >= warmup_iters, "nanogpt_lr",
             "lr_decay_iters must be >= 1 and >= warmup_iters (", warmup_iters, "), got ", lr_decay_iters);
  ATTO_CHECK(min_lr >= 0 && std::isfinite(min_lr), "nanogpt_lr", "min_lr must be finite and >= 0, got ", min_lr);
  // 1) linear warm-up for warmup_iters steps
  if (it < warmup_iters) return learning_rate * static_cast<double>(it + 1) / static_cast<double>(warmup_iters + 1);
  // 2) past lr_decay_iters, the floor (also at it == lr_decay_iters == warmup_iters, a 0 / 0 in nanoGPT)
  if (it > lr_decay_iters || lr_decay_iters == warmup_iters) return min_lr;
  // 3) in between, cosine decay down to min_lr
  const double decay_ratio =
      static_cast<double>(it - warmup_iters) / static_cast<double>(lr_decay_iters - warmup_iters);
  const double coeff = 0.5 * (1.0 + std::cos(std::numbers::pi * decay_ratio));
  // Rounded before the addition, as Python does: the compiler may not fuse the two into one FMA (g++ contracts
  // a * b + c by default, which would differ from nanoGPT's value in the last bit).
  const volatile double scaled = coeff * (learning_rate - min_lr);
  return min_lr + scaled;
}

double noam_lr(int64_t step, double lr_mul, int64_t d_model, int64_t warmup) {
  ATTO_CHECK(step >= 1, "noam_lr", "step is counted from 1, got ", step);
  ATTO_CHECK(lr_mul >= 0 && std::isfinite(lr_mul), "noam_lr", "lr_mul must be finite and >= 0, got ", lr_mul);
  ATTO_CHECK(d_model >= 1, "noam_lr", "d_model must be >= 1, got ", d_model);
  ATTO_CHECK(warmup >= 1, "noam_lr", "warmup must be >= 1, got ", warmup);
  const double s = static_cast<double>(step);
  const double scale = std::pow(static_cast<double>(d_model), -0.5) *
                       std::min(std::pow(s, -0.5), s * std::pow(static_cast<double>(warmup), -1.5));
  return lr_mul * scale;
}

// ---------------------------------------------------------------------------------------------
// Schedulers

const char* warmup_style_name(WarmupStyle style) { return style == WarmupStyle::NanoGPT ? "nanogpt" : "from-zero"; }

WarmupStyle parse_warmup_style(const std::string& name, const std::string& what) {
  if (name == "from-zero") return WarmupStyle::FromZero;
  if (name == "nanogpt") return WarmupStyle::NanoGPT;
  throw Error("WarmupCosine", str_cat(what, " must be from-zero or nanogpt, got \"",
                                      name.size() > 60 ? name.substr(0, 57) + "..." : name, "\""));
}

LRScheduler::LRScheduler(Optimizer& optimizer) : opt_(optimizer) {
  for (size_t g = 0; g < optimizer.num_groups(); ++g) base_lrs_.push_back(optimizer.initial_lr(g));
}

void LRScheduler::apply() {
  std::vector<double> lrs(base_lrs_.size());
  for (size_t g = 0; g < base_lrs_.size(); ++g) lrs[g] = lr_at(step_count_, base_lrs_[g]);
  for (size_t g = 0; g < lrs.size(); ++g) opt_.set_lr(g, lrs[g]);
  last_lrs_ = std::move(lrs);
}

void LRScheduler::step() {
  ++step_count_;
  apply();
}

void LRScheduler::set_step_count(int64_t count) {
  ATTO_CHECK(count >= 0, "set_step_count", "step count must be >= 0, got ", count);
  step_count_ = count;
  apply();
}

ConstantLR::ConstantLR(Optimizer& optimizer, double factor, int64_t total_iters)
    : LRScheduler(optimizer), factor_(factor), total_iters_(total_iters) {
  apply();
}

double ConstantLR::lr_at(int64_t step, double base_lr) const {
  return constant_lr(step, base_lr, factor_, total_iters_);
}

StepLR::StepLR(Optimizer& optimizer, int64_t step_size, double gamma)
    : LRScheduler(optimizer), step_size_(step_size), gamma_(gamma) {
  apply();
}

double StepLR::lr_at(int64_t step, double base_lr) const { return step_lr(step, base_lr, step_size_, gamma_); }

WarmupCosine::WarmupCosine(Optimizer& optimizer, int64_t warmup_steps, int64_t total_steps, double min_lr,
                           WarmupStyle style)
    : LRScheduler(optimizer), warmup_steps_(warmup_steps), total_steps_(total_steps), min_lr_(min_lr), style_(style) {
  apply();
}

double WarmupCosine::lr_at(int64_t step, double base_lr) const {
  if (style_ == WarmupStyle::NanoGPT) return nanogpt_lr(step, base_lr, warmup_steps_, total_steps_, min_lr_);
  return warmup_cosine_lr(step, base_lr, warmup_steps_, total_steps_, min_lr_);
}

NoamLR::NoamLR(Optimizer& optimizer, double lr_mul, int64_t d_model, int64_t warmup)
    : LRScheduler(optimizer), lr_mul_(lr_mul), d_model_(d_model), warmup_(warmup) {
  apply();
}

NoamLR::NoamLR(Optimizer& optimizer, int64_t d_model, int64_t warmup)
    : LRScheduler(optimizer), d_model_(d_model), warmup_(warmup) {
  apply();
}

double NoamLR::lr_at(int64_t step, double base_lr) const {
  return noam_lr(step + 1, lr_mul_.value_or(base_lr), d_model_, warmup_);
}

}  // namespace attograd::optim
