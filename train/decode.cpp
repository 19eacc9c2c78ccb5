// Greedy decoding (batched, stop at EOS) and accuracy evaluation for the toy-task models.

#include "train/decode.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "autograd/loss.h"
#include "autograd/shape.h"

namespace attograd::train {

namespace {

using data::Example;

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

// Index of the first maximum of logits[i, :]; logits (A, V) float32 or float64.
int64_t argmax_row(const Tensor& logits, int64_t i) {
  const int64_t V = logits.size(1);
  auto first_max = [&](const auto* p) {
    p += i * V;
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

// Summed cross-entropy over the non-ignored targets and their number; logits (B, L, V), target (B, L).
std::pair<double, int64_t> summed_loss(const Tensor& logits, const Tensor& target, int64_t ignore_index) {
  const int64_t V = logits.size(2);
  const Tensor loss = cross_entropy(reshape(logits, {-1, V}), reshape(target, {-1}),
                                    {.ignore_index = ignore_index, .reduction = Reduction::Sum});
  const int64_t* t = target.data<int64_t>();
  int64_t count = 0;
  for (int64_t i = 0; i < target.numel(); ++i) count += t[i] != ignore_index;
  return {loss.item(), count};
}

EvalResult evaluate_stream(nn::SequenceModel& model, const std::vector<Example>& examples, int64_t batch);

EvalResult evaluate_examples(nn::SequenceModel& model, const std::vector<Example>& examples, int64_t batch) {
  const char* me = "evaluate";
  ATTO_CHECK(!examples.empty(), me, "no examples to evaluate");
  ATTO_CHECK(batch >= 1, me, "batch must be >= 1, got ", batch);
  if (model.spec().stream) return evaluate_stream(model, examples, batch);
  NoGradGuard no_grad;
  EvalModeGuard eval_mode(model);
  const nn::SpecialTokens eos_ignore = model.special_tokens();

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
    TokenRows sources;
    for (const Example& e : ex) sources.push_back(e.src);
    const TokenRows decoded = greedy_decode(model, sources, max_new);
    const nn::SequenceBatch b = model.make_batch(ex);
    const auto [sum, count] = summed_loss(model.forward_batch(b), b.target, eos_ignore.ignore_index);  // (B, T, V)
    loss_sum += sum;
    loss_count += count;
    for (size_t i = 0; i < ex.size(); ++i) {
      std::vector<int64_t> want = ex[i].tgt;
      want.push_back(eos_ignore.eos);
      const std::vector<int64_t>& got = decoded[i];
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

}  // namespace

TokenRows greedy_decode(nn::SequenceModel& model, const TokenRows& sources, int64_t max_new) {
  const char* me = "greedy_decode";
  ATTO_CHECK(max_new >= 1 && max_new <= model.max_decode_len(), me, "max_new must be in [1, ",
             model.max_decode_len(), "] for this ", model.kind(), " model, got ", max_new);
  const nn::ModelSpec& spec = model.spec();
  for (size_t b = 0; b < sources.size(); ++b) {
    ATTO_CHECK(static_cast<int64_t>(sources[b].size()) <= spec.max_source_len, me, "source ", b, " has ",
               sources[b].size(), " tokens, more than the model's max_source_len ", spec.max_source_len);
    for (int64_t t : sources[b])
      ATTO_CHECK(t >= 0 && t < spec.vocab, me, "source ", b, " has token ", t, " outside [0, ", spec.vocab, ")");
  }
  NoGradGuard no_grad;
  EvalModeGuard eval_mode(model);
  TokenRows out(sources.size());
  if (sources.empty()) return out;
  nn::DecodeState st = model.begin_decode(sources);
  const int64_t eos = spec.specials.eos;
  for (int64_t step = 0; step < max_new && !st.active.empty(); ++step) {
    const Tensor logits = model.decode_step(st);  // (A, V)
    ATTO_CHECK(logits.dim() == 2 && logits.size(0) == static_cast<int64_t>(st.active.size()) &&
                   logits.size(1) == spec.vocab,
               me, model.kind(), "'s decode_step returned ", logits.shape(), ", expected (", st.active.size(), ", ",
               spec.vocab, ")");
    std::vector<int64_t> still;
    for (size_t i = 0; i < st.active.size(); ++i) {
      const auto ub = static_cast<size_t>(st.active[i]);
      const int64_t token = argmax_row(logits, static_cast<int64_t>(i));
      st.decoded[ub].push_back(token);
      if (token != eos || spec.stream) still.push_back(st.active[i]);  // a text stream has no end
    }
    st.active = std::move(still);
  }
  return std::move(st.decoded);
}

std::vector<int64_t> strip_eos(std::vector<int64_t> row, int64_t eos) {
  if (!row.empty() && row.back() == eos) row.pop_back();
  return row;
}

EvalResult evaluate(nn::SequenceModel& model, const std::vector<Example>& examples, int64_t batch) {
  return evaluate_examples(model, examples, batch);
}

EvalResult evaluate(nn::SequenceModel& model, const data::Dataset& dataset, int64_t n, uint64_t seed, int64_t batch) {
  ATTO_CHECK(n >= 1, "evaluate", "n must be >= 1, got ", n);
  return evaluate_examples(model, dataset.heldout(n, seed), batch);
}

}  // namespace attograd::train

// ---------------------------------------------------------------------------------------------
// Evaluation of a stream model: teacher-forced next-token loss and accuracy, no decoding

namespace attograd::train {

namespace {

// Every target position of a stream model's framing: loss, argmax right, and whole windows right.
EvalResult evaluate_stream(nn::SequenceModel& model, const std::vector<Example>& examples, int64_t batch) {
  NoGradGuard no_grad;
  EvalModeGuard eval_mode(model);
  const int64_t ignore = model.special_tokens().ignore_index;
  double loss_sum = 0;
  int64_t count = 0, right = 0, windows_right = 0;
  for (size_t start = 0; start < examples.size(); start += static_cast<size_t>(batch)) {
    const size_t end = std::min(examples.size(), start + static_cast<size_t>(batch));
    const nn::SequenceBatch b = model.make_batch({examples.begin() + static_cast<std::ptrdiff_t>(start),
                                                  examples.begin() + static_cast<std::ptrdiff_t>(end)});
    const Tensor logits = model.forward_batch(b);  // (B, T, V)
    const auto [sum, n] = summed_loss(logits, b.target, ignore);
    loss_sum += sum;
    count += n;
    const int64_t B = b.target.size(0), T = b.target.size(1);
    const Tensor flat = reshape(logits, {B * T, logits.size(2)});  // (B*T, V)
    const int64_t* t = b.target.data<int64_t>();
    for (int64_t i = 0; i < B; ++i) {
      bool all = true;
      for (int64_t p = 0; p < T; ++p) {
        if (t[i * T + p] == ignore) continue;
        const bool ok = argmax_row(flat, i * T + p) == t[i * T + p];
        right += ok;
        all = all && ok;
      }
      windows_right += all;
    }
  }
  const auto n = static_cast<int64_t>(examples.size());
  return {.token_accuracy = count > 0 ? static_cast<double>(right) / static_cast<double>(count) : 0.0,
          .sequence_accuracy = static_cast<double>(windows_right) / static_cast<double>(n),
          .loss = count > 0 ? loss_sum / static_cast<double>(count) : 0.0,
          .n = n};
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Sampling

std::vector<double> sampling_distribution(const Tensor& logits, const SamplingOptions& o) {
  const char* me = "sample";
  ATTO_CHECK(std::isfinite(o.temperature) && o.temperature >= 0, me, "temperature must be >= 0 and finite, got ",
             o.temperature);
  ATTO_CHECK(o.top_k >= 0, me, "top_k must be >= 0 (0: off), got ", o.top_k);
  ATTO_CHECK(o.top_p > 0 && o.top_p <= 1, me, "top_p must be in (0, 1] (1: off), got ", o.top_p);
  ATTO_CHECK(logits.defined() && logits.dim() == 1 && logits.size(0) >= 1, me,
             "expected one row of logits (V), got shape ", logits.defined() ? logits.shape() : Shape{});
  const int64_t V = logits.size(0);
  std::vector<double> z(static_cast<size_t>(V));
  const Tensor& c = logits;
  if (c.dtype() == kFloat32)
    for (int64_t v = 0; v < V; ++v) z[static_cast<size_t>(v)] = c.data<float>()[v];
  else {
    ATTO_CHECK(c.dtype() == kFloat64, me, "logits must be float32 or float64, got ", dtype_name(c.dtype()));
    for (int64_t v = 0; v < V; ++v) z[static_cast<size_t>(v)] = c.data<double>()[v];
  }
  std::vector<double> p(z.size(), 0.0);
  if (o.temperature == 0) {  // greedy: the first maximum
    p[static_cast<size_t>(std::max_element(z.begin(), z.end()) - z.begin())] = 1.0;
    return p;
  }
  constexpr double kMasked = -std::numeric_limits<double>::infinity();
  for (double& x : z) x /= o.temperature;
  if (o.top_k > 0 && o.top_k < V) {
    std::vector<double> sorted = z;
    std::nth_element(sorted.begin(), sorted.begin() + (o.top_k - 1), sorted.end(), std::greater<>());
    const double kth = sorted[static_cast<size_t>(o.top_k - 1)];
    for (double& x : z)
      if (x < kth) x = kMasked;
  }
  const double mx = *std::max_element(z.begin(), z.end());
  double total = 0;
  for (size_t v = 0; v < z.size(); ++v) total += p[v] = z[v] == kMasked ? 0.0 : std::exp(z[v] - mx);
  for (double& x : p) x /= total;
  if (o.top_p < 1) {
    std::vector<size_t> order(p.size());
    std::iota(order.begin(), order.end(), size_t{0});
    std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return p[a] > p[b]; });
    double cumulative = 0;
    size_t keep = 0;
    while (keep < order.size() && (keep == 0 || cumulative < o.top_p)) cumulative += p[order[keep++]];
    for (size_t i = keep; i < order.size(); ++i) p[order[i]] = 0;
    for (double& x : p) x /= cumulative;
  }
  return p;
}

int64_t draw_token(const std::vector<double>& probs, Generator& gen) {
  double total = 0;
  for (double x : probs) {
    ATTO_CHECK(x >= 0 && std::isfinite(x), "sample", "probabilities must be finite and >= 0, got ", x);
    total += x;
  }
  ATTO_CHECK(total > 0, "sample", "every probability is zero");
  const double u = gen.uniform() * total;
  double cumulative = 0;
  int64_t last = 0;
  for (size_t v = 0; v < probs.size(); ++v) {
    if (probs[v] == 0) continue;
    cumulative += probs[v];
    last = static_cast<int64_t>(v);
    if (u < cumulative) return last;
  }
  return last;  // u within rounding of the total
}

TokenRows sample(nn::SequenceModel& model, const TokenRows& prompts, int64_t max_new, const SamplingOptions& options,
                 Generator& gen, const TokenCallback& on_token) {
  const char* me = "sample";
  ATTO_CHECK(max_new >= 1 && max_new <= model.max_decode_len(), me, "max_new must be in [1, ", model.max_decode_len(),
             "] for this ", model.kind(), " model, got ", max_new);
  const nn::ModelSpec& spec = model.spec();
  for (size_t b = 0; b < prompts.size(); ++b) {
    ATTO_CHECK(spec.stream || static_cast<int64_t>(prompts[b].size()) <= spec.max_source_len, me, "prompt ", b,
               " has ", prompts[b].size(), " tokens, more than the model's max_source_len ", spec.max_source_len);
    for (int64_t t : prompts[b])
      ATTO_CHECK(t >= 0 && t < spec.vocab, me, "prompt ", b, " has token ", t, " outside [0, ", spec.vocab, ")");
  }
  (void)sampling_distribution(from_vector(std::vector<double>{0.0}, {1}), options);  // checks the options up front
  NoGradGuard no_grad;
  EvalModeGuard eval_mode(model);
  if (prompts.empty()) return {};
  nn::DecodeState st = model.begin_decode(prompts);
  const int64_t eos = spec.specials.eos;
  for (int64_t step = 0; step < max_new && !st.active.empty(); ++step) {
    const Tensor logits = model.decode_step(st);  // (A, V)
    ATTO_CHECK(logits.dim() == 2 && logits.size(0) == static_cast<int64_t>(st.active.size()) &&
                   logits.size(1) == spec.vocab,
               me, model.kind(), "'s decode_step returned ", logits.shape(), ", expected (", st.active.size(), ", ",
               spec.vocab, ")");
    std::vector<int64_t> still;
    for (size_t i = 0; i < st.active.size(); ++i) {
      const int64_t row = st.active[i];
      const int64_t token = draw_token(sampling_distribution(select(logits, 0, static_cast<int64_t>(i)), options), gen);
      st.decoded[static_cast<size_t>(row)].push_back(token);
      if (on_token) on_token(row, token);
      if (spec.stream || token != eos) still.push_back(row);
    }
    st.active = std::move(still);
  }
  return std::move(st.decoded);
}

}  // namespace attograd::train
