// attograd_bench: `attograd bench` as a standalone executable (the same add_bench_command), for scripts that run
// before the `attograd` tool lists the command. `attograd_bench --preset small` == `attograd bench --preset small`.

#include <CLI/CLI.hpp>
#include <cstdio>
#include <string>
#include <vector>

#include "examples/cli/cli_bench.h"

int main(int argc, char** argv) {
  // Accept both `attograd_bench bench --preset small` and `attograd_bench --preset small`.
  std::vector<char*> args(argv, argv + argc);
  static char bench_word[] = "bench";
  if (argc < 2 || std::string(argv[1]) != "bench") args.insert(args.begin() + 1, bench_word);

  CLI::App app{"attograd_bench: time training steps of a causal LM (attograd bench)", "attograd_bench"};
  app.require_subcommand(1, 1);
  attograd::cli::add_bench_command(app);  // runs the benchmark during parse and exits with its status
  try {
    app.parse(static_cast<int>(args.size()), args.data());
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::fprintf(stderr, "attograd bench: error: %s (see `attograd_bench --help`)\n", e.what());
    return 2;
  }
  return 0;
}
