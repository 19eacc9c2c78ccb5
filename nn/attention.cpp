#include "nn/attention.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <new>
#include <type_traits>
#include <unordered_map>
#include <vector>

#include "autograd/activation.h"
#include "autograd/attention.h"
#include "autograd/autocast.h"
#include "autograd/gemm.h"
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
  ATTO_CHECK((!opts_.mask_mod && !opts_.score_mod) || (!opts_.add_bias_kv && !opts_.add_zero_attn), kMha,
             "mask_mod and score_mod do not combine with add_bias_kv / add_zero_attn (their extra keys have no "
             "position), got add_bias_kv=", opts_.add_bias_kv, ", add_zero_attn=", opts_.add_zero_attn);
  ATTO_CHECK((opts_.window == 0 && opts_.block_size == 0) || (!opts_.add_bias_kv && !opts_.add_zero_attn), kMha,
             "window and block_size do not combine with add_bias_kv / add_zero_attn (their extra keys sit outside "
             "every window), got window=", opts_.window, ", block_size=", opts_.block_size);
  const int64_t Ekv = opts_.num_kv_heads * (E / H);  // E unless grouped-query
  if (opts_.rope) {
    ATTO_CHECK((E / H) % 2 == 0, kMha, "rope needs an even head_dim (pairs of features), got embed_dim=", E,
               ", num_heads=", H, ", head_dim=", E / H);
    ATTO_CHECK(!opts_.add_bias_kv && !opts_.add_zero_attn, kMha,
               "rope does not combine with add_bias_kv / add_zero_attn (their extra keys have no position)");
    ATTO_CHECK(opts_.rope_max_len > 0 && opts_.rope_base > 0, kMha, "rope needs rope_max_len > 0 and rope_base > 0, got ",
               "rope_max_len=", opts_.rope_max_len, ", rope_base=", opts_.rope_base);
    rotary_ = std::make_shared<RotaryEmbedding>(E / H, opts_.rope_max_len, opts_.rope_base);
  }

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
  const bool packed = same_embed_ && extra == 0 && query.is_same(key) && key.is_same(value) && !rotary_;
  if (rotary_)
    ATTO_CHECK(Lq == Lk && opts.rope_offset >= 0, kMha, "rope needs one position per query and key (Lq == Lk) and ",
               "rope_offset >= 0, got query ", qs, ", key ", ks, ", rope_offset=", opts.rope_offset);
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
  ao.need_entropy = opts.need_entropy;
  ao.num_kv_heads = Hkv;
  ATTO_CHECK(opts.window >= 0 && (opts.window == 0 || extra == 0), kMha,
             "a call's window must be >= 0 (0 = none) and does not combine with add_bias_kv / add_zero_attn, got ",
             "window=", opts.window);
  ao.window = opts_.window == 0 || opts.window == 0 ? std::max(opts_.window, opts.window)
                                                    : std::min(opts_.window, opts.window);
  if (opts_.mask_mod || opts_.score_mod || opts.mask_mod || opts.score_mod) {  // the mods (autograd/flex.h)
    ATTO_CHECK(extra == 0, kMha, "mask_mod and score_mod do not combine with add_bias_kv / add_zero_attn");
    ATTO_CHECK(opts.mod_q_offset >= 0, kMha, "mod_q_offset must be >= 0, got ", opts.mod_q_offset);
    ao.mask_mod = opts_.mask_mod && opts.mask_mod ? and_masks(opts_.mask_mod, opts.mask_mod)
                  : opts.mask_mod                 ? opts.mask_mod
                                                  : opts_.mask_mod;
    ao.score_mod = compose_score_mods(opts_.score_mod, opts.score_mod);
    ao.mod_q_offset = opts.mod_q_offset;
  }
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
    Tensor q, k, v;
    if (same_embed_ && rotary_ && query.is_same(key) && key.is_same(value)) {
      // RoPE self-attention: one packed projection, split into q (B, L, E), k (B, L, Ekv), v (B, L, Ekv).
      std::vector<Tensor> qkv = split(linear(query, in_proj_weight, in_proj_bias), {E, Ekv, Ekv}, 2);
      q = qkv[0], k = qkv[1], v = qkv[2];
    } else {
      if (same_embed_) {
        std::vector<Tensor> w = Ekv == E ? split(in_proj_weight, E, 0) : split(in_proj_weight, {E, Ekv, Ekv}, 0);
        wq = w[0], wk = w[1], wv = w[2];
      }
      if (opts_.bias) {
        std::vector<Tensor> b = Ekv == E ? split(in_proj_bias, E, 0) : split(in_proj_bias, {E, Ekv, Ekv}, 0);
        bq = b[0], bk = b[1], bv = b[2];
      }
      q = linear(query, wq, bq);  // (B, Lq, E)
      k = linear(key, wk, bk);    // (B, Lk, Ekv)
      v = linear(value, wv, bv);  // (B, Lk, Ekv)
    }
    if (rotary_) {
      q = rotary_->forward(q, opts.rope_offset);  // every head's features rotated at its position
      k = rotary_->forward(k, opts.rope_offset);
    }
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
  out.entropy = r.entropy;  // (B, H, Lq) when need_entropy
  return out;
}

