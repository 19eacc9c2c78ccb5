// The weights format's checksum: XXH64 from libxxhash, one-shot (io::detail::xxh64) and streamed while a file is
// written (io::detail::AtomicFile::digest), against xxHash's own published sanity values.

#include <cstdint>
#include <vector>

#include "testing.h"
#include "train/io/files.h"
#include "train/io/serialize.h"

namespace attograd {
namespace {

constexpr uint64_t kPrime32 = 2654435761ULL;
constexpr uint64_t kPrime64 = 11400714785074694797ULL;

// xxHash's sanity buffer (cli/xsum_sanity_check.c): byte i is the top byte of PRIME32 * PRIME64^i.
std::vector<uint8_t> sanity_buffer(size_t n) {
  std::vector<uint8_t> b(n);
  uint64_t gen = kPrime32;
  for (uint8_t& v : b) {
    v = static_cast<uint8_t>(gen >> 56);
    gen *= kPrime64;
  }
  return b;
}

TEST(Checksum, XxHashSanityVectors) {
  using io::detail::xxh64;
  const std::vector<uint8_t> b = sanity_buffer(222);
  EXPECT_EQ(xxh64(nullptr, 0), 0xEF46DB3751D8E999ULL);
  EXPECT_EQ(xxh64(nullptr, 0, kPrime32), 0xAC75FDA2929B17EFULL);
  EXPECT_EQ(xxh64(b.data(), 1), 0xE934A84ADB052768ULL);
  EXPECT_EQ(xxh64(b.data(), 1, kPrime32), 0x5014607643A9B4C3ULL);
  EXPECT_EQ(xxh64(b.data(), 14), 0x8282DCC4994E35C8ULL);
  EXPECT_EQ(xxh64(b.data(), 14, kPrime32), 0xC3BD6BF63DEB6DF0ULL);
  EXPECT_EQ(xxh64(b.data(), 222), 0xB641AE8CB691C174ULL);
  EXPECT_EQ(xxh64(b.data(), 222, kPrime32), 0x20CB8AB7AE10C14AULL);
}

// Written in pieces of every size class (within a 32-byte stripe, across stripes, larger than the file sink's
// 64 KiB buffer), the streamed digest equals the one-shot hash of the file's bytes.
TEST(Checksum, StreamedWhileWritingEqualsOneShot) {
  testing::TempDir dir("checksum");
  const std::string path = dir.file("stream.bin");
  const std::vector<uint8_t> data = sanity_buffer(200000);
  uint64_t streamed = 0;
  {
    io::detail::AtomicFile f(path, "checksum test");
    size_t at = 0;
    for (size_t piece : {size_t{1}, size_t{3}, size_t{31}, size_t{32}, size_t{33}, size_t{7}, size_t{100000}, size_t{5},
                         size_t{70000}}) {
      f.stream().write(reinterpret_cast<const char*>(data.data() + at), static_cast<std::streamsize>(piece));
      at += piece;
      if (piece == 7) f.flush_midway();
    }
    f.stream().write(reinterpret_cast<const char*>(data.data() + at), static_cast<std::streamsize>(data.size() - at));
    streamed = f.digest();
    f.commit();
  }
  EXPECT_EQ(testing::read_bytes(path), data);
  EXPECT_EQ(streamed, io::detail::xxh64(data.data(), data.size()));
  EXPECT_EQ(io::detail::xxh64(data.data(), 222), 0xB641AE8CB691C174ULL);  // the same generator as the vectors
}

}  // namespace
}  // namespace attograd
