// Corruption sweeps over the loaders (train/io/serialize.h, train/io/safetensors.h): truncation at every length, a flipped
// byte at every offset, single-bit flips, seeded random corruptions, and hand-forged files whose sizes lie but whose
// checksum is valid. Every input must be rejected with attograd::Error or load exactly the original data (and for
// each sweep the test says which), never crash, and never allocate more than the input's size in one piece.

#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>

#include "testing.h"
#include "train/io/safetensors.h"
#include "train/io/serialize.h"

using namespace attograd;
using namespace attograd::testing;
namespace io = attograd::io;
namespace fs = std::filesystem;

namespace {

using Bytes = std::vector<uint8_t>;

std::string temp_path(const std::string& stem) {
  return (fs::temp_directory_path() / (stem + "_" + std::to_string(::getpid()))).string();
}

Bytes read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return Bytes(std::istreambuf_iterator<char>(in), {});
}

bool same_tensors(const io::NamedTensors& a, const io::NamedTensors& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    const Tensor &x = a[i].second, &y = b[i].second;
    if (a[i].first != b[i].first || x.dtype() != y.dtype() || x.shape() != y.shape()) return false;
    if (x.nbytes() && std::memcmp(x.raw_data(), y.raw_data(), x.nbytes()) != 0) return false;
  }
  return true;
}

const std::string kMeta = R"({"d_model": 4, "note": "corruption sweep"})";

// The small weights file of the sweep (a few hundred bytes): every dtype, a 0-d and an empty tensor.
io::NamedTensors small_tensors() {
  return {{"linear.weight", from_vector<float>({0.5f, -1, 2, NAN, 1e-3f, 7, -0.0f, 3, 4, 5, 6, 8}, {3, 4})},
          {"linear.bias", from_vector<float>({0.25f, -0.75f, 1}, {3})},
          {"norm.weight", from_vector<double>({1.0 / 3.0, 2, -4}, {3})},
          {"steps", from_vector<int64_t>({-1, 1LL << 40}, {2})},
          {"mask", from_vector<bool>({true, false, false, true}, {4})},
          {"scale", scalar_tensor(0.125)},
          {"empty", zeros({0, 2})}};
}

Bytes small_weights_file() {
  const std::string path = temp_path("attograd_corruption_w");
  io::write_tensors(path, small_tensors(), kMeta);
  Bytes b = read_bytes(path);
  fs::remove(path);
  return b;
}

Bytes small_checkpoint_file() {
  const std::string path = temp_path("attograd_corruption_ck");
  io::Checkpoint ck;
  ck.metadata_json = kMeta;
  ck.tensors = {{"model.w", from_vector<float>({1, 2, 3, 4}, {2, 2})}};
  ck.generators = {{"data", Generator(7).get_state()}};
  ck.counters = {{"step", 12}};
  ck.scalars = {{"lr", 0.01}};
  ck.metrics_csv = "step,loss\n12,0.5\n";
  io::save_checkpoint(ck, path);
  Bytes b = read_bytes(path);
  fs::remove(path);
  return b;
}

Bytes small_safetensors_file();

enum class Outcome { Rejected, Identical, Different };

// Parses `bytes` as a weights file; checks that no single allocation exceeded the input size.
Outcome parse_weights(const Bytes& bytes, std::string* message = nullptr) {
  Outcome out;
  try {
    std::string meta;
    io::NamedTensors t = io::parse_tensors_from_memory(bytes.data(), bytes.size(), &meta);
    out = same_tensors(t, small_tensors()) && meta == kMeta ? Outcome::Identical : Outcome::Different;
  } catch (const Error& e) {
    if (message) *message = e.what();
    out = Outcome::Rejected;
  }
  EXPECT_LE(io::detail::last_parse_stats().max_allocation, bytes.size());
  // inspect() reads the same structure without the checksum gate: it may accept, but must not crash or over-allocate.
  try {
    io::inspect_memory(bytes.data(), bytes.size());
  } catch (const Error&) {
  }
  EXPECT_LE(io::detail::last_parse_stats().max_allocation, bytes.size());
  return out;
}