// ---------------------------------------------------------------------------------------------
// Attention with a key/value cache

namespace {

constexpr const char* kCache = "cached_attention";

// 64-byte vectors (one AVX-512 register; GCC splits them where the target has narrower ones).
typedef float Float16 __attribute__((vector_size(64)));
typedef double Double8 __attribute__((vector_size(64)));
template <class T>
struct Vec64;
template <>
struct Vec64<float> {
  using type = Float16;
};
template <>
struct Vec64<double> {
  using type = Double8;
};

// Loads 64 bytes into v (an out-parameter: returning a 64-byte vector by value changes the ABI, and GCC warns,
// where the target has no AVX-512).
template <class V, class T>
void load64(V& v, const T* p) {
  std::memcpy(&v, p, sizeof v);
}

void check_rows(const CachedAttentionRows& r, int64_t A, int64_t N, int64_t B, const char* me) {
  ATTO_CHECK(static_cast<int64_t>(r.cache_row.size()) == A && static_cast<int64_t>(r.start.size()) == A &&
                 static_cast<int64_t>(r.count.size()) == A,
             me, "expected cache_row, start and count for ", A, " rows, got ", r.cache_row.size(), ", ", r.start.size(),
             ", ", r.count.size());
  for (int64_t a = 0; a < A; ++a) {
    const auto ua = static_cast<size_t>(a);
    ATTO_CHECK(r.cache_row[ua] >= 0 && r.cache_row[ua] < B && r.start[ua] >= 0 && r.count[ua] >= 0 && r.count[ua] <= N,
               me, "row ", a, ": cache row ", r.cache_row[ua], " start ", r.start[ua], " count ", r.count[ua],
               " outside a cache of ", B, " rows fed ", N, " positions");
  }
}

}  // namespace

std::pair<Tensor, Tensor> make_kv_cache(int64_t B, int64_t H, int64_t C, int64_t d_k, int64_t d_v, Dtype dtype) {
  ATTO_CHECK(B >= 0 && H > 0 && C >= 0 && d_k > 0 && d_v > 0, "make_kv_cache", "bad sizes B=", B, ", H=", H, ", C=", C,
             ", d_k=", d_k, ", d_v=", d_v);
  return {empty({B, H, d_k, C}, {.dtype = dtype}), empty({B, H, C, d_v}, {.dtype = dtype})};
}

