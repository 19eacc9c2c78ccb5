#pragma once
// Pieces shared by the subcommands of the `attograd` tool (examples/cli). Each cli_<command>.cpp adds one or
// more subcommands to the CLI11 app and returns what to run when the user picked it.

#include <CLI/CLI.hpp>

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "nn/attention_layer.h"
#include "train/io/serialize.h"
#include "train/tools/explorer.h"
#include "train/trainer.h"

namespace attograd::cli {

/// Exit status: success.
inline constexpr int kExitOk = 0;
/// Exit status: a check failed (gradcheck).
inline constexpr int kExitFailed = 1;
/// Exit status: bad usage, a missing, unreadable or corrupt file, or any other error.
inline constexpr int kExitError = 2;

/// A subcommand: its CLI11 app and what to run when it was chosen (returns the exit status; may throw).
struct Command {
  CLI::App* app = nullptr;       ///< the subcommand
  std::function<int()> run;      ///< runs it after parsing
};

/// `attograd train`.
Command add_train(CLI::App& app);
/// `attograd eval`.
Command add_eval(CLI::App& app);
/// `attograd generate`.
Command add_generate(CLI::App& app);
/// `attograd sample`.
Command add_sample(CLI::App& app);
/// `attograd gradcheck`.
Command add_gradcheck(CLI::App& app);
/// `attograd inspect`.
Command add_inspect(CLI::App& app);
/// `attograd export`.
Command add_export(CLI::App& app);
/// `attograd import`.
Command add_import(CLI::App& app);
/// `attograd view` (cli_view.cpp).
Command add_view(CLI::App& app);
/// `attograd predict` (cli_predict.cpp).
Command add_predict(CLI::App& app);
/// `attograd prepare` (cli_prepare.cpp).
Command add_prepare(CLI::App& app);

/// A Trainer holding the model saved in a weights file (config and data settings from its metadata) or a
/// checkpoint. `seed` replaces the config's seed (which picks the held-out examples of a built-in task). A model
/// trained on a data file gets its dataset from the saved settings: re-reading the file when read_data (or for a
/// checkpoint), else only the saved vocabulary. Error if the file has no training config.
std::unique_ptr<train::Trainer> load_model(const std::string& path, std::optional<uint64_t> seed = std::nullopt,
                                           bool read_data = false);
/// Adds --precision (fp32 or bf16; default: the training run's) to a command that runs a saved model.
void add_precision_option(CLI::App* sub, std::string& precision);
/// Sets t's precision to `precision` ("" keeps the training run's) and returns it, for the command's Autocast.
Precision use_precision(train::Trainer& t, const std::string& precision);
/// Before building anything: the configuration is valid and its model (estimate_memory's lower bound of the
/// parameters) fits in the values the file holds; Error naming the file otherwise. `data` is the run's data settings
/// (RunMetadata::data): a data run's bound is taken with its own token space (and one position), not the config's
/// built-in task sizes.
void check_config_against_tensors(const train::TrainConfig& cfg, const io::FileInfo& info, const std::string& path,
                                  const std::string& data = "");
/// The TrainConfig stored as a file's metadata (Error naming the file when there is none).
train::TrainConfig config_from_metadata(const std::string& metadata, const std::string& path);
/// Largest configuration (JSON) file read: 1 MiB.
inline constexpr uint64_t kMaxTextFileBytes = uint64_t{1} << 20;
/// The whole text file: a regular file of at most kMaxTextFileBytes (Error naming it and `what` otherwise).
std::string read_text(const std::string& path, const char* what);
/// A check for an integer flag: a plain decimal integer (no sign unless lo < 0, nothing after it) in [lo, hi];
/// an out-of-range value is an error, never clamped or wrapped (CLI11 would turn -1 into 2^64-1 for unsigned).
CLI::Validator integer_in(int64_t lo, int64_t hi);
/// A check for an unsigned 64-bit flag (a seed): digits only, at most 2^64-1.
CLI::Validator unsigned64();
/// A check for a real flag: a finite number greater than 0 (not NaN, not 0, not negative).
CLI::Validator positive_real();
/// Gives every numeric option (type INT, UINT or FLOAT) of `app` and of all its subcommands a check that its value
/// is a whole plain decimal number: an empty, blank or partial value ('', ' ', '1x', '0.1.2'), hex or octal
/// spellings, NaN, infinity, an overflowing real and a negative unsigned value are usage errors naming the flag
/// (CLI11 alone reads '' as 0 and accepts 'nan' and ' 1'). Called once, after every subcommand declared its flags.
void require_plain_numbers(CLI::App& app);
/// The configuration's attention variant in words: "gqa (2 key/value heads), rope, checkpointed, entropy-reg 0.01".
std::string describe_attention(const train::TrainConfig& cfg);
/// The configuration's architecture recipe in words: the recipe's name and every option that differs from the
/// default (nn::ArchitectureSpec::differences), e.g. "nanogpt recipe: positions=learned, activation=gelu, ...",
/// "positions=learned" without a named recipe; empty for the default recipe.
std::string describe_architecture(const train::TrainConfig& cfg);
/// The optimizer-recipe settings that differ from TrainConfig's defaults (beta1 ... warmup_style), e.g. "betas (0.9,
/// 0.95), weight decay 0.1 on matrices only, min-lr 0.0001, nanogpt warm-up"; empty when all are the defaults.
std::string describe_optimizer_recipe(const train::TrainConfig& cfg);
/// A CLI11 validator: the value must be a registered attention kind (nn::has_attention); the error lists them.
CLI::Validator attention_kind();
/// Peak resident memory of this process in MB (getrusage ru_maxrss).
double peak_rss_mb();
/// 101056 -> "101,056".
std::string thousands(int64_t n);
/// The configuration as (field, value) rows for a page's table, without the toy tasks' fields for a text or pairs
/// run (cli_view.cpp).
std::vector<std::pair<std::string, std::string>> config_table(const train::TrainConfig& cfg);
/// The attention explorer page of a trainer's model on `src` and `output`, its subtitle naming the run (cli_view.cpp).
report::ExplorerPage explorer_for(train::Trainer& t, const std::vector<int64_t>& src, const std::vector<int64_t>& output);
/// Writes the attention of `src` and `output` to `path`: the explorer page when it ends in .html (or .htm), else the
/// heatmap SVG (labels drawn visibly); one line on stderr says where (cli_view.cpp).
void write_attention(const std::string& path, train::Trainer& t, const std::vector<int64_t>& src,
                     const std::vector<int64_t>& output);
/// printf into a std::string.
std::string strf(const char* format, ...) __attribute__((format(printf, 1, 2)));

}  // namespace attograd::cli
