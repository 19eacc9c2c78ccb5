#include "nn/attention.h"

#include <cmath>
#include <limits>
#include <type_traits>

#include "autograd/attention.h"
#include "autograd/matmul.h"
#include "autograd/reduce.h"
#include "autograd/shape.h"
#include "nn/init.h"

namespace attograd::nn {

namespace {

constexpr const char* kMha = "MultiheadAttention";
constexpr const char* kSeed = "MultiHeadAttention";

// Writes the masks of one score row (b, h, i) into row[0, Lk): float masks are added, Bool masks and the causal
// mask block (true, or -inf for a float row). row[Lk, tk) (bias_kv / zero-attn keys) stays open.
template <class T>
void fill_mask_row(T* row, int64_t tk, int64_t Lk, const Tensor& kpm, int64_t kpm_off, const Tensor& am, int64_t am_off,
                   bool causal, int64_t i) {
  constexpr bool kBoolRow = std::is_same_v<T, bool>;
  T blocked;
  if constexpr (kBoolRow)
    blocked = true;
  else
    blocked = -std::numeric_limits<T>::infinity();
  for (int64_t j = 0; j < tk; ++j) row[j] = T(0);
  for (const Tensor* src : {&kpm, &am}) {
    if (!src->defined()) continue;
    const int64_t off = src == &kpm ? kpm_off : am_off;
    if (src->dtype() == kBool) {
      const bool* m = src->data<bool>() + off;
      for (int64_t j = 0; j < Lk; ++j)
        if (m[j]) row[j] = blocked;
    } else if constexpr (!kBoolRow) {
      const T* m = src->data<T>() + off;
      for (int64_t j = 0; j < Lk; ++j) row[j] += m[j];
    }
  }
  if (causal)
    for (int64_t j = i + 1; j < Lk; ++j) row[j] = blocked;
}

// Combines key_padding_mask (B, Lk), attn_mask (Lq, Lk) or (B * H, Lq, Lk) and, when `causal`, the causal mask
// (key j > query i) into one mask (B or 1, H or 1, Lq or 1, Lk + extra) whose `extra` trailing columns are
// open. Bool (true = blocked) when every given mask is Bool, else additive in `dtype` (-inf = blocked).
Tensor combine_masks(const Tensor& kpm, const Tensor& am, bool causal, int64_t B, int64_t H, int64_t Lq, int64_t Lk,
                     int64_t extra, Dtype dtype) {
  const bool am3 = am.defined() && am.dim() == 3;
  const int64_t tb = kpm.defined() || am3 ? B : 1;
  const int64_t th = am3 ? H : 1;
  const int64_t tq = am.defined() || causal ? Lq : 1;
  const int64_t tk = Lk + extra;
  const bool all_bool = (!kpm.defined() || kpm.dtype() == kBool) && (!am.defined() || am.dtype() == kBool);
  Tensor out = empty({tb, th, tq, tk}, {.dtype = all_bool ? kBool : dtype});
  auto fill = [&]<typename T>() {
    T* o = out.data<T>();
    for (int64_t b = 0; b < tb; ++b)
      for (int64_t h = 0; h < th; ++h)
        for (int64_t i = 0; i < tq; ++i) {
          const int64_t am_off = !am.defined() ? 0 : am3 ? ((b * H + h) * Lq + i) * Lk : i * Lk;
          fill_mask_row<T>(o + ((b * th + h) * tq + i) * tk, tk, Lk, kpm, b * Lk, am, am_off, causal, i);
        }
  };
  if (all_bool)
    fill.template operator()<bool>();
  else
    dispatch_float(dtype, kMha, fill);
  return out;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// MultiheadAttention (torch.nn.MultiheadAttention, batch-first)

MultiheadAttention::MultiheadAttention(const MultiheadAttentionOptions& options, Generator& gen) : opts_(options) {
  const int64_t E = opts_.embed_dim, H = opts_.num_heads;
  ATTO_CHECK(E > 0 && H > 0, kMha, "embed_dim and num_heads must be positive, got embed_dim=", E, ", num_heads=", H);
  ATTO_CHECK(E % H == 0, kMha, "embed_dim must be divisible by num_heads, got embed_dim=", E, ", num_heads=", H);
  ATTO_CHECK(opts_.dropout >= 0.0 && opts_.dropout < 1.0, kMha, "dropout must be in [0, 1), got ", opts_.dropout);
  ATTO_CHECK(opts_.kdim >= 0 && opts_.vdim >= 0, kMha,
             "kdim and vdim must be non-negative (0 means embed_dim), got kdim=", opts_.kdim, ", vdim=", opts_.vdim);
  if (opts_.kdim == 0) opts_.kdim = E;
  if (opts_.vdim == 0) opts_.vdim = E;
  same_embed_ = opts_.kdim == E && opts_.vdim == E;

  NoGradGuard no_grad;
  // PyTorch builds out_proj (a Linear: weight, then bias from the generator) before _reset_parameters.
  auto proj = std::make_shared<Linear>(E, E, opts_.bias, gen);
  // Registration order = PyTorch's named_parameters() order (own parameters come before out_proj's).
  if (same_embed_) {
    in_proj_weight = register_parameter("in_proj_weight", empty({3 * E, E}));
  } else {
    q_proj_weight = register_parameter("q_proj_weight", empty({E, E}));
    k_proj_weight = register_parameter("k_proj_weight", empty({E, opts_.kdim}));
    v_proj_weight = register_parameter("v_proj_weight", empty({E, opts_.vdim}));
  }
  if (opts_.bias) in_proj_bias = register_parameter("in_proj_bias", zeros({3 * E}));
  if (opts_.add_bias_kv) {
    bias_k = register_parameter("bias_k", empty({1, 1, E}));
    bias_v = register_parameter("bias_v", empty({1, 1, E}));
  }
  out_proj = register_module("out_proj", proj);

  // _reset_parameters: xavier_uniform_ on the in-projections, zero biases, xavier_normal_ on bias_k / bias_v.
  if (same_embed_) {
    init::xavier_uniform_(in_proj_weight, 1.0, gen);
  } else {
    init::xavier_uniform_(q_proj_weight, 1.0, gen);
    init::xavier_uniform_(k_proj_weight, 1.0, gen);
    init::xavier_uniform_(v_proj_weight, 1.0, gen);
  }
  if (opts_.bias) init::zeros_(out_proj->bias);
  if (opts_.add_bias_kv) {
    init::xavier_normal_(bias_k, 1.0, gen);
    init::xavier_normal_(bias_v, 1.0, gen);
  }
  to(opts_.dtype);  // drawn in float32, then converted (see nn/layers.h)
}

MhaResult MultiheadAttention::forward(const Tensor& query, const Tensor& key, const Tensor& value,
                                      const MhaForwardOptions& opts) {
  const int64_t E = opts_.embed_dim, H = opts_.num_heads;
  ATTO_CHECK(query.defined() && key.defined() && value.defined(), kMha, "query, key and value must be defined");
  const Shape& qs = query.shape();
  const Shape& ks = key.shape();
  const Shape& vs = value.shape();
  ATTO_CHECK(query.dim() == 3 && key.dim() == 3 && value.dim() == 3 && qs[2] == E && ks[2] == opts_.kdim &&
                 vs[2] == opts_.vdim,
             kMha, "expected batch-first query (B, Lq, ", E, "), key (B, Lk, ", opts_.kdim, "), value (B, Lk, ",
             opts_.vdim, "), got query ", qs, ", key ", ks, ", value ", vs);
  ATTO_CHECK(qs[0] == ks[0] && qs[0] == vs[0], kMha, "batch sizes differ: query ", qs, ", key ", ks, ", value ", vs);
  ATTO_CHECK(ks[1] == vs[1], kMha, "key and value lengths differ: key ", ks, ", value ", vs);
  const Dtype dt = out_proj->weight.dtype();
  ATTO_CHECK(query.dtype() == dt && key.dtype() == dt && value.dtype() == dt, kMha, "dtype mismatch: parameters are ",
             dtype_name(dt), ", query ", dtype_name(query.dtype()), ", key ", dtype_name(key.dtype()), ", value ",
             dtype_name(value.dtype()));
  const int64_t B = qs[0], Lq = qs[1], Lk = ks[1];

  // Masks: validated here so that errors name this module and its shapes.
  const Tensor& kpm = opts.key_padding_mask;
  const Tensor& am = opts.attn_mask;
  if (kpm.defined()) {
    ATTO_CHECK(kpm.dtype() == kBool || kpm.dtype() == dt, kMha, "key_padding_mask must be bool or ", dtype_name(dt),
               ", got ", dtype_name(kpm.dtype()), " key_padding_mask ", kpm.shape());
    ATTO_CHECK(kpm.shape() == Shape({B, Lk}), kMha, "key_padding_mask must have shape (B, Lk) = ", Shape({B, Lk}),
               ", got ", kpm.shape(), " (query ", qs, ", key ", ks, ")");
  }
  if (am.defined()) {
    ATTO_CHECK(am.dtype() == kBool || am.dtype() == dt, kMha, "attn_mask must be bool or ", dtype_name(dt), ", got ",
               dtype_name(am.dtype()), " attn_mask ", am.shape());
    ATTO_CHECK(am.shape() == Shape({Lq, Lk}) || am.shape() == Shape({B * H, Lq, Lk}), kMha,
               "attn_mask must have shape (Lq, Lk) = ", Shape({Lq, Lk}),
               " or (B * num_heads, Lq, Lk) = ", Shape({B * H, Lq, Lk}), ", got ", am.shape(), " (query ", qs, ", key ",
               ks, ")");
  }

  // Self-attention (one tensor as query, key and value, no extra keys) projects q, k and v with one GEMM into a
  // packed (B, L, 3E) tensor that the attention reads in place; otherwise three projections (B, L, E) each.
  const int64_t extra = (opts_.add_bias_kv ? 1 : 0) + (opts_.add_zero_attn ? 1 : 0);
  const bool packed = same_embed_ && extra == 0 && query.is_same(key) && key.is_same(value);
  const int64_t Lk2 = Lk + extra;

  // One mask broadcastable to (B, H, Lq, Lk2). The op applies is_causal itself (and skips the blocked
  // blocks) unless extra keys must stay visible, in which case it is folded into the mask.
  AttentionOptions ao;
  const bool fold_causal = opts.is_causal && extra > 0;
  ao.is_causal = opts.is_causal && !fold_causal;
  if (extra == 0 && kpm.defined() != am.defined()) {
    if (kpm.defined())
      ao.attn_mask = reshape(kpm, {B, 1, 1, Lk});
    else
      ao.attn_mask = am.dim() == 3 ? reshape(am, {B, H, Lq, Lk}) : am;
  } else if (kpm.defined() || am.defined() || fold_causal) {
    ao.attn_mask = combine_masks(kpm, am, fold_causal, B, H, Lq, Lk, extra, dt);
  }
  ao.dropout_p = is_training() ? opts_.dropout : 0.0;
  ao.generator = dropout_gen_;
  ao.need_weights = opts.need_weights;

  AttentionResult r;  // output (B, Lq, E), heads side by side
  if (packed) {
    r = packed_self_attention(linear(query, in_proj_weight, in_proj_bias), H, ao);  // qkv (B, L, 3E)
  } else {
    // In-projections: (B, L, features) -> (B, L, E).
    Tensor wq = q_proj_weight, wk = k_proj_weight, wv = v_proj_weight, bq, bk, bv;
    if (same_embed_) {
      std::vector<Tensor> w = split(in_proj_weight, E, 0);
      wq = w[0], wk = w[1], wv = w[2];
    }
    if (opts_.bias) {
      std::vector<Tensor> b = split(in_proj_bias, E, 0);
      bq = b[0], bk = b[1], bv = b[2];
    }
    Tensor q = linear(query, wq, bq);  // (B, Lq, E)
    Tensor k = linear(key, wk, bk);    // (B, Lk, E)
    Tensor v = linear(value, wv, bv);  // (B, Lk, E)
    // Extra keys, in PyTorch's order: bias_k / bias_v, then a zero key / value.
    if (opts_.add_bias_kv) {
      k = cat({k, broadcast_to(bias_k, {B, 1, E})}, 1);
      v = cat({v, broadcast_to(bias_v, {B, 1, E})}, 1);
    }
    if (opts_.add_zero_attn) {
      Tensor z = zeros({B, 1, E}, {.dtype = dt});
      k = cat({k, z}, 1);
      v = cat({v, z}, 1);
    }
    ATTO_CHECK(k.size(1) == Lk2, kMha, "internal error: ", Lk2, " keys expected, got ", k.shape());
    r = multi_head_attention(q, k, v, H, ao);
  }
  MhaResult out;
  out.output = out_proj->forward(r.output);  // (B, Lq, E)
  if (opts.need_weights) out.weights = opts.average_attn_weights ? mean(r.weights, {1}) : r.weights;
  return out;
}

// ---------------------------------------------------------------------------------------------
// MultiHeadAttention (the seed's formulation)

MultiHeadAttention::MultiHeadAttention(int64_t heads, int64_t model, int64_t key_size, int64_t value_size, double p,
                                       Generator& gen, Dtype dtype)
    : n_head(heads), d_model(model), d_k(key_size), d_v(value_size), attn_dropout_(p) {
  ATTO_CHECK(heads > 0 && model > 0 && key_size > 0 && value_size > 0, kSeed,
             "n_head, d_model, d_k and d_v must be positive, got n_head=", heads, ", d_model=", model,
             ", d_k=", key_size, ", d_v=", value_size);
  ATTO_CHECK(p >= 0.0 && p < 1.0, kSeed, "dropout must be in [0, 1), got ", p);
  NoGradGuard no_grad;
  w_qs = register_module("w_qs", std::make_shared<Linear>(model, heads * key_size, false, gen));
  w_ks = register_module("w_ks", std::make_shared<Linear>(model, heads * key_size, false, gen));
  w_vs = register_module("w_vs", std::make_shared<Linear>(model, heads * value_size, false, gen));
  fc = register_module("fc", std::make_shared<Linear>(heads * value_size, model, false, gen));
  dropout = register_module("dropout", std::make_shared<Dropout>(p, default_generator()));
  layer_norm = register_module("layer_norm", std::make_shared<LayerNorm>(model, 1e-6));
  for (Linear* l : {w_qs.get(), w_ks.get(), w_vs.get(), fc.get()}) init::xavier_uniform_(l->weight, 1.0, gen);
  to(dtype);  // drawn in float32, then converted (see nn/layers.h)
}

SeedAttentionResult MultiHeadAttention::forward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask,
                                                bool need_weights) {
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
  AttentionResult r = multi_head_attention(w_qs->forward(q),  // (B, Lq, H d_k)
                                           w_ks->forward(k),  // (B, Lk, H d_k)
                                           w_vs->forward(v),  // (B, Lk, H d_v)
                                           H, ao);            // (B, Lq, H d_v)
  Tensor o = dropout->forward(fc->forward(r.output));  // (B, Lq, d_model)
  return {layer_norm->forward(o + q), r.weights};
}

}  // namespace attograd::nn
