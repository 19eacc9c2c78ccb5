// UTF-8, Vocabulary, DataSpec and TextDataset: tokens of Chinese and ASCII text, the contiguous held-out split,
// nanoGPT-style windows, resumable positions, and every bad-data error (empty, invalid UTF-8 with its offset, NUL
// bytes, too few characters, too large a vocabulary, too large a file, a file changed since training, CRLF).

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <set>

#include "scratch.h"
#include "testing.h"
#include "train/data/text.h"

using namespace attograd;
using namespace attograd::data;
using namespace attograd::testing;

namespace {

namespace fs = std::filesystem;

// A file in the test's scratch directory holding `bytes`.
std::string scratch_file(const std::string& name, const std::string& bytes) {
  return test_scratch::file("text", name, bytes);
}

// The message of the Error f throws ("" when it throws none).
template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

std::string repeat(const std::string& s, int n) {
  std::string out;
  for (int i = 0; i < n; ++i) out += s;
  return out;
}

}  // namespace

TEST(Utf8, DecodesChineseAndRoundTrips) {
  const std::string text = "a\xC3\xA9\xE4\xB8\xAD\xF0\x9F\x98\x80";  // a, e-acute, U+4E2D, U+1F600
  const std::vector<char32_t> cps = decode_utf8(text, "t");
  EXPECT_EQ(cps, (std::vector<char32_t>{U'a', 0xE9, 0x4E2D, 0x1F600}));
  std::string back;
  for (char32_t c : cps) back += encode_utf8(c);
  EXPECT_EQ(back, text);
}

TEST(Utf8, ErrorsNameTheByteOffset) {
  EXPECT_NE(error_of([] {
              decode_utf8(
                  "ab\xFF"
                  "c",
                  "f");
            }).find("invalid UTF-8 at byte offset 2"),
            std::string::npos);
  EXPECT_NE(error_of([] { decode_utf8("abc\xE4\xB8", "f"); }).find("byte offset 3"), std::string::npos);  // cut off
  EXPECT_NE(error_of([] { decode_utf8("x\xC0\xAF", "f"); }).find("overlong"), std::string::npos);
  EXPECT_NE(error_of([] { decode_utf8("\xED\xA0\x80", "f"); }).find("not a Unicode scalar value"), std::string::npos);
  EXPECT_NE(error_of([] { decode_utf8("\xE4\x41\x41", "f"); }).find("not a continuation byte"), std::string::npos);
  const std::string nul("ab\0c", 4);
  EXPECT_NE(error_of([&] { decode_utf8(nul, "f"); }).find("NUL byte at byte offset 2 (binary data"), std::string::npos);
}

TEST(Vocabulary, CharactersWordsAndJson) {
  const Vocabulary chars = Vocabulary::build({"b", "a", "\xE4\xB8\xAD", "a"}, Tokenize::Char);
  EXPECT_EQ(chars.size(), Vocabulary::kReserved + 3);
  EXPECT_EQ(chars.tokens(), (std::vector<std::string>{"a", "b", "\xE4\xB8\xAD"}));
  EXPECT_EQ(chars.encode("ba\xE4\xB8\xAD", "t"), (std::vector<int64_t>{5, 4, 6}));
  EXPECT_EQ(chars.decode({5, 2, 4, 6}), "ba\xE4\xB8\xAD");  // the reserved EOS is left out
  EXPECT_EQ(chars.token(0), "<pad>");
  const std::string err = error_of([&] { chars.encode("abz", "the prompt"); });
  EXPECT_NE(err.find("the prompt: character 'z' (U+007A) is not in the model's vocabulary of 7 tokens"),
            std::string::npos)
      << err;
  EXPECT_EQ(Vocabulary::from_json(chars.to_json()), chars);

  const Vocabulary words = Vocabulary::build({"uno", "dos", "uno"}, Tokenize::Word);
  EXPECT_EQ(words.split("  uno\tdos  uno ", "t"), (std::vector<std::string>{"uno", "dos", "uno"}));
  EXPECT_EQ(words.decode(words.encode("uno dos", "t")), "uno dos");
  EXPECT_EQ(Vocabulary::from_json(words.to_json()), words);
  EXPECT_NE(error_of([] { Vocabulary({"a", "a"}); }).find("appears twice"), std::string::npos);
}

