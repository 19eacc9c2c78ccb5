#pragma once
// What the tests of the `attograd` tool share (tests/cli/test_cli.cpp, test_cli_data.cpp): running the built binary
// (path from the ATTOGRAD_CLI compile definition) through popen as a user would, a scratch directory, and the
// one-line error contract.

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "scratch.h"

// In an unnamed namespace, as they were in each test file: the helper `attograd(...)` shares its name with the
// library's namespace, which a named namespace could not make unambiguous.
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

#ifdef ATTOGRAD_CLI
constexpr const char* kCli = ATTOGRAD_CLI;
#else
constexpr const char* kCli = nullptr;  // examples (and so the tool) not built
#endif

struct CliRun {
  int status = -1;
  std::string out, err;
};

std::string slurp(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::ostringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

std::string quote(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

// The test binary's scratch directory (one per process).
const fs::path& scratch() { return test_scratch::dir("cli"); }

// Runs `attograd ARGS` (ARGS as shell words), capturing stdout, stderr and the exit status.
CliRun attograd(const std::string& args, const std::string& shell_prefix = "") {
  const std::string err_file = (scratch() / "stderr.txt").string();
  // Under `timeout`: a hang (a FIFO, a run that never ends) fails the test instead of blocking the suite. The bound
  // is far above any command's normal time, sanitizer builds included; it is never a timing assertion.
  const std::string cmd =
      shell_prefix + "timeout -k 10 600 " + std::string(kCli) + " " + args + " 2>" + quote(err_file) + " </dev/null";
  CliRun r;
  std::FILE* p = ::popen(cmd.c_str(), "r");
  if (!p) return r;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) r.out.append(buf, n);
  const int st = ::pclose(p);
  r.status = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  r.err = slurp(err_file);
  return r;
}

std::vector<std::string> lines(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream in(text);
  for (std::string l; std::getline(in, l);) out.push_back(l);
  return out;
}

[[maybe_unused]] json last_line_json(const std::string& out) {
  const std::vector<std::string> l = lines(out);
  if (l.empty()) return json();
  return json::parse(l.back(), nullptr, false);
}

// Asserts the failure contract: exit status 2 and exactly one line on stderr, no crash.
void expect_one_line_error(const CliRun& r, const std::string& substring, const std::string& what) {
  EXPECT_EQ(r.status, 2) << what << "\nstdout: " << r.out << "\nstderr: " << r.err;
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << what << ": " << r.err;
  EXPECT_EQ(r.err.rfind("attograd", 0), 0u) << what << ": " << r.err;
  EXPECT_NE(r.err.find(substring), std::string::npos) << what << ": expected '" << substring << "' in " << r.err;
  EXPECT_EQ(r.err.find("terminate"), std::string::npos) << r.err;
}

}  // namespace
