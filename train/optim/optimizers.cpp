// Optimizers and gradient clipping. Each optimizer's math is one templated loop over raw pointers
// (sgd_update, adam_update) that follows PyTorch 1.13's single-tensor code operation by operation, in the
// parameter's own precision, so float32 trajectories agree with PyTorch's to rounding.

#include "train/optim/optimizers.h"

#include <cmath>
#include <cstring>

#include "autograd/parallel.h"

namespace attograd::optim {

namespace {

// ---------------------------------------------------------------------------------------------
// The update formulas

// SGD (torch.optim.SGD), per element, g the gradient:
//   g = g + weight_decay * p
//   if momentum != 0:
//     b = g                                        on the parameter's first step
//     b = momentum * b + (1 - dampening) * g       on later steps
//     g = nesterov ? g + momentum * b : b
//   p = p - lr * g
// `buf` is null without momentum; `first` is true on the step that creates it.
template <class T>
void sgd_update(T* p, const T* grad, T* buf, int64_t n, bool first, const SGDOptions& o, double lr) {
  const T wd = static_cast<T>(o.weight_decay);
  const T mu = static_cast<T>(o.momentum);
  const T keep = static_cast<T>(1 - o.dampening);
  const T neg_lr = static_cast<T>(-lr);
  const bool decay = o.weight_decay != 0;
  for (int64_t i = 0; i < n; ++i) {
    T g = grad[i];
    if (decay) g = g + wd * p[i];
    if (buf) {
      const T b = first ? g : buf[i] * mu + keep * g;
      buf[i] = b;
      g = o.nesterov ? g + mu * b : b;
    }
    p[i] = p[i] + neg_lr * g;
  }
}

// The scalar factors of one Adam step, in the parameter's precision.
template <class T>
struct AdamFactors {
  T decay_factor, wd, b1, one_minus_b1, b2, one_minus_b2, bc2_sqrt, eps, neg_step_size;
};

// The per-element update of adam_update below over n elements, specialised per configuration.
template <class T, bool kDecoupled, bool kL2, bool kAms>
void adam_kernel(T* __restrict p, const T* __restrict grad, T* __restrict m, T* __restrict v, T* __restrict vmax,
                 int64_t n, const AdamFactors<T> f) {
  for (int64_t i = 0; i < n; ++i) {
    T pi = p[i];
    T g = grad[i];
    if constexpr (kDecoupled) pi = pi * f.decay_factor;
    if constexpr (kL2) g = g + f.wd * pi;
    const T mi = m[i] * f.b1 + f.one_minus_b1 * g;
    T vi = v[i] * f.b2 + f.one_minus_b2 * g * g;
    m[i] = mi;
    v[i] = vi;
    if constexpr (kAms) {
      const T vm = vmax[i];
      vi = vm > vi ? vm : vi;  // NaN in v propagates, as torch.maximum
      vmax[i] = vi;
    }
    const T denom = std::sqrt(vi) / f.bc2_sqrt + f.eps;
    p[i] = pi + f.neg_step_size * mi / denom;
  }
}

// Adam (torch.optim.Adam) and AdamW (torch.optim.AdamW), per element; t is the parameter's step, from 1:
//   AdamW: p = p * (1 - lr * weight_decay)            (decoupled decay, first)
//   Adam:  g = g + weight_decay * p                   (L2 penalty in the gradient)
//   m = beta1 * m + (1 - beta1) * g
//   v = beta2 * v + (1 - beta2) * g * g
//   amsgrad: vmax = max(vmax, v), used in place of v below
//   p = p - (lr / (1 - beta1^t)) * m / (sqrt(v) / sqrt(1 - beta2^t) + eps)
// (eps is added outside the square root; the scalar factors are computed in double as PyTorch does.)
// `vmax` is null without amsgrad.
template <class T>
void adam_update(T* p, const T* grad, T* m, T* v, T* vmax, int64_t n, int64_t t, const AdamOptions& o, double lr,
                 bool decoupled) {
  const auto [beta1, beta2] = o.betas;
  const double step = static_cast<double>(t);
  const double bias_correction1 = 1 - std::pow(beta1, step);
  const double bias_correction2 = 1 - std::pow(beta2, step);
  const T neg_step_size = static_cast<T>(-(lr / bias_correction1));
  const T bc2_sqrt = static_cast<T>(std::sqrt(bias_correction2));
  const T b1 = static_cast<T>(beta1), one_minus_b1 = static_cast<T>(1 - beta1);
  const T b2 = static_cast<T>(beta2), one_minus_b2 = static_cast<T>(1 - beta2);
  const T eps = static_cast<T>(o.eps);
  const T wd = static_cast<T>(o.weight_decay);
  const T decay_factor = static_cast<T>(1 - lr * o.weight_decay);
  const bool l2 = !decoupled && o.weight_decay != 0;
  // One branch-free loop per configuration (so it vectorises), over chunks of elements split between threads.
  auto run = [&]<bool kDecoupled, bool kL2, bool kAms>() {
    parallel_for(0, n, 1 << 15, [&](int64_t i0, int64_t i1) {
      adam_kernel<T, kDecoupled, kL2, kAms>(p + i0, grad + i0, m + i0, v + i0, kAms ? vmax + i0 : nullptr, i1 - i0,
                                            {decay_factor, wd, b1, one_minus_b1, b2, one_minus_b2, bc2_sqrt, eps,
                                             neg_step_size});
    });
  };
  const bool ams = vmax != nullptr;
  if (decoupled) {
    if (ams) run.template operator()<true, false, true>();
    else run.template operator()<true, false, false>();
  } else if (l2) {
    if (ams) run.template operator()<false, true, true>();
    else run.template operator()<false, true, false>();
  } else {
    if (ams) run.template operator()<false, false, true>();
    else run.template operator()<false, false, false>();
  }
}

// ---------------------------------------------------------------------------------------------
// Helpers

// `where` starts each message: "" or "param group <g>: " (Optimizer::group_prefix).
void check_lr(const std::string& op, const std::string& where, double lr) {
  ATTO_CHECK(std::isfinite(lr) && lr >= 0, op, where, "invalid learning rate lr=", lr, " (must be finite and >= 0",
             op == "SGD" ? "; SGDOptions.lr has no default and must be given)" : ")");
}

void check_sgd_options(const std::string& where, const SGDOptions& o) {
  check_lr("SGD", where, o.lr);
  ATTO_CHECK(o.momentum >= 0 && std::isfinite(o.momentum), "SGD", where, "invalid momentum value momentum=", o.momentum,
             " (must be >= 0)");
  ATTO_CHECK(std::isfinite(o.dampening), "SGD", where, "invalid dampening value dampening=", o.dampening);
  ATTO_CHECK(o.weight_decay >= 0 && std::isfinite(o.weight_decay), "SGD", where,
             "invalid weight_decay value weight_decay=", o.weight_decay, " (must be >= 0)");
  ATTO_CHECK(!o.nesterov || (o.momentum > 0 && o.dampening == 0), "SGD", where,
             "Nesterov momentum requires a momentum and zero dampening, got momentum=", o.momentum,
             " dampening=", o.dampening);
}

void check_adam_options(const std::string& op, const std::string& where, const AdamOptions& o) {
  check_lr(op, where, o.lr);
  ATTO_CHECK(o.eps >= 0 && std::isfinite(o.eps), op, where, "invalid epsilon value eps=", o.eps, " (must be >= 0)");
  ATTO_CHECK(o.betas.first >= 0 && o.betas.first < 1, op, where,
             "invalid beta parameter at index 0: betas.first=", o.betas.first, " (must be in [0, 1))");
  ATTO_CHECK(o.betas.second >= 0 && o.betas.second < 1, op, where,
             "invalid beta parameter at index 1: betas.second=", o.betas.second, " (must be in [0, 1))");
  ATTO_CHECK(o.weight_decay >= 0 && std::isfinite(o.weight_decay), op, where,
             "invalid weight_decay value weight_decay=", o.weight_decay, " (must be >= 0)");
}

// A fresh buffer of p's shape and dtype holding t's values (converted when the dtype differs).
Tensor copy_as(const Tensor& t, const Tensor& p) {
  Tensor out = empty(p.shape(), {.dtype = p.dtype()});
  const int64_t n = out.numel();
  if (t.dtype() == p.dtype()) {
    if (n) std::memcpy(out.raw_data(), t.raw_data(), out.nbytes());
    return out;
  }
  dispatch_float(p.dtype(), "load_state", [&]<typename D>() {
    D* dst = out.data<D>();
    dispatch_float(t.dtype(), "load_state", [&]<typename S>() {
      const S* src = t.data<S>();
      for (int64_t i = 0; i < n; ++i) dst[i] = static_cast<D>(src[i]);
    });
  });
  return out;
}

std::string join_keys(const std::vector<std::string>& keys) {
  if (keys.empty()) return "nothing";
  std::string s;
  for (size_t i = 0; i < keys.size(); ++i) s += (i ? ", " : "") + keys[i];
  return s;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Optimizer

NamedTensors numbered(const std::vector<Tensor>& params, size_t first) {
  NamedTensors named;
  named.reserve(params.size());
  for (size_t i = 0; i < params.size(); ++i) named.emplace_back(std::to_string(first + i), params[i]);
  return named;
}

std::pair<NamedTensors, NamedTensors> split_by_dim(const NamedTensors& params, int64_t min_dim) {
  std::pair<NamedTensors, NamedTensors> out;
  for (const auto& [name, p] : params) {
    ATTO_CHECK(p.defined(), "split_by_dim", "parameter '", name, "' is undefined");
    (p.dim() >= min_dim ? out.first : out.second).emplace_back(name, p);
  }
  return out;
}

Optimizer::Optimizer(std::vector<std::pair<NamedTensors, double>> groups, const char* name) : name_(name) {
  for (auto& [params, lr] : groups) {
    Group g;
    g.begin = params_.size();
    for (auto& named : params) params_.push_back(std::move(named));
    g.end = params_.size();
    g.lr = g.initial_lr = lr;
    group_of_.resize(params_.size(), groups_.size());
    groups_.push_back(g);
  }
  ATTO_CHECK(!params_.empty(), name_, "got an empty parameter list");
  for (size_t i = 0; i < params_.size(); ++i) {
    const auto& [pname, p] = params_[i];
    ATTO_CHECK(p.defined(), name_, "parameter '", pname, "' is undefined");
    ATTO_CHECK(is_floating(p.dtype()), name_, "parameter '", pname, "' has dtype ", dtype_name(p.dtype()),
               "; only float32 and float64 parameters can be optimized");
    ATTO_CHECK(p.is_leaf(), name_, "parameter '", pname, "' is not a leaf (it comes from '", p.grad_fn_name(),
               "'); optimize leaf tensors");
    ATTO_CHECK(index_.emplace(pname, i).second, name_, "parameter name '", pname, "' appears more than once",
               groups_.size() > 1 ? " (names must be unique across the parameter groups)" : "");
    for (size_t j = 0; j < i; ++j)
      ATTO_CHECK(!params_[j].second.is_same(p), name_, "parameters '", params_[j].first, "' and '", pname,
                 "' are the same tensor; some parameters appear more than once",
                 group_of_[i] != group_of_[j] ? " (in param groups " + std::to_string(group_of_[j]) + " and " +
                                                    std::to_string(group_of_[i]) + ")"
                                              : std::string());
  }
  state_.resize(params_.size());
}

std::string Optimizer::group_prefix(size_t group) const {
  return groups_.size() > 1 ? "param group " + std::to_string(group) + ": " : std::string();
}

size_t Optimizer::check_group(size_t group, const char* what) const {
  ATTO_CHECK(group < groups_.size(), name_, what, ": no param group ", group, " (this ", name_, " has ", groups_.size(),
             ")");
  return group;
}

void Optimizer::step() {
  NoGradGuard no_grad;
  for (size_t i = 0; i < params_.size(); ++i) {
    const size_t group = group_of_[i];
    Tensor& p = params_[i].second;
    const Tensor g = p.grad();
    if (!g.defined()) continue;
    ATTO_CHECK(g.shape() == p.shape() && g.dtype() == p.dtype(), name_, "gradient of parameter '", params_[i].first,
               "' has shape ", g.shape(), " (", dtype_name(g.dtype()), ") but the parameter has ", p.shape(), " (",
               dtype_name(p.dtype()), ")");
    ParamState& s = state_[i];
    // State made before the parameter's dtype changed (Module::to) is converted once.
    for (Tensor& t : s.slots)
      if (t.defined() && t.dtype() != p.dtype()) t = copy_as(t, p);
    ++s.step;
    update(p, g, s, group, groups_[group].lr);
  }
  ++step_count_;
}

void Optimizer::zero_grad(bool set_to_none) {
  for (auto& [_, p] : params_) p.zero_grad(set_to_none);
}

double Optimizer::lr(size_t group) const { return groups_[check_group(group, "lr")].lr; }

double Optimizer::initial_lr(size_t group) const { return groups_[check_group(group, "initial_lr")].initial_lr; }

void Optimizer::set_lr(double lr) {
  check_lr(name_, "", lr);
  for (Group& g : groups_) g.lr = lr;
}

void Optimizer::set_lr(size_t group, double lr) {
  check_group(group, "set_lr");
  check_lr(name_, group_prefix(group), lr);
  groups_[group].lr = lr;
}

NamedTensors Optimizer::group_params(size_t group) const {
  const Group& g = groups_[check_group(group, "group_params")];
  return NamedTensors(params_.begin() + static_cast<std::ptrdiff_t>(g.begin),
                      params_.begin() + static_cast<std::ptrdiff_t>(g.end));
}

std::vector<Tensor> Optimizer::params() const {
  std::vector<Tensor> out;
  out.reserve(params_.size());
  for (const auto& [_, p] : params_) out.push_back(p);
  return out;
}

NamedTensors Optimizer::state_tensors() const {
  NamedTensors out;
  for (size_t i = 0; i < params_.size(); ++i) {
    const ParamState& s = state_[i];
    if (s.step == 0) continue;
    const std::vector<std::string> keys = slot_names(group_of_[i]);
    const std::string& pname = params_[i].first;
    if (exports_step())
      out.emplace_back(pname + ".step", scalar_tensor(static_cast<double>(s.step), {.dtype = kFloat64}));
    for (size_t k = 0; k < keys.size(); ++k)
      if (s.slots[k].defined()) out.emplace_back(pname + "." + keys[k], s.slots[k]);
  }
  return out;
}

void Optimizer::load_state(const NamedTensors& state, int64_t step_count) {
  ATTO_CHECK(step_count >= 0, name_, "load_state: step_count must be >= 0, got ", step_count);
  std::vector<ParamState> fresh(params_.size());
  for (const auto& [full, t] : state) {
    const size_t dot = full.rfind('.');
    ATTO_CHECK(dot != std::string::npos && dot > 0, name_, "load_state: state name '", full,
               "' is not of the form '<parameter>.<key>'");
    const std::string pname = full.substr(0, dot), key = full.substr(dot + 1);
    auto it = index_.find(pname);
    ATTO_CHECK(it != index_.end(), name_, "load_state: state '", full, "' names no parameter of this optimizer (no '",
               pname, "')");
    ATTO_CHECK(t.defined(), name_, "load_state: state '", full, "' is undefined");
    const Tensor& p = params_[it->second].second;
    ParamState& s = fresh[it->second];
    const std::vector<std::string> keys = slot_names(group_of_[it->second]);
    if (exports_step() && key == "step") {
      ATTO_CHECK(t.numel() == 1 && t.dtype() != kBool, name_, "load_state: state '", full,
                 "' must be a one-element number, got shape ", t.shape(), " (", dtype_name(t.dtype()), ")");
      const double v = t.item();
      ATTO_CHECK(v >= 1 && v <= 9007199254740992.0 && v == std::floor(v), name_, "load_state: state '", full,
                 "' must be a whole number >= 1, got ", v);
      ATTO_CHECK(s.step == 0, name_, "load_state: state '", full, "' appears more than once");
      s.step = static_cast<int64_t>(v);
      continue;
    }
    size_t k = 0;
    while (k < keys.size() && keys[k] != key) ++k;
    if (k == keys.size()) {
      std::vector<std::string> all_keys = keys;
      if (exports_step()) all_keys.insert(all_keys.begin(), "step");
      throw Error(name_, str_cat("load_state: unknown state key '", key, "' in '", full, "' (this ", name_,
                                 groups_.size() > 1 ? " keeps, for param group " + std::to_string(group_of_[it->second])
                                                    : std::string(" keeps"),
                                 " ", join_keys(all_keys), ")"));
    }
    ATTO_CHECK(t.shape() == p.shape(), name_, "load_state: state '", full, "' has shape ", t.shape(),
               " but parameter '", pname, "' has shape ", p.shape());
    ATTO_CHECK(is_floating(t.dtype()), name_, "load_state: state '", full, "' has dtype ", dtype_name(t.dtype()),
               "; expected float32 or float64");
    ATTO_CHECK(!s.slots[k].defined(), name_, "load_state: state '", full, "' appears more than once");
    s.slots[k] = copy_as(t, p);
  }
  for (size_t i = 0; i < params_.size(); ++i) {
    ParamState& s = fresh[i];
    const std::vector<std::string> keys = slot_names(group_of_[i]);
    bool any = s.step > 0;
    for (size_t k = 0; k < keys.size(); ++k) any = any || s.slots[k].defined();
    if (!any) continue;
    const std::string& pname = params_[i].first;
    if (exports_step())
      ATTO_CHECK(s.step > 0, name_, "load_state: missing state '", pname, ".step'");
    else
      s.step = 1;
    for (size_t k = 0; k < keys.size(); ++k)
      ATTO_CHECK(s.slots[k].defined(), name_, "load_state: missing state '", pname, ".", keys[k], "'");
  }
  state_ = std::move(fresh);
  step_count_ = step_count;
}

// ---------------------------------------------------------------------------------------------
// SGD

namespace {

// A group's options: the defaults with what the group sets.
SGDOptions resolve(const SGDParamGroup& g, const SGDOptions& d) {
  return {.lr = g.lr.value_or(d.lr),
          .momentum = g.momentum.value_or(d.momentum),
          .dampening = g.dampening.value_or(d.dampening),
          .weight_decay = g.weight_decay.value_or(d.weight_decay),
          .nesterov = g.nesterov.value_or(d.nesterov)};
}

AdamOptions resolve(const AdamParamGroup& g, const AdamOptions& d) {
  return {.lr = g.lr.value_or(d.lr),
          .betas = g.betas.value_or(d.betas),
          .eps = g.eps.value_or(d.eps),
          .weight_decay = g.weight_decay.value_or(d.weight_decay),
          .amsgrad = g.amsgrad.value_or(d.amsgrad)};
}

// The (parameters, lr) pairs of the base class, each group's lr resolved (the groups keep their options).
template <class G, class O>
std::vector<std::pair<NamedTensors, double>> base_groups(std::vector<G>& groups, const O& defaults) {
  std::vector<std::pair<NamedTensors, double>> out;
  out.reserve(groups.size());
  for (G& g : groups) out.emplace_back(std::move(g.params), g.lr.value_or(defaults.lr));
  return out;
}

template <class G, class O>
std::vector<O> resolve_all(const std::vector<G>& groups, const O& defaults) {
  std::vector<O> out;
  out.reserve(groups.size());
  for (const G& g : groups) out.push_back(resolve(g, defaults));
  return out;
}

}  // namespace

SGD::SGD(NamedTensors params, SGDOptions options)
    : SGD(std::vector<SGDParamGroup>{{.params = std::move(params)}}, options) {}

SGD::SGD(const std::vector<Tensor>& params, SGDOptions options) : SGD(number(params), options) {}

SGD::SGD(std::vector<SGDParamGroup> groups, SGDOptions defaults)
    : SGD(resolve_all(groups, defaults), base_groups(groups, defaults), defaults) {}

SGD::SGD(std::vector<SGDOptions> resolved, std::vector<std::pair<NamedTensors, double>> groups, SGDOptions defaults)
    : Optimizer(std::move(groups), "SGD"), opt_(defaults), group_opts_(std::move(resolved)) {
  for (size_t g = 0; g < group_opts_.size(); ++g) check_sgd_options(group_prefix(g), group_opts_[g]);
}

const SGDOptions& SGD::group_options(size_t group) const {
  ATTO_CHECK(group < group_opts_.size(), "SGD", "group_options: no param group ", group, " (this SGD has ",
             group_opts_.size(), ")");
  return group_opts_[group];
}

std::vector<std::string> SGD::slot_names(size_t group) const {
  if (group_opts_[group].momentum == 0) return {};
  return {"momentum_buffer"};
}

void SGD::update(Tensor& p, const Tensor& g, ParamState& s, size_t group, double lr) {
  const SGDOptions& o = group_opts_[group];
  const bool use_momentum = o.momentum != 0;
  const bool first = use_momentum && !s.slots[0].defined();
  if (first) s.slots[0] = empty(p.shape(), {.dtype = p.dtype()});
  dispatch_float(p.dtype(), "SGD", [&]<typename T>() {
    sgd_update<T>(p.data<T>(), g.data<T>(), use_momentum ? s.slots[0].data<T>() : nullptr, p.numel(), first, o, lr);
  });
}

// ---------------------------------------------------------------------------------------------
// Adam, AdamW

Adam::Adam(std::vector<AdamParamGroup> groups, AdamOptions defaults, bool decoupled, const char* name)
    : Adam(resolve_all(groups, defaults), base_groups(groups, defaults), defaults, decoupled, name) {}

Adam::Adam(std::vector<AdamOptions> resolved, std::vector<std::pair<NamedTensors, double>> groups, AdamOptions defaults,
           bool decoupled, const char* name)
    : Optimizer(std::move(groups), name), opt_(defaults), group_opts_(std::move(resolved)), decoupled_(decoupled) {
  for (size_t g = 0; g < group_opts_.size(); ++g) check_adam_options(name, group_prefix(g), group_opts_[g]);
}

Adam::Adam(NamedTensors params, AdamOptions options)
    : Adam(std::vector<AdamParamGroup>{{.params = std::move(params)}}, options, false, "Adam") {}

Adam::Adam(const std::vector<Tensor>& params, AdamOptions options) : Adam(number(params), options) {}

Adam::Adam(std::vector<AdamParamGroup> groups, AdamOptions defaults)
    : Adam(std::move(groups), defaults, false, "Adam") {}

const AdamOptions& Adam::group_options(size_t group) const {
  ATTO_CHECK(group < group_opts_.size(), type_name(), "group_options: no param group ", group, " (this ", type_name(),
             " has ", group_opts_.size(), ")");
  return group_opts_[group];
}

std::vector<std::string> Adam::slot_names(size_t group) const {
  if (group_opts_[group].amsgrad) return {"exp_avg", "exp_avg_sq", "max_exp_avg_sq"};
  return {"exp_avg", "exp_avg_sq"};
}

void Adam::update(Tensor& p, const Tensor& g, ParamState& s, size_t group, double lr) {
  const AdamOptions& o = group_opts_[group];
  const size_t nslots = o.amsgrad ? 3 : 2;
  for (size_t k = 0; k < nslots; ++k)
    if (!s.slots[k].defined()) s.slots[k] = zeros(p.shape(), {.dtype = p.dtype()});
  dispatch_float(p.dtype(), type_name().c_str(), [&]<typename T>() {
    adam_update<T>(p.data<T>(), g.data<T>(), s.slots[0].data<T>(), s.slots[1].data<T>(),
                   o.amsgrad ? s.slots[2].data<T>() : nullptr, p.numel(), s.step, o, lr, decoupled_);
  });
}

static AdamOptions as_adam(const AdamWOptions& o) {
  return {.lr = o.lr, .betas = o.betas, .eps = o.eps, .weight_decay = o.weight_decay, .amsgrad = o.amsgrad};
}

AdamW::AdamW(NamedTensors params, AdamWOptions options)
    : AdamW(std::vector<AdamParamGroup>{{.params = std::move(params)}}, options) {}

AdamW::AdamW(const std::vector<Tensor>& params, AdamWOptions options) : AdamW(number(params), options) {}

AdamW::AdamW(std::vector<AdamParamGroup> groups, AdamWOptions defaults)
    : Adam(std::move(groups), as_adam(defaults), true, "AdamW"), wopt_(defaults) {}

// ---------------------------------------------------------------------------------------------
// Gradient clipping

// s + sum_j q[j]^2 over 8 running sums (added up at the end; then a tail): one serial chain of double additions was
// 1.4% of a nanoGPT-recipe step (and 3.7% while the sum lived on the stack). Float squares are exact in double, so
// the partial sums differ from the serial sum only in double rounding (relative 1e-16), far below the float32
// rounding of the clip coefficient that scales the gradients.
namespace {
template <class T>
double add_squares(const T* q, int64_t n, double s) {
  constexpr int kLanes = 8;
  double part[kLanes] = {};
  int64_t j = 0;
  for (; j + kLanes <= n; j += kLanes)
    for (int l = 0; l < kLanes; ++l) part[l] += static_cast<double>(q[j + l]) * static_cast<double>(q[j + l]);
  for (int w = kLanes / 2; w > 0; w /= 2)
    for (int l = 0; l < w; ++l) part[l] += part[l + w];
  s += part[0];
  for (; j < n; ++j) s += static_cast<double>(q[j]) * static_cast<double>(q[j]);
  return s;
}
}  // namespace

double clip_grad_norm_(const std::vector<Tensor>& params, double max_norm, double norm_type, bool error_if_nonfinite) {
  ATTO_CHECK(max_norm >= 0, "clip_grad_norm_", "max_norm must be >= 0, got ", max_norm);
  ATTO_CHECK(norm_type > 0, "clip_grad_norm_", "norm_type must be > 0 (or infinity), got ", norm_type);
  const bool max_kind = std::isinf(norm_type);
  double acc = 0;
  bool saw_nan = false, any = false;
  for (size_t i = 0; i < params.size(); ++i) {
    ATTO_CHECK(params[i].defined(), "clip_grad_norm_", "parameter ", i, " is undefined");
    const Tensor g = params[i].grad();
    if (!g.defined()) continue;
    any = true;
    const int64_t n = g.numel();
    dispatch_float(g.dtype(), "clip_grad_norm_", [&]<typename T>() {
      const T* q = g.data<T>();
      if (max_kind) {
        for (int64_t j = 0; j < n; ++j) {
          const double a = std::fabs(static_cast<double>(q[j]));
          if (std::isnan(a))
            saw_nan = true;
          else if (a > acc)
            acc = a;
        }
      } else if (norm_type == 2) {
        acc = add_squares(q, n, acc);
      } else if (norm_type == 1) {
        for (int64_t j = 0; j < n; ++j) acc += std::fabs(static_cast<double>(q[j]));
      } else {
        for (int64_t j = 0; j < n; ++j) acc += std::pow(std::fabs(static_cast<double>(q[j])), norm_type);
      }
    });
  }
  if (!any) return 0.0;
  double total = max_kind         ? (saw_nan ? std::nan("") : acc)
                 : norm_type == 2 ? std::sqrt(acc)
                 : norm_type == 1 ? acc
                                  : std::pow(acc, 1.0 / norm_type);
  ATTO_CHECK(!error_if_nonfinite || std::isfinite(total), "clip_grad_norm_", "the total norm of order ", norm_type,
             " of the gradients is ", total,
             ", so it cannot be clipped (pass error_if_nonfinite=false to scale by it)");
  const double coef = max_norm / (total + 1e-6);
  if (coef >= 1.0) return total;  // a NaN coefficient scales like PyTorch's (to NaN)
  for (const Tensor& p : params) {
    Tensor g = p.grad();
    if (!g.defined()) continue;
    const int64_t n = g.numel();
    dispatch_float(g.dtype(), "clip_grad_norm_", [&]<typename T>() {
      T* q = g.data<T>();
      const T c = static_cast<T>(coef);
      for (int64_t j = 0; j < n; ++j) q[j] *= c;
    });
  }
  return total;
}

void clip_grad_value_(const std::vector<Tensor>& params, double clip_value) {
  ATTO_CHECK(clip_value >= 0, "clip_grad_value_", "clip_value must be >= 0, got ", clip_value);
  for (size_t i = 0; i < params.size(); ++i) {
    ATTO_CHECK(params[i].defined(), "clip_grad_value_", "parameter ", i, " is undefined");
    Tensor g = params[i].grad();
    if (!g.defined()) continue;
    const int64_t n = g.numel();
    dispatch_float(g.dtype(), "clip_grad_value_", [&]<typename T>() {
      T* q = g.data<T>();
      const T hi = static_cast<T>(clip_value), lo = -hi;
      for (int64_t j = 0; j < n; ++j) q[j] = q[j] < lo ? lo : (q[j] > hi ? hi : q[j]);  // NaN stays NaN
    });
  }
}

}  // namespace attograd::optim
