#pragma once
// Learning-rate schedules. As in torch.optim.lr_scheduler, a schedule sets the optimizer's lr when it is
// built (lr_at(0)) and after each of its step() calls (lr_at(step_count())), and the loop reads
//     optimizer.step(); scheduler.step();
// so the t-th optimizer update (t = 1, 2, ...) runs with lr_at(t - 1). With parameter groups, each group's lr
// follows the schedule from the group's own initial lr (as PyTorch's schedulers scale each group's initial_lr):
// group g gets lr_at(step, optimizer.initial_lr(g)). The pure functions below give the same values for tests and
// plots.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

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
/// nanoGPT's get_lr(it) (train.py), `it` the number of completed steps (the update it + 1 uses it):
/// learning_rate * (it + 1) / (warmup_iters + 1) while it < warmup_iters; min_lr when it > lr_decay_iters; else
/// min_lr + 0.5 * (1 + cos(pi * (it - warmup_iters) / (lr_decay_iters - warmup_iters))) * (learning_rate - min_lr)
/// (min_lr at it == lr_decay_iters == warmup_iters, where nanoGPT divides by zero).
double nanogpt_lr(int64_t it, double learning_rate, int64_t warmup_iters, int64_t lr_decay_iters, double min_lr);
/// The seed's schedule for its step-th update (step counted from 1):
/// lr_mul * d_model^-0.5 * min(step^-0.5, step * warmup^-1.5).
double noam_lr(int64_t step, double lr_mul, int64_t d_model, int64_t warmup);

/// Base class of the schedules: holds the optimizer, counts steps and sets the optimizer's lr.
class LRScheduler {
 public:
  virtual ~LRScheduler() = default;
  LRScheduler(const LRScheduler&) = delete;
  LRScheduler& operator=(const LRScheduler&) = delete;

  /// Advances one step and sets each group's lr to lr_at(step_count(), its initial lr).
  void step();
  /// The lr this schedule last set on the optimizer's group 0.
  double last_lr() const { return last_lrs_.at(0); }
  /// The lrs this schedule last set, one per parameter group (PyTorch's get_last_lr()).
  const std::vector<double>& last_lrs() const { return last_lrs_; }
  /// Number of step() calls made (PyTorch's last_epoch).
  int64_t step_count() const { return step_count_; }
  /// Jumps to `count` completed steps (to resume training) and sets the optimizer's lrs accordingly.
  void set_step_count(int64_t count);
  /// The lr after `step` completed steps of a group whose initial lr is `base_lr`.
  virtual double lr_at(int64_t step, double base_lr) const = 0;
  /// The lr of group 0 after `step` completed steps: lr_at(step, base_lr()).
  double lr_at(int64_t step) const { return lr_at(step, base_lr()); }
  /// The schedule's base lr: the optimizer's initial_lr() (of group 0).
  double base_lr() const { return base_lrs_.at(0); }
  /// The base lr of every group: the optimizer's initial_lr(g) (PyTorch's base_lrs).
  const std::vector<double>& base_lrs() const { return base_lrs_; }
  /// The optimizer whose lr this schedule sets.
  Optimizer& optimizer() { return opt_; }

 protected:
  /// Remembers the optimizer and its groups' initial lrs; derived constructors finish by calling apply().
  explicit LRScheduler(Optimizer& optimizer);
  /// Sets each group g's lr to lr_at(step_count(), base_lrs()[g]).
  void apply();

 private:
  Optimizer& opt_;
  std::vector<double> base_lrs_;
  std::vector<double> last_lrs_;
  int64_t step_count_ = 0;
};

/// base_lr * factor for the first total_iters steps, then base_lr (PyTorch's ConstantLR; the defaults
/// here keep the lr constant, where PyTorch's are factor 1/3 for 5 steps).
class ConstantLR : public LRScheduler {
 public:
  /// factor in [0, 1], total_iters >= 0.
  explicit ConstantLR(Optimizer& optimizer, double factor = 1.0, int64_t total_iters = 0);
  using LRScheduler::lr_at;
  /// constant_lr(step, base_lr, factor, total_iters).
  double lr_at(int64_t step, double base_lr) const override;