TEST(DataSpec, JsonRoundTripAndValidation) {
  DataSpec s{.format = "pairs", .path = "x.tsv", .tokenize = "word", .context = 8, .val_fraction = 0.25};
  s.vocabulary = {"a", "b"};
  s.file_hash = 12345678901234567890ull;
  EXPECT_EQ(DataSpec::from_json(s.to_json()), s);
  EXPECT_NE(error_of([] { DataSpec::from_json(R"({"bogus": 1})"); }).find("unknown field \"bogus\""),
            std::string::npos);
  EXPECT_NE(error_of([] { DataSpec{.context = 65537}.validate(); }).find("context must be in [1, 65536]"),
            std::string::npos);
  EXPECT_NE(error_of([] { DataSpec{.val_fraction = 0}.validate(); }).find("val_fraction"), std::string::npos);
  EXPECT_NE(error_of([] { DataSpec{.tokenize = "word"}.validate(); }).find("modelled by character"), std::string::npos);
}

TEST(TextDataset, ChineseTokensSplitAndWindows) {
  // 100 characters: "床前明月光，" repeated, then ASCII; the last 10% (10 characters) are held out.
  const std::string text =
      repeat("\xE5\xBA\x8A\xE5\x89\x8D\xE6\x98\x8E\xE6\x9C\x88\xE5\x85\x89\xEF\xBC\x8C", 15) + "abcdefghij";
  TextDataset d({.format = "text", .path = scratch_file("poem.txt", text), .context = 4, .val_fraction = 0.1});
  EXPECT_EQ(d.vocab_size(), Vocabulary::kReserved + 6 + 10);
  EXPECT_EQ(d.train_size(), 90);
  EXPECT_EQ(d.val_size(), 10);
  EXPECT_TRUE(d.stream());
  EXPECT_EQ(d.max_source_len(), 4);
  EXPECT_EQ(d.max_target_len(), 1);
  EXPECT_EQ(d.model_spec({}).stream, true);
  EXPECT_EQ(d.to_text(d.parse_source("\xE6\x98\x8E\xE6\x9C\x88")), "\xE6\x98\x8E\xE6\x9C\x88");

  // Training windows: context + 1 consecutive characters of the training part (never the held-out letters).
  d.seed(7);
  const Vocabulary& v = d.vocabulary();
  const int64_t a = *v.find("a"), j = *v.find("j");
  std::set<std::string> seen;
  for (int i = 0; i < 200; ++i) {
    const Example e = d.next();
    ASSERT_EQ(e.src.size(), 4u);
    ASSERT_EQ(e.tgt.size(), 1u);
    std::vector<int64_t> w = e.src;
    w.push_back(e.tgt[0]);
    for (int64_t t : w) EXPECT_FALSE(t >= a && t <= j) << t;  // letters are only in the held-out part
    seen.insert(d.to_text(w));
  }
  EXPECT_EQ(seen.size(), 6u);  // a period-6 text has 6 distinct windows, and 200 draws find them all

  // Held-out windows start every `context` characters of the held-out part: abcde, efghi, ij.
  const std::vector<Example> h = d.heldout(100, 0);
  ASSERT_EQ(h.size(), 3u);
  EXPECT_EQ(d.to_text(h[0].src) + "|" + d.to_text(h[0].tgt), "abcd|e");
  EXPECT_EQ(d.to_text(h[1].src) + "|" + d.to_text(h[1].tgt), "efgh|i");
  EXPECT_EQ(d.to_text(h[2].src) + "|" + d.to_text(h[2].tgt), "i|j");
  EXPECT_EQ(d.heldout(2, 99).size(), 2u);
}

