// Helpers shared by the attograd subcommands: rebuilding a model from a file, reading files, memory use.

#include <sys/resource.h>

#include <cstdarg>
#include <cstdio>
#include <fstream>
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

double peak_rss_mb() {
  rusage ru{};
  if (getrusage(RUSAGE_SELF, &ru) != 0) return 0;
  return static_cast<double>(ru.ru_maxrss) / 1024.0;  // Linux reports kilobytes
}

std::string read_text(const std::string& path, const char* what) {
  std::ifstream f(path, std::ios::binary);
  ATTO_CHECK(f.good(), what, "cannot read '", path, "'");
  std::ostringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

train::TrainConfig config_from_metadata(const std::string& metadata, const std::string& path) {
  const nlohmann::json j = nlohmann::json::parse(metadata, nullptr, false);
  if (j.is_object() && j.contains("task") && j.contains("model")) return train::TrainConfig::from_json(metadata);
  if (j.is_object() && j.contains("attograd_config") && j["attograd_config"].is_string())
    return train::TrainConfig::from_json(j["attograd_config"].get<std::string>());
  throw Error("load", str_cat("'", path,
                          "' has no training configuration in its metadata (write weights with `attograd train` or "
                          "`attograd import --config`)"));
}

std::unique_ptr<train::Trainer> load_model(const std::string& path, std::optional<uint64_t> seed) {
  const io::FileInfo info = io::inspect(path);
  ATTO_CHECK(!info.has_checksum || info.checksum_ok, "load", "'", path, "' is corrupt: checksum mismatch (stored ",
             strf("%016llx", static_cast<unsigned long long>(info.stored_checksum)), ", computed ",
             strf("%016llx", static_cast<unsigned long long>(info.computed_checksum)), ")");
  train::TrainConfig cfg = config_from_metadata(info.metadata, path);
  if (seed) cfg.seed = *seed;
  auto trainer = std::make_unique<train::Trainer>(cfg);
  if (info.kind == "checkpoint")
    trainer->load_checkpoint(path);
  else if (info.kind == "safetensors")
    io::import_safetensors(trainer->model(), path);
  else
    io::load(trainer->model(), path);
  return trainer;
}

}  // namespace attograd::cli
