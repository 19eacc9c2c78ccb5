// `attograd gradcheck`: finite-difference gradient checks of every op and module (train/tools/gradcheck_suite.h).

#include <algorithm>
#include <cstdio>

#include <nlohmann/json.hpp>

#include "cli.h"
#include "train/tools/gradcheck_suite.h"

namespace attograd::cli {

namespace {

struct GradcheckArgs {
  std::string module, dtype = "float64";
  checks::CheckConfig config;
  double eps = 0, atol = 0, rtol = 0;
  bool json = false, list = false;
};

int run_gradcheck(GradcheckArgs& a) {
  if (a.list) {
    for (const checks::Check& c : checks::registry()) std::printf("%-30s %s\n", c.name.c_str(), c.kind.c_str());
    return kExitOk;
  }
  a.config.dtype = a.dtype == "float32" ? kFloat32 : kFloat64;
  checks::validate(a.config);
  GradcheckOptions o = checks::tolerances(a.config.dtype);
  // Given values were checked (positive_real): finite and > 0.
  if (a.eps > 0) o.eps = a.eps;
  if (a.atol > 0) o.atol = a.atol;
  if (a.rtol > 0) o.rtol = a.rtol;
  if (!a.module.empty()) checks::find_check(a.module);  // an unknown name is a usage error before any work

  std::vector<checks::CheckResult> results;
  size_t name_w = 4;
  for (const checks::Check& c : checks::registry()) name_w = std::max(name_w, c.name.size());
  const std::string header =
      strf("%-*s  %-6s  %-*s  %12s  %12s  %s", static_cast<int>(name_w), "name", "kind", 56, "configuration",
           "max abs err", "max rel err", "result");
  if (!a.json) {
    std::printf("gradcheck in %s: eps %g, atol %g, rtol %g (pass when |analytic - numeric| <= atol + rtol |numeric|)\n",
                a.dtype.c_str(), o.eps, o.atol, o.rtol);
    std::printf("%s\n%s\n", header.c_str(), std::string(header.size() + 2, '-').c_str());
    std::fflush(stdout);
  }
  auto print_row = [&](const checks::CheckResult& r) {
    std::printf("%-*s  %-6s  %-*s  %12.3e  %12.3e  %s\n", static_cast<int>(name_w), r.name.c_str(), r.kind.c_str(), 56,
                r.configuration.c_str(), r.max_abs_error, r.max_rel_error,
                r.result.passed ? "pass" : "FAIL");
    if (!r.result.passed) std::printf("    %s\n", r.result.message.c_str());
    std::fflush(stdout);
  };
  double seconds = 0;
  int failed = 0;
  const std::vector<std::string> names = [&] {
    std::vector<std::string> n;
    if (!a.module.empty()) n.push_back(checks::find_check(a.module).name);
    else
      for (const checks::Check& c : checks::registry()) n.push_back(c.name);
    return n;
  }();
  for (const std::string& name : names) {
    checks::CheckResult r = checks::run_checks(name, a.config, o).front();
    seconds += r.seconds;
    failed += r.result.passed ? 0 : 1;
    if (!a.json) print_row(r);
    results.push_back(std::move(r));
  }
  if (a.json) {
    nlohmann::ordered_json j;
    j["dtype"] = a.dtype;
    j["eps"] = o.eps;
    j["atol"] = o.atol;
    j["rtol"] = o.rtol;
    j["checks"] = nlohmann::ordered_json::array();
    for (const checks::CheckResult& r : results)
      j["checks"].push_back({{"name", r.name},
                             {"kind", r.kind},
                             {"configuration", r.configuration},
                             {"max_abs_error", r.max_abs_error},
                             {"max_rel_error", r.max_rel_error},
                             {"passed", r.result.passed},
                             {"seconds", r.seconds},
                             {"message", r.result.message}});
    j["passed"] = static_cast<int64_t>(results.size()) - failed;
    j["failed"] = failed;
    std::printf("%s\n", j.dump().c_str());
  } else {
    std::printf("%zu of %zu checks passed in %.1f s%s\n", results.size() - static_cast<size_t>(failed), results.size(),
                seconds, failed ? "; FAILED: see the rows marked FAIL" : "");
  }
  return failed ? kExitFailed : kExitOk;
}

}  // namespace

Command add_gradcheck(CLI::App& app) {
  CLI::App* sub = app.add_subcommand("gradcheck", "Check every op's and module's gradients by finite differences");
  auto a = std::make_shared<GradcheckArgs>();
  sub->add_option("-m,--module", a->module,
                  "run one check: an op (softmax, ...) or module (MultiheadAttention, ...) or an alias (mha, seed_mha, "
                  "ffn, encoder_layer, decoder_layer, causal_lm, transformer, sdpa)");
  sub->add_option("--dtype", a->dtype, "precision: float64 (PyTorch's tolerances) or float32 (eps 1e-3, atol/rtol 1e-2)")
      ->check(CLI::IsMember({"float64", "float32"}))
      ->capture_default_str();
  sub->add_option("--batch", a->config.batch, "batch size of module inputs (at most 4)")
      ->check(integer_in(1, checks::kMaxCheckBatch))
      ->capture_default_str();
  sub->add_option("--len", a->config.len, "sequence length (at most 16: a check costs a forward pass per value)")
      ->check(integer_in(1, checks::kMaxCheckLen))
      ->capture_default_str();
  sub->add_option("--d-model", a->config.d_model, "model width (at most 16)")
      ->check(integer_in(1, checks::kMaxCheckDModel))
      ->capture_default_str();
  sub->add_option("--heads", a->config.heads, "attention heads")
      ->check(integer_in(1, checks::kMaxCheckDModel))
      ->capture_default_str();
  sub->add_option("--layers", a->config.layers, "layers of CausalLM, EncoderTagger and seed::Transformer (at most 2)")
      ->check(integer_in(1, checks::kMaxCheckLayers))
      ->capture_default_str();
  sub->add_option("--mask", a->config.mask, "attention mask: none, causal or padding")
      ->check(CLI::IsMember({"none", "causal", "padding"}))
      ->capture_default_str();
  sub->add_option("--dropout", a->config.dropout, "dropout (masks replayed); the dropout op and Dropout use 0.2 if 0")
      ->capture_default_str();
  sub->add_option("--seed", a->config.seed, "seed of inputs and weights")->check(unsigned64())->capture_default_str();
  sub->add_option("--eps", a->eps, "finite-difference step (default: per precision)")->check(positive_real());
  sub->add_option("--atol", a->atol, "absolute tolerance (default: per precision)")->check(positive_real());
  sub->add_option("--rtol", a->rtol, "relative tolerance (default: per precision)")->check(positive_real());
  sub->add_flag("--list", a->list, "list the checks and exit");
  sub->add_flag("--json", a->json, "print the results as one JSON object");
  sub->footer(
      "Central differences against the analytic gradient (torch.autograd.gradcheck's method). float64 uses\n"
      "PyTorch's defaults (eps 1e-6, atol 1e-5, rtol 1e-3); float32 uses eps 1e-3, atol 1e-2, rtol 1e-2, since\n"
      "float32 differences at eps 1e-6 are rounding noise. Exit status 1 when any check fails.\n\n"
      "Examples:\n"
      "  attograd gradcheck\n"
      "  attograd gradcheck --module mha --heads 2 --d-model 8 --len 5 --mask causal --dropout 0.1\n"
      "  attograd gradcheck --dtype float32 --json");
  return {sub, [a] { return run_gradcheck(*a); }};
}

}  // namespace attograd::cli
