// The seed's attention sublayer (jadore801120/attention-is-all-you-need-pytorch, transformer/SubLayers.py
// MultiHeadAttention): see nn/seed/attention.h.
#include "nn/seed/attention.h"

#include <cmath>

#include "autograd/attention.h"
#include "autograd/shape.h"
#include "nn/init.h"
#include "nn/masks.h"

namespace attograd::nn::seed {

namespace {

constexpr const char* kSeed = "AttentionSublayer";

}  // namespace

AttentionSublayer::AttentionSublayer(int64_t heads, int64_t model, int64_t key_size, int64_t value_size, double p,
                                     Generator& gen, Dtype dtype, const AttentionSublayerVariants& v)
    : n_head(heads), d_model(model), d_k(key_size), d_v(value_size), variants(v), attn_dropout_(p) {
  ATTO_CHECK(heads > 0 && model > 0 && key_size > 0 && value_size > 0, kSeed,
             "n_head, d_model, d_k and d_v must be positive, got n_head=", heads, ", d_model=", model,
             ", d_k=", key_size, ", d_v=", value_size);
  ATTO_CHECK(p >= 0.0 && p < 1.0, kSeed, "dropout must be in [0, 1), got ", p);
  ATTO_CHECK(v.n_kv_head >= 0 && (v.n_kv_head == 0 || heads % v.n_kv_head == 0) && v.window >= 0 && v.block_size >= 0,
             kSeed, "n_kv_head must divide n_head (0 = n_head), window and block_size be >= 0, got n_kv_head=",
             v.n_kv_head, ", n_head=", heads, ", window=", v.window, ", block_size=", v.block_size);
  if (variants.n_kv_head == 0) variants.n_kv_head = heads;
  const int64_t kv = variants.n_kv_head;
  NoGradGuard no_grad;
  w_qs = register_module("w_qs", std::make_shared<Linear>(model, heads * key_size, false, gen));
  w_ks = register_module("w_ks", std::make_shared<Linear>(model, kv * key_size, false, gen));
  w_vs = register_module("w_vs", std::make_shared<Linear>(model, kv * value_size, false, gen));
  fc = register_module("fc", std::make_shared<Linear>(heads * value_size, model, false, gen));
  dropout = register_module("dropout", std::make_shared<Dropout>(p, default_generator()));
  layer_norm = register_module("layer_norm", std::make_shared<LayerNorm>(model, 1e-6));
  for (Linear* l : {w_qs.get(), w_ks.get(), w_vs.get(), fc.get()}) init::xavier_uniform_(l->weight, 1.0, gen);
  to(dtype);  // drawn in float32, then converted (see nn/layers.h)
}

AttentionSublayerResult AttentionSublayer::forward(const Tensor& q, const Tensor& k, const Tensor& v,
                                                   const Tensor& mask, bool need_weights, bool need_entropy) {
  ATTO_CHECK(q.defined() && k.defined() && v.defined(), kSeed, "q, k and v must be defined");
  const Shape& qs = q.shape();
  const Shape& ks = k.shape();
  const Shape& vs = v.shape();
  ATTO_CHECK(q.dim() == 3 && k.dim() == 3 && v.dim() == 3 && qs[2] == d_model && ks[2] == d_model && vs[2] == d_model,
             kSeed, "expected q (B, Lq, ", d_model, "), k (B, Lk, ", d_model, "), v (B, Lk, ", d_model, "), got q ", qs,
             ", k ", ks, ", v ", vs);
  ATTO_CHECK(qs[0] == ks[0] && qs[0] == vs[0], kSeed, "batch sizes differ: q ", qs, ", k ", ks, ", v ", vs);
  ATTO_CHECK(ks[1] == vs[1], kSeed, "k and v lengths differ: k ", ks, ", v ", vs);
  const Dtype dt = fc->weight.dtype();
  ATTO_CHECK(q.dtype() == dt && k.dtype() == dt && v.dtype() == dt, kSeed, "dtype mismatch: parameters are ",
             dtype_name(dt), ", q ", dtype_name(q.dtype()), ", k ", dtype_name(k.dtype()), ", v ",
             dtype_name(v.dtype()));
  const int64_t B = qs[0], Lq = qs[1], Lk = ks[1], H = n_head;

  Tensor m = mask;
  if (m.defined()) {
    ATTO_CHECK(m.dtype() == kBool || m.dtype() == dt, kSeed, "mask must be bool (true = blocked) or ", dtype_name(dt),
               ", got ", dtype_name(m.dtype()), " mask ", m.shape());
    if (m.dim() == 3) m = unsqueeze(m, 1);  // (B, Lq or 1, Lk) -> (B, 1, Lq or 1, Lk), as the seed does
    const Shape target{B, H, Lq, Lk};
    const Shape& ms = m.shape();
    bool ok = ms.size() >= 2 && ms.size() <= 4;
    for (size_t d = 0; ok && d < ms.size(); ++d) {
      const int64_t md = ms[ms.size() - 1 - d], td = target[3 - d];
      ok = md == td || md == 1;
    }
    ATTO_CHECK(ok, kSeed, "mask of shape ", mask.shape(), " does not broadcast to the scores (B, H, Lq, Lk) = ", target,
               " (expected (B, Lq or 1, Lk), (Lq, Lk) or 4-D; q ", qs, ", k ", ks, ")");
  }

  AttentionOptions ao;
  ao.attn_mask = m;
  ao.dropout_p = is_training() ? attn_dropout_ : 0.0;
  ao.scale = 1.0 / std::sqrt(static_cast<double>(d_k));
  ao.generator = dropout_gen_;
  ao.need_weights = need_weights;
  ao.need_entropy = need_entropy;
  ao.num_kv_heads = variants.n_kv_head;
  ao.window = variants.window;
  if (variants.block_size > 0) {
    const int64_t bs = variants.block_size;
    ao.block_size = bs;
    ao.block_layout = bigbird_block_layout(
        {.q_blocks = (Lq + bs - 1) / bs, .k_blocks = (Lk + bs - 1) / bs, .local_blocks = 1, .global_blocks = 1});
  }
  AttentionResult r = multi_head_attention(w_qs->forward(q),  // (B, Lq, H d_k)
                                           w_ks->forward(k),  // (B, Lk, H_kv d_k)
                                           w_vs->forward(v),  // (B, Lk, H_kv d_v)
                                           H, ao);            // (B, Lq, H d_v)
  Tensor o = dropout->forward(fc->forward(r.output));         // (B, Lq, d_model)
  return {layer_norm->forward(o + q), r.weights, r.entropy};
}

AttentionOutput AttentionSublayer::forward(const Tensor& x, const AttentionCall& call) {
  ATTO_CHECK(x.defined() && x.dim() == 3, kSeed, "expected x (B, L, ", d_model, "), got ",
             x.defined() ? x.shape() : Shape{});
  ATTO_CHECK(call.rope_offset == 0 && call.window == 0, kSeed,
             "attention \"seed-mha\" has no rotary positions or call window, got rope_offset=", call.rope_offset,
             ", window=", call.window);
  const int64_t B = x.size(0), L = x.size(1);
  Tensor mask;  // (B, 1, 1, L), (L, L) or (B, 1, L, L), TRUE = blocked: what the seed's model built
  if (call.key_padding_mask.defined()) {
    const Tensor& kpm = call.key_padding_mask;
    ATTO_CHECK(kpm.dtype() == kBool && kpm.dim() == 2 && kpm.size(0) == B && kpm.size(1) == L, kSeed,
               "key_padding_mask must be Bool (B, L) = ", Shape({B, L}), ", got ", dtype_name(kpm.dtype()), " ",
               kpm.shape());
    mask = reshape(kpm, {B, 1, 1, L});
  }
  if (call.is_causal) mask = mask.defined() ? logical_or(mask, causal_mask(L)) : causal_mask(L);
  AttentionSublayerResult r = forward(x, x, x, mask, call.need_weights, call.need_entropy);
  return {.output = std::move(r.output), .weights = std::move(r.attn), .entropy = std::move(r.entropy)};
}

std::shared_ptr<AttentionCache> AttentionSublayer::make_cache(int64_t B, int64_t C) const {
  if (variants.window > 0 || variants.block_size > 0) return nullptr;
  ATTO_CHECK(B > 0 && C > 0, "AttentionSublayer::make_cache", "B and C must be positive, got B=", B, ", C=", C);
  auto c = std::make_shared<SeedKeyValueCache>();
  std::tie(c->key, c->value) = make_kv_cache(B, variants.n_kv_head, C, d_k, d_v, fc->weight.dtype());
  c->tokens.resize(static_cast<size_t>(B));
  return c;
}

Tensor AttentionSublayer::forward_cached(const Tensor& x, AttentionCache& cache_in, const CachedAttentionRows& rows) {
  const char* me = "AttentionSublayer::forward_cached";
  auto* cache = dynamic_cast<SeedKeyValueCache*>(&cache_in);
  ATTO_CHECK(cache != nullptr, me, "needs the SeedKeyValueCache that make_cache gave");
  if (pad < 0) return forward_cached(x, x, cache->key, cache->value, rows, true);
  // Record the new positions' tokens: a key whose token is the pad is blocked, now and at every later step.
  const auto A = static_cast<int64_t>(rows.cache_row.size());
  const int64_t N = x.size(1);
  const Tensor& t = rows.tokens;
  ATTO_CHECK(t.defined() && t.dtype() == kInt64 && t.dim() == 2 && t.size(0) == A && t.size(1) == N, me,
             "needs the new positions' tokens (A, N) = ", Shape({A, N}), " int64 (CachedAttentionRows::tokens) to ",
             "block the pad token's keys, got ", t.defined() ? t.shape() : Shape{});
  ATTO_CHECK(rows.start.size() == rows.cache_row.size() && rows.count.size() == rows.cache_row.size(), me,
             "cache_row, start and count must have one entry per fed row");
  const int64_t* tp = t.data<int64_t>();
  for (int64_t a = 0; a < A; ++a) {
    const auto ua = static_cast<size_t>(a);
    const int64_t b = rows.cache_row[ua];
    ATTO_CHECK(b >= 0 && b < static_cast<int64_t>(cache->tokens.size()), me, "cache row ", b, " outside [0, ",
               cache->tokens.size(), ")");
    std::vector<int64_t>& kept = cache->tokens[static_cast<size_t>(b)];
    kept.resize(static_cast<size_t>(rows.start[ua]), pad);  // positions not recorded (none when fed in order)
    kept.insert(kept.end(), tp + a * N, tp + a * N + rows.count[ua]);
  }
  return forward_cached(x, x, cache->key, cache->value, rows, true, &cache->tokens, pad);
}

Tensor AttentionSublayer::forward_cached(const Tensor& q, const Tensor& kv, Tensor& key_cache, Tensor& value_cache,
                                         const CachedAttentionRows& rows, bool causal,
                                         const std::vector<std::vector<int64_t>>* key_tokens, int64_t pad) {
  ATTO_CHECK(variants.window == 0 && variants.block_size == 0, kSeed,
             "no cached decoding with a window or block_size (got window=", variants.window, ", block_size=",
             variants.block_size, ")");
  if (kv.defined())
    write_kv_cache(key_cache, value_cache, decode_linear(kv, w_ks->weight), 0, decode_linear(kv, w_vs->weight), 0,
                   rows);
  Tensor heads = cached_attention(decode_linear(q, w_qs->weight), 0, key_cache, value_cache, rows,
                                  1.0 / std::sqrt(static_cast<double>(d_k)), causal, key_tokens, pad,
                                  {.num_heads = n_head});  // (A, N, H d_v)
  return layer_norm->forward(decode_linear(heads, fc->weight) + q);  // (A, N, D); dropout is off in eval mode
}

}  // namespace attograd::nn::seed
