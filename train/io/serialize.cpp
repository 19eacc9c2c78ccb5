#include "train/io/serialize.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <bit>
#include <cereal/archives/portable_binary.hpp>
#include <cereal/types/string.hpp>
#include <cctype>
#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <istream>
#include <limits>
#include <memory>
#include <new>
#include <nlohmann/json.hpp>
#include <ostream>
#include <streambuf>
#include <system_error>
#include <unordered_map>
#include <unordered_set>
#include <xxhash.h>

#include "autograd/elementwise.h"
#include "nn/module.h"
#include "train/optim/optimizers.h"
#include "train/io/safetensors.h"

namespace attograd::io {

namespace {

// ---------------------------------------------------------------------------------------------
// Small helpers

std::string errno_text(int err) { return std::error_code(err, std::generic_category()).message(); }

std::string hex64(uint64_t v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "0x%016" PRIx64, v);
  return buf;
}

// A name from an untrusted file, safe to print: control and non-ASCII bytes escaped, long names cut.
std::string printable(const std::string& s) {
  std::string out;
  for (size_t i = 0; i < s.size() && i < 200; ++i) {
    unsigned char c = static_cast<unsigned char>(s[i]);
    if (c >= 0x20 && c < 0x7f) {
      out += static_cast<char>(c);
    } else {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", c);
      out += buf;
    }
  }
  if (s.size() > 200) out += str_cat("... (", s.size(), " bytes)");
  return out;
}

uint64_t load_le64(const uint8_t* p) {
  uint64_t v;
  std::memcpy(&v, p, 8);
  if constexpr (std::endian::native == std::endian::big) v = __builtin_bswap64(v);
  return v;
}

// The file's dtype codes (fixed by the format, independent of the Dtype enum's values).
bool dtype_from_code(uint8_t code, Dtype* out) {
  switch (code) {
    case 0:
      *out = kFloat32;
      return true;
    case 1:
      *out = kFloat64;
      return true;
    case 2:
      *out = kInt64;
      return true;
    case 3:
      *out = kBool;
      return true;
    default:
      return false;
  }
}

uint8_t dtype_code(Dtype d) {
  switch (d) {
    case Dtype::Float32:
      return 0;
    case Dtype::Float64:
      return 1;
    case Dtype::Int64:
      return 2;
    case Dtype::Bool:
      return 3;
  }
  return 255;
}

// ---------------------------------------------------------------------------------------------
// XXH64 (Yann Collet's xxHash, 64-bit), streaming, from Debian's libxxhash. The state comes from
// XXH64_createState, not the stack: its layout is only stable under XXH_STATIC_LINKING_ONLY with a static
// library, and this links the shared one.

class Xxh64 {
 public:
  explicit Xxh64(uint64_t seed = 0) : state_(XXH64_createState()) {
    if (!state_) throw std::bad_alloc();
    XXH64_reset(state_.get(), seed);
  }

  void update(const void* data, size_t n) {
    if (n) XXH64_update(state_.get(), data, n);
  }

  uint64_t digest() const { return XXH64_digest(state_.get()); }

 private:
  struct Free {
    void operator()(XXH64_state_t* s) const { XXH64_freeState(s); }
  };
  std::unique_ptr<XXH64_state_t, Free> state_;
};

// ---------------------------------------------------------------------------------------------
// Parse statistics and fault injection

thread_local detail::ParseStats t_stats;
std::atomic<int> g_fault{0};

const char* fault_name(int stage) {
  switch (stage) {
    case detail::kFaultAfterOpen:
      return "after open";
    case detail::kFaultMidWrite:
      return "mid-write";
    case detail::kFaultBeforeFsync:
      return "before fsync";
    case detail::kFaultBeforeRename:
      return "before rename";
    default:
      return "none";
  }
}

// ---------------------------------------------------------------------------------------------
// Output: a buffered file sink that hashes every byte it writes.

class FileSink : public std::streambuf {
 public:
  FileSink(int fd, const std::string& path, const std::string& op) : fd_(fd), path_(path), op_(op) {
    setp(buf_.data(), buf_.data() + buf_.size());
  }

  /// Hashes and writes the buffered bytes.
  void flush() {
    push(pbase(), static_cast<size_t>(pptr() - pbase()));
    setp(buf_.data(), buf_.data() + buf_.size());
  }
  uint64_t digest() {
    flush();
    return hash_.digest();
  }

 protected:
  int_type overflow(int_type ch) override {
    flush();
    if (!traits_type::eq_int_type(ch, traits_type::eof())) {
      *pptr() = traits_type::to_char_type(ch);
      pbump(1);
    }
    return traits_type::not_eof(ch);
  }
  int sync() override {
    flush();
    return 0;
  }
  std::streamsize xsputn(const char* s, std::streamsize n) override {
    if (n <= epptr() - pptr()) {
      std::memcpy(pptr(), s, static_cast<size_t>(n));
      pbump(static_cast<int>(n));
      return n;
    }
    flush();
    if (n >= static_cast<std::streamsize>(buf_.size())) {
      push(s, static_cast<size_t>(n));
    } else {
      std::memcpy(pptr(), s, static_cast<size_t>(n));
      pbump(static_cast<int>(n));
    }
    return n;
  }

