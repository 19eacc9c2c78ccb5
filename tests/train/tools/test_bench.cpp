// The training-step benchmark (train/tools/bench.h): presets and their errors, validation, the FLOP count by hand,
// a tiny run that returns finite positive numbers and one JSON line, and the loss going down. No timing is
// ever asserted (only that times are positive).

#include <cmath>
#include <nlohmann/json.hpp>

#include "testing.h"
#include "train/tools/bench.h"

using namespace attograd;
using namespace attograd::bench;

namespace {

BenchConfig tiny() {
  BenchConfig c;
  c.V = 8, c.D = 16, c.H = 2, c.F = 32, c.N = 1, c.L = 8, c.B = 4;
  c.steps = 2;
  c.warmup = 1;
  return c;
}

}  // namespace

TEST(Bench, PresetsHaveTheIssueSizes) {
  const BenchConfig s = preset("small");
  EXPECT_EQ(std::vector<int64_t>({s.V, s.D, s.H, s.F, s.N, s.L, s.B}),
            std::vector<int64_t>({16, 64, 4, 256, 2, 32, 32}));
  EXPECT_EQ(s.name, "small");
  const BenchConfig m = preset("medium");
  EXPECT_EQ(std::vector<int64_t>({m.V, m.D, m.H, m.F, m.N, m.L, m.B}),
            std::vector<int64_t>({64, 128, 4, 512, 2, 64, 32}));
  const BenchConfig l = preset("large");
  EXPECT_EQ(std::vector<int64_t>({l.V, l.D, l.H, l.F, l.N, l.L, l.B}),
            std::vector<int64_t>({256, 256, 8, 1024, 4, 128, 16}));
  const BenchConfig g = preset("long");
  EXPECT_EQ(std::vector<int64_t>({g.V, g.D, g.H, g.F, g.N, g.L, g.B}),
            std::vector<int64_t>({64, 128, 4, 512, 2, 1024, 4}));
  EXPECT_EQ(g.steps, 20);
  EXPECT_EQ(g.warmup, 3);
  EXPECT_EQ(g.threads, 1);
  EXPECT_EQ(preset_names(), std::vector<std::string>({"small", "medium", "large", "long"}));
  for (const std::string& name : preset_names()) EXPECT_NO_THROW(validate(preset(name))) << name;
}

TEST(Bench, UnknownPresetIsAnErrorNamingItAndTheValidOnes) {
  EXPECT_ATTO_ERROR(preset("huge"), "unknown preset 'huge'");
  EXPECT_ATTO_ERROR(preset("Small"), "valid: small, medium, large, long");
  EXPECT_ATTO_ERROR(preset(""), "unknown preset ''");
}

TEST(Bench, ValidateNamesTheBadField) {
  auto with = [](auto change) {
    BenchConfig c = tiny();
    change(c);
    return c;
  };
  EXPECT_ATTO_ERROR(validate(with([](BenchConfig& c) { c.D = 15; })), "D must be divisible by H, got D=15, H=2");
  EXPECT_ATTO_ERROR(validate(with([](BenchConfig& c) { c.L = 7; })), "L must be even");
  EXPECT_ATTO_ERROR(validate(with([](BenchConfig& c) { c.L = 0; })), "got L=0");
  EXPECT_ATTO_ERROR(validate(with([](BenchConfig& c) { c.V = 6; })), "V must be at least 7");
  EXPECT_ATTO_ERROR(validate(with([](BenchConfig& c) { c.H = 0; })), "H must be positive, got H=0");
  EXPECT_ATTO_ERROR(validate(with([](BenchConfig& c) { c.B = -1; })), "B must be positive, got B=-1");
  EXPECT_ATTO_ERROR(validate(with([](BenchConfig& c) { c.F = 0; })), "F must be positive");
  EXPECT_ATTO_ERROR(validate(with([](BenchConfig& c) { c.N = -2; })), "N must be at least 1, got N=-2");
  EXPECT_ATTO_ERROR(validate(with([](BenchConfig& c) { c.N = 0; })), "N must be at least 1");
  EXPECT_ATTO_ERROR(run_bench(with([](BenchConfig& c) { c.N = 0; })), "N must be at least 1");
  EXPECT_ATTO_ERROR(validate(with([](BenchConfig& c) { c.steps = 0; })), "steps must be at least 1");
  EXPECT_ATTO_ERROR(validate(with([](BenchConfig& c) { c.warmup = -1; })), "warmup must be non-negative");
  EXPECT_ATTO_ERROR(validate(with([](BenchConfig& c) { c.threads = 0; })), "threads must be at least 1");
  EXPECT_ATTO_ERROR(run_bench(with([](BenchConfig& c) { c.L = 5; })), "L must be even");
}

TEST(Bench, ModelFlopsByHand) {
  // T = B L = 32 tokens. Projections q, k, v, o: 2 T D 4D = 65536; FFN: 2 T D F 2 = 65536; attention Q K^T and P V
  // over B H L(L+1)/2 = 4*2*36 pairs of d_k = 8: 2 * 2 * 288 * 8 = 9216; tied output: 2 T D V = 8192.
  // Forward 148480, times 3 with the backward.
  EXPECT_DOUBLE_EQ(model_flops_per_step(tiny()), 3.0 * 148480.0);
  // Large: the FFN and projections dominate; 2 * 6 * params-ish would miss the attention term.
  BenchConfig l = preset("large");
  const double T = 16 * 128;
  const double fwd =
      4 * (2 * T * 256 * 1024 + 2 * T * 256 * 1024 * 2 + 2 * 2 * 16 * 8 * 32 * (128.0 * 129 / 2)) + 2 * T * 256 * 256;
  EXPECT_DOUBLE_EQ(model_flops_per_step(l), 3 * fwd);
}

