// Task generators: targets, batch shapes and padding, the LM framing's loss positions,
#include <set>
// determinism and errors.

#include "testing.h"
#include "train/tasks.h"

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
    Example e = ds.next_example();
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

TEST(Tasks, Seq2SeqBatchShapesAndPadding) {
  Seq2SeqBatch b = make_seq2seq_batch({{sym({1, 2, 3}), sym({3, 2, 1})}, {sym({4}), sym({4})}});
  EXPECT_EQ(b.src.shape(), (Shape{2, 3}));
  EXPECT_EQ(b.tgt_in.shape(), (Shape{2, 4}));
  EXPECT_EQ(b.tgt_out.shape(), (Shape{2, 4}));
  auto d = [](int64_t x) { return kFirstSymbol + x; };
  EXPECT_EQ(b.src.to_vector<int64_t>(), (std::vector<int64_t>{d(1), d(2), d(3), d(4), kPad, kPad}));
  EXPECT_EQ(b.tgt_in.to_vector<int64_t>(),
            (std::vector<int64_t>{kBos, d(3), d(2), d(1), kBos, d(4), kPad, kPad}));
  EXPECT_EQ(b.tgt_out.to_vector<int64_t>(),
            (std::vector<int64_t>{d(3), d(2), d(1), kEos, d(4), kEos, kIgnore, kIgnore}));
}

TEST(Tasks, LMBatchPutsLossOnTargetOnly) {
  // seq = 1 2 SEP 2 1 EOS; input = 1 2 SEP 2 1; target = - - 2 1 EOS
  LMBatch b = make_lm_batch({{sym({1, 2}), sym({2, 1})}, {sym({5}), sym({5})}});
  auto d = [](int64_t x) { return kFirstSymbol + x; };
  EXPECT_EQ(b.input.shape(), (Shape{2, 5}));
  EXPECT_EQ(b.input.to_vector<int64_t>(),
            (std::vector<int64_t>{d(1), d(2), kSep, d(2), d(1), d(5), kSep, d(5), kPad, kPad}));
  EXPECT_EQ(b.target.to_vector<int64_t>(), (std::vector<int64_t>{kIgnore, kIgnore, d(2), d(1), kEos, kIgnore, d(5),
                                                                  kEos, kIgnore, kIgnore}));
}

TEST(Tasks, SameSeedSameBatchesAndStateReplays) {
  TaskDataset a({.task = Task::Add, .max_len = 4}, 42), b({.task = Task::Add, .max_len = 4}, 42);
  for (int i = 0; i < 5; ++i) {
    EXPECT_EQ(a.next_lm(8).input.to_vector<int64_t>(), b.next_lm(8).input.to_vector<int64_t>());
  }
  GeneratorState s = a.generator().get_state();
  auto first = a.next_seq2seq(4).src.to_vector<int64_t>();
  a.generator().set_state(s);
  EXPECT_EQ(a.next_seq2seq(4).src.to_vector<int64_t>(), first);
  TaskDataset c({.task = Task::Add, .max_len = 4}, 43);
  EXPECT_NE(c.next_lm(8).input.to_vector<int64_t>(), b.next_lm(8).input.to_vector<int64_t>());
}

TEST(Tasks, Errors) {
  EXPECT_ATTO_ERROR(parse_task("shuffle"), "unknown task 'shuffle'");
  EXPECT_EQ(parse_task("reverse"), Task::Reverse);
  EXPECT_ATTO_ERROR(TaskDataset({.min_len = 0}, 1), "min_len must be >= 1, got 0");
  EXPECT_ATTO_ERROR(TaskDataset({.min_len = 5, .max_len = 3}, 1), "max_len (3) must be >= min_len (5)");
  EXPECT_ATTO_ERROR(parse_symbols("1 x 3", 10), "'x' is not a symbol");
  EXPECT_ATTO_ERROR(parse_symbols("1 12", 10), "'12' is not a symbol");
  EXPECT_EQ(parse_symbols("3 1 4", 10), sym({3, 1, 4}));
  TaskDataset ds({}, 1);
  EXPECT_ATTO_ERROR(ds.next_lm(0), "batch size must be positive, got 0");
}
