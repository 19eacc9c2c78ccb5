// Attention kind "alibi": ALiBi (Press et al. 2022, "Train Short, Test Long"), a MultiheadAttention whose scores get
// a fixed per-head linear distance penalty, score - slope_h * |q - kv|, with the slopes of autograd/flex.h's
// alibi_slopes(H). Under the causal mask (kv <= q) that is FlexAttention's alibi score_mod, score + slope_h * (kv - q);
// in a bidirectional model (the encoder) the penalty is symmetric. Positions come only from the penalty: the model adds
// no sinusoidal table. Made of a score_mod only (docs/ATTENTION.md, "Score and mask functions").

#include <cstdlib>

#include "autograd/flex.h"
#include "nn/attention/builtin.h"

namespace attograd::nn::detail {

namespace {

// score - slopes[h] * |q - kv| (slopes (H), fixed).
ScoreMod symmetric_alibi(int64_t heads) {
  return {.fn = [](const Score& s, int64_t, int64_t h, int64_t q, int64_t kv, const Captures& c) {
            return s - c[0](h) * static_cast<double>(std::llabs(q - kv));
          },
          .captures = {alibi_slopes(heads)}};
}

}  // namespace

AttentionKindEntry alibi_attention_kind() {
  return multihead_attention_kind(
      "alibi",
      {.description = "ALiBi: a fixed per-head linear distance penalty on the scores instead of a position table",
       .fields = {},
       .facts =
           [](const AttentionSpec&, const AttentionConfig& c) {
             AttentionFacts f = softmax_attention_facts(c);
             f.own_positions = true;  // the penalty is the position signal
             f.slides = true;         // and it reads only the distance q - kv (the ring passes the true one)
             return f;
           },
       .multihead =
           [](const AttentionSpec& s, const AttentionConfig& c) {
             MultiheadAttentionOptions o = base_multihead_options(s, c);
             o.score_mod = symmetric_alibi(c.heads);
             return o;
           }});
}

}  // namespace attograd::nn::detail
