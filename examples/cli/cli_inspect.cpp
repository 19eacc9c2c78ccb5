// `attograd inspect FILE`: what a weights, checkpoint or safetensors file holds and whether its checksum holds.

#include <algorithm>
#include <cstdio>
#include <optional>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli.h"
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
    std::printf("metadata    %s\n", meta.is_discarded() ? info.metadata.c_str() : meta.dump().c_str());
    if (const std::optional<train::TrainConfig> cfg = saved_config(info.metadata))
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
