// `--precision bf16` (issue 26) as a user runs it: train writes it into config.json and the weights' metadata, the
// run resumes bit-identically, eval / generate / sample / predict take the run's precision or --precision, bench
// times it, and a bad value is a one-line error.

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>

#include "cli_testing.h"
#include "train/trainer.h"

namespace {

using attograd::train::TrainConfig;

constexpr const char* kSizes =
    "--d-model 16 --layers 1 --heads 2 --d-ff 32 --max-len 4 --batch 16 --eval-size 50 --schedule constant ";
const std::string kTiny = std::string(kSizes) + "--steps 20 --eval-every 10";

class CliPrecision : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!kCli) GTEST_SKIP() << "the attograd tool is not built (ATTOGRAD_BUILD_EXAMPLES=OFF)";
  }
};

TEST_F(CliPrecision, Bf16RunSavesItsPrecisionResumesAndEvaluates) {
  const std::string out = (scratch() / "bf16").string(), fp = (scratch() / "fp32").string();
  const CliRun t = attograd(std::string("train ") + kTiny + " --precision bf16 --json --out " + quote(out));
  ASSERT_EQ(t.status, 0) << t.err;
  EXPECT_NE(attograd(std::string("train ") + kTiny + " --precision bf16 --out " + quote(out + "-text"))
                .out.find("seed 1, bf16 mixed precision"),
            std::string::npos);
  EXPECT_NE(attograd("inspect " + quote(out + "/model.attograd")).out.find("bf16 mixed precision"), std::string::npos);
  const CliRun f = attograd(std::string("train ") + kTiny + " --json --out " + quote(fp));
  ASSERT_EQ(f.status, 0) << f.err;
  EXPECT_EQ(TrainConfig::from_json(slurp(out + "/config.json")).precision, "bf16");
  EXPECT_EQ(slurp(fp + "/config.json").find("precision"), std::string::npos);  // fp32 files as before
  EXPECT_FALSE(slurp(out + "/model.attograd") == slurp(fp + "/model.attograd")) << "bf16 weights == fp32 weights";
  // eval takes the run's precision: the training run's last evaluation again.
  const std::string w = out + "/model.attograd";
  const json e = last_line_json(attograd("eval --weights " + quote(w) + " --eval-size 50 --json").out);
  ASSERT_TRUE(e.is_object());
  EXPECT_EQ(e["loss"].get<double>(), last_line_json(t.out)["eval_loss"].get<double>());
  const json e32 =
      last_line_json(attograd("eval --weights " + quote(w) + " --eval-size 50 --precision fp32 --json").out);
  ASSERT_TRUE(e32.is_object());
  EXPECT_NE(e32["loss"].get<double>(), e["loss"].get<double>());
  EXPECT_NEAR(e32["loss"].get<double>(), e["loss"].get<double>(), 0.02 * e["loss"].get<double>());
  // Resuming the bf16 run to 30 steps equals a straight 30-step bf16 run (a constant schedule: the cosine's shape
  // depends on --steps).
  const std::string straight = (scratch() / "straight").string();
  ASSERT_EQ(attograd(std::string("train ") + kSizes + "--eval-every 10 --precision bf16 --steps 30 --quiet --out " +
                     quote(straight))
                .status,
            0);
  ASSERT_EQ(attograd("train --resume " + quote(out + "/checkpoint.attograd") + " --steps 30 --quiet").status, 0);
  EXPECT_TRUE(slurp(out + "/model.attograd") == slurp(straight + "/model.attograd")) << "resumed != straight";
  // Decoding in bf16 (the cache's bf16 weights) and recomputing give the same tokens.
  const CliRun g = attograd("generate --precision bf16 -w " + quote(w) + " -i '1 2 3'");
  ASSERT_EQ(g.status, 0) << g.err;
  EXPECT_EQ(attograd("generate --precision bf16 --no-kv-cache -w " + quote(w) + " -i '1 2 3'").out, g.out);
  const CliRun p = attograd("predict --precision bf16 -w " + quote(w) + " --prompt '1 2 3' --json");
  ASSERT_EQ(p.status, 0) << p.err;
}

TEST_F(CliPrecision, BenchTimesBf16) {
  const CliRun b = attograd("bench --preset small --steps 2 --warmup 1 --precision bf16");
  ASSERT_EQ(b.status, 0) << b.err;
  const json j = last_line_json(b.out);
  ASSERT_TRUE(j.is_object()) << b.out;
  EXPECT_EQ(j["precision"], "bf16");
  EXPECT_NE(b.out.find(", bf16"), std::string::npos) << b.out;
  const CliRun g = attograd("bench --generate -D 32 -H 2 -F 64 -N 1 -V 16 --tokens 8 --rounds 1 --precision bf16");
  ASSERT_EQ(g.status, 0) << g.out << g.err;
  EXPECT_EQ(last_line_json(g.out)["same_tokens"], true);
}

TEST_F(CliPrecision, BadValuesAreOneLineErrors) {
  const std::string base = std::string("train ") + kTiny + " --out " + quote((scratch() / "bad").string());
  expect_one_line_error(attograd(base + " --precision fp16"), "--precision", "train fp16");
  expect_one_line_error(attograd("bench --precision half"), "--precision", "bench half");
  const std::string out = (scratch() / "for-eval").string();
  ASSERT_EQ(attograd(std::string("train ") + kTiny + " --quiet --out " + quote(out)).status, 0);
  expect_one_line_error(attograd("eval --weights " + quote(out + "/model.attograd") + " --precision bf17"),
                        "--precision", "eval bf17");
}

}  // namespace