 private:
  void push(const char* p, size_t n) {
    hash_.update(p, n);
    while (n > 0) {
      ssize_t w = ::write(fd_, p, std::min<size_t>(n, size_t{1} << 30));
      if (w < 0 && errno == EINTR) continue;
      if (w <= 0) throw Error(op_, str_cat("'", path_, "': write failed: ", errno_text(w < 0 ? errno : EIO)));
      p += w;
      n -= static_cast<size_t>(w);
    }
  }

  int fd_;
  const std::string& path_;
  const std::string& op_;
  Xxh64 hash_;
  std::array<char, 1 << 16> buf_;
};

std::string parent_dir(const std::string& path) {
  size_t slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

// The mode of a new file: the existing target's mode, else 0666 minus the process umask.
mode_t new_file_mode(const std::string& path) {
  struct stat st;
  if (::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode)) return st.st_mode & 07777;
  mode_t mask = 022;
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line))
    if (line.rfind("Umask:", 0) == 0) mask = static_cast<mode_t>(std::strtol(line.c_str() + 6, nullptr, 8));
  return 0666 & ~mask;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// detail

namespace detail {

void set_fault_point(int stage) { g_fault.store(stage); }

ParseStats last_parse_stats() { return t_stats; }

void reset_parse_stats(uint64_t input_bytes) { t_stats = ParseStats{input_bytes, 0, 0}; }

void note_allocation(uint64_t bytes) {
  t_stats.max_allocation = std::max(t_stats.max_allocation, bytes);
  t_stats.total_allocated += bytes;
}

uint64_t xxh64(const void* data, size_t size, uint64_t seed) { return XXH64(data, size, seed); }

namespace {
// Elements whose exponent bits are all ones (NaN, +-inf) among n values of U's width at p (any alignment).
template <class U>
int64_t count_all_ones_exponent(const uint8_t* p, uint64_t n, U exponent, int64_t* first) {
  int64_t count = 0;
  for (uint64_t i = 0; i < n; ++i) {
    U bits;
    std::memcpy(&bits, p + i * sizeof(U), sizeof(U));
    if ((bits & exponent) == exponent) {
      if (count++ == 0 && first) *first = static_cast<int64_t>(i);
    }
  }
  return count;
}
}  // namespace

int64_t count_nonfinite(const void* data, Dtype dtype, uint64_t nbytes, int64_t* first) {
  const auto* p = static_cast<const uint8_t*>(data);
  if (dtype == kFloat32) return count_all_ones_exponent<uint32_t>(p, nbytes / 4, 0x7f800000u, first);
  if (dtype == kFloat64) return count_all_ones_exponent<uint64_t>(p, nbytes / 8, 0x7ff0000000000000ull, first);
  return 0;
}

void check_finite(const Tensor& t, const std::string& name, const std::string& origin, const char* op) {
  if (t.dtype() != kFloat32 && t.dtype() != kFloat64) return;
  int64_t first = 0;
  const int64_t n = count_nonfinite(t.raw_data(), t.dtype(), t.nbytes(), &first);
  if (n == 0) return;
  const double v = t.dtype() == kFloat32 ? static_cast<double>(t.data<float>()[first]) : t.data<double>()[first];
  throw Error(op, str_cat("'", origin, "': tensor '", printable(name), "' holds ", n, " non-finite value",
                          n == 1 ? "" : "s", " (the first, ", v, ", at element ", first, " of ", t.numel(),
                          "): weights that are not finite make every output NaN; refusing to load them"));
}

namespace {

// What a non-regular file is, for messages.
const char* file_type(mode_t mode) {
  return S_ISDIR(mode)    ? "a directory"
         : S_ISFIFO(mode) ? "a FIFO"
         : S_ISCHR(mode)  ? "a character device"
         : S_ISSOCK(mode) ? "a socket"
         : S_ISBLK(mode)  ? "a block device"
                          : "a special file";
}

}  // namespace

std::vector<uint8_t> read_file(const std::string& path, const char* op, uint64_t cap) {
  // O_NONBLOCK: opening a FIFO (named pipe) for reading would otherwise wait for a writer forever; the file type
  // is checked right after. It changes nothing for a regular file.
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
  if (fd < 0) throw Error(op, str_cat("'", path, "': cannot open: ", errno_text(errno)));
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  struct stat st;
  if (::fstat(fd, &st) != 0) throw Error(op, str_cat("'", path, "': cannot stat: ", errno_text(errno)));
  if (S_ISDIR(st.st_mode)) throw Error(op, str_cat("'", path, "': is a directory"));
  if (!S_ISREG(st.st_mode)) throw Error(op, str_cat("'", path, "': not a regular file (", file_type(st.st_mode), ")"));
  const uint64_t size = static_cast<uint64_t>(st.st_size);
  if (size > cap) throw Error(op, str_cat("'", path, "': file is ", size, " bytes, more than the cap of ", cap, " bytes"));
  std::vector<uint8_t> bytes(static_cast<size_t>(size));
  size_t got = 0;
  while (got < size) {
    ssize_t r = ::read(fd, bytes.data() + got, std::min<size_t>(size - got, size_t{1} << 30));
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) throw Error(op, str_cat("'", path, "': read failed: ", errno_text(errno)));
    if (r == 0) throw Error(op, str_cat("'", path, "': file shrank while being read (", got, " of ", size, " bytes)"));
    got += static_cast<size_t>(r);
  }
  return bytes;
}

