#pragma once
// Module: the base of every layer. Parameters, buffers and submodules are registered by name;
// named_parameters() walks them in registration order with dotted names
// ("blocks.0.self_attn.w_q.weight"), the names that files and optimizers key on.

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "autograd/autograd.h"

namespace attograd::nn {

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

  /// Sets training mode on this module and every descendant.
  void train(bool on = true);
  /// Sets evaluation mode (train(false)).
  void eval() { train(false); }
  /// True in training mode (the default).
  bool is_training() const { return training_; }
  /// Zeros (or drops) every parameter's gradient.
  void zero_grad(bool set_to_none = false);
  /// Total number of parameter elements (shared tensors counted once).
  int64_t num_parameters() const;
  /// Converts every parameter and buffer to `dtype` in place (e.g. kFloat64 for a gradient check);
  /// gradients are dropped.
  void to(Dtype dtype);
  /// Multi-line description in PyTorch's style.
  std::string to_string() const;

 protected:
  /// Appends extra text to this module's line in to_string(), e.g. "in_features=4, out_features=2".
  virtual std::string extra_repr() const { return ""; }

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
