// train/gradcheck_suite: the registry behind `attograd gradcheck`.

#include <filesystem>
#include <fstream>
#include <regex>
#include <set>
#include <tuple>

#include "testing.h"
#include "train/tools/gradcheck_suite.h"

namespace attograd {
namespace {

// The ops' and the modules' names, in the registry's order: ops first (snake_case), then modules (PascalCase).
TEST(GradcheckSuite, RegistryListsEveryOpAndModuleOnce) {
  const std::vector<std::string> ops = {"add",
                                        "sub",
                                        "mul",
                                        "div",
                                        "broadcast_to",
                                        "sum_to",
                                        "exp",
                                        "log",
                                        "sqrt",
                                        "pow",
                                        "tanh",
                                        "sigmoid",
                                        "relu",
                                        "gelu",
                                        "abs",
                                        "neg",
                                        "rdiv",
                                        "matmul",
                                        "linear",
                                        "transpose",
                                        "reshape",
                                        "view",
                                        "flatten",
                                        "unsqueeze",
                                        "squeeze",
                                        "permute",
                                        "slice",
                                        "narrow",
                                        "select",
                                        "cat",
                                        "stack",
                                        "split",
                                        "chunk",
                                        "sum",
                                        "mean",
                                        "max",
                                        "softmax",
                                        "log_softmax",
                                        "masked_fill",
                                        "where",
                                        "dropout",
                                        "relu_dropout",
                                        "dropout_add",
                                        "embedding",
                                        "layer_norm",
                                        "cross_entropy",
                                        "mse_loss",
                                        "scaled_dot_product_attention",
                                        "multi_head_attention",
                                        "packed_self_attention",
                                        "scaled_dot_product_attention.gqa",
                                        "scaled_dot_product_attention.window",
                                        "scaled_dot_product_attention.block_sparse",
                                        "scaled_dot_product_attention.flex",
                                        "scaled_dot_product_attention.entropy",
                                        "apply_rotary_emb",
                                        "linear_attention",
                                        "checkpoint"};
  const std::vector<std::string> modules = {"Linear",
                                            "Embedding",
                                            "LayerNorm",
                                            "LayerNorm.no_bias",
                                            "RMSNorm",
                                            "Dropout",
                                            "PositionwiseFeedForward",
                                            "PositionwiseFeedForward.gelu_tanh",
                                            "PositionwiseFeedForward.swiglu",
                                            "MultiheadAttention",
                                            "MultiheadAttention.variants",
                                            "MultiheadAttention.rope",
                                            "seed::AttentionSublayer",
                                            "TransformerEncoderLayer",
                                            "TransformerDecoderLayer",
                                            "CausalLM",
                                            "CausalLM.gqa_rope",
                                            "CausalLM.local",
                                            "CausalLM.block_sparse",
                                            "CausalLM.checkpoint",
                                            "CausalLM.learned_positions",
                                            "CausalLM.rope_positions",
                                            "CausalLM.no_positions",
                                            "CausalLM.gelu_tanh",
                                            "CausalLM.swiglu",
                                            "CausalLM.rmsnorm",
                                            "CausalLM.no_bias",
                                            "CausalLM.embed_scale_none",
                                            "CausalLM.untied_head",
                                            "CausalLM.nanogpt",
                                            "CausalLM.llama",
                                            "EncoderTagger",
                                            "seed::Transformer",
                                            "seed::Transformer.variants",
                                            "RotaryEmbedding",
                                            "LinearAttention",
                                            "Checkpointed",
                                            "MultiHeadLatentAttention",
                                            "CausalLM.mla",
                                            "CausalLM.mla_rope",
                                            "CausalLM.linear",
                                            "CausalLM.alibi",
                                            "CausalLM.softcap",
                                            "CausalLM.prefix_lm",
                                            "CausalLM.document"};
  std::vector<std::string> names, kinds;
  for (const checks::Check& c : checks::registry()) names.push_back(c.name), kinds.push_back(c.kind);
  std::vector<std::string> expected = ops;
  expected.insert(expected.end(), modules.begin(), modules.end());
  EXPECT_EQ(names, expected);
  for (size_t i = 0; i < names.size(); ++i) EXPECT_EQ(kinds[i], i < ops.size() ? "op" : "module") << names[i];
  EXPECT_EQ(std::set<std::string>(names.begin(), names.end()).size(), names.size());
}

// The names of the functions returning a Tensor (or a vector of them, MaxResult, AttentionResult) declared at
// namespace scope in the autograd headers of the source tree: a line that starts with the return type (the
// project does not indent namespaces; methods and detail helpers are indented or return other types).
std::set<std::string> declared_tensor_functions(std::vector<std::string>* headers) {
  const std::filesystem::path dir = std::filesystem::path(testing::data_path("")) / ".." / ".." / "autograd";
  const std::regex decl(R"(^(?:Tensor|std::vector<Tensor>|MaxResult|AttentionResult)\s+([a-z_][a-z0-9_]*)\()");
  std::set<std::string> names;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    if (entry.path().extension() != ".h") continue;
    headers->push_back(entry.path().filename().string());
    std::ifstream in(entry.path());
    std::string line;
    std::smatch m;
    while (std::getline(in, line))
      if (std::regex_search(line, m, decl)) names.insert(m[1]);
  }
  return names;
}

// Every op of the autograd headers has a registry entry, or is listed in unchecked_ops() with a reason; no
// entry or exemption names a function that no longer exists.
TEST(GradcheckSuite, EveryOpOfTheAutogradHeadersHasAnEntry) {
  std::vector<std::string> headers;
  const std::set<std::string> declared = declared_tensor_functions(&headers);
  ASSERT_GE(headers.size(), 10u) << "autograd headers not found under " << testing::data_path("../../autograd");
  // The scan sees the ops of every family (a sample of them: a broken scan must not pass vacuously).
  for (const char* op : {"add", "exp", "matmul", "softmax", "cross_entropy", "split", "max", "embedding",
                         "scaled_dot_product_attention", "dropout", "zeros"})
    EXPECT_TRUE(declared.count(op)) << op;
  std::set<std::string> checked, unchecked;
  // An entry "op.variant" checks an option of op (the attention variants).
  for (const checks::Check& c : checks::registry())
    if (c.kind == "op") checked.insert(c.name.substr(0, c.name.find('.')));
  for (const checks::UncheckedOp& u : checks::unchecked_ops()) {
    EXPECT_FALSE(u.reason.empty()) << u.name;
    EXPECT_TRUE(unchecked.insert(u.name).second) << u.name << " is listed twice";
    EXPECT_FALSE(checked.count(u.name)) << u.name << " has an entry and is listed as unchecked";
  }
  for (const std::string& name : declared)
    EXPECT_TRUE(checked.count(name) || unchecked.count(name))
        << name << " is declared in autograd/ but has no gradcheck entry: add one in build_registry() "
        << "(train/tools/gradcheck_suite.cpp), or list it in unchecked_ops() with the reason";
  for (const std::string& name : checked)
    EXPECT_TRUE(declared.count(name)) << name << ": no such function in autograd/";
  for (const std::string& name : unchecked)
    EXPECT_TRUE(declared.count(name)) << name << ": no such function in autograd/";
}

TEST(GradcheckSuite, FindsNamesAndAliases) {
  EXPECT_EQ(checks::find_check("mha").name, "MultiheadAttention");
  EXPECT_EQ(checks::find_check("seed_mha").name, "seed::AttentionSublayer");
  EXPECT_EQ(checks::find_check("attention_sublayer").name, "seed::AttentionSublayer");
  EXPECT_EQ(checks::find_check("multiheadattention").name, "MultiheadAttention");  // no longer ambiguous
  EXPECT_EQ(checks::find_check("transformer").name, "seed::Transformer");
  EXPECT_EQ(checks::find_check("seed::transformer").name, "seed::Transformer");
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

// One test per registry entry and precision, named after the entry (Registry/GradcheckEntry.Passes/softmax_float64),
// at the default configuration and tolerances(dtype): gradcheck() passes (every Jacobian entry within tolerance, two
// backward passes bitwise equal), the reported errors agree, and the check is not vacuous (a derivative is nonzero).
class GradcheckEntry : public ::testing::TestWithParam<std::tuple<std::string, Dtype>> {};

TEST_P(GradcheckEntry, Passes) {
  const auto& [name, dtype] = GetParam();
  checks::CheckConfig config;
  config.dtype = dtype;
  const GradcheckOptions o = checks::tolerances(dtype);
  const std::vector<checks::CheckResult> results = checks::run_checks(name, config);
  ASSERT_EQ(results.size(), 1u);
  const checks::CheckResult& r = results.front();
  EXPECT_EQ(r.name, name);
  EXPECT_TRUE(r.result.passed) << r.result.message;
  EXPECT_TRUE(r.result.reentrant) << r.result.message;
  EXPECT_GT(r.result.checked, 0);
  EXPECT_FALSE(r.configuration.empty());
  // Every entry is within atol + rtol |numeric| (gradcheck's criterion), so the largest error is too.
  EXPECT_LE(r.max_abs_error, o.atol + o.rtol * r.max_abs_derivative) << r.configuration;
  if (dtype == kFloat64) {
    // In double the errors are far inside the bounds, absolute and relative. (In float32 the relative error of a
    // derivative of order atol is rounding noise of eps 1e-3 differences; only gradcheck's bound applies there.)
    EXPECT_LT(r.max_abs_error, o.atol) << r.configuration;
    EXPECT_LT(r.max_rel_error, o.rtol) << r.configuration;
  }
  EXPECT_GT(r.max_abs_derivative, o.atol) << r.configuration << ": every derivative is ~0, the check proves nothing";
}

std::vector<std::string> registry_names() {
  std::vector<std::string> names;
  for (const checks::Check& c : checks::registry()) names.push_back(c.name);
  return names;
}

INSTANTIATE_TEST_SUITE_P(Registry, GradcheckEntry,
                         ::testing::Combine(::testing::ValuesIn(registry_names()),
                                            ::testing::Values(kFloat64, kFloat32)),
                         [](const ::testing::TestParamInfo<GradcheckEntry::ParamType>& info) {
                           // A test name is alphanumeric: "seed::Transformer" -> "seed_Transformer",
                           // "scaled_dot_product_attention.window" -> "scaled_dot_product_attention_window".
                           std::string name = std::get<0>(info.param);
                           for (size_t at; (at = name.find("::")) != std::string::npos;) name.replace(at, 2, "_");
                           for (char& ch : name)
                             if (ch == '.') ch = '_';
                           return name + "_" + dtype_name(std::get<1>(info.param));
                         });

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
      for (const char* name :
           {"sdpa", "mha", "seed_mha", "encoder_layer", "decoder_layer", "causal_lm", "transformer", "CausalLM.mla",
            "CausalLM.mla_rope", "CausalLM.linear", "CausalLM.alibi", "CausalLM.softcap", "CausalLM.prefix_lm",
            "CausalLM.document"}) {
        const checks::CheckResult r = checks::run_checks(name, c).front();
        EXPECT_TRUE(r.result.passed) << name << " mask=" << mask << " " << dtype_name(dtype) << ": "
                                     << r.result.message;
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