struct AtomicFile::Impl {
  Impl(std::string path_, std::string op_, std::string tmp_, int fd_)
      : path(std::move(path_)), op(std::move(op_)), tmp(std::move(tmp_)), fd(fd_), sink(fd, path, op), os(&sink) {}

  void fault(int stage) {
    int expected = stage;
    if (g_fault.compare_exchange_strong(expected, kNoFault))
      throw Error(op, str_cat("'", path, "': injected fault (", fault_name(stage), ")"));
  }
  [[noreturn]] void fail(const std::string& what, int err) {
    throw Error(op, str_cat("'", path, "': ", what, ": ", errno_text(err)));
  }

  std::string path, op, tmp;
  int fd;
  FileSink sink;
  std::ostream os;
  bool committed = false;
};

namespace {

// True for "<base>.tmp-XXXXXX", the name mkostemp gives a temporary file of a save of <base> (six letters or digits).
bool is_temporary_of(const std::string& name, const std::string& base) {
  const std::string prefix = base + ".tmp-";
  if (name.size() != prefix.size() + 6 || name.compare(0, prefix.size(), prefix) != 0) return false;
  for (size_t i = prefix.size(); i < name.size(); ++i)
    if (!std::isalnum(static_cast<unsigned char>(name[i]))) return false;
  return true;
}

// Removes the temporary files that saves of `path` killed before their rename left behind: only names of our own
// pattern for this target, regular files (not symlinks) owned by this user, and only when no save holds them (a
// save keeps an exclusive flock on its temporary file until it is renamed or removed; a killed one holds none).
// Best effort: anything unexpected leaves the file alone.
void remove_stale_temporaries(const std::string& path) {
  const std::string dir = parent_dir(path);
  const size_t slash = path.rfind('/');
  const std::string base = slash == std::string::npos ? path : path.substr(slash + 1);
  if (base.empty()) return;
  DIR* d = ::opendir(dir.c_str());
  if (!d) return;
  while (const dirent* e = ::readdir(d)) {
    const std::string name = e->d_name;
    if (!is_temporary_of(name, base)) continue;
    const int fd = ::openat(::dirfd(d), name.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) continue;
    struct stat st;
    if (::fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_uid == ::geteuid() &&
        ::flock(fd, LOCK_EX | LOCK_NB) == 0)
      (void)::unlinkat(::dirfd(d), name.c_str(), 0);
    ::close(fd);
  }
  ::closedir(d);
}

}  // namespace

AtomicFile::AtomicFile(const std::string& path, const char* op) {
  ATTO_CHECK(!path.empty(), op, "empty file path");
  // The rename would replace whatever the path names: an existing FIFO, device, socket or directory is refused, not
  // swapped for a regular file (a symbolic link is followed: one to a regular file is replaced, as before).
  struct stat existing;
  if (::stat(path.c_str(), &existing) == 0 && !S_ISREG(existing.st_mode))
    throw Error(op, str_cat("'", path, "': exists and is not a regular file (", file_type(existing.st_mode),
                            "); not replacing it"));
  remove_stale_temporaries(path);
  std::string templ = path + ".tmp-XXXXXX";
  std::vector<char> name;
  int fd = -1;
  // Lock the new file at once (so a concurrent save's cleanup leaves it alone); should another save's cleanup have
  // removed it between its creation and the lock, make another.
  for (int attempt = 0; attempt < 8 && fd < 0; ++attempt) {
    name.assign(templ.begin(), templ.end());
    name.push_back('\0');
    fd = ::mkostemp(name.data(), O_CLOEXEC);
    if (fd < 0) throw Error(op, str_cat("'", path, "': cannot create a temporary file next to it: ", errno_text(errno)));
    struct stat by_fd, by_name;
    if (::flock(fd, LOCK_EX) != 0 || ::fstat(fd, &by_fd) != 0 || ::stat(name.data(), &by_name) != 0 ||
        by_fd.st_ino != by_name.st_ino || by_fd.st_dev != by_name.st_dev) {
      ::close(fd);
      fd = -1;
    }
  }
  if (fd < 0) throw Error(op, str_cat("'", path, "': cannot create and lock a temporary file next to it"));
  impl_ = std::make_unique<Impl>(path, op, std::string(name.data()), fd);
  try {
    impl_->fault(kFaultAfterOpen);
  } catch (...) {
    ::close(fd);  // a throwing constructor runs no destructor: clean up here
    ::unlink(impl_->tmp.c_str());
    throw;
  }
}

AtomicFile::~AtomicFile() {
  if (!impl_ || impl_->committed) return;
  if (impl_->fd >= 0) ::close(impl_->fd);
  ::unlink(impl_->tmp.c_str());
}

std::ostream& AtomicFile::stream() { return impl_->os; }

void AtomicFile::flush_midway() {
  impl_->sink.flush();
  impl_->fault(kFaultMidWrite);
}

uint64_t AtomicFile::digest() { return impl_->sink.digest(); }