bool checkpoint_rejected(const Bytes& bytes) {
  bool rejected = false;
  try {
    io::parse_checkpoint_from_memory(bytes.data(), bytes.size());
  } catch (const Error&) {
    rejected = true;
  }
  EXPECT_LE(io::detail::last_parse_stats().max_allocation, bytes.size());
  return rejected;
}

// Writes native files field by field, independently of the library's writer, then appends a valid checksum.
struct Forge {
  Bytes b;
  Forge& raw(const void* p, size_t n) {
    b.insert(b.end(), static_cast<const uint8_t*>(p), static_cast<const uint8_t*>(p) + n);
    return *this;
  }
  Forge& u8(uint8_t v) { return raw(&v, 1); }
  Forge& u32(uint32_t v) { return raw(&v, 4); }
  Forge& u64(uint64_t v) { return raw(&v, 8); }
  Forge& i64(int64_t v) { return raw(&v, 8); }
  Forge& str(const std::string& s) { return u64(s.size()).raw(s.data(), s.size()); }
  Forge& header(uint64_t count, uint32_t kind = 0, const std::string& meta = "{}", uint32_t version = 1,
                uint8_t order = 1) {
    return raw("ATTOGRAD", 8).u8(order).u32(version).u32(kind).str(meta).u64(count);
  }
  // A tensor record: name, dtype code, dims, then `data_bytes` bytes of value `fill`.
  Forge& tensor(const std::string& name, uint8_t code, const std::vector<int64_t>& dims, size_t data_bytes,
                uint8_t fill = 0) {
    str(name).u8(code).u8(static_cast<uint8_t>(dims.size()));
    for (int64_t d : dims) i64(d);
    b.insert(b.end(), data_bytes, fill);
    return *this;
  }
  Bytes finish() const {
    Bytes out = b;
    uint64_t h = io::detail::xxh64(out.data(), out.size());
    out.insert(out.end(), reinterpret_cast<uint8_t*>(&h), reinterpret_cast<uint8_t*>(&h) + 8);
    return out;
  }
};

}  // namespace

// ---------------------------------------------------------------------------------------------
// Native weights and checkpoints

TEST(Corruption, TheSweptFilesAreSmallAndLoad) {
  Bytes w = small_weights_file(), ck = small_checkpoint_file();
  RecordProperty("weights_bytes", static_cast<int>(w.size()));
  RecordProperty("checkpoint_bytes", static_cast<int>(ck.size()));
  RecordProperty("safetensors_bytes", static_cast<int>(small_safetensors_file().size()));
  EXPECT_GE(w.size(), 200u);
  EXPECT_LE(w.size(), 4096u);
  EXPECT_EQ(parse_weights(w), Outcome::Identical);
  EXPECT_FALSE(checkpoint_rejected(ck));
}

TEST(Corruption, ForgeWritesTheLibrarysFormat) {
  // The forge is an independent writer of the documented layout: its file must equal the library's byte for byte.
  const std::string path = temp_path("attograd_corruption_forge");
  io::write_tensors(path, {{"a", from_vector<float>({1, 2}, {2})}, {"b", scalar_tensor(3.0, {.dtype = kInt64})}},
                    R"({"k": 1})");
  Bytes lib = read_bytes(path);
  fs::remove(path);
  float a[2] = {1, 2};
  int64_t three = 3;
  Forge f;
  f.header(2, 0, R"({"k": 1})").str("a").u8(0).u8(1).i64(2).raw(a, 8).str("b").u8(2).u8(0).raw(&three, 8);
  EXPECT_EQ(f.finish(), lib);
}

TEST(Corruption, TruncationAtEveryLengthIsRejected) {
  for (const Bytes& file : {small_weights_file(), small_checkpoint_file()}) {
    for (size_t len = 0; len < file.size(); ++len) {
      Bytes cut(file.begin(), file.begin() + static_cast<std::ptrdiff_t>(len));
      EXPECT_EQ(parse_weights(cut), Outcome::Rejected) << "length " << len;
      EXPECT_TRUE(checkpoint_rejected(cut)) << "length " << len;
    }
  }
}

