// ModelSpec::architecture (ArchitectureSpec, nn/sequence_model.h): its JSON (nested, only when not the default, every
// field round-trips, errors name the field), validate(), differences(), the CausalLM each option builds (parameter
// names and shapes), GPT-2's init statistics, and the seq2seq kind refusing the options (the encoder takes them). The values the
// options compute are checked against PyTorch in tests/nn/test_recipe_golden.cpp.

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "nn/attention.h"
#include "nn/encoder_tagger.h"
#include "nn/layers.h"
#include "nn/mla.h"
#include "nn/models.h"
#include "testing.h"

// After the nn headers, which they use.
#include "decode_testing.h"
#include "nn_golden.h"

using namespace attograd;
using namespace attograd::nn;
using namespace attograd::testing;

namespace {

ModelSpec lm_spec(ArchitectureSpec a = {}) {
  return {.vocab = 11,
          .layers = 2,
          .d_model = 8,
          .heads = 2,
          .d_ff = 16,
          .max_source_len = 3,
          .max_target_len = 4,
          .architecture = std::move(a)};
}

// Every field away from its default.
ArchitectureSpec every_field() {
  return {.positions = "learned",
          .activation = "gelu-tanh",
          .norm = "rmsnorm",
          .norm_eps = 2.5e-5,
          .bias = false,
          .embed_scale = "none",
          .init = "gpt2",
          .head = "untied",
          .recipe = "mine"};
}

CausalLMOptions lm_options(ArchitectureSpec a) {
  return {
      .vocab = 11, .d_model = 8, .n_head = 2, .d_ff = 16, .n_layers = 2, .max_len = 6, .architecture = std::move(a)};
}

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// The sample mean and standard deviation of the values of some tensors.
std::pair<double, double> mean_std(const std::vector<Tensor>& ts, int64_t* count = nullptr) {
  double s = 0, s2 = 0;
  int64_t n = 0;
  for (const Tensor& t : ts)
    for (double v : t.to_vector<double>()) s += v, s2 += v * v, ++n;
  if (count) *count = n;
  const double m = s / static_cast<double>(n);
  return {m, std::sqrt(s2 / static_cast<double>(n) - m * m)};
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// JSON

TEST(ArchitectureSpec, DefaultSpecJsonHasNoArchitectureKeyAndKeepsTheOldBytes) {
  const ModelSpec plain = lm_spec();
  const std::string j = plain.to_json();
  EXPECT_EQ(j.find("architecture"), std::string::npos) << j;
  // The bytes an older attograd wrote for this spec (before ArchitectureSpec existed): unchanged.
  EXPECT_EQ(
      j, R"({"vocab":11,"layers":2,"d_model":8,"heads":2,"d_ff":16,"dropout":0.0,"max_source_len":3,)"
         R"("max_target_len":4,"aligned":false,"pad":0,"bos":1,"eos":2,"sep":3,"ignore_index":-100,"stream":false})");
  EXPECT_EQ(ModelSpec::from_json(j), plain);
  // A recipe name alone is not a default spec: it is written (and read back).
  ArchitectureSpec named;
  named.recipe = "plain";
  EXPECT_NE(lm_spec(named).to_json().find(R"("architecture":{)"), std::string::npos);
  EXPECT_EQ(ModelSpec::from_json(lm_spec(named).to_json()).architecture, named);
}

TEST(ArchitectureSpec, JsonRoundTripsEveryField) {
  const ModelSpec s = lm_spec(every_field());
  const std::string j = s.to_json();
  // The last key, fields in declaration order.
  EXPECT_NE(j.find(R"("stream":false,"architecture":{"positions":"learned","activation":"gelu-tanh","norm":"rmsnorm",)"
                   R"("norm_eps":2.5e-05,"bias":false,"embed_scale":"none","init":"gpt2","head":"untied",)"
                   R"("recipe":"mine"}})"),
            std::string::npos)
      << j;
  EXPECT_EQ(ModelSpec::from_json(j), s);
  EXPECT_NE(j.find(R"("architecture":)" + every_field().to_json()), std::string::npos);  // ArchitectureSpec::to_json
  // Each field alone round-trips (and only it differs from the default).
  const ArchitectureSpec d{};
  std::vector<ArchitectureSpec> one_each(9, d);
  one_each[0].positions = "rope";
  one_each[1].activation = "swiglu";
  one_each[2].norm = "rmsnorm";
  one_each[3].norm_eps = 1e-5;
  one_each[4].bias = false;
  one_each[5].embed_scale = "none";
  one_each[6].init = "gpt2";
  one_each[7].head = "tied";
  one_each[8].recipe = "nanogpt";
  for (const ArchitectureSpec& a : one_each) {
    EXPECT_NE(a, d);
    EXPECT_EQ(ModelSpec::from_json(lm_spec(a).to_json()).architecture, a) << a.to_json();
  }
  // A partial object keeps the other fields' defaults (what a hand-written spec gives).
  EXPECT_EQ(ModelSpec::from_json(R"({"vocab": 5, "architecture": {"norm": "rmsnorm"}})").architecture,
            (ArchitectureSpec{.norm = "rmsnorm"}));
}

TEST(ArchitectureSpec, JsonErrorsNameTheField) {
  EXPECT_ATTO_ERROR(ModelSpec::from_json(R"({"architecture": {"colour": "red"}})"),
                    "unknown field \"architecture.colour\"");
  EXPECT_ATTO_ERROR(ModelSpec::from_json(R"({"architecture": 3})"), "field \"architecture\" must be an object");
  EXPECT_ATTO_ERROR(ModelSpec::from_json(R"({"architecture": {"positions": 1}})"),
                    "field \"architecture.positions\" must be a string");
  EXPECT_ATTO_ERROR(ModelSpec::from_json(R"({"architecture": {"activation": null}})"),
                    "field \"architecture.activation\" must be a string");
  EXPECT_ATTO_ERROR(ModelSpec::from_json(R"({"architecture": {"norm": ["rmsnorm"]}})"),
                    "field \"architecture.norm\" must be a string");
  EXPECT_ATTO_ERROR(ModelSpec::from_json(R"({"architecture": {"norm_eps": "1e-5"}})"),
                    "field \"architecture.norm_eps\" must be a number");
  EXPECT_ATTO_ERROR(ModelSpec::from_json(R"({"architecture": {"bias": 0}})"),
                    "field \"architecture.bias\" must be true or false");
  EXPECT_ATTO_ERROR(ModelSpec::from_json(R"({"architecture": {"embed_scale": 1.0}})"),
                    "field \"architecture.embed_scale\" must be a string");
  EXPECT_ATTO_ERROR(ModelSpec::from_json(R"({"architecture": {"init": false}})"),
                    "field \"architecture.init\" must be a string");
  EXPECT_ATTO_ERROR(ModelSpec::from_json(R"({"architecture": {"head": {}}})"),
                    "field \"architecture.head\" must be a string");
  EXPECT_ATTO_ERROR(ModelSpec::from_json(R"({"architecture": {"recipe": 7}})"),
                    "field \"architecture.recipe\" must be a string");
  // A bad value parses (the JSON is well formed) and the model refuses it, naming the field and the value.
  const ModelSpec bad = ModelSpec::from_json(
      R"({"vocab": 11, "d_model": 8, "heads": 2, "d_ff": 16, "max_source_len": 3, "max_target_len": 3,)"
      R"( "architecture": {"norm": "batchnorm"}})");
  EXPECT_ATTO_ERROR(make_model("lm", bad), "norm must be one of layernorm, rmsnorm, got 'batchnorm'");
}

// ---------------------------------------------------------------------------------------------
// validate() and differences()

TEST(ArchitectureSpec, ValidateNamesTheFieldAndTheValue) {
  ArchitectureSpec{}.validate();
  every_field().validate();
  for (const char* p : {"sinusoidal", "learned", "rope", "none"}) ArchitectureSpec{.positions = p}.validate();
  for (const char* a : {"relu", "gelu", "gelu-tanh", "swiglu"}) ArchitectureSpec{.activation = a}.validate();
  EXPECT_ATTO_ERROR((ArchitectureSpec{.positions = "alibi"}.validate()),
                    "positions must be one of sinusoidal, learned, rope, none, got 'alibi'");
  EXPECT_ATTO_ERROR((ArchitectureSpec{.activation = "silu"}.validate()),
                    "activation must be one of relu, gelu, gelu-tanh, swiglu, got 'silu'");
  EXPECT_ATTO_ERROR((ArchitectureSpec{.norm = "LayerNorm"}.validate()),
                    "norm must be one of layernorm, rmsnorm, got 'LayerNorm'");
  EXPECT_ATTO_ERROR((ArchitectureSpec{.embed_scale = "sqrt(d)"}.validate()),
                    "embed_scale must be one of sqrt, none, got 'sqrt(d)'");
  EXPECT_ATTO_ERROR((ArchitectureSpec{.init = "xavier"}.validate()), "init must be one of default, gpt2, got 'xavier'");
  EXPECT_ATTO_ERROR((ArchitectureSpec{.head = "shared"}.validate()),
                    "head must be one of default, tied, untied, got 'shared'");
  ArchitectureSpec{.norm_eps = 0}.validate();  // 0, the default: the model kind's own eps
  EXPECT_ATTO_ERROR((ArchitectureSpec{.norm_eps = -1e-5}.validate()), "norm_eps must be finite and positive (or 0: the "
                                                                      "model kind's own), got -1e-05");
  EXPECT_ATTO_ERROR((ArchitectureSpec{.norm_eps = -1e-5}.validate()), "norm_eps must be finite and positive");
  EXPECT_ATTO_ERROR((ArchitectureSpec{.norm_eps = std::nan("")}.validate()), "norm_eps must be finite and positive");
  EXPECT_ATTO_ERROR((ArchitectureSpec{.norm_eps = INFINITY}.validate()), "norm_eps must be finite and positive");
  // The model validates before building.
  EXPECT_ATTO_ERROR(CausalLM(lm_options({.head = "shared"})), "head must be one of");
}

TEST(ArchitectureSpec, DifferencesListTheChangedOptionsInOrderWithoutTheRecipe) {
  EXPECT_TRUE(ArchitectureSpec{}.differences().empty());
  EXPECT_TRUE((ArchitectureSpec{.recipe = "nanogpt"}.differences().empty()));
  EXPECT_EQ(every_field().differences(),
            (std::vector<std::string>{"positions=learned", "activation=gelu-tanh", "norm=rmsnorm", "norm_eps=2.5e-05",
                                      "bias=false", "embed_scale=none", "init=gpt2", "head=untied"}));
  EXPECT_EQ((ArchitectureSpec{.norm_eps = 1e-5, .head = "tied"}.differences()),
            (std::vector<std::string>{"norm_eps=1e-05", "head=tied"}));
}

// ---------------------------------------------------------------------------------------------
// What each option builds

TEST(ArchitectureSpec, LearnedPositionsAreAParameterAndNoBuffer) {
  Generator gen(1);
  CausalLM lm(lm_options({.positions = "learned"}), gen);
  const std::vector<std::string> names = names_of(lm);
  ASSERT_GE(names.size(), 2u);
  EXPECT_EQ(names[0], "embed.weight");
  EXPECT_EQ(names[1], "pos_embed.weight");
  EXPECT_EQ(lm.parameter("pos_embed.weight").shape(), Shape({6, 8}));  // (max_len, D)
  EXPECT_TRUE(lm.named_buffers().empty());
  EXPECT_FALSE(lm.pe.defined());
  ASSERT_NE(lm.pos_embed, nullptr);
  // Default init N(0, 1/D), as the token embedding.
  CausalLM plain(lm_options({}), gen);
  EXPECT_EQ(lm.num_parameters(), plain.num_parameters() + 6 * 8);
  // The table's gradient: rows of positions the batch reaches, none beyond.
  Tensor logits = lm.forward(tokens_of({1, 2, 3, 4, 5, 6, 7, 8}, 2, 4));  // (2, 4, V)
  mean(logits * logits).backward();
  const Tensor g = lm.parameter("pos_embed.weight").grad();  // (6, 8)
  ASSERT_TRUE(g.defined());
  for (int64_t l = 0; l < 6; ++l) {
    double s = 0;
    for (int64_t k = 0; k < 8; ++k) s += std::fabs(g.at({l, k}));
    if (l < 4)
      EXPECT_GT(s, 0) << l;
    else
      EXPECT_EQ(s, 0) << l;
  }
}

TEST(ArchitectureSpec, RopeAndNoPositionsHaveNoTable) {
  Generator gen(2);
  CausalLM rope(lm_options({.positions = "rope"}), gen);
  EXPECT_TRUE(rope.named_buffers().empty());
  EXPECT_EQ(rope.pos_embed, nullptr);
  ASSERT_NE(rope.block(0)->attention<MultiheadAttention>(), nullptr);
  EXPECT_TRUE(rope.block(0)->attention<MultiheadAttention>()->options().rope);
  EXPECT_EQ(names_of(rope), names_of(CausalLM(lm_options({}), gen)));  // the same parameters as the default
  CausalLM none(lm_options({.positions = "none"}), gen);
  EXPECT_TRUE(none.named_buffers().empty());
  EXPECT_EQ(none.pos_embed, nullptr);
  EXPECT_FALSE(none.block(0)->attention<MultiheadAttention>()->options().rope);
  // Without positions a repeated token is the same at every position (causal attention over equal keys and values
  // returns that value; RoPE too: it rotates queries and keys, not the values); with learned positions it is not.
  NoGradGuard no_grad;
  auto spread = [](CausalLM& m) {
    m.eval();                                                  // no dropout
    const Tensor out = m.forward(tokens_of({9, 9, 9}, 1, 3));  // (1, 3, V)
    double most = 0;
    for (int64_t l = 1; l < 3; ++l)
      for (int64_t v = 0; v < 11; ++v) most = std::max(most, std::fabs(out.at({0, l, v}) - out.at({0, 0, v})));
    return most;
  };
  EXPECT_LT(spread(none), 1e-5);
  CausalLM learned(lm_options({.positions = "learned"}), gen);
  EXPECT_GT(spread(learned), 1e-3);
  // Positions rope with an attention that has no RoPE, and attention.rope with another position scheme: errors.
  EXPECT_ATTO_ERROR(CausalLM(CausalLMOptions{.vocab = 11,
                                             .d_model = 8,
                                             .n_head = 2,
                                             .d_ff = 16,
                                             .max_len = 6,
                                             .attention = {.kind = "linear"},
                                             .architecture = {.positions = "rope"}}),
                    "linear attention has no positions in it");
  EXPECT_ATTO_ERROR(
      CausalLM(CausalLMOptions{.vocab = 11,
                               .d_model = 8,
                               .n_head = 2,
                               .d_ff = 16,
                               .max_len = 6,
                               .attention = {.kind = "alibi"},
                               .architecture = {.positions = "rope"}}),
      "rope applies to softmax attention with a query/key per head (mha, gqa, mla, local, block-sparse, softcap, prefix-lm, "
      "document), not alibi");
  EXPECT_ATTO_ERROR(CausalLM(CausalLMOptions{.vocab = 11,
                                             .d_model = 8,
                                             .n_head = 2,
                                             .d_ff = 16,
                                             .max_len = 6,
                                             .attention = {.rope = true},
                                             .architecture = {.positions = "learned"}}),
                    "cannot be combined with positions 'learned'");
}

TEST(ArchitectureSpec, SwigluAddsLinear3) {
  Generator gen(3);
  CausalLM lm(lm_options({.activation = "swiglu"}), gen);
  const std::vector<std::string> names = names_of(lm);
  const std::vector<std::string> ff0{"blocks.0.ff.linear1.weight", "blocks.0.ff.linear1.bias",
                                     "blocks.0.ff.linear3.weight", "blocks.0.ff.linear3.bias",
                                     "blocks.0.ff.linear2.weight", "blocks.0.ff.linear2.bias"};
  auto at = std::find(names.begin(), names.end(), ff0[0]);
  ASSERT_NE(at, names.end());
  EXPECT_EQ(std::vector<std::string>(at, at + 6), ff0);
  EXPECT_EQ(lm.parameter("blocks.0.ff.linear3.weight").shape(), Shape({16, 8}));  // (F, D)
  EXPECT_EQ(lm.parameter("blocks.1.ff.linear3.bias").shape(), Shape({16}));
  CausalLM plain(lm_options({}), gen);
  EXPECT_EQ(lm.num_parameters(), plain.num_parameters() + 2 * (16 * 8 + 16));
  for (const char* act : {"relu", "gelu", "gelu-tanh"}) {
    CausalLM other(lm_options({.activation = act}), gen);
    EXPECT_EQ(names_of(other), names_of(plain)) << act;
    EXPECT_EQ(other.block(0)->ff->options.activation, act);
  }
}

TEST(ArchitectureSpec, UntiedHeadIsALinearWithTheRecipesBias) {
  Generator gen(4);
  CausalLM lm(lm_options({.head = "untied"}), gen);
  std::vector<std::string> names = names_of(lm);
  ASSERT_GE(names.size(), 2u);
  EXPECT_EQ(names[names.size() - 2], "head.weight");
  EXPECT_EQ(names.back(), "head.bias");
  EXPECT_EQ(lm.parameter("head.weight").shape(), Shape({11, 8}));  // (V, D)
  EXPECT_EQ(lm.parameter("head.bias").shape(), Shape({11}));
  CausalLM nobias(lm_options({.bias = false, .head = "untied"}), gen);
  EXPECT_EQ(names_of(nobias).back(), "head.weight");
  // Tied (and the default): no head, the logits are norm(x) embed.weight^T.
  for (const char* h : {"default", "tied"}) {
    CausalLM tied(lm_options({.head = h}), gen);
    EXPECT_EQ(tied.head, nullptr) << h;
    EXPECT_EQ(names_of(tied).back(), "norm.bias") << h;
  }
  // Untied: the head's gradient is the logits', and the embedding no longer gets the output projection's share.
  Tensor out = lm.forward(tokens_of({1, 2, 3}, 1, 3));
  sum(out).backward();
  EXPECT_TRUE(lm.parameter("head.weight").grad().defined());
  const Tensor ge = lm.parameter("embed.weight").grad();  // rows of tokens not in the input get nothing
  for (int64_t k = 0; k < 8; ++k) EXPECT_EQ(ge.at({9, k}), 0.0);
}

TEST(ArchitectureSpec, NoBiasLeavesNoBiasParameterAnywhere) {
  Generator gen(5);
  for (const ArchitectureSpec& a :
       {ArchitectureSpec{.bias = false}, ArchitectureSpec{.activation = "swiglu", .bias = false, .head = "untied"},
        ArchitectureSpec{.positions = "learned", .norm = "rmsnorm", .bias = false}}) {
    CausalLM lm(lm_options(a), gen);
    for (const std::string& n : names_of(lm)) EXPECT_FALSE(ends_with(n, "bias")) << a.to_json() << ": " << n;
    EXPECT_FALSE(lm.block(0)->attention<MultiheadAttention>()->in_proj_bias.defined());
  }
  // LayerNorm without bias: weight only, the same normalisation minus the shift.
  CausalLM lm(lm_options({.bias = false}), gen);
  const auto ln = std::dynamic_pointer_cast<LayerNorm>(lm.norm);
  ASSERT_NE(ln, nullptr);
  EXPECT_FALSE(ln->bias.defined());
  EXPECT_TRUE(ln->weight.defined());
  // Counted by hand: embed + per block [2 norm weights, in_proj 3D x D, out_proj D x D, linear1 F x D, linear2 D x F]
  // + final norm weight.
  const int64_t V = 11, D = 8, F = 16;
  EXPECT_EQ(lm.num_parameters(), V * D + 2 * (2 * D + 3 * D * D + D * D + 2 * F * D) + D);
}

TEST(ArchitectureSpec, RMSNormEverywhereWithWeightsOnly) {
  Generator gen(6);
  CausalLM lm(lm_options({.norm = "rmsnorm", .norm_eps = 3e-6}), gen);
  for (const auto& n : {lm.norm, lm.block(0)->norm1, lm.block(1)->norm2}) {
    const auto r = std::dynamic_pointer_cast<RMSNorm>(n);
    ASSERT_NE(r, nullptr);
    EXPECT_DOUBLE_EQ(r->eps, 3e-6);
  }
  for (const std::string& n : names_of(lm)) {
    if (n.find("norm") == std::string::npos) continue;
    EXPECT_TRUE(ends_with(n, "norm1.weight") || ends_with(n, "norm2.weight") || n == "norm.weight") << n;
  }
  EXPECT_EQ(lm.parameter("norm.weight").shape(), Shape({8}));
  // LayerNorm takes norm_eps too.
  CausalLM ln(lm_options({.norm_eps = 1e-5}), gen);
  EXPECT_DOUBLE_EQ(std::dynamic_pointer_cast<LayerNorm>(ln.block(0)->norm2)->eps, 1e-5);
  EXPECT_DOUBLE_EQ(std::dynamic_pointer_cast<LayerNorm>(ln.norm)->eps, 1e-5);
}

// GPT-2's init on a model big enough for sample statistics: D 256, F 1024, 2 layers, vocab 512, max_len 64.
// Tolerances from the sample sizes: a standard deviation estimated from n normal draws has a relative standard error
// of 1 / sqrt(2n) (n >= 65536 here: <= 0.28%), so 3% is > 10 standard errors; a mean's standard error is
// sigma / sqrt(n), bounded at 6 of them.
TEST(ArchitectureSpec, Gpt2InitStatistics) {
  Generator gen(7);
  const int64_t D = 256, F = 1024, V = 512, P = 64, layers = 2;
  CausalLM lm({.vocab = V,
               .d_model = D,
               .n_head = 4,
               .d_ff = F,
               .n_layers = layers,
               .max_len = P,
               .architecture = {.positions = "learned", .init = "gpt2", .head = "untied"}},
              gen);
  auto expect_normal = [](const std::vector<Tensor>& ts, double sigma, const char* what) {
    int64_t n = 0;
    const auto [m, s] = mean_std(ts, &n);
    EXPECT_NEAR(s, sigma, 0.03 * sigma) << what << " (n=" << n << ")";
    EXPECT_NEAR(m, 0.0, 6 * sigma / std::sqrt(static_cast<double>(n))) << what;
  };
  const double residual = 0.02 / std::sqrt(2.0 * layers);
  expect_normal({lm.embed->weight}, 0.02, "embed");
  expect_normal({lm.pos_embed->weight}, 0.02, "pos_embed");
  expect_normal({lm.head->weight}, 0.02, "head");
  std::vector<Tensor> in_proj, out_proj, linear1, linear2;
  for (int64_t i = 0; i < layers; ++i) {
    in_proj.push_back(lm.parameter("blocks." + std::to_string(i) + ".self_attn.in_proj_weight"));
    out_proj.push_back(lm.parameter("blocks." + std::to_string(i) + ".self_attn.out_proj.weight"));
    linear1.push_back(lm.parameter("blocks." + std::to_string(i) + ".ff.linear1.weight"));
    linear2.push_back(lm.parameter("blocks." + std::to_string(i) + ".ff.linear2.weight"));
  }
  expect_normal(in_proj, 0.02, "in_proj_weight");
  expect_normal(linear1, 0.02, "linear1.weight");
  expect_normal(out_proj, residual, "out_proj.weight (residual)");
  expect_normal(linear2, residual, "linear2.weight (residual)");
  // Biases zero, norm weights one.
  for (const auto& [n, p] : lm.named_parameters()) {
    if (ends_with(n, "bias")) {
      for (double v : p.to_vector<double>()) ASSERT_EQ(v, 0.0) << n;
    } else if (n.find("norm") != std::string::npos) {
      for (double v : p.to_vector<double>()) ASSERT_EQ(v, 1.0) << n;
    }
  }
  // The default init is different (embedding N(0, 1/D): std 1/16 here).
  Generator g2(7);
  CausalLM plain({.vocab = V, .d_model = D, .n_head = 4, .d_ff = F, .n_layers = layers, .max_len = P}, g2);
  EXPECT_NEAR(mean_std({plain.embed->weight}).second, 1.0 / 16, 0.03 / 16);
}

// ---------------------------------------------------------------------------------------------
// The kinds with a fixed recipe

TEST(ArchitectureSpec, Seq2SeqRefusesTheOptionsNamingThemAndTheEncoderTakesThem) {
  ModelSpec s = lm_spec();
  s.aligned = true;
  s.max_target_len = s.max_source_len;
  make_model("seq2seq", s);  // the defaults (and a recipe name alone) are fine
  make_model("encoder", s);
  s.architecture.recipe = "mine";
  make_model("seq2seq", s);
  make_model("encoder", s);
  const std::vector<std::pair<ArchitectureSpec, std::string>> cases = {{{.positions = "learned"}, "positions=learned"},
                                                                       {{.activation = "swiglu"}, "activation=swiglu"},
                                                                       {{.norm = "rmsnorm"}, "norm=rmsnorm"},
                                                                       {{.norm_eps = 1e-5}, "norm_eps=1e-05"},
                                                                       {{.bias = false}, "bias=false"},
                                                                       {{.embed_scale = "none"}, "embed_scale=none"},
                                                                       {{.init = "gpt2"}, "init=gpt2"},
                                                                       {{.head = "untied"}, "head=untied"}};
  for (const auto& [a, word] : cases) {
    s.architecture = a;
    EXPECT_ATTO_ERROR(make_model("seq2seq", s), "model kind \"seq2seq\" keeps the paper's recipe");
    EXPECT_ATTO_ERROR(make_model("seq2seq", s), "does not take the architecture option " + word);
    make_model("encoder", s);  // the encoder-only kind takes every option but rope (test_encoder_tagger_recipe.cpp)
    make_model("lm", s);       // and so does the lm kind
  }
}

// ---------------------------------------------------------------------------------------------
// Decoding

// The key/value-cached decode (its own embedding, feed-forward and head kernels) gives the recomputation's tokens and
// logits for every option, in float32 and float64.
TEST(ArchitectureSpec, CachedDecodeEqualsRecomputedForEveryOption) {
  const std::vector<ArchitectureSpec> archs = {
      {.positions = "learned",
       .activation = "gelu",
       .norm_eps = 1e-5,
       .bias = false,
       .embed_scale = "none",
       .init = "gpt2",
       .head = "tied",
       .recipe = "nanogpt"},
      {.positions = "rope", .activation = "swiglu", .norm = "rmsnorm", .bias = false, .embed_scale = "none"},
      {.positions = "none", .activation = "gelu-tanh", .head = "untied"},
      {.positions = "learned", .activation = "swiglu", .norm = "rmsnorm", .head = "untied"},
  };
  for (const ArchitectureSpec& a : archs)
    for (Dtype dt : {kFloat32, kFloat64}) {
      SCOPED_TRACE(a.to_json() + " " + dtype_name(dt));
      Generator gen(8);
      CausalLM m({.vocab = 13,
                  .d_model = 16,
                  .n_head = 2,
                  .d_ff = 24,
                  .n_layers = 2,
                  .dropout = 0.1,
                  .max_len = 16,
                  .dtype = dt,
                  .architecture = a},
                 gen);
      m.eval();
      const int64_t steps = 8;
      const DecodeTrace cached = run_greedy(m, kDecodeSources, steps, true);
      const DecodeTrace full = run_greedy(m, kDecodeSources, steps, false);
      EXPECT_GT(cached.cached_steps, 0);
      expect_same_decode(cached, full, dt);
      // The recomputation's first step is forward()'s logits at the last position of each prompt, src SEP.
      NoGradGuard no_grad;
      for (size_t b = 0; b < kDecodeSources.size(); ++b) {
        std::vector<int64_t> src = kDecodeSources[b];
        src.push_back(m.spec().specials.sep);
        const Tensor f = m.forward(tokens_of(src, 1, static_cast<int64_t>(src.size())));  // (1, L, V)
        for (int64_t v = 0; v < 13; ++v)
          EXPECT_NEAR(full.logits[0].at({static_cast<int64_t>(b), v}),
                      f.at({0, static_cast<int64_t>(src.size()) - 1, v}), decode_tolerance(dt))
              << b << " " << v;
      }
    }
}