TEST(Bench, TinyRunGivesFinitePositiveNumbersAndOneJsonLine) {
  const BenchResult r = run_bench(tiny());
  // embed 8*16 + block (2*16 + 3*16*16+48 + 16*16+16 + 2*16 + 16*32+32 + 32*16+16) + final norm 2*16
  EXPECT_EQ(r.params, 128 + (32 + 816 + 272 + 32 + 544 + 528) + 32);
  ASSERT_EQ(r.step_ms.size(), 2u);
  for (double ms : r.step_ms) EXPECT_GT(ms, 0.0);
  EXPECT_GT(r.median_step_ms, 0.0);
  EXPECT_GE(r.median_step_ms, r.min_step_ms);
  EXPECT_GT(r.tokens_per_s, 0.0);
  EXPECT_TRUE(std::isfinite(r.tokens_per_s));
  EXPECT_GT(r.peak_rss_mb, 0.0);
  EXPECT_TRUE(std::isfinite(r.first_loss));
  EXPECT_TRUE(std::isfinite(r.final_loss));
  EXPECT_GT(r.first_loss, 0.0);
  EXPECT_GT(r.final_loss, 0.0);
  EXPECT_DOUBLE_EQ(r.flops_per_step, model_flops_per_step(tiny()));
  EXPECT_GT(r.gflops, 0.0);

  const std::string json = to_json(r);
  EXPECT_EQ(json.find('\n'), std::string::npos);
  const nlohmann::json j = nlohmann::json::parse(json);
  EXPECT_EQ(j.at("impl"), "attograd");
  EXPECT_EQ(j.at("preset"), "custom");
  EXPECT_EQ(j.at("L"), 8);
  EXPECT_EQ(j.at("B"), 4);
  EXPECT_EQ(j.at("steps"), 2);
  EXPECT_EQ(j.at("params"), r.params);
  for (const char* key : {"median_step_ms", "min_step_ms", "tokens_per_s", "peak_rss_mb", "first_loss", "final_loss",
                          "flops_per_step", "gflops"}) {
    ASSERT_TRUE(j.contains(key)) << key;
    EXPECT_TRUE(j.at(key).is_number()) << key;
    EXPECT_GT(j.at(key).get<double>(), 0.0) << key;
  }
}

TEST(Bench, SameSeedSameLosses) {
  BenchConfig c = tiny();
  c.seed = 7;
  const BenchResult a = run_bench(c), b = run_bench(c);
  EXPECT_EQ(a.first_loss, b.first_loss);
  EXPECT_EQ(a.final_loss, b.final_loss);
  c.seed = 8;
  EXPECT_NE(run_bench(c).first_loss, a.first_loss);
}

TEST(Bench, LossGoesDownOverTwentyFiveSteps) {
  BenchConfig c;
  c.V = 12, c.D = 32, c.H = 2, c.F = 64, c.N = 1, c.L = 12, c.B = 16;
  c.steps = 25;
  c.warmup = 0;
  const BenchResult r = run_bench(c);
  // The tied output starts by predicting each input token itself (loss far above ln V = 2.48): the first Adam
  // steps take that away. Asserted loosely; the exact values depend on the dropout masks.
  EXPECT_GT(r.first_loss, std::log(12.0));
  EXPECT_LT(r.final_loss, r.first_loss - 0.5) << "first " << r.first_loss << ", final " << r.final_loss;
}

TEST(GenerateBench, DefaultsAreTheIssueSizes) {
  const GenerateConfig c;
  EXPECT_EQ(std::vector<int64_t>({c.V, c.D, c.H, c.F, c.N, c.tokens, c.B}),
            std::vector<int64_t>({256, 256, 4, 1024, 4, 256, 1}));
  EXPECT_EQ(c.threads, 1);
}

TEST(GenerateBench, ValidateNamesTheBadField) {
  GenerateConfig c;
  c.tokens = 0;
  try {
    validate(c);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("tokens must be positive, got 0"), std::string::npos) << e.what();
  }
  c = GenerateConfig{};
  c.H = 3;
  EXPECT_THROW(validate(c), Error);
  c = GenerateConfig{};
  c.N = 0;  // a model without blocks: nothing but the embedding to time
  EXPECT_ATTO_ERROR(validate(c), "N must be at least 1, got 0");
}

TEST(GenerateBench, TinyRunBothPathsSameTokensOneJsonLine) {
  GenerateConfig c;
  c.V = 16, c.D = 16, c.H = 2, c.F = 32, c.N = 2, c.prompt = 3, c.tokens = 12, c.B = 2, c.rounds = 2;
  const GenerateResult r = run_generate_bench(c);
  EXPECT_TRUE(r.same_tokens);
  ASSERT_EQ(r.cached_ms.size(), 2u);
  ASSERT_EQ(r.uncached_ms.size(), 2u);
  for (double ms : r.cached_ms) EXPECT_GT(ms, 0);
  EXPECT_GT(r.cached_tokens_per_s, 0);
  EXPECT_GT(r.uncached_tokens_per_s, 0);
  EXPECT_NEAR(r.speedup, r.cached_tokens_per_s / r.uncached_tokens_per_s, 1e-9);
  const std::string line = to_json(r);
  EXPECT_EQ(line.find('\n'), std::string::npos);
  const nlohmann::json j = nlohmann::json::parse(line);
  EXPECT_EQ(j["mode"], "generate");
  EXPECT_EQ(j["tokens"], 12);
  EXPECT_EQ(j["same_tokens"], true);
}