TEST(Corruption, EveryFlippedByteAndBitIsRejected) {
  // Every byte is covered by the checksum (or is the checksum): there are no don't-care bytes in this format, so
  // every flip must be rejected; none may load, not even identically.
  const Bytes file = small_weights_file();
  size_t rejected = 0, total = 0;
  for (size_t i = 0; i < file.size(); ++i) {
    for (int mask : {0xFF, 0x01, 0x02, 0x04, 0x08, 0x10, 0x20, 0x40, 0x80}) {
      Bytes bad = file;
      bad[i] ^= static_cast<uint8_t>(mask);
      std::string msg;
      Outcome o = parse_weights(bad, &msg);
      ++total;
      if (o == Outcome::Rejected)
        ++rejected;
      else
        ADD_FAILURE() << "flip 0x" << std::hex << mask << " at byte " << std::dec << i << " was accepted";
      if (i >= 8) {  // bytes 0-7 give "bad magic"
        EXPECT_NE(msg.find("checksum mismatch"), std::string::npos) << msg;
      }
    }
  }
  EXPECT_EQ(rejected, total);
  const Bytes ck = small_checkpoint_file();
  for (size_t i = 0; i < ck.size(); ++i) {
    Bytes bad = ck;
    bad[i] ^= 0xFF;
    EXPECT_TRUE(checkpoint_rejected(bad)) << "byte " << i;
  }
}

TEST(Corruption, SeededRandomCorruptionsAreRejected) {
  const Bytes file = small_weights_file();
  std::mt19937_64 rng(20240607);
  auto pick = [&](size_t n) { return static_cast<size_t>(rng() % n); };
  int rejected = 0, unchanged = 0;
  for (int trial = 0; trial < 3000; ++trial) {
    Bytes bad = file;
    switch (trial % 5) {
      case 0:  // overwrite 1 to 8 random bytes
        for (size_t k = 1 + pick(8); k > 0; --k) bad[pick(bad.size())] = static_cast<uint8_t>(rng());
        break;
      case 1:  // insert random bytes
        bad.insert(bad.begin() + static_cast<std::ptrdiff_t>(pick(bad.size() + 1)), 1 + pick(16),
                   static_cast<uint8_t>(rng()));
        break;
      case 2: {  // delete a range
        size_t at = pick(bad.size()), n = 1 + pick(std::min<size_t>(32, bad.size() - at));
        bad.erase(bad.begin() + static_cast<std::ptrdiff_t>(at), bad.begin() + static_cast<std::ptrdiff_t>(at + n));
        break;
      }
      case 3: {  // overwrite an aligned 8-byte word (a length or count field, often) with a random or extreme value
        size_t at = pick(bad.size() / 8) * 8;
        uint64_t v = (rng() & 1) ? rng() : (uint64_t{1} << pick(64));
        std::memcpy(bad.data() + at, &v, std::min<size_t>(8, bad.size() - at));
        break;
      }
      default:  // truncate and append garbage
        bad.resize(pick(bad.size()));
        for (size_t k = pick(64); k > 0; --k) bad.push_back(static_cast<uint8_t>(rng()));
        break;
    }
    if (bad == file) {
      ++unchanged;
      continue;
    }
    Outcome o = parse_weights(bad);
    if (o == Outcome::Rejected)
      ++rejected;
    else
      ADD_FAILURE() << "trial " << trial << " was accepted";
  }
  EXPECT_EQ(rejected + unchanged, 3000);
  RecordProperty("rejected", rejected);
  RecordProperty("unchanged", unchanged);
  EXPECT_LT(unchanged, 30);
}

