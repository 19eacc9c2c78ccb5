// libFuzzer target for the JSON a run's configuration comes from: `attograd train --config` (TrainConfig::from_json,
// then validate() and the memory estimate, never building a model) and a weights file's metadata (the input placed
// as the metadata of an otherwise valid, checksummed weights file, parsed and read back as a configuration, as
// `attograd eval` does). Only attograd::Error may escape; a crash, an ASan report, a stack overflow on deep nesting
// or another exception is a bug.
//
//   CC=clang-14 CXX=clang++-14 cmake -S . -B build-fuzz -DATTOGRAD_FUZZ=ON -DATTOGRAD_BUILD_TESTS=OFF \
//       -DATTOGRAD_BUILD_EXAMPLES=OFF && cmake --build build-fuzz --target fuzz_config
//   build-fuzz/fuzz_config -max_total_time=60 -rss_limit_mb=2048 fuzz/corpus/config

#include <cstdint>
#include <string>
#include <vector>

#include "train/io/serialize.h"
#include "train/trainer.h"

namespace {

void read_config(const std::string& text) {
  try {
    const attograd::train::TrainConfig c = attograd::train::TrainConfig::from_json(text);
    (void)c.estimate_memory();
    c.validate();
  } catch (const attograd::Error&) {
  }
}

// A weights file (format version 1, no tensors) whose metadata is `metadata`, with a valid checksum.
std::vector<uint8_t> weights_file_with_metadata(const std::string& metadata) {
  std::vector<uint8_t> f(attograd::io::kMagic, attograd::io::kMagic + 8);
  auto put = [&](uint64_t v, int bytes) {
    for (int i = 0; i < bytes; ++i) f.push_back(static_cast<uint8_t>(v >> (8 * i)));
  };
  f.push_back(1);                   // little-endian
  put(attograd::io::kFormatVersion, 4);
  put(0, 4);                        // weights
  put(metadata.size(), 8);
  f.insert(f.end(), metadata.begin(), metadata.end());
  put(0, 8);                        // no tensors
  put(attograd::io::detail::xxh64(f.data(), f.size()), 8);
  return f;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  read_config(text);
  const std::vector<uint8_t> file = weights_file_with_metadata(text);
  try {
    const attograd::io::FileInfo info = attograd::io::inspect_memory(file.data(), file.size());
    read_config(info.metadata);
  } catch (const attograd::Error&) {
  }
  return 0;
}
