#pragma once
// Greedy decoding and evaluation of any sequence model (nn/sequence_model.h) (attograd::train).
//
// Decoding runs the model in eval mode under NoGradGuard (the model's training flag is restored on return) and
// decodes a whole batch together through the model's incremental interface: begin_decode(sources), then
// decode_step(state) for the rows still running (from the model's key/value cache unless DecodeOptions::use_cache
// is false: the same tokens either way), taking the argmax of each row's next-token logits (the first
// maximum on ties, as torch.argmax; a stream model's choice leaves out the reserved ids, see never_emitted; logits
// that are not finite are an Error naming the step). A row stops after it has emitted the model's EOS (a stream
// model's rows never stop: a text stream has no end); the loop stops when every row has stopped or the budget is
// spent. Each returned row holds the generated tokens and ENDS WITH EOS when the model emitted it within the budget
// (strip_eos removes it).
//
// Evaluation decodes greedily and compares the result with the reference position by position:
//   token accuracy    = (positions p < |tgt| + 1 where decoded[p] == (tgt + [EOS])[p]) / sum(|tgt| + 1)
//   sequence accuracy = fraction of examples whose decoded row equals tgt + [EOS] exactly
//   loss              = teacher-forced cross-entropy (no label smoothing) of the model's own batch framing,
//                       averaged over every target token including the final EOS
// A missing position (the row stopped early) counts as wrong. The decoding budget of a batch is the longest
// target in it plus one (the EOS), which cannot change whether any row is exactly right.

#include <cstdint>
#include <functional>
#include <vector>

#include "autograd/random.h"

#include "autograd/tensor.h"
#include "nn/sequence_model.h"
#include "train/data/dataset.h"

namespace attograd::train {

/// Token rows, one per sequence.
using TokenRows = nn::TokenRows;

/// How greedy decoding runs the model.
struct DecodeOptions {
  bool use_cache = true;  ///< decode from the model's key/value cache (false: recompute every step, the reference)
};

/// Greedy decoding: each source (token ids without specials; lengths may differ) is continued by at most
/// max_new tokens, stopping after EOS. Requires max_new in [1, model.max_decode_len()], every source within the
/// model's max_source_len with tokens in [0, vocab).
TokenRows greedy_decode(nn::SequenceModel& model, const TokenRows& sources, int64_t max_new,
                        const DecodeOptions& options = {});

/// The row without its trailing EOS token `eos` (unchanged when it has none).
std::vector<int64_t> strip_eos(std::vector<int64_t> row, int64_t eos = nn::SpecialTokens{}.eos);

/// Accuracy and loss of greedy decoding over a set of examples.
struct EvalResult {
  double token_accuracy = 0;     ///< fraction of target positions (final EOS included) decoded right
  double sequence_accuracy = 0;  ///< fraction of examples decoded exactly (target then EOS)
  double loss = 0;               ///< teacher-forced cross-entropy per target token (no label smoothing)
  int64_t n = 0;                 ///< number of examples
  double nats = 0;               ///< the summed cross-entropy of every target token (loss = nats / their count)
  double bits_per_byte = 0;      ///< a text's: nats / ln 2 / the targets' UTF-8 bytes (0: unknown; bits_per_byte())
};

/// Evaluates a model on `examples`, decoding `batch` examples at a time (grouped by length).
EvalResult evaluate(nn::SequenceModel& model, const std::vector<data::Example>& examples, int64_t batch = 250,
                    const DecodeOptions& options = {});
/// The teacher-forced cross-entropy per target token (no label smoothing, no decoding) of `examples`, `batch` at a
/// time, in eval mode without gradients: nanoGPT's estimate_loss for one split.
double teacher_forced_loss(nn::SequenceModel& model, const std::vector<data::Example>& examples, int64_t batch);
/// The bits per byte of a stream model's evaluation `r` of `examples`: r.nats / ln 2 / the UTF-8 bytes of every
/// target token (each window's tokens after its first, dataset.token_bytes()); 0 when the dataset does not know
/// its tokens' bytes (their sum is 0).
double bits_per_byte(const EvalResult& r, const std::vector<data::Example>& examples, const data::Dataset& dataset);
/// Evaluates a model on the first n held-out examples of `dataset` for `seed`.
EvalResult evaluate(nn::SequenceModel& model, const data::Dataset& dataset, int64_t n, uint64_t seed,
                    int64_t batch = 250, const DecodeOptions& options = {});

// ---------------------------------------------------------------------------------------------
// Sampling
//
// sample() continues prompts by drawing each next token from the model's distribution, reshaped as Hugging Face's
// generate(do_sample=True) does, in this order:
//   temperature  logits / T (T > 0); T = 0 means greedy: the argmax, no draw (the first maximum on ties)
//   top_k        keep the k largest logits (ties with the k-th kept, as HF's `scores < topk[-1]` mask); 0 = off
//   top_p        of the softmax of what is left, keep the smallest set of most probable tokens whose cumulative
//                probability reaches p (always at least the most probable one); 1 = off
// then one multinomial draw from the renormalised distribution with the caller's Generator (inverse CDF in token
// order from one uniform() draw), so the same generator state gives the same tokens. A stream model
// (ModelSpec::stream) never stops early; other models stop a row after EOS, as greedy decoding. The reserved ids a
// model never emits (never_emitted: every special of a text model; pad, bos and sep of the others) are masked out
// before any of this, as HF's suppress_tokens. Logits that are not finite (NaN, inf) are an Error naming the step
// and the row, in greedy decoding too.

/// How sample() reshapes the next-token distribution (see the section comment).
struct SamplingOptions {
  double temperature = 1.0;  ///< divides the logits; 0: greedy (argmax); must be >= 0 and finite
  int64_t top_k = 0;         ///< keep the k most likely tokens; 0: off
  double top_p = 1.0;        ///< nucleus: keep the most likely tokens up to cumulative probability p, in (0, 1]; 1: off
};

/// Called for every token sample() produces: the row (index into the prompts) and the token.
using TokenCallback = std::function<void(int64_t row, int64_t token)>;

/// The token ids a model never emits when it samples: pad, bos and sep, and for a stream (text) model eos too (a
/// text stream holds no reserved id; another model's eos ends its row). greedy_decode leaves them out for a stream
/// model; sample() for every model.
std::vector<int64_t> never_emitted(const nn::ModelSpec& spec);
/// The distribution sample() draws from for one row of finite logits (V): probabilities summing to 1, 0 for the
/// `masked` ids and where top-k / top-p cut (with temperature 0: 1 at the first maximum of the others). Any
/// temperature > 0 is exact: softmax((z - max) / T), so a tiny one (4.9e-324) splits the mass between the maxima
/// and never overflows. Error on invalid options, a non-finite logit or every token masked.
std::vector<double> sampling_distribution(const Tensor& logits, const SamplingOptions& options,
                                          const std::vector<int64_t>& masked = {});
/// One multinomial draw from `probs` (non-negative, not all zero) with one gen.uniform().
int64_t draw_token(const std::vector<double>& probs, Generator& gen);
/// Continues each prompt (token ids; any length for a stream model, else within max_source_len) by up to max_new
/// tokens (in [1, model.max_decode_len()]) drawn as described above, calling on_token after each token, through the
/// key/value cache unless decode.use_cache is false. Returns the new tokens of each row (ending with EOS when a
/// non-stream model emitted it).
TokenRows sample(nn::SequenceModel& model, const TokenRows& prompts, int64_t max_new, const SamplingOptions& options,
                 Generator& gen, const TokenCallback& on_token = {}, const DecodeOptions& decode = {});

}  // namespace attograd::train
