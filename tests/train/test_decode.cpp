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
using data::kEos;

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

const std::vector<std::string> kModels = {"lm", "seq2seq", "encoder"};

// The argmax of the model's teacher-forced logits at each target position (the non-ignored labels of its own
// batch framing) for a source and a target: for the autoregressive models the target is what was decoded before
// (so position j predicts decoded token j); the encoder-only model's logits do not depend on the target.
std::vector<int64_t> teacher_forced_argmax(nn::SequenceModel& m, const Example& e) {
  NoGradGuard no_grad;
  m.eval();
  const nn::SequenceBatch b = m.make_batch({e});
  const Tensor logits = m.forward_batch(b);  // (1, T, V)
  m.train();
  const int64_t T = logits.size(1), V = logits.size(2);
  std::vector<int64_t> out;
  for (int64_t p = 0; p < T; ++p) {
    if (b.target.data<int64_t>()[p] == m.special_tokens().ignore_index) continue;
    const float* x = logits.data<float>() + p * V;
    out.push_back(std::max_element(x, x + V) - x);
  }
  return out;
}

TokenRows sources_of(const std::vector<Example>& ex) {
  TokenRows s;
  for (const Example& e : ex) s.push_back(e.src);
  return s;
}

// ---------------------------------------------------------------------------------------------
// Decoding

TEST(GreedyDecode, AgreesWithTeacherForcedArgmax) {
  for (const std::string& model : kModels) {
    SCOPED_TRACE(model);
    Trainer& t = trained(model);
    nn::SequenceModel& m = t.model();
    const std::vector<Example> ex = t.heldout_examples(40);
    const TokenRows rows = greedy_decode(m, sources_of(ex), 5);
    ASSERT_EQ(rows.size(), ex.size());
    for (size_t i = 0; i < ex.size(); ++i) {
      ASSERT_FALSE(rows[i].empty());
      Example e{ex[i].src, {rows[i].begin(), rows[i].end() - 1}};
      if (model == "encoder") e.tgt = e.src;  // its framing needs |tgt| == |src|; the logits ignore tgt
      const std::vector<int64_t> want = teacher_forced_argmax(m, e);
      ASSERT_GE(want.size(), rows[i].size());
      for (size_t j = 0; j < rows[i].size(); ++j) EXPECT_EQ(want[j], rows[i][j]) << "example " << i << " position " << j;
    }
  }
}