TEST(Corruption, ForgedSizesWithAValidChecksumAreRejected) {
  const uint8_t f32 = 0, f64 = 1, i64 = 2, boolean = 3;
  const char kPad[17] = "0123456789abcdef";
  struct Case {
    const char* what;
    Bytes bytes;
    const char* message;
  };
  std::vector<Case> cases = {
      {"huge dim", Forge().header(1).tensor("w", f32, {int64_t{1} << 62}, 8).finish(),
       "tensor 'w': shape [4611686018427387904] overflows 64 bits in bytes"},
      {"huge dim (fits 64 bits)", Forge().header(1).tensor("w", f32, {int64_t{1} << 40}, 8).finish(),
       "tensor 'w': shape [1099511627776] float32 needs 4398046511104 bytes of data but only 8 are left"},
      {"product overflow", Forge().header(1).tensor("w", f32, {int64_t{1} << 32, int64_t{1} << 32}, 8).finish(),
       "tensor 'w': shape [4294967296, 4294967296] overflows 64 bits"},
      {"product times size overflow", Forge().header(1).tensor("w", f64, {int64_t{1} << 61}, 8).finish(),
       "overflows 64 bits"},
      {"zero dim hides a huge one", Forge().header(1).tensor("w", f32, {0, int64_t{1} << 62}, 0).finish(), ""},
      {"negative dim", Forge().header(1).tensor("w", f32, {2, -1}, 8).finish(),
       "tensor 'w': negative dim in shape [2, -1]"},
      {"most negative dim", Forge().header(1).tensor("w", f32, {INT64_MIN}, 8).finish(), "negative dim"},
      {"count larger than the file", Forge().header(1000).tensor("w", f32, {2}, 8).finish(),
       "tensor count 1000 cannot fit in the"},
      {"count one too many", Forge().header(2).tensor("w", f32, {1}, 4).finish(),
       "tensor 1: tensor name needs 8 bytes"},
      {"huge count", Forge().header(uint64_t{1} << 63).finish(), "cannot fit"},
      {"huge name length", Forge().header(1).u64(uint64_t{1} << 62).raw(kPad, 16).finish(),
       "tensor name length 4611686018427387904 exceeds the cap of 65536 bytes"},
      {"name longer than the file", Forge().header(1).u64(1000).raw(kPad, 16).finish(),
       "tensor name length 1000 exceeds the 16 bytes left"},
      {"huge metadata length", Forge().raw("ATTOGRAD", 8).u8(1).u32(1).u32(0).u64(uint64_t{1} << 40).u64(0).finish(),
       "metadata length 1099511627776 exceeds the"},
      {"metadata not JSON", Forge().header(0, 0, "{oops").finish(), "metadata is not valid JSON"},
      {"rank 9", Forge().header(1).tensor("w", f32, {1, 1, 1, 1, 1, 1, 1, 1, 1}, 4).finish(),
       "rank 9 exceeds the maximum of 8"},
      {"rank 255", Forge().header(1).str("w").u8(f32).u8(255).finish(), "rank 255"},
      {"unknown dtype", Forge().header(1).tensor("w", 7, {1}, 4).finish(), "unknown dtype code 7"},
      {"version 2", Forge().header(0, 0, "{}", 2).finish(), "unsupported format version 2"},
      {"version 0", Forge().header(0, 0, "{}", 0).finish(), "unsupported format version 0"},
      {"unknown kind", Forge().header(0, 5).finish(), "unknown file kind 5"},
      {"byte order", Forge().header(0, 0, "{}", 1, 0).finish(), "byte-order flag 0"},
      {"trailing byte", Forge().header(1).tensor("w", f32, {1}, 4).u8(0).finish(), "1 trailing bytes"},
      {"duplicate names", Forge().header(2).tensor("w", f32, {1}, 4).tensor("w", f32, {1}, 4).finish(),
       "tensor 'w': duplicate name"},
      {"empty name", Forge().header(1).tensor("", f32, {1}, 4).finish(), "empty tensor name"},
      {"bool byte 2", Forge().header(1).tensor("m", boolean, {3}, 3, 2).finish(),
       "tensor 'm': bool element 0 has byte value 2"},
      {"hostile name", Forge().header(1).tensor(std::string("a\x01\xff", 3), i64, {-4}, 0).finish(),
       "tensor 'a\\x01\\xff': negative dim"},
      // Checkpoint sections.
      {"huge generator count", Forge().header(0, 1).u64(uint64_t{1} << 60).finish(),
       "generator count 1152921504606846976 cannot fit"},
      {"huge counter count", Forge().header(0, 1).u64(0).u64(1u << 20).finish(), "counter count 1048576 cannot fit"},
      {"huge scalar count", Forge().header(0, 1).u64(0).u64(0).u64(99).finish(), "scalar count 99 cannot fit"},
      {"huge metrics length", Forge().header(0, 1).u64(0).u64(0).u64(0).u64(uint64_t{1} << 50).finish(),
       "metrics_csv length 1125899906842624 exceeds the"},
      {"duplicate counters", Forge().header(0, 1).u64(0).u64(2).str("s").i64(1).str("s").i64(2).u64(0).str("").finish(),
       "duplicate counter name 's'"},
      {"missing checkpoint sections", Forge().header(0, 1).finish(), "generator count needs 8 bytes"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    bool rejected = false;
    std::string msg;
    const bool is_checkpoint = c.bytes[13] == 1;
    try {
      if (is_checkpoint)
        io::parse_checkpoint_from_memory(c.bytes.data(), c.bytes.size(), "forged");
      else
        io::parse_tensors_from_memory(c.bytes.data(), c.bytes.size(), nullptr, "forged");
    } catch (const Error& e) {
      rejected = true;
      msg = e.what();
    }
    EXPECT_LE(io::detail::last_parse_stats().max_allocation, c.bytes.size());
    if (std::string(c.message).empty()) {  // a legal file: [0, 2^62] has no elements
      EXPECT_FALSE(rejected) << msg;
      continue;
    }
    EXPECT_TRUE(rejected);
    EXPECT_NE(msg.find(c.message), std::string::npos) << msg;
    EXPECT_NE(msg.find("'forged'"), std::string::npos) << msg;
  }
}

// ---------------------------------------------------------------------------------------------
// safetensors (no checksum: a flipped data byte cannot be detected and loads as written)

namespace {

Bytes small_safetensors_file() {
  const std::string path = temp_path("attograd_corruption_st");
  io::NamedTensors t = small_tensors();
  io::write_safetensors(path, t, {{"format", "pt"}});
  Bytes b = read_bytes(path);
  fs::remove(path);
  return b;
}

struct StResult {
  bool rejected = false;
  io::SafeTensors st;
};

StResult parse_st(const Bytes& bytes) {
  StResult r;
  try {
    r.st = io::parse_safetensors_from_memory(bytes.data(), bytes.size());
  } catch (const Error&) {
    r.rejected = true;
  }
  EXPECT_LE(io::detail::last_parse_stats().max_allocation, bytes.size());
  try {
    io::inspect_memory(bytes.data(), bytes.size());
  } catch (const Error&) {
  }
  return r;
}

uint64_t header_len(const Bytes& b) {
  uint64_t n;
  std::memcpy(&n, b.data(), 8);
  return n;
}

}  // namespace

TEST(Corruption, SafetensorsTruncationAtEveryLengthIsRejected) {
  const Bytes file = small_safetensors_file();
  ASSERT_FALSE(parse_st(file).rejected);
  for (size_t len = 0; len < file.size(); ++len)
    EXPECT_TRUE(parse_st(Bytes(file.begin(), file.begin() + static_cast<std::ptrdiff_t>(len))).rejected) << len;
}

TEST(Corruption, SafetensorsFlippedBytes) {
  // Header bytes (length and JSON): every 0xFF flip is rejected (it breaks the length, the JSON or its UTF-8).
  // Data bytes: the format has no checksum, so a flip loads as written: the same names, dtypes and shapes with
  // exactly one byte different, except in a BOOL tensor, where the flipped byte is not 0 or 1 and is rejected.
  const Bytes file = small_safetensors_file();
  const io::SafeTensors original = parse_st(file).st;
  const size_t data_start = 8 + header_len(file);
  io::FileInfo info = io::inspect_memory(file.data(), file.size());
  auto in_bool_tensor = [&](size_t at) {
    for (auto& t : info.tensors)
      if (t.dtype == kBool && at >= t.offset && at < t.offset + t.nbytes) return true;
    return false;
  };
  size_t header_rejected = 0, data_accepted = 0, bool_rejected = 0;
  for (size_t i = 0; i < file.size(); ++i) {
    Bytes bad = file;
    bad[i] ^= 0xFF;
    StResult r = parse_st(bad);
    if (i < data_start) {
      EXPECT_TRUE(r.rejected) << "header byte " << i;
      header_rejected += r.rejected;
    } else if (in_bool_tensor(i)) {
      EXPECT_TRUE(r.rejected) << "bool byte " << i;
      bool_rejected += r.rejected;
    } else {
      ASSERT_FALSE(r.rejected) << "data byte " << i;
      ASSERT_EQ(r.st.tensors.size(), original.tensors.size());
      size_t differing = 0;
      for (size_t k = 0; k < original.tensors.size(); ++k) {
        const Tensor &a = original.tensors[k].second, &b = r.st.tensors[k].second;
        ASSERT_EQ(original.tensors[k].first, r.st.tensors[k].first);
        ASSERT_EQ(a.shape(), b.shape());
        ASSERT_EQ(a.dtype(), b.dtype());
        for (size_t j = 0; j < a.nbytes(); ++j)
          differing += static_cast<const uint8_t*>(a.raw_data())[j] != static_cast<const uint8_t*>(b.raw_data())[j];
      }
      EXPECT_EQ(differing, 1u) << "data byte " << i;
      ++data_accepted;
    }
  }
  EXPECT_EQ(header_rejected, data_start);
  EXPECT_EQ(bool_rejected, 4u);
  EXPECT_EQ(data_accepted, file.size() - data_start - 4);
}

TEST(Corruption, SafetensorsRandomCorruptionsNeverLoadInconsistentData) {
  // Without a checksum some corruptions are legal files (a renamed tensor, a changed value); what is accepted must
  // still be self-consistent: the tensors tile the data section exactly, and nothing crashes or over-allocates.
  const Bytes file = small_safetensors_file();
  std::mt19937_64 rng(7);
  auto pick = [&](size_t n) { return static_cast<size_t>(rng() % n); };
  int rejected = 0, accepted = 0;
  for (int trial = 0; trial < 3000; ++trial) {
    Bytes bad = file;
    switch (trial % 3) {
      case 0:
        for (size_t k = 1 + pick(4); k > 0; --k) bad[pick(bad.size())] = static_cast<uint8_t>(rng());
        break;
      case 1: {  // corrupt the header only, where the structure lives
        size_t end = 8 + std::min<uint64_t>(header_len(file), bad.size() - 8);
        bad[pick(end)] = static_cast<uint8_t>("0123456789[]{}\",:-.e \x01\xff"[pick(24)]);
        break;
      }
      default:
        bad.resize(pick(bad.size()));
        for (size_t k = pick(32); k > 0; --k) bad.push_back(static_cast<uint8_t>(rng()));
        break;
    }
    StResult r = parse_st(bad);
    if (r.rejected) {
      ++rejected;
      continue;
    }
    ++accepted;
    uint64_t covered = 0;
    for (auto& [n, t] : r.st.tensors) covered += t.nbytes();
    EXPECT_EQ(covered, bad.size() - 8 - header_len(bad)) << "trial " << trial;
  }
  EXPECT_EQ(rejected + accepted, 3000);
  EXPECT_GT(rejected, 1500);
  RecordProperty("rejected", rejected);
  RecordProperty("accepted", accepted);
}