void write_kv_cache(Tensor& key_cache, Tensor& value_cache, const Tensor& k, int64_t k_col, const Tensor& v,
                    int64_t v_col, const CachedAttentionRows& rows, bool ring) {
  const char* me = "write_kv_cache";
  ATTO_CHECK(key_cache.dim() == 4 && value_cache.dim() == 4 && k.dim() == 3 && v.dim() == 3 &&
                 k.dtype() == key_cache.dtype() && v.dtype() == value_cache.dtype(),
             me, "expected caches (B, H, d_k, C), (B, H, C, d_v) and new keys/values (A, N, W) of their dtype, got ",
             key_cache.shape(), ", ", value_cache.shape(), ", ", k.shape(), ", ", v.shape());
  const int64_t B = key_cache.size(0), H = key_cache.size(1), dk = key_cache.size(2), C = key_cache.size(3);
  const int64_t dv = value_cache.size(3);
  const int64_t A = k.size(0), N = k.size(1), Wk = k.size(2), Wv = v.size(2);
  ATTO_CHECK(v.size(0) == A && v.size(1) == N && k_col >= 0 && k_col + H * dk <= Wk && v_col >= 0 &&
                 v_col + H * dv <= Wv && value_cache.size(2) == C,
             me, "keys ", k.shape(), " from feature ", k_col, " and values ", v.shape(), " from feature ", v_col,
             " do not fit caches ", key_cache.shape(), ", ", value_cache.shape());
  check_rows(rows, A, N, B, me);
  dispatch_float(k.dtype(), me, [&]<typename T>() {
    T* kc = key_cache.data<T>();
    T* vc = value_cache.data<T>();
    const T* kp = k.data<T>();
    const T* vp = v.data<T>();
    for (int64_t a = 0; a < A; ++a) {
      const auto ua = static_cast<size_t>(a);
      const int64_t b = rows.cache_row[ua];
      ATTO_CHECK(ring ? rows.count[ua] <= C : rows.start[ua] + rows.count[ua] <= C, me, "row ", a,
                 " writes positions ", rows.start[ua], " .. ", rows.start[ua] + rows.count[ua] - 1, " into a ",
                 ring ? "ring" : "cache", " of ", C, " positions");
      for (int64_t i = 0; i < rows.count[ua]; ++i) {
        const int64_t p = ring ? (rows.start[ua] + i) % C : rows.start[ua] + i;  // the slot
        const T* ks = kp + (a * N + i) * Wk + k_col;
        const T* vs = vp + (a * N + i) * Wv + v_col;
        for (int64_t h = 0; h < H; ++h) {
          T* kd = kc + (b * H + h) * dk * C + p;  // column p of (d_k, C)
          for (int64_t x = 0; x < dk; ++x) kd[x * C] = ks[h * dk + x];
          std::copy(vs + h * dv, vs + (h + 1) * dv, vc + ((b * H + h) * C + p) * dv);
        }
      }
    }
  });
}

