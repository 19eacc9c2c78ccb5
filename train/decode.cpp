// Greedy decoding (batched, stop at EOS) and accuracy evaluation for the toy-task models.

#include "train/decode.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "autograd/loss.h"
#include "autograd/shape.h"
#include "nn/attention.h"

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

// f(p) with p pointing at row i of logits (A, V), float32 or float64.
template <class F>
auto with_row(const Tensor& logits, int64_t i, const char* me, F&& f) {
  const int64_t V = logits.size(1);
  if (logits.dtype() == kFloat32) return f(logits.data<float>() + i * V);
  ATTO_CHECK(logits.dtype() == kFloat64, me, "logits must be float32 or float64, got ", dtype_name(logits.dtype()));
  return f(logits.data<double>() + i * V);
}

// Error naming `where` (the step, the examples) and the first logit of logits (A, V) that is NaN or +inf (row
// numbers from `rows` when given): it has no argmax and no softmax, and index 0 is no answer. -inf is a token the
// model rules out (EncoderTagger past a source's end); a row of nothing else is an error too.
void check_finite_logits(const Tensor& logits, const char* me, const std::string& where,
                         const std::vector<int64_t>* rows = nullptr) {
  const int64_t A = logits.size(0), V = logits.size(1);
  for (int64_t i = 0; i < A; ++i) {
    const int64_t bad = with_row(logits, i, me, [&](const auto* p) {
      bool any = false;
      for (int64_t v = 0; v < V; ++v) {
        if (std::isnan(p[v]) || p[v] > std::numeric_limits<double>::max()) return v;
        any = any || std::isfinite(p[v]);
      }
      return any ? int64_t{-1} : V;
    });
    if (bad < 0) continue;
    const int64_t row = rows ? (*rows)[static_cast<size_t>(i)] : i;
    if (bad == V) throw Error(me, str_cat(where, ": every logit of row ", row, " is -inf: no token to choose"));
    throw Error(me, str_cat(where, ": the model's logits are not finite (",
                            with_row(logits, i, me, [&](const auto* p) { return static_cast<double>(p[bad]); }),
                            " for token ", bad, " of row ", row, "): are its weights and inputs finite?"));
  }
}

// Index of the first maximum of logits[i, :] among the tokens not masked; logits (A, V) float32 or float64, finite.
int64_t argmax_row(const Tensor& logits, int64_t i, const std::vector<char>& masked = {}) {
  const int64_t V = logits.size(1);
  return with_row(logits, i, "greedy_decode", [&](const auto* p) {
    int64_t best = -1;
    for (int64_t v = 0; v < V; ++v)
      if ((masked.empty() || !masked[static_cast<size_t>(v)]) && (best < 0 || p[v] > p[best])) best = v;
    return best;
  });
}

// A mask over the vocabulary: 1 for the ids in `ids` (empty when there are none).
std::vector<char> token_mask(const std::vector<int64_t>& ids, int64_t vocab) {
  std::vector<char> m;
  if (ids.empty()) return m;
  m.assign(static_cast<size_t>(vocab), 0);
  for (int64_t t : ids)
    if (t >= 0 && t < vocab) m[static_cast<size_t>(t)] = 1;
  return m;
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

EvalResult evaluate_examples(nn::SequenceModel& model, const std::vector<Example>& examples, int64_t batch,
                             const DecodeOptions& options) {
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
    const TokenRows decoded = greedy_decode(model, sources, max_new, options);
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
          .n = n,
          .nats = loss_sum};
}

}  // namespace

