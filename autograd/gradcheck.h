#pragma once
// Finite-difference gradient checking, PyTorch's torch.autograd.gradcheck method and defaults.

#include <functional>
#include <string>
#include <vector>

#include "autograd/tensor.h"

namespace attograd {

/// Options of gradcheck; the defaults are PyTorch's (meant for float64 inputs).
struct GradcheckOptions {
  double eps = 1e-6;              ///< central-difference step
  double atol = 1e-5;             ///< absolute tolerance
  double rtol = 1e-3;             ///< relative tolerance: pass when |a - n| <= atol + rtol * |n|
  bool check_reentrant = true;    ///< run the analytic Jacobian twice and require bitwise equality
  bool fast_mode = false;         ///< compare v^T J u for random u, v instead of the full Jacobian
  int64_t max_full_outputs = 4096;  ///< above this many output elements, fall back to fast mode
  uint64_t seed = 0;              ///< seed of the random projections in fast mode
};

/// What gradcheck found; `passed` is false on any mismatch, and `message` names the worst element.
struct GradcheckResult {
  bool passed = true;          ///< every element within tolerance (and reentrant when checked)
  bool reentrant = true;       ///< two backward passes gave bitwise-equal gradients
  double max_abs_error = 0;    ///< max |analytic - numeric| over all compared entries
  double max_rel_error = 0;    ///< max |analytic - numeric| / |numeric| over entries with |numeric| >= atol
  size_t worst_input = 0;      ///< input holding the worst entry (by error / allowed error)
  int64_t worst_index = -1;    ///< flat element index within that input (-1 in fast mode)
  int64_t worst_output = -1;   ///< flat output element of the worst entry (-1 in fast mode)
  double analytic = 0;         ///< the analytic value at the worst entry
  double numeric = 0;          ///< the numeric value at the worst entry
  int64_t checked = 0;         ///< number of entries compared
  std::string message;         ///< human-readable summary
  /// True when passed.
  explicit operator bool() const { return passed; }
};

/// Checks the gradients of `f` with respect to `inputs` (leaves with requires_grad). `f` is called
/// repeatedly and must read the inputs' current values (it may be a closure over a module whose
/// parameters are the inputs). Inputs are perturbed in place and restored.
GradcheckResult gradcheck(const std::function<Tensor()>& f, const std::vector<Tensor>& inputs,
                          const GradcheckOptions& options = {});

/// Same, with f receiving the inputs.
GradcheckResult gradcheck(const std::function<Tensor(const std::vector<Tensor>&)>& f,
                          const std::vector<Tensor>& inputs, const GradcheckOptions& options = {});

}  // namespace attograd
