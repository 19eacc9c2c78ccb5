// The recipe options of CausalLM (ArchitectureSpec, nn/sequence_model.h) against a float64 PyTorch reference written
// from nanoGPT's model.py (tests/nn/golden_recipe.py): logits, the next-token cross-entropy and the gradient of every
// parameter, to 1e-12 of each tensor's scale. Cases: `--recipe nanogpt`'s architecture (learned positions, GELU, no
// bias, LayerNorm eps 1e-5, no embedding scale, tied head, GPT-2 init), LLaMA's pieces (RMSNorm, SwiGLU, RoPE, no
// bias, no embedding scale) and the rest (GELU-tanh, biases, no positions, sqrt(D) scale, untied head).

#include <algorithm>
#include <cmath>

#include "autograd/loss.h"
#include "autograd/shape.h"
#include "nn/models.h"
#include "nn_golden.h"
#include "recipe_cases.h"
#include "testing.h"

using namespace attograd;
using namespace attograd::testing;
using namespace attograd::nn;

namespace {

// Every element within 1e-12 * (1 + max |expected|) + 1e-12 |expected|: float64 agreement up to the summation order
// of the two implementations (their differences are ~1e-15 of the tensor's scale).
::testing::AssertionResult near_double(const Tensor& actual, const Tensor& expected) {
  double scale = 0;
  for (double v : expected.to_vector<double>()) scale = std::max(scale, std::fabs(v));
  return all_close(actual, expected, 1e-12 * (1.0 + scale), 1e-12);
}


ArchitectureSpec gelu_tanh_untied() {
  return {.positions = "none", .activation = "gelu-tanh", .norm_eps = 1e-5, .embed_scale = "sqrt", .head = "untied"};
}

void check_case(const std::string& name, const ArchitectureSpec& arch) {
  SCOPED_TRACE(name);
  Golden g = load_golden("nn/recipe_" + name + ".golden");
  const std::vector<int64_t> c = g.at("config").to_vector<int64_t>();  // [V, D, H, F, layers, max_len]
  const std::unique_ptr<CausalLM> model = golden_lm(g, arch, kFloat64);
  CausalLM& lm = *model;
  const std::vector<GoldenParam> gp = golden_params(g);
  expect_names_and_load(lm, gp);  // attograd's names, order and shapes are the golden's
  if (::testing::Test::HasFatalFailure()) return;
  const Tensor tokens = g.at("tokens"), targets = g.at("targets");  // (B, L) Int64
  const int64_t V = c[0];
  Tensor logits = lm.forward(tokens);  // (B, L, V)
  EXPECT_TRUE(near_double(logits, g.at("logits")));
  Tensor loss = cross_entropy(reshape(logits, {-1, V}), reshape(targets, {-1}));
  EXPECT_TRUE(near_double(loss, g.at("loss")));
  loss.backward();
  for (const GoldenParam& p : gp) {
    Tensor grad = lm.parameter(p.name).grad();
    ASSERT_TRUE(grad.defined()) << p.name;
    EXPECT_TRUE(near_double(grad, g.at("grad." + std::to_string(p.index) + "." + p.name))) << p.name;
  }
}

}  // namespace

TEST(RecipeGolden, NanoGPTMatchesPyTorch) {
  check_case("nanogpt", golden_nanogpt_spec());
  // The learned table's rows past the sequence (L = 5 of max_len 8) get exactly zero gradient, the others not.
  Golden g = load_golden("nn/recipe_nanogpt.golden");
  ASSERT_EQ(g.count("grad.1.pos_embed.weight"), 1u);
  const Tensor gpos = g.at("grad.1.pos_embed.weight");  // (8, D)
  for (int64_t l = 0; l < gpos.size(0); ++l) {
    double s = 0;
    for (int64_t k = 0; k < gpos.size(1); ++k) s += std::fabs(gpos.at({l, k}));
    if (l < 5)
      EXPECT_GT(s, 0) << l;
    else
      EXPECT_EQ(s, 0) << l;
  }
}

TEST(RecipeGolden, RMSNormSwiGLURoPENoBiasMatchesPyTorch) { check_case("llama", golden_llama_spec()); }

TEST(RecipeGolden, GeluTanhBiasNoPositionsUntiedHeadMatchesPyTorch) {
  check_case("gelu_tanh_untied", gelu_tanh_untied());
}

// The same models built through ModelSpec (what `attograd train` does) take the same parameters.
TEST(RecipeGolden, ModelSpecBuildsTheSameParameters) {
  for (const auto& [name, arch] : {std::pair{std::string("nanogpt"), golden_nanogpt_spec()},
                                   {std::string("llama"), golden_llama_spec()},
                                   {std::string("gelu_tanh_untied"), gelu_tanh_untied()}}) {
    SCOPED_TRACE(name);
    Golden g = load_golden("nn/recipe_" + name + ".golden");
    const std::vector<int64_t> c = g.at("config").to_vector<int64_t>();
    ModelSpec s{.vocab = c[0],
                .layers = c[4],
                .d_model = c[1],
                .heads = c[2],
                .d_ff = c[3],
                .max_source_len = 3,
                .max_target_len = c[5] - 3,
                .architecture = arch};
    Generator gen(6);
    std::shared_ptr<SequenceModel> m = CausalLM::build(s, gen);
    auto* lm = dynamic_cast<CausalLM*>(m.get());
    ASSERT_NE(lm, nullptr);
    EXPECT_EQ(lm->options.architecture, arch);
    std::vector<std::string> theirs;
    for (const GoldenParam& p : golden_params(g)) theirs.push_back(p.name);
    EXPECT_EQ(names_of(*lm), theirs);
  }
}
