// `attograd train`'s architecture flags and --recipe (issue 22), run as a user would: the flags reach config.json and
// the weights' spec, --recipe nanogpt sets every option and explicit flags (and --config keys) override it, its
// first loss is ln(vocabulary) where the default recipe's is above it, the other model kinds refuse the options,
// and a recipe model evaluates, samples, generates and is described by inspect.

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli_testing.h"

#include "train/io/serialize.h"
#include "train/trainer.h"

namespace {

using attograd::train::TrainConfig;

constexpr const char* kTiny =
    "--steps 20 --d-model 16 --layers 1 --heads 2 --d-ff 32 --max-len 4 --batch 16 --eval-size 50 --eval-every 10";

class CliRecipe : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!kCli) GTEST_SKIP() << "the attograd tool is not built (ATTOGRAD_BUILD_EXAMPLES=OFF)";
  }
  // The configuration a run saved: config.json, and the same in the weights' metadata.
  static TrainConfig saved(const std::string& out) {
    const TrainConfig c = TrainConfig::from_json(slurp(out + "/config.json"));
    const attograd::io::FileInfo info = attograd::io::inspect(out + "/model.attograd");
    EXPECT_EQ(attograd::train::parse_run_metadata(info.metadata, out).config, c);
    return c;
  }
  // The first rows of the GPL (Debian's common-licenses), a small English text; empty when not installed.
  static std::string text_file() {
    const std::string src = "/usr/share/common-licenses/GPL-3";
    if (!fs::exists(src)) return {};
    const std::string path = (scratch() / "gpl.txt").string();
    std::ofstream(path) << slurp(src).substr(0, 20000);
    return path;
  }
  // metrics.csv's loss at step 0 (the training-loss estimate before the first update).
  static double first_loss(const std::string& out) {
    const std::vector<std::string> rows = lines(slurp(out + "/metrics.csv"));
    EXPECT_GE(rows.size(), 2u);
    std::stringstream row(rows.at(1));
    std::string step, loss;
    std::getline(row, step, ',');
    std::getline(row, loss, ',');
    EXPECT_EQ(step, "0");
    return std::stod(loss);
  }
};

TEST_F(CliRecipe, FlagsReachTheConfigAndTheWeightsSpec) {
  const std::string out = (scratch() / "flags").string();
  const CliRun r = attograd(std::string("train ") + kTiny +
                            " --positions learned --activation swiglu --norm rmsnorm --norm-eps 1e-5 --no-bias "
                            "--embed-scale none --init gpt2 --head untied --json --out " + quote(out));
  ASSERT_EQ(r.status, 0) << r.err;
  const TrainConfig c = saved(out);
  EXPECT_EQ(c.positions, "learned");
  EXPECT_EQ(c.activation, "swiglu");
  EXPECT_EQ(c.norm, "rmsnorm");
  EXPECT_EQ(c.norm_eps, 1e-5);
  EXPECT_FALSE(c.bias);
  EXPECT_EQ(c.embed_scale, "none");
  EXPECT_EQ(c.init, "gpt2");
  EXPECT_EQ(c.head, "untied");
  EXPECT_EQ(c.recipe, "");
  const json s = last_line_json(r.out);
  EXPECT_EQ(s["recipe"], "default");
  EXPECT_EQ(s["architecture"]["positions"], "learned");
  EXPECT_EQ(s["architecture"]["bias"], false);
  EXPECT_EQ(s["architecture"]["norm_eps"], 1e-5);
  EXPECT_FALSE(s["architecture"].contains("recipe"));
  // The weights hold the options' tensors: a position table and an untied head without bias.
  const std::string listing = attograd("inspect " + quote(out + "/model.attograd")).out;
  EXPECT_NE(listing.find("pos_embed.weight"), std::string::npos) << listing;
  EXPECT_NE(listing.find("head.weight"), std::string::npos) << listing;
  EXPECT_EQ(listing.find("head.bias"), std::string::npos) << listing;
  // --rope is --positions rope: the same weights.
  const std::string a = (scratch() / "rope-flag").string(), b = (scratch() / "rope-positions").string();
  ASSERT_EQ(attograd(std::string("train ") + kTiny + " --rope --quiet --out " + quote(a)).status, 0);
  ASSERT_EQ(attograd(std::string("train ") + kTiny + " --positions rope --quiet --out " + quote(b)).status, 0);
  EXPECT_EQ(first_loss(a), first_loss(b));
  EXPECT_EQ(lines(slurp(a + "/metrics.csv")).back().substr(0, 40), lines(slurp(b + "/metrics.csv")).back().substr(0, 40));
}

