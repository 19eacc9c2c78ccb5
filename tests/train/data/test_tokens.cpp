// Token files, prepare() and TokenFileDataset: a prepared file draws exactly TextDataset's windows (across block
// boundaries that cut characters and CRLF pairs), several files concatenate, resident memory stays flat while
// windows are drawn from a large file, and every bad token file or directory is an Error naming what is wrong.

#include <fcntl.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>

#include "scratch.h"
#include "testing.h"
#include "train/data/text.h"
#include "train/data/tokens.h"

using namespace attograd;
using namespace attograd::data;

namespace {

namespace fs = std::filesystem;

const fs::path& scratch_dir() { return test_scratch::dir("tokens"); }

std::string scratch_file(const std::string& name, const std::string& bytes) {
  const std::string path = (scratch_dir() / name).string();
  std::ofstream(path, std::ios::binary) << bytes;
  return path;
}

std::string slurp(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::ostringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// A text with multi-byte characters and CRLF line ends here and there, so that small blocks cut them.
std::string mixed_text(int lines) {
  std::string s;
  for (int i = 0; i < lines; ++i)
    s += "line " + std::to_string(i) + " \xE4\xB8\xAD\xE6\x96\x87 caf\xC3\xA9 \xF0\x9F\x98\x80" +
         (i % 3 == 0 ? "\r\n" : "\n");
  return s;
}

std::string prepared(const std::string& name, const std::vector<std::string>& inputs, uint64_t chunk = 7,
                     double val_fraction = 0.1) {
  const std::string out = (scratch_dir() / name).string();
  prepare({.inputs = inputs, .out = out, .val_fraction = val_fraction, .chunk_bytes = chunk});
  return out;
}

std::string repeat_lines(const std::string& line, int n) {
  std::string s;
  for (int i = 0; i < n; ++i) s += line + " " + std::to_string(i) + "\n";
  return s;
}

// VmRSS of this process in kB.
int64_t resident_kb() {
  std::ifstream f("/proc/self/status");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind("VmRSS:", 0) == 0) return std::stoll(line.substr(6));
  return -1;
}

}  // namespace

TEST(TokenFiles, PreparedTextDrawsTheSameWindowsAsTheTextFile) {
  const std::string file = scratch_file("mixed.txt", mixed_text(300));
  for (uint64_t chunk : {uint64_t{7}, uint64_t{16}, uint64_t{1} << 20}) {  // blocks that cut characters and CRLFs
    const std::string dir = prepared("mixed-" + std::to_string(chunk), {file}, chunk);
    TextDataset text({.format = "text", .path = file, .context = 24});
    TokenFileDataset tokens({.format = "tokens", .path = dir, .context = 24});
    EXPECT_EQ(tokens.spec().vocabulary, text.spec().vocabulary) << chunk;
    EXPECT_EQ(tokens.vocab_size(), text.vocab_size());
    EXPECT_EQ(tokens.train_size(), text.train_size());
    EXPECT_EQ(tokens.val_size(), text.val_size());
    EXPECT_EQ(tokens.heldout_size(), text.heldout_size());
    text.seed(5);
    tokens.seed(5);
    for (int i = 0; i < 200; ++i) {
      const Example a = text.next(), b = tokens.next();
      ASSERT_EQ(a.src, b.src) << "window " << i << ", block " << chunk;
      ASSERT_EQ(a.tgt, b.tgt);
    }
    EXPECT_EQ(tokens.position().offset, 200);
    const auto ha = text.heldout(1000, 0), hb = tokens.heldout(1000, 0);
    ASSERT_EQ(ha.size(), hb.size());
    for (size_t i = 0; i < ha.size(); ++i) {
      EXPECT_EQ(ha[i].src, hb[i].src);
      EXPECT_EQ(ha[i].tgt, hb[i].tgt);
    }
    EXPECT_EQ(tokens.to_text(tokens.parse_source("caf\xC3\xA9 \xE4\xB8\xAD")), "caf\xC3\xA9 \xE4\xB8\xAD");
  }
}

