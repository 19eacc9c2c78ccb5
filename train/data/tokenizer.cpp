// The SentencePiece subword tokenizer (train/data/tokenizer.h).

#include "train/data/tokenizer.h"

#include <sentencepiece_processor.h>
#include <sentencepiece_trainer.h>

#include <cstdio>
#include <unordered_map>

#include "autograd/error.h"
#include "train/data/text.h"
#include "train/io/serialize.h"

namespace attograd::data {

// ---------------------------------------------------------------------------------------------
// base64

namespace {

constexpr char kBase64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

int base64_value(char c) {
  if (c >= 'A' && c <= 'Z') return c - 'A';
  if (c >= 'a' && c <= 'z') return c - 'a' + 26;
  if (c >= '0' && c <= '9') return c - '0' + 52;
  if (c == '+') return 62;
  if (c == '/') return 63;
  return -1;
}

}  // namespace

std::string base64_encode(std::string_view bytes) {
  std::string out;
  out.reserve((bytes.size() + 2) / 3 * 4);
  const auto* p = reinterpret_cast<const unsigned char*>(bytes.data());
  size_t i = 0;
  for (; i + 3 <= bytes.size(); i += 3) {
    const uint32_t v = (uint32_t{p[i]} << 16) | (uint32_t{p[i + 1]} << 8) | p[i + 2];
    out += kBase64[v >> 18], out += kBase64[(v >> 12) & 63], out += kBase64[(v >> 6) & 63], out += kBase64[v & 63];
  }
  if (bytes.size() - i == 1) {
    const uint32_t v = uint32_t{p[i]} << 16;
    out += kBase64[v >> 18], out += kBase64[(v >> 12) & 63], out += "==";
  } else if (bytes.size() - i == 2) {
    const uint32_t v = (uint32_t{p[i]} << 16) | (uint32_t{p[i + 1]} << 8);
    out += kBase64[v >> 18], out += kBase64[(v >> 12) & 63], out += kBase64[(v >> 6) & 63], out += '=';
  }
  return out;
}

std::string base64_decode(std::string_view text, const std::string& origin) {
  ATTO_CHECK(text.size() % 4 == 0, "base64", origin, ": not base64 (its length ", text.size(),
             " is not a multiple of 4)");
  std::string out;
  out.reserve(text.size() / 4 * 3);
  for (size_t i = 0; i < text.size(); i += 4) {
    const bool last = i + 4 == text.size();
    const int pad = last ? (text[i + 3] == '=') + (text[i + 2] == '=') : 0;
    int v[4];
    for (int k = 0; k < 4; ++k) {
      v[k] = k >= 4 - pad ? 0 : base64_value(text[i + static_cast<size_t>(k)]);
      ATTO_CHECK(v[k] >= 0, "base64", origin, ": not base64 (character ", i + static_cast<size_t>(k), ")");
    }
    ATTO_CHECK(!(pad == 1 && text[i + 2] == '=' && text[i + 3] != '='), "base64", origin, ": not base64 (padding)");
    const uint32_t w = (uint32_t(v[0]) << 18) | (uint32_t(v[1]) << 12) | (uint32_t(v[2]) << 6) | uint32_t(v[3]);
    out += static_cast<char>(w >> 16);
    if (pad < 2) out += static_cast<char>((w >> 8) & 255);
    if (pad < 1) out += static_cast<char>(w & 255);
  }
  return out;
}

// ---------------------------------------------------------------------------------------------
// Tokenizer

namespace {

constexpr const char* kMe = "tokenizer";
constexpr size_t kMaxTrainingLine = 4096;  // SentencePiece skips sentences above max_sentence_length (4,192)
const std::string kReservedText[Vocabulary::kReserved] = {"<pad>", "<bos>", "<eos>", "<sep>"};
constexpr std::string_view kSpace = "\xE2\x96\x81";  // ▁ U+2581, SentencePiece's space

// The text's lines, without their newlines, cut at kMaxTrainingLine bytes (at a character boundary); empty lines
// are left out.
class LineIterator : public sentencepiece::SentenceIterator {
 public:
  explicit LineIterator(std::string_view text) : text_(text) { Next(); }
  bool done() const override { return done_; }
  void Next() override {
    while (pos_ < text_.size()) {
      size_t end = text_.find('\n', pos_);
      if (end == std::string_view::npos) end = text_.size();
      if (end - pos_ > kMaxTrainingLine) {
        end = pos_ + kMaxTrainingLine;
        while (end > pos_ && (static_cast<unsigned char>(text_[end]) & 0xC0) == 0x80) --end;  // a character's start
      }
      line_.assign(text_.substr(pos_, end - pos_));
      pos_ = end < text_.size() && text_[end] == '\n' ? end + 1 : end;
      if (!line_.empty()) return;
    }
    done_ = true;
  }
  const std::string& value() const override { return line_; }
  sentencepiece::util::Status status() const override { return {}; }