void AtomicFile::write(const void* data, size_t n) {
  impl_->sink.sputn(static_cast<const char*>(data), static_cast<std::streamsize>(n));  // throws on failure
}

const std::string& AtomicFile::temp_path() const { return impl_->tmp; }

void AtomicFile::commit() {
  Impl& f = *impl_;
  f.sink.flush();
  f.fault(kFaultBeforeFsync);
  if (::fchmod(f.fd, new_file_mode(f.path)) != 0) f.fail("cannot set the file mode", errno);
  if (::fsync(f.fd) != 0) f.fail("fsync failed", errno);
  const int fd = f.fd;
  f.fd = -1;
  struct LockHolder {  // the flock stays (same open file description) until the rename is done
    int fd;
    ~LockHolder() {
      if (fd >= 0) ::close(fd);
    }
  } lock{::fcntl(fd, F_DUPFD_CLOEXEC, 0)};
  if (::close(fd) != 0) f.fail("close failed", errno);
  f.fault(kFaultBeforeRename);
  if (::rename(f.tmp.c_str(), f.path.c_str()) != 0) f.fail(str_cat("cannot rename '", f.tmp, "' over it"), errno);
  f.committed = true;
  // Make the rename itself durable. Best effort: the new file is in place whatever happens here.
  int dfd = ::open(parent_dir(f.path).c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    (void)::fsync(dfd);
    ::close(dfd);
  }
}

}  // namespace detail

namespace {

// ---------------------------------------------------------------------------------------------
// Writing

enum class Kind : uint32_t { Weights = 0, Checkpoint = 1 };

bool valid_json(const std::string& text) {
  try {
    return nlohmann::json::accept(text);
  } catch (const nlohmann::json::exception&) {
    return false;
  }
}

// Checks a section's names before anything is written: non-empty, within the cap, unique.
template <class V>
void check_names(const char* op, const std::string& path, const char* what,
                 const std::vector<std::pair<std::string, V>>& items) {
  std::unordered_set<std::string> seen;
  for (const auto& [name, _] : items) {
    ATTO_CHECK(!name.empty(), op, "'", path, "': a ", what, " has an empty name");
    ATTO_CHECK(name.size() <= kMaxNameBytes, op, "'", path, "': ", what, " name of ", name.size(),
               " bytes exceeds the cap of ", kMaxNameBytes);
    ATTO_CHECK(seen.insert(name).second, op, "'", path, "': ", what, " name '", name, "' appears more than once");
  }
}

void write_native(const std::string& path, const char* op, Kind kind, const std::string& metadata,
                  const NamedTensors& tensors, const Checkpoint* ck) {
  ATTO_CHECK(valid_json(metadata), op, "'", path, "': metadata is not valid JSON: ", printable(metadata.substr(0, 80)));
  ATTO_CHECK(json_depth(metadata) <= kMaxJsonDepth, op, "'", path, "': metadata JSON is nested more than ",
             kMaxJsonDepth, " levels deep");
  check_names(op, path, "tensor", tensors);
  for (const auto& [name, t] : tensors) {
    ATTO_CHECK(t.defined(), op, "'", path, "': tensor '", name, "' is undefined");
    ATTO_CHECK(t.dim() <= kMaxRank, op, "'", path, "': tensor '", name, "' has rank ", t.dim(), " > ", kMaxRank);
  }
  if (ck) {
    check_names(op, path, "generator", ck->generators);
    check_names(op, path, "counter", ck->counters);
    check_names(op, path, "scalar", ck->scalars);
  }

  detail::AtomicFile file(path, op);
  std::ostream& os = file.stream();
  os.rdbuf()->sputn(kMagic, 8);
  {
    cereal::PortableBinaryOutputArchive ar(os, cereal::PortableBinaryOutputArchive::Options::LittleEndian());
    ar(kFormatVersion, static_cast<uint32_t>(kind), metadata, static_cast<uint64_t>(tensors.size()));
    file.flush_midway();
    for (const auto& entry : tensors) {
      const Tensor& t = entry.second;  // (not a structured binding: clang 14 cannot capture those in the lambda)
      ar(entry.first, dtype_code(t.dtype()), static_cast<uint8_t>(t.dim()));
      for (int64_t d : t.shape()) ar(d);
      if (t.nbytes() == 0) continue;
      dispatch_all(t.dtype(), [&]<typename T>() { ar(cereal::binary_data(t.data<T>(), t.nbytes())); });
    }
    if (ck) {
      ar(static_cast<uint64_t>(ck->generators.size()));
      for (const auto& [name, g] : ck->generators) ar(name, g.state, g.inc);
      ar(static_cast<uint64_t>(ck->counters.size()));
      for (const auto& [name, v] : ck->counters) ar(name, v);
      ar(static_cast<uint64_t>(ck->scalars.size()));
      for (const auto& [name, v] : ck->scalars) ar(name, v);
      ar(ck->metrics_csv);
    }
    const uint64_t checksum = file.digest();
    ar(checksum);
  }
  file.commit();
}

// ---------------------------------------------------------------------------------------------
// Reading

// A read-only stream buffer over bytes in memory (cereal reads from a std::istream).
class MemBuf : public std::streambuf {
 public:
  MemBuf(const uint8_t* p, size_t n) {
    char* b = const_cast<char*>(reinterpret_cast<const char*>(p));  // never written through
    setg(b, b, b + n);
  }
  size_t pos() const { return static_cast<size_t>(gptr() - eback()); }
  size_t left() const { return static_cast<size_t>(egptr() - gptr()); }
  const uint8_t* cur() const { return reinterpret_cast<const uint8_t*>(gptr()); }
  void skip(size_t n) { setg(eback(), gptr() + n, egptr()); }
};

// Reads the body of a native file (between the magic and the checksum). Fixed-size fields and raw data go
// through cereal; every length and count is read and checked here before anything is allocated.
class Parser {
 public:
  Parser(const uint8_t* body, size_t size, size_t base, const std::string& origin, const char* op)
      : buf_(body, size), in_(&buf_), ar_(in_), base_(base), origin_(origin), op_(op) {}

