#pragma once
// Training on one's own files (attograd::data): a UTF-8 text file modelled character by character (TextDataset),
// and a file of `source<TAB>target` lines (PairsDataset, train/data/pairs.h). Both share:
//  - decode_utf8: strict UTF-8 (no overlong forms, surrogates or code points above U+10FFFF, no NUL byte: a file
//    with one is binary); errors name the byte offset.
//  - Vocabulary: the tokens of a file (Unicode code points, or whitespace-separated words), sorted, after four
//    reserved ids (0 <pad>, 1 <bos>, 2 <eos>, 3 <sep>: the built-in tasks' SpecialTokens), saved as JSON.
//  - DataSpec: the data settings (file, format, tokenization, context, held-out fraction) plus what was learned
//    from the file (its vocabulary, the longest source and target, a hash of its bytes). A training run saves it
//    beside the weights (Dataset::describe()), so a model can be rebuilt and used from the weights file alone.
//
// Files are read once, whole, into memory (at most DataSpec::max_bytes, a regular file opened without blocking);
// a file that changes while training does not affect the run. Re-opening a saved spec (resume, eval) re-reads the
// file and refuses it when its bytes changed (the hash differs). CRLF line ends are accepted (the \r is dropped).
//
// TextDataset: the file's characters as one token stream; the last val_fraction of it is held out (contiguous, as
// nanoGPT's split). With DataSpec::tokenizer "bpe" or "unigram" the tokens are a SentencePiece tokenizer's pieces
// (train/data/tokenizer.h) instead: the text is split at byte (1 - val_fraction) (moved back to a character's
// start), the tokenizer is trained on the training part alone (or loaded from the spec's tokenizer_model, checked
// against tokenizer_hash), and both parts are encoded with it; below, "characters" are then those tokens. A training example is a random window of context + 1 characters of the training part
// (nanoGPT's get_batch): src = its first `context`, tgt = its last one; the model frames it as a stream
// (ModelSpec::stream: inputs window[:-1], targets window[1:], loss at every position). The held-out examples are
// the windows of context + 1 characters starting every `context` characters of the held-out part (the last one
// shorter), so that together they predict every held-out character but the first; heldout(n) gives the first n.

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "train/data/dataset.h"
#include "train/data/tokenizer.h"

namespace attograd::data {

/// Largest data file read (64 MiB).
inline constexpr uint64_t kMaxDataFileBytes = uint64_t{64} << 20;
/// Most tokens in a vocabulary, the four reserved ids included.
inline constexpr int64_t kMaxVocabulary = 65536;
/// Longest text context and longest pairs source or target, in tokens (train::kMaxSequenceLen).
inline constexpr int64_t kMaxContext = 256;
/// The longest window a text model may see (--context): far beyond kMaxContext, since a text model samples from its
/// cache and never decodes a whole target greedily; what fits is the memory estimate's to say.
inline constexpr int64_t kMaxTextContext = 65536;

/// The code points of UTF-8 text. Error naming `origin` and the byte offset of an invalid sequence or a NUL byte.
std::vector<char32_t> decode_utf8(std::string_view text, const std::string& origin);
/// One code point as UTF-8.
std::string encode_utf8(char32_t c);

/// How text becomes tokens.
enum class Tokenize { Char, Word };
/// "char" or "word".
std::string tokenize_name(Tokenize t);
/// Parses "char" or "word" (Error otherwise).
Tokenize parse_tokenize(const std::string& name);

/// The tokens of a file after four reserved ids (see the file comment), and how text is split into them.
class Vocabulary {
 public:
  /// Reserved ids before the file's tokens: <pad>, <bos>, <eos>, <sep>.
  static constexpr int64_t kReserved = 4;
  /// A vocabulary of `tokens` (distinct, non-empty; ids kReserved, kReserved + 1, ...). Error on a duplicate.
  explicit Vocabulary(std::vector<std::string> tokens = {}, Tokenize tokenize = Tokenize::Char);
  /// The distinct tokens of `pieces`, sorted by their bytes.
  static Vocabulary build(const std::vector<std::string>& pieces, Tokenize tokenize);
  /// Token count, the reserved ids included.
  int64_t size() const { return kReserved + static_cast<int64_t>(tokens_.size()); }
  /// The file's tokens (without the reserved ones), in id order.
  const std::vector<std::string>& tokens() const { return tokens_; }
  /// How text is split.
  Tokenize tokenize() const { return tokenize_; }
  /// The id of a token, if it is one.
  std::optional<int64_t> find(const std::string& token) const;
  /// A token's text ("<pad>", "<bos>", "<eos>", "<sep>" for the reserved ids). Error outside [0, size()).
  const std::string& token(int64_t id) const;
  /// Text split into pieces: code points (char) or whitespace-separated words (word). Error naming `origin` on
  /// invalid UTF-8.
  std::vector<std::string> split(std::string_view text, const std::string& origin) const;
  /// Text as ids. Error naming `origin` and the first piece that is not in the vocabulary.
  std::vector<int64_t> encode(std::string_view text, const std::string& origin) const;
  /// Ids as text: characters concatenated, words joined by single spaces; reserved ids are left out.
  std::string decode(const std::vector<int64_t>& ids) const;
  /// {"tokenize": "char", "tokens": [...]}.
  std::string to_json() const;
  /// Parses to_json()'s output (Error on anything else).
  static Vocabulary from_json(const std::string& text);
  /// Same tokens, same tokenization.
  bool operator==(const Vocabulary& o) const { return tokens_ == o.tokens_ && tokenize_ == o.tokenize_; }