TEST(TokenFiles, FilesConcatenateInOrderAndTheHeaderSaysWhatFollows) {
  const std::string a = scratch_file("a.txt", "abcabcabcabcabcabcabcabcabcabc"), b = scratch_file("b.txt", "xyzzy\n");
  const std::string dir = prepared("ab", {a, b}, 5, 0.25);
  const std::string both = scratch_file("ab.txt", slurp(a) + slurp(b));
  TextDataset text({.format = "text", .path = both, .context = 4, .val_fraction = 0.25});
  TokenFileDataset tokens({.format = "tokens", .path = dir, .context = 4});
  EXPECT_EQ(tokens.spec().vocabulary, text.spec().vocabulary);
  EXPECT_EQ(tokens.train_size() + tokens.val_size(), 36);
  EXPECT_EQ(tokens.val_size(), 9);  // floor(36 * 0.25)
  const TokenFileHeader h = read_token_file_header(dir + "/val.bin");
  EXPECT_EQ(h.version, kTokenFileVersion);
  EXPECT_EQ(h.width, 2u);
  EXPECT_EQ(h.count, 9u);
  EXPECT_EQ(h.tokenizer_hash, char_tokenizer_hash(Vocabulary(text.spec().vocabulary)));
  EXPECT_EQ(fs::file_size(dir + "/val.bin"), kTokenFileHeaderBytes + 9 * 2);
  const auto held = tokens.heldout(10, 0);
  ASSERT_EQ(held.size(), 2u);  // 9 held-out tokens, context 4: windows starting at 0 and 4
  EXPECT_EQ(tokens.to_text(held[0].src) + tokens.to_text(held[0].tgt), slurp(both).substr(27, 5));
  EXPECT_EQ(tokens.to_text(held[1].src) + tokens.to_text(held[1].tgt), slurp(both).substr(31, 5));
}

TEST(TokenFiles, ResidentMemoryStaysFlatWhileWindowsAreDrawn) {
  // 24M tokens (48 MB) under a prepared tokenizer; 20,000 random windows touch most of the file's pages, which the
  // mapping would keep resident (about 48 MB) if the dataset did not release them.
  const std::string dir = prepared("big", {scratch_file("small.txt", mixed_text(50))}, 1 << 20);
  const TokenFileHeader h = read_token_file_header(dir + "/train.bin");
  std::vector<int64_t> tokens(int64_t{24} << 20);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = 4 + static_cast<int64_t>((i * 2654435761u) % 20);
  write_token_file(dir + "/train.bin", tokens, h.tokenizer_hash);
  tokens = {};
  tokens.shrink_to_fit();
  // Out of the page cache, as a large corpus mostly is: faults then read ahead into large folios and map more than
  // the page touched (also "fault-around"), which the dataset must release too.
  {
    const int fd = ::open((dir + "/train.bin").c_str(), O_RDONLY);
    ASSERT_GE(fd, 0);
    ::fdatasync(fd);
    ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    ::close(fd);
  }
  const int64_t before = resident_kb();
  TokenFileDataset big({.format = "tokens", .path = dir, .context = 256});
  EXPECT_EQ(big.train_size(), int64_t{24} << 20);
  big.seed(1);
  for (int i = 0; i < 20000; ++i) (void)big.next();
  const int64_t after = resident_kb();
  ASSERT_GT(before, 0);
  EXPECT_LT(after - before, 16 * 1024) << "resident memory grew from " << before << " kB to " << after << " kB";
}