  [[noreturn]] void fail(const std::string& what) const {
    throw Error(op_, str_cat("'", origin_, "': ", where_, what, " (at byte ", base_ + buf_.pos(), ")"));
  }
  void context(std::string where) { where_ = std::move(where); }
  size_t left() const { return buf_.left(); }
  uint64_t offset() const { return base_ + buf_.pos(); }
  const uint8_t* cur() const { return buf_.cur(); }
  void skip(uint64_t n) { buf_.skip(static_cast<size_t>(n)); }
  cereal::PortableBinaryInputArchive& ar() { return ar_; }

  void need(uint64_t n, const char* what) {
    if (n > left()) fail(str_cat(what, " needs ", n, " bytes but only ", left(), " are left (truncated file?)"));
  }
  template <class T>
  T pod(const char* what) {
    need(sizeof(T), what);
    T v{};
    ar_(v);
    return v;
  }
  std::string str(const char* what, uint64_t cap) {
    const uint64_t n = pod<uint64_t>(what);
    if (n > cap) fail(str_cat(what, " length ", n, " exceeds the cap of ", cap, " bytes"));
    if (n > left()) fail(str_cat(what, " length ", n, " exceeds the ", left(), " bytes left"));
    detail::note_allocation(n);
    std::string s(static_cast<size_t>(n), '\0');
    if (n) ar_(cereal::binary_data(s.data(), static_cast<size_t>(n)));
    return s;
  }
  uint64_t count(const char* what, uint64_t min_record) {
    const uint64_t n = pod<uint64_t>(what);
    if (n > left() / min_record)
      fail(str_cat(what, " ", n, " cannot fit in the ", left(), " bytes left (each entry takes at least ", min_record,
               " bytes)"));
    return n;
  }

