#pragma once
// Learning-rate schedules. As in torch.optim.lr_scheduler, a schedule sets the optimizer's lr when it is
// built (lr_at(0)) and after each of its step() calls (lr_at(step_count())), and the loop reads
//     optimizer.step(); scheduler.step();
// so the t-th optimizer update (t = 1, 2, ...) runs with lr_at(t - 1). The pure functions below give the
// same values for tests and plots.

#include <cstdint>

#include "train/optim/optimizers.h"

namespace attograd::optim {

/// PyTorch's ConstantLR: base_lr * factor while step < total_iters, then base_lr.
double constant_lr(int64_t step, double base_lr, double factor = 1.0, int64_t total_iters = 0);
/// PyTorch's StepLR: base_lr * gamma^floor(step / step_size).
double step_lr(int64_t step, double base_lr, int64_t step_size, double gamma);
/// Linear warm-up then cosine decay after `step` completed steps:
/// base_lr * step / warmup_steps while step < warmup_steps; then
/// min_lr + (base_lr - min_lr) * (1 + cos(pi * (step - warmup_steps) / (total_steps - warmup_steps))) / 2;
/// min_lr from total_steps on.
double warmup_cosine_lr(int64_t step, double base_lr, int64_t warmup_steps, int64_t total_steps, double min_lr = 0);
/// The seed's schedule for its step-th update (step counted from 1):
/// lr_mul * d_model^-0.5 * min(step^-0.5, step * warmup^-1.5).
double noam_lr(int64_t step, double lr_mul, int64_t d_model, int64_t warmup);

/// Base class of the schedules: holds the optimizer, counts steps and sets the optimizer's lr.
class LRScheduler {
 public:
  virtual ~LRScheduler() = default;
  LRScheduler(const LRScheduler&) = delete;
  LRScheduler& operator=(const LRScheduler&) = delete;

  /// Advances one step and sets the optimizer's lr to lr_at(step_count()).
  void step();
  /// The lr this schedule last set on the optimizer.
  double last_lr() const { return last_lr_; }
  /// Number of step() calls made (PyTorch's last_epoch).
  int64_t step_count() const { return step_count_; }
  /// Jumps to `count` completed steps (to resume training) and sets the optimizer's lr accordingly.
  void set_step_count(int64_t count);
  /// The lr after `step` completed steps.
  virtual double lr_at(int64_t step) const = 0;
  /// The schedule's base lr: the optimizer's initial_lr().
  double base_lr() const { return base_lr_; }
  /// The optimizer whose lr this schedule sets.
  Optimizer& optimizer() { return opt_; }

 protected:
  /// Remembers the optimizer and its initial lr; derived constructors finish by calling apply().
  explicit LRScheduler(Optimizer& optimizer);
  /// Sets the optimizer's lr to lr_at(step_count()).
  void apply();

 private:
  Optimizer& opt_;
  double base_lr_ = 0;
  double last_lr_ = 0;
  int64_t step_count_ = 0;
};

/// base_lr * factor for the first total_iters steps, then base_lr (PyTorch's ConstantLR; the defaults
/// here keep the lr constant, where PyTorch's are factor 1/3 for 5 steps).
class ConstantLR : public LRScheduler {
 public:
  /// factor in [0, 1], total_iters >= 0.
  explicit ConstantLR(Optimizer& optimizer, double factor = 1.0, int64_t total_iters = 0);
  /// constant_lr(step, base_lr(), factor, total_iters).
  double lr_at(int64_t step) const override;

 private:
  double factor_;
  int64_t total_iters_;
};

/// base_lr * gamma^floor(step / step_size) (PyTorch's StepLR, in closed form).
class StepLR : public LRScheduler {
 public:
  /// step_size >= 1, gamma > 0.
  StepLR(Optimizer& optimizer, int64_t step_size, double gamma = 0.1);
  /// step_lr(step, base_lr(), step_size, gamma).
  double lr_at(int64_t step) const override;

 private:
  int64_t step_size_;
  double gamma_;
};

/// Linear warm-up from 0 to base_lr over warmup_steps, then cosine decay to min_lr at total_steps
/// (see warmup_cosine_lr; with warmup_steps = 0 it is PyTorch's CosineAnnealingLR up to T_max).
class WarmupCosine : public LRScheduler {
 public:
  /// 0 <= warmup_steps <= total_steps, total_steps >= 1, 0 <= min_lr.
  WarmupCosine(Optimizer& optimizer, int64_t warmup_steps, int64_t total_steps, double min_lr = 0);
  /// warmup_cosine_lr(step, base_lr(), warmup_steps, total_steps, min_lr).
  double lr_at(int64_t step) const override;

 private:
  int64_t warmup_steps_, total_steps_;
  double min_lr_;
};

/// The seed's warm-up schedule (ScheduledOptim in attention-is-all-you-need-pytorch): the t-th update
/// uses noam_lr(t, lr_mul, d_model, warmup), i.e. lr_at(step) = noam_lr(step + 1, ...). The optimizer's own
/// lr is ignored.
class NoamLR : public LRScheduler {
 public:
  /// lr_mul >= 0, d_model >= 1, warmup >= 1.
  NoamLR(Optimizer& optimizer, double lr_mul, int64_t d_model, int64_t warmup);
  /// noam_lr(step + 1, lr_mul, d_model, warmup).
  double lr_at(int64_t step) const override;

 private:
  double lr_mul_;
  int64_t d_model_, warmup_;
};

}  // namespace attograd::optim