TEST_F(CliRecipe, NanogptSetsEveryOptionAndExplicitFlagsOverrideIt) {
  const std::string out = (scratch() / "nanogpt").string();
  const CliRun r = attograd(std::string("train ") + kTiny + " --recipe nanogpt --lr 2e-3 --json --out " + quote(out));
  ASSERT_EQ(r.status, 0) << r.err;
  const TrainConfig c = saved(out);
  EXPECT_EQ(c.recipe, "nanogpt");
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
  EXPECT_EQ(c.min_lr, 2e-3 / 10);  // the final lr's tenth
  EXPECT_EQ(c.warmup_style, "nanogpt");
  const json s = last_line_json(r.out);
  EXPECT_EQ(s["recipe"], "nanogpt");
  EXPECT_EQ(s["architecture"]["init"], "gpt2");
  EXPECT_NE(s["optimizer_recipe"].get<std::string>().find("betas (0.9, 0.95)"), std::string::npos);
  // The human summary names the recipe and its options.
  const CliRun h = attograd(std::string("train ") + kTiny + " --recipe nanogpt --out " + quote(out + "-human"));
  ASSERT_EQ(h.status, 0) << h.err;
  EXPECT_NE(h.out.find("architecture  nanogpt recipe: positions=learned, activation=gelu, norm_eps=1e-05, "
                       "bias=false, embed_scale=none, init=gpt2, head=tied"),
            std::string::npos)
      << h.out;
  EXPECT_NE(h.out.find("betas (0.9, 0.95)"), std::string::npos) << h.out;

  // Explicit flags win over the recipe, whichever order they come in.
  const std::string o2 = (scratch() / "nanogpt-overridden").string();
  ASSERT_EQ(attograd(std::string("train ") + kTiny +
                     " --beta2 0.99 --activation gelu-tanh --recipe nanogpt --min-lr 1e-4 --positions sinusoidal "
                     "--quiet --out " + quote(o2))
                .status,
            0);
  const TrainConfig d = saved(o2);
  EXPECT_EQ(d.beta2, 0.99);
  EXPECT_EQ(d.activation, "gelu-tanh");
  EXPECT_EQ(d.min_lr, 1e-4);
  EXPECT_EQ(d.positions, "sinusoidal");
  EXPECT_EQ(d.init, "gpt2");  // the rest is the recipe's
  EXPECT_FALSE(d.bias);
  EXPECT_EQ(d.recipe, "nanogpt");
  // A --config file's keys count as explicit too.
  const std::string cfg = (scratch() / "partial.json").string();
  std::ofstream(cfg) << R"({"steps": 20, "d_model": 16, "layers": 1, "heads": 2, "d_ff": 32, "max_len": 4,
                            "batch": 16, "eval_size": 50, "eval_every": 10, "lr": 0.004, "beta2": 0.97,
                            "norm_eps": 1e-6})";
  const std::string o3 = (scratch() / "nanogpt-config").string();
  ASSERT_EQ(attograd("train --config " + quote(cfg) + " --recipe nanogpt --quiet --out " + quote(o3)).status, 0);
  const TrainConfig e = saved(o3);
  EXPECT_EQ(e.beta2, 0.97);
  EXPECT_EQ(e.norm_eps, 1e-6);
  EXPECT_EQ(e.min_lr, 0.004 / 10);
  EXPECT_EQ(e.positions, "learned");
  // --rope keeps its positions; another schedule or sgd drops the recipe's cosine settings or betas.
  const std::string o4 = (scratch() / "nanogpt-rope-sgd").string();
  ASSERT_EQ(attograd(std::string("train ") + kTiny +
                     " --recipe nanogpt --rope --schedule constant --optimizer sgd --quiet --out " + quote(o4))
                .status,
            0);
  const TrainConfig f = saved(o4);
  EXPECT_TRUE(f.rope);
  EXPECT_EQ(f.positions, "sinusoidal");
  EXPECT_EQ(f.min_lr, 0.0);
  EXPECT_EQ(f.warmup_style, "from-zero");
  EXPECT_EQ(f.beta2, TrainConfig{}.beta2);
  EXPECT_EQ(f.init, "gpt2");
}