Tensor cached_attention(const Tensor& q, int64_t q_col, const Tensor& key_cache, const Tensor& value_cache,
                        const CachedAttentionRows& rows, double scale, bool causal,
                        const std::vector<std::vector<int64_t>>* key_tokens, int64_t pad,
                        const CachedAttentionOptions& variants) {
  ATTO_CHECK(key_cache.dim() == 4 && value_cache.dim() == 4 && q.dim() == 3 && q.dtype() == key_cache.dtype() &&
                 q.dtype() == value_cache.dtype(),
             kCache, "expected queries (A, N, W) and caches (B, H, d_k, C), (B, H, C, d_v) of one dtype, got ",
             q.shape(), ", ", key_cache.shape(), ", ", value_cache.shape());
  const int64_t B = key_cache.size(0), Hkv = key_cache.size(1), dk = key_cache.size(2), C = key_cache.size(3);
  const int64_t dv = value_cache.size(3);
  const int64_t A = q.size(0), N = q.size(1), Wq = q.size(2);
  const int64_t H = variants.num_heads > 0 ? variants.num_heads : Hkv;
  ATTO_CHECK(H % Hkv == 0, kCache, "the cache's ", Hkv, " key/value heads must divide the ", H, " query heads");
  const int64_t group = H / Hkv;  // query heads per cache head
  ATTO_CHECK(q_col >= 0 && q_col + H * dk <= Wq, kCache, "queries ", q.shape(), " from feature ", q_col,
             " do not hold ", H, " heads of ", dk);
  const int64_t window = variants.window, bs = variants.block_size;
  ATTO_CHECK(window >= 0 && bs >= 0 && ((window == 0 && bs == 0) || causal), kCache,
             "window and block_size must be >= 0 and need causal attention, got window=", window, ", block_size=", bs);
  const bool ring = variants.ring;
  ATTO_CHECK(!ring || (causal && window > 0 && window <= C && bs == 0 && key_tokens == nullptr), kCache,
             "a ring cache needs causal attention, 0 < window <= its ", C,
             " slots, no block layout and no key tokens, got causal=", causal, ", window=", window,
             ", block_size=", bs);
  const Tensor& layout = variants.block_layout;
  if (bs > 0)
    ATTO_CHECK(layout.defined() && layout.dtype() == kBool && layout.dim() == 2 && layout.size(0) * bs >= C &&
                   layout.size(1) * bs >= C,
               kCache, "block_layout must be Bool covering ", C, " positions in blocks of ", bs, ", got ",
               layout.defined() ? layout.shape() : Shape{});
  const bool* lay = bs > 0 ? layout.data<bool>() : nullptr;
  const int64_t lay_cols = bs > 0 ? layout.size(1) : 0;
  check_rows(rows, A, N, B, kCache);
  ATTO_CHECK(!key_tokens || static_cast<int64_t>(key_tokens->size()) >= B, kCache, "key_tokens has ",
             key_tokens ? key_tokens->size() : 0, " rows for a cache of ", B);
  Tensor out = zeros({A, N, H * dv}, {.dtype = q.dtype()});  // (A, N, H d_v)
  const MaskFn* mask_fn = variants.mask_mod ? &variants.mask_mod.fn() : nullptr;
  const ScoreFn* score_fn = variants.score_mod ? &variants.score_mod.fn : nullptr;
  ATTO_CHECK(variants.score_mod || variants.score_mod.captures.empty(), kCache,
             "score_mod has captures but no function");
  const Captures caps(variants.score_mod.captures);
  const bool mods = mask_fn || score_fn;
  dispatch_float(q.dtype(), kCache, [&]<typename T>() {
    using V = typename Vec64<T>::type;
    constexpr int64_t kLanes = 64 / sizeof(T);
    const T* qp = q.data<T>();
    const T* kc = key_cache.data<T>();
    const T* vc = value_cache.data<T>();
    T* op = out.data<T>();
    const T s = static_cast<T>(scale);
    std::vector<T> scores(static_cast<size_t>(C));
    std::vector<unsigned char> open(static_cast<size_t>(C), 1);
    // The keys a query sees, as runs [first, last) of cache slots: positions [lo, nk) (the causal rule and the
    // window), cut to the key blocks its layout row allows; keys outside every run are never read. A slot j of a
    // run holds the position j + offset (a ring's positions wrap around its slots; otherwise offset 0).
    struct Run {
      int64_t first, last, offset;
    };
    std::vector<Run> runs;
    runs.reserve(lay != nullptr ? static_cast<size_t>(lay_cols) + 1 : 2);
    for (int64_t a = 0; a < A; ++a) {
      const auto ua = static_cast<size_t>(a);
      const int64_t b = rows.cache_row[ua];
      // a ring's keys: all open; not causal (written_only): the positions written so far; else the whole cache
      const int64_t keys_max = ring ? 0 : causal || variants.written_only ? rows.start[ua] + rows.count[ua] : C;
      ATTO_CHECK(keys_max <= C, kCache, "row ", a, " reads positions up to ", keys_max, " from a cache of ", C);
      for (int64_t j = 0; j < keys_max; ++j) {
        const auto uj = static_cast<size_t>(j);
        const std::vector<int64_t>* kt = key_tokens ? &(*key_tokens)[static_cast<size_t>(b)] : nullptr;
        open[uj] = !kt || (uj < kt->size() && (*kt)[uj] != pad);
      }
      for (int64_t i = 0; i < rows.count[ua]; ++i) {
        const int64_t p = rows.start[ua] + i;     // the query's position
        const int64_t nk = causal ? p + 1 : keys_max;  // keys this query sees: [lo, nk)
        const int64_t lo = window > 0 ? std::max<int64_t>(0, p - window + 1) : 0;
        runs.clear();
        if (ring) {  // positions [lo, nk) (at most C of them) in slots lo mod C, ..., wrapping once at most
          const int64_t first = lo % C, n = nk - lo, head = std::min(n, C - first);
          runs.push_back({first, first + head, lo - first});
          if (head < n) runs.push_back({0, n - head, lo + head});
        } else if (lay == nullptr) {
          if (lo < nk) runs.push_back({lo, nk, 0});
        } else {
          const bool* lrow = lay + (p / bs) * lay_cols;
          for (int64_t kb = lo / bs; kb * bs < nk; ++kb) {
            if (!lrow[kb]) continue;
            const int64_t first = std::max(lo, kb * bs), last = std::min(nk, (kb + 1) * bs);
            if (!runs.empty() && runs.back().last == first)
              runs.back().last = last;
            else
              runs.push_back({first, last, 0});
          }
        }
        for (int64_t h = 0; h < H; ++h) {
          const T* qv = qp + (a * N + i) * Wq + q_col + h * dk;
          const T* kt = kc + (b * Hkv + h / group) * dk * C;  // (d_k, C)
          T* sc = scores.data();
          T m = -std::numeric_limits<T>::infinity();
          for (const auto& [first, last, offset] : runs) {
            // scores[j] = q . k_j over the transposed keys: a vector of kLanes keys at a time accumulates in a
            // register over the d_k features (the keys' columns are contiguous in j).
            int64_t j0 = first;
            for (; j0 + kLanes <= last; j0 += kLanes) {
              V acc = {}, kv;
              for (int64_t x = 0; x < dk; ++x) {
                load64(kv, kt + x * C + j0);
                acc += qv[x] * kv;
              }
              std::memcpy(sc + j0, &acc, sizeof acc);
            }
            for (int64_t j = j0; j < last; ++j) {
              T acc = 0;
              for (int64_t x = 0; x < dk; ++x) acc += qv[x] * kt[x * C + j];
              sc[j] = acc;
            }
            if (mods) {  // the mods at the query's and the key's absolute positions (FlexAttention's arguments)
              for (int64_t j = first; j < last; ++j) {
                T x = -std::numeric_limits<T>::infinity();
                if (open[static_cast<size_t>(j)] && (!mask_fn || (*mask_fn)(b, h, p, j + offset))) {
                  x = sc[j] * s;
                  if (score_fn) {
                    Score sx;
                    sx.v = static_cast<double>(x);
                    sx.ds = 1.0;
                    x = static_cast<T>((*score_fn)(sx, b, h, p, j + offset, caps).v);
                  }
                }
                sc[j] = x;
                m = std::max(m, sc[j]);
              }
              continue;
            }
            for (int64_t j = first; j < last; ++j) {
              sc[j] = open[static_cast<size_t>(j)] ? sc[j] * s : -std::numeric_limits<T>::infinity();
              m = std::max(m, sc[j]);
            }
          }
          if (m == -std::numeric_limits<T>::infinity()) continue;  // every key blocked: zeros
          T sum = 0;
          for (const Run& r : runs)
            for (int64_t j = r.first; j < r.last; ++j) {
              sc[j] = std::exp(sc[j] - m);
              sum += sc[j];
            }
          T* o = op + (a * N + i) * H * dv + h * dv;
          const T* vh = vc + (b * Hkv + h / group) * C * dv;
          const T inv = T(1) / sum;
          // o = (sum_j p_j v_j) / sum, kLanes features at a time accumulated in a register over the keys.
          int64_t y0 = 0;
          for (; y0 + kLanes <= dv; y0 += kLanes) {
            V acc = {}, vv;
            for (const Run& r : runs)
              for (int64_t j = r.first; j < r.last; ++j) {
                load64(vv, vh + j * dv + y0);
                acc += sc[j] * vv;
              }
            acc *= inv;
            std::memcpy(o + y0, &acc, sizeof acc);
          }
          for (int64_t y = y0; y < dv; ++y) {
            T acc = 0;
            for (const Run& r : runs)
              for (int64_t j = r.first; j < r.last; ++j) acc += sc[j] * vh[j * dv + y];
            o[y] = acc * inv;
          }
        }
      }
    }
  });
  return out;
}

