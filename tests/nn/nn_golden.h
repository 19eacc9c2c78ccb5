#pragma once
// Shared by the nn tests: a PyTorch golden's parameters ("param.<i>.<name>" / "grad.<i>.<name>" entries, written
// by tests/nn/golden_*.py) matched against a module's named_parameters().

#include <algorithm>
#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "nn/init.h"
#include "nn/module.h"
#include "testing.h"

namespace attograd::testing {

/// A golden file's tensors by name.
using Golden = std::map<std::string, Tensor>;

/// A golden parameter: its position in PyTorch's named_parameters(), name and value.
struct GoldenParam {
  int index;          ///< position in PyTorch's named_parameters()
  std::string name;   ///< PyTorch's dotted name
  Tensor value;       ///< its value
};

/// The "param.<i>.<name>" entries of a golden file, in PyTorch's order.
inline std::vector<GoldenParam> golden_params(const Golden& g) {
  std::vector<GoldenParam> out;
  const std::string prefix = "param.";
  for (auto& [key, t] : g) {
    if (key.rfind(prefix, 0) != 0) continue;
    const std::string rest = key.substr(prefix.size());
    const size_t dot = rest.find('.');
    out.push_back({std::stoi(rest.substr(0, dot)), rest.substr(dot + 1), t});
  }
  std::sort(out.begin(), out.end(), [](const GoldenParam& a, const GoldenParam& b) { return a.index < b.index; });
  return out;
}

/// The module's parameter names, in registration order.
inline std::vector<std::string> names_of(const nn::Module& m) {
  std::vector<std::string> out;
  for (auto& [n, p] : m.named_parameters()) out.push_back(n);
  return out;
}

/// Checks that `m` has exactly the golden's parameter names (in order) and shapes, then loads the values by name.
inline void expect_names_and_load(nn::Module& m, const std::vector<GoldenParam>& gp) {
  std::vector<std::string> theirs;
  for (auto& p : gp) theirs.push_back(p.name);
  ASSERT_EQ(names_of(m), theirs);
  ASSERT_EQ(m.parameters().size(), gp.size());
  int64_t count = 0;
  for (auto& p : gp) {
    Tensor ours = m.parameter(p.name);
    ASSERT_EQ(ours.shape(), p.value.shape()) << p.name;
    copy_(ours, p.value);
    count += p.value.numel();
  }
  EXPECT_EQ(m.num_parameters(), count);
}

/// Every parameter's .grad against the golden's "grad.<i>.<name>" (1e-5 absolute, 1e-4 relative).
inline void expect_param_grads(const nn::Module& m, const Golden& g, const std::vector<GoldenParam>& gp) {
  for (auto& p : gp) {
    Tensor grad = m.parameter(p.name).grad();
    ASSERT_TRUE(grad.defined()) << p.name;
    EXPECT_TRUE(all_close(grad, g.at("grad." + std::to_string(p.index) + "." + p.name), 1e-5, 1e-4)) << p.name;
  }
}

/// A detached copy of t's handle that requires grad (a fresh leaf on the same values).
inline Tensor leaf(const Tensor& t) {
  Tensor x = t.detach();
  x.requires_grad_(true);
  return x;
}

/// True when every element is finite.
inline bool all_finite(const Tensor& t) {
  for (double v : t.to_vector<double>())
    if (!std::isfinite(v)) return false;
  return true;
}

/// `inputs` followed by every parameter of `m` (float64 leaves after m.to(kFloat64)), with every parameter whose
/// name contains "bias" drawn from U(-0.5, 0.5) so that no gradient path is hidden by a zero init.
inline std::vector<Tensor> with_params(std::vector<Tensor> inputs, nn::Module& m, Generator& gen) {
  NoGradGuard no_grad;
  for (auto& [n, p] : m.named_parameters()) {
    if (n.find("bias") != std::string::npos) nn::init::uniform_(p, -0.5, 0.5, gen);
    inputs.push_back(p);
  }
  return inputs;
}

/// `inputs` followed by every parameter of `m`, biases (names ending in "bias") drawn from U(-0.5, 0.5) and
/// LayerNorm weights (names containing "norm") from U(0.7, 1.3), away from their 0 / 1 init.
inline std::vector<Tensor> params_as_inputs(nn::Module& m, Generator& gen, std::vector<Tensor> inputs = {}) {
  NoGradGuard no_grad;
  for (auto& [n, p] : m.named_parameters()) {
    if (n.size() >= 4 && n.compare(n.size() - 4, 4, "bias") == 0)
      nn::init::uniform_(p, -0.5, 0.5, gen);
    else if (n.find("norm") != std::string::npos)
      nn::init::uniform_(p, 0.7, 1.3, gen);
    inputs.push_back(p);
  }
  return inputs;
}

/// Token ids as a (B, L) Int64 tensor.
inline Tensor tokens_of(const std::vector<int64_t>& ids, int64_t B, int64_t L) {
  return from_vector<int64_t>(ids, {B, L});
}

}  // namespace attograd::testing