// nanoGPT's init (N(0, 0.02), no embedding scale) gives near-uniform logits: the first loss is ln V. The default
// recipe's token embedding (N(0, 1/D) times sqrt(D): rows of norm about 1 before the scale, sqrt(D) after) is also
// its output matrix: the final LayerNorm's output still points along the input token's own embedding, so that
// token's logit is about sqrt(D) above the others and the model starts out confidently predicting "the same
// character again": the first loss grows with sqrt(D) (6.1 at width 64, 8.6 at 128 on this text, ln V = 4.3).
TEST_F(CliRecipe, NanogptStartsAtLnVAndTheDefaultRecipeAboveIt) {
  const std::string text = text_file();
  if (text.empty()) GTEST_SKIP() << "/usr/share/common-licenses/GPL-3 is not installed";
  const std::string run = " --steps 2 --eval-every 1 --eval-size 20 --batch 8 --samples 1 --quiet --out ";
  const std::string ng = (scratch() / "text-nanogpt").string(), def = (scratch() / "text-default").string();
  ASSERT_EQ(attograd("train --text " + quote(text) + " --recipe nanogpt" + run + quote(ng)).status, 0);
  ASSERT_EQ(attograd("train --text " + quote(text) + run + quote(def)).status, 0);
  const json in = last_line_json(attograd("inspect --json " + quote(ng + "/model.attograd")).out);
  const std::string vocab = in["summary"]["vocabulary"].get<std::string>();  // "75 tokens"
  const double ln_v = std::log(std::stod(vocab));
  EXPECT_GT(ln_v, 3.5);
  EXPECT_NEAR(first_loss(ng), ln_v, 0.3);
  EXPECT_GT(first_loss(def), ln_v + 1.0);
  // The recipe model evaluates, samples, and inspect names it.
  const CliRun e = attograd("eval --json -w " + quote(ng + "/model.attograd") + " --eval-size 20");
  ASSERT_EQ(e.status, 0) << e.err;
  EXPECT_TRUE(std::isfinite(last_line_json(e.out)["loss"].get<double>()));
  const CliRun smp = attograd("sample -w " + quote(ng + "/model.attograd") + " -p 'The GNU' -n 20 --seed 3");
  ASSERT_EQ(smp.status, 0) << smp.err;
  EXPECT_EQ(in["summary"]["architecture"].get<std::string>(), "nanogpt recipe: positions=learned, activation=gelu, norm_eps=1e-05, bias=false, "
                                "embed_scale=none, init=gpt2, head=tied");
  const std::string listing = attograd("inspect " + quote(ng + "/model.attograd")).out;
  EXPECT_NE(listing.find("architecture nanogpt recipe: positions=learned"), std::string::npos) << listing;
  EXPECT_NE(listing.find("betas (0.9, 0.95), eps 1e-08, weight decay 0.1 on matrices only"), std::string::npos) << listing;
}

TEST_F(CliRecipe, ARecipeModelGeneratesEvaluatesAndRoundTripsThroughSafetensors) {
  const std::string out = (scratch() / "generate").string();
  const CliRun t = attograd(std::string("train ") + kTiny + " --recipe nanogpt --activation swiglu --head untied " +
                            "--json --out " + quote(out));
  ASSERT_EQ(t.status, 0) << t.err;
  const std::string w = out + "/model.attograd";
  const json e = last_line_json(attograd("eval --weights " + quote(w) + " --eval-size 50 --json").out);
  ASSERT_TRUE(e.is_object());
  EXPECT_EQ(e["token_accuracy"].get<double>(), last_line_json(t.out)["token_accuracy"].get<double>());
  const CliRun g = attograd("generate -w " + quote(w) + " -i '1 2 3'");
  ASSERT_EQ(g.status, 0) << g.err;
  EXPECT_EQ(attograd("generate --no-kv-cache -w " + quote(w) + " -i '1 2 3'").out, g.out);
  const std::string st = out + "/model.safetensors", back = out + "/imported.attograd";
  ASSERT_EQ(attograd("export -w " + quote(w) + " --to " + quote(st)).status, 0);
  ASSERT_EQ(attograd("import --from " + quote(st) + " --to " + quote(back)).status, 0);
  EXPECT_EQ(attograd("generate -w " + quote(back) + " -i '1 2 3'").out, g.out);
}

