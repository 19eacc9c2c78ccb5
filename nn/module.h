#pragma once
// Module: the base of every layer. Parameters, buffers and submodules are registered by name;
// named_parameters() walks them in registration order with dotted names
// ("blocks.0.self_attn.w_q.weight"), the names that files and optimizers key on. Tree-wide settings (train/eval,
// to(dtype), set_generator) walk the tree once through apply(), as PyTorch's nn.Module.apply: a module that holds
// a generator overrides the hook set_own_generator() instead of forwarding to its children by hand.

#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "autograd/autograd.h"

namespace attograd::nn {

/// Dotted name -> tensor, in order: parameters (named_parameters()) then buffers (named_buffers()).
using StateDict = std::vector<std::pair<std::string, Tensor>>;

/// Options of Module::load_state_dict: load_state_dict(state, {.strict = false, .allow_dtype_cast = true}).
struct LoadStateDictOptions {
  /// Any missing, unexpected or mismatched (shape or dtype) key throws ONE Error naming each, and nothing is
  /// copied. Non-strict: copies what matches and reports the rest.
  bool strict = true;
  /// Convert between float32 and float64 (rounding to float32 when narrowing). Without it a float dtype
  /// difference is a mismatch naming the key and both dtypes. Non-float dtypes never convert.
  bool allow_dtype_cast = false;
};

/// What Module::load_state_dict did not load, by dotted name (PyTorch's missing_keys / unexpected_keys).
struct LoadStateDictResult {
  std::vector<std::string> missing;     ///< in the module, absent from the state
  std::vector<std::string> unexpected;  ///< in the state, absent from the module
  std::vector<std::string> mismatched;  ///< in both, but the shape or the dtype differs
  /// True when everything matched.
  bool ok() const { return missing.empty() && unexpected.empty() && mismatched.empty(); }
};

class Module;

namespace detail {
/// Where a state comes from, for error messages of the loaders built on Module::load_state_dict.
struct StateSource {
  std::string origin = "state dict";   ///< names the source, e.g. "'model.bin'"
  std::string op = "load_state_dict";  ///< the operation named in errors, e.g. "load"
  std::string noun = "state";          ///< the source in a mismatch, e.g. "w (state [3] float64, model [3] float32)"
};
/// Module::load_state_dict with the source named as `source` says (the one implementation of loading).
LoadStateDictResult load_state_dict(Module& m, const StateDict& state, const LoadStateDictOptions& options,
                                    const StateSource& source);
}  // namespace detail

/// Base class of all modules (torch.nn.Module). Hold modules by std::shared_ptr.
class Module {
 public:
  virtual ~Module() = default;
  Module() = default;
  Module(const Module&) = delete;
  Module& operator=(const Module&) = delete;

  /// The module's type name, e.g. "Linear" (used in printing and errors).
  virtual std::string type_name() const { return "Module"; }
  /// Forward for modules that map one tensor to one tensor (used by Sequential); others throw.
  virtual Tensor forward(const Tensor& x);
  /// Calls forward(x).
  Tensor operator()(const Tensor& x) { return forward(x); }

  /// Registers a parameter (a leaf; requires_grad is set unless `requires_grad` is false) and returns it.
  Tensor register_parameter(const std::string& name, Tensor value, bool requires_grad = true);
  /// Registers a buffer (state saved with the weights but not trained, e.g. a position table).
  Tensor register_buffer(const std::string& name, Tensor value);
  /// Registers a child module and returns it.
  template <class M>
  std::shared_ptr<M> register_module(const std::string& name, std::shared_ptr<M> module) {
    add_child(name, module);
    return module;
  }

  /// Parameters with dotted names, in registration order (recursively unless recurse is false).
  std::vector<std::pair<std::string, Tensor>> named_parameters(bool recurse = true) const;
  /// Buffers with dotted names, in registration order.
  std::vector<std::pair<std::string, Tensor>> named_buffers(bool recurse = true) const;
  /// Every parameter, in named_parameters() order.
  std::vector<Tensor> parameters(bool recurse = true) const;
  /// Direct children with their names.
  const std::vector<std::pair<std::string, std::shared_ptr<Module>>>& named_children() const { return children_; }
  /// This module and every descendant with dotted names ("" for this one), depth-first.
  std::vector<std::pair<std::string, Module*>> named_modules();
  /// The parameter with the given dotted name; throws an Error naming it if absent.
  Tensor parameter(const std::string& dotted_name) const;

  /// Calls fn on every submodule (children first, recursively) and then on this module; returns *this
  /// (torch.nn.Module.apply).
  Module& apply(const std::function<void(Module&)>& fn);
  /// Sets training mode on this module and every descendant; returns *this.
  Module& train(bool on = true);
  /// Sets evaluation mode (train(false)); returns *this.
  Module& eval() { return train(false); }
  /// True in training mode (the default).
  bool is_training() const { return training_; }
  /// Zeros (or drops) every parameter's gradient.
  void zero_grad(bool set_to_none = false);
  /// Total number of parameter elements (shared tensors counted once).
  int64_t num_parameters() const;
  /// Converts every float parameter and buffer to the float `dtype` in place (e.g. kFloat64 for a gradient
  /// check); gradients are dropped. Every handle (module members, optimizers) sees the new data.
  void to(Dtype dtype);
  /// Makes every module of the tree that draws random numbers at run time (Dropout, attention dropout) draw
  /// them from `gen`, which must outlive the modules; re-seeding `gen` replays the masks. Walks the tree
  /// with apply(), calling each module's set_own_generator().
  void set_generator(Generator& gen);
  /// Parameters then buffers with dotted names (shares data, as PyTorch's state_dict(keep_vars=True)).
  StateDict state_dict() const;
  /// Copies `state` into the parameters and buffers in place (no history; every handle sees the values).
  /// Strict by default; a float dtype difference is a mismatch unless options.allow_dtype_cast.
  LoadStateDictResult load_state_dict(const StateDict& state, const LoadStateDictOptions& options = {});
  /// Multi-line description in PyTorch's style.
  std::string to_string() const;

 protected:
  /// Appends extra text to this module's line in to_string(), e.g. "in_features=4, out_features=2".
  virtual std::string extra_repr() const { return ""; }
  /// Hook of set_generator(): a module that holds a generator pointer stores `gen` (children are reached by
  /// set_generator itself). Does nothing by default.
  virtual void set_own_generator(Generator& gen) { (void)gen; }

 private:
  void add_child(const std::string& name, std::shared_ptr<Module> module);
  void check_new_name(const std::string& name, const char* what) const;
  void describe(std::string& out, int indent) const;

  bool training_ = true;
  std::vector<std::pair<std::string, Tensor>> params_;
  std::vector<std::pair<std::string, Tensor>> buffers_;
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> children_;
};

}  // namespace attograd::nn
