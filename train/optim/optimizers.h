#pragma once
// Optimizers (SGD, Adam, AdamW) with PyTorch 1.13's update formulas, and gradient clipping.
// Parameters are held by name; per-parameter state is exported and restored by name
// ("layer.weight.exp_avg") so a checkpoint can carry it. Updates run in place on the parameters'
// data under NoGradGuard; state buffers are allocated once, on a parameter's first step.

#include <array>
#include <cstdint>
#include <limits>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "autograd/tensor.h"

namespace attograd::optim {

/// Tensors with names, e.g. Module::named_parameters() or Optimizer::state_tensors().
using NamedTensors = std::vector<std::pair<std::string, Tensor>>;

/// Base class of the optimizers: parameters by name, the learning rate, per-parameter state.
class Optimizer {
 public:
  virtual ~Optimizer() = default;
  Optimizer(const Optimizer&) = delete;
  Optimizer& operator=(const Optimizer&) = delete;

  /// Updates every parameter whose grad is defined (others are skipped, as in PyTorch).
  void step();
  /// Zeros every parameter's gradient in place, or drops it when set_to_none.
  void zero_grad(bool set_to_none = false);

  /// The current learning rate (schedules change it through set_lr).
  double lr() const { return lr_; }
  /// Sets the learning rate used by the next step(); must be finite and >= 0.
  void set_lr(double lr);
  /// The learning rate given in the options at construction (PyTorch's initial_lr; schedules start from it).
  double initial_lr() const { return initial_lr_; }

  /// The parameters with their names, in construction order.
  const NamedTensors& named_params() const { return params_; }
  /// The parameters, in construction order.
  std::vector<Tensor> params() const;
  /// Number of step() calls made (or restored by load_state).
  int64_t step_count() const { return step_count_; }

  /// Per-parameter state as "<param name>.<key>" tensors, parameters in order, only for parameters
  /// that have taken a step. Keys: "step" (0-d float64 count; Adam/AdamW), "momentum_buffer" (SGD),
  /// "exp_avg", "exp_avg_sq", "max_exp_avg_sq" (Adam/AdamW). Buffers are the live ones (shared data).
  NamedTensors state_tensors() const;
  /// Replaces all state with copies of `state` (as returned by state_tensors()) and sets step_count.
  /// Checks every name, key, shape and dtype first; on error nothing changes.
  void load_state(const NamedTensors& state, int64_t step_count);

  /// "SGD", "Adam" or "AdamW" (also the op name in error messages).
  const std::string& type_name() const { return name_; }

 protected:
  /// Per-parameter state: the parameter's own step count and up to three buffers (named by slot_names()).
  struct ParamState {
    int64_t step = 0;             ///< steps this parameter has taken (grad defined)
    std::array<Tensor, 3> slots;  ///< state buffers, each of the parameter's shape and dtype
  };

  /// Checks and stores the parameters (`name` names the optimizer in errors).
  Optimizer(NamedTensors params, double lr, const char* name);
  /// Names "0", "1", ... for plain parameters.
  static NamedTensors number(const std::vector<Tensor>& params);

  /// Names of the state buffers this configuration keeps, in slot order.
  virtual std::vector<std::string> slot_names() const = 0;
  /// True when state_tensors() exports the per-parameter "step" (Adam); SGD's state is its buffer alone.
  virtual bool exports_step() const = 0;
  /// Applies one update to parameter `p` with gradient `g` (same shape and dtype); s.step is already advanced.
  virtual void update(Tensor& p, const Tensor& g, ParamState& s) = 0;

