#pragma once
// A per-process scratch directory for tests, removed with everything in it when the process exits.

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

// Not inside namespace attograd: the CLI tests name their functions `attograd` and `scratch`.
namespace test_scratch {

/// The process's scratch directory /tmp/attograd_<tag>_XXXXXX (mkdtemp), created on first use and removed at exit.
/// One tag per test binary: the directory lives as long as the process, so files may be shared between tests.
inline const std::filesystem::path& dir(const std::string& tag) {
  struct Dir {
    std::filesystem::path path;
    pid_t owner = ::getpid();  // a forked child that exits must not remove its parent's directory
    explicit Dir(const std::string& t) {
      std::string templ = (std::filesystem::temp_directory_path() / ("attograd_" + t + "_XXXXXX")).string();
      if (::mkdtemp(templ.data()) == nullptr) throw std::filesystem::filesystem_error("mkdtemp", templ, {});
      path = templ;
    }
    ~Dir() {
      if (::getpid() != owner) return;
      std::error_code ec;
      std::filesystem::remove_all(path, ec);
    }
  };
  static const Dir dir(tag);
  return dir.path;
}

/// Writes `bytes` to `name` in the scratch directory of `tag` and returns its path.
inline std::string file(const std::string& tag, const std::string& name, const std::string& bytes) {
  const std::string path = (dir(tag) / name).string();
  std::ofstream(path, std::ios::binary) << bytes;
  return path;
}

}  // namespace test_scratch
