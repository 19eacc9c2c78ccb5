// Attention kind "local": sliding-window attention, a MultiheadAttention whose query i sees keys
// i - window < j <= i.

#include <algorithm>

#include "nn/attention/builtin.h"

namespace attograd::nn::detail {

AttentionKindEntry local_attention_kind() {
  return multihead_attention_kind(
      "local",
      {.description = "sliding-window attention: each query sees the last window keys",
       .fields = {"window", "rope"},
       .validate =
           [](const AttentionSpec& s, int64_t) {
             ATTO_CHECK(s.window > 0, "AttentionSpec", "local attention needs window (--window) > 0, got ", s.window);
           },
       .facts =
           [](const AttentionSpec& s, const AttentionConfig& c) {
             if (s.window <= 0) return softmax_attention_facts(c);  // not valid (validate() says so)
             const double l = static_cast<double>(c.max_len);
             const double w = static_cast<double>(std::min(s.window, c.max_len));
             // Rows 0 .. w-1 see i + 1 keys, the others w.
             AttentionFacts f = softmax_attention_facts(c, 0, w * (w + 1) / 2 + (l - w) * w,
                                                        std::min(l, static_cast<double>(s.window)));
             f.own_positions = s.rope;
             f.slides = true;  // a window of relative positions: its ring keeps min(window, span) slots
             return f;
           },
       .multihead =
           [](const AttentionSpec& s, const AttentionConfig& c) {
             MultiheadAttentionOptions o = base_multihead_options(s, c);
             o.window = s.window;
             return o;
           }});
}

}  // namespace attograd::nn::detail
