// train/gradcheck_suite: the registry behind `attograd gradcheck`.

#include <set>

#include "testing.h"
#include "train/gradcheck_suite.h"

namespace attograd {
namespace {

TEST(GradcheckSuite, RegistryCoversEveryOpAndModuleOnce) {
  const std::vector<std::string> ops = {
      "add", "sub", "mul", "div", "exp", "log", "sqrt", "pow", "tanh", "sigmoid", "relu", "gelu", "matmul", "linear",
      "transpose", "reshape", "slice", "cat", "stack", "split", "sum", "mean", "max", "softmax", "log_softmax",
      "masked_fill", "where", "dropout", "embedding", "layer_norm", "cross_entropy", "mse_loss",
      "scaled_dot_product_attention"};
  const std::vector<std::string> modules = {
      "Linear", "Embedding", "LayerNorm", "Dropout", "PositionwiseFeedForward", "MultiheadAttention",
      "MultiHeadAttention", "TransformerEncoderLayer", "TransformerDecoderLayer", "CausalLM", "Transformer"};
  std::vector<std::string> names, kinds;
  for (const checks::Check& c : checks::registry()) names.push_back(c.name), kinds.push_back(c.kind);
  std::vector<std::string> expected = ops;
  expected.insert(expected.end(), modules.begin(), modules.end());
  EXPECT_EQ(names, expected);
  for (size_t i = 0; i < names.size(); ++i) EXPECT_EQ(kinds[i], i < ops.size() ? "op" : "module") << names[i];
}

TEST(GradcheckSuite, FindsNamesAndAliases) {
  EXPECT_EQ(checks::find_check("mha").name, "MultiheadAttention");
  EXPECT_EQ(checks::find_check("seed_mha").name, "MultiHeadAttention");
  EXPECT_EQ(checks::find_check("linear").name, "linear");
  EXPECT_EQ(checks::find_check("Linear").name, "Linear");
  EXPECT_EQ(checks::find_check("SOFTMAX").name, "softmax");
  EXPECT_EQ(checks::find_check("causallm").name, "CausalLM");
  EXPECT_EQ(checks::find_check("encoder_layer").name, "TransformerEncoderLayer");
  EXPECT_ATTO_ERROR(checks::find_check("conv2d"), "no check named 'conv2d'");
  EXPECT_ATTO_ERROR(checks::find_check("LINEAR"), "ambiguous");
}

TEST(GradcheckSuite, TolerancesPerPrecision) {
  const GradcheckOptions d = checks::tolerances(kFloat64);
  EXPECT_EQ(d.eps, 1e-6);
  EXPECT_EQ(d.atol, 1e-5);
  EXPECT_EQ(d.rtol, 1e-3);
  const GradcheckOptions f = checks::tolerances(kFloat32);
  EXPECT_EQ(f.eps, 1e-3);
  EXPECT_EQ(f.atol, 1e-2);
  EXPECT_EQ(f.rtol, 1e-2);
  EXPECT_ATTO_ERROR(checks::tolerances(kInt64), "float64 or float32");
}

TEST(GradcheckSuite, ValidatesTheConfiguration) {
  checks::CheckConfig c;
  c.heads = 3;
  EXPECT_ATTO_ERROR(checks::validate(c), "heads (3) must divide d_model (8)");
  c = {};
  c.mask = "diagonal";
  EXPECT_ATTO_ERROR(checks::validate(c), "mask must be none, causal or padding");
  c = {};
  c.dropout = 1;
  EXPECT_ATTO_ERROR(checks::validate(c), "dropout");
  c = {};
  c.mask = "padding";
  c.len = 1;
  EXPECT_ATTO_ERROR(checks::validate(c), "len >= 2");
}

TEST(GradcheckSuite, EveryCheckPassesInDouble) {
  for (const checks::CheckResult& r : checks::run_checks("", {})) {
    EXPECT_TRUE(r.result.passed) << r.name << ": " << r.result.message;
    EXPECT_FALSE(r.configuration.empty()) << r.name;
    EXPECT_LT(r.max_abs_error, 1e-5) << r.name;
    EXPECT_LT(r.max_rel_error, 1e-3) << r.name;
  }
}

TEST(GradcheckSuite, AttentionModulesWithMasksDropoutAndFloat32) {
  for (const char* mask : {"none", "causal", "padding"}) {
    for (Dtype dtype : {kFloat64, kFloat32}) {
      checks::CheckConfig c;
      c.mask = mask;
      c.dtype = dtype;
      c.dropout = 0.1;
      c.len = 3;
      c.d_model = 4;
      c.batch = 2;
      c.seed = 3;
      for (const char* name : {"sdpa", "mha", "seed_mha", "encoder_layer", "decoder_layer", "causal_lm", "transformer"}) {
        const checks::CheckResult r = checks::run_checks(name, c).front();
        EXPECT_TRUE(r.result.passed) << name << " mask=" << mask << " " << dtype_name(dtype) << ": " << r.result.message;
        EXPECT_NE(r.configuration.find("dropout=0.1"), std::string::npos) << r.configuration;
      }
    }
  }
}

TEST(GradcheckSuite, ImpossibleTolerancesFail) {
  GradcheckOptions o = checks::tolerances(kFloat64);
  o.atol = 1e-300;
  o.rtol = 1e-300;
  const checks::CheckResult r = checks::run_checks("exp", {}, o).front();
  EXPECT_FALSE(r.result.passed);
  EXPECT_GT(r.max_abs_error, 0);
}

}  // namespace
}  // namespace attograd
