#pragma once
// Optimizers (SGD, Adam, AdamW) with PyTorch 1.13's update formulas, and gradient clipping.
// Parameters are held by name, in parameter groups (PyTorch's param_groups: each group its own lr, weight decay
// and any other option it overrides; unset options take the optimizer's defaults). Per-parameter state is exported
// and restored by parameter name ("layer.weight.exp_avg") so a checkpoint can carry it, whatever the groups. Updates
// run in place on the parameters' data under NoGradGuard; state buffers are allocated once, on a parameter's first
// step.

#include <array>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "autograd/tensor.h"

namespace attograd::optim {

/// Tensors with names, e.g. Module::named_parameters() or Optimizer::state_tensors().
using NamedTensors = std::vector<std::pair<std::string, Tensor>>;

/// Names "first", "first + 1", ... for plain parameters (PyTorch's state_dict numbers them so, across groups).
NamedTensors numbered(const std::vector<Tensor>& params, size_t first = 0);
/// nanoGPT's weight-decay split (configure_optimizers): the tensors of at least `min_dim` dimensions (matrices:
/// Linear and embedding weights) and the others (biases, norm gains), each in the given order.
std::pair<NamedTensors, NamedTensors> split_by_dim(const NamedTensors& params, int64_t min_dim = 2);

/// Base class of the optimizers: parameters by name in groups, each group's learning rate, per-parameter state.
class Optimizer {
 public:
  virtual ~Optimizer() = default;
  Optimizer(const Optimizer&) = delete;
  Optimizer& operator=(const Optimizer&) = delete;

  /// Updates every parameter whose grad is defined (others are skipped, as in PyTorch).
  void step();
  /// Zeros every parameter's gradient in place, or drops it when set_to_none.
  void zero_grad(bool set_to_none = false);

  /// Number of parameter groups (1 for the constructors taking one list of parameters).
  size_t num_groups() const { return groups_.size(); }
  /// The current learning rate of a group (param_groups[group]["lr"]; schedules change it through set_lr).
  double lr(size_t group = 0) const;
  /// Sets every group's learning rate to `lr` for the next step(); must be finite and >= 0.
  void set_lr(double lr);
  /// Sets one group's learning rate for the next step(); must be finite and >= 0.
  void set_lr(size_t group, double lr);
  /// A group's learning rate given at construction (PyTorch's initial_lr; schedules scale it).
  double initial_lr(size_t group = 0) const;

  /// The parameters with their names, group after group, each group in its given order.
  const NamedTensors& named_params() const { return params_; }
  /// The parameters, in named_params() order.
  std::vector<Tensor> params() const;
  /// The parameters of one group, with their names.
  NamedTensors group_params(size_t group) const;
  /// Number of step() calls made (or restored by load_state).
  int64_t step_count() const { return step_count_; }

  /// Per-parameter state as "<param name>.<key>" tensors, parameters in named_params() order, only for parameters
  /// that have taken a step. Keys: "step" (0-d float64 count; Adam/AdamW), "momentum_buffer" (SGD with momentum),
  /// "exp_avg", "exp_avg_sq", "max_exp_avg_sq" (Adam/AdamW; the last with amsgrad). The keys of a parameter are
  /// those of its group's options. Buffers are the live ones (shared data). Groups are not part of the state: an
  /// optimizer built with the same groups resumes bit-exactly.
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

  /// Checks and stores the groups' parameters, each group with its learning rate (`name` names the optimizer in
  /// errors). At least one parameter in all; a group may be empty.
  Optimizer(std::vector<std::pair<NamedTensors, double>> groups, const char* name);
  /// Names "0", "1", ... for plain parameters.
  static NamedTensors number(const std::vector<Tensor>& params) { return numbered(params); }
  /// "" with one group, else "param group <g>: " (the start of an error message about group g's options).
  std::string group_prefix(size_t group) const;

  /// Names of the state buffers a group's options keep, in slot order.
  virtual std::vector<std::string> slot_names(size_t group) const = 0;
  /// True when state_tensors() exports the per-parameter "step" (Adam); SGD's state is its buffer alone.
  virtual bool exports_step() const = 0;
  /// Applies one update to parameter `p` of group `group` with gradient `g` (same shape and dtype) and learning
  /// rate `lr`; s.step is already advanced.
  virtual void update(Tensor& p, const Tensor& g, ParamState& s, size_t group, double lr) = 0;

 private:
  struct Group {
    size_t begin = 0, end = 0;  // its parameters: params_[begin, end)
    double lr = 0, initial_lr = 0;
  };
  size_t check_group(size_t group, const char* what) const;

