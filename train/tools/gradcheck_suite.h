#pragma once
// A registry of named gradient checks covering every op and every module (attograd::checks), run by
// `attograd gradcheck` and by the tests: tests/train/test_gradcheck_suite.cpp generates one test per entry and
// precision, and fails when a function of the autograd headers that returns a Tensor has neither an entry here nor
// a place in unchecked_ops(). So a new op is registered once, in build_registry(), and is tested from there
// (PyTorch's OpInfo table plays the same part).
//
// Each check builds small inputs (and a module, if any) in the requested precision from a fixed seed and runs
// gradcheck() (autograd/gradcheck.h) against every float input and every parameter. Module checks reduce the
// module's output to a scalar with a fixed random projection, sum(out * W), so one backward gives the gradient
// of every input and parameter, which is then compared element by element with central differences.
// Parameters are moved off their initial values where those would hide mistakes (biases away from 0, norm weights
// away from 1). Sample points stay away from kinks (relu near 0, ties of max); inside modules, the feed-forward
// ReLU inputs are kept away from 0 by a first-layer bias of magnitude >= 0.5 and a first-layer weight scaled by 1/4.
//
// Op checks use fixed small shapes (listed in each check's configuration); scaled_dot_product_attention and
// every module take their sizes from CheckConfig (batch, len, d_model, heads, mask, dropout). With dropout > 0 the
// module runs in training mode and its generator is re-seeded before every forward, so the masks replay.
//
// The reported errors are computed beside gradcheck() from the same central differences: the max absolute error
// over every Jacobian entry, and the max relative error over the entries whose numeric derivative is at least atol
// (where the true derivative is ~0, e.g. the key bias of attention, a relative error is rounding noise divided by
// nearly nothing). Pass/fail is gradcheck()'s: |analytic - numeric| <= atol + rtol * |numeric| everywhere, and
// two backward passes bitwise equal.
//
// Tolerances per precision (tolerances()):
//   float64: PyTorch's gradcheck defaults, eps 1e-6, atol 1e-5, rtol 1e-3;
//   float32: eps 1e-3, atol 1e-2, rtol 1e-2 (float32 differences at eps 1e-6 are mostly rounding noise).

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "autograd/gradcheck.h"
#include "nn/sequence_model.h"

namespace attograd::checks {

/// Sizes and options of the checks that take any (the modules and scaled_dot_product_attention).
/// Largest sizes validate() accepts: a full-Jacobian check costs about (parameters + inputs) forward passes, so
/// these keep the biggest check (a 2-layer Transformer, batch 4, len 16, d_model 16) within about a minute.
inline constexpr int64_t kMaxCheckBatch = 4, kMaxCheckLen = 16, kMaxCheckDModel = 16, kMaxCheckLayers = 2;

struct CheckConfig {
  Dtype dtype = kFloat64;     ///< precision of inputs and parameters
  int64_t batch = 2;          ///< sequences
  int64_t len = 5;            ///< sequence length (queries and keys)
  int64_t d_model = 8;        ///< model width
  int64_t heads = 2;          ///< attention heads (must divide d_model)
  int64_t layers = 1;         ///< layers of the whole models (CausalLM, seed::Transformer)
  std::string mask = "none";  ///< attention mask: "none", "causal" or "padding"
  double dropout = 0.0;  ///< dropout probability of modules with dropout (the dropout op and Dropout use 0.2 when 0)
  uint64_t seed = 0;     ///< seed of inputs and initial weights
};

/// The outcome of one check.
struct CheckResult {
  std::string name;               ///< the check's name
  std::string kind;               ///< "op" or "module"
  std::string configuration;      ///< shapes and options actually used
  GradcheckResult result;         ///< what gradcheck() found (decides pass/fail)
  double max_abs_error = 0;       ///< max |analytic - numeric| over every Jacobian entry
  double max_rel_error = 0;       ///< max |analytic - numeric| / |numeric| over the entries with |numeric| >= atol
  double max_abs_derivative = 0;  ///< max |numeric| over every Jacobian entry (0 would make the check vacuous)
  double seconds = 0;             ///< wall time
};

/// A named check.
struct Check {
  std::string name;  ///< op name (snake_case) or module type name (PascalCase)
  std::string kind;  ///< "op" or "module"
  std::function<CheckResult(const CheckConfig&, const GradcheckOptions&)> run;  ///< runs the check
};

/// Every check: the ops first, then the modules, in a fixed order.
const std::vector<Check>& registry();

/// A function of the autograd headers that returns a Tensor but has no check, and why.
struct UncheckedOp {
  std::string name;    ///< function name
  std::string reason;  ///< why no gradient check applies (creation, boolean result, engine helper)
};

/// The functions of the autograd headers that return a Tensor and need no check: every other one has an entry.
const std::vector<UncheckedOp>& unchecked_ops();

/// The tolerances documented above for a precision (Error for non-float dtypes).
GradcheckOptions tolerances(Dtype dtype);

/// The check called `name`: an exact registry name ("softmax", "MultiheadAttention"), else an alias or a
/// case-insensitive name ("mha" = MultiheadAttention, "seed_mha" = seed::AttentionSublayer, "encoder_layer",
/// "decoder_layer", "ffn", "causal_lm", "transformer" = seed::Transformer, ...), else "CausalLM.<kind>" or the name
/// of a registered attention kind (causal_lm_attention_check). Error listing the names when none matches.
const Check& find_check(const std::string& name);

/// A check of CausalLM (every parameter, causal, with padding unless the kind takes no key padding mask) built with
/// `spec`, any registered attention kind: what the CausalLM.<variant> entries run. find_check("CausalLM.<kind>")
/// (or the kind's bare name, when no other check has it) makes one for a kind at its defaults.
Check causal_lm_attention_check(const std::string& name, const nn::AttentionSpec& spec);

/// Validates a configuration (Error naming the offending field).
void validate(const CheckConfig& config);

/// Runs one check, or all of them when `name` is empty, with tolerances(config.dtype) unless `options` is given.
std::vector<CheckResult> run_checks(const std::string& name, const CheckConfig& config);
/// Same with explicit gradcheck options.
std::vector<CheckResult> run_checks(const std::string& name, const CheckConfig& config,
                                    const GradcheckOptions& options);

}  // namespace attograd::checks