 private:
  std::vector<std::string> tokens_;
  Tokenize tokenize_;
  std::unordered_map<std::string, int64_t> ids_;
};

/// A data file's settings, and what a model trained on it needs to be rebuilt (saved beside its weights).
struct DataSpec {
  std::string format = "text";             ///< "text" (TextDataset), "pairs" (PairsDataset) or "tokens" (a directory
                                           ///< of token files: TokenFileDataset, train/data/tokens.h)
  std::string path = {};                   ///< the file
  std::string tokenize = "char";           ///< "char" or "word" (pairs; text is always char)
  int64_t context = 64;                    ///< text: tokens (characters) a model sees, in [1, kMaxTextContext]
  double val_fraction = 0.1;               ///< held-out share, in (0, 1)
  uint64_t max_bytes = kMaxDataFileBytes;  ///< largest file read
  int64_t max_vocab = kMaxVocabulary;      ///< largest vocabulary (reserved ids included)
  // Learned from the file when it is first read; given, they are checked against it.
  std::vector<std::string> vocabulary = {};  ///< the file's tokens (empty: build from the file)
  int64_t max_source_len = 0;                ///< longest source (pairs) / context (text)
  int64_t max_target_len = 0;                ///< longest target (pairs) / 1 (text)
  uint64_t file_hash = 0;                    ///< XXH64 of the file's bytes (0: not yet read)
  bool aligned = false;                      ///< pairs: every target has its source's length (an encoder needs it)
  // A text's subword tokenizer (train/data/tokenizer.h); written to JSON only when not the default.
  std::string tokenizer = "char";   ///< text: "char" (a token per character), "bpe" or "unigram" (SentencePiece)
  int64_t vocab_size = 0;           ///< bpe/unigram: SentencePiece's piece count (the model has 4 more ids); char: 0
  std::string tokenizer_model = {};  ///< bpe/unigram: the serialized SentencePiece model, base64 (empty: train it)
  uint64_t tokenizer_hash = 0;      ///< bpe/unigram: XXH64 of the serialized model (checked when it is loaded)
  /// Every field as one JSON object ("aligned" only when true, the tokenizer fields only when not char, so that
  /// older readers still read other specs).
  std::string to_json() const;
  /// Parses to_json()'s output (Error naming an unknown field or a wrong type).
  static DataSpec from_json(const std::string& text);
  /// Error naming the field for a value out of range.
  void validate() const;
  /// Field-wise equality.
  bool operator==(const DataSpec&) const = default;
};

/// The whole data file: a regular file of at most `max_bytes`, read without blocking (Error naming it otherwise).
std::string read_data_file(const std::string& path, uint64_t max_bytes);
/// The dataset a spec describes: reads its file (read_file; Error when spec.file_hash is set and the file's bytes
/// differ) or, without reading, a dataset that only knows its token space (spec.vocabulary must be given; next()
/// and heldout() are then errors).
std::shared_ptr<Dataset> open_data(const DataSpec& spec, bool read_file = true);

/// The subword tokenizer a spec saved (tokenizer_model), checked against tokenizer_hash before it is parsed and
/// against vocab_size after; nullopt when it saved none. Error naming the field otherwise.
std::optional<Tokenizer> saved_tokenizer(const DataSpec& spec);

/// A language-modelling dataset of a UTF-8 text file, by character or by subword (see the file comment).
class TextDataset : public Dataset {
 public:
  /// Reads spec.path (see open_data); spec.format must be "text".
  explicit TextDataset(const DataSpec& spec, bool read_file = true);
  /// The file's name.
  std::string name() const override;
  /// Restarts the stream of windows.
  void seed(uint64_t seed) override;
  /// A random window of the training part: src (context), tgt (1).
  Example next() override;
  /// The first n held-out windows (fewer when the held-out part has fewer); the seed is not used.
  std::vector<Example> heldout(int64_t n, uint64_t seed) const override;
  /// The held-out windows: ceil((held-out characters - 1) / context).
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
  /// true: language modelling of a text stream.
  bool stream() const override { return true; }
  /// The character (a subword tokenizer's Tokenizer::token_text).
  std::string token_text(int64_t token) const override;
  /// The characters concatenated (a subword tokenizer's exact decode).
  std::string to_text(const std::vector<int64_t>& tokens) const override;
  /// Raw text as character ids (Error naming a character outside the vocabulary), or encoded by the subword
  /// tokenizer (any UTF-8).
  std::vector<int64_t> parse_source(const std::string& text) const override;
  /// The UTF-8 bytes of a token (0 for the reserved ids).
  int64_t token_bytes(int64_t token) const override;
  /// The spec with the vocabulary, lengths and hash filled in.
  std::string describe() const override { return spec_.to_json(); }
  /// The spec with the vocabulary, lengths and hash filled in.
  const DataSpec& spec() const { return spec_; }
  /// The vocabulary (empty with a subword tokenizer).
  const Vocabulary& vocabulary() const { return vocab_; }
  /// The subword tokenizer (null for char).
  const Tokenizer* tokenizer() const { return tokenizer_ ? &*tokenizer_ : nullptr; }
  /// Tokens (characters for char) in the training part.
  int64_t train_size() const { return n_train_; }
  /// Tokens (characters for char) in the held-out part.
  int64_t val_size() const { return static_cast<int64_t>(tokens_.size()) - n_train_; }

 private:
  void open_subword(bool read_file);

  DataSpec spec_;
  Vocabulary vocab_;
  std::optional<Tokenizer> tokenizer_;
  std::vector<int32_t> tokens_;  // the whole file as ids (at most kMaxVocabulary: 4 bytes per character)
  int64_t n_train_ = 0;
  Generator gen_;
  int64_t offset_ = 0;
};

}  // namespace attograd::data