TEST(GreedyDecode, StopsAtEosAndSolvesTheTask) {
  for (const std::string& model : kModels) {
    SCOPED_TRACE(model);
    Trainer& t = trained(model);
    const std::vector<Example> ex = t.heldout_examples(50);
    const TokenRows rows = greedy_decode(t.model(), sources_of(ex), 5);
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
  for (const std::string& model : kModels) {
    SCOPED_TRACE(model);
    Trainer& t = trained(model);
    const std::vector<Example> ex = t.heldout_examples(30);
    for (int64_t budget : {1, 2, 3}) {
      const TokenRows rows = greedy_decode(t.model(), sources_of(ex), budget);
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
  for (const std::string& model : kModels) {
    SCOPED_TRACE(model);
    Trainer& t = trained(model, 60);  // partly trained: rows of different lengths, some without EOS
    const std::vector<Example> ex = t.heldout_examples(20);
    const TokenRows batched = greedy_decode(t.model(), sources_of(ex), 5);
    for (size_t i = 0; i < ex.size(); ++i)
      EXPECT_EQ(greedy_decode(t.model(), {ex[i].src}, 5)[0], batched[i]) << "example " << i;
  }
}

TEST(GreedyDecode, KeyValueCacheGivesTheSameTokensAsRecomputing) {
  // Trained models (rows stop at EOS at different steps, mixed source lengths 1..4) and one trained for a single step
  // kind (rows rarely stop: the whole budget): the cached decode (the default) and DecodeOptions{.use_cache = false}
  // give the same rows; so do evaluate's results. The encoder-only model has no cache (it decodes in one pass).
  for (const std::string& model : kModels) {
    SCOPED_TRACE(model);
    for (int64_t steps : {int64_t{300}, int64_t{1}}) {
      Trainer& t = trained(model, steps);
      const std::vector<Example> ex = t.heldout_examples(60);
      const TokenRows cached = greedy_decode(t.model(), sources_of(ex), 5);
      const TokenRows full = greedy_decode(t.model(), sources_of(ex), 5, {.use_cache = false});
      EXPECT_EQ(cached, full);
      const EvalResult a = evaluate(t.model(), ex, 7), b = evaluate(t.model(), ex, 7, {.use_cache = false});
      EXPECT_EQ(a.token_accuracy, b.token_accuracy);
      EXPECT_EQ(a.sequence_accuracy, b.sequence_accuracy);
      EXPECT_EQ(a.loss, b.loss);  // the teacher-forced loss does not decode: bitwise
      EXPECT_EQ(t.predict(ex[0].src), t.predict(ex[0].src, {.use_cache = false}));
      const EvalResult c = t.evaluate(50), d = t.evaluate(50, {.use_cache = false});
      EXPECT_EQ(c.token_accuracy, d.token_accuracy);
    }
  }
}

TEST(GreedyDecode, LeavesModeAndGradientsAlone) {
  for (const std::string& model : kModels) {
    SCOPED_TRACE(model);
    nn::SequenceModel& m = trained(model).model();
    m.train();
    m.zero_grad(true);
    greedy_decode(m, {{data::kFirstSymbol}}, 3);
    EXPECT_TRUE(m.is_training());
    for (const auto& [name, p] : m.named_parameters()) EXPECT_FALSE(p.grad().defined()) << name;
    m.eval();
    greedy_decode(m, {{data::kFirstSymbol}}, 3);
    EXPECT_FALSE(m.is_training());
    m.train();
  }
}

TEST(GreedyDecode, Errors) {
  for (const std::string& model : kModels) {
    SCOPED_TRACE(model);
    Trainer& t = trained(model, 1);
    nn::SequenceModel& m = t.model();
    // copy with max_len 4: sources of at most 4 tokens, targets of at most 4 + EOS.
    EXPECT_ATTO_ERROR(greedy_decode(m, {{5}}, 0), "max_new must be in [1, 5] for this " + model + " model, got 0");
    EXPECT_ATTO_ERROR(greedy_decode(m, {{5}}, 6), "max_new must be in [1, 5] for this " + model + " model, got 6");
    EXPECT_ATTO_ERROR(greedy_decode(m, {{5}, {5, 99}}, 2), "source 1 has token 99 outside [0, 15)");
    EXPECT_ATTO_ERROR(greedy_decode(m, {{5, 5, 5, 5, 5}}, 2), "source 0 has 5 tokens, more than the model's "
                                                              "max_source_len 4");
    EXPECT_NO_THROW(greedy_decode(m, {{5, 5, 5, 5}}, 5));
    EXPECT_TRUE(greedy_decode(m, {}, 3).empty());
    EXPECT_ATTO_ERROR(t.predict({}), "source length must be in [1, 4], got 0");
    EXPECT_ATTO_ERROR(t.predict({5, 5, 5, 5, 5}), "source length must be in [1, 4], got 5");
  }
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
  for (const std::string& model : kModels) {
    SCOPED_TRACE(model);
    // Partly trained, so the accuracies are strictly between 0 and 1 (the encoder learns copy fastest).
    Trainer& t = trained(model, model == "encoder" ? 4 : 60);
    const std::vector<Example> ex = t.heldout_examples(80);
    // Each example decoded alone with the budget evaluate() gives its batch (longest target + 1 = 5).
    TokenRows rows;
    for (const Example& e : ex) rows.push_back(greedy_decode(t.model(), {e.src}, 5)[0]);
    for (int64_t batch : {int64_t{1}, int64_t{7}, int64_t{250}}) {
      SCOPED_TRACE(batch);
      const EvalResult r = evaluate(t.model(), ex, batch);
      if (batch != 250) continue;  // smaller batches may use a smaller budget per batch (see below)
      expect_hand_count(r, ex, rows);
      EXPECT_GT(r.sequence_accuracy, 0.0);
      EXPECT_LT(r.sequence_accuracy, 1.0);
      EXPECT_GT(r.token_accuracy, r.sequence_accuracy);
    }
    // With batch 1 the budget is that example's target length + 1: rows are cut there.
    const EvalResult one = evaluate(t.model(), ex, 1);
    TokenRows cut = rows;
    for (size_t i = 0; i < ex.size(); ++i) cut[i].resize(std::min(cut[i].size(), ex[i].tgt.size() + 1));
    expect_hand_count(one, ex, cut);
  }
}

TEST(Evaluate, LossIsTheTeacherForcedCrossEntropy) {
  for (const std::string& model : kModels) {
    SCOPED_TRACE(model);
    Trainer& t = trained(model, 60);
    const std::vector<Example> ex = t.heldout_examples(30);
    const EvalResult r = evaluate(t.model(), ex);
    const nn::SequenceBatch b = t.model().make_batch(ex);
    NoGradGuard no_grad;
    t.model().eval();
    const Tensor logits = t.model().forward_batch(b);  // (B, T, V)
    t.model().train();
    const double want = cross_entropy(reshape(logits, {-1, logits.size(-1)}), reshape(b.target, {-1})).item();
    EXPECT_NEAR(r.loss, want, 1e-5 * want);
  }
}

TEST(Evaluate, TrainedModelsScorePerfectlyAndDatasetOverloadIsTheHeldOutSet) {
  for (const std::string& model : kModels) {
    SCOPED_TRACE(model);
    Trainer& t = trained(model);
    const EvalResult r = evaluate(t.model(), t.dataset(), 100, 99);
    const EvalResult same = evaluate(t.model(), t.dataset().heldout(100, 99));
    EXPECT_EQ(r.token_accuracy, same.token_accuracy);
    EXPECT_EQ(r.sequence_accuracy, same.sequence_accuracy);
    EXPECT_EQ(r.n, 100);
    EXPECT_GE(r.sequence_accuracy, 0.95);
    EXPECT_GE(r.token_accuracy, 0.97);
  }
}

TEST(Evaluate, Errors) {
  Trainer& t = trained("lm", 1);
  EXPECT_ATTO_ERROR(evaluate(t.model(), std::vector<Example>{}), "no examples to evaluate");
  EXPECT_ATTO_ERROR(evaluate(t.model(), t.heldout_examples(3), 0), "batch must be >= 1, got 0");
  EXPECT_ATTO_ERROR(evaluate(t.model(), t.dataset(), 0, 1), "n must be >= 1, got 0");
}

}  // namespace
}  // namespace attograd::train