TEST_F(CliRecipe, OptionsAModelDoesNotTakeAreOneLineErrors) {
  const std::string base = std::string("train ") + kTiny + " --out " + quote((scratch() / "bad").string());
  expect_one_line_error(attograd(base + " --model seq2seq --positions learned"),
                        "positions (--positions) = learned applies to the lm and encoder models; model seq2seq",
                        "seq2seq learned");
  expect_one_line_error(attograd(base + " --model seq2seq --no-bias"), "bias (--no-bias) = false", "seq2seq no-bias");
  expect_one_line_error(attograd(base + " --model seq2seq --recipe nanogpt"), "(from --recipe nanogpt)",
                        "seq2seq recipe");
  expect_one_line_error(attograd(base + " --model encoder --positions rope"), "positions (--positions) rope",
                        "encoder rope");
  expect_one_line_error(attograd(base + " --positions learned --rope"), "rope (--rope) is --positions rope",
                        "rope and learned");
  expect_one_line_error(attograd(base + " --recipe gpt3"), "--recipe", "unknown recipe");
  expect_one_line_error(attograd(base + " --activation tanh"), "--activation", "unknown activation");
  expect_one_line_error(attograd(base + " --norm-eps -1"), "--norm-eps", "eps -1");
  const std::string ck = (scratch() / "resume-me").string();
  ASSERT_EQ(attograd(std::string("train ") + kTiny + " --quiet --out " + quote(ck)).status, 0);
  expect_one_line_error(attograd("train --resume " + quote(ck + "/checkpoint.attograd") + " --recipe nanogpt --steps 30"),
                        "--recipe sets up a new run", "recipe on resume");
}

TEST_F(CliRecipe, ATinyVocabularyRunWithoutBiasesLoadsBack) {
  // The load check bounds a file's parameters from below by its configuration: a data run is bounded with the
  // data's own vocabulary (5 characters here) and context, not the built-in task's 5 + num_symbols tokens and
  // 2 max_len + 1 learned positions, which refused this correct file.
  const std::string text = (scratch() / "five.txt").string();
  {
    std::ofstream f(text);
    for (int i = 0; i < 200; ++i) f << "abcde";
  }
  const std::string out = (scratch() / "five-run").string();
  ASSERT_EQ(attograd("train --text " + quote(text) + " --recipe nanogpt --context 8 --steps 5 --d-model 16 --heads 2 "
                     "--layers 1 --d-ff 64 --quiet --out " + quote(out)).status,
            0);
  const CliRun e = attograd("eval -w " + quote(out + "/model.attograd") + " --json");
  ASSERT_EQ(e.status, 0) << e.err;
  const CliRun r = attograd("train --resume " + quote(out + "/checkpoint.attograd") + " --steps 7 --quiet");
  EXPECT_EQ(r.status, 0) << r.err;
}

TEST_F(CliRecipe, TheEncoderModelTakesTheRecipe) {
  const std::string out = (scratch() / "encoder-nanogpt").string();
  const CliRun r = attograd(std::string("train --model encoder --recipe nanogpt --json ") + kTiny + " --out " +
                            quote(out));
  ASSERT_EQ(r.status, 0) << r.err;
  const TrainConfig c = saved(out);
  EXPECT_EQ(c.positions, "learned");
  EXPECT_EQ(c.recipe, "nanogpt");
  const attograd::io::FileInfo info = attograd::io::inspect(out + "/model.attograd");
  bool learned = false, biases = false;
  for (const auto& t : info.tensors) {
    learned |= t.name == "pos_embed.weight";
    biases |= t.name.size() >= 4 && t.name.compare(t.name.size() - 4, 4, "bias") == 0;
  }
  EXPECT_TRUE(learned);
  EXPECT_FALSE(biases);
  EXPECT_EQ(attograd("eval -w " + quote(out + "/model.attograd")).status, 0);
}

}  // namespace
