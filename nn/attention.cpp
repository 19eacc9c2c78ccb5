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
  ATTO_CHECK(opts_.num_kv_heads >= 0 && (opts_.num_kv_heads == 0 || H % opts_.num_kv_heads == 0), kMha,
             "num_kv_heads must divide num_heads (0 means num_heads), got num_kv_heads=", opts_.num_kv_heads,
             ", num_heads=", H);
  if (opts_.num_kv_heads == 0) opts_.num_kv_heads = H;
  ATTO_CHECK(opts_.window >= 0 && opts_.block_size >= 0 && opts_.block_local >= 0 && opts_.block_global >= 0 &&
                 opts_.block_random >= 0,
             kMha, "window and the block options must be >= 0, got window=", opts_.window,
             ", block_size=", opts_.block_size, ", block_local=", opts_.block_local, ", block_global=",
             opts_.block_global, ", block_random=", opts_.block_random);
  ATTO_CHECK((opts_.window == 0 && opts_.block_size == 0) || (!opts_.add_bias_kv && !opts_.add_zero_attn), kMha,
             "window and block_size do not combine with add_bias_kv / add_zero_attn (their extra keys sit outside "
             "every window), got window=", opts_.window, ", block_size=", opts_.block_size);
  const int64_t Ekv = opts_.num_kv_heads * (E / H);  // E unless grouped-query

  NoGradGuard no_grad;
  // PyTorch builds out_proj (a Linear: weight, then bias from the generator) before _reset_parameters.
  auto proj = std::make_shared<Linear>(E, E, opts_.bias, gen);
  // Registration order = PyTorch's named_parameters() order (own parameters come before out_proj's).
  if (same_embed_) {
    in_proj_weight = register_parameter("in_proj_weight", empty({E + 2 * Ekv, E}));
  } else {
    q_proj_weight = register_parameter("q_proj_weight", empty({E, E}));
    k_proj_weight = register_parameter("k_proj_weight", empty({Ekv, opts_.kdim}));
    v_proj_weight = register_parameter("v_proj_weight", empty({Ekv, opts_.vdim}));
  }
  if (opts_.bias) in_proj_bias = register_parameter("in_proj_bias", zeros({E + 2 * Ekv}));
  if (opts_.add_bias_kv) {
    bias_k = register_parameter("bias_k", empty({1, 1, Ekv}));
    bias_v = register_parameter("bias_v", empty({1, 1, Ekv}));
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
  const int64_t Hkv = opts_.num_kv_heads, Ekv = Hkv * (E / H);

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
  ao.num_kv_heads = Hkv;
  ao.window = opts_.window;
  if (opts_.block_size > 0) {
    ao.block_size = opts_.block_size;
    ao.block_layout = bigbird_block_layout({.q_blocks = (Lq + opts_.block_size - 1) / opts_.block_size,
                                            .k_blocks = (Lk2 + opts_.block_size - 1) / opts_.block_size,
                                            .local_blocks = opts_.block_local,
                                            .global_blocks = opts_.block_global,
                                            .random_blocks = opts_.block_random,
                                            .seed = opts_.block_seed});
  }

  AttentionResult r;  // output (B, Lq, E), heads side by side
  if (packed) {
    r = packed_self_attention(linear(query, in_proj_weight, in_proj_bias), H, ao);  // qkv (B, L, E + 2 Ekv)
  } else {
    // In-projections: (B, L, features) -> (B, L, E).
    Tensor wq = q_proj_weight, wk = k_proj_weight, wv = v_proj_weight, bq, bk, bv;
    if (same_embed_) {
      std::vector<Tensor> w = Ekv == E ? split(in_proj_weight, E, 0) : split(in_proj_weight, {E, Ekv, Ekv}, 0);
      wq = w[0], wk = w[1], wv = w[2];
    }
    if (opts_.bias) {
      std::vector<Tensor> b = Ekv == E ? split(in_proj_bias, E, 0) : split(in_proj_bias, {E, Ekv, Ekv}, 0);
      bq = b[0], bk = b[1], bv = b[2];
    }
    Tensor q = linear(query, wq, bq);  // (B, Lq, E)
    Tensor k = linear(key, wk, bk);    // (B, Lk, Ekv)
    Tensor v = linear(value, wv, bv);  // (B, Lk, Ekv)
    // Extra keys, in PyTorch's order: bias_k / bias_v, then a zero key / value.
    if (opts_.add_bias_kv) {
      k = cat({k, broadcast_to(bias_k, {B, 1, Ekv})}, 1);
      v = cat({v, broadcast_to(bias_v, {B, 1, Ekv})}, 1);
    }
    if (opts_.add_zero_attn) {
      Tensor z = zeros({B, 1, Ekv}, {.dtype = dt});
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

}  // namespace attograd::nn
