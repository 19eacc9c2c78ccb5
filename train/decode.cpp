// Greedy decoding (batched, stop at EOS) and accuracy evaluation for the toy-task models.

#include "train/decode.h"

#include <algorithm>
#include <numeric>

#include "autograd/loss.h"
#include "autograd/shape.h"
#include "nn/models.h"

namespace attograd::train {

namespace {

using data::Example;
using data::kBos;
using data::kEos;
using data::kIgnore;
using data::kPad;
using data::kSep;

// Puts a module in eval mode for the scope and restores its training flag afterwards.
class EvalModeGuard {
 public:
  explicit EvalModeGuard(nn::Module& m) : m_(m), was_training_(m.is_training()) { m_.eval(); }
  ~EvalModeGuard() { m_.train(was_training_); }
  EvalModeGuard(const EvalModeGuard&) = delete;
  EvalModeGuard& operator=(const EvalModeGuard&) = delete;

 private:
  nn::Module& m_;
  bool was_training_;
};

// Index of the first maximum of logits[b, pos, :]; logits (B, L, V) float32 or float64.
int64_t argmax_at(const Tensor& logits, int64_t b, int64_t pos) {
  const int64_t L = logits.size(1), V = logits.size(2);
  const int64_t offset = (b * L + pos) * V;
  auto first_max = [&](const auto* p) {
    p += offset;
    int64_t best = 0;
    for (int64_t v = 1; v < V; ++v)
      if (p[v] > p[best]) best = v;
    return best;
  };
  if (logits.dtype() == kFloat32) return first_max(logits.data<float>());
  ATTO_CHECK(logits.dtype() == kFloat64, "greedy_decode", "logits must be float32 or float64, got ",
             dtype_name(logits.dtype()));
  return first_max(logits.data<double>());
}

// An Int64 (rows.size(), width) tensor holding each row's first `width` tokens, right-padded with kPad.
Tensor pack_rows(const std::vector<const std::vector<int64_t>*>& rows, int64_t width) {
  const auto B = static_cast<int64_t>(rows.size());
  Tensor t = full({B, width}, static_cast<double>(kPad), {.dtype = kInt64});  // (B, width)
  int64_t* p = t.data<int64_t>();
  for (int64_t b = 0; b < B; ++b) {
    const auto n = std::min<int64_t>(width, static_cast<int64_t>(rows[b]->size()));
    std::copy(rows[b]->begin(), rows[b]->begin() + n, p + b * width);
  }
  return t;
}

// Summed cross-entropy over the non-ignored targets and their number; logits (B, L, V), target (B, L).
std::pair<double, int64_t> summed_loss(const Tensor& logits, const Tensor& target) {
  const int64_t V = logits.size(2);
  const Tensor loss = cross_entropy(reshape(logits, {-1, V}), reshape(target, {-1}),
                                    {.ignore_index = kIgnore, .reduction = Reduction::Sum});
  const int64_t* t = target.data<int64_t>();
  int64_t count = 0;
  for (int64_t i = 0; i < target.numel(); ++i) count += t[i] != kIgnore;
  return {loss.item(), count};
}

// Decodes and scores one batch of examples with either model.
struct BatchScore {
  TokenRows decoded;
  double loss_sum = 0;
  int64_t loss_count = 0;
};

BatchScore score_batch(nn::Transformer& model, const std::vector<Example>& ex, int64_t max_new) {
  const data::Seq2SeqBatch b = data::make_seq2seq_batch(ex);
  BatchScore s;
  s.decoded = greedy_decode(model, b.src, max_new);
  std::tie(s.loss_sum, s.loss_count) = summed_loss(model.forward(b.src, b.tgt_in), b.tgt_out);  // (B, T, V)
  return s;
}

BatchScore score_batch(nn::CausalLM& model, const std::vector<Example>& ex, int64_t max_new) {
  TokenRows prompts;
  for (const Example& e : ex) {
    prompts.push_back(e.src);
    prompts.back().push_back(kSep);
  }
  const data::LMBatch b = data::make_lm_batch(ex);
  BatchScore s;
  s.decoded = greedy_decode(model, prompts, max_new);
  std::tie(s.loss_sum, s.loss_count) = summed_loss(model.forward(b.input), b.target);  // (B, L, V)
  return s;
}

template <class Model>
EvalResult evaluate_examples(Model& model, const std::vector<Example>& examples, int64_t batch) {
  const char* me = "evaluate";
  ATTO_CHECK(!examples.empty(), me, "no examples to evaluate");
  ATTO_CHECK(batch >= 1, me, "batch must be >= 1, got ", batch);
  NoGradGuard no_grad;
  EvalModeGuard eval_mode(model);

  // Group examples of similar length so that a batch wastes few decoding steps on padding.
  std::vector<size_t> order(examples.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return std::pair(examples[a].src.size(), examples[a].tgt.size()) <
           std::pair(examples[b].src.size(), examples[b].tgt.size());
  });