void rotate_cached_rows_(Tensor& x, int64_t col, int64_t heads, RotaryEmbedding& rotary,
                         const CachedAttentionRows& rows) {
  const char* me = "rotate_cached_rows_";
  const int64_t d = rotary.head_dim;
  ATTO_CHECK(x.dim() == 3 && col >= 0 && heads > 0 && col + heads * d <= x.size(2), me, "x ", x.shape(),
             " does not hold ", heads, " heads of ", d, " features from feature ", col);
  const int64_t A = x.size(0), N = x.size(1), W = x.size(2);
  check_rows(rows, A, N, std::numeric_limits<int64_t>::max(), me);
  for (int64_t a = 0; a < A; ++a) {
    const auto ua = static_cast<size_t>(a);
    const int64_t count = rows.count[ua], start = rows.start[ua];
    if (count == 0) continue;
    // The row's positions start .. start + count - 1 as one (count, heads * d) slice, rotated by the module (its
    // tables, so bit for bit its forward's values), then written back.
    Tensor slice = narrow(narrow(narrow(x, 0, a, 1), 1, 0, count), 2, col, heads * d);  // a copy
    Tensor r = rotary.forward(slice, start);  // (1, count, heads * d)
    dispatch_float(x.dtype(), me, [&]<typename T>() {
      const T* src = r.data<T>();
      T* dst = x.data<T>();
      for (int64_t i = 0; i < count; ++i)
        std::copy(src + i * heads * d, src + (i + 1) * heads * d, dst + (a * N + i) * W + col);
    });
  }
}

