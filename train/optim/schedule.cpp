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

LRScheduler::LRScheduler(Optimizer& optimizer) : opt_(optimizer), base_lr_(optimizer.initial_lr()) {}

void LRScheduler::apply() {
  last_lr_ = lr_at(step_count_);
  opt_.set_lr(last_lr_);
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

double ConstantLR::lr_at(int64_t step) const { return constant_lr(step, base_lr(), factor_, total_iters_); }

StepLR::StepLR(Optimizer& optimizer, int64_t step_size, double gamma)
    : LRScheduler(optimizer), step_size_(step_size), gamma_(gamma) {
  apply();
}

double StepLR::lr_at(int64_t step) const { return step_lr(step, base_lr(), step_size_, gamma_); }

WarmupCosine::WarmupCosine(Optimizer& optimizer, int64_t warmup_steps, int64_t total_steps, double min_lr)
    : LRScheduler(optimizer), warmup_steps_(warmup_steps), total_steps_(total_steps), min_lr_(min_lr) {
  apply();
}

double WarmupCosine::lr_at(int64_t step) const {
  return warmup_cosine_lr(step, base_lr(), warmup_steps_, total_steps_, min_lr_);
}

NoamLR::NoamLR(Optimizer& optimizer, double lr_mul, int64_t d_model, int64_t warmup)
    : LRScheduler(optimizer), lr_mul_(lr_mul), d_model_(d_model), warmup_(warmup) {
  apply();
}

double NoamLR::lr_at(int64_t step) const { return noam_lr(step + 1, lr_mul_, d_model_, warmup_); }

}  // namespace attograd::optim
