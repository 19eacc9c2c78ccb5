// `attograd inspect FILE`: what a weights, checkpoint or safetensors file holds and whether its checksum holds.

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <optional>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli.h"
#include "train/data/text.h"
#include "train/io/serialize.h"

namespace attograd::cli {

namespace {

struct InspectArgs {
  std::string file;
  bool json = false;
  bool allow_nonfinite = false;
};

// The training configuration in a file's metadata when it has one and its attention is not the textbook one (the
// inspect output of other files is unchanged).
std::optional<train::TrainConfig> saved_config(const std::string& metadata) {
  try {
    train::TrainConfig c = train::parse_run_metadata(metadata, "metadata").config;
    if (c.attention_spec() == nn::AttentionSpec{} && !c.tracks_entropy()) return std::nullopt;
    return c;
  } catch (const Error&) {
    return std::nullopt;
  }
}

std::string hex(uint64_t v) { return strf("%016llx", static_cast<unsigned long long>(v)); }

// The metadata for reading: the configuration and data settings stored as JSON strings (safetensors' convention)
// become objects, and a file run's configuration loses the toy tasks' fields.
nlohmann::ordered_json readable_metadata(const nlohmann::ordered_json& meta) {
  if (!meta.is_object()) return meta;
  nlohmann::ordered_json out = meta;
  for (const char* key : {"attograd_config", "attograd_data"})
    if (out.contains(key) && out[key].is_string()) {
      nlohmann::ordered_json inner = nlohmann::ordered_json::parse(out[key].get<std::string>(), nullptr, false);
      if (!inner.is_discarded()) out[key] = inner;
    }
  const bool file_data = out.contains("attograd_data");
  nlohmann::ordered_json* cfg = out.contains("attograd_config") ? &out["attograd_config"] : &out;
  if (file_data && cfg->is_object())
    for (const char* key : {"min_len", "max_len", "num_symbols"}) cfg->erase(key);
  return out;
}

// JSON indented by two spaces per level, except that an array of numbers or strings (a vocabulary, a shape) stays
// on one line.
std::string pretty(const nlohmann::ordered_json& j, int depth = 0) {
  const std::string pad(static_cast<size_t>(2 * (depth + 1)), ' '), end_pad(static_cast<size_t>(2 * depth), ' ');
  if (j.is_object() && !j.empty()) {
    std::string out = "{\n";
    size_t i = 0;
    for (const auto& [key, value] : j.items())
      out += pad + nlohmann::ordered_json(key).dump() + ": " + pretty(value, depth + 1) + (++i < j.size() ? ",\n" : "\n");
    return out + end_pad + "}";
  }
  if (j.is_array() && std::any_of(j.begin(), j.end(), [](const auto& e) { return e.is_structured(); })) {
    std::string out = "[\n";
    for (size_t i = 0; i < j.size(); ++i) out += pad + pretty(j[i], depth + 1) + (i + 1 < j.size() ? ",\n" : "\n");
    return out + end_pad + "]";
  }
  if (!j.is_array() || j.empty()) return j.dump();
  std::string flat = "[";
  for (size_t i = 0; i < j.size(); ++i) flat += (i ? ", " : "") + j[i].dump();
  return flat + "]";
}

// The last evaluation in a metrics log (nullopt when it has none or does not parse).
std::optional<train::StepMetrics> last_evaluation(const std::string& csv) {
  try {
    const std::vector<train::StepMetrics> rows = train::parse_metrics_csv(csv);
    for (auto it = rows.rbegin(); it != rows.rend(); ++it)
      if (it->evaluated) return *it;
  } catch (const Error&) {
  }
  return std::nullopt;
}

// A human summary of a training run's file: (label, value) rows, empty when the metadata holds no configuration.
std::vector<std::pair<std::string, std::string>> run_summary(const std::string& file, const io::FileInfo& info) {
  std::vector<std::pair<std::string, std::string>> rows;
  train::RunMetadata run;
  try {
    run = train::parse_run_metadata(info.metadata, "'" + file + "'");
  } catch (const Error&) {
    return rows;
  }
  const train::TrainConfig& c = run.config;
  rows.emplace_back("model", strf("%s, layers %lld, d_model %lld, heads %lld, d_ff %lld", c.model.c_str(),
                                  static_cast<long long>(c.layers), static_cast<long long>(c.d_model),
                                  static_cast<long long>(c.heads), static_cast<long long>(c.d_ff)));
  std::string recipe = strf("%s, lr %g, %s schedule", c.optimizer.c_str(), c.lr, c.schedule.c_str());
  if (c.schedule != "constant" && c.schedule != "step") recipe += strf(", warmup %lld", static_cast<long long>(c.warmup));
  if (c.weight_decay != 0) recipe += strf(", weight decay %g", c.weight_decay);
  if (c.dropout != 0) recipe += strf(", dropout %g", c.dropout);
  recipe += strf(", batch %lld", static_cast<long long>(c.batch));
  if (c.precision != "fp32") recipe += ", " + c.precision + " mixed precision";
  if (const std::string optim = describe_optimizer_recipe(c); !optim.empty()) recipe += ", " + optim;
  rows.emplace_back("recipe", recipe);
  if (const std::string arch = describe_architecture(c); !arch.empty()) rows.emplace_back("architecture", arch);
  rows.emplace_back("attention", describe_attention(c));
  std::optional<data::DataSpec> spec;
  if (!run.data.empty()) try {
      spec = data::DataSpec::from_json(run.data);
    } catch (const Error&) {
    }
  try {
    rows.emplace_back("vocabulary", strf("%s tokens", thousands(train::run_dataset(run, false)->vocab_size()).c_str()));
  } catch (const Error&) {
  }
  if (spec && spec->format == "text" && spec->tokenizer != "char")
    rows.emplace_back("tokenizer", strf("%s (SentencePiece), %lld pieces + %lld reserved ids, saved in the file "
                                        "(xxh64 %016llx)",
                                        spec->tokenizer.c_str(), static_cast<long long>(spec->vocab_size),
                                        static_cast<long long>(data::Vocabulary::kReserved),
                                        static_cast<unsigned long long>(spec->tokenizer_hash)));
  if (spec && (spec->format == "text" || spec->format == "tokens")) {
    rows.emplace_back("context", strf("%lld %s", static_cast<long long>(spec->context),
                                      spec->tokenizer == "char" ? "characters" : "tokens"));
  } else if (spec) {
    rows.emplace_back("lengths", strf("sources up to %lld tokens, targets up to %lld (%s tokens)",
                                      static_cast<long long>(spec->max_source_len),
                                      static_cast<long long>(spec->max_target_len), spec->tokenize.c_str()));
  } else {
    rows.emplace_back("lengths", strf("%lld-%lld, %lld symbols", static_cast<long long>(c.min_len),
                                      static_cast<long long>(c.max_len), static_cast<long long>(c.num_symbols)));
  }
  if (spec)
    rows.emplace_back("data", strf("%s %s, xxh64 %s", spec->format == "tokens" ? "token directory" : (spec->format + " file").c_str(), spec->path.c_str(),
                                   hex(spec->file_hash).c_str()));
  else
    rows.emplace_back("data", strf("the built-in %s task", c.task.c_str()));
  // Steps and the last evaluation: a checkpoint's own counters and log, else the metrics.csv beside the file.
  std::string csv, csv_origin;
  if (info.kind == "checkpoint") {
    const auto step = std::find_if(info.counters.begin(), info.counters.end(),
                                   [](const auto& kv) { return kv.first == "step"; });
    rows.emplace_back("steps", strf("%lld of %lld", static_cast<long long>(step != info.counters.end() ? step->second : 0),
                                    static_cast<long long>(c.steps)));
    try {
      csv = io::load_checkpoint(file).metrics_csv;
      csv_origin = "the checkpoint's log";
    } catch (const Error&) {
    }
  } else {
    rows.emplace_back("steps", strf("%lld (configured)", static_cast<long long>(c.steps)));
    const std::filesystem::path beside = std::filesystem::path(file).parent_path() / "metrics.csv";
    std::error_code ec;
    if (std::filesystem::is_regular_file(beside, ec)) try {
        csv = read_text(beside.string(), "metrics");
        csv_origin = beside.string();
      } catch (const Error&) {
      }
  }
  if (const std::optional<train::StepMetrics> last = last_evaluation(csv)) {
    std::string v = strf("%.4f at step %lld", last->eval.loss, static_cast<long long>(last->step));
    if (spec && (spec->format == "text" || spec->format == "tokens")) v += strf(" (%.4f bits per %s", last->eval.loss / std::log(2.0),
                                                  spec->tokenizer == "char" ? "character" : "token");
    if (spec && (spec->format == "text" || spec->format == "tokens"))
      v += last->eval.bits_per_byte > 0 ? strf(", %.4f bits per byte)", last->eval.bits_per_byte) : ")";
    if (std::isfinite(last->train_loss)) v += strf(", train loss %.4f", last->train_loss);
    rows.emplace_back("val loss", v + " (from " + csv_origin + ")");
  } else {
    rows.emplace_back("val loss", "unknown (no metrics log beside the file)");
  }
  return rows;
}

int run_inspect(const InspectArgs& a) {
  const io::FileInfo info = io::inspect(a.file);
  const bool corrupt = info.has_checksum && !info.checksum_ok;
  const nlohmann::ordered_json meta = nlohmann::ordered_json::parse(info.metadata, nullptr, false);
  if (a.json) {
    nlohmann::ordered_json j;
    j["file"] = a.file;
    j["kind"] = info.kind;
    j["format_version"] = info.format_version;
    j["file_size"] = info.file_size;
    j["checksum"] = {{"present", info.has_checksum},
                     {"ok", info.checksum_ok},
                     {"stored", hex(info.stored_checksum)},
                     {"computed", hex(info.computed_checksum)}};
    const std::vector<std::pair<std::string, std::string>> summary = run_summary(a.file, info);
    if (!summary.empty()) {
      j["summary"] = nlohmann::ordered_json::object();
      for (const auto& [label, value] : summary) j["summary"][label] = value;
    }
    j["metadata"] = meta.is_discarded() ? nlohmann::ordered_json(info.metadata) : meta;
    if (const std::optional<train::TrainConfig> cfg = saved_config(info.metadata))
      j["attention"] = describe_attention(*cfg);
    j["tensors"] = nlohmann::ordered_json::array();
    for (const io::TensorInfo& t : info.tensors)
      j["tensors"].push_back({{"name", t.name},
                              {"dtype", dtype_name(t.dtype)},
                              {"shape", t.shape},
                              {"nbytes", t.nbytes},
                              {"nonfinite", t.nonfinite}});
    j["elements"] = info.num_elements();
    if (info.kind == "checkpoint") {
      j["counters"] = nlohmann::ordered_json::object();
      for (const auto& [n, v] : info.counters) j["counters"][n] = v;
      j["scalars"] = nlohmann::ordered_json::object();
      for (const auto& [n, v] : info.scalars) j["scalars"][n] = v;
      j["generators"] = nlohmann::ordered_json::array();
      for (const auto& [n, g] : info.generators) j["generators"].push_back(n);
      j["metrics_csv_bytes"] = info.metrics_csv_bytes;
    }
    std::printf("%s\n", j.dump().c_str());
  } else {
    const std::vector<std::pair<std::string, std::string>> summary = run_summary(a.file, info);
    for (const auto& [label, value] : summary) std::printf("%-11s %s\n", label.c_str(), value.c_str());
    if (!summary.empty()) std::printf("\n");
    std::printf("file        %s (%s bytes)\n", a.file.c_str(), thousands(static_cast<int64_t>(info.file_size)).c_str());
    if (info.kind == "safetensors")
      std::printf("kind        safetensors\n");
    else
      std::printf("kind        %s, format version %u\n", info.kind.c_str(), info.format_version);
    if (!info.has_checksum)
      std::printf("checksum    none (safetensors files carry none)\n");
    else if (info.checksum_ok)
      std::printf("checksum    %s OK\n", hex(info.stored_checksum).c_str());
    else
      std::printf("checksum    MISMATCH: stored %s, computed %s: the file is CORRUPT\n",
                  hex(info.stored_checksum).c_str(), hex(info.computed_checksum).c_str());
    if (const std::optional<train::TrainConfig> cfg = saved_config(info.metadata); cfg && summary.empty())
      std::printf("attention   %s\n", describe_attention(*cfg).c_str());
    std::printf("tensors     %zu (%s elements)\n", info.tensors.size(), thousands(info.num_elements()).c_str());
    size_t w = 4;
    for (const io::TensorInfo& t : info.tensors) w = std::max(w, t.name.size());
    std::printf("  %-*s  %-7s  %s\n", static_cast<int>(w), "name", "dtype", "shape");
    for (const io::TensorInfo& t : info.tensors)
      std::printf("  %-*s  %-7s  %s%s\n", static_cast<int>(w), t.name.c_str(), dtype_name(t.dtype).c_str(),
                  shape_str(t.shape).c_str(),
                  t.nonfinite ? strf("  %s NaN or infinite values", thousands(t.nonfinite).c_str()).c_str() : "");
    if (info.kind == "checkpoint") {
      std::printf("counters   ");
      for (const auto& [n, v] : info.counters) std::printf(" %s=%lld", n.c_str(), static_cast<long long>(v));
      std::printf("\nscalars    ");
      for (const auto& [n, v] : info.scalars) std::printf(" %s=%.6g", n.c_str(), v);
      std::printf("\ngenerators ");
      for (const auto& [n, g] : info.generators) std::printf(" %s", n.c_str());
      std::printf("\nmetrics     %s bytes of CSV\n", thousands(static_cast<int64_t>(info.metrics_csv_bytes)).c_str());
    }
    if (meta.is_discarded())
      std::printf("metadata    %s\n", info.metadata.c_str());
    else
      std::printf("metadata\n%s\n", pretty(readable_metadata(meta)).c_str());
  }
  std::fflush(stdout);
  std::vector<const io::TensorInfo*> nonfinite;
  for (const io::TensorInfo& t : info.tensors)
    if (t.nonfinite) nonfinite.push_back(&t);
  if (!nonfinite.empty() && !a.allow_nonfinite)
    throw Error("inspect", str_cat("'", a.file, "': tensor '", nonfinite[0]->name, "' holds ", nonfinite[0]->nonfinite,
                               " NaN or infinite values", nonfinite.size() > 1 ? str_cat(" (and ", nonfinite.size() - 1,
                                                                                        " more tensors hold some)")
                                                                              : std::string(),
                               ": these weights cannot be loaded; --allow-nonfinite lists them with exit status 0"));
  if (corrupt)
    throw Error("inspect", str_cat("'", a.file, "' is corrupt: checksum mismatch (stored ", hex(info.stored_checksum),
                               ", computed ", hex(info.computed_checksum), ")"));
  return kExitOk;
}

}  // namespace

Command add_inspect(CLI::App& app) {
  CLI::App* sub = app.add_subcommand("inspect", "Show what a weights, checkpoint or safetensors file holds");
  auto a = std::make_shared<InspectArgs>();
  sub->add_option("file", a->file, "the file")->required()->check(CLI::ExistingFile);
  sub->add_flag("--json", a->json, "print the description as one JSON object");
  sub->add_flag("--allow-nonfinite", a->allow_nonfinite,
                "a file whose float tensors hold NaN or infinite values (which every loader refuses) is listed with "
                "their counts and exit status 0 instead of 2");
  sub->footer(
      "Lists the format version, kind, metadata and every tensor (name, dtype, shape) and verifies the checksum.\n"
      "Exit status 2 when the file is unreadable or corrupt, or holds NaN or infinite values (listed and\n"
      "counted first; --allow-nonfinite: exit status 0).\n\n"
      "Examples:\n"
      "  attograd inspect runs/reverse-lm/model.attograd\n"
      "  attograd inspect runs/reverse-lm/checkpoint.attograd --json");
  return {sub, [a] { return run_inspect(*a); }};
}

}  // namespace attograd::cli
