// libFuzzer target for `attograd train --data DIR`: a directory written by `attograd prepare` whose one file is the
// input. The first byte picks which (0: train.bin, 1: val.bin, 2: meta.json); the rest replaces that file of a valid
// directory (the other two stay valid), which TokenFileDataset then opens, drawing windows and held-out windows when
// it accepts it. Only attograd::Error may escape; a crash, an ASan report or another exception is a bug.
//
//   CC=clang-14 CXX=clang++-14 cmake -S . -B build-fuzz -DATTOGRAD_FUZZ=ON -DATTOGRAD_BUILD_TESTS=OFF \
//       -DATTOGRAD_BUILD_EXAMPLES=OFF && cmake --build build-fuzz --target fuzz_tokens
//   build-fuzz/fuzz_tokens -max_total_time=60 -rss_limit_mb=2048 fuzz/corpus/tokens

#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>

#include "train/data/tokens.h"

namespace {

namespace fs = std::filesystem;

// A valid prepared directory (made once), and a scratch directory each input is written into.
struct Dirs {
  fs::path root, good, work;
  Dirs() {
    root = fs::temp_directory_path() / ("attograd_fuzz_tokens_" + std::to_string(::getpid()));
    fs::create_directories(root);
    const fs::path text = root / "text.txt";
    std::ofstream(text, std::ios::binary) << "The quick brown fox jumps over the lazy dog.\n\xE4\xB8\xAD\xE6\x96\x87\n"
                                             "Pack my box with five dozen liquor jugs.\n";
    good = root / "good";
    work = root / "work";
    attograd::data::prepare({.inputs = {text.string()}, .out = good.string(), .val_fraction = 0.25});
    fs::create_directories(work);
  }
  ~Dirs() {
    std::error_code ec;
    fs::remove_all(root, ec);
  }
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const Dirs dirs;
  if (size == 0) return 0;
  const char* names[] = {"train.bin", "val.bin", "meta.json"};
  const int which = data[0] % 3;
  for (const char* n : names) fs::copy_file(dirs.good / n, dirs.work / n, fs::copy_options::overwrite_existing);
  std::ofstream(dirs.work / names[which], std::ios::binary | std::ios::trunc)
      .write(reinterpret_cast<const char*>(data + 1), static_cast<std::streamsize>(size - 1));
  try {
    attograd::data::TokenFileDataset d({.format = "tokens", .path = dirs.work.string(), .context = 4});
    d.seed(1);
    for (int i = 0; i < 8; ++i) (void)d.to_text(d.next().src);
    for (const auto& e : d.heldout(4, 0)) (void)d.to_text(e.src);
  } catch (const attograd::Error&) {
  }
  return 0;
}
