#include "train/data/tasks.h"

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

TaskDataset::TaskDataset(TaskOptions opts, uint64_t seed) : GeneratedDataset(seed), opts_(opts) {
  ATTO_CHECK(opts.min_len >= 1, "TaskDataset", "min_len must be >= 1, got ", opts.min_len);
  ATTO_CHECK(opts.max_len >= opts.min_len, "TaskDataset", "max_len (", opts.max_len, ") must be >= min_len (",
             opts.min_len, ")");
  ATTO_CHECK(opts.num_symbols >= 2, "TaskDataset", "num_symbols must be >= 2, got ", opts.num_symbols);
}

Example TaskDataset::generate(Generator& gen) const {
  auto draw_len = [&] {
    return opts_.min_len + static_cast<int64_t>(gen.randint(static_cast<uint64_t>(opts_.max_len - opts_.min_len + 1)));
  };
  auto draw_symbols = [&](int64_t n, std::vector<int64_t>& out) {
    for (int64_t i = 0; i < n; ++i)
      out.push_back(kFirstSymbol + static_cast<int64_t>(gen.randint(static_cast<uint64_t>(opts_.num_symbols))));
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

std::string TaskDataset::token_text(int64_t token) const { return tokens_to_string({token}); }

std::vector<int64_t> TaskDataset::parse_source(const std::string& text) const {
  std::vector<int64_t> src = parse_symbols(text, opts_.num_symbols);
  if (opts_.task != Task::Add)
    for (int64_t t : src)
      ATTO_CHECK(t != kPlus, "parse_source", "'+' is not a symbol of the ", name(),
                 " task (only the add task's sources have '+'; expected integers in [0, ", opts_.num_symbols, "))");
  return src;
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
    ATTO_CHECK(end && *end == '\0' && v >= 0 && v < num_symbols, "parse_symbols", "'",
               w.size() > 40 ? w.substr(0, 37) + "..." : w,
               "' is not a symbol (expected an integer in [0, ", num_symbols, ") or '+')");
    out.push_back(kFirstSymbol + v);
  }
  ATTO_CHECK(!out.empty(), "parse_symbols", "no symbols in '", text.size() > 40 ? text.substr(0, 37) + "..." : text,
             "'");
  return out;
}

}  // namespace attograd::data
