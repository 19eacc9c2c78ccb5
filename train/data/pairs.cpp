// PairsDataset: `source<TAB>target` lines (train/data/pairs.h).

#include "train/data/pairs.h"

#include <algorithm>
#include <filesystem>
#include <numeric>

namespace attograd::data {

namespace detail {
std::string read_spec_file(DataSpec& spec);                        // text.cpp
void check_vocab_size(const Vocabulary& v, const DataSpec& spec);  // text.cpp
}  // namespace detail

std::vector<PairLine> parse_pairs(const std::string& text, const std::string& origin, Tokenize tokenize,
                                  const Vocabulary* vocab, Vocabulary* built, int64_t max_vocab) {
  const char* me = "pairs";
  ATTO_CHECK(!text.empty(), me, origin, " is empty");
  // Checked as a whole first, so that an error names the byte offset in the file.
  (void)decode_utf8(text, origin);
  struct Raw {
    int64_t line;
    std::vector<std::string> src, tgt;
  };
  std::vector<Raw> raw;
  const Vocabulary splitter({}, tokenize);
  int64_t line_no = 0;
  for (size_t pos = 0; pos < text.size();) {
    size_t end = text.find('\n', pos);
    if (end == std::string::npos) end = text.size();
    std::string line = text.substr(pos, end - pos);
    pos = end + 1;
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.pop_back();               // CRLF
    if (line.find_first_not_of(" \t\r\v\f") == std::string::npos) continue;  // blank
    const size_t tabs = static_cast<size_t>(std::count(line.begin(), line.end(), '\t'));
    ATTO_CHECK(tabs == 1, me, origin, " line ", line_no,
               tabs == 0 ? std::string(" has no tab: expected source<TAB>target")
                         : str_cat(" has ", tabs, " tabs: expected exactly one (source<TAB>target)"));
    const size_t tab = line.find('\t');
    Raw r{line_no, splitter.split(std::string_view(line).substr(0, tab), origin),
          splitter.split(std::string_view(line).substr(tab + 1), origin)};
    ATTO_CHECK(!r.src.empty(), me, origin, " line ", line_no, " has an empty source");
    ATTO_CHECK(!r.tgt.empty(), me, origin, " line ", line_no, " has an empty target");
    for (const auto& [what, n] : {std::pair{"source", r.src.size()}, std::pair{"target", r.tgt.size()}})
      ATTO_CHECK(static_cast<int64_t>(n) <= kMaxContext, me, origin, " line ", line_no, ": its ", what, " has ", n,
                 " tokens, more than the limit of ", kMaxContext);
    raw.push_back(std::move(r));
  }
  ATTO_CHECK(!raw.empty(), me, origin, " has no usable lines (every line is blank): expected source<TAB>target lines");

  Vocabulary own;
  if (!vocab) {
    std::vector<std::string> pieces;
    for (const Raw& r : raw) {
      pieces.insert(pieces.end(), r.src.begin(), r.src.end());
      pieces.insert(pieces.end(), r.tgt.begin(), r.tgt.end());
    }
    own = Vocabulary::build(pieces, tokenize);
    ATTO_CHECK(own.size() <= max_vocab, me, origin, " has ", own.size() - Vocabulary::kReserved,
               " distinct tokens; with the ", Vocabulary::kReserved, " reserved ids that is ", own.size(),
               ", more than the limit of ", max_vocab);
    vocab = &own;
  }
  ATTO_CHECK(vocab->tokenize() == tokenize, me, origin, ": the vocabulary splits by ", tokenize_name(vocab->tokenize()),
             ", the file is read by ", tokenize_name(tokenize));
  std::vector<PairLine> out;
  out.reserve(raw.size());
  for (const Raw& r : raw) {
    PairLine p{.line = r.line, .example = {}};
    for (const auto& [pieces, ids] : {std::pair{&r.src, &p.example.src}, std::pair{&r.tgt, &p.example.tgt}})
      for (const std::string& piece : *pieces) {
        const std::optional<int64_t> id = vocab->find(piece);
        ATTO_CHECK(id.has_value(), me, origin, " line ", r.line, ": ",
                   tokenize == Tokenize::Char ? "character" : "word", " '", piece.substr(0, 60),
                   "' is not in the model's vocabulary");
        ids->push_back(*id);
      }
    out.push_back(std::move(p));
  }
  if (built) *built = own;
  return out;
}

PairsDataset::PairsDataset(const DataSpec& spec, bool read_file) : spec_(spec) {
  const char* me = "PairsDataset";
  spec_.validate();
  ATTO_CHECK(spec_.format == "pairs", me, "spec format must be \"pairs\", got \"", spec_.format, "\"");
  const Tokenize tokenize = parse_tokenize(spec_.tokenize);
  if (!read_file) {
    ATTO_CHECK(!spec_.vocabulary.empty() && spec_.max_source_len > 0 && spec_.max_target_len > 0, me,
               "a dataset without its file needs the saved vocabulary and lengths");
    vocab_ = Vocabulary(spec_.vocabulary, tokenize);
    aligned_ = spec_.aligned;  // learned from the file when it was read, saved with the model
    return;
  }
  const std::string text = detail::read_spec_file(spec_);
  const std::string origin = "'" + spec_.path + "'";
  std::vector<PairLine> lines;
  if (spec_.vocabulary.empty()) {
    lines = parse_pairs(text, origin, tokenize, nullptr, &vocab_, spec_.max_vocab);
    spec_.vocabulary = vocab_.tokens();
  } else {
    vocab_ = Vocabulary(spec_.vocabulary, tokenize);
    lines = parse_pairs(text, origin, tokenize, &vocab_);
  }
  int64_t src_len = 0, tgt_len = 0;
  aligned_ = true;
  for (const PairLine& p : lines) {
    src_len = std::max<int64_t>(src_len, static_cast<int64_t>(p.example.src.size()));
    tgt_len = std::max<int64_t>(tgt_len, static_cast<int64_t>(p.example.tgt.size()));
    aligned_ = aligned_ && p.example.src.size() == p.example.tgt.size();
  }
  spec_.aligned = aligned_;  // saved with a model: a dataset opened without its file knows it
  // Lengths saved with a model fix its shapes: the file must fit them.
  if (spec.max_source_len > 0 || spec.max_target_len > 0) {
    ATTO_CHECK(src_len <= spec.max_source_len && tgt_len <= spec.max_target_len, me, origin, " has a source of ",
               src_len, " or a target of ", tgt_len, " tokens, longer than the model's ", spec.max_source_len, " and ",
               spec.max_target_len);
  } else {
    spec_.max_source_len = src_len;
    spec_.max_target_len = tgt_len;
  }
  const auto n = static_cast<int64_t>(lines.size());
  ATTO_CHECK(n >= 2, me, origin, " has ", n, " usable line; a held-out split needs at least 2");
  const int64_t n_val =
      std::clamp<int64_t>(static_cast<int64_t>(static_cast<double>(n) * spec_.val_fraction + 0.5), 1, n - 1);
  // A fixed permutation (Fisher-Yates from the project's generator with a fixed seed): the same on every machine.
  std::vector<size_t> order(static_cast<size_t>(n));
  std::iota(order.begin(), order.end(), size_t{0});
  Generator g(0x9a125);
  for (size_t i = order.size() - 1; i > 0; --i) std::swap(order[i], order[g.randint(i + 1)]);
  std::vector<bool> held(static_cast<size_t>(n), false);
  for (int64_t i = 0; i < n_val; ++i) held[order[static_cast<size_t>(i)]] = true;
  for (size_t i = 0; i < lines.size(); ++i) (held[i] ? val_ : train_).push_back(lines[i].example);
}

std::string PairsDataset::name() const { return std::filesystem::path(spec_.path).filename().string(); }

void PairsDataset::seed(uint64_t seed) {
  gen_.manual_seed(seed);
  offset_ = 0;
}

Example PairsDataset::next() {
  ATTO_CHECK(!train_.empty(), "PairsDataset", "no data: the dataset was opened without its file");
  ++offset_;
  return train_[gen_.randint(train_.size())];
}

std::vector<Example> PairsDataset::heldout(int64_t n, uint64_t) const {
  ATTO_CHECK(n >= 1, name(), "held-out example count must be >= 1, got ", n);
  ATTO_CHECK(!val_.empty(), "PairsDataset", "no data: the dataset was opened without its file");
  return {val_.begin(), val_.begin() + std::min<int64_t>(n, static_cast<int64_t>(val_.size()))};
}

void PairsDataset::set_position(const DataPosition& p) {
  ATTO_CHECK(p.offset >= 0, name(), "data position offset must be >= 0, got ", p.offset);
  gen_.set_state(p.generator);
  offset_ = p.offset;
}

std::vector<int64_t> PairsDataset::parse_source(const std::string& text) const {
  std::vector<int64_t> ids = vocab_.encode(text, "the input");
  ATTO_CHECK(!ids.empty(), "parse_source", "the input is empty");
  ATTO_CHECK(static_cast<int64_t>(ids.size()) <= spec_.max_source_len, "parse_source", "the input has ", ids.size(),
             " tokens, more than the model's longest source of ", spec_.max_source_len);
  return ids;
}

}  // namespace attograd::data