namespace {

// Y (M, N) = X (M, K) W (N, K)^T (+ bias) for a few rows X: a memory-bound product that reads each weight once,
// four weight rows at a time (kept in L1 while every row of X passes), one vector accumulator per output (lanes
// summed in a fixed order at the end, so a row's result does not depend on M).
template <class T>
void matrix_rows(const T* W, const T* X, int64_t M, const T* bias, T* Y, int64_t N, int64_t K) {
  using V = typename Vec64<T>::type;
  constexpr int64_t kLanes = 64 / sizeof(T), kRows = 4;
  const int64_t Kv = K / kLanes * kLanes;
  auto finish = [&](const V& acc, const T* x, int64_t n) {
    T s = 0;
    for (int64_t l = 0; l < kLanes; ++l) s += acc[l];
    const T* w = W + n * K;
    for (int64_t k = Kv; k < K; ++k) s += w[k] * x[k];
    return bias ? s + bias[n] : s;
  };
  int64_t n = 0;
  for (; n + kRows <= N; n += kRows) {
    const T* w = W + n * K;
    // The rows two groups ahead are fetched while these are read (1.2x at D 512 on a Zen 4 core, batch 1).
    const T* next = n + 3 * kRows <= N ? w + 2 * kRows * K : nullptr;
    for (int64_t m = 0; m < M; ++m) {
      const T* x = X + m * K;
      V a0 = {}, a1 = {}, a2 = {}, a3 = {}, xv, wv;
      for (int64_t k = 0; k < Kv; k += kLanes) {
        if (next && m == 0)
          for (int64_t r = 0; r < kRows; ++r) __builtin_prefetch(next + r * K + k);
        load64(xv, x + k);
        load64(wv, w + k);
        a0 += wv * xv;
        load64(wv, w + K + k);
        a1 += wv * xv;
        load64(wv, w + 2 * K + k);
        a2 += wv * xv;
        load64(wv, w + 3 * K + k);
        a3 += wv * xv;
      }
      T* y = Y + m * N + n;
      y[0] = finish(a0, x, n);
      y[1] = finish(a1, x, n + 1);
      y[2] = finish(a2, x, n + 2);
      y[3] = finish(a3, x, n + 3);
    }
  }
  for (; n < N; ++n)
    for (int64_t m = 0; m < M; ++m) {
      const T* x = X + m * K;
      V a = {}, xv, wv;
      for (int64_t k = 0; k < Kv; k += kLanes) {
        load64(xv, x + k);
        load64(wv, W + n * K + k);
        a += wv * xv;
      }
      Y[m * N + n] = finish(a, x, n);
    }
}

// The active DecodeWeightCache of this thread (null: none).
thread_local DecodeWeightCache::Impl* t_weight_cache = nullptr;

}  // namespace

struct DecodeWeightCache::Impl {
  struct Free {
    void operator()(uint16_t* p) const { std::free(p); }
  };
  struct Entry {
    int64_t numel = -1;
    uint32_t version = 0;  // the weight storage's version when converted: a weight changed in place is converted again
    std::unique_ptr<uint16_t[], Free> bits;  // 64-byte aligned: the rows' loads split no cache line more than need be
  };
  std::unordered_map<const void*, Entry> weights;
  // The bf16 bits of `w` (float32, numel values at data), converted on first use.
  const uint16_t* get(const float* data, int64_t numel, uint32_t version) {
    Entry& e = weights[data];
    if (e.numel != numel || e.version != version) {
      const size_t bytes = (static_cast<size_t>(numel) * sizeof(uint16_t) + 63) / 64 * 64;
      e.bits.reset(static_cast<uint16_t*>(std::aligned_alloc(64, std::max<size_t>(bytes, 64))));
      if (!e.bits) throw std::bad_alloc();
      e.numel = numel;
      e.version = version;
      attograd::detail::to_bf16_bits(data, e.bits.get(), numel);
    }
    return e.bits.get();
  }
};

