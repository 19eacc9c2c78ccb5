// Every numeric option of every `attograd` subcommand refuses an empty or partial number (issue 27), run as a user
// would. About 700 runs of the tool: the file is labelled slow (tests/CMakeLists.txt), so .ci/run's sanitizer pass,
// where each start of the instrumented tool costs about 0.4 s, skips it; scripts/test runs it under every kernel set.

#include <gtest/gtest.h>

#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli_testing.h"

namespace {

// Every numeric option of every subcommand as its --help lists it (type INT, UINT or FLOAT): {command, --name, type}.
struct NumericOption {
  std::string command, name, type;
};
std::vector<NumericOption> numeric_options() {
  std::vector<std::string> commands;
  bool in_list = false;
  for (const std::string& l : lines(attograd("--help").out)) {
    if (l.rfind("Subcommands:", 0) == 0) {
      in_list = true;
    } else if (in_list) {
      if (l.size() < 3 || l[0] != ' ' || l[2] == ' ') break;
      commands.push_back(l.substr(2, l.find(' ', 2) - 2));
    }
  }
  std::vector<NumericOption> out;
  for (const std::string& c : commands)
    for (const std::string& l : lines(attograd(c + " --help").out)) {
      // "  -n,--tokens INT:INT in [1 - 1000000]=200   help": names, then the type.
      std::istringstream words(l);
      std::string names, type;
      if (l.rfind("  -", 0) != 0 || !(words >> names >> type)) continue;
      type = type.substr(0, type.find_first_of(":="));
      if (type != "INT" && type != "UINT" && type != "FLOAT") continue;
      const size_t comma = names.rfind(',');
      out.push_back({c, comma == std::string::npos ? names : names.substr(comma + 1), type});
    }
  return out;
}

TEST(CliFlags, EveryNumericFlagRefusesAnEmptyOrPartialNumber) {
  if (!kCli) GTEST_SKIP() << "the attograd tool is not built (ATTOGRAD_BUILD_EXAMPLES=OFF)";
  // Issue 27: CLI11 reads '' as 0 (`--clip ''` turned clipping off) and accepts 'nan', ' 1', '0x10' and, for an
  // unsigned value, '-1' (as 2^64-1). Every numeric option of every subcommand refuses them, naming the flag.
  const std::string dummy = (scratch() / "dummy.attograd").string();
  std::ofstream(dummy) << "not read: the flags are refused first";
  const std::map<std::string, std::string> required = {
      {"eval", "-w " + quote(dummy)},
      {"generate", "-w " + quote(dummy) + " -i 1"},
      {"sample", "-w " + quote(dummy)},
      {"inspect", quote(dummy)},
      {"export", "-w " + quote(dummy) + " --to " + quote(dummy + ".x")},
      {"import", "--from " + quote(dummy) + " --to " + quote(dummy + ".x")},
      {"train", "--resume " + quote(dummy)}};  // should a value pass, the run fails at once (not a checkpoint)
  const std::vector<NumericOption> options = numeric_options();
  std::set<std::string> seen;
  for (const NumericOption& o : options) seen.insert(o.command + " " + o.name);
  // The ones that read '' as 0, and a few of each kind and command: the listing found them all.
  for (const char* want : {"train --clip", "train --dropout", "train --label-smoothing", "train --weight-decay",
                           "train --momentum", "train --entropy-reg", "gradcheck --dropout", "train --bucket-mb",
                           "train --val-fraction", "train --seed", "sample --temperature", "sample --top-p",
                           "eval --eval-size", "train --norm-eps", "bench --layers", "bench --seed", "gradcheck --eps"})
    EXPECT_TRUE(seen.count(want)) << want << " is not listed as numeric";
  EXPECT_GE(options.size(), 60u);
  for (const NumericOption& o : options) {
    std::vector<std::string> bad = {"", " ", "1x", "0.1.2", "nan", "inf", "0x10", "1 2"};
    if (o.type == "FLOAT") bad.insert(bad.end(), {"1e999", "-1e400x", "."});
    if (o.type != "FLOAT") bad.insert(bad.end(), {"1.5", "1e3", "99999999999999999999"});
    if (o.type == "UINT") bad.push_back("-1");
    const auto it = required.find(o.command);
    for (const std::string& v : bad) {
      const std::string args =
          o.command + " " + (it == required.end() ? "" : it->second + " ") + o.name + " " + quote(v);
      expect_one_line_error(attograd(args), "attograd " + o.command + ": error: " + o.name + ": ", args);
    }
  }
  // A valid spelling is read as written: leading zeros are decimal (CLI11 alone reads 010 as octal 8).
  const std::string out = (scratch() / "run").string();
  const CliRun t = attograd("train --steps 2 --d-model 16 --layers 1 --heads 2 --d-ff 32 --max-len 4 --batch 4 --out " +
                            quote(out));
  ASSERT_EQ(t.status, 0) << t.err;
  const CliRun e = attograd("eval --json --eval-size 010 -w " + quote(out + "/model.attograd"));
  ASSERT_EQ(e.status, 0) << e.err;
  EXPECT_EQ(last_line_json(e.out)["n"], 10);
}

}  // namespace
