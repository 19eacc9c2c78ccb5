// Attention kind "block-sparse": a MultiheadAttention over a BigBird block layout of blocks of `block` positions
// (one local block on each side, the first block global, no random blocks).

#include <algorithm>

#include "nn/attention/builtin.h"

namespace attograd::nn::detail {

AttentionKindEntry block_sparse_attention_kind() {
  return multihead_attention_kind(
      "block-sparse",
      {.description = "block-sparse attention: a BigBird layout of blocks (local 1, global 1)",
       .fields = {"block", "rope"},
       .validate =
           [](const AttentionSpec& s, int64_t) {
             ATTO_CHECK(s.block > 0, "AttentionSpec", "block-sparse attention needs block (--block) > 0, got ",
                        s.block);
           },
       .facts =
           [](const AttentionSpec& s, const AttentionConfig& c) {
             // Causal pairs of the layout (query block r sees key blocks r - 1 .. r + 1 and the global block 0, and
             // block 0 sees every block), restricted to j <= i: the diagonal block its triangle.
             if (s.block <= 0) return softmax_attention_facts(c);  // not valid (validate() says so)
             const int64_t L = c.max_len, b = s.block, nb = (L + b - 1) / b;
             double pairs = 0;
             for (int64_t qb = 0; qb < nb; ++qb) {
               const double rows = static_cast<double>(std::min(L, (qb + 1) * b) - qb * b);
               for (int64_t kb = 0; kb <= qb; ++kb) {
                 if (kb != 0 && kb < qb - 1) kb = qb - 1;  // only blocks 0, qb - 1 and qb are on
                 const double cols = static_cast<double>(std::min(L, (kb + 1) * b) - kb * b);
                 pairs += kb < qb ? rows * cols : rows * (rows + 1) / 2;
               }
             }
             AttentionFacts f = softmax_attention_facts(c, 0, pairs,
                                                        std::min(static_cast<double>(L), static_cast<double>(b)));
             f.own_positions = s.rope;
             f.slides = false;  // the layout is fixed from position 0 (block 0 is global): it cannot slide
             return f;
           },
       .multihead =
           [](const AttentionSpec& s, const AttentionConfig& c) {
             MultiheadAttentionOptions o = base_multihead_options(s, c);
             o.block_size = s.block;
             o.block_global = 1;
             return o;
           }});
}

}  // namespace attograd::nn::detail
