#pragma once
// Corpora larger than memory (attograd::data): `attograd prepare` (nanoGPT's prepare.py) tokenises any number of text
// files once into a directory of token files, and `attograd train --data DIR` trains from them, memory-mapped.
//
// The directory holds
//   train.bin, val.bin  the tokens of the training part and of the held-out part (the last val_fraction of the
//                       concatenated text's tokens, as TextDataset splits a file), each a token file:
//                         bytes 0-7    magic "ATTOTOK\0"
//                         bytes 8-11   version (1), little-endian uint32
//                         bytes 12-15  token width in bytes: 2 (uint16) or 4 (uint32)
//                         bytes 16-23  token count, uint64
//                         bytes 24-31  the tokenizer's hash (XXH64 of its description, below), uint64
//                         then count tokens of `width` bytes, little-endian
//   meta.json           the tokenizer (char: its vocabulary; bpe/unigram: SentencePiece's serialized model, base64),
//                       its hash, the source files and what was counted.
//
// TokenFileDataset maps both files read-only, checks every header, size and token once when it opens them (streaming,
// so a file of any size is checked without being held), and draws random windows of the training tokens exactly as
// TextDataset draws them from a file's characters: the same spec and seed give the same windows, so a prepared file
// trains to the same weights as `train --text` on it. Pages a window touched are released after it is copied
// (madvise MADV_DONTNEED), so the resident memory stays a few pages whatever the corpus size.

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <optional>

#include "train/data/text.h"
#include "train/data/tokenizer.h"

