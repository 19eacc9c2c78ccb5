// Greedy decoding and evaluation, checked on tiny models trained here on copy (lengths 1..4): decoding agrees
// with the argmax of a teacher-forced forward pass, stops at EOS, respects its budget, batches without changing
// results; evaluation counts match a hand count.

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "autograd/loss.h"
#include "autograd/shape.h"
#include "testing.h"
#include "train/decode.h"
#include "train/trainer.h"

namespace attograd::train {
namespace {

using data::Example;
using data::kBos;
using data::kEos;
using data::kPad;
using data::kSep;

TrainConfig tiny_copy(const std::string& model, int64_t steps) {
  TrainConfig c;
  c.task = "copy";
  c.model = model;
  c.layers = 2;
  c.d_model = 32;
  c.heads = 2;
  c.d_ff = 64;
  c.max_len = 4;
  c.batch = 32;
  c.steps = steps;
  c.lr = 1e-2;
  c.warmup = std::min<int64_t>(25, steps);
  c.eval_every = 0;
  c.eval_size = 100;
  c.seed = 11;
  return c;
}

// A Trainer of `model` trained for `steps` steps, built once per test program.
Trainer& trained(const std::string& model, int64_t steps = 300) {
  static std::map<std::pair<std::string, int64_t>, std::unique_ptr<Trainer>> cache;
  auto& t = cache[{model, steps}];
  if (!t) {
    t = std::make_unique<Trainer>(tiny_copy(model, steps));
    for (int64_t i = 0; i < steps; ++i) t->step();
  }
  return *t;
}

// Index of the first maximum of logits[b, p, :] (B, L, V) float32.
int64_t argmax_at(const Tensor& logits, int64_t b, int64_t p) {
  const int64_t L = logits.size(1), V = logits.size(2);
  const float* x = logits.data<float>() + (b * L + p) * V;
  int64_t best = 0;
  for (int64_t v = 1; v < V; ++v)
    if (x[v] > x[best]) best = v;
  return best;
}

// An Int64 (rows, width) tensor, rows right-padded with kPad.
Tensor pack(const std::vector<std::vector<int64_t>>& rows) {
  size_t width = 1;
  for (const auto& r : rows) width = std::max(width, r.size());
  Tensor t = full({static_cast<int64_t>(rows.size()), static_cast<int64_t>(width)}, kPad, {.dtype = kInt64});
  for (size_t i = 0; i < rows.size(); ++i)
    std::copy(rows[i].begin(), rows[i].end(), t.data<int64_t>() + i * width);
  return t;
}

TokenRows prompts_of(const std::vector<Example>& ex) {
  TokenRows p;
  for (const Example& e : ex) {
    p.push_back(e.src);
    p.back().push_back(kSep);
  }
  return p;
}

// ---------------------------------------------------------------------------------------------
// Decoding

TEST(GreedyDecode, CausalLMAgreesWithTeacherForcedArgmax) {
  Trainer& t = trained("lm");
  nn::CausalLM& lm = *t.causal_lm();
  const std::vector<Example> ex = t.heldout_examples(40);
  const TokenRows prompts = prompts_of(ex);
  const TokenRows rows = greedy_decode(lm, prompts, 5);
  ASSERT_EQ(rows.size(), ex.size());
  // Feed prompt + decoded (all but the last decoded token) in one teacher-forced pass.
  TokenRows full_rows;
  for (size_t i = 0; i < ex.size(); ++i) {
    ASSERT_FALSE(rows[i].empty());
    full_rows.push_back(prompts[i]);
    full_rows.back().insert(full_rows.back().end(), rows[i].begin(), rows[i].end() - 1);
  }
  NoGradGuard no_grad;
  lm.eval();
  const Tensor logits = lm.forward(pack(full_rows));  // (B, L, V)
  lm.train();
  for (size_t i = 0; i < ex.size(); ++i)
    for (size_t j = 0; j < rows[i].size(); ++j)
      EXPECT_EQ(argmax_at(logits, static_cast<int64_t>(i), static_cast<int64_t>(prompts[i].size() + j - 1)),
                rows[i][j])
          << "example " << i << " position " << j;
}

TEST(GreedyDecode, TransformerAgreesWithTeacherForcedArgmax) {
  Trainer& t = trained("seq2seq");
  nn::Transformer& tf = *t.transformer();
  const std::vector<Example> ex = t.heldout_examples(40);
  const Tensor src = data::make_seq2seq_batch(ex).src;  // (B, S)
  const TokenRows rows = greedy_decode(tf, src, 5);
  TokenRows tgt_in;
  for (const auto& r : rows) {
    ASSERT_FALSE(r.empty());
    tgt_in.push_back({kBos});
    tgt_in.back().insert(tgt_in.back().end(), r.begin(), r.end() - 1);
  }
  NoGradGuard no_grad;
  tf.eval();
  const Tensor logits = tf.forward(src, pack(tgt_in));  // (B, T, V)
  tf.train();
  for (size_t i = 0; i < ex.size(); ++i)
    for (size_t j = 0; j < rows[i].size(); ++j)
      EXPECT_EQ(argmax_at(logits, static_cast<int64_t>(i), static_cast<int64_t>(j)), rows[i][j])
          << "example " << i << " position " << j;
}

TEST(GreedyDecode, StopsAtEosAndSolvesTheTask) {
  for (const std::string model : {"lm", "seq2seq"}) {
    SCOPED_TRACE(model);
    Trainer& t = trained(model);
    const std::vector<Example> ex = t.heldout_examples(50);
    const TokenRows rows = model == "lm" ? greedy_decode(*t.causal_lm(), prompts_of(ex), 5)
                                         : greedy_decode(*t.transformer(), data::make_seq2seq_batch(ex).src, 5);
    int right = 0, stopped = 0;
    for (size_t i = 0; i < ex.size(); ++i) {
      const auto& r = rows[i];
      // EOS, if any, is the last token: nothing is generated after it.
      for (size_t j = 0; j + 1 < r.size(); ++j) EXPECT_NE(r[j], kEos) << "example " << i;
      if (!r.empty() && r.back() == kEos) ++stopped;
      else EXPECT_EQ(r.size(), 5u) << "a row that did not stop used the whole budget";
      right += strip_eos(r) == ex[i].tgt && r.back() == kEos;
    }
    // The budget (5) fits the longest answer (4 + EOS); shorter answers must stop by themselves.
    EXPECT_GE(stopped, 48);
    EXPECT_GE(right, 47);
    EXPECT_EQ(t.predict(ex[0].src), ex[0].tgt);
  }
}

TEST(GreedyDecode, RespectsTheBudget) {
  for (const std::string model : {"lm", "seq2seq"}) {
    SCOPED_TRACE(model);
    Trainer& t = trained(model);
    const std::vector<Example> ex = t.heldout_examples(30);
    for (int64_t budget : {1, 2, 3}) {
      const TokenRows rows = model == "lm"
                                 ? greedy_decode(*t.causal_lm(), prompts_of(ex), budget)
                                 : greedy_decode(*t.transformer(), data::make_seq2seq_batch(ex).src, budget);
      for (size_t i = 0; i < ex.size(); ++i) {
        ASSERT_LE(static_cast<int64_t>(rows[i].size()), budget);
        // A trained copy model emits the answer's prefix; it stops early only when the answer is shorter.
        if (static_cast<int64_t>(ex[i].tgt.size()) >= budget) {
          EXPECT_EQ(static_cast<int64_t>(rows[i].size()), budget);
        }
      }
    }
  }
}

TEST(GreedyDecode, BatchedEqualsOneAtATime) {
  for (const std::string model : {"lm", "seq2seq"}) {
    SCOPED_TRACE(model);
    Trainer& t = trained(model, 60);  // partly trained: rows of different lengths, some without EOS
    const std::vector<Example> ex = t.heldout_examples(20);
    const TokenRows batched = model == "lm"
                                  ? greedy_decode(*t.causal_lm(), prompts_of(ex), 5)
                                  : greedy_decode(*t.transformer(), data::make_seq2seq_batch(ex).src, 5);
    for (size_t i = 0; i < ex.size(); ++i) {
      const TokenRows one = model == "lm" ? greedy_decode(*t.causal_lm(), prompts_of({ex[i]}), 5)
                                          : greedy_decode(*t.transformer(), data::make_seq2seq_batch({ex[i]}).src, 5);
      EXPECT_EQ(one[0], batched[i]) << "example " << i;
    }
  }
}

TEST(GreedyDecode, LeavesModeAndGradientsAlone) {
  Trainer& t = trained("lm");
  nn::CausalLM& lm = *t.causal_lm();
  lm.train();
  lm.zero_grad(true);
  greedy_decode(lm, {{data::kFirstSymbol, kSep}}, 3);
  EXPECT_TRUE(lm.is_training());
  for (const auto& [name, p] : lm.named_parameters()) EXPECT_FALSE(p.grad().defined()) << name;
  lm.eval();
  greedy_decode(lm, {{data::kFirstSymbol, kSep}}, 3);
  EXPECT_FALSE(lm.is_training());
  lm.train();
}

TEST(GreedyDecode, Errors) {
  Trainer& t = trained("lm", 1);
  Trainer& s = trained("seq2seq", 1);
  nn::CausalLM& lm = *t.causal_lm();
  EXPECT_ATTO_ERROR(greedy_decode(lm, {{5, kSep}}, 0), "max_new must be >= 1, got 0");
  EXPECT_ATTO_ERROR(greedy_decode(lm, {{5, kSep}, {}}, 2), "prompt 1 is empty");
  EXPECT_ATTO_ERROR(greedy_decode(lm, {{5, 99}}, 2), "prompt 0 has token 99 outside [0, 15)");
  // copy with max_len 4: the model holds 4 + 1 + 4 = 9 positions.
  EXPECT_NO_THROW(greedy_decode(lm, {{5, 5, 5, 5, kSep}}, 5));
  EXPECT_ATTO_ERROR(greedy_decode(lm, {{5, 5, 5, 5, kSep}}, 6), "exceeds the model's max_len 9");
  EXPECT_TRUE(greedy_decode(lm, {}, 3).empty());
  nn::Transformer& tf = *s.transformer();
  const Tensor src = from_vector<int64_t>({5, 6}, {1, 2});
  EXPECT_ATTO_ERROR(greedy_decode(tf, src, 0), "max_len must be >= 1, got 0");
  EXPECT_ATTO_ERROR(greedy_decode(tf, src, 6), "max_len 6 exceeds the model's n_position 5");
  EXPECT_ATTO_ERROR(greedy_decode(tf, from_vector<float>({5, 6}, {1, 2}), 2), "src must be a (B, S) int64 tensor");
  EXPECT_ATTO_ERROR(greedy_decode(tf, from_vector<int64_t>({5, 6}, {2}), 2), "src must be a (B, S) int64 tensor");
  EXPECT_ATTO_ERROR(t.predict({}), "source length must be in [1, 4], got 0");
  EXPECT_ATTO_ERROR(t.predict({5, 5, 5, 5, 5}), "source length must be in [1, 4], got 5");
}

TEST(StripEos, RemovesOnlyATrailingEos) {
  EXPECT_EQ(strip_eos({5, 6, kEos}), (std::vector<int64_t>{5, 6}));
  EXPECT_EQ(strip_eos({5, 6}), (std::vector<int64_t>{5, 6}));
  EXPECT_EQ(strip_eos({kEos}), std::vector<int64_t>{});
  EXPECT_EQ(strip_eos({}), std::vector<int64_t>{});
}

// ---------------------------------------------------------------------------------------------
// Evaluation

// Token accuracy counts every target position plus the final EOS; sequence accuracy needs target then EOS.
void expect_hand_count(const EvalResult& r, const std::vector<Example>& ex, const TokenRows& rows) {
  int64_t right = 0, total = 0, exact = 0;
  for (size_t i = 0; i < ex.size(); ++i) {
    std::vector<int64_t> want = ex[i].tgt;
    want.push_back(kEos);
    for (size_t p = 0; p < want.size(); ++p) right += p < rows[i].size() && rows[i][p] == want[p];
    total += static_cast<int64_t>(want.size());
    exact += rows[i] == want;
  }
  EXPECT_EQ(r.n, static_cast<int64_t>(ex.size()));
  EXPECT_DOUBLE_EQ(r.token_accuracy, static_cast<double>(right) / static_cast<double>(total));
  EXPECT_DOUBLE_EQ(r.sequence_accuracy, static_cast<double>(exact) / static_cast<double>(ex.size()));
}

TEST(Evaluate, CountsMatchAHandCount) {
  for (const std::string model : {"lm", "seq2seq"}) {
    SCOPED_TRACE(model);
    Trainer& t = trained(model, 60);  // partly trained, so the accuracies are strictly between 0 and 1
    const std::vector<Example> ex = t.heldout_examples(80);
    // Each example decoded alone with the budget evaluate() gives its batch (longest target + 1 = 5).
    TokenRows rows;
    for (const Example& e : ex)
      rows.push_back(model == "lm" ? greedy_decode(*t.causal_lm(), prompts_of({e}), 5)[0]
                                   : greedy_decode(*t.transformer(), data::make_seq2seq_batch({e}).src, 5)[0]);
    for (int64_t batch : {int64_t{1}, int64_t{7}, int64_t{250}}) {
      SCOPED_TRACE(batch);
      const EvalResult r = model == "lm" ? evaluate(*t.causal_lm(), ex, batch) : evaluate(*t.transformer(), ex, batch);
      if (batch != 250) continue;  // smaller batches may use a smaller budget per batch (see below)
      expect_hand_count(r, ex, rows);
      EXPECT_GT(r.sequence_accuracy, 0.0);
      EXPECT_LT(r.sequence_accuracy, 1.0);
      EXPECT_GT(r.token_accuracy, r.sequence_accuracy);
    }
    // With batch 1 the budget is that example's target length + 1: rows are cut there.
    const EvalResult one = model == "lm" ? evaluate(*t.causal_lm(), ex, 1) : evaluate(*t.transformer(), ex, 1);
    TokenRows cut = rows;
    for (size_t i = 0; i < ex.size(); ++i) cut[i].resize(std::min(cut[i].size(), ex[i].tgt.size() + 1));
    expect_hand_count(one, ex, cut);
  }
}

TEST(Evaluate, LossIsTheTeacherForcedCrossEntropy) {
  Trainer& t = trained("seq2seq", 60);
  const std::vector<Example> ex = t.heldout_examples(30);
  const EvalResult r = evaluate(*t.transformer(), ex);
  const data::Seq2SeqBatch b = data::make_seq2seq_batch(ex);
  NoGradGuard no_grad;
  t.transformer()->eval();
  const Tensor logits = t.transformer()->forward(b.src, b.tgt_in);  // (B, T, V)
  t.transformer()->train();
  const double want = cross_entropy(reshape(logits, {-1, logits.size(-1)}), reshape(b.tgt_out, {-1})).item();
  EXPECT_NEAR(r.loss, want, 1e-5 * want);
}

TEST(Evaluate, TrainedModelsScorePerfectlyAndDatasetOverloadAdvances) {
  for (const std::string model : {"lm", "seq2seq"}) {
    SCOPED_TRACE(model);
    Trainer& t = trained(model);
    data::TaskDataset a(t.task_options(), 99), b(t.task_options(), 99);
    const EvalResult r = model == "lm" ? evaluate(*t.causal_lm(), a, 100) : evaluate(*t.transformer(), a, 100);
    std::vector<Example> ex;
    for (int i = 0; i < 100; ++i) ex.push_back(b.next_example());
    EXPECT_EQ(a.next_example().src, b.next_example().src) << "the overload drew exactly n examples";
    const EvalResult same = model == "lm" ? evaluate(*t.causal_lm(), ex) : evaluate(*t.transformer(), ex);
    EXPECT_EQ(r.token_accuracy, same.token_accuracy);
    EXPECT_EQ(r.sequence_accuracy, same.sequence_accuracy);
    EXPECT_EQ(r.n, 100);
    EXPECT_GE(r.sequence_accuracy, 0.95);
    EXPECT_GE(r.token_accuracy, 0.97);
  }
}

TEST(Evaluate, Errors) {
  Trainer& t = trained("lm", 1);
  EXPECT_ATTO_ERROR(evaluate(*t.causal_lm(), std::vector<Example>{}), "no examples to evaluate");
  EXPECT_ATTO_ERROR(evaluate(*t.causal_lm(), t.heldout_examples(3), 0), "batch must be >= 1, got 0");
  EXPECT_ATTO_ERROR(evaluate(*t.causal_lm(), t.train_data(), 0), "n must be >= 1, got 0");
}

}  // namespace
}  // namespace attograd::train
