// Task generators through the data interface: targets, lengths and alphabet, determinism, positions that resume
// the stream, the held-out set, token text, and errors. (Each model's batch framing is tested in
// tests/nn/test_sequence_model.cpp.)

#include <set>

#include "testing.h"
#include "train/data/tasks.h"

using namespace attograd;
using namespace attograd::data;
using namespace attograd::testing;

namespace {
std::vector<int64_t> sym(std::initializer_list<int64_t> digits) {
  std::vector<int64_t> v;
  for (int64_t d : digits) v.push_back(kFirstSymbol + d);
  return v;
}
}  // namespace

TEST(Tasks, Solutions) {
  EXPECT_EQ(solve({.task = Task::Copy}, sym({3, 1, 4})), sym({3, 1, 4}));
  EXPECT_EQ(solve({.task = Task::Reverse}, sym({3, 1, 4})), sym({4, 1, 3}));
  EXPECT_EQ(solve({.task = Task::Sort}, sym({3, 1, 4, 1})), sym({1, 1, 3, 4}));
  // 57 + 68 = 125, least significant digit first: [7,5] + [8,6] = [5,2,1]
  auto src = sym({7, 5});
  src.push_back(kPlus);
  auto b = sym({8, 6});
  src.insert(src.end(), b.begin(), b.end());
  EXPECT_EQ(solve({.task = Task::Add}, src), sym({5, 2, 1}));
  EXPECT_EQ(tokens_to_string(src), "7 5 + 8 6");
}

TEST(Tasks, ExamplesRespectLengthsAndAlphabet) {
  TaskDataset ds({.task = Task::Sort, .min_len = 2, .max_len = 5, .num_symbols = 7}, 1);
  std::set<size_t> lengths;
  for (int i = 0; i < 500; ++i) {
    Example e = ds.next();
    lengths.insert(e.src.size());
    EXPECT_EQ(e.tgt, solve(ds.options(), e.src));
    for (int64_t t : e.src) {
      EXPECT_GE(t, kFirstSymbol);
      EXPECT_LT(t, kFirstSymbol + 7);
    }
  }
  EXPECT_EQ(lengths, (std::set<size_t>{2, 3, 4, 5}));
  EXPECT_EQ(vocab_size(ds.options()), kFirstSymbol + 7);
}

TEST(Tasks, SameSeedSameStreamAndPositionsResume) {
  TaskDataset a({.task = Task::Add, .max_len = 4}, 42), b({.task = Task::Add, .max_len = 4}, 42);
  for (int i = 0; i < 20; ++i) EXPECT_EQ(a.next(), b.next());
  const DataPosition p = a.position();
  EXPECT_EQ(p.offset, 20);
  std::vector<Example> first;
  for (int i = 0; i < 5; ++i) first.push_back(a.next());
  a.set_position(p);
  for (int i = 0; i < 5; ++i) EXPECT_EQ(a.next(), first[static_cast<size_t>(i)]) << i;
  EXPECT_EQ(a.position().offset, 25);
  // Re-seeding restarts the stream; another seed gives another stream.
  a.seed(42);
  TaskDataset fresh({.task = Task::Add, .max_len = 4}, 42), other({.task = Task::Add, .max_len = 4}, 43);
  EXPECT_EQ(a.position(), fresh.position());
  EXPECT_EQ(a.next(), fresh.next());
  bool differs = false;
  for (int i = 0; i < 5; ++i) differs |= !(other.next() == fresh.next());
  EXPECT_TRUE(differs);
  EXPECT_ATTO_ERROR(a.set_position({.offset = -1}), "offset must be >= 0, got -1");
}

TEST(Tasks, HeldOutIsFixedPerSeedAndLeavesTrainingAlone) {
  TaskDataset ds({.task = Task::Reverse, .max_len = 6}, 7);
  const DataPosition before = ds.position();
  const std::vector<Example> h = ds.heldout(30, 99);
  EXPECT_EQ(ds.position(), before);
  EXPECT_EQ(h, ds.heldout(30, 99));
  ASSERT_EQ(h.size(), 30u);
  // The held-out set for a seed is the stream a TaskDataset with that seed draws.
  TaskDataset same({.task = Task::Reverse, .max_len = 6}, 99);
  for (const Example& e : h) EXPECT_EQ(e, same.next());
  EXPECT_NE(ds.heldout(30, 100), h);
  EXPECT_ATTO_ERROR(ds.heldout(0, 1), "held-out example count must be >= 1, got 0");
}

TEST(Tasks, TokenSpaceAndText) {
  TaskDataset add({.task = Task::Add, .max_len = 3, .num_symbols = 10}, 1);
  EXPECT_EQ(add.name(), "add");
  EXPECT_EQ(add.vocab_size(), kFirstSymbol + 10);
  EXPECT_EQ(add.max_source_len(), 7);
  EXPECT_EQ(add.max_target_len(), 4);
  EXPECT_FALSE(add.aligned());
  TaskDataset sort({.task = Task::Sort, .max_len = 3}, 1);
  EXPECT_TRUE(sort.aligned());
  EXPECT_EQ(add.to_text({kFirstSymbol + 7, kPlus, kFirstSymbol + 2, kEos}), "7 + 2 <eos>");
  EXPECT_EQ(add.parse_source("7 + 2"), (std::vector<int64_t>{kFirstSymbol + 7, kPlus, kFirstSymbol + 2}));
  const nn::ModelSpec spec = add.model_spec({.layers = 3, .d_model = 16});
  EXPECT_EQ(spec.layers, 3);
  EXPECT_EQ(spec.d_model, 16);
  EXPECT_EQ(spec.vocab, 15);
  EXPECT_EQ(spec.max_source_len, 7);
  EXPECT_EQ(spec.max_target_len, 4);
  EXPECT_EQ(spec.specials, nn::SpecialTokens{});
}

TEST(Tasks, Errors) {
  EXPECT_ATTO_ERROR(parse_task("shuffle"), "unknown task 'shuffle'");
  EXPECT_EQ(parse_task("reverse"), Task::Reverse);
  EXPECT_ATTO_ERROR(TaskDataset({.min_len = 0}, 1), "min_len must be >= 1, got 0");
  EXPECT_ATTO_ERROR(TaskDataset({.min_len = 5, .max_len = 3}, 1), "max_len (3) must be >= min_len (5)");
  EXPECT_ATTO_ERROR(parse_symbols("1 x 3", 10), "'x' is not a symbol");
  EXPECT_ATTO_ERROR(parse_symbols("1 12", 10), "'12' is not a symbol");
  EXPECT_EQ(parse_symbols("3 1 4", 10), sym({3, 1, 4}));
}

// generate --input with a token the task cannot have (issue 14): '+' belongs to the add task only.
TEST(Tasks, ParseSourceRejectsTokensTheTaskCannotHave) {
  TaskDataset reverse({.task = Task::Reverse, .max_len = 6}, 1), add({.task = Task::Add, .max_len = 4}, 1);
  EXPECT_ATTO_ERROR(reverse.parse_source("1 + 2"), "'+' is not a symbol of the reverse task");
  EXPECT_ATTO_ERROR(reverse.parse_source("+"), "'+' is not a symbol");
  EXPECT_EQ(add.parse_source("1 + 2").size(), 3u);
  EXPECT_ATTO_ERROR(reverse.parse_source(std::string(100000, '7')), "...' is not a symbol");  // cut in the message
}