namespace attograd::data {

/// The first 8 bytes of a token file.
inline constexpr char kTokenFileMagic[8] = {'A', 'T', 'T', 'O', 'T', 'O', 'K', '\0'};
/// The token file format's version.
inline constexpr uint32_t kTokenFileVersion = 1;
/// Bytes before the first token.
inline constexpr uint64_t kTokenFileHeaderBytes = 32;

/// A token file's header.
struct TokenFileHeader {
  uint32_t version = kTokenFileVersion;  ///< kTokenFileVersion
  uint32_t width = 2;                    ///< bytes per token: 2 or 4
  uint64_t count = 0;                    ///< tokens in the file
  uint64_t tokenizer_hash = 0;           ///< the tokenizer's hash (meta.json's "tokenizer_hash")
};

/// A token file mapped read-only. The constructor checks the magic, version, width and size against the header, the
/// tokenizer hash against `tokenizer_hash`, and every token against `vocab_size` (Error naming the file and what is
/// wrong: one line, for the CLI's exit 2).
class TokenFile {
 public:
  /// Opens and checks `path` (see the class comment).
  TokenFile(const std::string& path, uint64_t tokenizer_hash, int64_t vocab_size);
  ~TokenFile();
  TokenFile(const TokenFile&) = delete;
  TokenFile& operator=(const TokenFile&) = delete;
  /// Tokens in the file.
  int64_t size() const { return static_cast<int64_t>(header_.count); }
  /// The header.
  const TokenFileHeader& header() const { return header_; }
  /// XXH64 of the whole file, computed when it was opened.
  uint64_t digest() const { return digest_; }
  /// Tokens [start, start + n) into out[0 .. n), then releases the pages they were read from.
  void read(int64_t start, int64_t n, int64_t* out) const;
  /// The file's path.
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  TokenFileHeader header_;
  const unsigned char* map_ = nullptr;  // the whole file
  uint64_t bytes_ = 0;
  uint64_t digest_ = 0;
  int fd_ = -1;
};

/// Writes a token file atomically (a temporary file renamed over `path` by commit(); without commit() nothing of it
/// is left), streaming: tokens go out as they come.
class TokenFileWriter {
 public:
  /// Starts `path` for tokens of `width` bytes (2 or 4) and a tokenizer of hash `tokenizer_hash`.
  TokenFileWriter(const std::string& path, uint32_t width, uint64_t tokenizer_hash);
  ~TokenFileWriter();
  TokenFileWriter(const TokenFileWriter&) = delete;
  TokenFileWriter& operator=(const TokenFileWriter&) = delete;
  /// Appends tokens (Error for one that does not fit the width).
  void write(const int64_t* tokens, int64_t n);
  /// Tokens written so far.
  int64_t count() const { return count_; }
  /// Writes the header, fsyncs and renames the file into place.
  void commit();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  uint32_t width_;
  uint64_t tokenizer_hash_;
  int64_t count_ = 0;
};

/// Writes a token file of `tokens` in one go (tests, small corpora).
void write_token_file(const std::string& path, const std::vector<int64_t>& tokens, uint64_t tokenizer_hash,
                      uint32_t width = 2);
/// Reads a token file's header without checking the rest (Error naming the file for a bad magic, version or width).
TokenFileHeader read_token_file_header(const std::string& path);

/// What `attograd prepare` reads and writes.
struct PrepareOptions {
  std::vector<std::string> inputs = {};  ///< UTF-8 text files, concatenated in this order (CRLF read as LF)
  std::string out = {};                  ///< the directory to write (created; its token files are replaced)
  std::string tokenizer = "char";        ///< "char" (a token per character), "bpe" or "unigram" (SentencePiece,
                                         ///< trained on the training part's first kMaxDataFileBytes)
  int64_t vocab_size = 0;                ///< bpe/unigram: SentencePiece's pieces (0 with char)
  double val_fraction = 0.1;             ///< the held-out share of the tokens, in (0, 1)
  int64_t max_vocab = kMaxVocabulary;    ///< largest vocabulary (reserved ids included)
  uint64_t chunk_bytes = uint64_t{4} << 20;  ///< bytes read at a time (memory does not grow with the corpus)
};

/// What prepare() wrote.
struct PrepareResult {
  std::string out;                    ///< the directory
  uint64_t bytes = 0;                 ///< text bytes read (all inputs)
  int64_t train_tokens = 0;           ///< tokens in train.bin
  int64_t val_tokens = 0;             ///< tokens in val.bin
  int64_t vocab_size = 0;             ///< the tokenizer's vocabulary, reserved ids included
  uint64_t tokenizer_hash = 0;        ///< meta.json's tokenizer_hash
  std::vector<std::string> vocabulary = {};  ///< the tokens (without the reserved ids)
};

/// Tokenises opts.inputs into opts.out (train.bin, val.bin, meta.json; see the file comment), reading each file in
/// chunks: memory holds a chunk and the vocabulary, never the corpus. Error naming the file (and byte offset) for a
/// missing, non-regular or non-UTF-8 input, and for a corpus too small to split.
PrepareResult prepare(const PrepareOptions& opts);

/// The hash of a character vocabulary as a tokenizer (meta.json's tokenizer_hash; every token file's header).
uint64_t char_tokenizer_hash(const Vocabulary& vocabulary);

/// A prepared directory as training data (format "tokens"; see the file comment and TextDataset, whose windows,
/// held-out windows and stream it reproduces).
class TokenFileDataset : public Dataset {
 public:
  /// Opens spec.path, a directory written by prepare(); spec.format must be "tokens". Without read_file, only the
  /// token space (spec.vocabulary must be given).
  explicit TokenFileDataset(const DataSpec& spec, bool read_file = true);
  /// The directory's name.
  std::string name() const override;
  /// Restarts the stream of windows.
  void seed(uint64_t seed) override;
  /// A random window of train.bin: src (context), tgt (1).
  Example next() override;
  /// The first n held-out windows of val.bin (windows of context + 1 starting every context tokens).
  std::vector<Example> heldout(int64_t n, uint64_t seed) const override;
  /// ceil((val tokens - 1) / context).
  int64_t heldout_size() const override;
  /// The stream's position.
  DataPosition position() const override { return {gen_.get_state(), offset_}; }
  /// Restores position().
  void set_position(const DataPosition& p) override;
  /// The vocabulary's size (the tokenizer's with a subword tokenizer).
  int64_t vocab_size() const override { return tokenizer_ ? tokenizer_->size() : vocab_.size(); }
  /// The context.
  int64_t max_source_len() const override { return spec_.context; }
  /// 1.
  int64_t max_target_len() const override { return 1; }
  /// true: language modelling of a token stream.
  bool stream() const override { return true; }
  /// The token's text (a subword tokenizer's Tokenizer::token_text).
  std::string token_text(int64_t token) const override;
  /// The tokens' text (a subword tokenizer's exact decode).
  std::string to_text(const std::vector<int64_t>& tokens) const override;
  /// The UTF-8 bytes a token stands for (0 for the reserved ids).
  int64_t token_bytes(int64_t token) const override;
  /// A prompt as token ids (Error naming a character outside a char vocabulary).
  std::vector<int64_t> parse_source(const std::string& text) const override;
  /// The spec with the vocabulary, lengths and hash filled in.
  std::string describe() const override { return spec_.to_json(); }
  /// The spec with the vocabulary, lengths and hash filled in.
  const DataSpec& spec() const { return spec_; }
  /// Tokens in train.bin.
  int64_t train_size() const { return train_ ? train_->size() : 0; }
  /// Tokens in val.bin.
  int64_t val_size() const { return val_ ? val_->size() : 0; }

 private:
  DataSpec spec_;
  Vocabulary vocab_;
  std::optional<Tokenizer> tokenizer_;
  std::unique_ptr<TokenFile> train_, val_;
  Generator gen_;
  int64_t offset_ = 0;
};

}  // namespace attograd::data
