// Attention kind "softcap": Gemma 2's attention-logit soft-capping, a MultiheadAttention whose scores pass through
// cap * tanh(score / cap) before the softmax (autograd/flex.h's softcap score_mod). The cap is the kind's option "cap"
// (`--attention-options '{"cap": 20}'`; default 50, Gemma 2's attn_logit_softcapping). Positions as mha: the model's
// sinusoidal table, or RoPE with `rope`.

#include <cmath>

#include "autograd/flex.h"
#include "nn/attention/builtin.h"

namespace attograd::nn::detail {

namespace {

constexpr double kDefaultCap = 50.0;  // Gemma 2

}  // namespace

AttentionKindEntry softcap_attention_kind() {
  return multihead_attention_kind(
      "softcap",
      {.description = "tanh soft-capping of the scores (Gemma 2): cap * tanh(score / cap), option cap (default 50)",
       .fields = {"rope"},
       .validate =
           [](const AttentionSpec& s, int64_t) {
             const double cap = attention_option(s, "cap", kDefaultCap);
             ATTO_CHECK(cap > 0 && std::isfinite(cap), "AttentionSpec", "softcap needs options.cap > 0 and finite, got ",
                        cap);
           },
       .facts =
           [](const AttentionSpec& s, const AttentionConfig& c) {
             AttentionFacts f = softmax_attention_facts(c);
             f.own_positions = s.rope;
             f.slides = true;  // the cap is per score: positions as mha (RoPE, relative, or none)
             return f;
           },
       .multihead =
           [](const AttentionSpec& s, const AttentionConfig& c) {
             MultiheadAttentionOptions o = base_multihead_options(s, c);
             o.score_mod = softcap(attention_option(s, "cap", kDefaultCap));
             return o;
           }});
}

}  // namespace attograd::nn::detail