 private:
  MemBuf buf_;
  std::istream in_;
  cereal::PortableBinaryInputArchive ar_;
  size_t base_;
  const std::string& origin_;
  const char* op_;
  std::string where_;
};

constexpr size_t kHeaderBytes = 8 + 1 + 4 + 4 + 8 + 8;  // magic, byte order, version, kind, metadata length, count
constexpr size_t kMinFileBytes = kHeaderBytes + 8;      // + checksum
constexpr uint64_t kMinTensorRecord = 8 + 1 + 1;        // name length, dtype, rank
constexpr uint64_t kMinGeneratorRecord = 8 + 8 + 8;     // name length, state, inc
constexpr uint64_t kMinValueRecord = 8 + 8;             // name length, value

struct Parsed {
  Kind kind = Kind::Weights;
  uint32_t version = 0;
  std::string metadata;
  NamedTensors tensors;  // when loading data
  std::vector<TensorInfo> infos;
  std::vector<std::pair<std::string, GeneratorState>> generators;
  std::vector<std::pair<std::string, int64_t>> counters;
  std::vector<std::pair<std::string, double>> scalars;
  std::string metrics_csv;  // when loading data
  uint64_t metrics_bytes = 0;
  bool checksum_ok = false;
  uint64_t stored = 0, computed = 0;
};

const char* kind_name(Kind k) { return k == Kind::Weights ? "weights" : "checkpoint"; }

// Parses a native file held in memory. load_data: allocate and fill the tensors (else only list them).
// verify_checksum: throw on a mismatch (else only report it). expect: the required kind, or null for any.
Parsed parse_native(const uint8_t* data, size_t size, const std::string& origin, const char* op, bool load_data,
                    bool verify_checksum, const Kind* expect, const ReadOptions& options) {
  detail::reset_parse_stats(size);
  auto fail = [&](const std::string& what) { throw Error(op, str_cat("'", origin, "': ", what)); };
  if (size < 8) fail(str_cat("file is ", size, " bytes, too short for an attograd file (truncated?)"));
  if (std::memcmp(data, kMagic, 8) != 0) fail("not an attograd weights or checkpoint file (bad magic)");
  if (size < kMinFileBytes)
    fail(str_cat("file is ", size, " bytes, shorter than the smallest valid file (", kMinFileBytes, " bytes): truncated?"));

  Parsed out;
  out.stored = load_le64(data + size - 8);
  out.computed = detail::xxh64(data, size - 8);
  out.checksum_ok = out.stored == out.computed;
  if (verify_checksum && !out.checksum_ok)
    fail(str_cat("checksum mismatch (stored ", hex64(out.stored), ", computed ", hex64(out.computed),
             "): the file is corrupt or truncated"));
  if (data[8] != 1) fail(str_cat("unsupported byte-order flag ", int{data[8]}, " (expected 1, little-endian)"));

  try {
    Parser p(data + 8, size - 16, 8, origin, op);  // cereal's constructor consumes the byte-order flag
    out.version = p.pod<uint32_t>("format version");
    if (out.version == 0 || out.version > kFormatVersion)
      p.fail(str_cat("unsupported format version ", out.version, " (this reader knows 1 to ", kFormatVersion, ")"));
    const uint32_t kind = p.pod<uint32_t>("kind");
    if (kind > 1) p.fail(str_cat("unknown file kind ", kind, " (0 = weights, 1 = checkpoint)"));
    out.kind = static_cast<Kind>(kind);
    if (expect && out.kind != *expect)
      p.fail(str_cat("is a ", kind_name(out.kind), " file, not a ", kind_name(*expect), " file",
                 out.kind == Kind::Checkpoint ? " (use load_checkpoint)" : " (use read_tensors or load)"));
    out.metadata = p.str("metadata", std::numeric_limits<uint64_t>::max());
    if (!valid_json(out.metadata)) p.fail("metadata is not valid JSON");
    if (json_depth(out.metadata) > kMaxJsonDepth)
      p.fail(str_cat("metadata JSON is nested more than ", kMaxJsonDepth, " levels deep"));

    const uint64_t n = p.count("tensor count", kMinTensorRecord);
    std::unordered_set<std::string> seen;
    for (uint64_t i = 0; i < n; ++i) {
      p.context(str_cat("tensor ", i, ": "));
      std::string name = p.str("tensor name", kMaxNameBytes);
      if (name.empty()) p.fail("empty tensor name");
      p.context(str_cat("tensor '", printable(name), "': "));
      if (!seen.insert(name).second) p.fail("duplicate name");
      const uint8_t code = p.pod<uint8_t>("dtype");
      Dtype dtype;
      if (!dtype_from_code(code, &dtype)) p.fail(str_cat("unknown dtype code ", int{code}, " (0 to 3 are known)"));
      const uint8_t rank = p.pod<uint8_t>("rank");
      if (rank > kMaxRank) p.fail(str_cat("rank ", int{rank}, " exceeds the maximum of ", kMaxRank));
      p.need(uint64_t{rank} * 8, "shape");
      Shape shape(rank);
      for (auto& d : shape) d = p.pod<int64_t>("dim");
      uint64_t nbytes = dtype_size(dtype);
      for (int64_t d : shape) {
        if (d < 0) p.fail(str_cat("negative dim in shape ", shape));
        if (__builtin_mul_overflow(nbytes, static_cast<uint64_t>(d), &nbytes))
          p.fail(str_cat("shape ", shape, " overflows 64 bits in bytes"));
      }
      if (nbytes > p.left())
        p.fail(str_cat("shape ", shape, " ", dtype_name(dtype), " needs ", nbytes, " bytes of data but only ", p.left(),
                   " are left (truncated or forged size)"));
      out.infos.push_back({name, dtype, shape, nbytes, p.offset(), detail::count_nonfinite(p.cur(), dtype, nbytes)});
      if (load_data) {
        if (dtype == kBool)
          for (uint64_t j = 0; j < nbytes; ++j)
            if (p.cur()[j] > 1)
              p.fail(str_cat("bool element ", j, " has byte value ", int{p.cur()[j]}, " (must be 0 or 1)"));
        detail::note_allocation(nbytes);
        Tensor t = empty(shape, {.dtype = dtype});
        if (nbytes)
          dispatch_all(dtype,
                       [&]<typename T>() { p.ar()(cereal::binary_data(t.data<T>(), static_cast<size_t>(nbytes))); });
        if (!options.allow_nonfinite) detail::check_finite(t, name, origin, op);
        out.tensors.emplace_back(std::move(name), std::move(t));
      } else {
        p.skip(nbytes);
      }
    }
    p.context("");

    if (out.kind == Kind::Checkpoint) {
      auto unique = [&](std::unordered_set<std::string>& names, const std::string& name, const char* what) {
        if (name.empty()) p.fail(str_cat("empty ", what, " name"));
        if (!names.insert(name).second) p.fail(str_cat("duplicate ", what, " name '", printable(name), "'"));
      };
      std::unordered_set<std::string> names;
      const uint64_t ng = p.count("generator count", kMinGeneratorRecord);
      for (uint64_t i = 0; i < ng; ++i) {
        std::string name = p.str("generator name", kMaxNameBytes);
        unique(names, name, "generator");
        GeneratorState g;
        g.state = p.pod<uint64_t>("generator state");
        g.inc = p.pod<uint64_t>("generator increment");
        out.generators.emplace_back(std::move(name), g);
      }
      names.clear();
      const uint64_t nc = p.count("counter count", kMinValueRecord);
      for (uint64_t i = 0; i < nc; ++i) {
        std::string name = p.str("counter name", kMaxNameBytes);
        unique(names, name, "counter");
        out.counters.emplace_back(std::move(name), p.pod<int64_t>("counter value"));
      }
      names.clear();
      const uint64_t ns = p.count("scalar count", kMinValueRecord);
      for (uint64_t i = 0; i < ns; ++i) {
        std::string name = p.str("scalar name", kMaxNameBytes);
        unique(names, name, "scalar");
        out.scalars.emplace_back(std::move(name), p.pod<double>("scalar value"));
      }
      if (load_data) {
        out.metrics_csv = p.str("metrics_csv", std::numeric_limits<uint64_t>::max());
        out.metrics_bytes = out.metrics_csv.size();
      } else {
        const uint64_t m = p.pod<uint64_t>("metrics_csv length");
        if (m > p.left()) p.fail(str_cat("metrics_csv length ", m, " exceeds the ", p.left(), " bytes left"));
        out.metrics_bytes = m;
        p.skip(m);
      }
    }
    if (p.left() != 0) p.fail(str_cat(p.left(), " trailing bytes after the last record"));
  } catch (const cereal::Exception& e) {
    fail(str_cat("malformed file: ", e.what()));
  }
  return out;
}

}  // namespace

