// TrainConfig's architecture options (issue 22, "The recipe is the user's"): their JSON round trip, the spec the
// Trainer builds from them, --recipe nanogpt's settings, the memory estimate's parameter count and the errors.

#include <cmath>
#include <string>

#include "testing.h"
#include "nn/models.h"
#include "train/trainer.h"

namespace attograd::train {
namespace {

// Expects `statement` to throw an Error whose message contains `text`.
#define EXPECT_THROW_MSG(statement, text)                                                  \
  do {                                                                                    \
    try {                                                                                 \
      statement;                                                                          \
      ADD_FAILURE() << #statement << " did not throw";                                    \
    } catch (const Error& e) {                                                            \
      EXPECT_NE(std::string(e.what()).find(text), std::string::npos) << e.what();         \
    }                                                                                     \
  } while (0)

TrainConfig tiny() {
  TrainConfig c;
  c.task = "reverse";
  c.layers = 2;
  c.d_model = 16;
  c.heads = 2;
  c.d_ff = 32;
  c.max_len = 5;
  c.batch = 8;
  c.steps = 4;
  c.warmup = 1;
  c.eval_every = 0;
  c.eval_size = 10;
  return c;
}

TEST(TrainConfigRecipe, DefaultsWriteNoneOfTheFieldsAndEveryFieldRoundTrips) {
  const std::string def = TrainConfig{}.to_json();
  for (const char* key : {"\"positions\"", "\"activation\"", "\"norm\"", "\"norm_eps\"", "\"bias\"", "\"embed_scale\"",
                          "\"init\"", "\"head\"", "\"recipe\""})
    EXPECT_EQ(def.find(key), std::string::npos) << key;
  TrainConfig c = tiny();
  c.positions = "learned", c.activation = "swiglu", c.norm = "rmsnorm", c.norm_eps = 1e-5, c.bias = false;
  c.embed_scale = "none", c.init = "gpt2", c.head = "untied", c.recipe = "mine";
  const std::string j = c.to_json();
  EXPECT_NE(j.find("\"norm_eps\": 1e-05"), std::string::npos) << j;
  EXPECT_NE(j.find("\"bias\": false"), std::string::npos) << j;
  EXPECT_EQ(TrainConfig::from_json(j), c);
  // The spec the Trainer builds the model from carries every option (and its JSON round-trips too).
  const nn::ArchitectureSpec a = c.model_sizes().architecture;
  EXPECT_EQ(a.positions, "learned");
  EXPECT_EQ(a.activation, "swiglu");
  EXPECT_EQ(a.norm, "rmsnorm");
  EXPECT_EQ(a.norm_eps, 1e-5);
  EXPECT_FALSE(a.bias);
  EXPECT_EQ(a.embed_scale, "none");
  EXPECT_EQ(a.init, "gpt2");
  EXPECT_EQ(a.head, "untied");
  EXPECT_EQ(a.recipe, "mine");
  Trainer t(c);
  EXPECT_EQ(t.model().spec().architecture, a);
  EXPECT_EQ(nn::ModelSpec::from_json(t.model().spec().to_json()), t.model().spec());
  EXPECT_EQ(tiny().model_sizes().architecture, nn::ArchitectureSpec{});
}

TEST(TrainConfigRecipe, NanogptSetsEveryOptionOfModelPyAndTrainPy) {
  TrainConfig c = tiny();
  c.lr = 1e-3;
  c.apply_recipe("nanogpt");
  EXPECT_EQ(c.positions, "learned");
  EXPECT_EQ(c.activation, "gelu");
  EXPECT_EQ(c.norm, "layernorm");
  EXPECT_EQ(c.norm_eps, 1e-5);
  EXPECT_FALSE(c.bias);
  EXPECT_EQ(c.embed_scale, "none");
  EXPECT_EQ(c.init, "gpt2");
  EXPECT_EQ(c.head, "tied");
  EXPECT_EQ(c.decay, "matrices");
  EXPECT_EQ(c.beta1, 0.9);
  EXPECT_EQ(c.beta2, 0.95);
  EXPECT_EQ(c.min_lr, 1e-3 / 10);
  EXPECT_EQ(c.warmup_style, "nanogpt");
  EXPECT_EQ(c.recipe, "nanogpt");
  EXPECT_EQ(c.lr, 1e-3);  // run settings stay the user's
  EXPECT_EQ(c.weight_decay, 0.1);  // train.py's weight_decay = 1e-1
  EXPECT_EQ(c.adam_eps, 1e-8);     // torch.optim.AdamW's default eps
  c.validate();
  // "default" puts every recipe field back.
  c.apply_recipe("default");
  TrainConfig want = tiny();
  want.lr = 1e-3;
  EXPECT_EQ(c, want);
  EXPECT_THROW_MSG(c.apply_recipe("llama"), "recipe (--recipe) must be default or nanogpt");
}

TEST(TrainConfigRecipe, BadValuesAndOptionsTheModelDoesNotTakeNameTheFlag) {
  TrainConfig c = tiny();
  c.positions = "alibi";
  EXPECT_THROW_MSG(c.validate(), "positions (--positions) must be one of sinusoidal, learned, rope, none");
  c = tiny(), c.norm_eps = 0;
  c.validate();  // 0, the default: the model's own eps
  c.norm_eps = -1e-5;
  EXPECT_THROW_MSG(c.validate(), "norm_eps (--norm-eps) must be finite and > 0 (or 0: the model's own)");
  c = tiny(), c.rope = true, c.positions = "learned";
  EXPECT_THROW_MSG(c.validate(), "rope (--rope) is --positions rope");
  c = tiny(), c.model = "seq2seq", c.bias = false;
  EXPECT_THROW_MSG(c.validate(), "bias (--no-bias) = false applies to the lm and encoder models; model seq2seq");
  c = tiny(), c.model = "seq2seq", c.lr = 1e-3;
  c.apply_recipe("nanogpt");
  EXPECT_THROW_MSG(c.validate(), "positions (--positions) = learned (from --recipe nanogpt) applies to the lm and");
  // The encoder takes the recipe, but not rotary positions.
  c = tiny(), c.model = "encoder", c.lr = 1e-3;
  c.apply_recipe("nanogpt");
  c.validate();
  c.positions = "rope";
  EXPECT_THROW_MSG(c.validate(), "the encoder model's positions are sinusoidal, learned or none");
}

// The estimate counts weight matrices and embeddings (no biases or norms): what an option adds to them it adds
// exactly, and it stays a lower bound within 10% of the real count.
TEST(TrainConfigRecipe, MemoryEstimateCountsEachOptionsWeights) {
  auto counts = [](const TrainConfig& c) {
    Trainer t(c);
    return std::pair<double, double>{c.estimate_memory().parameters, static_cast<double>(t.model().num_parameters())};
  };
  const TrainConfig base = tiny();
  const auto [e0, n0] = counts(base);
  const double V = 5 + base.num_symbols, L = 2 * base.max_len + 1, D = base.d_model, F = base.d_ff;
  struct Case {
    const char* name;
    void (*set)(TrainConfig&);
    double added;  // the weights the option adds (biases included where they are)
  };
  const Case cases[] = {
      {"learned", [](TrainConfig& c) { c.positions = "learned"; }, L * D},
      {"swiglu", [](TrainConfig& c) { c.activation = "swiglu"; }, 2 * (D * F + F)},
      {"untied", [](TrainConfig& c) { c.head = "untied"; }, V * D + V},
      {"no-bias", [](TrainConfig& c) { c.bias = false; }, 0},
      {"rmsnorm", [](TrainConfig& c) { c.norm = "rmsnorm"; }, 0},
  };
  for (const Case& k : cases) {
    TrainConfig c = base;
    k.set(c);
    const auto [e, n] = counts(c);
    EXPECT_LE(e, n) << k.name;
    EXPECT_GE(e, 0.9 * n) << k.name;
    if (std::string(k.name) == "no-bias" || std::string(k.name) == "rmsnorm") {
      EXPECT_EQ(e, e0) << k.name;  // only biases and norm weights go
      EXPECT_LT(n, n0) << k.name;
    } else {
      EXPECT_EQ(n - n0, k.added) << k.name;
      EXPECT_EQ(e - e0, std::string(k.name) == "swiglu" ? 2 * D * F : k.added) << k.name;
    }
  }
}

}  // namespace
}  // namespace attograd::train
