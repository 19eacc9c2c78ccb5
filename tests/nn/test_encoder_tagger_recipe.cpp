// The recipe options (ArchitectureSpec, issue 22) in the encoder-only EncoderTagger: parameters follow the options,
// a double-precision gradcheck of every option at once and of each alone, the nanoGPT recipe's conventions, GPT-2's
// init statistics, and the default model unchanged (its PyTorch golden is in test_encoder_tagger.cpp).

#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "autograd/gradcheck.h"
#include "autograd/matmul.h"
#include "autograd/reduce.h"
#include "autograd/shape.h"
#include "nn/encoder_tagger.h"
#include "nn/mla.h"
#include "testing.h"

using namespace attograd;
using namespace attograd::testing;
using namespace attograd::nn;

namespace {

EncoderTaggerOptions tiny(ArchitectureSpec a, Dtype dtype = kFloat64) {
  return {.vocab = 7, .d_model = 8, .n_head = 2, .d_ff = 12, .n_layers = 2, .dropout = 0.0, .max_len = 6,
          .dtype = dtype, .architecture = std::move(a)};
}

std::vector<std::string> names(const Module& m) {
  std::vector<std::string> out;
  for (const auto& [n, p] : m.named_parameters()) out.push_back(n);
  return out;
}

bool has(const std::vector<std::string>& v, const std::string& s) { return std::find(v.begin(), v.end(), s) != v.end(); }

void expect_gradcheck(const ArchitectureSpec& a) {
  Generator gen(4);
  EncoderTagger m(tiny(a), gen);
  const Tensor tokens = from_vector<int64_t>({5, 6, 4, 3, 0, 6, 6, 5, 4, 3}, {2, 5});
  const GradcheckResult r = gradcheck(
      [&](const std::vector<Tensor>&) {
        const Tensor out = m.forward(tokens);  // (2, 5, 7)
        return sum(out * out * 0.1 + out);
      },
      m.parameters());
  EXPECT_TRUE(r.passed) << a.to_json() << ": " << r.message;
}

}  // namespace

TEST(EncoderTaggerRecipe, ParametersFollowTheOptions) {
  Generator gen(1);
  EncoderTagger m(tiny({.positions = "learned", .activation = "swiglu", .norm = "rmsnorm", .bias = false,
                        .head = "tied"}),
                  gen);
  const std::vector<std::string> n = names(m);
  EXPECT_TRUE(has(n, "pos_embed.weight"));
  EXPECT_EQ(m.parameter("pos_embed.weight").shape(), Shape({6, 8}));
  EXPECT_TRUE(has(n, "layers.0.linear3.weight"));
  EXPECT_EQ(m.parameter("layers.1.linear3.weight").shape(), Shape({12, 8}));
  EXPECT_FALSE(has(n, "head.weight"));
  for (const std::string& s : n) EXPECT_EQ(s.find("bias"), std::string::npos) << s;
  EXPECT_NE(std::dynamic_pointer_cast<RMSNorm>(m.norm), nullptr);
  EXPECT_NE(std::dynamic_pointer_cast<RMSNorm>(m.layers->at<TransformerEncoderLayer>(0)->norm1), nullptr);
  EXPECT_EQ(m.named_buffers().size(), 0u);  // no sinusoidal table
  EXPECT_EQ(m.pos, nullptr);
  ASSERT_NE(m.dropout, nullptr);
  // The tied head: logits = norm(x) embed.weight^T, so the embedding gets the head's gradient too.
  const Tensor tokens = from_vector<int64_t>({5, 6, 4, 3}, {1, 4});
  EXPECT_EQ(m.forward(tokens).shape(), Shape({1, 4, 7}));
}

