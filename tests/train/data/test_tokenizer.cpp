// The SentencePiece subword tokenizer (train/data/tokenizer.h) and a text file tokenised by it (TextDataset with
// DataSpec::tokenizer bpe / unigram): base64, exact round trips of any UTF-8 (English, Chinese, emoji, runs of
// spaces, newlines, tabs), the ids after the reserved four, byte lengths, the tokenizer trained on the training part
// only, the model saved in the spec and checked by its hash, and every error message.

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <functional>

#include "scratch.h"
#include "testing.h"
#include "train/data/text.h"
#include "train/data/tokenizer.h"
#include "train/io/serialize.h"

using namespace attograd;
using namespace attograd::data;
using namespace attograd::testing;
using namespace std::string_literals;

namespace {

namespace fs = std::filesystem;

std::string scratch_file(const std::string& name, const std::string& bytes) {
  return test_scratch::file("tokenizer", name, bytes);
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

std::string poems() {
  std::ifstream in(data_path("train/poems.txt"), std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// A bpe tokenizer of 700 pieces trained on the committed poems (English and Chinese: 375 pieces are characters,
// bytes and <unk>), once.
const Tokenizer& poems_bpe() {
  static const Tokenizer t = Tokenizer::train(poems(), "bpe", 700);
  return t;
}

const std::vector<std::string>& round_trip_texts() {
  static const std::vector<std::string> texts = {
      "Shall I compare thee to a summer's day?",
      "\xE5\xBA\x8A\xE5\x89\x8D\xE6\x98\x8E\xE6\x9C\x88\xE5\x85\x89",  // 床前明月光 (in the poems)
      "\xE9\xBE\x98\xE9\x9D\x90 unseen: \xF0\x9F\x98\x80\xF0\x9F\x8E\x89!",  // rare CJK and emoji: byte fallback
      "   leading spaces, a run of     five, trailing  ",
      "\n\nnewlines\nbetween\n\n\nlines\n",
      "\ttabs\tand\t\tmore\ttabs\t",
      " \n\t \r mixed \xC3\xA9\xC3\xA0 ~`|{}\x7F",
      "a",
      " ",
      "\n",
  };
  return texts;
}

}  // namespace

TEST(Base64, KnownValuesAndRoundTrips) {
  EXPECT_EQ(base64_encode(""), "");
  EXPECT_EQ(base64_encode("M"), "TQ==");
  EXPECT_EQ(base64_encode("Ma"), "TWE=");
  EXPECT_EQ(base64_encode("Man"), "TWFu");
  EXPECT_EQ(base64_encode("\xFF\xFE\x00\x01"s), "//4AAQ==");
  std::string bytes;
  for (int i = 0; i < 300; ++i) {
    EXPECT_EQ(base64_decode(base64_encode(bytes), "t"), bytes) << i;
    bytes += static_cast<char>((i * 37) & 255);
  }
  EXPECT_EQ(error_of([] { base64_decode("TWF", "field x"); }),
            "base64: field x: not base64 (its length 3 is not a multiple of 4)");
  EXPECT_EQ(error_of([] { base64_decode("TW*u", "field x"); }), "base64: field x: not base64 (character 2)");
  EXPECT_EQ(error_of([] { base64_decode("TW=u", "field x"); }), "base64: field x: not base64 (character 2)");
}

TEST(Tokenizer, BpeRoundTripsAnyUtf8Exactly) {
  const Tokenizer& t = poems_bpe();
  EXPECT_EQ(t.kind(), "bpe");
  EXPECT_EQ(t.pieces(), 700);
  EXPECT_EQ(t.size(), 704);
  for (const std::string& text : round_trip_texts()) {
    const std::vector<int64_t> ids = t.encode(text, "t");
    int64_t bytes = 0;
    for (int64_t id : ids) {
      EXPECT_GE(id, Vocabulary::kReserved) << text;
      EXPECT_LT(id, t.size()) << text;
      bytes += t.token_bytes(id);
    }
    EXPECT_EQ(t.decode(ids), text);
    EXPECT_EQ(bytes, static_cast<int64_t>(text.size())) << text;  // every byte is in exactly one token
  }
  // Subwords: an English line takes fewer tokens than characters.
  const std::string line = "And summer's lease hath all too short a date;";
  EXPECT_LT(t.encode(line, "t").size(), line.size() / 2);
  // A newline is the byte piece <0x0A>, shown as itself; a non-ASCII byte piece as <0xNN>.
  const std::vector<int64_t> nl = t.encode("\n", "t");
  ASSERT_EQ(nl.size(), 1u);
  EXPECT_EQ(t.token_text(nl[0]), "\n");
  EXPECT_EQ(t.token_bytes(nl[0]), 1);
  const std::vector<int64_t> emoji = t.encode("\xF0\x9F\x98\x80", "t");  // U+1F600 is not in the poems: 4 bytes
  ASSERT_EQ(emoji.size(), 4u);
  EXPECT_EQ(t.token_text(emoji[0]), "<0xF0>");
  EXPECT_EQ(t.decode({emoji[0], emoji[1]}), "\xEF\xBF\xBD\xEF\xBF\xBD");  // half a character: U+FFFD per byte
  // ▁ is shown (and decoded) as a space; reserved ids are left out of the text and shown by name.
  const std::vector<int64_t> ids = t.encode("thee to", "t");
  std::string shown;
  for (int64_t id : ids) shown += t.token_text(id);
  EXPECT_EQ(shown, "thee to");
  EXPECT_EQ(t.token_text(0), "<pad>");
  EXPECT_EQ(t.token_text(3), "<sep>");
  EXPECT_EQ(t.token_bytes(2), 0);
  std::vector<int64_t> with_reserved = {1};
  with_reserved.insert(with_reserved.end(), ids.begin(), ids.end());
  with_reserved.push_back(2);
  EXPECT_EQ(t.decode(with_reserved), "thee to");
  EXPECT_EQ(error_of([&] { t.decode({704}); }), "tokenizer: token id 704 outside [0, 704)");
  EXPECT_EQ(error_of([&] { t.token_text(-1); }), "tokenizer: token id -1 outside [0, 704)");
  EXPECT_NE(error_of([&] { t.encode("bad \xFF", "the prompt"); }).find("the prompt: invalid UTF-8 at byte offset 4"),
            std::string::npos);
}

TEST(Tokenizer, UnigramRoundTripsAndTrainingIsRepeatable) {
  const Tokenizer u = Tokenizer::train(poems(), "unigram", 400);
  EXPECT_EQ(u.kind(), "unigram");
  EXPECT_EQ(u.size(), 404);
  for (const std::string& text : round_trip_texts()) EXPECT_EQ(u.decode(u.encode(text, "t")), text);
  // The same text and settings train the same model.
  EXPECT_EQ(Tokenizer::train(poems(), "unigram", 400).proto(), u.proto());
  EXPECT_EQ(Tokenizer::train(poems(), "bpe", 700).proto(), poems_bpe().proto());
}

TEST(Tokenizer, LinesLongerThanSentencePieceTakesAreCutAtCharacterStarts) {
  // One line of 24,000 bytes of three-byte characters: cut into pieces of at most 4,096 bytes (4,096 is not a
  // multiple of 3: the cut moves back to a character's start), all of them learned from.
  std::string line;
  for (int i = 0; i < 4000; ++i) line += "\xE4\xB8\xAD\xE6\x96\x87";  // 中文
  const Tokenizer t = Tokenizer::train(line + " ab\n" + line, "bpe", 265);
  const std::vector<int64_t> ids = t.encode(line, "t");
  EXPECT_EQ(t.decode(ids), line);
  EXPECT_LT(ids.size(), 4000u);  // merged: 中文 and longer runs are pieces
}

TEST(Tokenizer, LoadsItsSerializedModel) {
  const Tokenizer& t = poems_bpe();
  const Tokenizer again = Tokenizer::load(t.proto(), "bpe", "x");
  EXPECT_EQ(again.hash(), t.hash());
  EXPECT_EQ(t.hash(), io::detail::xxh64(t.proto().data(), t.proto().size()));
  const std::string text = poems().substr(0, 500);
  EXPECT_EQ(again.encode(text, "t"), t.encode(text, "t"));
  EXPECT_EQ(error_of([] { Tokenizer::load("not a model", "bpe", "field m"); }).rfind("tokenizer: field m: not a "
                                                                                       "SentencePiece model (",
                                                                                       0),
            0u);
  EXPECT_EQ(error_of([&] { Tokenizer::load(t.proto(), "wordpiece", "field m"); }),
            "tokenizer: field m: the tokenizer must be \"bpe\" or \"unigram\", got \"wordpiece\"");
}

TEST(Tokenizer, SizesSentencePieceRefusesNameVocabSize) {
  EXPECT_EQ(error_of([] { Tokenizer::train(poems(), "bpe", 300); }),
            "tokenizer: SentencePiece cannot train a bpe tokenizer of --vocab-size 300 on this text: Vocabulary size "
            "is smaller than required_chars. 300 vs 375. Increase vocab_size or decrease character_coverage with "
            "--character_coverage option.");
  EXPECT_EQ(error_of([] { Tokenizer::train(poems(), "unigram", 5000); }),
            "tokenizer: SentencePiece cannot train a unigram tokenizer of --vocab-size 5000 on this text: Vocabulary "
            "size too high (5000). Please set it to a value <= 568.");
  EXPECT_EQ(error_of([] { Tokenizer::train(poems(), "bpe", 0); }),
            "tokenizer: --vocab-size must be in [1, 65532], got 0");
  EXPECT_EQ(error_of([] { Tokenizer::train(poems(), "char", 10); }),
            "tokenizer: the tokenizer must be \"bpe\" or \"unigram\", got \"char\"");
}

TEST(TextDatasetSubword, TrainedOnTheTrainingPartOnly) {
  // The held-out tenth repeats a word the training part never has: a tokenizer of the whole text would make it a
  // piece; this one has no piece holding it.
  std::string train_part = poems();
  std::string val_part;
  while (val_part.size() * 9 < train_part.size()) val_part += "zyxwzyxw quorbly zyxwzyxw quorbly\n";
  const std::string text = train_part + val_part;
  const std::string path = scratch_file("split.txt", text);
  auto has_piece = [](const std::function<std::string(int64_t)>& shown, int64_t n, const std::string& part) {
    for (int64_t id = 0; id < n; ++id)
      if (shown(id).find(part) != std::string::npos) return true;
    return false;
  };
  const Tokenizer whole = Tokenizer::train(text, "bpe", 420);
  EXPECT_TRUE(has_piece([&](int64_t id) { return whole.token_text(id); }, whole.size(), "zyxw"));
  TextDataset d(DataSpec{.path = path, .context = 8, .tokenizer = "bpe", .vocab_size = 420});
  EXPECT_EQ(d.vocab_size(), 424);
  EXPECT_FALSE(has_piece([&](int64_t id) { return d.token_text(id); }, d.vocab_size(), "zyxw"));
  EXPECT_FALSE(has_piece([&](int64_t id) { return d.token_text(id); }, d.vocab_size(), "quor"));
  // The split is at byte (1 - val_fraction) of the text, moved back to a character's start: the held-out windows
  // decode to the text's last part.
  const auto split = text.size() - static_cast<size_t>(static_cast<double>(text.size()) * 0.1);
  std::vector<int64_t> held;
  for (const Example& e : d.heldout(1000, 0)) {
    if (held.empty()) held = e.src;
    else held.insert(held.end(), e.src.begin() + 1, e.src.end());
    held.push_back(e.tgt[0]);
  }
  EXPECT_EQ(d.to_text(held), text.substr(split));
  EXPECT_EQ(d.val_size(), static_cast<int64_t>(held.size()));
  // Every held-out token's bytes, summed, are the held-out text's bytes.
  int64_t bytes = 0;
  for (int64_t t : held) bytes += d.token_bytes(t);
  EXPECT_EQ(bytes, static_cast<int64_t>(text.size() - split));
}

TEST(TextDatasetSubword, SplitMovesToACharacterStart) {
  // "a" then 33 three-byte characters, 100 bytes: byte 90 is inside one, the split goes back to 88, its start.
  std::string text = "a";
  for (int i = 0; i < 33; ++i) text += "\xE4\xB8\xAD";  // 中
  const std::string path = scratch_file("cjk.txt", text);
  TextDataset d(DataSpec{.path = path, .context = 2, .tokenizer = "bpe", .vocab_size = 260});
  std::vector<int64_t> all;
  for (const Example& e : d.heldout(100, 0)) {
    if (all.empty()) all = e.src;
    else all.insert(all.end(), e.src.begin() + 1, e.src.end());
    all.push_back(e.tgt[0]);
  }
  EXPECT_EQ(d.to_text(all), text.substr(88));
}

TEST(TextDatasetSubword, TheModelIsSavedInTheSpecAndCheckedByItsHash) {
  const std::string path = scratch_file("poems.txt", poems());
  TextDataset d(DataSpec{.path = path, .context = 8, .tokenizer = "bpe", .vocab_size = 400});
  const DataSpec& spec = d.spec();
  EXPECT_EQ(spec.tokenizer, "bpe");
  EXPECT_EQ(spec.vocab_size, 400);
  EXPECT_TRUE(spec.vocabulary.empty());
  const std::string proto = base64_decode(spec.tokenizer_model, "t");
  EXPECT_EQ(spec.tokenizer_hash, io::detail::xxh64(proto.data(), proto.size()));
  // The model is the one trained on the training part: the first 2,710 - 271 bytes, back to a character's start.
  const std::string text = poems();
  size_t split = text.size() - static_cast<size_t>(static_cast<double>(text.size()) * 0.1);
  while ((static_cast<unsigned char>(text[split]) & 0xC0) == 0x80) --split;
  EXPECT_EQ(proto, Tokenizer::train(text.substr(0, split), "bpe", 400).proto());
  const std::string json = spec.to_json();
  EXPECT_NE(json.find("\"tokenizer\":\"bpe\",\"vocab_size\":400,\"tokenizer_model\":\""), std::string::npos);
  const DataSpec back = DataSpec::from_json(json);
  EXPECT_EQ(back, spec);
  // Without the file: the token space from the saved model alone.
  const auto bare = open_data(back, false);
  EXPECT_EQ(bare->vocab_size(), 404);
  const std::string prompt = "Shall I \xE5\xBA\x8A\xF0\x9F\x98\x80\n\t  x";
  EXPECT_EQ(bare->parse_source(prompt), d.parse_source(prompt));
  EXPECT_EQ(bare->to_text(bare->parse_source(prompt)), prompt);
  for (int64_t id = 0; id < 404; ++id) EXPECT_EQ(bare->token_text(id), d.token_text(id));
  // Re-reading the file with the saved model tokenises as before.
  TextDataset again(back);
  EXPECT_EQ(again.heldout(3, 0)[2].src, d.heldout(3, 0)[2].src);
  // A damaged model or hash is refused, naming the field.
  DataSpec bad = back;
  bad.tokenizer_hash ^= 1;
  EXPECT_EQ(error_of([&] { open_data(bad, false); }).rfind("tokenizer: DataSpec field \"tokenizer_model\" does not "
                                                            "match field \"tokenizer_hash\" (",
                                                            0),
            0u);
  bad = back;
  bad.tokenizer_model = "AAAA" + bad.tokenizer_model.substr(4);
  EXPECT_NE(error_of([&] { open_data(bad, false); }).find("does not match field \"tokenizer_hash\""),
            std::string::npos);
  bad = back;
  bad.tokenizer_model = "A";
  EXPECT_EQ(error_of([&] { open_data(bad, false); }),
            "base64: DataSpec field \"tokenizer_model\": not base64 (its length 1 is not a multiple of 4)");
  bad = back;
  bad.tokenizer_model = base64_encode("not a model");
  bad.tokenizer_hash = io::detail::xxh64("not a model", 11);
  EXPECT_EQ(error_of([&] { open_data(bad, false); }).rfind("tokenizer: DataSpec field \"tokenizer_model\": not a "
                                                            "SentencePiece model (",
                                                            0),
            0u);
  bad = back;
  bad.vocab_size = 401;
  EXPECT_EQ(error_of([&] { open_data(bad, false); }),
            "tokenizer: DataSpec field \"tokenizer_model\" has 400 pieces, field \"vocab_size\" says 401");
  bad = back;
  bad.tokenizer_model.clear();
  bad.tokenizer_hash = 0;
  EXPECT_EQ(error_of([&] { open_data(bad, false); }),
            "TextDataset: a dataset without its file needs the saved tokenizer (tokenizer_model)");
}

TEST(TextDatasetSubword, SpecValidation) {
  DataSpec s{.path = "x"};
  EXPECT_EQ(s.to_json().find("tokenizer"), std::string::npos);  // char: the fields are not written
  EXPECT_EQ(s.to_json().find("vocab_size"), std::string::npos);
  s.tokenizer = "wordpiece";
  EXPECT_EQ(error_of([&] { s.validate(); }),
            "DataSpec: tokenizer must be \"char\", \"bpe\" or \"unigram\", got \"wordpiece\"");
  s.tokenizer = "char";
  s.vocab_size = 100;
  EXPECT_EQ(error_of([&] { s.validate(); }),
            "DataSpec: vocab_size, tokenizer_model and tokenizer_hash are for a subword tokenizer (bpe, unigram), "
            "not char");
  s.tokenizer = "bpe";
  s.vocab_size = 0;
  EXPECT_EQ(error_of([&] { s.validate(); }),
            "DataSpec: vocab_size must be in [1, 65532] (max_vocab 65536 less the 4 reserved ids), got 0");
  s.vocab_size = 100;
  s.vocabulary = {"a"};
  EXPECT_EQ(error_of([&] { s.validate(); }),
            "DataSpec: a bpe tokenizer keeps its pieces in tokenizer_model: vocabulary must be empty");
  DataSpec p{.format = "pairs", .path = "x", .tokenizer = "bpe", .vocab_size = 100};
  EXPECT_EQ(error_of([&] { p.validate(); }),
            "DataSpec: a pairs file keeps its char or word tokens: tokenizer must be \"char\", got \"bpe\"");
  EXPECT_EQ(error_of([] { DataSpec::from_json(R"({"tokenizer_hash": -1})"); }),
            "DataSpec: field \"tokenizer_hash\" must be a non-negative integer");
}

TEST(TextDatasetSubword, CharTokenBytesAreUtf8Lengths) {
  const std::string path = scratch_file("mixed.txt", std::string(40, 'a') + "\xC3\xA9\xE4\xB8\xAD\xF0\x9F\x98\x80");
  TextDataset d(DataSpec{.path = path, .context = 4});
  EXPECT_EQ(d.token_bytes(0), 0);
  EXPECT_EQ(d.token_bytes(*d.vocabulary().find("a")), 1);
  EXPECT_EQ(d.token_bytes(*d.vocabulary().find("\xC3\xA9")), 2);
  EXPECT_EQ(d.token_bytes(*d.vocabulary().find("\xE4\xB8\xAD")), 3);
  EXPECT_EQ(d.token_bytes(*d.vocabulary().find("\xF0\x9F\x98\x80")), 4);
}
