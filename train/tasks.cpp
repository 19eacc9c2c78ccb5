#include "train/tasks.h"

#include <algorithm>
#include <sstream>

namespace attograd::data {

std::string task_name(Task t) {
  switch (t) {
    case Task::Copy: return "copy";
    case Task::Reverse: return "reverse";
    case Task::Sort: return "sort";
    case Task::Add: return "add";
  }
  return "?";
}

Task parse_task(const std::string& name) {
  for (Task t : {Task::Copy, Task::Reverse, Task::Sort, Task::Add})
    if (task_name(t) == name) return t;
  throw Error("task", "unknown task '" + name + "' (expected copy, reverse, sort or add)");
}

int64_t vocab_size(const TaskOptions& o) { return kFirstSymbol + o.num_symbols; }

int64_t max_src_len(const TaskOptions& o) { return o.task == Task::Add ? 2 * o.max_len + 1 : o.max_len; }

int64_t max_tgt_len(const TaskOptions& o) { return o.task == Task::Add ? o.max_len + 1 : o.max_len; }

std::vector<int64_t> solve(const TaskOptions& o, const std::vector<int64_t>& src) {
  std::vector<int64_t> t;
  switch (o.task) {
    case Task::Copy: return src;
    case Task::Reverse: return {src.rbegin(), src.rend()};
    case Task::Sort:
      t = src;
      std::sort(t.begin(), t.end());
      return t;
    case Task::Add: {
      auto plus = std::find(src.begin(), src.end(), kPlus);
      ATTO_CHECK(plus != src.end(), "add", "source has no '+' token");
      std::vector<int64_t> a(src.begin(), plus), b(plus + 1, src.end());
      const int64_t base = o.num_symbols;
      int64_t carry = 0;
      for (size_t i = 0; i < std::max(a.size(), b.size()) || carry; ++i) {
        int64_t s = carry;
        if (i < a.size()) s += a[i] - kFirstSymbol;
        if (i < b.size()) s += b[i] - kFirstSymbol;
        t.push_back(kFirstSymbol + s % base);
        carry = s / base;
      }
      return t;
    }
  }
  return t;
}

TaskDataset::TaskDataset(TaskOptions opts, uint64_t seed) : opts_(opts), gen_(seed) {
  ATTO_CHECK(opts.min_len >= 1, "TaskDataset", "min_len must be >= 1, got ", opts.min_len);
  ATTO_CHECK(opts.max_len >= opts.min_len, "TaskDataset", "max_len (", opts.max_len, ") must be >= min_len (",
             opts.min_len, ")");
  ATTO_CHECK(opts.num_symbols >= 2, "TaskDataset", "num_symbols must be >= 2, got ", opts.num_symbols);
}

Example TaskDataset::next_example() {
  auto draw_len = [&] {
    return opts_.min_len + static_cast<int64_t>(gen_.randint(static_cast<uint64_t>(opts_.max_len - opts_.min_len + 1)));
  };
  auto draw_symbols = [&](int64_t n, std::vector<int64_t>& out) {
    for (int64_t i = 0; i < n; ++i)
      out.push_back(kFirstSymbol + static_cast<int64_t>(gen_.randint(static_cast<uint64_t>(opts_.num_symbols))));
  };
  Example e;
  if (opts_.task == Task::Add) {
    draw_symbols(draw_len(), e.src);
    e.src.push_back(kPlus);
    draw_symbols(draw_len(), e.src);
  } else {
    draw_symbols(draw_len(), e.src);
  }
  e.tgt = solve(opts_, e.src);
  return e;
}

Seq2SeqBatch make_seq2seq_batch(const std::vector<Example>& ex) {
  ATTO_CHECK(!ex.empty(), "make_seq2seq_batch", "empty batch");
  size_t S = 0, T = 0;
  for (auto& e : ex) {
    S = std::max(S, e.src.size());
    T = std::max(T, e.tgt.size() + 1);
  }
  const auto B = static_cast<int64_t>(ex.size());
  Seq2SeqBatch b;
  b.src = full({B, static_cast<int64_t>(S)}, static_cast<double>(kPad), {.dtype = kInt64});
  b.tgt_in = full({B, static_cast<int64_t>(T)}, static_cast<double>(kPad), {.dtype = kInt64});
  b.tgt_out = full({B, static_cast<int64_t>(T)}, static_cast<double>(kIgnore), {.dtype = kInt64});
  int64_t* src = b.src.data<int64_t>();
  int64_t* tin = b.tgt_in.data<int64_t>();
  int64_t* tout = b.tgt_out.data<int64_t>();
  for (size_t i = 0; i < ex.size(); ++i) {
    std::copy(ex[i].src.begin(), ex[i].src.end(), src + i * S);
    tin[i * T] = kBos;
    std::copy(ex[i].tgt.begin(), ex[i].tgt.end(), tin + i * T + 1);
    std::copy(ex[i].tgt.begin(), ex[i].tgt.end(), tout + i * T);
    tout[i * T + ex[i].tgt.size()] = kEos;
  }
  b.examples = ex;
  return b;
}

LMBatch make_lm_batch(const std::vector<Example>& ex) {
  ATTO_CHECK(!ex.empty(), "make_lm_batch", "empty batch");
  // sequence = src SEP tgt EOS; input = sequence[:-1], target = sequence[1:] where it is tgt or EOS.
  size_t L = 0;
  for (auto& e : ex) L = std::max(L, e.src.size() + 1 + e.tgt.size());
  const auto B = static_cast<int64_t>(ex.size());
  LMBatch b;
  b.input = full({B, static_cast<int64_t>(L)}, static_cast<double>(kPad), {.dtype = kInt64});
  b.target = full({B, static_cast<int64_t>(L)}, static_cast<double>(kIgnore), {.dtype = kInt64});
  int64_t* in = b.input.data<int64_t>();
  int64_t* tg = b.target.data<int64_t>();
  for (size_t i = 0; i < ex.size(); ++i) {
    std::vector<int64_t> seq = ex[i].src;
    seq.push_back(kSep);
    seq.insert(seq.end(), ex[i].tgt.begin(), ex[i].tgt.end());
    seq.push_back(kEos);
    const size_t first_target = ex[i].src.size() + 1;  // index in seq of the first tgt token
    for (size_t p = 0; p + 1 < seq.size(); ++p) {
      in[i * L + p] = seq[p];
      if (p + 1 >= first_target) tg[i * L + p] = seq[p + 1];
    }
  }
  b.examples = ex;
  return b;
}

Seq2SeqBatch TaskDataset::next_seq2seq(int64_t batch_size) {
  ATTO_CHECK(batch_size > 0, "next_seq2seq", "batch size must be positive, got ", batch_size);
  std::vector<Example> ex;
  for (int64_t i = 0; i < batch_size; ++i) ex.push_back(next_example());
  return make_seq2seq_batch(ex);
}

LMBatch TaskDataset::next_lm(int64_t batch_size) {
  ATTO_CHECK(batch_size > 0, "next_lm", "batch size must be positive, got ", batch_size);
  std::vector<Example> ex;
  for (int64_t i = 0; i < batch_size; ++i) ex.push_back(next_example());
  return make_lm_batch(ex);
}

std::string tokens_to_string(const std::vector<int64_t>& tokens) {
  std::ostringstream os;
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (i) os << ' ';
    int64_t t = tokens[i];
    switch (t) {
      case kPad: os << "<pad>"; break;
      case kBos: os << "<bos>"; break;
      case kEos: os << "<eos>"; break;
      case kSep: os << "<sep>"; break;
      case kPlus: os << '+'; break;
      default: os << t - kFirstSymbol;
    }
  }
  return os.str();
}

std::vector<int64_t> parse_symbols(const std::string& text, int64_t num_symbols) {
  std::istringstream is(text);
  std::vector<int64_t> out;
  std::string w;
  while (is >> w) {
    if (w == "+") {
      out.push_back(kPlus);
      continue;
    }
    char* end = nullptr;
    long v = std::strtol(w.c_str(), &end, 10);
    ATTO_CHECK(end && *end == '\0' && v >= 0 && v < num_symbols, "parse_symbols", "'", w,
               "' is not a symbol (expected an integer in [0, ", num_symbols, ") or '+')");
    out.push_back(kFirstSymbol + v);
  }
  ATTO_CHECK(!out.empty(), "parse_symbols", "no symbols in '", text, "'");
  return out;
}

}  // namespace attograd::data
