// PairsDataset and parse_pairs: character and word tokens, the fixed held-out split, resumable draws, and every
// bad-data error (no tab, several tabs, empty sides, no usable lines, a line too long, invalid UTF-8, NUL bytes,
// too large a vocabulary, a token outside a saved vocabulary), CRLF accepted.

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <set>

#include "scratch.h"
#include "testing.h"
#include "train/data/pairs.h"

using namespace attograd;
using namespace attograd::data;
using namespace attograd::testing;

namespace {

namespace fs = std::filesystem;

std::string scratch_file(const std::string& name, const std::string& bytes) {
  return test_scratch::file("pairs", name, bytes);
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

std::string parse_error(const std::string& text, Tokenize t = Tokenize::Char) {
  return error_of([&] { parse_pairs(text, "'f.tsv'", t, nullptr); });
}

}  // namespace

TEST(Pairs, CharactersAndWords) {
  Vocabulary v;
  const std::vector<PairLine> c = parse_pairs("ab\tba\n\nabc\tcba\n", "f", Tokenize::Char, nullptr, &v);
  ASSERT_EQ(c.size(), 2u);
  EXPECT_EQ(c[1].line, 3);  // the blank line 2 is skipped but counted
  EXPECT_EQ(v.tokens(), (std::vector<std::string>{"a", "b", "c"}));
  EXPECT_EQ(c[0].example, (Example{.src = {4, 5}, .tgt = {5, 4}}));

  const std::vector<PairLine> w = parse_pairs("one two\tuno dos\r\nthree\ttres\r\n", "f", Tokenize::Word, nullptr, &v);
  ASSERT_EQ(w.size(), 2u);
  EXPECT_EQ(v.tokens(), (std::vector<std::string>{"dos", "one", "three", "tres", "two", "uno"}));
  EXPECT_EQ(v.decode(w[0].example.tgt), "uno dos");  // CRLF: the \r is dropped
  EXPECT_EQ(v.decode(w[1].example.src), "three");
}

TEST(Pairs, BadLinesNameTheLine) {
  EXPECT_NE(parse_error("a\tb\nno tab here\n").find("'f.tsv' line 2 has no tab"), std::string::npos);
  EXPECT_NE(parse_error("a\tb\tc\n").find("line 1 has 2 tabs"), std::string::npos);
  EXPECT_NE(parse_error("a\tb\n\tb\n").find("line 2 has an empty source"), std::string::npos);
  EXPECT_NE(parse_error("a\t  \n", Tokenize::Word).find("line 1 has an empty target"), std::string::npos);
  EXPECT_NE(parse_error("").find("is empty"), std::string::npos);
  EXPECT_NE(parse_error("\n  \n\r\n").find("has no usable lines"), std::string::npos);
  const std::string longer = parse_error("a\tb\n" + std::string(257, 'x') + "\ty\n");
  EXPECT_NE(longer.find("line 2: its source has 257 tokens, more than the limit of 256"), std::string::npos) << longer;
  EXPECT_NE(parse_error("a\tb\nc\t\xFF\n").find("invalid UTF-8 at byte offset 6"), std::string::npos);
  EXPECT_NE(parse_error(std::string("a\tb\0\n", 5)).find("NUL byte at byte offset 3"), std::string::npos);
  const std::string vocab =
      error_of([] { parse_pairs("abcdef\tghij\n", "'f'", Tokenize::Char, nullptr, nullptr, 10); });
  EXPECT_NE(vocab.find("10 distinct tokens; with the 4 reserved ids that is 14, more than the limit of 10"),
            std::string::npos)
      << vocab;
  const Vocabulary known({"a", "b"});
  const std::string unknown = error_of([&] { parse_pairs("ab\tba\nab\tbz\n", "'g'", Tokenize::Char, &known); });
  EXPECT_NE(unknown.find("'g' line 2: character 'z' is not in the model's vocabulary"), std::string::npos) << unknown;
}

TEST(PairsDataset, SplitDrawsAndPositions) {
  std::string text;
  for (int i = 0; i < 50; ++i) text += std::to_string(i) + "\t" + std::to_string(i * 7) + "\n";
  PairsDataset d({.format = "pairs", .path = scratch_file("n.tsv", text), .val_fraction = 0.2});
  EXPECT_EQ(d.train_size(), 40);
  EXPECT_EQ(d.val_size(), 10);
  EXPECT_EQ(d.max_source_len(), 2);
  EXPECT_EQ(d.max_target_len(), 3);
  EXPECT_FALSE(d.aligned());
  EXPECT_FALSE(d.stream());
  // Held-out and training lines are disjoint; the split is the same every time the file is read.
  const std::vector<Example> held = d.heldout(1000, 0);
  ASSERT_EQ(held.size(), 10u);
  std::set<std::vector<int64_t>> held_src;
  for (const Example& e : held) held_src.insert(e.src);
  d.seed(5);
  std::set<std::vector<int64_t>> drawn;
  for (int i = 0; i < 400; ++i) {
    const Example e = d.next();
    EXPECT_EQ(held_src.count(e.src), 0u);
    drawn.insert(e.src);
  }
  EXPECT_EQ(drawn.size(), 40u);
  PairsDataset again(d.spec());
  EXPECT_EQ(again.heldout(1000, 1), held);
  // Positions resume the stream.
  const DataPosition p = d.position();
  const Example next = d.next();
  again.set_position(p);
  EXPECT_EQ(again.next(), next);
  EXPECT_EQ(d.to_text(d.parse_source("12")), "12");
  EXPECT_NE(error_of([&] { d.parse_source("123"); }).find("more than the model's longest source of 2"),
            std::string::npos);
}

TEST(PairsDataset, AlignedWordsAndFileErrors) {
  PairsDataset w({.format = "pairs",
                  .path = scratch_file("w.tsv", "one two\tuno dos\nthree\ttres\nfour\tcuatro\n"),
                  .tokenize = "word"});
  EXPECT_TRUE(w.aligned());
  EXPECT_EQ(w.to_text(w.parse_source("two  one")), "two one");
  EXPECT_NE(error_of([] {
              open_data({.format = "pairs", .path = scratch_file("one.tsv", "a\tb\n")});
            }).find("has 1 usable line; a held-out split needs at least 2"),
            std::string::npos);
  EXPECT_NE(error_of([] { open_data({.format = "pairs", .path = scratch_file("e.tsv", "")}); }).find("is empty"),
            std::string::npos);
}

TEST(PairsDataset, AlignmentIsSavedWithTheSpec) {
  // Issue 27: a model is rebuilt from the saved spec without re-reading the file; the spec must say whether the
  // targets are aligned (the encoder-only tagger needs it), or the rebuilt dataset says false and refuses it.
  const std::string aligned_file = scratch_file("al.tsv", "one two\tuno dos\nthree\ttres\nfour\tcuatro\n");
  const std::string ragged_file = scratch_file("rg.tsv", "one two\tuno\nthree\ttres\nfour\tcuatro\n");
  for (const auto& [path, want] : {std::pair{aligned_file, true}, std::pair{ragged_file, false}}) {
    PairsDataset full({.format = "pairs", .path = path, .tokenize = "word"});
    EXPECT_EQ(full.aligned(), want) << path;
    EXPECT_EQ(full.spec().aligned, want) << path;
    const DataSpec saved = DataSpec::from_json(full.describe());
    EXPECT_EQ(saved, full.spec());
    PairsDataset tokens_only(saved, /*read_file=*/false);
    EXPECT_EQ(tokens_only.aligned(), want) << path;
    EXPECT_EQ(tokens_only.model_spec({}).aligned, want) << path;
    // Re-reading the file learns it again.
    EXPECT_EQ(PairsDataset(saved).aligned(), want) << path;
  }
  EXPECT_NE(error_of([] { DataSpec::from_json(R"({"aligned": 1})"); }).find("\"aligned\" must be true or false"),
            std::string::npos);
}
