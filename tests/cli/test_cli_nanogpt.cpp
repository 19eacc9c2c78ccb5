// `attograd export --names nanogpt` and `attograd import --names nanogpt` (train/io/nanogpt.h): a model nanoGPT
// cannot express is refused naming the option; a malformed state dict is one line naming the tensor; a bare nanoGPT
// state dict (the PyTorch golden of tests/train/io/golden_nanogpt_names.py) imports, inspects, generates and exports
// back to the same tensors; a `--recipe nanogpt` run exports and imports back to the same weights and evaluation.
// Runs the built tool as tests/cli/test_cli.cpp does. The parts that need `--recipe nanogpt` in the training
// configuration skip (saying so) on a build without it.

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "cli_testing.h"
#include "testing.h"
#include "train/io/safetensors.h"

namespace io = attograd::io;

namespace {

std::string reference(const std::string& stem) {
  return attograd::testing::data_path("train/" + stem + ".safetensors");
}
std::string out(const std::string& name) { return (scratch() / name).string(); }

constexpr const char* kNoRecipe = "cannot describe the nanogpt recipe";

// Every tensor of `a` is in `b` with the same dtype, shape and bytes, and the other way round.
void expect_same_tensors(const std::string& a, const std::string& b) {
  const io::SafeTensors x = io::read_safetensors(a), y = io::read_safetensors(b);
  ASSERT_EQ(x.tensors.size(), y.tensors.size()) << a << " vs " << b;
  for (const auto& [name, t] : x.tensors) {
    bool found = false;
    for (const auto& [other, u] : y.tensors)
      if (other == name) {
        found = true;
        EXPECT_TRUE(attograd::testing::bitwise_equal(t, u)) << name;
      }
    EXPECT_TRUE(found) << name << " is not in " << b;
  }
}

class CliNanoGPT : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!kCli) GTEST_SKIP() << "the attograd tool is not built (ATTOGRAD_BUILD_EXAMPLES=OFF)";
  }
};

TEST_F(CliNanoGPT, ExportRefusesAModelNanoGPTCannotExpressNamingTheOption) {
  const std::string dir = out("default");
  const CliRun t = attograd(
      "train --steps 2 --d-model 16 --heads 2 --d-ff 64 --layers 1 --batch 4 --eval-every 0 "
      "--eval-size 8 --out " +
      quote(dir));
  ASSERT_EQ(t.status, 0) << t.err;
  expect_one_line_error(
      attograd("export --weights " + quote(dir + "/model.attograd") + " --names nanogpt --to " + quote(out("x.st"))),
      "nanoGPT's GPT cannot express --positions sinusoidal (it needs learned)", "export of the textbook lm");
  EXPECT_FALSE(std::filesystem::exists(out("x.st")));
  const CliRun bad =
      attograd("export --weights " + quote(dir + "/model.attograd") + " --names gpt2 --to " + quote(out("y.st")));
  EXPECT_EQ(bad.status, 2) << bad.err;
}

TEST_F(CliNanoGPT, ImportRefusesAMalformedStateDictInOneLine) {
  io::SafeTensors st = io::read_safetensors(reference("nanogpt_bias"));
  std::erase_if(st.tensors, [](const auto& p) { return p.first == "transformer.h.0.mlp.c_fc.weight"; });
  st.tensors.emplace_back("transformer.h.0.mlp.gate.weight", attograd::zeros({4}));
  io::write_safetensors(out("bad.safetensors"), st.tensors, st.metadata);
  expect_one_line_error(
      attograd("import --names nanogpt --from " + quote(out("bad.safetensors")) + " --to " + quote(out("bad.a"))),
      "missing transformer.h.0.mlp.c_fc.weight; unknown transformer.h.0.mlp.gate.weight", "names");

  st = io::read_safetensors(reference("nanogpt_bias"));
  for (auto& [name, t] : st.tensors)
    if (name == "transformer.ln_f.bias") {
      t = t.clone();
      t.set({3}, std::numeric_limits<double>::infinity());
    }
  io::write_safetensors(out("inf.safetensors"), st.tensors, st.metadata);
  expect_one_line_error(
      attograd("import --names nanogpt --from " + quote(out("inf.safetensors")) + " --to " + quote(out("inf.a"))),
      "transformer.ln_f.bias", "a non-finite value");

  expect_one_line_error(attograd("import --names nanogpt --from " + quote(reference("nanogpt_nobias")) + " --to " +
                                 quote(out("nohead.a"))),
                        "no shape holds n_head: pass --heads", "a bare state dict without n_head");
}