TEST(EncoderTaggerRecipe, DefaultsKeepTheTextbookModel) {
  Generator a(3), b(3);
  EncoderTagger plain({.vocab = 7, .d_model = 8, .n_head = 2, .d_ff = 12, .n_layers = 2, .max_len = 6}, a);
  EncoderTagger spelled(tiny({}, kFloat32), b);
  EXPECT_EQ(names(plain), names(spelled));
  EXPECT_TRUE(has(names(plain), "head.bias"));
  EXPECT_DOUBLE_EQ(std::dynamic_pointer_cast<LayerNorm>(plain.norm)->eps, 1e-5);
  EXPECT_DOUBLE_EQ(std::dynamic_pointer_cast<LayerNorm>(plain.layers->at<TransformerEncoderLayer>(1)->norm2)->eps, 1e-5);
  // An explicit eps reaches every norm.
  Generator c(3);
  EncoderTagger eps(tiny({.norm_eps = 1e-3}, kFloat32), c);
  EXPECT_DOUBLE_EQ(std::dynamic_pointer_cast<LayerNorm>(eps.norm)->eps, 1e-3);
  EXPECT_DOUBLE_EQ(std::dynamic_pointer_cast<LayerNorm>(eps.layers->at<TransformerEncoderLayer>(0)->norm1)->eps, 1e-3);
}

TEST(EncoderTaggerRecipe, GradcheckInDoubleForEveryOption) {
  expect_gradcheck({.positions = "learned"});
  expect_gradcheck({.positions = "none", .embed_scale = "none"});
  expect_gradcheck({.activation = "gelu"});
  expect_gradcheck({.activation = "gelu-tanh"});
  expect_gradcheck({.activation = "swiglu"});
  expect_gradcheck({.norm = "rmsnorm", .norm_eps = 1e-3});
  expect_gradcheck({.bias = false});
  expect_gradcheck({.head = "tied"});
  expect_gradcheck({.positions = "learned", .activation = "gelu", .norm_eps = 1e-5, .bias = false,
                    .embed_scale = "none", .init = "gpt2", .head = "tied", .recipe = "nanogpt"});
}

TEST(EncoderTaggerRecipe, Gpt2InitStatistics) {
  Generator gen(7);
  EncoderTagger m({.vocab = 64, .d_model = 256, .n_head = 4, .d_ff = 512, .n_layers = 4, .max_len = 64,
                   .architecture = {.init = "gpt2"}},
                  gen);
  auto stddev = [](const Tensor& t) {
    const std::vector<float> v = t.to_vector<float>();
    double s = 0, s2 = 0;
    for (float x : v) s += x, s2 += static_cast<double>(x) * x;
    const double n = static_cast<double>(v.size()), mean = s / n;
    return std::sqrt(s2 / n - mean * mean);
  };
  // 16k+ samples each: the sample std is within 2% of the true one with overwhelming probability.
  EXPECT_NEAR(stddev(m.parameter("embed.weight")), 0.02, 0.02 * 0.03);
  EXPECT_NEAR(stddev(m.parameter("layers.0.linear1.weight")), 0.02, 0.02 * 0.03);
  EXPECT_NEAR(stddev(m.parameter("layers.0.self_attn.in_proj_weight")), 0.02, 0.02 * 0.03);
  const double residual = 0.02 / std::sqrt(8.0);
  EXPECT_NEAR(stddev(m.parameter("layers.3.self_attn.out_proj.weight")), residual, residual * 0.03);
  EXPECT_NEAR(stddev(m.parameter("layers.2.linear2.weight")), residual, residual * 0.03);
  for (const auto& [n, p] : m.named_parameters()) {
    if (n.size() >= 4 && n.compare(n.size() - 4, 4, "bias") == 0) {
      for (float x : p.to_vector<float>()) ASSERT_EQ(x, 0.0f) << n;
    }
  }
  for (float x : m.parameter("norm.weight").to_vector<float>()) ASSERT_EQ(x, 1.0f);
}

TEST(EncoderTaggerRecipe, ModelSpecCarriesTheArchitecture) {
  ModelSpec s{.vocab = 9, .layers = 1, .d_model = 8, .heads = 2, .d_ff = 16, .max_source_len = 5,
              .max_target_len = 5, .aligned = true};
  s.architecture = {.positions = "learned", .activation = "gelu-tanh", .init = "gpt2"};
  auto m = make_model("encoder", s);
  EXPECT_EQ(m->spec().architecture, s.architecture);
  EXPECT_EQ(ModelSpec::from_json(m->spec().to_json()), s);
  EXPECT_NO_THROW(m->parameter("pos_embed.weight"));
  s.architecture = {.positions = "rope"};
  EXPECT_ATTO_ERROR(make_model("encoder", s), "positions 'rope'");
  s.architecture = {.activation = "tanh"};
  EXPECT_ATTO_ERROR(make_model("encoder", s), "activation must be one of relu, gelu, gelu-tanh, swiglu, got 'tanh'");
}