LoadReport detail::load_into(nn::Module& m, const NamedTensors& tensors, bool strict, const std::string& origin,
                             const char* op) {
  return nn::detail::load_state_dict(m, tensors, {.strict = strict, .allow_dtype_cast = true},
                                     {.origin = origin, .op = op, .noun = "file"});
}

namespace {

FileInfo to_info(Parsed&& p, uint64_t size) {
  FileInfo info;
  info.kind = kind_name(p.kind);
  info.format_version = p.version;
  info.metadata = std::move(p.metadata);
  info.tensors = std::move(p.infos);
  info.generators = std::move(p.generators);
  info.counters = std::move(p.counters);
  info.scalars = std::move(p.scalars);
  info.metrics_csv_bytes = p.metrics_bytes;
  info.file_size = size;
  info.has_checksum = true;
  info.checksum_ok = p.checksum_ok;
  info.stored_checksum = p.stored;
  info.computed_checksum = p.computed;
  return info;
}

template <class V>
const V& find_entry(const std::vector<std::pair<std::string, V>>& items, const std::string& name, const char* what) {
  for (const auto& [n, v] : items)
    if (n == name) return v;
  throw Error("Checkpoint",
              str_cat("no ", what, " named '", name, "' (the checkpoint has ", items.size(), " ", what, "s)"));
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Public API

int json_depth(const std::string& text) {
  int depth = 0, deepest = 0;
  bool in_string = false, escaped = false;
  for (char c : text) {
    if (in_string) {
      if (escaped) escaped = false;
      else if (c == '\\') escaped = true;
      else if (c == '"') in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      deepest = std::max(deepest, ++depth);
    } else if ((c == ']' || c == '}') && depth > 0) {
      --depth;
    }
  }
  return deepest;
}

void check_json_depth(const std::string& text, const char* op, const std::string& origin) {
  const int depth = json_depth(text);
  ATTO_CHECK(depth <= kMaxJsonDepth, op, origin, ": JSON nested ", depth, " levels deep, more than the maximum of ",
             kMaxJsonDepth);
}

NamedTensors state_dict(const nn::Module& m) { return m.state_dict(); }

LoadReport load_state_dict(nn::Module& m, const NamedTensors& tensors, const nn::LoadStateDictOptions& options,
                           const std::string& origin) {
  return nn::detail::load_state_dict(m, tensors, options, {.origin = origin});
}

void write_tensors(const std::string& path, const NamedTensors& tensors, const std::string& metadata_json) {
  write_native(path, "write_tensors", Kind::Weights, metadata_json, tensors, nullptr);
}

NamedTensors parse_tensors_from_memory(const uint8_t* data, size_t size, std::string* metadata,
                                       const std::string& origin) {
  const Kind expect = Kind::Weights;
  Parsed p = parse_native(data, size, origin, "read_tensors", true, true, &expect, {.allow_nonfinite = true});
  if (metadata) *metadata = std::move(p.metadata);
  return std::move(p.tensors);
}

NamedTensors read_tensors(const std::string& path, std::string* metadata) {
  std::vector<uint8_t> bytes = detail::read_file(path, "read_tensors");
  return parse_tensors_from_memory(bytes.data(), bytes.size(), metadata, path);
}

void save(const nn::Module& m, const std::string& path, const std::string& metadata_json) {
  write_native(path, "save", Kind::Weights, metadata_json, state_dict(m), nullptr);
}

LoadReport load(nn::Module& m, const std::string& path, bool strict, const ReadOptions& options) {
  std::vector<uint8_t> bytes = detail::read_file(path, "load");
  const Kind expect = Kind::Weights;
  Parsed p = parse_native(bytes.data(), bytes.size(), path, "load", true, true, &expect, options);
  bytes = {};
  return detail::load_into(m, p.tensors, strict, "'" + path + "'", "load");
}

const Tensor& Checkpoint::tensor(const std::string& name) const { return find_entry(tensors, name, "tensor"); }
const GeneratorState& Checkpoint::generator(const std::string& name) const {
  return find_entry(generators, name, "generator");
}
int64_t Checkpoint::counter(const std::string& name) const { return find_entry(counters, name, "counter"); }
double Checkpoint::scalar(const std::string& name) const { return find_entry(scalars, name, "scalar"); }

void save_checkpoint(const Checkpoint& checkpoint, const std::string& path) {
  write_native(path, "save_checkpoint", Kind::Checkpoint, checkpoint.metadata_json, checkpoint.tensors, &checkpoint);
}

Checkpoint parse_checkpoint_from_memory(const uint8_t* data, size_t size, const std::string& origin,
                                        const ReadOptions& options) {
  const Kind expect = Kind::Checkpoint;
  Parsed p = parse_native(data, size, origin, "load_checkpoint", true, true, &expect, options);
  Checkpoint c;
  c.metadata_json = std::move(p.metadata);
  c.tensors = std::move(p.tensors);
  c.generators = std::move(p.generators);
  c.counters = std::move(p.counters);
  c.scalars = std::move(p.scalars);
  c.metrics_csv = std::move(p.metrics_csv);
  return c;
}

Checkpoint load_checkpoint(const std::string& path, const ReadOptions& options) {
  std::vector<uint8_t> bytes = detail::read_file(path, "load_checkpoint");
  return parse_checkpoint_from_memory(bytes.data(), bytes.size(), path, options);
}

void add_module_state(Checkpoint& checkpoint, const nn::Module& m, const std::string& prefix) {
  for (auto& [name, t] : state_dict(m)) checkpoint.tensors.emplace_back(prefix + name, t);
}

LoadReport load_module_state(const Checkpoint& checkpoint, nn::Module& m, const std::string& prefix, bool strict) {
  NamedTensors sub;
  for (const auto& [name, t] : checkpoint.tensors)
    if (name.compare(0, prefix.size(), prefix) == 0) sub.emplace_back(name.substr(prefix.size()), t);
  return detail::load_into(m, sub, strict, str_cat("checkpoint tensors '", prefix, "*'"), "load_module_state");
}

void add_optimizer_state(Checkpoint& checkpoint, const optim::Optimizer& opt, const std::string& prefix) {
  for (auto& [name, t] : opt.state_tensors()) checkpoint.tensors.emplace_back(prefix + name, t);
  checkpoint.counters.emplace_back(prefix + "step_count", opt.step_count());
}

void load_optimizer_state(const Checkpoint& checkpoint, optim::Optimizer& opt, const std::string& prefix) {
  NamedTensors sub;
  for (const auto& [name, t] : checkpoint.tensors)
    if (name.compare(0, prefix.size(), prefix) == 0) sub.emplace_back(name.substr(prefix.size()), t);
  opt.load_state(sub, checkpoint.counter(prefix + "step_count"));
}

int64_t FileInfo::num_elements() const {
  int64_t n = 0;
  for (const auto& t : tensors) n += shape_numel(t.shape);
  return n;
}

std::string FileInfo::to_string() const {
  std::ostringstream os;
  os << "kind: " << kind;
  if (kind != "safetensors") os << " (format version " << format_version << ")";
  os << "\nfile: " << file_size << " bytes";
  if (has_checksum) {
    os << ", checksum " << hex64(stored_checksum);
    if (checksum_ok)
      os << " OK";
    else
      os << " MISMATCH (computed " << hex64(computed_checksum) << "): the file is corrupt";
  } else {
    os << ", no checksum";
  }
  os << "\nmetadata: " << metadata << "\n";
  os << "tensors: " << tensors.size() << " (" << num_elements() << " elements)\n";
  for (const auto& t : tensors) {
    os << "  " << t.name << "  " << dtype_name(t.dtype) << "  " << shape_str(t.shape) << "  " << t.nbytes << " bytes";
    if (t.nonfinite) os << "  " << t.nonfinite << " non-finite";
    os << "\n";
  }
  if (kind == "checkpoint") {
    os << "generators: " << generators.size() << "\n";
    for (const auto& [n, g] : generators)
      os << "  " << n << "  state=" << hex64(g.state) << " inc=" << hex64(g.inc) << "\n";
    os << "counters: " << counters.size() << "\n";
    for (const auto& [n, v] : counters) os << "  " << n << " = " << v << "\n";
    os << "scalars: " << scalars.size() << "\n";
    char buf[64];
    for (const auto& [n, v] : scalars) {
      std::snprintf(buf, sizeof buf, "%.17g", v);
      os << "  " << n << " = " << buf << "\n";
    }
    os << "metrics_csv: " << metrics_csv_bytes << " bytes\n";
  }
  return os.str();
}

FileInfo inspect_memory(const uint8_t* data, size_t size, const std::string& origin) {
  if (size >= 8 && std::memcmp(data, kMagic, 8) == 0)
    return to_info(parse_native(data, size, origin, "inspect", false, false, nullptr, {}), size);
  if (size >= 9 && data[8] == '{') return detail::inspect_safetensors_memory(data, size, origin);
  throw Error("inspect", str_cat("'", origin, "': neither an attograd weights or checkpoint file nor a safetensors file"));
}

FileInfo inspect(const std::string& path) {
  std::vector<uint8_t> bytes = detail::read_file(path, "inspect");
  return inspect_memory(bytes.data(), bytes.size(), path);
}

}  // namespace attograd::io
