#pragma once
// Shared by the weight-file tests: a temporary directory and whole-file reads and writes.

#include <stdlib.h>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

namespace attograd::testing {

/// A fresh directory under /tmp (mkdtemp), removed with everything in it at the end of the test.
class TempDir {
 public:
  /// Creates /tmp/attograd_<tag>_XXXXXX.
  explicit TempDir(const std::string& tag) {
    std::string templ = "/tmp/attograd_" + tag + "_XXXXXX";
    path_ = ::mkdtemp(templ.data());
  }
  ~TempDir() { std::filesystem::remove_all(path_); }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  /// The path of `name` inside the directory.
  std::string file(const std::string& name) const { return path_ + "/" + name; }
  /// The names of the directory's entries, sorted.
  std::vector<std::string> entries() const {
    std::vector<std::string> out;
    for (auto& e : std::filesystem::directory_iterator(path_)) out.push_back(e.path().filename().string());
    std::sort(out.begin(), out.end());
    return out;
  }
  /// How many entries the directory has.
  size_t count() const { return entries().size(); }

 private:
  std::string path_;
};

/// The whole file as bytes (empty when it cannot be read).
inline std::vector<uint8_t> read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::vector<uint8_t>(std::istreambuf_iterator<char>(in), {});
}

/// Writes `bytes` as the whole file.
inline void write_bytes(const std::string& path, const std::vector<uint8_t>& bytes) {
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
}

/// Writes the characters of `text` (any bytes) as the whole file.
inline void write_string(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary);
  out.write(text.data(), static_cast<std::streamsize>(text.size()));
}

}  // namespace attograd::testing