 private:
  std::string name_;
  NamedTensors params_;
  std::unordered_map<std::string, size_t> index_;  // parameter name -> position
  std::vector<ParamState> state_;
  double lr_ = 0;
  double initial_lr_ = 0;
  int64_t step_count_ = 0;
};

/// Options of SGD (torch.optim.SGD). lr has no default and must be given.
struct SGDOptions {
  double lr = std::numeric_limits<double>::quiet_NaN();  ///< learning rate (required)
  double momentum = 0;                                   ///< momentum factor mu
  double dampening = 0;                                  ///< dampening of the gradient added to the momentum buffer
  double weight_decay = 0;                               ///< L2 penalty added to the gradient
  bool nesterov = false;                                 ///< Nesterov momentum (needs momentum > 0 and dampening == 0)
};

/// Stochastic gradient descent with optional momentum, dampening, Nesterov and weight decay.
class SGD : public Optimizer {
 public:
  /// Optimizes named parameters (e.g. module.named_parameters()).
  SGD(NamedTensors params, SGDOptions options);
  /// Optimizes plain parameters, named "0", "1", ...
  SGD(const std::vector<Tensor>& params, SGDOptions options);
  /// The options given at construction.
  const SGDOptions& options() const { return opt_; }

 protected:
  std::vector<std::string> slot_names() const override;
  bool exports_step() const override { return false; }
  void update(Tensor& p, const Tensor& g, ParamState& s) override;

 private:
  SGDOptions opt_;
};

/// Options of Adam (torch.optim.Adam).
struct AdamOptions {
  double lr = 1e-3;                             ///< learning rate
  std::pair<double, double> betas{0.9, 0.999};  ///< decay rates of the first and second moments, in [0, 1)
  double eps = 1e-8;                            ///< added to the denominator, outside the square root
  double weight_decay = 0;                      ///< L2 penalty added to the gradient
  bool amsgrad = false;                         ///< use the running maximum of the second moment
};

/// Options of AdamW (torch.optim.AdamW): Adam's, with decoupled weight decay defaulting to 1e-2.
struct AdamWOptions {
  double lr = 1e-3;                             ///< learning rate
  std::pair<double, double> betas{0.9, 0.999};  ///< decay rates of the first and second moments, in [0, 1)
  double eps = 1e-8;                            ///< added to the denominator, outside the square root
  double weight_decay = 1e-2;                   ///< decoupled decay: p *= 1 - lr * weight_decay each step
  bool amsgrad = false;                         ///< use the running maximum of the second moment
};

/// Adam (Kingma & Ba), optionally AMSGrad, with L2 weight decay folded into the gradient.
class Adam : public Optimizer {
 public:
  /// Optimizes named parameters (e.g. module.named_parameters()).
  Adam(NamedTensors params, AdamOptions options = {});
  /// Optimizes plain parameters, named "0", "1", ...
  Adam(const std::vector<Tensor>& params, AdamOptions options = {});
  /// The options given at construction.
  const AdamOptions& options() const { return opt_; }

 protected:
  /// For AdamW: same state, decoupled weight decay.
  Adam(NamedTensors params, AdamOptions options, bool decoupled, const char* name);
  std::vector<std::string> slot_names() const override;
  bool exports_step() const override { return true; }
  void update(Tensor& p, const Tensor& g, ParamState& s) override;

 private:
  AdamOptions opt_;
  bool decoupled_ = false;
};

/// AdamW (Loshchilov & Hutter): Adam with decoupled weight decay.
class AdamW : public Adam {
 public:
  /// Optimizes named parameters (e.g. module.named_parameters()).
  AdamW(NamedTensors params, AdamWOptions options = {});
  /// Optimizes plain parameters, named "0", "1", ...
  AdamW(const std::vector<Tensor>& params, AdamWOptions options = {});
  /// The options given at construction.
  const AdamWOptions& options() const { return wopt_; }

 private:
  AdamWOptions wopt_;
};

/// Clips the gradients of `params` in place so that their total norm (of order norm_type, the norms of all
/// gradients taken as one vector; infinity for the max norm) is at most max_norm: when
/// max_norm / (total + 1e-6) < 1 every gradient is multiplied by it (torch.nn.utils.clip_grad_norm_).
/// Parameters without a gradient are skipped. Accumulates in double; returns the total norm.
double clip_grad_norm_(const std::vector<Tensor>& params, double max_norm, double norm_type = 2.0,
                       bool error_if_nonfinite = false);
/// Clamps every gradient element of `params` to [-clip_value, clip_value] in place
/// (torch.nn.utils.clip_grad_value_).
void clip_grad_value_(const std::vector<Tensor>& params, double clip_value);

}  // namespace attograd::optim
