// The `attograd` command-line tool, run as a user would: the built binary (path from the ATTOGRAD_CLI compile
// definition) through popen, on tiny configurations so the whole file takes seconds.

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli_testing.h"

#include "train/io/safetensors.h"
#include "train/io/serialize.h"
#include "train/trainer.h"

namespace {

constexpr const char* kTiny =
    "--steps 30 --d-model 16 --layers 1 --heads 2 --d-ff 32 --max-len 4 --batch 16 --eval-size 50 --eval-every 10";

class Cli : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    if (!kCli) return;
    run_ = new CliRun(attograd(std::string("train ") + kTiny + " --json --out " + quote((scratch() / "run").string())));
    summary_ = new json(last_line_json(run_->out));
  }
  static void TearDownTestSuite() {
    delete run_;
    delete summary_;
    run_ = nullptr;
    summary_ = nullptr;
  }
  void SetUp() override {
    if (!kCli) GTEST_SKIP() << "the attograd tool is not built (ATTOGRAD_BUILD_EXAMPLES=OFF)";
    ASSERT_EQ(run_->status, 0) << run_->out << run_->err;
    ASSERT_TRUE(summary_->is_object()) << run_->out;
  }
  static std::string dir() { return (scratch() / "run").string(); }
  static std::string weights() { return (scratch() / "run" / "model.attograd").string(); }
  static const json& summary() { return *summary_; }

  static CliRun* run_;
  static json* summary_;
};
CliRun* Cli::run_ = nullptr;
json* Cli::summary_ = nullptr;

TEST_F(Cli, TrainWritesEveryPromisedFileAndAJsonSummary) {
  const json& s = summary();
  for (const char* key : {"task", "model", "parameters", "steps", "final_loss", "eval_loss", "token_accuracy",
                          "sequence_accuracy", "eval_size", "wall_seconds", "tokens_per_second", "peak_rss_mb", "paths"})
    EXPECT_TRUE(s.contains(key)) << key;
  EXPECT_EQ(s["task"], "reverse");
  EXPECT_EQ(s["model"], "lm");
  EXPECT_EQ(s["steps"], 30);
  EXPECT_EQ(s["eval_size"], 50);
  EXPECT_GT(s["parameters"].get<int64_t>(), 0);
  EXPECT_GT(s["final_loss"].get<double>(), 0);
  EXPECT_GE(s["token_accuracy"].get<double>(), 0);
  EXPECT_LE(s["token_accuracy"].get<double>(), 1);
  EXPECT_GE(s["sequence_accuracy"].get<double>(), 0);
  EXPECT_GT(s["wall_seconds"].get<double>(), 0);
  EXPECT_GT(s["tokens_per_second"].get<double>(), 0);
  EXPECT_GT(s["peak_rss_mb"].get<double>(), 1);
  for (const char* key : {"weights", "checkpoint", "metrics", "config", "curves", "attention", "samples"}) {
    ASSERT_TRUE(s["paths"].contains(key)) << key;
    const std::string path = s["paths"][key];
    EXPECT_TRUE(fs::is_regular_file(path)) << path;
    EXPECT_GT(fs::file_size(path), 0u) << path;
  }
  EXPECT_EQ(fs::path(s["paths"]["weights"].get<std::string>()).filename(), "model.attograd");
  // Progress lines precede the JSON (stdout is not a terminal here).
  EXPECT_NE(run_->out.find("step 30/30 (100%)"), std::string::npos);

  const std::vector<std::string> csv = lines(slurp(s["paths"]["metrics"]));
  ASSERT_EQ(csv.size(), 32u);  // header, step 0 (the evaluation before the first update), one row per step
  EXPECT_EQ(csv[0].rfind("step,loss,", 0), 0u);
  EXPECT_EQ(csv[1].rfind("0,", 0), 0u);
  EXPECT_EQ(csv[2].rfind("1,", 0), 0u);
  const json cfg = json::parse(slurp(s["paths"]["config"]));
  EXPECT_EQ(cfg["steps"], 30);
  EXPECT_EQ(cfg["d_model"], 16);
  EXPECT_EQ(cfg["warmup"], 3);  // the default warm-up, scaled to a short run
  const std::string curves = slurp(s["paths"]["curves"]);
  EXPECT_NE(curves.find("<svg"), std::string::npos);
  EXPECT_NE(curves.find("data-label=\"training loss\""), std::string::npos);
  EXPECT_NE(curves.find("data-label=\"train loss (estimate)\""), std::string::npos);
  const std::string attention = slurp(s["paths"]["attention"]);
  EXPECT_NE(attention.find("class=\"cells\""), std::string::npos);
  EXPECT_EQ(std::count(attention.begin(), attention.end(), '\n') > 3, true);
  const std::string samples = slurp(s["paths"]["samples"]);
  size_t inputs = 0;
  for (const std::string& l : lines(samples)) inputs += l.rfind("input:", 0) == 0;
  EXPECT_EQ(inputs, 8u);
}

TEST_F(Cli, HumanSummaryWithoutJson) {
  const CliRun r = attograd(std::string("train ") + kTiny + " --task copy --model seq2seq --out " +
                         quote((scratch() / "copy").string()));
  ASSERT_EQ(r.status, 0) << r.err;
  for (const char* piece : {"task          copy", "model         seq2seq", "held-out      token accuracy",
                            "peak memory", "tokens/s", "model.attograd"})
    EXPECT_NE(r.out.find(piece), std::string::npos) << piece << "\n" << r.out;
  EXPECT_TRUE(fs::is_regular_file(scratch() / "copy" / "attention.svg"));
  // The encoder-decoder picture has encoder, decoder self and decoder cross rows.
  const std::string svg = slurp((scratch() / "copy" / "attention.svg").string());
  EXPECT_NE(svg.find("decoder 0 cross"), std::string::npos);
}

