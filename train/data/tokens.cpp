// Token files, `prepare` and TokenFileDataset (train/data/tokens.h).

#include "train/data/tokens.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "train/io/serialize.h"

namespace attograd::data {

namespace fs = std::filesystem;
using json = nlohmann::ordered_json;

namespace {

constexpr const char* kMe = "token file";

std::string hex64(uint64_t v) {
  char buf[24];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

uint32_t get_u32(const unsigned char* p) {
  uint32_t v = 0;
  for (int i = 3; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

uint64_t get_u64(const unsigned char* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

void put_u32(unsigned char* p, uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<unsigned char>(v >> (8 * i));
}

void put_u64(unsigned char* p, uint64_t v) {
  for (int i = 0; i < 8; ++i) p[i] = static_cast<unsigned char>(v >> (8 * i));
}

// Parses a header; Error naming `path` for a bad magic, version or width. `size` is the file's size in bytes.
TokenFileHeader parse_header(const unsigned char* p, uint64_t size, const std::string& path) {
  ATTO_CHECK(size >= kTokenFileHeaderBytes, kMe, "'", path, "' is ", size, " bytes, shorter than the ",
             kTokenFileHeaderBytes, "-byte header: truncated, or not a token file (write one with attograd prepare)");
  ATTO_CHECK(std::memcmp(p, kTokenFileMagic, sizeof kTokenFileMagic) == 0, kMe, "'", path,
             "' is not a token file (its first bytes are not \"ATTOTOK\"; write one with attograd prepare)");
  TokenFileHeader h;
  h.version = get_u32(p + 8);
  h.width = get_u32(p + 12);
  h.count = get_u64(p + 16);
  h.tokenizer_hash = get_u64(p + 24);
  ATTO_CHECK(h.version == kTokenFileVersion, kMe, "'", path, "' has format version ", h.version,
             "; this attograd reads version ", kTokenFileVersion, " (prepare it again)");
  ATTO_CHECK(h.width == 2 || h.width == 4, kMe, "'", path, "' has token width ", h.width,
             " bytes; expected 2 (uint16) or 4 (uint32)");
  return h;
}

// Releases the pages around [p, p + n) from this process's resident memory (a read-only file mapping: they are
// read again from the page cache when touched). A fault on a file mapping also maps the neighbouring pages that are
// in the page cache ("fault-around", 64 KiB by default, at most 2 MiB), so the whole aligned 2 MiB blocks around
// the range are released, not only the pages it covers: `base` and `size` bound the mapping.
void release_pages(const unsigned char* p, uint64_t n, const unsigned char* base, uint64_t size) {
  constexpr uintptr_t kBlock = uintptr_t{2} << 20;
  const auto lo = reinterpret_cast<uintptr_t>(base), hi = lo + size;
  const auto a = std::max(lo, reinterpret_cast<uintptr_t>(p) & ~(kBlock - 1));  // base is page-aligned
  const auto e = std::min(hi, (reinterpret_cast<uintptr_t>(p) + n + kBlock - 1) & ~(kBlock - 1));
  if (e > a) ::madvise(reinterpret_cast<void*>(a), e - a, MADV_DONTNEED);
}

std::string errno_text(int err) { return std::strerror(err); }

}  // namespace

// ---------------------------------------------------------------------------------------------
// TokenFile

TokenFile::TokenFile(const std::string& path, uint64_t tokenizer_hash, int64_t vocab_size) : path_(path) {
  fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
  ATTO_CHECK(fd_ >= 0, kMe, "cannot open '", path, "': ", errno_text(errno));
  struct stat st {};
  if (::fstat(fd_, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd_);
    fd_ = -1;
    throw Error(kMe, str_cat("'", path, "' is not a regular file"));
  }
  bytes_ = static_cast<uint64_t>(st.st_size);
  if (bytes_ > 0) {
    void* m = ::mmap(nullptr, bytes_, PROT_READ, MAP_SHARED, fd_, 0);
    if (m == MAP_FAILED) {
      const int err = errno;
      ::close(fd_);
      fd_ = -1;
      throw Error(kMe, str_cat("cannot map '", path, "': ", errno_text(err)));
    }
    map_ = static_cast<const unsigned char*>(m);
  }
  try {
    header_ = parse_header(map_, bytes_, path);
    const uint64_t need = kTokenFileHeaderBytes + header_.count * header_.width;
    ATTO_CHECK(header_.count <= (bytes_ - kTokenFileHeaderBytes) / header_.width && bytes_ == need, kMe, "'",
               path, "' is ", bytes_, " bytes but its header promises ", header_.count, " tokens of ",
               header_.width, " bytes (", need, " bytes with the header): ",
               bytes_ < need ? "truncated" : "trailing bytes after the last token");
    ATTO_CHECK(header_.tokenizer_hash == tokenizer_hash, kMe, "'", path,
               "' was prepared with another tokenizer (hash ", hex64(header_.tokenizer_hash),
               ") than its directory's meta.json describes (hash ", hex64(tokenizer_hash),
               "): the tokenizer changed since `attograd prepare`; prepare the text again");
    // One streaming pass: the digest and every token's range, releasing each block once read.
    XXH64_state_t* st_hash = XXH64_createState();
    XXH64_reset(st_hash, 0);
    XXH64_update(st_hash, map_, kTokenFileHeaderBytes);
    const auto limit = static_cast<uint64_t>(vocab_size);
    const unsigned char* base = map_ + kTokenFileHeaderBytes;
    const uint32_t w = header_.width;
    auto token_at = [&](uint64_t i) -> uint64_t {
      const unsigned char* q = base + i * w;
      return w == 2 ? static_cast<uint64_t>(q[0] | (q[1] << 8)) : get_u32(q);
    };
    constexpr uint64_t kTokens = uint64_t{1} << 22;
    for (uint64_t s = 0; s < header_.count; s += kTokens) {
      const uint64_t n = std::min(kTokens, header_.count - s);
      XXH64_update(st_hash, base + s * w, n * w);
      uint64_t worst = 0;
      for (uint64_t i = 0; i < n; ++i) worst = std::max(worst, token_at(s + i));
      if (worst >= limit) {  // the first offender, for the message
        XXH64_freeState(st_hash);
        uint64_t at = s;
        while (token_at(at) < limit) ++at;
        throw Error(kMe, str_cat("'", path, "': token ", at, " is ", token_at(at), ", outside the vocabulary of ",
                                 vocab_size, " tokens (the file is corrupt or belongs to another tokenizer)"));
      }
      release_pages(base + s * w, n * w, map_, bytes_);
    }
    digest_ = XXH64_digest(st_hash);
    XXH64_freeState(st_hash);
  } catch (...) {
    if (map_) ::munmap(const_cast<unsigned char*>(map_), bytes_);
    ::close(fd_);
    map_ = nullptr;
    fd_ = -1;
    throw;
  }
}

TokenFile::~TokenFile() {
  if (map_) ::munmap(const_cast<unsigned char*>(map_), bytes_);
  if (fd_ >= 0) ::close(fd_);
}

void TokenFile::read(int64_t start, int64_t n, int64_t* out) const {
  ATTO_CHECK(start >= 0 && n >= 0 && start + n <= size(), kMe, "'", path_, "': tokens [", start, ", ", start + n,
             ") outside [0, ", size(), ")");
  const unsigned char* p = map_ + kTokenFileHeaderBytes + static_cast<uint64_t>(start) * header_.width;
  if (header_.width == 2)
    for (int64_t i = 0; i < n; ++i) out[i] = p[2 * i] | (p[2 * i + 1] << 8);
  else
    for (int64_t i = 0; i < n; ++i) out[i] = get_u32(p + 4 * i);
  release_pages(p, static_cast<uint64_t>(n) * header_.width, map_, bytes_);
}

TokenFileHeader read_token_file_header(const std::string& path) {
  const std::vector<uint8_t> head = io::detail::read_file(path, kMe);
  return parse_header(head.data(), head.size(), path);
}

// ---------------------------------------------------------------------------------------------
// TokenFileWriter

struct TokenFileWriter::Impl {
  Impl(const std::string& path) : file(path, "prepare"), path(path) {}
  io::detail::AtomicFile file;
  std::string path;
  std::vector<unsigned char> buf;
};

TokenFileWriter::TokenFileWriter(const std::string& path, uint32_t width, uint64_t tokenizer_hash)
    : impl_(std::make_unique<Impl>(path)), width_(width), tokenizer_hash_(tokenizer_hash) {
  ATTO_CHECK(width == 2 || width == 4, "prepare", "token width must be 2 or 4, got ", width);
  const unsigned char zero[kTokenFileHeaderBytes] = {};
  impl_->file.write(zero, sizeof zero);  // the header is written by commit(), when the count is known
}

TokenFileWriter::~TokenFileWriter() = default;

void TokenFileWriter::write(const int64_t* tokens, int64_t n) {
  if (n <= 0) return;  // nothing (an empty buffer's data() may be null)
  auto& buf = impl_->buf;
  buf.resize(static_cast<size_t>(n) * width_);
  const int64_t limit = width_ == 2 ? int64_t{1} << 16 : int64_t{1} << 32;
  for (int64_t i = 0; i < n; ++i) {
    ATTO_CHECK(tokens[i] >= 0 && tokens[i] < limit, "prepare", "token ", tokens[i], " does not fit ", width_,
               " bytes");
    unsigned char* p = buf.data() + static_cast<size_t>(i) * width_;
    if (width_ == 2) {
      p[0] = static_cast<unsigned char>(tokens[i]);
      p[1] = static_cast<unsigned char>(tokens[i] >> 8);
    } else {
      put_u32(p, static_cast<uint32_t>(tokens[i]));
    }
  }
  impl_->file.write(buf.data(), buf.size());
  count_ += n;
}

void TokenFileWriter::commit() {
  unsigned char h[kTokenFileHeaderBytes] = {};
  std::memcpy(h, kTokenFileMagic, sizeof kTokenFileMagic);
  put_u32(h + 8, kTokenFileVersion);
  put_u32(h + 12, width_);
  put_u64(h + 16, static_cast<uint64_t>(count_));
  put_u64(h + 24, tokenizer_hash_);
  impl_->file.flush_midway();
  const std::string& tmp = impl_->file.temp_path();
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CLOEXEC);
  ATTO_CHECK(fd >= 0, "prepare", "cannot reopen '", tmp, "': ", errno_text(errno));
  const ssize_t w = ::pwrite(fd, h, sizeof h, 0);
  const int err = errno;
  ::close(fd);
  ATTO_CHECK(w == static_cast<ssize_t>(sizeof h), "prepare", "cannot write the header of '", impl_->path,
             "': ", errno_text(err));
  impl_->file.commit();  // fsyncs the file (the header included) and renames it into place
}

void write_token_file(const std::string& path, const std::vector<int64_t>& tokens, uint64_t tokenizer_hash,
                      uint32_t width) {
  TokenFileWriter w(path, width, tokenizer_hash);
  w.write(tokens.data(), static_cast<int64_t>(tokens.size()));
  w.commit();
}

// ---------------------------------------------------------------------------------------------
// prepare

uint64_t char_tokenizer_hash(const Vocabulary& vocabulary) {
  const std::string d = vocabulary.to_json();
  return io::detail::xxh64(d.data(), d.size());
}

namespace {

// Reads a text file in blocks of complete UTF-8 characters with CRLF read as LF (as TextDataset reads a file).
class ChunkReader {
 public:
  ChunkReader(const std::string& path, uint64_t chunk) : path_(path), chunk_(chunk) {
    fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
    ATTO_CHECK(fd_ >= 0, "prepare", "cannot open '", path, "': ", errno_text(errno));
    struct stat st {};
    if (::fstat(fd_, &st) != 0 || !S_ISREG(st.st_mode)) {
      ::close(fd_);
      throw Error("prepare", str_cat("'", path, "' is not a regular file"));
    }
    ATTO_CHECK(st.st_size > 0, "prepare", "'", path, "' is empty");
  }
  ~ChunkReader() { ::close(fd_); }
  ChunkReader(const ChunkReader&) = delete;
  ChunkReader& operator=(const ChunkReader&) = delete;

  // The next block as text (CRLF read as LF) and its code points (checked: strict UTF-8, no NUL); false at the end.
  bool next(std::string& text, std::vector<char32_t>& cps) {
    if (done_) return false;
    buf_.resize(carry_.size() + chunk_);
    std::memcpy(buf_.data(), carry_.data(), carry_.size());
    size_t have = carry_.size();
    const uint64_t base = pos_ - carry_.size();
    while (have < buf_.size()) {
      const ssize_t r = ::read(fd_, buf_.data() + have, buf_.size() - have);
      if (r < 0 && errno == EINTR) continue;
      ATTO_CHECK(r >= 0, "prepare", "cannot read '", path_, "': ", errno_text(errno));
      if (r == 0) {
        done_ = true;
        break;
      }
      have += static_cast<size_t>(r);
      pos_ += static_cast<uint64_t>(r);
    }
    // Hold back an incomplete character and a final \r (its \n may come next) unless the file ended.
    size_t keep = have;
    if (!done_) {
      size_t k = have;
      for (int back = 0; back < 4 && k > 0; ++back) {
        const auto b = static_cast<unsigned char>(buf_[k - 1]);
        if ((b & 0xC0) != 0x80) {  // a lead byte or ASCII: is its sequence complete?
          const size_t len = b < 0x80 ? 1 : (b & 0xE0) == 0xC0 ? 2 : (b & 0xF0) == 0xE0 ? 3 : (b & 0xF8) == 0xF0 ? 4 : 1;
          if (have - (k - 1) < len) keep = k - 1;
          break;
        }
        --k;
      }
      if (keep > 0 && buf_[keep - 1] == '\r') --keep;
    }
    carry_.assign(buf_.begin() + static_cast<std::ptrdiff_t>(keep), buf_.begin() + static_cast<std::ptrdiff_t>(have));
    text.clear();
    text.reserve(keep);
    for (size_t i = 0; i < keep; ++i)
      if (!(buf_[i] == '\r' && i + 1 < keep && buf_[i + 1] == '\n')) text += buf_[i];
    cps = decode_utf8(text, str_cat("'", path_, "' (in the block from byte ", base, ")"));
    if (done_) ATTO_CHECK(carry_.empty(), "prepare", "'", path_, "': invalid UTF-8 at its end");
    return true;
  }

 private:
  std::string path_;
  uint64_t chunk_;
  int fd_ = -1;
  uint64_t pos_ = 0;
  bool done_ = false;
  std::string buf_, carry_;
};

// Calls fn(path, text, cps) for every block of every input, in order.
template <class F>
void for_each_block(const std::vector<std::string>& inputs, uint64_t chunk, F&& fn) {
  std::string text;
  std::vector<char32_t> cps;
  for (const std::string& in : inputs) {
    ChunkReader rd(in, chunk);
    while (rd.next(text, cps)) fn(in, text, cps);
  }
}

// Encodes a stream of text with a subword tokenizer into a token file, line by line: Tokenizer::encode encodes each
// line alone, so cutting the stream after a newline gives the tokens of the whole. A line longer than kLongLine
// bytes is encoded in pieces of about that (cut at a character start).
class LineEncoder {
 public:
  static constexpr size_t kLongLine = size_t{4} << 20;
  LineEncoder(const Tokenizer& t, TokenFileWriter& w) : t_(t), w_(w) {}
  void add(std::string_view s) {
    pending_ += s;
    const size_t nl = pending_.rfind('\n');
    if (nl != std::string::npos) {
      emit(std::string_view(pending_).substr(0, nl + 1));
      pending_.erase(0, nl + 1);
    } else if (pending_.size() > kLongLine) {
      size_t cut = pending_.size();
      while (cut > 0 && (static_cast<unsigned char>(pending_[cut - 1]) & 0xC0) == 0x80) --cut;
      if (cut > 0 && static_cast<unsigned char>(pending_[cut - 1]) >= 0xC0) --cut;  // a lead byte: keep it whole
      emit(std::string_view(pending_).substr(0, cut));
      pending_.erase(0, cut);
    }
  }
  void finish() {
    if (!pending_.empty()) emit(pending_);
    pending_.clear();
  }

 private:
  void emit(std::string_view text) {
    const std::vector<int64_t> ids = t_.encode(text, "the text");
    w_.write(ids.data(), static_cast<int64_t>(ids.size()));
  }
  const Tokenizer& t_;
  TokenFileWriter& w_;
  std::string pending_;
};

void write_meta(const std::string& out, const json& meta) {
  const std::string text = meta.dump(1) + "\n";
  io::detail::AtomicFile mf((fs::path(out) / "meta.json").string(), "prepare");
  mf.write(text.data(), text.size());
  mf.commit();
}

}  // namespace

PrepareResult prepare(const PrepareOptions& opts) {
  const char* me = "prepare";
  ATTO_CHECK(!opts.inputs.empty(), me, "no input text file (--text FILE...)");
  ATTO_CHECK(!opts.out.empty(), me, "no output directory (--out DIR)");
  ATTO_CHECK(opts.tokenizer == "char" || opts.tokenizer == "bpe" || opts.tokenizer == "unigram", me,
             "--tokenizer must be \"char\", \"bpe\" or \"unigram\", got \"", opts.tokenizer.substr(0, 60), "\"");
  ATTO_CHECK(opts.tokenizer != "char" || opts.vocab_size == 0, me,
             "--vocab-size is for --tokenizer bpe or unigram (char has a token per character of the text)");
  ATTO_CHECK(opts.val_fraction > 0 && opts.val_fraction < 1, me, "--val-fraction must be in (0, 1), got ",
             opts.val_fraction);
  ATTO_CHECK(opts.chunk_bytes >= 4, me, "chunk_bytes must be >= 4, got ", opts.chunk_bytes);
  ATTO_CHECK(opts.max_vocab > Vocabulary::kReserved && opts.max_vocab <= kMaxVocabulary, me, "max_vocab must be in [",
             Vocabulary::kReserved + 1, ", ", kMaxVocabulary, "], got ", opts.max_vocab);
  for (const std::string& in : opts.inputs)
    ATTO_CHECK(fs::absolute(in).lexically_normal() != fs::absolute(opts.out).lexically_normal(), me, "'", in,
               "' is the output directory");
  const bool subword = opts.tokenizer != "char";
  // Pass 1: the characters, their count and the bytes (CRLF read as LF).
  std::vector<bool> seen(subword ? 0 : 0x110000, false);
  int64_t n = 0;
  PrepareResult r;
  std::vector<json> sources;
  {
    std::string last;
    uint64_t file_bytes = 0;
    for_each_block(opts.inputs, opts.chunk_bytes, [&](const std::string& in, const std::string& text,
                                                      const std::vector<char32_t>& cps) {
      if (in != last && !last.empty()) {
        sources.push_back({{"path", fs::absolute(last).lexically_normal().string()}, {"bytes", file_bytes}});
        file_bytes = 0;
      }
      last = in;
      if (!subword)
        for (char32_t c : cps) seen[c] = true;
      n += static_cast<int64_t>(cps.size());
      file_bytes += text.size();
      r.bytes += text.size();
    });
    sources.push_back({{"path", fs::absolute(last).lexically_normal().string()}, {"bytes", file_bytes}});
  }
  fs::create_directories(opts.out);
  json meta = json::object();
  meta["format"] = "attograd-tokens";
  meta["version"] = kTokenFileVersion;
  meta["tokenizer"] = opts.tokenizer;
  if (!subword) {
    std::vector<std::string> tokens;
    std::vector<int32_t> id(0x110000, -1);
    for (char32_t c = 0; c < 0x110000; ++c)
      if (seen[c]) {
        id[c] = static_cast<int32_t>(Vocabulary::kReserved + static_cast<int64_t>(tokens.size()));
        tokens.push_back(encode_utf8(c));
      }
    const Vocabulary vocab(tokens, Tokenize::Char);
    ATTO_CHECK(vocab.size() <= opts.max_vocab, me, "the text has ", tokens.size(), " distinct characters; with the ",
               Vocabulary::kReserved, " reserved ids that is ", vocab.size(), ", more than the limit of ",
               opts.max_vocab);
    const auto n_val = static_cast<int64_t>(static_cast<double>(n) * opts.val_fraction);
    const int64_t n_train = n - n_val;
    ATTO_CHECK(n_train >= 2 && n_val >= 2, me, "the text has ", n, " characters: too few to hold out ",
               opts.val_fraction, " of them (each part needs at least 2; they would get ", n_train, " and ", n_val,
               ")");
    const uint64_t th = char_tokenizer_hash(vocab);
    const uint32_t width = vocab.size() <= (int64_t{1} << 16) ? 2 : 4;
    // Pass 2: the tokens, the first n_train into train.bin, the rest into val.bin.
    TokenFileWriter train((fs::path(opts.out) / "train.bin").string(), width, th);
    TokenFileWriter val((fs::path(opts.out) / "val.bin").string(), width, th);
    std::vector<int64_t> ids;
    int64_t done = 0;
    for_each_block(opts.inputs, opts.chunk_bytes, [&](const std::string& in, const std::string&,
                                                      const std::vector<char32_t>& cps) {
      ids.resize(cps.size());
      for (size_t i = 0; i < cps.size(); ++i) {
        ids[i] = id[cps[i]];
        // A character that pass 1 did not see: the file changed while it was read.
        ATTO_CHECK(ids[i] >= 0, me, "'", in, "' changed while it was being prepared; run prepare again");
      }
      const auto m = static_cast<int64_t>(ids.size());
      const int64_t to_train = std::clamp<int64_t>(n_train - done, 0, m);
      train.write(ids.data(), to_train);
      val.write(ids.data() + to_train, m - to_train);
      done += m;
    });
    ATTO_CHECK(done == n, me, "the input changed while it was being prepared; run prepare again");
    train.commit();
    val.commit();
    meta["vocabulary"] = vocab.tokens();
    meta["tokenizer_hash"] = hex64(th);
    r.train_tokens = n_train;
    r.val_tokens = n_val;
    r.vocab_size = vocab.size();
    r.tokenizer_hash = th;
    r.vocabulary = vocab.tokens();
  } else {
    // TextDataset's split: the held-out part is the last val_fraction of the bytes, moved back to a character start.
    const auto total = static_cast<int64_t>(r.bytes);
    const int64_t raw = total - static_cast<int64_t>(static_cast<double>(total) * opts.val_fraction);
    // Pass 2: the training part's first kMaxDataFileBytes (all of it, for a text --text could read) train the
    // tokenizer; the exact split is found on the way.
    std::string sample;
    int64_t offset = 0, split = -1;
    for_each_block(opts.inputs, opts.chunk_bytes, [&](const std::string&, const std::string& text,
                                                      const std::vector<char32_t>&) {
      const auto m = static_cast<int64_t>(text.size());
      if (split < 0 && offset + m > raw) {  // blocks hold whole characters: the start at or before raw is here
        int64_t s = raw - offset;
        while (s > 0 && (static_cast<unsigned char>(text[static_cast<size_t>(s)]) & 0xC0) == 0x80) --s;
        split = offset + s;
      }
      const int64_t end = split >= 0 ? split : offset + m;
      const int64_t take = std::min<int64_t>(end - offset, static_cast<int64_t>(kMaxDataFileBytes) -
                                                               static_cast<int64_t>(sample.size()));
      if (take > 0) sample.append(text, 0, static_cast<size_t>(take));
      offset += m;
    });
    if (split < 0) split = total;
    if (static_cast<int64_t>(sample.size()) < split)  // cut: end the sample at a character start
      while (!sample.empty() && (static_cast<unsigned char>(sample.back()) & 0xC0) == 0x80) sample.pop_back();
    if (!sample.empty() && static_cast<int64_t>(sample.size()) < split &&
        static_cast<unsigned char>(sample.back()) >= 0xC0)
      sample.pop_back();
    ATTO_CHECK(!sample.empty(), me, "the text has ", total, " bytes: no training part for --val-fraction ",
               opts.val_fraction);
    const Tokenizer tok = Tokenizer::train(sample, opts.tokenizer, opts.vocab_size);
    sample = {};
    const uint64_t th = tok.hash();
    const uint32_t width = tok.size() <= (int64_t{1} << 16) ? 2 : 4;
    // Pass 3: [0, split) encoded into train.bin, the rest into val.bin.
    TokenFileWriter train((fs::path(opts.out) / "train.bin").string(), width, th);
    TokenFileWriter val((fs::path(opts.out) / "val.bin").string(), width, th);
    LineEncoder te(tok, train), ve(tok, val);
    offset = 0;
    for_each_block(opts.inputs, opts.chunk_bytes, [&](const std::string&, const std::string& text,
                                                      const std::vector<char32_t>&) {
      const auto m = static_cast<int64_t>(text.size());
      const int64_t to_train = std::clamp<int64_t>(split - offset, 0, m);
      if (to_train > 0) te.add(std::string_view(text).substr(0, static_cast<size_t>(to_train)));
      if (to_train < m) {
        te.finish();
        ve.add(std::string_view(text).substr(static_cast<size_t>(to_train)));
      }
      offset += m;
    });
    ATTO_CHECK(offset == total, me, "the input changed while it was being prepared; run prepare again");
    te.finish();
    ve.finish();
    ATTO_CHECK(train.count() >= 2 && val.count() >= 2, me, "the text has ", train.count() + val.count(), " ",
               opts.tokenizer, " tokens: too few to hold out ", opts.val_fraction,
               " of it (each part needs at least 2; they would get ", train.count(), " and ", val.count(), ")");
    r.train_tokens = train.count();
    r.val_tokens = val.count();
    train.commit();
    val.commit();
    meta["vocab_size"] = tok.pieces();
    meta["tokenizer_model"] = base64_encode(tok.proto());
    meta["tokenizer_hash"] = hex64(th);
    r.vocab_size = tok.size();
    r.tokenizer_hash = th;
  }
  meta["val_fraction"] = opts.val_fraction;
  meta["train_tokens"] = r.train_tokens;
  meta["val_tokens"] = r.val_tokens;
  meta["bytes"] = r.bytes;
  meta["sources"] = sources;
  write_meta(opts.out, meta);
  r.out = opts.out;
  return r;
}

// ---------------------------------------------------------------------------------------------
// TokenFileDataset

namespace {

struct Meta {
  std::string tokenizer;
  std::vector<std::string> vocabulary;  // char
  std::optional<Tokenizer> subword;     // bpe, unigram
  int64_t vocab_size = 0;               // bpe, unigram: pieces
  std::string model;                    // bpe, unigram: base64
  uint64_t tokenizer_hash = 0;
  double val_fraction = 0.1;
};

Meta read_meta(const std::string& dir) {
  const std::string path = (fs::path(dir) / "meta.json").string();
  const char* me = "data";
  ATTO_CHECK(fs::is_directory(dir), me, "'", dir, "' is not a directory (--data takes what attograd prepare wrote)");
  const std::vector<uint8_t> bytes = io::detail::read_file(path, me, uint64_t{64} << 20);
  const std::string text(bytes.begin(), bytes.end());
  io::check_json_depth(text, me, "'" + path + "'");
  const json j = json::parse(text, nullptr, false);
  ATTO_CHECK(!j.is_discarded() && j.is_object() && j.value("format", "") == "attograd-tokens", me, "'", path,
             "' is not an attograd prepare meta.json");
  ATTO_CHECK(j.contains("version") && j["version"].is_number_unsigned() &&
                 j["version"].get<uint64_t>() == kTokenFileVersion,
             me, "'", path, "' has another version than ", kTokenFileVersion, " (prepare the text again)");
  Meta m;
  ATTO_CHECK(j.contains("tokenizer") && j["tokenizer"].is_string(), me, "'", path, "': \"tokenizer\" must be a string");
  m.tokenizer = j["tokenizer"].get<std::string>();
  ATTO_CHECK(m.tokenizer == "char" || m.tokenizer == "bpe" || m.tokenizer == "unigram", me, "'", path,
             "': unknown tokenizer \"", m.tokenizer.substr(0, 60), "\"");
  ATTO_CHECK(j.contains("tokenizer_hash") && j["tokenizer_hash"].is_string(), me, "'", path,
             "': \"tokenizer_hash\" must be a hex string");
  const std::string hs = j["tokenizer_hash"].get<std::string>();
  char* end = nullptr;
  m.tokenizer_hash = std::strtoull(hs.c_str(), &end, 16);
  ATTO_CHECK(hs.size() == 16 && end == hs.c_str() + hs.size(), me, "'", path,
             "': \"tokenizer_hash\" must be 16 hex digits");
  if (m.tokenizer == "char") {
    ATTO_CHECK(j.contains("vocabulary") && j["vocabulary"].is_array(), me, "'", path,
               "': \"vocabulary\" must be an array of strings");
    for (const json& t : j["vocabulary"]) {
      ATTO_CHECK(t.is_string(), me, "'", path, "': \"vocabulary\" must be an array of strings");
      m.vocabulary.push_back(t.get<std::string>());
    }
  } else {
    ATTO_CHECK(j.contains("tokenizer_model") && j["tokenizer_model"].is_string() && j.contains("vocab_size") &&
                   j["vocab_size"].is_number_integer(),
               me, "'", path, "': a ", m.tokenizer, " tokenizer needs \"tokenizer_model\" and \"vocab_size\"");
    m.model = j["tokenizer_model"].get<std::string>();
    m.vocab_size = j["vocab_size"].get<int64_t>();
    const std::string origin = "'" + path + "' (\"tokenizer_model\")";
    std::string proto = base64_decode(m.model, origin);
    ATTO_CHECK(io::detail::xxh64(proto.data(), proto.size()) == m.tokenizer_hash, me, "'", path,
               "': its tokenizer does not match its tokenizer_hash (the tokenizer was changed since attograd "
               "prepare; prepare the text again)");
    m.subword = Tokenizer::load(std::move(proto), m.tokenizer, origin);
    ATTO_CHECK(m.subword->pieces() == m.vocab_size, me, "'", path, "': the tokenizer has ", m.subword->pieces(),
               " pieces, \"vocab_size\" says ", m.vocab_size);
  }
  if (j.contains("val_fraction") && j["val_fraction"].is_number()) m.val_fraction = j["val_fraction"].get<double>();
  return m;
}

}  // namespace

TokenFileDataset::TokenFileDataset(const DataSpec& spec, bool read_file) : spec_(spec) {
  const char* me = "TokenFileDataset";
  spec_.validate();
  ATTO_CHECK(spec_.format == "tokens", me, "spec format must be \"tokens\", got \"", spec_.format, "\"");
  spec_.max_source_len = spec_.context;
  spec_.max_target_len = 1;
  tokenizer_ = saved_tokenizer(spec_);
  if (!read_file) {
    ATTO_CHECK(tokenizer_.has_value() || !spec_.vocabulary.empty(), me,
               "a dataset without its files needs the saved vocabulary or tokenizer");
    if (!tokenizer_) vocab_ = Vocabulary(spec_.vocabulary, Tokenize::Char);
    return;
  }
  Meta meta = read_meta(spec_.path);
  const std::string meta_path = (fs::path(spec_.path) / "meta.json").string();
  const bool was_char = spec_.tokenizer == "char" && spec_.tokenizer_model.empty();
  const bool given = !spec_.vocabulary.empty() || !spec_.tokenizer_model.empty();
  if (meta.tokenizer == "char") {
    vocab_ = Vocabulary(meta.vocabulary, Tokenize::Char);
    for (const std::string& t : meta.vocabulary)
      ATTO_CHECK(decode_utf8(t, "'" + meta_path + "'").size() == 1, me, "'", meta_path, "': vocabulary token \"",
                 t.substr(0, 20), "\" is not one character");
    ATTO_CHECK(char_tokenizer_hash(vocab_) == meta.tokenizer_hash, "data", "'", meta_path,
               "': its tokenizer does not match its tokenizer_hash (the vocabulary was edited since attograd "
               "prepare; prepare the text again)");
    ATTO_CHECK(vocab_.size() <= spec_.max_vocab, "data", "'", meta_path, "' has a vocabulary of ", vocab_.size(),
               " tokens, more than the limit of ", spec_.max_vocab);
    ATTO_CHECK(!given || (was_char && spec_.vocabulary == meta.vocabulary), "data", "'", spec_.path,
               "' has another tokenizer than the model was trained with (it was prepared again); give the original "
               "directory");
    spec_.vocabulary = meta.vocabulary;
  } else {
    ATTO_CHECK(!given || (spec_.tokenizer == meta.tokenizer && spec_.tokenizer_hash == meta.tokenizer_hash), "data",
               "'", spec_.path,
               "' has another tokenizer than the model was trained with (it was prepared again); give the original "
               "directory");
    tokenizer_ = std::move(meta.subword);
    ATTO_CHECK(tokenizer_->size() <= spec_.max_vocab, "data", "'", meta_path, "' has a vocabulary of ",
               tokenizer_->size(), " tokens, more than the limit of ", spec_.max_vocab);
    spec_.tokenizer = meta.tokenizer;
    spec_.vocab_size = meta.vocab_size;
    spec_.tokenizer_model = meta.model;
    spec_.tokenizer_hash = meta.tokenizer_hash;
  }
  train_ = std::make_unique<TokenFile>((fs::path(spec_.path) / "train.bin").string(), meta.tokenizer_hash,
                                       vocab_size());
  val_ = std::make_unique<TokenFile>((fs::path(spec_.path) / "val.bin").string(), meta.tokenizer_hash,
                                     vocab_size());
  const uint64_t digest = train_->digest() ^ (val_->digest() * 0x9E3779B97F4A7C15ull);
  ATTO_CHECK(spec_.file_hash == 0 || spec_.file_hash == digest, "data", "'", spec_.path,
             "' changed since the model was trained on it (its token files hash differs); give the original "
             "directory");
  spec_.file_hash = digest;
  spec_.val_fraction = meta.val_fraction;
  spec_.validate();
  ATTO_CHECK(train_->size() >= spec_.context + 1 && val_->size() >= 2, me, "'", spec_.path, "' has ",
             train_->size(), " training and ", val_->size(), " held-out tokens: too few for context ", spec_.context,
             " (the training part needs at least context + 1 = ", spec_.context + 1,
             ", the held-out part at least 2)");
}

std::string TokenFileDataset::token_text(int64_t token) const {
  return tokenizer_ ? tokenizer_->token_text(token) : vocab_.token(token);
}

std::string TokenFileDataset::to_text(const std::vector<int64_t>& tokens) const {
  return tokenizer_ ? tokenizer_->decode(tokens) : vocab_.decode(tokens);
}

int64_t TokenFileDataset::token_bytes(int64_t token) const {
  if (tokenizer_) return tokenizer_->token_bytes(token);
  return token < Vocabulary::kReserved ? 0 : static_cast<int64_t>(vocab_.token(token).size());
}

std::string TokenFileDataset::name() const {
  fs::path p = fs::path(spec_.path).lexically_normal();
  if (p.filename().empty()) p = p.parent_path();  // "dir/"
  return p.filename().string();
}

void TokenFileDataset::seed(uint64_t seed) {
  gen_.manual_seed(seed);
  offset_ = 0;
}

Example TokenFileDataset::next() {
  ATTO_CHECK(train_ != nullptr, "TokenFileDataset", "no data: the dataset was opened without its files");
  const int64_t start = static_cast<int64_t>(gen_.randint(static_cast<uint64_t>(train_->size() - spec_.context)));
  ++offset_;
  Example e;  // the window read into src, its last token then moved to tgt
  e.src.resize(static_cast<size_t>(spec_.context + 1));
  train_->read(start, spec_.context + 1, e.src.data());
  e.tgt = {e.src.back()};
  e.src.pop_back();
  return e;
}

std::vector<Example> TokenFileDataset::heldout(int64_t n, uint64_t) const {
  ATTO_CHECK(n >= 1, name(), "held-out example count must be >= 1, got ", n);
  ATTO_CHECK(val_ != nullptr, "TokenFileDataset", "no data: the dataset was opened without its files");
  // TextDataset's held-out windows: from the first held-out token, every context tokens.
  std::vector<Example> out;
  const int64_t total = val_->size();
  std::vector<int64_t> w;
  for (int64_t s = 0; s + 1 < total && static_cast<int64_t>(out.size()) < n; s += spec_.context) {
    const int64_t e = std::min(total, s + spec_.context + 1);
    w.resize(static_cast<size_t>(e - s));
    val_->read(s, e - s, w.data());
    out.push_back({.src = std::vector<int64_t>(w.begin(), w.end() - 1), .tgt = {w.back()}});
  }
  return out;
}

int64_t TokenFileDataset::heldout_size() const {
  const int64_t span = val_size() - 1;
  return span > 0 ? (span + spec_.context - 1) / spec_.context : 0;
}

void TokenFileDataset::set_position(const DataPosition& p) {
  ATTO_CHECK(p.offset >= 0, name(), "data position offset must be >= 0, got ", p.offset);
  gen_.set_state(p.generator);
  offset_ = p.offset;
}

std::vector<int64_t> TokenFileDataset::parse_source(const std::string& text) const {
  std::vector<int64_t> ids = tokenizer_ ? tokenizer_->encode(text, "the prompt") : vocab_.encode(text, "the prompt");
  ATTO_CHECK(!ids.empty(), "parse_source", "the prompt is empty");
  return ids;
}

}  // namespace attograd::data