  double loss_sum = 0;
  int64_t loss_count = 0, tokens_right = 0, tokens_total = 0, sequences_right = 0;
  for (size_t start = 0; start < order.size(); start += static_cast<size_t>(batch)) {
    const size_t end = std::min(order.size(), start + static_cast<size_t>(batch));
    std::vector<Example> ex;
    int64_t max_new = 1;
    for (size_t i = start; i < end; ++i) {
      ex.push_back(examples[order[i]]);
      max_new = std::max<int64_t>(max_new, static_cast<int64_t>(ex.back().tgt.size()) + 1);
    }
    const BatchScore s = score_batch(model, ex, max_new);
    loss_sum += s.loss_sum;
    loss_count += s.loss_count;
    for (size_t i = 0; i < ex.size(); ++i) {
      std::vector<int64_t> want = ex[i].tgt;
      want.push_back(kEos);
      const std::vector<int64_t>& got = s.decoded[i];
      for (size_t p = 0; p < want.size(); ++p) tokens_right += p < got.size() && got[p] == want[p];
      tokens_total += static_cast<int64_t>(want.size());
      sequences_right += got == want;
    }
  }
  const auto n = static_cast<int64_t>(examples.size());
  return {.token_accuracy = static_cast<double>(tokens_right) / static_cast<double>(tokens_total),
          .sequence_accuracy = static_cast<double>(sequences_right) / static_cast<double>(n),
          .loss = loss_count > 0 ? loss_sum / static_cast<double>(loss_count) : 0.0,
          .n = n};
}

std::vector<Example> draw_examples(data::TaskDataset& dataset, int64_t n) {
  ATTO_CHECK(n >= 1, "evaluate", "n must be >= 1, got ", n);
  std::vector<Example> ex;
  ex.reserve(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) ex.push_back(dataset.next_example());
  return ex;
}

}  // namespace

TokenRows greedy_decode(nn::Transformer& model, const Tensor& src, int64_t max_len) {
  const char* me = "greedy_decode";
  ATTO_CHECK(src.defined() && src.dim() == 2 && src.dtype() == kInt64, me, "src must be a (B, S) int64 tensor, got ",
             src.defined() ? cat(shape_str(src.shape()), " ", dtype_name(src.dtype())) : std::string("undefined"));
  ATTO_CHECK(max_len >= 1, me, "max_len must be >= 1, got ", max_len);
  ATTO_CHECK(max_len <= model.options.n_position, me, "max_len ", max_len, " exceeds the model's n_position ",
             model.options.n_position);
  NoGradGuard no_grad;
  EvalModeGuard eval_mode(model);
  const int64_t B = src.size(0);
  TokenRows out(static_cast<size_t>(B));
  if (B == 0) return out;

  const Tensor memory = model.encode(src);  // (B, S, D), computed once
  // tgt[b] = kBos followed by row b's generated tokens (kPad once the row has stopped).
  std::vector<std::vector<int64_t>> tgt(static_cast<size_t>(B), std::vector<int64_t>{kBos});
  std::vector<const std::vector<int64_t>*> rows;
  for (const auto& r : tgt) rows.push_back(&r);
  std::vector<bool> done(static_cast<size_t>(B), false);
  int64_t running = B;
  for (int64_t t = 0; t < max_len && running > 0; ++t) {
    const Tensor logits = model.decode(pack_rows(rows, t + 1), memory, src);  // (B, t + 1, V)
    for (int64_t b = 0; b < B; ++b) {
      const auto ub = static_cast<size_t>(b);
      if (done[ub]) {
        tgt[ub].push_back(kPad);
        continue;
      }
      const int64_t token = argmax_at(logits, b, t);
      out[ub].push_back(token);
      tgt[ub].push_back(token);
      if (token == kEos) {
        done[ub] = true;
        --running;
      }
    }
  }
  return out;
}