TokenRows greedy_decode(nn::SequenceModel& model, const TokenRows& sources, int64_t max_new,
                        const DecodeOptions& options) {
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
  const nn::DecodeWeightCache bf16_weights;  // under Autocast: each weight read as bf16, converted once
  TokenRows out(sources.size());
  if (sources.empty()) return out;
  nn::DecodeState st = model.begin_decode(sources);
  st.use_cache = options.use_cache;
  const int64_t eos = spec.specials.eos;
  // A text stream holds no reserved id: the choice is among the others (see never_emitted).
  const std::vector<char> masked = token_mask(spec.stream ? never_emitted(spec) : std::vector<int64_t>{}, spec.vocab);
  for (int64_t step = 0; step < max_new && !st.active.empty(); ++step) {
    const Tensor logits = model.decode_step(st);  // (A, V)
    ATTO_CHECK(logits.dim() == 2 && logits.size(0) == static_cast<int64_t>(st.active.size()) &&
                   logits.size(1) == spec.vocab,
               me, model.kind(), "'s decode_step returned ", logits.shape(), ", expected (", st.active.size(), ", ",
               spec.vocab, ")");
    check_finite_logits(logits, me, str_cat("step ", step), &st.active);
    std::vector<int64_t> still;
    for (size_t i = 0; i < st.active.size(); ++i) {
      const auto ub = static_cast<size_t>(st.active[i]);
      const int64_t token = argmax_row(logits, static_cast<int64_t>(i), masked);
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

EvalResult evaluate(nn::SequenceModel& model, const std::vector<Example>& examples, int64_t batch,
                    const DecodeOptions& options) {
  return evaluate_examples(model, examples, batch, options);
}

double teacher_forced_loss(nn::SequenceModel& model, const std::vector<Example>& examples, int64_t batch) {
  const char* me = "teacher_forced_loss";
  ATTO_CHECK(!examples.empty(), me, "no examples");
  ATTO_CHECK(batch >= 1, me, "batch must be >= 1, got ", batch);
  NoGradGuard no_grad;
  EvalModeGuard eval_mode(model);
  const int64_t ignore = model.special_tokens().ignore_index;
  double loss_sum = 0;
  int64_t count = 0;
  for (size_t start = 0; start < examples.size(); start += static_cast<size_t>(batch)) {
    const size_t end = std::min(examples.size(), start + static_cast<size_t>(batch));
    const nn::SequenceBatch b = model.make_batch({examples.begin() + static_cast<std::ptrdiff_t>(start),
                                                  examples.begin() + static_cast<std::ptrdiff_t>(end)});
    const auto [sum, n] = summed_loss(model.forward_batch(b), b.target, ignore);  // (B, T, V)
    loss_sum += sum;
    count += n;
  }
  return count > 0 ? loss_sum / static_cast<double>(count) : 0.0;
}

double bits_per_byte(const EvalResult& r, const std::vector<Example>& examples, const data::Dataset& dataset) {
  int64_t bytes = 0;
  for (const Example& e : examples) {
    // The stream framing's targets: the window (src then tgt) after its first token.
    for (size_t i = 1; i < e.src.size(); ++i) bytes += dataset.token_bytes(e.src[i]);
    for (size_t i = e.src.empty() ? 1 : 0; i < e.tgt.size(); ++i) bytes += dataset.token_bytes(e.tgt[i]);
  }
  return bytes > 0 ? r.nats / std::log(2.0) / static_cast<double>(bytes) : 0.0;
}

EvalResult evaluate(nn::SequenceModel& model, const data::Dataset& dataset, int64_t n, uint64_t seed, int64_t batch,
                    const DecodeOptions& options) {
  ATTO_CHECK(n >= 1, "evaluate", "n must be >= 1, got ", n);
  const std::vector<Example> examples = dataset.heldout(n, seed);
  EvalResult r = evaluate_examples(model, examples, batch, options);
  if (model.spec().stream) r.bits_per_byte = bits_per_byte(r, examples, dataset);
  return r;
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
    const int64_t B = b.target.size(0), T = b.target.size(1);
    const Tensor flat = reshape(logits, {B * T, logits.size(2)});  // (B*T, V)
    check_finite_logits(flat, "evaluate", str_cat("examples ", start, " to ", end - 1));
    const auto [sum, n] = summed_loss(logits, b.target, ignore);
    loss_sum += sum;
    count += n;
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
          .n = n,
          .nats = loss_sum};
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Sampling

std::vector<int64_t> never_emitted(const nn::ModelSpec& spec) {
  const nn::SpecialTokens& s = spec.specials;
  std::vector<int64_t> ids = {s.pad, s.bos, s.sep};
  if (spec.stream) ids.push_back(s.eos);
  std::sort(ids.begin(), ids.end());
  ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
  std::erase_if(ids, [&](int64_t t) { return t < 0 || t >= spec.vocab; });
  return ids;
}

std::vector<double> sampling_distribution(const Tensor& logits, const SamplingOptions& o,
                                          const std::vector<int64_t>& masked) {
  const char* me = "sample";
  ATTO_CHECK(std::isfinite(o.temperature) && o.temperature >= 0, me, "temperature must be >= 0 and finite, got ",
             o.temperature);
  ATTO_CHECK(o.top_k >= 0, me, "top_k must be >= 0 (0: off), got ", o.top_k);
  ATTO_CHECK(o.top_p > 0 && o.top_p <= 1, me, "top_p must be in (0, 1] (1: off), got ", o.top_p);
  ATTO_CHECK(logits.defined() && logits.dim() == 1 && logits.size(0) >= 1, me,
             "expected one row of logits (V), got shape ", logits.defined() ? logits.shape() : Shape{});
  const int64_t V = logits.size(0);
  std::vector<double> z(static_cast<size_t>(V));
  with_row(reshape(logits, {1, V}), 0, me, [&](const auto* p) {
    std::copy(p, p + V, z.begin());
    return 0;
  });
  std::vector<char> keep(z.size(), 1);
  for (size_t v = 0; v < z.size(); ++v) {
    ATTO_CHECK(!std::isnan(z[v]) && z[v] != std::numeric_limits<double>::infinity(), me, "logit ", v, " is ", z[v],
               ": a distribution needs finite logits (-inf rules a token out)");
    keep[v] = z[v] != -std::numeric_limits<double>::infinity();
  }
  for (int64_t t : masked) {
    ATTO_CHECK(t >= 0 && t < V, me, "masked token ", t, " is outside [0, ", V, ")");
    keep[static_cast<size_t>(t)] = 0;
  }
  const auto kept = static_cast<int64_t>(std::count(keep.begin(), keep.end(), 1));
  ATTO_CHECK(kept > 0, me, "every one of the ", V, " tokens is masked or has logit -inf: nothing to draw");
  // The largest kept logit (the first, for greedy).
  size_t best = 0;
  while (!keep[best]) ++best;
  for (size_t v = best + 1; v < z.size(); ++v)
    if (keep[v] && z[v] > z[best]) best = v;
  std::vector<double> p(z.size(), 0.0);
  if (o.temperature == 0) {  // greedy: the first maximum
    p[best] = 1.0;
    return p;
  }
  // top-k on the logits themselves: dividing by T > 0 keeps their order, and rounding cannot merge two of them.
  if (o.top_k > 0 && o.top_k < kept) {
    std::vector<double> sorted;
    for (size_t v = 0; v < z.size(); ++v)
      if (keep[v]) sorted.push_back(z[v]);
    std::nth_element(sorted.begin(), sorted.begin() + (o.top_k - 1), sorted.end(), std::greater<>());
    const double kth = sorted[static_cast<size_t>(o.top_k - 1)];
    for (size_t v = 0; v < z.size(); ++v)
      if (z[v] < kth) keep[v] = 0;
  }
  // softmax((z - max) / T): z - max <= 0, so any T > 0 (4.9e-324 included) gives exp of a value in [-inf, 0]: no
  // inf - inf, and the maxima keep exp(0) = 1. (z / T - max / T overflows for a tiny T.) Only logits beyond +-9e307
  // make z - max itself overflow: then it is halved first.
  const double mx = z[best], T = o.temperature;
  auto scaled = [&](double x) {
    const double d = x - mx;
    return std::isfinite(d) ? d / T : ((x * 0.5 - mx * 0.5) / T) * 2;
  };
  double total = 0;
  for (size_t v = 0; v < z.size(); ++v) total += p[v] = keep[v] ? std::exp(scaled(z[v])) : 0.0;
  for (double& x : p) x /= total;  // total >= 1: the maximum contributes exp(0)
  if (o.top_p < 1) {
    std::vector<size_t> order(p.size());
    std::iota(order.begin(), order.end(), size_t{0});
    std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return p[a] > p[b]; });
    double cumulative = 0;
    size_t keep_n = 0;
    while (keep_n < order.size() && (keep_n == 0 || cumulative < o.top_p)) cumulative += p[order[keep_n++]];
    for (size_t i = keep_n; i < order.size(); ++i) p[order[i]] = 0;
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
                 Generator& gen, const TokenCallback& on_token, const DecodeOptions& decode) {
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
  const nn::DecodeWeightCache bf16_weights;  // under Autocast: each weight read as bf16, converted once
  if (prompts.empty()) return {};
  nn::DecodeState st = model.begin_decode(prompts);
  st.use_cache = decode.use_cache;
  const int64_t eos = spec.specials.eos;
  const std::vector<int64_t> masked = never_emitted(spec);
  for (int64_t step = 0; step < max_new && !st.active.empty(); ++step) {
    const Tensor logits = model.decode_step(st);  // (A, V)
    ATTO_CHECK(logits.dim() == 2 && logits.size(0) == static_cast<int64_t>(st.active.size()) &&
                   logits.size(1) == spec.vocab,
               me, model.kind(), "'s decode_step returned ", logits.shape(), ", expected (", st.active.size(), ", ",
               spec.vocab, ")");
    check_finite_logits(logits, me, str_cat("step ", step), &st.active);
    std::vector<int64_t> still;
    for (size_t i = 0; i < st.active.size(); ++i) {
      const int64_t row = st.active[i];
      const int64_t token =
          draw_token(sampling_distribution(select(logits, 0, static_cast<int64_t>(i)), options, masked), gen);
      st.decoded[static_cast<size_t>(row)].push_back(token);
      if (on_token) on_token(row, token);
      if (spec.stream || token != eos) still.push_back(row);
    }
    st.active = std::move(still);
  }
  return std::move(st.decoded);
}

}  // namespace attograd::train
