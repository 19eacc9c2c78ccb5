// attograd: the command-line tool. Subcommands train, eval, generate, sample, gradcheck, inspect, export and import
// (one cli_*.cpp each, listed below). Every error -- a bad flag, a missing, unreadable or corrupt file, an
// invalid configuration -- prints ONE line on stderr and exits with status 2; gradcheck exits 1 when a check fails.

#include <cstdio>
#include <exception>
#include <new>
#include <string>
#include <vector>

#include "cli.h"
#include "cli_bench.h"

namespace {

// The message on one line (multi-line messages are joined with "; ").
std::string one_line(std::string s) {
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
  std::string out;
  for (char c : s) {
    if (c == '\n') out += "; ";
    else if (c != '\r') out += c;
  }
  return out;
}

int fail(const std::string& who, const std::string& message) {
  std::fprintf(stderr, "%s: error: %s\n", who.c_str(), one_line(message).c_str());
  return attograd::cli::kExitError;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace attograd::cli;
  CLI::App app{"attograd: train, evaluate, inspect and gradient-check small transformers", "attograd"};
  app.set_version_flag("--version", "attograd 0.1.0");
  app.require_subcommand(0, 1);
  app.footer(
      "Run `attograd COMMAND --help` for a command's options and examples.\n\n"
      "Examples:\n"
      "  attograd train                                   # reverse task, about a minute\n"
      "  attograd eval --weights runs/reverse-lm/model.attograd\n"
      "  attograd generate --weights runs/reverse-lm/model.attograd --input \"3 1 4 1 5\"\n"
      "  attograd train --text poem.txt --steps 500 && attograd sample --weights runs/poem-lm/model.attograd\n"
      "  attograd gradcheck\n"
      "  attograd inspect runs/reverse-lm/model.attograd");
  const std::vector<Command> commands = {add_train(app),     add_eval(app),   add_generate(app), add_sample(app),
                                         add_gradcheck(app), add_inspect(app), add_export(app),  add_import(app),
                                         add_bench(app),     add_view(app),   add_predict(app),
                                         add_prepare(app)};
  require_plain_numbers(app);  // every numeric flag, whoever declared it: '' or '1x' is an error, never 0

  std::string who = "attograd";
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    for (const CLI::App* sub : app.get_subcommands()) who = "attograd " + sub->get_name();
    return fail(who, std::string(e.what()) + " (see `" + who + " --help`)");
  }

  try {
    for (const Command& c : commands) {
      if (c.app->parsed()) {
        who = "attograd " + c.app->get_name();
        return c.run();
      }
    }
    std::printf("%s", app.help().c_str());
    return kExitOk;
  } catch (const attograd::Error& e) {
    return fail(who, e.what());
  } catch (const CLI::Error& e) {
    return fail(who, e.what());
  } catch (const std::bad_alloc&) {  // the tensors' allocator says how much; this is another allocation
    return fail(who, "out of memory (a system allocation failed: std::bad_alloc)");
  } catch (const std::exception& e) {
    return fail(who, e.what());
  } catch (...) {
    return fail(who, "unknown error");
  }
}
