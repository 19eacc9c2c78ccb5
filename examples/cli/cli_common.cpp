// Helpers shared by the attograd subcommands: rebuilding a model from a file, reading files, memory use.

#include <sys/resource.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdarg>
#include <cstdio>
#include <sstream>

#include <nlohmann/json.hpp>

#include "cli.h"
#include "train/io/safetensors.h"
#include "train/io/serialize.h"

namespace attograd::cli {

std::string strf(const char* format, ...) {
  char buf[1024];
  va_list args;
  va_start(args, format);
  const int n = std::vsnprintf(buf, sizeof buf, format, args);
  va_end(args);
  if (n < static_cast<int>(sizeof buf)) return std::string(buf, static_cast<size_t>(n > 0 ? n : 0));
  std::string s(static_cast<size_t>(n) + 1, '\0');
  va_start(args, format);
  std::vsnprintf(s.data(), s.size(), format, args);
  va_end(args);
  s.resize(static_cast<size_t>(n));
  return s;
}

std::string thousands(int64_t n) {
  std::string s = std::to_string(n < 0 ? -n : n);
  for (int i = static_cast<int>(s.size()) - 3; i > 0; i -= 3) s.insert(static_cast<size_t>(i), ",");
  return n < 0 ? "-" + s : s;
}

namespace {

// The value as an integer if it is one (an optional '-', then digits, nothing else, no overflow).
std::optional<int64_t> parse_int(const std::string& s, bool* overflow) {
  *overflow = false;
  const char* b = s.data();
  const char* e = b + s.size();
  if (b == e || (*b != '-' && (*b < '0' || *b > '9'))) return std::nullopt;
  int64_t v = 0;
  const auto [p, ec] = std::from_chars(b, e, v);
  if (ec == std::errc::result_out_of_range) *overflow = true;
  if (ec != std::errc() || p != e) return std::nullopt;
  return v;
}

}  // namespace

CLI::Validator integer_in(int64_t lo, int64_t hi) {
  return CLI::Validator(
      [lo, hi](std::string& value) -> std::string {
        bool overflow = false;
        const std::optional<int64_t> v = parse_int(value, &overflow);
        if (v && *v >= lo && *v <= hi) return "";
        if (!v && !overflow) return "'" + value + "' is not an integer";
        return "'" + value + "' is out of range: expected an integer in [" + std::to_string(lo) + ", " +
               std::to_string(hi) + "]";
      },
      "INT in [" + std::to_string(lo) + " - " + std::to_string(hi) + "]");
}

CLI::Validator unsigned64() {
  return CLI::Validator(
      [](std::string& value) -> std::string {
        uint64_t v = 0;
        const char* b = value.data();
        const char* e = b + value.size();
        const auto [p, ec] = std::from_chars(b, e, v);
        if (b != e && *b >= '0' && *b <= '9' && ec == std::errc() && p == e) return "";
        return "'" + value + "' is not an integer in [0, 18446744073709551615]";
      },
      "UINT64");
}

CLI::Validator positive_real() {
  return CLI::Validator(
      [](std::string& value) -> std::string {
        char* end = nullptr;
        const double v = std::strtod(value.c_str(), &end);
        if (!value.empty() && end && *end == '\0' && std::isfinite(v) && v > 0) return "";
        return "'" + value + "' is not a positive finite number";
      },
      "POSITIVE");
}

namespace {

bool digits(const std::string& s, size_t& i) {
  const size_t start = i;
  while (i < s.size() && s[i] >= '0' && s[i] <= '9') ++i;
  return i > start;
}

// "" when `s` spells a plain decimal number of the kind (INT: [-]digits, UINT: digits, FLOAT:
// [+-]digits[.digits][e[+-]digits] or [+-].digits[...], finite); else why not.
std::string plain_number_error(const std::string& s, const std::string& kind) {
  const bool real = kind == "FLOAT";
  const std::string what = real ? "a number" : kind == "UINT" ? "a non-negative integer" : "an integer";
  const std::string bad = "'" + s + "' is not " + what;
  size_t i = 0;
  if (i < s.size() && (s[i] == '-' || (real && s[i] == '+'))) {
    if (kind == "UINT") return bad;
    ++i;
  }
  bool any = digits(s, i);
  if (real && i < s.size() && s[i] == '.') {
    ++i;
    any = digits(s, i) || any;
  }
  if (!any) return bad;
  if (real && i < s.size() && (s[i] == 'e' || s[i] == 'E')) {
    ++i;
    if (i < s.size() && (s[i] == '+' || s[i] == '-')) ++i;
    if (!digits(s, i)) return bad;
  }
  if (i != s.size()) return bad;
  if (real && !std::isfinite(std::strtod(s.c_str(), nullptr)))
    return "'" + s + "' is out of range (overflows a double)";
  if (!real && kind == "INT") {
    bool overflow = false;
    if (!parse_int(s, &overflow)) return "'" + s + "' is out of range for a 64-bit integer";
  }
  if (kind == "UINT") {
    uint64_t v = 0;
    if (std::from_chars(s.data(), s.data() + s.size(), v).ec != std::errc())
      return "'" + s + "' is out of range for a 64-bit unsigned integer";
  }
  return "";
}

void require_plain_numbers_in(CLI::App& app) {
  for (CLI::Option* opt : app.get_options()) {
    if (opt->get_type_size() == 0) continue;  // a flag: no value
    const std::string type = opt->get_type_name();
    const std::string kind = type.substr(0, type.find(':'));
    if (kind != "INT" && kind != "UINT" && kind != "FLOAT") continue;
    // No description: the help text keeps the option's own type and checks.
    // Last: the option's own checks speak first (their messages say what range is meant).
    opt->check(CLI::Validator([kind](std::string& v) { return plain_number_error(v, kind); }, ""));
    // First: CLI11 reads integers in base 0 ("010" is 8, "0x10" 16); a plain integer loses its leading zeros so
    // that every check and the conversion read the decimal digits written.
    if (kind != "FLOAT")
      opt->transform(CLI::Validator(
          [kind](std::string& v) {
            if (plain_number_error(v, kind).empty()) {
              const size_t sign = v[0] == '-' ? 1 : 0;
              v = v.substr(0, sign) + v.substr(std::min(v.find_first_not_of('0', sign), v.size() - 1));
            }
            return std::string();
          },
          ""));
  }
  for (CLI::App* sub : app.get_subcommands([](CLI::App*) { return true; })) require_plain_numbers_in(*sub);
}

}  // namespace

void require_plain_numbers(CLI::App& app) { require_plain_numbers_in(app); }

std::string describe_attention(const train::TrainConfig& c) {
  std::string s = c.attention + nn::attention_fields_words(c.attention_spec());
  if (c.rope) s += ", rope";
  if (c.checkpoint_activations) s += ", checkpointed";
  if (c.entropy_reg != 0) s += strf(", entropy-reg %g", c.entropy_reg);
  if (c.log_entropy) s += ", entropies logged";
  return s;
}

std::string describe_architecture(const train::TrainConfig& c) {
  std::string s;
  for (const std::string& d : c.architecture_spec().differences()) s += (s.empty() ? "" : ", ") + d;
  if (c.recipe.empty()) return s;
  return c.recipe + " recipe" + (s.empty() ? std::string(" (every option at its default)") : ": " + s);
}

std::string describe_optimizer_recipe(const train::TrainConfig& c) {
  const train::TrainConfig d;
  std::string s;
  auto add = [&](const std::string& part) { s += (s.empty() ? "" : ", ") + part; };
  if (c.beta1 != d.beta1 || c.beta2 != d.beta2) add(strf("betas (%g, %g)", c.beta1, c.beta2));
  if (c.adam_eps != d.adam_eps) add(strf("eps %g", c.adam_eps));
  if (c.decay != d.decay) add(strf("weight decay %g on %s only", c.weight_decay, c.decay.c_str()));
  if (c.min_lr != d.min_lr) add(strf("min-lr %g", c.min_lr));
  if (c.decay_steps != d.decay_steps) add(strf("decay-steps %lld", static_cast<long long>(c.decay_steps)));
  if (c.warmup_style != d.warmup_style) add(c.warmup_style + " warm-up");
  return s;
}

double peak_rss_mb() {
  rusage ru{};
  if (getrusage(RUSAGE_SELF, &ru) != 0) return 0;
  return static_cast<double>(ru.ru_maxrss) / 1024.0;  // Linux reports kilobytes
}

std::string read_text(const std::string& path, const char* what) {
  // A regular file of at most kMaxTextFileBytes, opened without blocking (a FIFO or /dev/zero is an error).
  const std::vector<uint8_t> bytes = io::detail::read_file(path, what, kMaxTextFileBytes);
  return std::string(bytes.begin(), bytes.end());
}

train::TrainConfig config_from_metadata(const std::string& metadata, const std::string& path) {
  return train::parse_run_metadata(metadata, "'" + path + "'").config;
}

void check_config_against_tensors(const train::TrainConfig& cfg, const io::FileInfo& info, const std::string& path,
                                  const std::string& data) {
  cfg.validate();
  // A checkpoint also holds optimizer state: only its "model." tensors count.
  double held = 0;
  for (const io::TensorInfo& t : info.tensors)
    if (info.kind != "checkpoint" || t.name.rfind("model.", 0) == 0) held += static_cast<double>(shape_numel(t.shape));
  // A data run's model has the data's vocabulary and at least one position (a learned table has its context's
  // rows); the built-in task's sizes (5 + num_symbols tokens, 2 max_len + 1 positions) describe a task run only.
  const double needed =
      data.empty() ? cfg.estimate_memory().parameters
                   : cfg.estimate_memory(train::run_dataset({.config = cfg, .data = data}, false)->vocab_size(), 1)
                         .parameters;
  ATTO_CHECK(needed <= held, "load", "'", path, "': its configuration describes a ", cfg.model, " model of at least ",
             static_cast<int64_t>(needed), " parameters, but the file holds only ", static_cast<int64_t>(held),
             " values (", info.tensors.size(), " tensors): the metadata does not match the tensors");
}

void add_precision_option(CLI::App* sub, std::string& precision) {
  sub->add_option("--precision", precision,
                  "fp32, or bf16: matmuls, linears and attention with bfloat16 operands and float32 accumulation "
                  "(docs/CPU.md; default: the training run's)")
      ->check(CLI::IsMember({"fp32", "bf16"}));
}

Precision use_precision(train::Trainer& t, const std::string& precision) {
  if (!precision.empty()) t.set_precision(parse_precision(precision));
  return t.precision();
}

std::unique_ptr<train::Trainer> load_model(const std::string& path, std::optional<uint64_t> seed, bool read_data) {
  const io::FileInfo info = io::inspect(path);
  ATTO_CHECK(!info.has_checksum || info.checksum_ok, "load", "'", path, "' is corrupt: checksum mismatch (stored ",
             strf("%016llx", static_cast<unsigned long long>(info.stored_checksum)), ", computed ",
             strf("%016llx", static_cast<unsigned long long>(info.computed_checksum)), ")");
  train::RunMetadata run = train::parse_run_metadata(info.metadata, "'" + path + "'");
  if (seed) run.config.seed = *seed;
  // A data file is re-read only when its examples are needed; a saved tokenizer that is damaged names the file.
  const bool read = read_data || info.kind == "checkpoint";
  std::shared_ptr<data::Dataset> dataset;
  try {
    check_config_against_tensors(run.config, info, path, run.data);
    dataset = train::run_dataset(run, read);
  } catch (const Error& e) {
    if (e.op() != "tokenizer" && e.op() != "base64") throw;
    throw Error("load", str_cat("'", path, "': ", e.what()));
  }
  // A built-in task is drawn from its config.
  auto trainer = std::make_unique<train::Trainer>(run.config, std::move(dataset));
  if (info.kind == "checkpoint")
    trainer->load_checkpoint(path);
  else if (info.kind == "safetensors")
    io::import_safetensors(trainer->model(), path);
  else
    io::load(trainer->model(), path);
  return trainer;
}

}  // namespace attograd::cli