TEST_F(Cli, EncoderModelTrainsEvaluatesAndGenerates) {
  const std::string out = (scratch() / "encoder").string();
  const CliRun r = attograd(std::string("train ") + kTiny + " --task sort --model encoder --json --out " + quote(out));
  ASSERT_EQ(r.status, 0) << r.err;
  const json s = last_line_json(r.out);
  ASSERT_TRUE(s.is_object()) << r.out;
  EXPECT_EQ(s["model"], "encoder");
  const std::string w = quote(out + "/model.attograd");
  const json e = last_line_json(attograd("eval --weights " + w + " --json").out);
  EXPECT_EQ(e["model"], "encoder");
  EXPECT_EQ(e["token_accuracy"].get<double>(), s["token_accuracy"].get<double>());
  EXPECT_EQ(e["loss"].get<double>(), s["eval_loss"].get<double>());
  // One layer row per encoder layer in the picture; generate prints a decoded sequence.
  EXPECT_NE(slurp(out + "/attention.svg").find("layer 0"), std::string::npos);
  const CliRun g = attograd("generate --weights " + w + " --input '3 1 2'");
  EXPECT_EQ(g.status, 0) << g.err;
  EXPECT_FALSE(g.out.empty());
  // A task whose targets are not as long as their sources is refused in one line.
  expect_one_line_error(attograd(std::string("train ") + kTiny + " --task add --model encoder --out " +
                                 quote((scratch() / "enc_add").string())),
                        "aligned", "encoder on add");
}

TEST_F(Cli, EvalReproducesTheTrainingRunsAccuracy) {
  const CliRun r = attograd("eval --weights " + quote(weights()) + " --json");
  ASSERT_EQ(r.status, 0) << r.err;
  const json e = last_line_json(r.out);
  ASSERT_TRUE(e.is_object()) << r.out;
  EXPECT_EQ(e["n"], 50);
  EXPECT_EQ(e["token_accuracy"].get<double>(), summary()["token_accuracy"].get<double>());
  EXPECT_EQ(e["sequence_accuracy"].get<double>(), summary()["sequence_accuracy"].get<double>());
  EXPECT_EQ(e["loss"].get<double>(), summary()["eval_loss"].get<double>());
  // The checkpoint holds the same weights.
  const json c = last_line_json(attograd("eval --weights " + quote(dir() + "/checkpoint.attograd") + " --json").out);
  EXPECT_EQ(c["token_accuracy"].get<double>(), summary()["token_accuracy"].get<double>());
  // Another seed and size: fresh sequences.
  const json o = last_line_json(attograd("eval --weights " + quote(weights()) + " --json --seed 9 --eval-size 20").out);
  EXPECT_EQ(o["n"], 20);
  EXPECT_EQ(o["seed"], 9);
  // Without the key/value cache: the same decoded sequences, so the same accuracies (the loss does not decode).
  const json u = last_line_json(
      attograd("eval --weights " + quote(weights()) + " --json --seed 9 --eval-size 20 --no-kv-cache").out);
  EXPECT_EQ(u["token_accuracy"].get<double>(), o["token_accuracy"].get<double>());
  EXPECT_EQ(u["sequence_accuracy"].get<double>(), o["sequence_accuracy"].get<double>());
  EXPECT_EQ(u["loss"].get<double>(), o["loss"].get<double>());
  // Human-readable form.
  const CliRun h = attograd("eval --weights " + quote(weights()));
  EXPECT_EQ(h.status, 0);
  EXPECT_NE(h.out.find("sequence accuracy"), std::string::npos);
}

TEST_F(Cli, GenerateReproducesTheSamplePredictions) {
  const std::vector<std::string> l = lines(slurp(dir() + "/samples.txt"));
  int checked = 0;
  for (size_t i = 0; i + 2 < l.size() && checked < 4; ++i) {
    if (l[i].rfind("input:", 0) != 0) continue;
    const std::string input = l[i].substr(l[i].find_first_not_of(' ', 6));
    std::string pred = l[i + 2].substr(12);
    if (pred == "(nothing)") pred.clear();
    const CliRun r = attograd("generate --weights " + quote(weights()) + " --input " + quote(input));
    ASSERT_EQ(r.status, 0) << r.err;
    EXPECT_EQ(r.out, pred + "\n") << "input " << input;
    // The key/value cache (the default) and --no-kv-cache (recomputing every step) decode the same.
    const CliRun u = attograd("generate --no-kv-cache --weights " + quote(weights()) + " --input " + quote(input));
    ASSERT_EQ(u.status, 0) << u.err;
    EXPECT_EQ(u.out, r.out) << "input " << input;
    ++checked;
  }
  EXPECT_EQ(checked, 4);
  const std::string svg = (scratch() / "gen_attention.svg").string();
  const CliRun r = attograd("generate -w " + quote(weights()) + " -i '1 2 3' --attention " + quote(svg));
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_NE(slurp(svg).find("class=\"cells\""), std::string::npos);
}

