#pragma once
// A trained subword tokenizer for text files (attograd::data): SentencePiece (BPE or unigram), trained in memory on
// the training part of a text and stored inside the DataSpec (so inside the weights file and the checkpoint).
//
// SentencePiece is trained with byte fallback (a character it has no piece for is encoded as its UTF-8 bytes, one
// piece <0xNN> each: any UTF-8 prompt encodes), the identity normalization, no dummy prefix and no removal of extra
// whitespace, so that decode(encode(text)) == text exactly for any valid UTF-8. It learns from the text's lines
// (a line longer than 4,096 bytes is cut into pieces of at most that); a newline is never inside a piece and is
// encoded as the byte piece <0x0A>. Its logging is quiet.
//
// Ids: the four reserved ids (0 <pad>, 1 <bos>, 2 <eos>, 3 <sep>: Vocabulary::kReserved) then SentencePiece's ids
// (its id 0 is <unk>, which byte fallback never produces; it has no bos, eos or pad), so a tokenizer of
// `pieces` SentencePiece pieces (spm_train's --vocab_size) has pieces + 4 ids.

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace attograd::data {

/// The SentencePiece vocabulary size (--vocab-size) when a subword tokenizer is asked for without one.
inline constexpr int64_t kDefaultSubwordVocab = 1024;

/// Standard base64 (RFC 4648, with padding).
std::string base64_encode(std::string_view bytes);
/// Parses base64_encode's output. Error naming `origin` on anything else.
std::string base64_decode(std::string_view text, const std::string& origin);

/// A SentencePiece subword tokenizer (see the file comment). Copies share the loaded model.
class Tokenizer {
 public:
  /// Trains a "bpe" or "unigram" tokenizer of `pieces` SentencePiece pieces on `text` (valid UTF-8). Error naming
  /// the kind, and --vocab-size when SentencePiece refuses the size for this text.
  static Tokenizer train(std::string_view text, const std::string& kind, int64_t pieces);
  /// Loads a serialized SentencePiece model (a ModelProto) of a "bpe" or "unigram" tokenizer. Error naming `origin`
  /// when it does not parse or was not trained as train() trains (byte fallback, unk id 0).
  static Tokenizer load(std::string proto, const std::string& kind, const std::string& origin);
  /// "bpe" or "unigram".
  const std::string& kind() const;
  /// The serialized SentencePiece model.
  const std::string& proto() const;
  /// XXH64 of proto().
  uint64_t hash() const;
  /// SentencePiece's piece count (the reserved ids not included).
  int64_t pieces() const;
  /// Ids in all: pieces() + Vocabulary::kReserved.
  int64_t size() const;
  /// Text (valid UTF-8, Error naming `origin` otherwise) as ids.
  std::vector<int64_t> encode(std::string_view text, const std::string& origin) const;
  /// Ids as text: pieces concatenated (▁ as a space, byte pieces as their bytes); reserved ids are left out; a
  /// byte sequence that is not valid UTF-8 becomes U+FFFD per byte, as SentencePiece decodes. Error outside
  /// [0, size()).
  std::string decode(const std::vector<int64_t>& ids) const;
  /// One id as text: a reserved id's name, a piece with ▁ as a space, a byte piece as its byte when ASCII, else
  /// "<0xNN>". Error outside [0, size()).
  std::string token_text(int64_t id) const;
  /// The UTF-8 bytes an id stands for in the text (a byte piece 1; 0 for reserved ids and <unk>).
  int64_t token_bytes(int64_t id) const;

 private:
  struct Impl;
  explicit Tokenizer(std::shared_ptr<const Impl> impl) : impl_(std::move(impl)) {}
  std::shared_ptr<const Impl> impl_;
};

}  // namespace attograd::data