TokenRows greedy_decode(nn::CausalLM& model, const TokenRows& prompts, int64_t max_new) {
  const char* me = "greedy_decode";
  ATTO_CHECK(max_new >= 1, me, "max_new must be >= 1, got ", max_new);
  const int64_t vocab = model.options.vocab;
  int64_t longest = 0;
  for (size_t b = 0; b < prompts.size(); ++b) {
    ATTO_CHECK(!prompts[b].empty(), me, "prompt ", b, " is empty");
    for (int64_t t : prompts[b])
      ATTO_CHECK(t >= 0 && t < vocab, me, "prompt ", b, " has token ", t, " outside [0, ", vocab, ")");
    longest = std::max<int64_t>(longest, static_cast<int64_t>(prompts[b].size()));
  }
  ATTO_CHECK(longest + max_new - 1 <= model.options.max_len, me, "longest prompt (", longest, ") + max_new (",
             max_new, ") - 1 exceeds the model's max_len ", model.options.max_len);
  NoGradGuard no_grad;
  EvalModeGuard eval_mode(model);
  const auto B = static_cast<int64_t>(prompts.size());
  TokenRows out(static_cast<size_t>(B));
  TokenRows seq = prompts;  // prompt + generated tokens
  std::vector<int64_t> active(static_cast<size_t>(B));
  std::iota(active.begin(), active.end(), int64_t{0});
  for (int64_t step = 0; step < max_new && !active.empty(); ++step) {
    // Only running rows are fed, each right-padded to the longest: with the causal mask the padding after
    // a row's last token cannot change that token's logits.
    std::vector<const std::vector<int64_t>*> rows;
    int64_t width = 0;
    for (int64_t b : active) {
      rows.push_back(&seq[static_cast<size_t>(b)]);
      width = std::max<int64_t>(width, static_cast<int64_t>(rows.back()->size()));
    }
    const Tensor logits = model.forward(pack_rows(rows, width));  // (active, width, V)
    std::vector<int64_t> still;
    for (size_t i = 0; i < active.size(); ++i) {
      const auto ub = static_cast<size_t>(active[i]);
      const int64_t token = argmax_at(logits, static_cast<int64_t>(i), static_cast<int64_t>(seq[ub].size()) - 1);
      out[ub].push_back(token);
      seq[ub].push_back(token);
      if (token != kEos) still.push_back(active[i]);
    }
    active = std::move(still);
  }
  return out;
}

std::vector<int64_t> strip_eos(std::vector<int64_t> row) {
  if (!row.empty() && row.back() == kEos) row.pop_back();
  return row;
}

EvalResult evaluate(nn::Transformer& model, const std::vector<Example>& examples, int64_t batch) {
  return evaluate_examples(model, examples, batch);
}

EvalResult evaluate(nn::CausalLM& model, const std::vector<Example>& examples, int64_t batch) {
  return evaluate_examples(model, examples, batch);
}

EvalResult evaluate(nn::Transformer& model, data::TaskDataset& dataset, int64_t n, int64_t batch) {
  return evaluate_examples(model, draw_examples(dataset, n), batch);
}

EvalResult evaluate(nn::CausalLM& model, data::TaskDataset& dataset, int64_t n, int64_t batch) {
  return evaluate_examples(model, draw_examples(dataset, n), batch);
}

}  // namespace attograd::train