TEST_F(Cli, InspectListsTheFileAndReportsCorruption) {
  const CliRun r = attograd("inspect " + quote(weights()));
  ASSERT_EQ(r.status, 0) << r.err;
  for (const char* piece : {"kind        weights, format version 1", "OK", "\"task\": \"reverse\"", "embed.weight",
                            "float32", "[15, 16]"})
    EXPECT_NE(r.out.find(piece), std::string::npos) << piece << "\n" << r.out;
  // The human summary comes first: a built-in task's run.
  EXPECT_EQ(r.out.rfind("model       lm, ", 0), 0u) << r.out;
  for (const char* piece : {"\nvocabulary  15 tokens\n", "\ndata        the built-in reverse task\n",
                            "\nsteps       30 (configured)\n", "\nlengths     1-4, 10 symbols\n"})
    EXPECT_NE(r.out.find(piece), std::string::npos) << piece << "\n" << r.out;
  EXPECT_NE(r.out.find("\"min_len\": 1"), std::string::npos) << r.out;  // a toy task keeps its fields
  char val[64];
  std::snprintf(val, sizeof val, "\nval loss    %.4f at step 30", (*summary_)["eval_loss"].get<double>());
  EXPECT_NE(r.out.find(val), std::string::npos) << val << "\n" << r.out;
  const CliRun ck = attograd("inspect " + quote(dir() + "/checkpoint.attograd"));
  EXPECT_NE(ck.out.find("\nsteps       30 of 30\n"), std::string::npos) << ck.out;
  EXPECT_NE(ck.out.find("(from the checkpoint's log)"), std::string::npos) << ck.out;
  const json j = last_line_json(attograd("inspect --json " + quote(dir() + "/checkpoint.attograd")).out);
  ASSERT_TRUE(j.is_object());
  EXPECT_EQ(j["kind"], "checkpoint");
  EXPECT_TRUE(j["checksum"]["ok"].get<bool>());
  EXPECT_EQ(j["counters"]["step"], 30);

  // One flipped byte in the middle of the data.
  const std::string bad = (scratch() / "corrupt.attograd").string();
  std::string bytes = slurp(weights());
  bytes[bytes.size() / 2] = static_cast<char>(bytes[bytes.size() / 2] ^ 0x20);
  std::ofstream(bad, std::ios::binary) << bytes;
  const CliRun c = attograd("inspect " + quote(bad));
  expect_one_line_error(c, "corrupt", "inspect of a flipped byte");
  EXPECT_NE(c.out.find("MISMATCH"), std::string::npos);
  // A truncated file is unreadable.
  const std::string cut = (scratch() / "truncated.attograd").string();
  std::ofstream(cut, std::ios::binary) << bytes.substr(0, 20);
  expect_one_line_error(attograd("inspect " + quote(cut)), "inspect", "inspect of a truncated file");
}

