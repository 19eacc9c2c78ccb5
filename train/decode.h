#pragma once
// Greedy decoding and evaluation of any sequence model (nn/sequence_model.h) (attograd::train).
//
// Decoding runs the model in eval mode under NoGradGuard (the model's training flag is restored on return) and
// decodes a whole batch together through the model's incremental interface: begin_decode(sources), then
// decode_step(state) for the rows still running (from the model's key/value cache unless DecodeOptions::use_cache
// is false: the same tokens either way), taking the argmax of each row's next-token logits (the first
// maximum on ties, as torch.argmax). A row stops after it has emitted the model's EOS; the loop stops when every
// row has stopped or the budget is spent. Each returned row holds the generated tokens and ENDS WITH EOS when the
// model emitted it within the budget (strip_eos removes it).
//
// Evaluation decodes greedily and compares the result with the reference position by position:
//   token accuracy    = (positions p < |tgt| + 1 where decoded[p] == (tgt + [EOS])[p]) / sum(|tgt| + 1)
//   sequence accuracy = fraction of examples whose decoded row equals tgt + [EOS] exactly
//   loss              = teacher-forced cross-entropy (no label smoothing) of the model's own batch framing,
//                       averaged over every target token including the final EOS
// A missing position (the row stopped early) counts as wrong. The decoding budget of a batch is the longest
// target in it plus one (the EOS), which cannot change whether any row is exactly right.

#include <cstdint>
#include <vector>

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
};

/// Evaluates a model on `examples`, decoding `batch` examples at a time (grouped by length).
EvalResult evaluate(nn::SequenceModel& model, const std::vector<data::Example>& examples, int64_t batch = 250,
                    const DecodeOptions& options = {});
/// Evaluates a model on the first n held-out examples of `dataset` for `seed`.
EvalResult evaluate(nn::SequenceModel& model, const data::Dataset& dataset, int64_t n, uint64_t seed,
                    int64_t batch = 250, const DecodeOptions& options = {});

}  // namespace attograd::train
