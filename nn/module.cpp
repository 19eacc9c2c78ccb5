#include "nn/module.h"

#include <cstring>
#include <unordered_map>
#include <unordered_set>

namespace attograd::nn {

Tensor Module::forward(const Tensor&) {
  throw Error(type_name(), "this module does not take a single tensor; call its own forward(...)");
}

void Module::check_new_name(const std::string& name, const char* what) const {
  ATTO_CHECK(!name.empty() && name.find('.') == std::string::npos, what, "invalid name '", name,
             "' (must be non-empty and contain no '.')");
  for (auto& [n, _] : params_) ATTO_CHECK(n != name, what, "name '", name, "' is already a parameter");
  for (auto& [n, _] : buffers_) ATTO_CHECK(n != name, what, "name '", name, "' is already a buffer");
  for (auto& [n, _] : children_) ATTO_CHECK(n != name, what, "name '", name, "' is already a submodule");
}

Tensor Module::register_parameter(const std::string& name, Tensor value, bool requires_grad) {
  check_new_name(name, "register_parameter");
  ATTO_CHECK(value.defined(), "register_parameter", "parameter '", name, "' is undefined");
  ATTO_CHECK(value.is_leaf(), "register_parameter", "parameter '", name, "' must be a leaf tensor (use detach())");
  value.requires_grad_(requires_grad);
  params_.emplace_back(name, value);
  return value;
}

Tensor Module::register_buffer(const std::string& name, Tensor value) {
  check_new_name(name, "register_buffer");
  ATTO_CHECK(value.defined(), "register_buffer", "buffer '", name, "' is undefined");
  buffers_.emplace_back(name, value);
  return value;
}

void Module::add_child(const std::string& name, std::shared_ptr<Module> module) {
  check_new_name(name, "register_module");
  ATTO_CHECK(module != nullptr, "register_module", "submodule '", name, "' is null");
  children_.emplace_back(name, std::move(module));
}

namespace {
template <class Get>
void collect(const Module& m, const std::string& prefix, bool recurse, Get get,
             std::vector<std::pair<std::string, Tensor>>& out, std::unordered_set<TensorImpl*>& seen) {
  for (auto& [n, t] : get(m))
    if (seen.insert(t.impl().get()).second) out.emplace_back(prefix + n, t);
  if (!recurse) return;
  for (auto& [n, child] : m.named_children()) collect(*child, prefix + n + ".", true, get, out, seen);
}
}  // namespace

std::vector<std::pair<std::string, Tensor>> Module::named_parameters(bool recurse) const {
  std::vector<std::pair<std::string, Tensor>> out;
  std::unordered_set<TensorImpl*> seen;  // a shared (tied) tensor is listed once, under its first name
  collect(*this, "", recurse, [](const Module& m) -> const auto& { return m.params_; }, out, seen);
  return out;
}

std::vector<std::pair<std::string, Tensor>> Module::named_buffers(bool recurse) const {
  std::vector<std::pair<std::string, Tensor>> out;
  std::unordered_set<TensorImpl*> seen;
  collect(*this, "", recurse, [](const Module& m) -> const auto& { return m.buffers_; }, out, seen);
  return out;
}

std::vector<Tensor> Module::parameters(bool recurse) const {
  std::vector<Tensor> out;
  for (auto& [_, t] : named_parameters(recurse)) out.push_back(t);
  return out;
}

std::vector<std::pair<std::string, Module*>> Module::named_modules() {
  std::vector<std::pair<std::string, Module*>> out;
  std::vector<std::pair<std::string, Module*>> stack{{"", this}};
  while (!stack.empty()) {
    auto [name, m] = stack.back();
    stack.pop_back();
    out.emplace_back(name, m);
    for (auto it = m->children_.rbegin(); it != m->children_.rend(); ++it)
      stack.emplace_back(name.empty() ? it->first : name + "." + it->first, it->second.get());
  }
  return out;
}

Tensor Module::parameter(const std::string& dotted_name) const {
  for (auto& [n, t] : named_parameters())
    if (n == dotted_name) return t;
  throw Error(type_name(), "no parameter named '" + dotted_name + "'");
}

Module& Module::apply(const std::function<void(Module&)>& fn) {
  for (auto& [_, c] : children_) c->apply(fn);
  fn(*this);
  return *this;
}

Module& Module::train(bool on) {
  return apply([on](Module& m) { m.training_ = on; });
}

void Module::set_generator(Generator& gen) {
  apply([&gen](Module& m) { m.set_own_generator(gen); });
}

void Module::zero_grad(bool set_to_none) {
  for (auto& t : parameters()) t.zero_grad(set_to_none);
}

int64_t Module::num_parameters() const {
  int64_t n = 0;
  for (auto& [_, t] : named_parameters()) n += t.numel();
  return n;
}

void Module::to(Dtype dtype) {
  ATTO_CHECK(is_floating(dtype), type_name(), "to: expected a float dtype (float32 or float64), got ",
             dtype_name(dtype));
  auto convert = [dtype](const Tensor& t) {
    if (t.dtype() == dtype || !is_floating(t.dtype())) return;  // a tied tensor is converted once
    Tensor c;
    {
      NoGradGuard ng;
      c = t.detach().to(dtype);
    }
    // Swap the storage in place so every handle to this parameter (module members, optimizers) sees it.
    TensorImpl* impl = t.impl().get();
    impl->storage = c.impl()->storage;
    impl->offset = 0;
    impl->dtype = dtype;
    impl->grad.reset();
  };
  apply([&convert](Module& m) {
    for (auto& [_, t] : m.params_) convert(t);
    for (auto& [_, t] : m.buffers_) convert(t);
  });
}

StateDict Module::state_dict() const {
  StateDict out = named_parameters();
  for (auto& b : named_buffers()) out.push_back(std::move(b));
  return out;
}

LoadStateDictResult Module::load_state_dict(const StateDict& state, const LoadStateDictOptions& options) {
  return detail::load_state_dict(*this, state, options, {});
}

namespace {
std::string join(const std::vector<std::string>& names) {
  std::string s;
  for (size_t i = 0; i < names.size(); ++i) s += (i ? ", " : "") + names[i];
  return s;
}
}  // namespace

LoadStateDictResult detail::load_state_dict(Module& m, const StateDict& state, const LoadStateDictOptions& options,
                                            const StateSource& source) {
  const std::string& op = source.op;
  const std::string& origin = source.origin;
  std::unordered_map<std::string, size_t> index;
  for (size_t i = 0; i < state.size(); ++i) {
    ATTO_CHECK(state[i].second.defined(), op, origin, ": tensor '", state[i].first, "' is undefined");
    ATTO_CHECK(index.emplace(state[i].first, i).second, op, origin, ": tensor '", state[i].first,
               "' appears more than once");
  }
  LoadStateDictResult report;
  std::vector<std::string> mismatch_detail;
  std::vector<std::pair<Tensor, size_t>> copies;  // (module tensor, index in `state`)
  std::vector<bool> used(state.size(), false);
  for (const auto& [name, dst] : m.state_dict()) {
    auto it = index.find(name);
    if (it == index.end()) {
      report.missing.push_back(name);
      continue;
    }
    used[it->second] = true;
    const Tensor& src = state[it->second].second;
    const bool castable = options.allow_dtype_cast && is_floating(src.dtype()) && is_floating(dst.dtype());
    if ((src.dtype() != dst.dtype() && !castable) || src.shape() != dst.shape()) {
      report.mismatched.push_back(name);
      const bool only_dtype = src.shape() == dst.shape() && is_floating(src.dtype()) && is_floating(dst.dtype());
      mismatch_detail.push_back(str_cat(name, " (", source.noun, " ", src.shape(), " ", dtype_name(src.dtype()), ", model ",
                                    dst.shape(), " ", dtype_name(dst.dtype()),
                                    only_dtype ? "; pass allow_dtype_cast = true to convert" : "", ")"));
      continue;
    }
    copies.emplace_back(dst, it->second);
  }
  for (size_t i = 0; i < state.size(); ++i)
    if (!used[i]) report.unexpected.push_back(state[i].first);
  if (options.strict && !report.ok()) {
    std::string msg = str_cat(origin, ": strict load failed:");
    if (!report.missing.empty())
      msg += str_cat(" ", report.missing.size(), " missing (in the model, not in the ", source.noun,
                 "): ", join(report.missing), ";");
    if (!report.unexpected.empty())
      msg += str_cat(" ", report.unexpected.size(), " unexpected (in the ", source.noun,
                 ", not in the model): ", join(report.unexpected), ";");
    if (!report.mismatched.empty())
      msg += str_cat(" ", report.mismatched.size(), " mismatched: ", join(mismatch_detail), ";");
    msg += " nothing was loaded (pass strict = false to load the tensors that match)";
    throw Error(op, msg);
  }
  NoGradGuard no_grad;
  for (auto& [dst, i] : copies) copy_(dst, state[i].second);
  return report;
}

void Module::describe(std::string& out, int indent) const {
  out += type_name() + "(";
  std::string extra = extra_repr();
  if (children_.empty()) {
    out += extra + ")";
    return;
  }
  auto newline = [&out](int n) {
    out.push_back('\n');
    out.append(static_cast<size_t>(n), ' ');
  };
  if (!extra.empty()) {
    newline(indent + 2);
    out.append(extra);
  }
  for (auto& [n, c] : children_) {
    newline(indent + 2);
    out.append("(").append(n).append("): ");
    c->describe(out, indent + 2);
  }
  newline(indent);
  out.push_back(')');
}

std::string Module::to_string() const {
  std::string s;
  describe(s, 0);
  return s;
}

}  // namespace attograd::nn
