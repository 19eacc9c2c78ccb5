// Attention kind "seed-mha": the seed's attention sublayer (seed::AttentionSublayer, nn/seed/attention.h: bias-free
// w_qs, w_ks, w_vs, fc, the residual and the post-LayerNorm inside), the seq2seq model's self-attention. Its own
// options (AttentionSpec::options): "d_k", "d_v" (per-head sizes; required, as the seq2seq model gives them) and
// "pad" (the token whose keys cached decoding blocks, -1 = none). kv_heads, window and block are the sublayer's
// AttentionSublayerVariants. Internal: its output already holds the residual and the norm, so it is the seq2seq
// model's own kind, not one that --attention offers (AttentionKindInfo::internal).

#include <nlohmann/json.hpp>

#include "nn/attention/builtin.h"
#include "nn/seed/attention.h"

namespace attograd::nn::detail {

namespace {

// The per-head sizes of a spec: options "d_k" and "d_v" (Error when missing: the seq2seq model always gives them).
std::pair<int64_t, int64_t> head_sizes(const AttentionSpec& s) {
  const double dk = attention_option(s, "d_k", 0), dv = attention_option(s, "d_v", 0);
  ATTO_CHECK(dk >= 1 && dv >= 1, "AttentionSpec",
             "attention \"seed-mha\" is the seq2seq model's own layer and needs the options d_k and d_v (positive "
             "per-head sizes), got options ",
             s.options.empty() ? "{}" : s.options);
  return {static_cast<int64_t>(dk), static_cast<int64_t>(dv)};
}

}  // namespace

AttentionKindEntry seed_attention_kind() {
  AttentionFactory factory = [](const AttentionSpec& s, const AttentionConfig& c, Generator& gen) {
    const auto [dk, dv] = head_sizes(s);
    auto a = std::make_shared<seed::AttentionSublayer>(
        c.heads, c.d_model, dk, dv, c.dropout, gen, kFloat32,
        seed::AttentionSublayerVariants{.n_kv_head = s.kv_heads, .window = s.window, .block_size = s.block});
    a->pad = static_cast<int64_t>(attention_option(s, "pad", -1));
    return a;
  };
  return {"seed-mha", std::move(factory),
          {.description = "the seed's attention sublayer (w_qs, w_ks, w_vs, fc, residual and post-LayerNorm inside): "
                          "the seq2seq model's own",
           .fields = {"kv_heads", "window", "block"},
           .validate =
               [](const AttentionSpec& s, int64_t heads) {
                 head_sizes(s);
                 ATTO_CHECK(s.kv_heads == 0 || heads % s.kv_heads == 0, "AttentionSpec",
                            "seed-mha needs kv_heads dividing heads=", heads, " (0 = heads), got kv_heads=",
                            s.kv_heads);
               },
           .facts =
               [](const AttentionSpec& s, const AttentionConfig& c) {
                 const auto [dk, dv] = head_sizes(s);
                 const auto D = static_cast<double>(c.d_model), H = static_cast<double>(c.heads);
                 const double Hkv = s.kv_heads > 0 ? static_cast<double>(s.kv_heads) : H;
                 AttentionFacts f = softmax_attention_facts(c, s.kv_heads);
                 f.weights = D * H * dk + D * Hkv * (dk + dv) + H * dv * D;  // w_qs, w_ks, w_vs, fc
                 f.flops = f.flops / D * H * (static_cast<double>(dk) + static_cast<double>(dv)) / 2;
                 f.cache_per_token = Hkv * static_cast<double>(dk + dv);
                 return f;
               },
           .internal = true}};
}

}  // namespace attograd::nn::detail