 private:
  std::string_view text_;
  size_t pos_ = 0;
  std::string line_;
  bool done_ = false;
};

// "0x41" of "<0x41>", or -1 when `piece` is no byte piece.
int byte_of(const std::string& piece) {
  if (piece.size() != 6 || piece.rfind("<0x", 0) != 0 || piece[5] != '>') return -1;
  unsigned v = 0;
  if (std::sscanf(piece.c_str() + 3, "%2X", &v) != 1) return -1;
  return static_cast<int>(v);
}

std::string replace_spaces(const std::string& piece) {
  std::string out;
  for (size_t i = 0; i < piece.size();) {
    if (piece.compare(i, kSpace.size(), kSpace) == 0) {
      out += ' ';
      i += kSpace.size();
    } else {
      out += piece[i++];
    }
  }
  return out;
}

// Invalid UTF-8 sequences of `s` as U+FFFD, one per byte.
std::string valid_utf8(const std::string& s) {
  std::string out;
  out.reserve(s.size());
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  for (size_t i = 0; i < s.size();) {
    const unsigned char b = p[i];
    size_t len = b < 0x80 ? 1 : (b & 0xE0) == 0xC0 ? 2 : (b & 0xF0) == 0xE0 ? 3 : (b & 0xF8) == 0xF0 ? 4 : 0;
    bool ok = len > 0 && i + len <= s.size();
    char32_t c = len == 1 ? b : len == 2 ? (b & 0x1F) : len == 3 ? (b & 0x0F) : (b & 0x07);
    for (size_t k = 1; ok && k < len; ++k) {
      ok = (p[i + k] & 0xC0) == 0x80;
      c = (c << 6) | (p[i + k] & 0x3F);
    }
    const char32_t min = len == 2 ? 0x80 : len == 3 ? 0x800 : len == 4 ? 0x10000 : 0;
    ok = ok && c >= min && c <= 0x10FFFF && !(c >= 0xD800 && c <= 0xDFFF);
    if (ok) {
      out.append(s, i, len);
      i += len;
    } else {
      out += "\xEF\xBF\xBD";
      ++i;
    }
  }
  return out;
}

}  // namespace

struct Tokenizer::Impl {
  std::string kind, proto;
  uint64_t hash = 0;
  sentencepiece::SentencePieceProcessor sp;
  std::vector<std::string> text;   // per id: the bytes it stands for (reserved ids: empty)
  std::vector<std::string> shown;  // per id: token_text
  std::vector<int64_t> bytes;      // per id: token_bytes
  std::vector<int64_t> newline;    // the ids of "\n"
};

Tokenizer Tokenizer::train(std::string_view text, const std::string& kind, int64_t pieces) {
  ATTO_CHECK(kind == "bpe" || kind == "unigram", kMe, "the tokenizer must be \"bpe\" or \"unigram\", got \"",
             kind.substr(0, 60), "\"");
  ATTO_CHECK(pieces >= 1 && pieces + Vocabulary::kReserved <= kMaxVocabulary, kMe, "--vocab-size must be in [1, ",
             kMaxVocabulary - Vocabulary::kReserved, "], got ", pieces);
  const std::unordered_map<std::string, std::string> kwargs = {
      {"model_type", kind},
      {"vocab_size", std::to_string(pieces)},
      {"byte_fallback", "true"},
      {"normalization_rule_name", "identity"},
      {"add_dummy_prefix", "false"},
      {"remove_extra_whitespaces", "false"},
      {"allow_whitespace_only_pieces", "true"},
      {"unk_id", "0"},
      {"bos_id", "-1"},
      {"eos_id", "-1"},
      {"pad_id", "-1"},
      {"minloglevel", "3"},
  };
  LineIterator lines(text);
  std::string proto;
  const sentencepiece::util::Status st = sentencepiece::SentencePieceTrainer::Train(kwargs, &lines, &proto);
  if (!st.ok()) {
    // Its message without the source position and the failed condition ("./src/x.cc(660) [a == b] Message").
    std::string why = st.message();
    const size_t cut = why.find("] ");
    if (why.rfind("./", 0) == 0 && cut != std::string::npos) why = why.substr(cut + 2);
    throw Error(kMe, str_cat("SentencePiece cannot train a ", kind, " tokenizer of --vocab-size ", pieces,
                             " on this text: ", why));
  }
  return load(std::move(proto), kind, "the trained tokenizer");
}

Tokenizer Tokenizer::load(std::string proto, const std::string& kind, const std::string& origin) {
  ATTO_CHECK(kind == "bpe" || kind == "unigram", kMe, origin, ": the tokenizer must be \"bpe\" or \"unigram\", got \"",
             kind.substr(0, 60), "\"");
  auto impl = std::make_shared<Impl>();
  impl->kind = kind;
  impl->hash = io::detail::xxh64(proto.data(), proto.size());
  const sentencepiece::util::Status st = impl->sp.LoadFromSerializedProto(proto);
  ATTO_CHECK(st.ok(), kMe, origin, ": not a SentencePiece model (", st.message(), ")");
  impl->proto = std::move(proto);
  const int n = impl->sp.GetPieceSize();
  ATTO_CHECK(n >= 1 && n + Vocabulary::kReserved <= kMaxVocabulary && impl->sp.IsUnknown(0) &&
                 impl->sp.PieceToId("<0x0A>") > 0 && impl->sp.IsByte(impl->sp.PieceToId("<0x0A>")),
             kMe, origin, ": a SentencePiece model of ", n,
             " pieces not trained as attograd trains one (unk id 0, byte fallback)");
  const auto total = static_cast<size_t>(n + Vocabulary::kReserved);
  impl->text.resize(total), impl->shown.resize(total), impl->bytes.assign(total, 0);
  for (int64_t r = 0; r < Vocabulary::kReserved; ++r) impl->shown[static_cast<size_t>(r)] = kReservedText[r];
  for (int i = 0; i < n; ++i) {
    const auto id = static_cast<size_t>(i + Vocabulary::kReserved);
    const std::string& piece = impl->sp.IdToPiece(i);
    if (impl->sp.IsByte(i)) {
      const int b = byte_of(piece);
      ATTO_CHECK(b >= 0, kMe, origin, ": byte piece ", i, " is \"", piece.substr(0, 20), "\"");
      impl->text[id] = std::string(1, static_cast<char>(b));
      impl->shown[id] = b < 0x80 ? impl->text[id] : piece;
      impl->bytes[id] = 1;
    } else if (impl->sp.IsUnknown(i) || impl->sp.IsControl(i)) {
      impl->text[id] = i == 0 ? " \xE2\x81\x87 " : "";  // SentencePiece decodes <unk> as " ⁇ "
      impl->shown[id] = piece;
    } else {
      impl->text[id] = replace_spaces(piece);
      impl->shown[id] = impl->text[id];
      impl->bytes[id] = static_cast<int64_t>(impl->text[id].size());
    }
  }
  impl->newline = {Vocabulary::kReserved + impl->sp.PieceToId("<0x0A>")};
  return Tokenizer(std::move(impl));
}

const std::string& Tokenizer::kind() const { return impl_->kind; }
const std::string& Tokenizer::proto() const { return impl_->proto; }
uint64_t Tokenizer::hash() const { return impl_->hash; }
int64_t Tokenizer::pieces() const { return impl_->sp.GetPieceSize(); }
int64_t Tokenizer::size() const { return pieces() + Vocabulary::kReserved; }

std::vector<int64_t> Tokenizer::encode(std::string_view text, const std::string& origin) const {
  decode_utf8(text, origin);  // valid UTF-8, no NUL byte (Error naming the offset otherwise)
  std::vector<int64_t> out;
  std::vector<int> ids;
  for (size_t pos = 0; pos <= text.size();) {
    size_t end = text.find('\n', pos);
    if (end == std::string_view::npos) end = text.size();
    if (end > pos) {
      const sentencepiece::util::Status st = impl_->sp.Encode(text.substr(pos, end - pos), &ids);
      ATTO_CHECK(st.ok(), kMe, origin, ": SentencePiece cannot encode it (", st.message(), ")");
      for (int id : ids) out.push_back(id + Vocabulary::kReserved);
    }
    if (end == text.size()) break;
    out.insert(out.end(), impl_->newline.begin(), impl_->newline.end());
    pos = end + 1;
  }
  return out;
}

std::string Tokenizer::decode(const std::vector<int64_t>& ids) const {
  std::string s;
  for (int64_t id : ids) {
    ATTO_CHECK(id >= 0 && id < size(), kMe, "token id ", id, " outside [0, ", size(), ")");
    s += impl_->text[static_cast<size_t>(id)];
  }
  return valid_utf8(s);
}

std::string Tokenizer::token_text(int64_t id) const {
  ATTO_CHECK(id >= 0 && id < size(), kMe, "token id ", id, " outside [0, ", size(), ")");
  return impl_->shown[static_cast<size_t>(id)];
}

int64_t Tokenizer::token_bytes(int64_t id) const {
  ATTO_CHECK(id >= 0 && id < size(), kMe, "token id ", id, " outside [0, ", size(), ")");
  return impl_->bytes[static_cast<size_t>(id)];
}

}  // namespace attograd::data
