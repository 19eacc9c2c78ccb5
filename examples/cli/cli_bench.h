#pragma once
// `attograd bench`: the training-step benchmark of issue 7 (train/tools/bench.h) from the command line. It prints a
// short human summary, then one JSON object as the LAST line of stdout (what bench/compare reads).

#include <CLI/CLI.hpp>

#include "cli.h"

namespace attograd::cli {

/// Adds the `bench` subcommand to `app` and returns it with what to run (the pattern of main.cpp's commands list).
Command add_bench(CLI::App& app);

/// Adds the `bench` subcommand with a callback that runs it during app.parse() and then ends the process with
/// its exit status (0, or 2 after one error line on stderr), so a main() that does not dispatch it still works.
void add_bench_command(CLI::App& app);

}  // namespace attograd::cli