TEST_F(Cli, GradcheckWithNoArgumentsChecksEveryOpAndModule) {
  const CliRun r = attograd("gradcheck");
  EXPECT_EQ(r.status, 0) << r.out << r.err;
  for (const char* name :
       {"add", "sub", "mul", "div", "exp", "log", "sqrt", "pow", "tanh", "sigmoid", "relu", "gelu", "matmul", "linear",
        "transpose", "reshape", "slice", "cat", "stack", "split", "sum", "mean", "max", "softmax", "log_softmax",
        "masked_fill", "where", "dropout", "embedding", "layer_norm", "cross_entropy", "mse_loss",
        "scaled_dot_product_attention", "scaled_dot_product_attention.gqa", "scaled_dot_product_attention.window",
        "scaled_dot_product_attention.block_sparse", "scaled_dot_product_attention.entropy", "Linear", "Embedding",
        "LayerNorm", "Dropout", "PositionwiseFeedForward", "MultiheadAttention", "MultiheadAttention.variants",
        "seed::AttentionSublayer", "TransformerEncoderLayer", "TransformerDecoderLayer", "CausalLM",
        "seed::Transformer", "apply_rotary_emb", "linear_attention", "checkpoint", "RotaryEmbedding",
        "LinearAttention", "Checkpointed", "MultiHeadLatentAttention", "CausalLM.mla",
        "CausalLM.linear"}) {
    bool found = false;
    for (const std::string& l : lines(r.out)) found = found || l.rfind(std::string(name) + " ", 0) == 0;
    EXPECT_TRUE(found) << name;
  }
  EXPECT_NE(r.out.find("103 of 103 checks passed"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("FAIL"), std::string::npos);
}

TEST_F(Cli, GradcheckOneModuleWithAMask) {
  const CliRun r = attograd("gradcheck --module mha --mask causal");
  EXPECT_EQ(r.status, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("MultiheadAttention"), std::string::npos);
  EXPECT_NE(r.out.find("mask=causal"), std::string::npos);
  EXPECT_NE(r.out.find("1 of 1 checks passed"), std::string::npos);
  const json j = last_line_json(
      attograd("gradcheck --module mha --heads 2 --d-model 8 --len 5 --mask padding --dropout 0.1 --dtype float32 --json")
          .out);
  ASSERT_TRUE(j.is_object());
  EXPECT_EQ(j["dtype"], "float32");
  EXPECT_EQ(j["eps"], 1e-3);
  EXPECT_EQ(j["checks"].size(), 1u);
  EXPECT_TRUE(j["checks"][0]["passed"].get<bool>()) << j.dump();
  // A failing check (impossible tolerances) exits 1.
  EXPECT_EQ(attograd("gradcheck --module add --atol 1e-300 --rtol 1e-300").status, 1);
}

TEST_F(Cli, ExportImportRoundTripKeepsTheAccuracy) {
  const std::string st = (scratch() / "model.safetensors").string();
  const CliRun e = attograd("export --weights " + quote(weights()) + " --to " + quote(st));
  ASSERT_EQ(e.status, 0) << e.err;
  const json info = last_line_json(attograd("inspect --json " + quote(st)).out);
  EXPECT_EQ(info["kind"], "safetensors");
  const std::string back = (scratch() / "imported.attograd").string();
  const CliRun i = attograd("import --from " + quote(st) + " --config " + quote(dir() + "/config.json") + " --to " +
                         quote(back));
  ASSERT_EQ(i.status, 0) << i.err;
  const json a = last_line_json(attograd("eval --weights " + quote(back) + " --json").out);
  EXPECT_EQ(a["token_accuracy"].get<double>(), summary()["token_accuracy"].get<double>());
  EXPECT_EQ(a["sequence_accuracy"].get<double>(), summary()["sequence_accuracy"].get<double>());
  // Without --config, the configuration stored in the safetensors metadata is used.
  const std::string back2 = (scratch() / "imported2.attograd").string();
  ASSERT_EQ(attograd("import --from " + quote(st) + " --to " + quote(back2)).status, 0);
  EXPECT_EQ(slurp(back2), slurp(back));
}

TEST_F(Cli, ResumeContinuesTheRun) {
  const std::string out = (scratch() / "resumed").string();
  const CliRun r = attograd("train --resume " + quote(dir() + "/checkpoint.attograd") + " --steps 35 --json --out " +
                         quote(out));
  ASSERT_EQ(r.status, 0) << r.err;
  const json s = last_line_json(r.out);
  EXPECT_EQ(s["steps"], 35);
  EXPECT_EQ(lines(slurp(out + "/metrics.csv")).size(), 37u);  // the header, step 0 (the first evaluation), 35 steps
}

TEST_F(Cli, EveryErrorIsOneLineAndExitStatusTwo) {
  const std::string w = quote(weights());
  expect_one_line_error(attograd("train --bogus"), "--bogus", "unknown flag");
  expect_one_line_error(attograd("train --steps abc"), "abc", "non-numeric value");
  expect_one_line_error(attograd("train --model rnn"), "rnn", "bad choice");
  expect_one_line_error(attograd("frobnicate"), "frobnicate", "unknown subcommand");
  expect_one_line_error(attograd("eval"), "--weights", "missing required flag");
  expect_one_line_error(attograd("eval --weights /nonexistent/model.attograd"), "/nonexistent", "missing file");
  expect_one_line_error(attograd("inspect /nonexistent/x"), "/nonexistent", "missing file");
  expect_one_line_error(attograd(std::string("train ") + kTiny + " --heads 3 --out " + quote((scratch() / "x").string())),
                        "heads", "invalid configuration");
  const std::string bad_json = (scratch() / "bad.json").string();
  std::ofstream(bad_json) << "{\"steps\": 10, \"colour\": 3}";
  expect_one_line_error(attograd("train --config " + quote(bad_json)), "colour", "unknown config field");
  expect_one_line_error(attograd("generate --weights " + w + " --input '1 x 3'"), "x", "bad input symbol");
  expect_one_line_error(attograd("gradcheck --module nope"), "nope", "unknown check");
  expect_one_line_error(attograd("gradcheck --dtype float16"), "float16", "bad dtype");
  expect_one_line_error(attograd("eval --weights " + w + " --eval-size 0"), "--eval-size", "bad eval size");
  expect_one_line_error(attograd("import --from " + w + " --to " + quote((scratch() / "y.attograd").string())),
                        "not a safetensors file", "importing a non-safetensors file");

  // A corrupt weights file: every command that reads it refuses with one line.
  const std::string bad = (scratch() / "corrupt2.attograd").string();
  std::string bytes = slurp(weights());
  bytes[bytes.size() - 100] = static_cast<char>(bytes[bytes.size() - 100] ^ 1);
  std::ofstream(bad, std::ios::binary) << bytes;
  expect_one_line_error(attograd("eval --weights " + quote(bad)), "corrupt", "eval of a corrupt file");
  expect_one_line_error(attograd("generate --weights " + quote(bad) + " --input '1 2'"), "corrupt",
                        "generate of a corrupt file");
  expect_one_line_error(attograd("export --weights " + quote(bad) + " --to " + quote((scratch() / "z").string())),
                        "corrupt", "export of a corrupt file");
  // Not an attograd file at all.
  const std::string text = (scratch() / "text.attograd").string();
  std::ofstream(text) << "hello, world";
  expect_one_line_error(attograd("eval --weights " + quote(text)), "neither", "eval of a text file");
}

TEST_F(Cli, HelpHasAnExampleForEveryCommand) {
  for (const char* cmd : {"train", "eval", "generate", "gradcheck", "inspect", "export", "import"}) {
    const CliRun r = attograd(std::string(cmd) + " --help");
    EXPECT_EQ(r.status, 0) << cmd;
    EXPECT_NE(r.out.find("Example"), std::string::npos) << cmd;
    EXPECT_NE(r.out.find(std::string("attograd ") + cmd), std::string::npos) << cmd;
  }
  const CliRun top = attograd("--help");
  EXPECT_EQ(top.status, 0);
  EXPECT_NE(top.out.find("gradcheck"), std::string::npos);
}


// ---------------------------------------------------------------------------------------------
// Hostile inputs (issue 14): each class ends in one line and exit status 2, quickly and in bounded memory.

// The run's weights as safetensors (with the config in the metadata), exported once.
std::string safetensors() {
  static const std::string path = [] {
    const std::string p = (scratch() / "hostile_model.safetensors").string();
    const CliRun r = attograd("export --weights " + quote((scratch() / "run" / "model.attograd").string()) +
                              " --to " + quote(p));
    EXPECT_EQ(r.status, 0) << r.err;
    return p;
  }();
  return path;
}

TEST_F(Cli, HostileSizesAreRejectedBeforeAnythingIsBuilt) {
  const std::string out = " --out " + quote((scratch() / "hostile").string());
  expect_one_line_error(attograd("train --d-ff 4611686018427387904" + out), "--d-ff", "d_ff 2^62 (was a segfault)");
  expect_one_line_error(attograd("train --d-model 4611686018427387904" + out), "--d-model", "d_model 2^62");
  expect_one_line_error(attograd("train --batch 99999999999999999999" + out), "--batch", "batch beyond int64");
  // Within the flags' limits but far beyond any machine: the memory estimate says so up front.
  expect_one_line_error(
      attograd("train --d-model 1000000 --heads 1 --d-ff 1000000 --layers 1000" + out), "the run needs at least",
      "model too big for memory");
  expect_one_line_error(attograd("train --batch 1000000 --max-len 256" + out), "for a batch of 1000000 sequences",
                        "batch too big for memory");
  // The same sizes in a config file.
  const std::string cfg = (scratch() / "huge.json").string();
  std::ofstream(cfg) << "{\"d_ff\": 4611686018427387904}";
  expect_one_line_error(attograd("train --config " + quote(cfg) + out), "d_ff must be at most", "config d_ff 2^62");

  // A small, checksummed weights file whose metadata asks for a big model (or impossible sizes): refused before
  // the model is built.
  ::attograd::train::TrainConfig big;
  big.d_model = 4096;
  big.heads = 4;
  big.d_ff = 65536;
  big.layers = 8;
  const std::string small_big = (scratch() / "small_big.attograd").string();
  ::attograd::io::write_tensors(small_big, {{"x", ::attograd::zeros({2})}}, big.to_json());
  for (const char* cmd : {"eval --weights ", "export --to /dev/null --weights "})
    expect_one_line_error(attograd(cmd + quote(small_big)), "at least 4831899648 parameters, but the file holds only 2",
                          std::string(cmd) + "of a file whose metadata asks for a big model");
  expect_one_line_error(attograd("generate --input '1 2' --weights " + quote(small_big)), "does not match",
                        "generate of a big-metadata file");
  ::attograd::train::TrainConfig impossible;
  impossible.d_ff = int64_t{1} << 62;
  const std::string overflow = (scratch() / "overflow.attograd").string();
  ::attograd::io::write_tensors(overflow, {{"x", ::attograd::zeros({2})}}, impossible.to_json());
  expect_one_line_error(attograd("eval --weights " + quote(overflow)), "d_ff must be at most",
                        "eval of a file with sizes that overflow (was a crash)");
}

TEST_F(Cli, OutOfMemoryIsAnErrorSayingHowMuch) {
#if defined(__has_feature)
#if __has_feature(address_sanitizer)
#define ATTOGRAD_TEST_ASAN 1
#endif
#endif
#if defined(__SANITIZE_ADDRESS__) || defined(ATTOGRAD_TEST_ASAN)
  GTEST_SKIP() << "an address-space limit and AddressSanitizer's shadow memory do not mix";
#else
  // 1.5 GB of address space: the memory estimate (a lower bound) passes, the first training step cannot allocate
  // its activations.
  // It was `terminate called after throwing std::bad_alloc` (exit 134); now one line, naming the bytes.
  const CliRun r = attograd("train --batch 9000 --steps 2 --quiet --out " + quote((scratch() / "oom").string()),
                            "ulimit -v 1500000; ");
  expect_one_line_error(r, "out of memory allocating", "out of memory in a training step");
  // Held-out examples beyond memory: said up front (was std::bad_alloc).
  expect_one_line_error(attograd("eval --eval-size 100000000 --weights " + quote(weights()), "ulimit -v 1500000; "),
                        "100000000 held-out examples need about", "eval --eval-size 10^8");
#endif
}

TEST_F(Cli, DeeplyNestedJsonIsRejected) {
  const std::string deep = (scratch() / "deep.json").string();
  std::ofstream(deep) << std::string(80000, '[') << std::string(80000, ']');
  expect_one_line_error(attograd("train --config " + quote(deep)), "nested 80000 levels deep",
                        "80,000 levels in --config (was a stack overflow)");
  expect_one_line_error(
      attograd("import --from " + quote(safetensors()) + " --config " + quote(deep) + " --to " +
               quote((scratch() / "never.attograd").string())),
      "levels deep", "80,000 levels in import --config");
  // A huge value is cut in the message.
  const std::string huge = (scratch() / "huge_value.json").string();
  std::ofstream(huge) << "{\"task\": [\"" << std::string(500000, 'x') << "\"]}";
  const CliRun r = attograd("train --config " + quote(huge));
  expect_one_line_error(r, "field \"task\" must be a string", "a huge value in --config");
  EXPECT_LT(r.err.size(), 400u);
  // A config file larger than the cap, and an endless one.
  const std::string big = (scratch() / "big.json").string();
  std::ofstream(big) << "{\"steps\": 1" << std::string(2 << 20, ' ') << "}";
  expect_one_line_error(attograd("train --config " + quote(big)), "more than the cap", "a 2 MB --config");
  expect_one_line_error(attograd("train --config /dev/zero"), "not a regular file", "--config /dev/zero");
}

TEST_F(Cli, AFifoAsAnyInputFileFailsAtOnce) {
  const std::string fifo = (scratch() / "pipe").string();
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  const std::string f = quote(fifo), to = quote((scratch() / "fifo_out").string());
  for (const std::string& args :
       {"inspect " + f, "eval --weights " + f, "generate --input '1 2' --weights " + f, "export --to " + to +
        " --weights " + f, "import --to " + to + " --from " + f, "train --resume " + f, "train --config " + f,
        "import --from " + quote(safetensors()) + " --to " + to + " --config " + f})
    expect_one_line_error(attograd(args), "FIFO", args);  // each under `timeout`: a hang fails, never blocks
}

TEST_F(Cli, AnExistingFifoAsAnOutputIsRefusedNotReplaced) {
  // --attention FILE names where the picture goes: a FIFO (any existing non-regular file) there is refused with one
  // line and left as it is, never silently swapped for a regular file.
  const std::string fifo = (scratch() / "out_pipe").string();
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  expect_one_line_error(attograd("generate --input '1 2' --weights " + quote(weights()) + " --attention " + quote(fifo)),
                        "not a regular file (a FIFO)", "--attention FIFO");
  struct stat st;
  ASSERT_EQ(::stat(fifo.c_str(), &st), 0);
  EXPECT_TRUE(S_ISFIFO(st.st_mode));
}

TEST_F(Cli, GarbageValuesAreRejected) {
  for (const char* flag : {"--eps 0", "--eps -1", "--eps nan", "--atol nan", "--atol inf", "--rtol -1", "--rtol nan"})
    expect_one_line_error(attograd(std::string("gradcheck ") + flag), "not a positive finite number", flag);
  expect_one_line_error(attograd("train --seed -1"), "--seed", "negative seed (was 2^64-1)");
  expect_one_line_error(attograd("train --seed 18446744073709551616"), "--seed", "seed 2^64 (was clamped)");
  expect_one_line_error(attograd("eval --seed -1 --weights " + quote(weights())), "--seed", "eval --seed -1");
  expect_one_line_error(attograd("gradcheck --seed -5"), "--seed", "gradcheck --seed -5");
  expect_one_line_error(attograd("train --steps 99999999999999999999"), "--steps", "steps beyond int64");
  expect_one_line_error(attograd("train --steps 1000000001"), "--steps", "steps above the maximum");
  expect_one_line_error(attograd("train --threads 100000"), "expected an integer in [1, 1024]", "--threads 100000");
  expect_one_line_error(attograd("generate --input '+' --weights " + quote(weights())), "'+' is not a symbol",
                        "'+' on a reverse model");
  expect_one_line_error(attograd("generate --input '1 + 2' --weights " + quote(weights())), "reverse task",
                        "'+' inside an input");
}

TEST_F(Cli, NonFiniteWeightsAreRefusedAndInspectListsThemOnRequest) {
  // Issue 27: a weights file holding NaN evaluated with loss NaN and exit 0 and generated "<pad> <pad> ...".
  std::string meta;
  attograd::io::NamedTensors t = attograd::io::read_tensors(weights(), &meta);
  ASSERT_GE(t.size(), 2u);
  const std::string name = t[1].first;
  t[1].second.data<float>()[0] = std::numeric_limits<float>::quiet_NaN();
  t[1].second.data<float>()[1] = -std::numeric_limits<float>::infinity();
  const std::string bad = (scratch() / "nan.attograd").string(), st = (scratch() / "nan.safetensors").string();
  attograd::io::write_tensors(bad, t, meta);
  ASSERT_EQ(attograd("export -w " + quote(weights()) + " --to " + quote(st)).status, 0);
  attograd::io::write_safetensors(st, t, attograd::io::read_safetensors(st).metadata);  // the same config
  const std::string b = quote(bad), to = quote((scratch() / "nan-out").string());
  const std::string holds = "tensor '" + name + "' holds 2 non-finite values";
  for (const std::string& args : {"eval -w " + b, "generate -w " + b + " -i '1 2'", "export -w " + b + " --to " + to,
                                  "import --from " + quote(st) + " --to " + to, "eval -w " + quote(st)})
    expect_one_line_error(attograd(args), holds, args);
  EXPECT_FALSE(fs::exists(scratch() / "nan-out"));
  // inspect lists and counts them, then refuses (exit 2) unless asked to allow them.
  for (const std::string& f : {b, quote(st)}) {
    const CliRun i = attograd("inspect " + f);
    expect_one_line_error(i, "tensor '" + name + "' holds 2 NaN or infinite values", "inspect " + f);
    EXPECT_NE(i.out.find("2 NaN or infinite values"), std::string::npos) << i.out;
    EXPECT_NE(i.err.find("--allow-nonfinite"), std::string::npos) << i.err;
    const CliRun ok = attograd("inspect --allow-nonfinite " + f);
    EXPECT_EQ(ok.status, 0) << ok.err;
    EXPECT_EQ(ok.out, i.out);
    const json j = last_line_json(attograd("inspect --json --allow-nonfinite " + f).out);
    int64_t total = 0;
    for (const json& e : j["tensors"]) total += e["nonfinite"].get<int64_t>();
    EXPECT_EQ(total, 2) << j.dump();
  }
  // A finite file's listing is unchanged, and no tensor counts any.
  const CliRun good = attograd("inspect --json " + quote(weights()));
  ASSERT_EQ(good.status, 0) << good.err;
  const json listing = last_line_json(good.out);  // held: a range-for over a temporary's member would dangle
  for (const json& e : listing["tensors"]) EXPECT_EQ(e["nonfinite"], 0);
  EXPECT_EQ(attograd("inspect " + quote(weights())).out.find("NaN"), std::string::npos);
  // A checkpoint whose optimizer state went NaN cannot be resumed.
  attograd::io::Checkpoint ck = attograd::io::load_checkpoint(dir() + "/checkpoint.attograd");
  for (auto& [n, v] : ck.tensors)
    if (n.rfind("optim.", 0) == 0 && v.dtype() == attograd::kFloat32 && v.numel() > 0) {
      v.data<float>()[0] = std::numeric_limits<float>::infinity();
      const std::string ckp = (scratch() / "nan-ck.attograd").string();
      attograd::io::save_checkpoint(ck, ckp);
      expect_one_line_error(attograd("train --resume " + quote(ckp) + " --steps 40"),
                            "tensor '" + n + "' holds 1 non-finite value", "resume a NaN checkpoint");
      break;
    }
}

TEST_F(Cli, WorkThatNeverEndsIsBounded) {
  expect_one_line_error(attograd("train --max-len 100000"), "[1, 256]", "--max-len 100000 (cubic decoding)");
  expect_one_line_error(attograd("gradcheck --len 100000"), "[1, 16]", "gradcheck --len 100000");
  expect_one_line_error(attograd("gradcheck --d-model 4096"), "--d-model", "gradcheck --d-model 4096");
  EXPECT_NE(attograd("train --help").out.find("max-len^3"), std::string::npos);
  EXPECT_NE(attograd("gradcheck --help").out.find("at most 16"), std::string::npos);
}

TEST_F(Cli, TextOutputsAreWrittenAtomically) {
  // Every output of a run is in place, and no temporary file is left (they are renamed over their targets).
  for (const auto& e : fs::directory_iterator(dir()))
    EXPECT_EQ(e.path().filename().string().find(".tmp-"), std::string::npos) << e.path();
  // The stale temporaries of a killed run are removed by the next save of the same files.
  const std::string out = (scratch() / "atomic").string();
  fs::create_directories(out);
  for (const char* name : {"config.json", "metrics.csv", "curves.svg", "model.attograd"})
    std::ofstream(out + "/" + name + ".tmp-K1lled") << "partial";
  std::ofstream(out + "/notes.txt.tmp-K1lled") << "not ours";
  const CliRun r = attograd("train --steps 2 --d-model 16 --layers 1 --heads 2 --d-ff 32 --max-len 4 --batch 16 "
                            "--eval-size 20 --samples 2 --quiet --out " + quote(out));
  ASSERT_EQ(r.status, 0) << r.err;
  std::vector<std::string> left;
  for (const auto& e : fs::directory_iterator(out))
    if (e.path().filename().string().find(".tmp-") != std::string::npos) left.push_back(e.path().filename());
  EXPECT_EQ(left, (std::vector<std::string>{"notes.txt.tmp-K1lled"}));
  EXPECT_EQ(slurp(out + "/config.json").substr(0, 1), "{");
}

// ---- The attention variants (issue 16): every kind trains, then eval, generate, sample, export and import work on
// its weights with no flag (the configuration saved with them carries the variant).

struct Variant {
  const char* name;
  const char* flags;
};
constexpr Variant kVariants[] = {
    {"gqa", "--attention gqa --kv-heads 1"},
    {"mla", "--attention mla --kv-rank 6 --q-rank 8"},
    {"local", "--attention local --window 3"},
    {"block-sparse", "--attention block-sparse --block 2"},
    {"linear", "--attention linear"},
    {"rope", "--rope"},
    {"checkpoint", "--checkpoint-activations"},
    {"entropy", "--entropy-reg 0.01"},
    {"prefix-lm", "--attention prefix-lm"},
    {"document", "--attention document"},
};

TEST_F(Cli, EveryAttentionVariantTrainsAndItsWeightsWorkEverywhere) {
  for (const Variant& v : kVariants) {
    SCOPED_TRACE(v.name);
    const std::string out = (scratch() / (std::string("variant-") + v.name)).string();
    const CliRun t = attograd(std::string("train ") + kTiny + " " + v.flags + " --json --out " + quote(out));
    ASSERT_EQ(t.status, 0) << t.out << t.err;
    const json s = last_line_json(t.out);
    ASSERT_TRUE(s.is_object()) << t.out;
    const std::string w = out + "/model.attograd";
    const attograd::train::TrainConfig saved = attograd::train::TrainConfig::from_json(slurp(out + "/config.json"));
    if (std::string(v.name) != "rope" && std::string(v.name) != "checkpoint" && std::string(v.name) != "entropy") {
      EXPECT_EQ(s["attention"], v.name);
      EXPECT_EQ(saved.attention, v.name);
    }
    EXPECT_EQ(saved.rope, std::string(v.name) == "rope");
    EXPECT_EQ(saved.checkpoint_activations, std::string(v.name) == "checkpoint");
    EXPECT_NE(t.out.find("attention:"), std::string::npos) << t.out;  // the header line names the variant
    // eval: the training run's final evaluation, from the weights alone.
    const json e = last_line_json(attograd("eval --weights " + quote(w) + " --eval-size 50 --json").out);
    ASSERT_TRUE(e.is_object());
    EXPECT_EQ(e["token_accuracy"].get<double>(), s["token_accuracy"].get<double>());
    // generate: the same with and without the key/value cache.
    const CliRun g = attograd("generate -w " + quote(w) + " -i '1 2 3'");
    ASSERT_EQ(g.status, 0) << g.err;
    EXPECT_EQ(attograd("generate --no-kv-cache -w " + quote(w) + " -i '1 2 3'").out, g.out);
    const CliRun smp = attograd("sample -w " + quote(w) + " -p '1 2' -n 5 --seed 3");
    EXPECT_EQ(smp.status, 0) << smp.err;
    // inspect names the variant.
    const CliRun in = attograd("inspect " + quote(w));
    EXPECT_NE(in.out.find("attention   "), std::string::npos) << in.out;
    // export / import round trip: the safetensors metadata keeps the configuration, import rebuilds the module tree.
    const std::string st = out + "/model.safetensors", back = out + "/imported.attograd";
    ASSERT_EQ(attograd("export -w " + quote(w) + " --to " + quote(st)).status, 0);
    const CliRun i = attograd("import --from " + quote(st) + " --to " + quote(back));
    ASSERT_EQ(i.status, 0) << i.err;
    const json a = last_line_json(attograd("eval --weights " + quote(back) + " --eval-size 50 --json").out);
    EXPECT_EQ(a["token_accuracy"].get<double>(), s["token_accuracy"].get<double>());
    EXPECT_EQ(attograd::train::TrainConfig::from_json(slurp(out + "/config.json")), saved);
    EXPECT_EQ(attograd("generate -w " + quote(back) + " -i '1 2 3'").out, g.out);
  }
}

TEST_F(Cli, AttentionFlagsThatDoNotApplyAreOneLineErrors) {
  const std::string base = std::string("train ") + kTiny + " --out " + quote((scratch() / "bad").string());
  expect_one_line_error(attograd(base + " --window 4"), "window applies to attention local, not mha", "window/mha");
  expect_one_line_error(attograd(base + " --attention gqa --kv-heads 4"), "kv_heads", "kv-heads > heads");
  expect_one_line_error(attograd(base + " --attention gqa"), "--kv-heads", "gqa without kv-heads");
  expect_one_line_error(attograd(base + " --attention local --block 2 --window 2"), "block applies to attention",
                        "block with local");
  expect_one_line_error(attograd(base + " --attention mla --kv-heads 1"), "kv_heads applies to attention gqa",
                        "kv-heads with mla");
  expect_one_line_error(attograd(base + " --attention linear --rope"), "rope applies to softmax attention",
                        "rope with linear");
  expect_one_line_error(attograd(base + " --attention linear --entropy-reg 0.01"),
                        "model \"lm\" with attention \"linear\"", "entropy-reg with linear");
  expect_one_line_error(attograd(base + " --attention flash"), "--attention", "unknown kind");
  expect_one_line_error(attograd("bench --attention local --steps 1"), "window", "bench local without window");
  expect_one_line_error(attograd("bench --preset long -L 100000000 --steps 1"), "GB available", "bench L too long");
}

TEST_F(Cli, ConfigFilesCarryTheAttentionAndEntropyColumnsAppearOnlyWhenTracked) {
  const std::string cfg = (scratch() / "gqa.json").string();
  attograd::train::TrainConfig c;
  c.steps = 10, c.d_model = 16, c.heads = 2, c.d_ff = 32, c.layers = 2, c.max_len = 4, c.batch = 8, c.eval_size = 20;
  c.warmup = 1;
  c.attention = "gqa", c.kv_heads = 1, c.log_entropy = true;
  std::ofstream(cfg) << c.to_json();
  const std::string out = (scratch() / "from-config").string();
  const CliRun t = attograd("train --config " + quote(cfg) + " --json --out " + quote(out));
  ASSERT_EQ(t.status, 0) << t.err;
  EXPECT_EQ(attograd::train::TrainConfig::from_json(slurp(out + "/config.json")).kv_heads, 1);
  const std::string header = lines(slurp(out + "/metrics.csv")).at(0);
  EXPECT_NE(header.find(",entropy,entropy.layer0.h0,entropy.layer0.h1,entropy.layer1.h0,entropy.layer1.h1"),
            std::string::npos)
      << header;
  EXPECT_GT(last_line_json(t.out)["entropy"].get<double>(), 0);
  // The default run: no entropy columns, and its config.json has none of the new fields.
  EXPECT_EQ(lines(slurp(dir() + "/metrics.csv")).at(0).find("entropy"), std::string::npos);
  EXPECT_EQ(slurp(dir() + "/config.json").find("attention"), std::string::npos);
}

TEST_F(Cli, BenchTakesTheVariantFlags) {
  const CliRun r = attograd("bench --preset long -L 256 -B 1 --attention local --window 16 --steps 1 --warmup 0");
  ASSERT_EQ(r.status, 0) << r.err;
  const json j = last_line_json(r.out);
  EXPECT_EQ(j["L"], 256);
  EXPECT_EQ(j["B"], 1);
  EXPECT_EQ(j["attention"]["kind"], "local");
  EXPECT_EQ(j["attention"]["window"], 16);
  EXPECT_EQ(j["kv_cache_bytes_per_token"], 2 * 2 * 128 * 4);  // N=2 layers, K and V of D=128 floats
  EXPECT_GT(j["peak_tensor_mb"].get<double>(), j["state_mb"].get<double>());
  const CliRun g = attograd("bench --generate -D 32 -F 64 -N 2 --tokens 8 --rounds 1 --attention mla --kv-rank 8");
  ASSERT_EQ(g.status, 0) << g.err;
  const json k = last_line_json(g.out);
  EXPECT_EQ(k["attention"]["kind"], "mla");
  EXPECT_EQ(k["kv_cache_bytes_per_token"], 2 * (8 + 4) * 4);  // latent 8 + RoPE key (head 8 / 2) per layer
  EXPECT_TRUE(k["same_tokens"].get<bool>());
  // Without a variant the JSON has no attention keys (bench/compare's files stay as they were).
  const json d = last_line_json(attograd("bench --preset small --steps 1 --warmup 0").out);
  EXPECT_FALSE(d.contains("attention"));
}

TEST_F(Cli, OptimizerFlagsReachTheRunAndBadValuesAreOneLineErrors) {
  const std::string out = (scratch() / "nanogpt-optim").string();
  const CliRun r = attograd(
      std::string("train ") + kTiny + " --lr 1e-3 --beta2 0.95 --adam-eps 1e-8 --weight-decay 0.1 " +
      "--decay matrices --min-lr 1e-4 --warmup 4 --decay-steps 20 --warmup-style nanogpt --json --out " + quote(out));
  ASSERT_EQ(r.status, 0) << r.err;
  const attograd::train::TrainConfig c = attograd::train::TrainConfig::from_json(slurp(out + "/config.json"));
  EXPECT_EQ(c.beta2, 0.95);
  EXPECT_EQ(c.adam_eps, 1e-8);
  EXPECT_EQ(c.decay, "matrices");
  EXPECT_EQ(c.min_lr, 1e-4);
  EXPECT_EQ(c.decay_steps, 20);
  EXPECT_EQ(c.warmup_style, "nanogpt");
  // metrics.csv: the first step's lr is lr / (warmup + 1) (nanoGPT's), and min-lr from step 21 on.
  const std::vector<std::string> rows = lines(slurp(out + "/metrics.csv"));
  ASSERT_EQ(rows.size(), 32u);  // the header, step 0 (the evaluation before the first update), 30 steps
  auto lr_of = [&](size_t step) {  // the third column
    std::stringstream row(rows.at(step + 1));
    std::string field;
    for (int i = 0; i < 3; ++i) std::getline(row, field, ',');
    return std::stod(field);
  };
  EXPECT_EQ(lr_of(1), 1e-3 * 1 / 5);
  EXPECT_EQ(lr_of(22), 1e-4);
  EXPECT_EQ(lr_of(30), 1e-4);
  // Resuming keeps the groups and the schedule.
  const CliRun resumed = attograd("train --resume " + quote(out + "/checkpoint.attograd") +
                                  " --steps 32 --json --out " + quote(out + "-resumed"));
  ASSERT_EQ(resumed.status, 0) << resumed.err;
  EXPECT_EQ(last_line_json(resumed.out)["steps"], 32);
  // The default run's config.json has none of the fields.
  EXPECT_EQ(slurp(dir() + "/config.json").find("beta"), std::string::npos);
  EXPECT_EQ(slurp(dir() + "/config.json").find("warmup_style"), std::string::npos);
  const std::string base = std::string("train ") + kTiny + " --out " + quote((scratch() / "bad-optim").string());
  expect_one_line_error(attograd(base + " --beta1 1"), "beta1 (--beta1) must be in [0, 1), got 1", "beta1 = 1");
  expect_one_line_error(attograd(base + " --beta2 -0.5"), "beta2 (--beta2)", "negative beta2");
  expect_one_line_error(attograd(base + " --adam-eps 0"), "adam_eps (--adam-eps) must be > 0", "eps 0");
  expect_one_line_error(attograd(base + " --min-lr 1"), "min_lr (--min-lr) must be in [0, lr]", "min-lr > lr");
  expect_one_line_error(attograd(base + " --decay-steps 100"), "decay_steps (--decay-steps) must not exceed steps",
                        "decay-steps > steps");
  expect_one_line_error(attograd(base + " --warmup 5 --decay-steps 2"), "decay_steps (--decay-steps) must be >= warmup",
                        "decay-steps < warmup");
  expect_one_line_error(attograd(base + " --decay biases"), "--decay", "unknown decay rule");
  expect_one_line_error(attograd(base + " --warmup-style linear"), "--warmup-style", "unknown warm-up style");
  expect_one_line_error(attograd(base + " --optimizer sgd --beta2 0.9"), "beta2 (--beta2) applies to the adam",
                        "beta2 with sgd");
  expect_one_line_error(attograd(base + " --schedule step --min-lr 0.001"), "min_lr (--min-lr) applies to the cosine",
                        "min-lr with step");
}

}  // namespace