 private:
  double factor_;
  int64_t total_iters_;
};

/// base_lr * gamma^floor(step / step_size) (PyTorch's StepLR, in closed form).
class StepLR : public LRScheduler {
 public:
  /// step_size >= 1, gamma > 0.
  StepLR(Optimizer& optimizer, int64_t step_size, double gamma = 0.1);
  using LRScheduler::lr_at;
  /// step_lr(step, base_lr, step_size, gamma).
  double lr_at(int64_t step, double base_lr) const override;

 private:
  int64_t step_size_;
  double gamma_;
};

/// How a WarmupCosine warms up (docs/TRAINING.md).
enum class WarmupStyle {
  FromZero,  ///< base_lr * step / warmup_steps: the first update uses lr 0 (warmup_cosine_lr; attograd's default)
  NanoGPT,   ///< base_lr * (step + 1) / (warmup_steps + 1): nanoGPT's get_lr (nanogpt_lr)
};

/// "from-zero" or "nanogpt".
const char* warmup_style_name(WarmupStyle style);
/// The style named "from-zero" or "nanogpt"; Error naming `what` (e.g. the flag) otherwise.
WarmupStyle parse_warmup_style(const std::string& name, const std::string& what = "warmup_style");

/// Linear warm-up to base_lr over warmup_steps, then cosine decay to min_lr at total_steps and min_lr after it
/// (FromZero: warmup_cosine_lr, with warmup_steps = 0 PyTorch's CosineAnnealingLR up to T_max; NanoGPT:
/// nanogpt_lr with lr_decay_iters = total_steps). min_lr is absolute and shared by every group (CosineAnnealingLR's
/// eta_min, nanoGPT's min_lr).
class WarmupCosine : public LRScheduler {
 public:
  /// 0 <= warmup_steps <= total_steps, total_steps >= 1, 0 <= min_lr.
  WarmupCosine(Optimizer& optimizer, int64_t warmup_steps, int64_t total_steps, double min_lr = 0,
               WarmupStyle style = WarmupStyle::FromZero);
  using LRScheduler::lr_at;
  /// warmup_cosine_lr or nanogpt_lr (by style) of (step, base_lr, warmup_steps, total_steps, min_lr).
  double lr_at(int64_t step, double base_lr) const override;
  /// The warm-up style.
  WarmupStyle style() const { return style_; }

 private:
  int64_t warmup_steps_, total_steps_;
  double min_lr_;
  WarmupStyle style_;
};

/// The seed's warm-up schedule (ScheduledOptim in attention-is-all-you-need-pytorch): the t-th update
/// uses noam_lr(t, lr_mul, d_model, warmup), i.e. lr_at(step) = noam_lr(step + 1, ...).
class NoamLR : public LRScheduler {
 public:
  /// lr_mul >= 0, d_model >= 1, warmup >= 1. The optimizer's own lrs are ignored: every group gets the same lr,
  /// as the seed's ScheduledOptim sets it on every param group.
  NoamLR(Optimizer& optimizer, double lr_mul, int64_t d_model, int64_t warmup);
  /// Each group's initial lr is its lr_mul (LambdaLR with the Noam factor: the groups keep their ratios).
  NoamLR(Optimizer& optimizer, int64_t d_model, int64_t warmup);
  using LRScheduler::lr_at;
  /// noam_lr(step + 1, lr_mul, d_model, warmup), lr_mul the one given or else base_lr.
  double lr_at(int64_t step, double base_lr) const override;

 private:
  std::optional<double> lr_mul_;
  int64_t d_model_, warmup_;
};

}  // namespace attograd::optim