TEST(TokenFiles, BadFilesAreErrorsNamingWhatIsWrong) {
  const std::string file = scratch_file("bad.txt", mixed_text(40));
  auto fresh = [&](const std::string& name) { return prepared(name, {file}, 1 << 20); };
  auto open = [](const std::string& dir) {
    return error_of([&] { TokenFileDataset d({.format = "tokens", .path = dir, .context = 8}); });
  };
  {
    const std::string dir = fresh("truncated");
    const auto size = fs::file_size(dir + "/val.bin");
    const auto count = (size - kTokenFileHeaderBytes) / 2;
    fs::resize_file(dir + "/val.bin", size - 1);
    const std::string want = "val.bin' is " + std::to_string(size - 1) + " bytes but its header promises " +
                             std::to_string(count) + " tokens of 2 bytes (" + std::to_string(size) +
                             " bytes with the header): truncated";
    EXPECT_NE(open(dir).find(want), std::string::npos) << open(dir);
  }
  {
    const std::string dir = fresh("trailing");
    std::ofstream(dir + "/train.bin", std::ios::binary | std::ios::app) << "x";
    EXPECT_NE(open(dir).find("trailing bytes after the last token"), std::string::npos) << open(dir);
  }
  {
    const std::string dir = fresh("short");
    fs::resize_file(dir + "/train.bin", 10);
    EXPECT_NE(open(dir).find("train.bin' is 10 bytes, shorter than the 32-byte header"), std::string::npos)
        << open(dir);
  }
  auto patch = [&](const std::string& name, const char* file, size_t at, char value) {
    const std::string dir = fresh(name);
    std::string b = slurp(dir + "/" + file);
    b[at] = value;
    std::ofstream(dir + "/" + file, std::ios::binary) << b;
    return dir;
  };
  const std::string magic = patch("magic", "train.bin", 0, 'X');
  EXPECT_NE(open(magic).find("train.bin' is not a token file"), std::string::npos) << open(magic);
  const std::string version = patch("version", "train.bin", 8, 9);
  EXPECT_NE(open(version).find("train.bin' has format version 9; this attograd reads version 1"), std::string::npos)
      << open(version);
  const std::string width = patch("width", "train.bin", 12, 3);
  EXPECT_NE(open(width).find("has token width 3 bytes; expected 2 (uint16) or 4 (uint32)"), std::string::npos)
      << open(width);
  const std::string range = patch("range", "val.bin", kTokenFileHeaderBytes + 2 * 5 + 1, 1);  // token 5 += 256
  EXPECT_NE(open(range).find("val.bin': token 5 is "), std::string::npos) << open(range);
  EXPECT_NE(open(range).find(", outside the vocabulary of "), std::string::npos);
  {
    // The tokenizer changed since prepare: meta.json's vocabulary edited (its hash no longer matches) ...
    const std::string dir = fresh("edited");
    std::string m = slurp(dir + "/meta.json");
    const size_t at = m.find("\"\\n\"");
    ASSERT_NE(at, std::string::npos);
    m.replace(at, 4, "\"\\t\"");
    std::ofstream(dir + "/meta.json", std::ios::binary) << m;
    EXPECT_NE(open(dir).find("its tokenizer does not match its tokenizer_hash"), std::string::npos) << open(dir);
  }
  {
    // ... or a token file comes from another prepare (another tokenizer) than meta.json.
    const std::string dir = fresh("mixed-up");
    const std::string other =
        prepared("other", {scratch_file("other.txt", "completely different text, 0123456789\n")}, 64);
    fs::copy_file(other + "/val.bin", dir + "/val.bin", fs::copy_options::overwrite_existing);
    EXPECT_NE(open(dir).find("val.bin' was prepared with another tokenizer"), std::string::npos) << open(dir);
    EXPECT_NE(open(dir).find("the tokenizer changed since `attograd prepare`"), std::string::npos);
  }
  EXPECT_NE(open((scratch_dir() / "missing").string()).find("is not a directory"), std::string::npos);
  EXPECT_NE(open(scratch_dir().string()).find("meta.json"), std::string::npos);
  {
    // A directory prepared again from other text is not the one a model was trained on.
    const std::string dir = fresh("changed");
    TokenFileDataset d({.format = "tokens", .path = dir, .context = 8});
    const DataSpec saved = d.spec();
    std::string other = mixed_text(40);
    other[0] = 'L';
    prepare({.inputs = {scratch_file("changed.txt", other)}, .out = dir});
    EXPECT_NE(error_of([&] { TokenFileDataset again(saved); }).find("another tokenizer than the model was trained"),
              std::string::npos);
    prepare({.inputs = {scratch_file("changed2.txt", mixed_text(41))}, .out = dir});
    EXPECT_NE(error_of([&] { TokenFileDataset again(saved); }).find("changed since the model was trained on it"),
              std::string::npos);
    // Without its files, the saved vocabulary alone gives the token space.
    TokenFileDataset space(saved, false);
    EXPECT_EQ(space.vocab_size(), d.vocab_size());
    EXPECT_NE(error_of([&] { space.next(); }).find("opened without its files"), std::string::npos);
  }
}