  std::string name_;
  NamedTensors params_;
  std::vector<Group> groups_;
  std::vector<size_t> group_of_;                   // parameter position -> group
  std::unordered_map<std::string, size_t> index_;  // parameter name -> position
  std::vector<ParamState> state_;
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

/// One parameter group of an SGD (an entry of PyTorch's param_groups): its parameters and the options it sets;
/// an unset option takes the optimizer's (the SGDOptions given with the groups).
struct SGDParamGroup {
  NamedTensors params = {};                 ///< the group's parameters, by name (names unique across groups)
  std::optional<double> lr = {};            ///< learning rate
  std::optional<double> momentum = {};      ///< momentum factor
  std::optional<double> dampening = {};     ///< dampening
  std::optional<double> weight_decay = {};  ///< L2 penalty
  std::optional<bool> nesterov = {};        ///< Nesterov momentum
};

/// Stochastic gradient descent with optional momentum, dampening, Nesterov and weight decay.
class SGD : public Optimizer {
 public:
  /// Optimizes named parameters (e.g. module.named_parameters()), one group.
  SGD(NamedTensors params, SGDOptions options);
  /// Optimizes plain parameters, named "0", "1", ..., one group.
  SGD(const std::vector<Tensor>& params, SGDOptions options);
  /// Optimizes parameter groups; `defaults` fill what a group leaves unset (lr must be set in one or the other).
  SGD(std::vector<SGDParamGroup> groups, SGDOptions defaults);
  /// The options given at construction (the defaults, with groups).
  const SGDOptions& options() const { return opt_; }
  /// A group's options: the defaults with the group's own settings (lr: its initial lr).
  const SGDOptions& group_options(size_t group) const;

 protected:
  std::vector<std::string> slot_names(size_t group) const override;
  bool exports_step() const override { return false; }
  void update(Tensor& p, const Tensor& g, ParamState& s, size_t group, double lr) override;

 private:
  // The groups' resolved options, the (parameters, lr) of each group, the defaults.
  SGD(std::vector<SGDOptions> resolved, std::vector<std::pair<NamedTensors, double>> groups, SGDOptions defaults);
  SGDOptions opt_;
  std::vector<SGDOptions> group_opts_;
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

/// One parameter group of an Adam or AdamW (an entry of PyTorch's param_groups): its parameters and the options
/// it sets; an unset option takes the optimizer's (the AdamOptions or AdamWOptions given with the groups).
struct AdamParamGroup {
  NamedTensors params = {};                             ///< the group's parameters, by name (unique across groups)
  std::optional<double> lr = {};                        ///< learning rate
  std::optional<std::pair<double, double>> betas = {};  ///< decay rates of the first and second moments
  std::optional<double> eps = {};                       ///< added to the denominator
  std::optional<double> weight_decay = {};              ///< L2 penalty (Adam) or decoupled decay (AdamW)
  std::optional<bool> amsgrad = {};                     ///< running maximum of the second moment
};

/// Adam (Kingma & Ba), optionally AMSGrad, with L2 weight decay folded into the gradient.
class Adam : public Optimizer {
 public:
  /// Optimizes named parameters (e.g. module.named_parameters()), one group.
  Adam(NamedTensors params, AdamOptions options = {});
  /// Optimizes plain parameters, named "0", "1", ..., one group.
  Adam(const std::vector<Tensor>& params, AdamOptions options = {});
  /// Optimizes parameter groups; `defaults` fill what a group leaves unset.
  Adam(std::vector<AdamParamGroup> groups, AdamOptions defaults = {});
  /// The options given at construction (the defaults, with groups).
  const AdamOptions& options() const { return opt_; }
  /// A group's options: the defaults with the group's own settings (lr: its initial lr).
  const AdamOptions& group_options(size_t group) const;

 protected:
  /// For AdamW: same state, decoupled weight decay.
  Adam(std::vector<AdamParamGroup> groups, AdamOptions defaults, bool decoupled, const char* name);
  std::vector<std::string> slot_names(size_t group) const override;
  bool exports_step() const override { return true; }
  void update(Tensor& p, const Tensor& g, ParamState& s, size_t group, double lr) override;

 private:
  // The groups' resolved options, the (parameters, lr) of each group, the defaults, decoupled decay, the name.
  Adam(std::vector<AdamOptions> resolved, std::vector<std::pair<NamedTensors, double>> groups, AdamOptions defaults,
       bool decoupled, const char* name);
  AdamOptions opt_;
  std::vector<AdamOptions> group_opts_;
  bool decoupled_ = false;
};

/// AdamW (Loshchilov & Hutter): Adam with decoupled weight decay.
class AdamW : public Adam {
 public:
  /// Optimizes named parameters (e.g. module.named_parameters()), one group.
  AdamW(NamedTensors params, AdamWOptions options = {});
  /// Optimizes plain parameters, named "0", "1", ..., one group.
  AdamW(const std::vector<Tensor>& params, AdamWOptions options = {});
  /// Optimizes parameter groups; `defaults` fill what a group leaves unset, e.g. nanoGPT's
  /// AdamW({{.params = matrices}, {.params = others, .weight_decay = 0.0}}, {.lr = 6e-4, .betas = {0.9, 0.95},
  /// .weight_decay = 0.1}).
  AdamW(std::vector<AdamParamGroup> groups, AdamWOptions defaults = {});
  /// The options given at construction (the defaults, with groups).
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
