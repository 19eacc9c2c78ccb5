// libFuzzer target for the safetensors parser (train/io/safetensors.h). Only attograd::Error may escape; anything
// else (a crash, an ASan report, another exception) is a bug.
//
//   CC=clang-14 CXX=clang++-14 cmake -S . -B build-fuzz -DATTOGRAD_FUZZ=ON -DATTOGRAD_BUILD_TESTS=OFF \
//       -DATTOGRAD_BUILD_EXAMPLES=OFF && cmake --build build-fuzz --target fuzz_safetensors
//   build-fuzz/fuzz_safetensors -max_total_time=60 -rss_limit_mb=2048 -dict=fuzz/safetensors.dict
//   fuzz/corpus/safetensors

#include <cstdint>

#include "train/io/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  namespace io = attograd::io;
  uint64_t total = 0;
  try {
    io::SafeTensors st = io::parse_safetensors_from_memory(data, size);
    for (auto& [name, t] : st.tensors) total += t.nbytes();
    // An accepted file's tensors tile its data section exactly.
    uint64_t header = 0;
    for (int i = 7; i >= 0; --i) header = (header << 8) | data[i];
    if (total != size - 8 - header) __builtin_trap();
  } catch (const attograd::Error&) {
  }
  if (io::detail::last_parse_stats().max_allocation > size) __builtin_trap();
  try {
    io::inspect_memory(data, size);
  } catch (const attograd::Error&) {
  }
  return 0;
}
