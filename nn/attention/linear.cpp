// Attention kind "linear": causal linear attention (Katharopoulos et al. 2020), a LinearAttention
// (nn/linear_attention.h), and its AttentionLayer implementation.

#include "nn/attention/builtin.h"
#include "nn/linear_attention.h"

namespace attograd::nn {

int64_t LinearAttentionState::bytes() const {
  return static_cast<int64_t>(state.numel() * dtype_size(state.dtype()) +
                              normalizer.numel() * dtype_size(normalizer.dtype()));
}

AttentionOutput LinearAttention::forward(const Tensor& x, const AttentionCall& call) {
  const char* me = "LinearAttention";
  ATTO_CHECK(!call.key_padding_mask.defined(), me,
             "linear attention takes no key padding mask (its running sums have no per-key weights to block)");
  ATTO_CHECK(!call.need_entropy, me,
             "linear attention has no softmax rows, so no attention entropy to track or regularise");
  ATTO_CHECK(call.rope_offset == 0, me, "linear attention has no positions in it, got rope_offset=",
             call.rope_offset);
  ATTO_CHECK(call.window == 0, me, "linear attention has no sliding window (its running sums keep every key), got ",
             "window=", call.window);
  AttentionOutput r{.output = forward(x, x, x, call.is_causal)};  // (B, L, E)
  // The weights the causal form applies to the values, by an explicit path (B, H, L, L), for a figure.
  if (call.need_weights && call.is_causal) r.weights = attention_weights(x);
  return r;
}

std::string LinearAttention::weights_note() const {
  return "linear attention has no softmax and never forms these weights: shown are w_ij = phi(q_i).phi(k_j) / (sum "
         "over j' <= i of phi(q_i).phi(k_j') + eps), phi = elu + 1, computed by an explicit L x L path; the layer's "
         "output per head is exactly sum_j w_ij v_j";
}

std::shared_ptr<AttentionCache> LinearAttention::make_cache(int64_t B, int64_t C) const {
  auto c = std::make_shared<LinearAttentionState>();
  std::tie(c->state, c->normalizer) = make_state(B);
  c->positions = C;
  return c;
}

Tensor LinearAttention::forward_cached(const Tensor& x, AttentionCache& cache, const CachedAttentionRows& rows) {
  auto* c = dynamic_cast<LinearAttentionState*>(&cache);
  ATTO_CHECK(c != nullptr, "LinearAttention::forward_cached", "needs the LinearAttentionState that make_cache gave");
  return decode(x, c->state, c->normalizer, rows);  // (A, N, E)
}

namespace detail {

AttentionKindEntry linear_attention_kind() {
  AttentionFactory factory = [](const AttentionSpec&, const AttentionConfig& c, Generator& gen) {
    return std::make_shared<LinearAttention>(
        LinearAttentionOptions{.embed_dim = c.d_model, .num_heads = c.heads, .bias = c.bias, .causal = true}, gen);
  };
  AttentionKindInfo info{
      .description = "causal linear attention (Katharopoulos et al. 2020): a fixed state per row instead of a cache",
      .validate =
          [](const AttentionSpec& s, int64_t) {
            ATTO_CHECK(!s.rope, "AttentionSpec", "rope applies to softmax attention with a query/key per head; ",
                       "linear attention has no positions in it");
          },
      .facts =
          [](const AttentionSpec&, const AttentionConfig& c) {
            AttentionFacts f = softmax_attention_facts(c);
            const double D = static_cast<double>(c.d_model), H = static_cast<double>(c.heads), d = D / H;
            f.kept_per_row = 0;  // no probabilities
            f.flops = 2 * 2 * static_cast<double>(c.max_len) * D * d;  // k v^T into the state, q times it
            f.cache_per_token = 0;
            f.state_per_row = H * d * (d + 1);
            f.softmax = false;
            f.key_padding = false;  // running sums have no per-key weights to block
            f.slides = false;       // running sums cannot forget the oldest key: past the context it recomputes
            return f;
          }};
  return {"linear", std::move(factory), std::move(info)};
}

}  // namespace detail

}  // namespace attograd::nn
