#pragma once
// Greedy decoding and evaluation of the toy-task models (attograd::train).
//
// Both decoders run the model in eval mode under NoGradGuard (the model's training flag is restored on
// return) and decode a whole batch together: every step feeds the tokens so far, takes the argmax of the
// next-token logits (the first maximum on ties, as torch.argmax) and appends it. A row stops after it has
// emitted kEos; the loop stops when every row has stopped or the budget is spent. Each returned row holds
// the generated tokens and ENDS WITH kEos when the model emitted it within the budget (strip_eos removes it).
// There is no key/value cache: step t recomputes the decoder over t tokens, which is cheap at these lengths.
//
// Evaluation decodes greedily and compares the result with the reference position by position:
//   token accuracy    = (positions p < |tgt| + 1 where decoded[p] == (tgt + [EOS])[p]) / sum(|tgt| + 1)
//   sequence accuracy = fraction of examples whose decoded row equals tgt + [EOS] exactly
//   loss              = teacher-forced cross-entropy (no label smoothing), averaged over every target
//                       token including the final EOS
// A missing position (the row stopped early) counts as wrong. The decoding budget of a batch is the longest
// target in it plus one (the EOS), which cannot change whether any row is exactly right.

#include <cstdint>
#include <vector>

#include "autograd/tensor.h"
#include "train/tasks.h"

namespace attograd::nn {
class Transformer;
class CausalLM;
}  // namespace attograd::nn

namespace attograd::train {

/// Token rows, one per sequence.
using TokenRows = std::vector<std::vector<int64_t>>;

/// Greedy decoding with the encoder-decoder: src (B, S) Int64 (right-padded with kPad) is encoded once,
/// then the decoder runs from kBos for at most max_len steps. Row b: up to max_len generated tokens, the last
/// being kEos if the model emitted it. max_len >= 1 and at most the model's n_position.
TokenRows greedy_decode(nn::Transformer& model, const Tensor& src, int64_t max_len);

/// Greedy decoding with the decoder-only model: each prompt (source tokens followed by kSep; lengths may
/// differ) is continued by at most max_new tokens, stopping after kEos. Requires every prompt non-empty with
/// tokens in [0, vocab), and longest prompt + max_new - 1 <= the model's max_len.
TokenRows greedy_decode(nn::CausalLM& model, const TokenRows& prompts, int64_t max_new);

/// The row without its trailing kEos (unchanged when it has none).
std::vector<int64_t> strip_eos(std::vector<int64_t> row);

/// Accuracy and loss of greedy decoding over a set of examples.
struct EvalResult {
  double token_accuracy = 0;     ///< fraction of target positions (final EOS included) decoded right
  double sequence_accuracy = 0;  ///< fraction of examples decoded exactly (target then EOS)
  double loss = 0;               ///< teacher-forced cross-entropy per target token (no label smoothing)
  int64_t n = 0;                 ///< number of examples
};

/// Evaluates the encoder-decoder on `examples`, decoding `batch` examples at a time (grouped by length).
EvalResult evaluate(nn::Transformer& model, const std::vector<data::Example>& examples, int64_t batch = 250);
/// Evaluates the decoder-only model on `examples` (prompt = src + kSep), `batch` at a time.
EvalResult evaluate(nn::CausalLM& model, const std::vector<data::Example>& examples, int64_t batch = 250);
/// Evaluates the encoder-decoder on the next n examples of `dataset` (advances its generator).
EvalResult evaluate(nn::Transformer& model, data::TaskDataset& dataset, int64_t n = 1000, int64_t batch = 250);
/// Evaluates the decoder-only model on the next n examples of `dataset` (advances its generator).
EvalResult evaluate(nn::CausalLM& model, data::TaskDataset& dataset, int64_t n = 1000, int64_t batch = 250);

}  // namespace attograd::train