TEST(TokenFiles, PrepareRefusesBadInputsAndKeepsTheLastGoodFiles) {
  const std::string out = (scratch_dir() / "keep").string();
  const std::string good = scratch_file("good.txt", mixed_text(20));
  prepare({.inputs = {good}, .out = out});
  const std::string before = slurp(out + "/train.bin");
  EXPECT_NE(error_of([&] { prepare({.inputs = {good, scratch_file("bad-utf8.txt", "ok\xFF")}, .out = out}); })
                .find("invalid UTF-8 at byte offset 2"),
            std::string::npos);
  EXPECT_NE(error_of([&] { prepare({.inputs = {scratch_file("empty.txt", "")}, .out = out}); }).find("is empty"),
            std::string::npos);
  EXPECT_NE(error_of([&] { prepare({.inputs = {scratch_file("tiny.txt", "abc")}, .out = out}); })
                .find("too few to hold out"),
            std::string::npos);
  EXPECT_NE(error_of([&] { prepare({.inputs = {good}, .out = out, .val_fraction = 1.0}); }).find("--val-fraction"),
            std::string::npos);
  EXPECT_EQ(slurp(out + "/train.bin"), before);  // nothing was replaced
  for (const auto& e : fs::directory_iterator(out))  // and no temporary file is left behind
    EXPECT_EQ(e.path().filename().string().find(".tmp-"), std::string::npos) << e.path();
}

TEST(TokenFiles, TheTextFileBoundPointsToPrepare) {
  const std::string big = (scratch_dir() / "big.txt").string();
  std::ofstream(big).close();
  fs::resize_file(big, kMaxDataFileBytes + 1);  // sparse: nothing written
  const std::string e = error_of([&] { TextDataset d({.format = "text", .path = big}); });
  EXPECT_NE(e.find("more than the 67108864 bytes read into memory; for a larger corpus run `attograd prepare --text"),
            std::string::npos)
      << e;
  fs::remove(big);
}

TEST(TokenFiles, APreparedSubwordTextDrawsTheSameWindowsAsTheTextFile) {
  // bpe and unigram: the tokenizer is trained on the same training part (the split by bytes, moved back to a
  // character start) and the text encoded line by line across blocks, so the tokens equal TextDataset's.
  std::string text;
  for (int i = 0; i < 120; ++i)
    text += "the cat sat on the mat " + std::to_string(i % 7) + " \xE4\xB8\xAD\xE6\x96\x87 caf\xC3\xA9" +
            (i % 5 == 0 ? "\r\n" : "\n");
  const std::string file = scratch_file("subword.txt", text);
  for (const std::string kind : {"bpe", "unigram"}) {
    const std::string dir = (scratch_dir() / ("sub-" + kind)).string();
    const int64_t pieces = kind == "bpe" ? 300 : 279;  // unigram: SentencePiece needs 278 to 280 for this text
    prepare({.inputs = {file}, .out = dir, .tokenizer = kind, .vocab_size = pieces, .chunk_bytes = 100});
    TextDataset t({.format = "text", .path = file, .context = 16, .tokenizer = kind, .vocab_size = pieces});
    TokenFileDataset d({.format = "tokens", .path = dir, .context = 16});
    EXPECT_EQ(d.spec().tokenizer, kind);
    EXPECT_EQ(d.spec().tokenizer_hash, t.spec().tokenizer_hash) << kind;
    EXPECT_EQ(d.vocab_size(), pieces + 4);
    EXPECT_EQ(d.train_size(), t.train_size());
    EXPECT_EQ(d.val_size(), t.val_size());
    t.seed(3);
    d.seed(3);
    for (int i = 0; i < 100; ++i) {
      const Example a = t.next(), b = d.next();
      ASSERT_EQ(a.src, b.src) << kind << " window " << i;
      ASSERT_EQ(a.tgt, b.tgt);
    }
    const auto ha = t.heldout(100, 0), hb = d.heldout(100, 0);
    ASSERT_EQ(ha.size(), hb.size());
    for (size_t i = 0; i < ha.size(); ++i) EXPECT_EQ(ha[i].src, hb[i].src);
    int64_t bytes = 0;
    for (int64_t id = 0; id < d.vocab_size(); ++id) EXPECT_EQ(d.token_bytes(id), t.token_bytes(id));
    for (int64_t id = 0; id < d.vocab_size(); ++id) bytes += d.token_bytes(id);
    EXPECT_GT(bytes, pieces);
    EXPECT_EQ(d.to_text(d.parse_source("caf\xC3\xA9 \xF0\x9F\x98\x80")), "caf\xC3\xA9 \xF0\x9F\x98\x80");  // byte fallback
    // The saved spec alone (a weights file) gives the token space and the text.
    TokenFileDataset space(d.spec(), false);
    EXPECT_EQ(space.vocab_size(), pieces + 4);
    EXPECT_EQ(space.to_text(d.heldout(1, 0)[0].src), d.to_text(d.heldout(1, 0)[0].src));
  }
}