TEST_F(CliNanoGPT, ABareStateDictImportsInspectsGeneratesAndExportsBack) {
  for (const std::string stem : {"nanogpt_bias", "nanogpt_nobias"}) {
    const std::string w = out(stem + ".attograd");
    const CliRun i =
        attograd("import --names nanogpt --heads 2 --from " + quote(reference(stem)) + " --to " + quote(w));
    if (i.status != 0 && i.err.find(kNoRecipe) != std::string::npos)
      GTEST_SKIP() << "this build's TrainConfig has no recipe fields: " << i.err;
    ASSERT_EQ(i.status, 0) << i.err;
    EXPECT_NE(i.out.find("nanoGPT names"), std::string::npos) << i.out;
    const CliRun info = attograd("inspect " + quote(w));
    EXPECT_EQ(info.status, 0) << info.err;
    // Placeholder characters: nanoGPT's token 5 is U+F0005.
    const CliRun g = attograd("generate -w " + quote(w) + " --input " + quote("\U000F0005\U000F0007") + " -n 4");
    EXPECT_EQ(g.status, 0) << g.err;
    const std::string back = out(stem + ".back.safetensors");
    const CliRun e = attograd("export -w " + quote(w) + " --names nanogpt --to " + quote(back));
    ASSERT_EQ(e.status, 0) << e.err;
    expect_same_tensors(reference(stem), back);
  }
}

TEST_F(CliNanoGPT, ARecipeRunExportsAndImportsBackExactly) {
  const std::string dir = out("recipe");
  const CliRun t = attograd("train --recipe nanogpt --text " + quote(attograd::testing::data_path("train/poems.txt")) +
                            " --context 16 --steps 3 --d-model 16 --heads 2 --d-ff 64 --layers 2 --batch 4 "
                            "--eval-every 0 --eval-size 8 --out " +
                            quote(dir));
  if (t.status != 0 && t.err.find("recipe") != std::string::npos)
    GTEST_SKIP() << "this build has no `train --recipe`: " << t.err;
  ASSERT_EQ(t.status, 0) << t.err;
  const std::string w = dir + "/model.attograd", st = out("recipe.safetensors"), back = out("recipe.attograd");
  for (const char* mask : {"", " --no-mask-buffer"}) {
    ASSERT_EQ(attograd("export -w " + quote(w) + " --names nanogpt --to " + quote(st) + mask).status, 0);
    const io::SafeTensors file = io::read_safetensors(st);
    size_t masks = 0;
    for (const auto& [name, _] : file.tensors) masks += name.ends_with(".attn.bias");
    EXPECT_EQ(masks, std::string(mask).empty() ? 2u : 0u);
    EXPECT_TRUE(file.metadata.count("nanogpt_config"));
    const CliRun i = attograd("import --names nanogpt --from " + quote(st) + " --to " + quote(back));
    ASSERT_EQ(i.status, 0) << i.err;
    // The same weights and the same evaluation as the run's own file.
    const std::string again = out("recipe.again.safetensors");
    ASSERT_EQ(attograd("export -w " + quote(back) + " --names nanogpt --to " + quote(again) + mask).status, 0);
    expect_same_tensors(st, again);
    const CliRun e1 = attograd("eval --json -w " + quote(w)), e2 = attograd("eval --json -w " + quote(back));
    ASSERT_EQ(e1.status, 0) << e1.err;
    ASSERT_EQ(e2.status, 0) << e2.err;
    EXPECT_TRUE(last_line_json(e1.out).contains("val_loss")) << e1.out;
    EXPECT_EQ(last_line_json(e1.out)["val_loss"], last_line_json(e2.out)["val_loss"]) << e1.out << e2.out;
  }
  // A state dict without attograd's metadata (as nanoGPT saves it) takes the run's vocabulary from --config, the
  // run's weights file: the same evaluation.
  io::SafeTensors bare = io::read_safetensors(st);
  bare.metadata = {{"nanogpt_config", bare.metadata.at("nanogpt_config")}};
  io::write_safetensors(out("bare.safetensors"), bare.tensors, bare.metadata);
  const std::string with_vocab = out("with_vocab.attograd");
  const CliRun i = attograd("import --names nanogpt --from " + quote(out("bare.safetensors")) + " --config " +
                            quote(w) + " --to " + quote(with_vocab));
  ASSERT_EQ(i.status, 0) << i.err;
  const CliRun e1 = attograd("eval --json -w " + quote(w)), e2 = attograd("eval --json -w " + quote(with_vocab));
  ASSERT_EQ(e2.status, 0) << e2.err;
  EXPECT_EQ(last_line_json(e1.out)["val_loss"], last_line_json(e2.out)["val_loss"]) << e1.out << e2.out;
}

}  // namespace
