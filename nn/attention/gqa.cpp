// Attention kind "gqa": grouped-query attention (Ainslie et al. 2023), a MultiheadAttention with kv_heads
// key/value heads (1 = multi-query attention).

#include "nn/attention/builtin.h"

namespace attograd::nn::detail {

AttentionKindEntry gqa_attention_kind() {
  return multihead_attention_kind(
      "gqa",
      {.description = "grouped-query attention: kv_heads key/value heads shared by the query heads",
       .fields = {"kv_heads", "rope"},
       .validate =
           [](const AttentionSpec& s, int64_t heads) {
             ATTO_CHECK(s.kv_heads > 0 && s.kv_heads < heads && heads % s.kv_heads == 0, "AttentionSpec",
                        "gqa needs kv_heads (--kv-heads) dividing heads=", heads, " and below it, got kv_heads=",
                        s.kv_heads);
           },
       .facts =
           [](const AttentionSpec& s, const AttentionConfig& c) {
             AttentionFacts f = softmax_attention_facts(c, s.kv_heads);
             f.own_positions = s.rope;
             f.slides = true;  // as mha: RoPE is relative, or no positions at all
             return f;
           },
       .multihead =
           [](const AttentionSpec& s, const AttentionConfig& c) {
             MultiheadAttentionOptions o = base_multihead_options(s, c);
             o.num_kv_heads = s.kv_heads;
             return o;
           }});
}

}  // namespace attograd::nn::detail