DecodeWeightCache::DecodeWeightCache() : impl_(nullptr), owner_(t_weight_cache == nullptr) {
  if (owner_) t_weight_cache = impl_ = new Impl();
}

DecodeWeightCache::~DecodeWeightCache() {
  if (!owner_) return;
  t_weight_cache = nullptr;
  delete impl_;
}

size_t DecodeWeightCache::size() const { return owner_ ? impl_->weights.size() : t_weight_cache->weights.size(); }

Tensor decode_linear(const Tensor& x, const Tensor& weight, const Tensor& bias) {
  constexpr int64_t kMaxRows = 16;
  const char* me = "decode_linear";
  ATTO_CHECK(x.defined() && weight.defined() && weight.dim() == 2 && x.dim() >= 1 && x.size(-1) == weight.size(1) &&
                 x.dtype() == weight.dtype(),
             me, "expected x (..., K) and weight (N, K) of one dtype, got x ", x.defined() ? x.shape() : Shape{},
             ", weight ", weight.defined() ? weight.shape() : Shape{});
  const int64_t K = weight.size(1), N = weight.size(0);
  const int64_t M = K > 0 ? x.numel() / K : 0;
  const bool grad =
      is_grad_enabled() && (x.requires_grad() || weight.requires_grad() || (bias.defined() && bias.requires_grad()));
  // K = 0 (no input features: every output is the bias) goes to linear() too, which fills it.
  if (M > kMaxRows || K == 0 || grad || (x.dtype() != kFloat32 && x.dtype() != kFloat64))
    return linear(x, weight, bias);
  ATTO_CHECK(!bias.defined() || (bias.dim() == 1 && bias.size(0) == N && bias.dtype() == x.dtype()), me,
             "bias must be (", N, "), got ", bias.shape());
  Shape out_shape = x.shape();
  out_shape.back() = N;
  if (x.dtype() == kFloat32 && autocast_precision() == Precision::bfloat16) {
    // bf16 operands: the cache's bf16 weight read in place, or linear()'s bf16 GEMM without a cache.
    if (t_weight_cache == nullptr) return linear(x, weight, bias);
    Tensor out = empty(out_shape);
    thread_local std::vector<float> xr;
    xr.resize(static_cast<size_t>(M * K));
    attograd::detail::round_bf16(x.data<float>(), xr.data(), M * K);
    const uint16_t* w = t_weight_cache->get(weight.data<float>(), weight.numel(), weight.impl()->storage->version);
    attograd::detail::rows_bf16(w, xr.data(), M, bias.defined() ? bias.data<float>() : nullptr, out.data<float>(), N,
                                K);
    return out;
  }
  Tensor out = empty(out_shape, {.dtype = x.dtype()});
  dispatch_float(x.dtype(), me, [&]<typename T>() {
    const T* b = bias.defined() ? bias.data<T>() : nullptr;
    matrix_rows(weight.data<T>(), x.data<T>(), M, b, out.data<T>(), N, K);
  });
  return out;
}

Tensor decode_feed_forward(const PositionwiseFeedForward& ff, const Tensor& x) {
  ATTO_CHECK(x.defined() && x.dim() >= 1 && x.size(-1) == ff.d_model, ff.type_name(),
             "expected input of shape (..., d_model=", ff.d_model, "), got shape ", x.defined() ? x.shape() : Shape{});
  Tensor h = decode_linear(x, ff.linear1->weight, ff.linear1->bias);  // (..., d_ff)
  const std::string& act = ff.options.activation;
  if (act == "swiglu")
    h = h * sigmoid(h) * decode_linear(x, ff.linear3->weight, ff.linear3->bias);  // silu(linear1 x) * linear3 x
  else
    h = act == "relu" ? relu(h) : gelu(h, act == "gelu-tanh" ? "tanh" : "none");
  Tensor y = decode_linear(h, ff.linear2->weight, ff.linear2->bias);  // (..., d_model)
  return ff.options.residual_norm ? ff.layer_norm->forward(y + x) : y;
}

}  // namespace attograd::nn
