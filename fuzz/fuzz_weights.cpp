// libFuzzer target for the native weights and checkpoint parser (train/io/serialize.h).
// Each input is parsed as given (the checksum gate rejects nearly all of them), then again with its last 8 bytes
// replaced by the valid checksum, so that the structural checks behind the gate are fuzzed too. Only
// attograd::Error may escape the parsers; anything else (a crash, an ASan report, another exception) is a bug.
//
//   CC=clang-14 CXX=clang++-14 cmake -S . -B build-fuzz -DATTOGRAD_FUZZ=ON -DATTOGRAD_BUILD_TESTS=OFF \
//       -DATTOGRAD_BUILD_EXAMPLES=OFF && cmake --build build-fuzz --target fuzz_weights
//   build-fuzz/fuzz_weights -max_total_time=60 -rss_limit_mb=2048 fuzz/corpus/weights

#include <cstdint>
#include <cstring>
#include <vector>

#include "train/io/serialize.h"

namespace {

void parse_all(const uint8_t* data, size_t size) {
  namespace io = attograd::io;
  try {
    std::string metadata;
    io::parse_tensors_from_memory(data, size, &metadata);
  } catch (const attograd::Error&) {
  }
  try {
    io::parse_checkpoint_from_memory(data, size);
  } catch (const attograd::Error&) {
  }
  try {
    io::inspect_memory(data, size);
  } catch (const attograd::Error&) {
  }
  // The loader's memory bound: no single allocation sized by the input exceeds the input.
  if (io::detail::last_parse_stats().max_allocation > size) __builtin_trap();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  parse_all(data, size);
  if (size >= 16) {
    std::vector<uint8_t> fixed(data, data + size);
    const uint64_t h = attograd::io::detail::xxh64(fixed.data(), size - 8);
    for (int i = 0; i < 8; ++i) fixed[size - 8 + i] = static_cast<uint8_t>(h >> (8 * i));
    parse_all(fixed.data(), fixed.size());
  }
  return 0;
}