TEST(TextDataset, PositionsResumeTheStream) {
  TextDataset d(
      {.path = scratch_file("abc.txt", repeat("the quick brown fox jumps over the lazy dog. ", 5)), .context = 8});
  d.seed(3);
  for (int i = 0; i < 5; ++i) d.next();
  const DataPosition p = d.position();
  EXPECT_EQ(p.offset, 5);
  std::vector<Example> want;
  for (int i = 0; i < 5; ++i) want.push_back(d.next());
  d.seed(99);
  d.set_position(p);
  for (int i = 0; i < 5; ++i) EXPECT_EQ(d.next(), want[static_cast<size_t>(i)]);
}

TEST(TextDataset, CrlfIsReadAsLf) {
  const std::string lf = repeat("line one\nline two\n", 4), crlf = repeat("line one\r\nline two\r\n", 4);
  TextDataset a({.path = scratch_file("lf.txt", lf), .context = 8}),
      b({.path = scratch_file("crlf.txt", crlf), .context = 8});
  EXPECT_EQ(a.vocabulary(), b.vocabulary());
  EXPECT_FALSE(b.vocabulary().find("\r").has_value());
  EXPECT_EQ(a.heldout(100, 0), b.heldout(100, 0));
}

TEST(TextDataset, BadFilesAreOneLineErrors) {
  auto open = [](const std::string& name, const std::string& bytes, DataSpec spec = {}) {
    spec.path = scratch_file(name, bytes);
    return error_of([&] { open_data(spec); });
  };
  EXPECT_NE(open("empty.txt", "").find("is empty"), std::string::npos);
  EXPECT_NE(open("bad.txt", repeat("ok ", 50) + "\xC3\x28").find("invalid UTF-8 at byte offset 150"),
            std::string::npos);
  EXPECT_NE(open("bin.txt", std::string("\x7f"
                                        "ELF\0\0\0",
                                        7) +
                                repeat("x", 100))
                .find("NUL byte at byte offset 4"),
            std::string::npos);
  const std::string small = open("small.txt", "hello world", {.context = 64});
  EXPECT_NE(small.find("has 11 characters: too few for context 64"), std::string::npos) << small;
  const std::string vocab = open("vocab.txt", repeat("abcdefghijklmnopqrstuvwxyz", 4), {.max_vocab = 20});
  EXPECT_NE(vocab.find("26 distinct tokens; with the 4 reserved ids that is 30, more than the limit of 20"),
            std::string::npos)
      << vocab;
  const std::string huge = open("huge.txt", repeat("0123456789", 200), {.max_bytes = 1000});
  EXPECT_NE(huge.find("huge.txt' is 2000 bytes, more than the 1000 bytes read into memory; for a larger corpus run "
                      "`attograd prepare --text "),
            std::string::npos)
      << huge;
  EXPECT_NE(error_of([] { open_data({.path = "/nonexistent/x.txt"}); }).find("cannot open"), std::string::npos);
}

TEST(TextDataset, ReadOnceThenAChangedFileIsRefused) {
  const std::string path = scratch_file("changing.txt", repeat("abcdefgh", 20));
  TextDataset d({.path = path, .context = 4});
  d.seed(1);
  const Example first = d.next();
  // The file changes while training: the dataset read it once and does not see the change...
  std::ofstream(path, std::ios::binary) << repeat("zzzzzzzz", 20);
  d.seed(1);
  EXPECT_EQ(d.next(), first);
  // ...and re-opening the saved settings (resume, eval) refuses the changed file.
  const DataSpec saved = d.spec();
  EXPECT_NE(saved.file_hash, 0u);
  const std::string err = error_of([&] { open_data(saved); });
  EXPECT_NE(err.find("changed since the model was trained on it"), std::string::npos) << err;
}

TEST(TextDataset, WithoutTheFileOnlyTheTokenSpace) {
  TextDataset full({.path = scratch_file("tokens.txt", repeat("hello, world. ", 20)), .context = 8});
  TextDataset vocab_only(full.spec(), /*read_file=*/false);
  EXPECT_EQ(vocab_only.vocab_size(), full.vocab_size());
  EXPECT_EQ(vocab_only.model_spec({}), full.model_spec({}));
  EXPECT_EQ(vocab_only.parse_source("hello"), full.parse_source("hello"));
  EXPECT_NE(error_of([&] { vocab_only.next(); }).find("opened without its file"), std::string::npos);
}