TEST(TokenFiles, ASubwordTokenizerChangedSincePrepareIsRefused) {
  const std::string file = scratch_file("sub2.txt", repeat_lines("a quick brown fox jumps over the lazy dog", 80));
  const std::string dir = (scratch_dir() / "sub-changed").string(), other = (scratch_dir() / "sub-other").string();
  prepare({.inputs = {file}, .out = dir, .tokenizer = "bpe", .vocab_size = 300});
  prepare({.inputs = {file}, .out = other, .tokenizer = "bpe", .vocab_size = 310});
  auto open = [](const std::string& d) {
    return error_of([&] { TokenFileDataset x({.format = "tokens", .path = d, .context = 8}); });
  };
  EXPECT_EQ(open(dir), "");
  // meta.json's model from another prepare: the token files' headers name another tokenizer.
  fs::copy_file(other + "/meta.json", dir + "/meta.json", fs::copy_options::overwrite_existing);
  EXPECT_NE(open(dir).find("train.bin' was prepared with another tokenizer"), std::string::npos) << open(dir);
  // A model edited inside meta.json no longer gives its hash.
  std::string m = slurp(other + "/meta.json");
  const size_t at = m.find("\"tokenizer_model\": \"") + 40;
  m[at] = m[at] == 'A' ? 'B' : 'A';
  std::ofstream(other + "/meta.json", std::ios::binary) << m;
  EXPECT_NE(open(other).find("its tokenizer does not match its tokenizer_hash"), std::string::npos) << open(other);
  EXPECT_NE(error_of([&] { prepare({.inputs = {file}, .out = dir, .tokenizer = "bpe", .vocab_size = 100000}); })
                .find("--vocab-size"),
            std::string::npos);
  EXPECT_NE(error_of([&] { prepare({.inputs = {file}, .out = dir, .tokenizer = "char", .vocab_size = 10}); })
                .find("--vocab-size is for --tokenizer bpe or unigram"),
            std::string::npos);
}

TEST(TokenFiles, ABadMetaJsonIsAnErrorNamingWhatIsWrong) {
  const std::string file = scratch_file("meta.txt", mixed_text(30));
  const std::string dir = prepared("meta", {file}, 1 << 20);
  const std::string good = slurp(dir + "/meta.json");
  auto with_meta = [&](const std::string& from, const std::string& to) {
    std::string m = good;
    const size_t at = m.find(from);
    EXPECT_NE(at, std::string::npos) << from;
    if (at != std::string::npos) m.replace(at, from.size(), to);
    std::ofstream(dir + "/meta.json", std::ios::binary) << m;
    return error_of([&] { TokenFileDataset d({.format = "tokens", .path = dir, .context = 8}); });
  };
  EXPECT_NE(with_meta("attograd-tokens", "something-else").find("is not an attograd prepare meta.json"),
            std::string::npos);
  EXPECT_NE(with_meta("\"version\": 1", "\"version\": 2").find("has another version than 1"), std::string::npos);
  EXPECT_NE(with_meta("\"tokenizer\": \"char\"", "\"tokenizer\": \"wordpiece\"").find("unknown tokenizer \"wordpiece\""),
            std::string::npos);
  EXPECT_NE(with_meta("\"tokenizer\": \"char\"", "\"tokenizer\": \"bpe\"")
                .find("a bpe tokenizer needs \"tokenizer_model\" and \"vocab_size\""),
            std::string::npos);
  const size_t h = good.find("\"tokenizer_hash\": \"") + 19;
  EXPECT_NE(with_meta(good.substr(h, 16), "xyz").find("\"tokenizer_hash\" must be 16 hex digits"), std::string::npos);
  EXPECT_NE(with_meta("\"vocabulary\": [", "\"vocabulary\": [1, ").find("\"vocabulary\" must be an array of strings"),
            std::string::npos);
  std::ofstream(dir + "/meta.json", std::ios::binary) << good;
  EXPECT_EQ(error_of([&] { TokenFileDataset d({.format = "tokens", .path = dir, .context = 8}); }), "");
}
