// Multi-head latent attention (see mla.h).

#include "nn/mla.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <utility>
#include <vector>

#include "autograd/activation.h"
#include "autograd/attention.h"
#include "autograd/eigen_util.h"
#include "autograd/elementwise.h"
#include "autograd/matmul.h"
#include "autograd/reduce.h"
#include "autograd/rope.h"
#include "autograd/shape.h"
#include "nn/attention.h"
#include "nn/init.h"

namespace attograd::nn {

// ---------------------------------------------------------------------------------------------
// RMSNorm

RMSNorm::RMSNorm(int64_t dim, double eps_, Dtype dtype) : eps(eps_) {
  ATTO_CHECK(dim > 0, "RMSNorm", "dim must be positive, got ", dim);
  ATTO_CHECK(eps_ > 0, "RMSNorm", "eps must be positive, got ", eps_);
  weight = register_parameter("weight", ones({dim}, {.dtype = dtype}));
}

Tensor RMSNorm::forward(const Tensor& x) {
  ATTO_CHECK(x.defined() && x.dim() >= 1 && x.size(-1) == weight.size(0), "RMSNorm", "input must be (..., ",
             weight.size(0), ")", x.defined() ? str_cat(", got shape ", x.shape()) : std::string());
  Tensor ms = mean(mul(x, x), {-1}, true);
  return mul(mul(x, rdiv(1.0, sqrt(add(ms, eps)))), weight);
}

std::string RMSNorm::extra_repr() const { return str_cat("dim=", weight.size(0), ", eps=", eps); }

// ---------------------------------------------------------------------------------------------
// MultiHeadLatentAttention

namespace {

// A projection without bias whose weight is xavier_uniform_ (gain 1) instead of Linear's default.
std::shared_ptr<Linear> xavier_linear(int64_t in, int64_t out, Generator& gen) {
  auto l = std::make_shared<Linear>(in, out, LinearOptions{.bias = false}, gen);
  init::xavier_uniform_(l->weight, 1.0, gen);
  return l;
}

// The additive causal mask (N, T) of queries at positions start .. start + N - 1 over keys 0 .. T - 1.
template <class T>
Tensor causal_offset_mask(int64_t N, int64_t Tk, int64_t start, Dtype dtype) {
  Tensor m = zeros({N, Tk}, {.dtype = dtype});
  T* p = m.data<T>();
  for (int64_t i = 0; i < N; ++i)
    for (int64_t j = start + i + 1; j < Tk; ++j) p[i * Tk + j] = -std::numeric_limits<T>::infinity();
  return m;
}

// The absorbed path's attention for every fed row, real query and head, reading the cache and wkv_b in place:
//   q' = [q_C,h W_UK,h | q_R,h] (d_c + d_rope), scores = q' [c_KV | k_R]^T * scale over the positions the query sees,
//   o_h = (softmax(scores) c_KV) W_UV,h^T.
// q (A, N, H, d_nope + d_rope), cache (B, C, d_c + d_rope), wkv_b (H (d_nope + d_v), d_c) -> out (A, N, H d_v) (the
// padding positions i >= rows.count[a] are left as they are). All heads of one query at once: scores (H, T) = Q' K^T
// and (H, d_c) = P K_c are two small GEMMs.
template <class T>
void absorbed_attention(const T* q, const T* cache, const T* wkvb, T* out, int64_t N, int64_t C,
                        const CachedAttentionRows& rows, int64_t H, int64_t dn, int64_t dr, int64_t dv, int64_t dc,
                        double scale) {
  using Mat = Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
  using Row = Eigen::Matrix<T, 1, Eigen::Dynamic>;
  const int64_t W = dc + dr, dq = dn + dr;
  int64_t most = 1;  // the most positions any query sees
  for (size_t a = 0; a < rows.start.size(); ++a) most = std::max(most, rows.start[a] + rows.count[a]);
  Mat qq(H, W), sc(H, most), lat(H, dc);  // per decode call, reused by every query
  for (size_t a = 0; a < rows.start.size(); ++a) {
    const int64_t b = rows.cache_row[a], start = rows.start[a];
    const auto ia = static_cast<int64_t>(a);
    for (int64_t i = 0; i < rows.count[a]; ++i) {
      const int64_t nk = start + i + 1;  // positions this query sees
      const T* qi = q + (ia * N + i) * H * dq;
      for (int64_t h = 0; h < H; ++h) {
        Eigen::Map<const Mat> w_uk(wkvb + h * (dn + dv) * dc, dn, dc);
        qq.row(h).head(dc).noalias() = Eigen::Map<const Row>(qi + h * dq, dn) * w_uk;
        qq.row(h).tail(dr) = Eigen::Map<const Row>(qi + h * dq + dn, dr);
      }
      Eigen::Map<const Mat> keys(cache + b * C * W, nk, W);  // rows [c_KV | k_R]
      auto s = sc.leftCols(nk);
      s.noalias() = qq * keys.transpose();
      for (int64_t h = 0; h < H; ++h) {
        auto r = s.row(h);
        r *= static_cast<T>(scale);
        const T m = r.maxCoeff();
        r = (r.array() - m).exp().matrix();
        r /= r.sum();
      }
      lat.noalias() = s * keys.leftCols(dc);  // (H, d_c)
      for (int64_t h = 0; h < H; ++h) {
        Eigen::Map<const Mat> w_uv(wkvb + (h * (dn + dv) + dn) * dc, dv, dc);
        Eigen::Map<Row>(out + ((ia * N + i) * H + h) * dv, dv).noalias() = lat.row(h) * w_uv.transpose();
      }
    }
  }
}

// A decoding step's queries and latents in place, as queries() and latents() compute them: RMSNorm (eps, weight
// w) of n features of each row of q_lat (rows of stride `stride`), then RoPE at positions start .. start + N - 1
// (tables cos, sin (N, d_rope / 2)) of the d_rope features at `col` of each of `groups` groups of `group` features.
template <class T>
void rms_rows(T* p, int64_t rows, int64_t n, int64_t stride, const T* w, double eps) {
  for (int64_t r = 0; r < rows; ++r) {
    T* x = p + r * stride;
    T ss = 0;
    for (int64_t j = 0; j < n; ++j) ss += x[j] * x[j];
    const T inv = T(1) / std::sqrt(ss / static_cast<T>(n) + static_cast<T>(eps));
    for (int64_t j = 0; j < n; ++j) x[j] = x[j] * inv * w[j];
  }
}

// Row a's position i is row first[a] + i of the tables.
template <class T>
void rope_rows(T* p, int64_t A, int64_t N, int64_t groups, int64_t group, int64_t col, int64_t dr,
               const std::vector<int64_t>& first, const T* cos, const T* sin) {
  for (int64_t a = 0; a < A; ++a)
    for (int64_t i = 0; i < N; ++i)
      for (int64_t g = 0; g < groups; ++g) {
        T* x = p + ((a * N + i) * groups + g) * group + col;
        const int64_t t = first[static_cast<size_t>(a)] + i;
        for (int64_t k = 0; k < dr / 2; ++k) {
          const T c = cos[t * dr / 2 + k], s = sin[t * dr / 2 + k], a0 = x[2 * k], e = x[2 * k + 1];
          x[2 * k] = a0 * c - e * s;
          x[2 * k + 1] = a0 * s + e * c;
        }
      }
}

}  // namespace

MultiHeadLatentAttention::MultiHeadLatentAttention(const MlaOptions& options, Generator& gen) : opts_(options) {
  const char* me = "MultiHeadLatentAttention";
  const MlaOptions& o = opts_;
  ATTO_CHECK(o.d_model > 0 && o.n_heads > 0, me, "d_model and n_heads must be positive, got d_model=", o.d_model,
             ", n_heads=", o.n_heads);
  ATTO_CHECK(o.qk_nope_head_dim > 0, me, "qk_nope_head_dim must be positive, got ", o.qk_nope_head_dim);
  ATTO_CHECK(o.qk_rope_head_dim > 0 && o.qk_rope_head_dim % 2 == 0, me,
             "qk_rope_head_dim must be positive and even (RoPE rotates pairs), got ", o.qk_rope_head_dim);
  ATTO_CHECK(o.v_head_dim > 0, me, "v_head_dim must be positive, got ", o.v_head_dim);
  ATTO_CHECK(o.kv_lora_rank > 0, me, "kv_lora_rank must be positive, got ", o.kv_lora_rank);
  ATTO_CHECK(o.q_lora_rank >= 0, me, "q_lora_rank must be >= 0 (0 = no query compression), got ", o.q_lora_rank);
  ATTO_CHECK(o.rope_base > 0, me, "rope_base must be positive, got ", o.rope_base);
  ATTO_CHECK(o.norm_eps > 0, me, "norm_eps must be positive, got ", o.norm_eps);
  ATTO_CHECK(o.dropout >= 0.0 && o.dropout < 1.0, me, "dropout must be in [0, 1), got ", o.dropout);
  const int64_t D = o.d_model, H = o.n_heads, dqk = o.qk_nope_head_dim + o.qk_rope_head_dim;
  NoGradGuard no_grad;
  if (o.q_lora_rank == 0) {
    wq = register_module("wq", xavier_linear(D, H * dqk, gen));
  } else {
    wq_a = register_module("wq_a", xavier_linear(D, o.q_lora_rank, gen));
    q_norm = register_module("q_norm", std::make_shared<RMSNorm>(o.q_lora_rank, o.norm_eps));
    wq_b = register_module("wq_b", xavier_linear(o.q_lora_rank, H * dqk, gen));
  }
  wkv_a = register_module("wkv_a", xavier_linear(D, o.kv_lora_rank + o.qk_rope_head_dim, gen));
  kv_norm = register_module("kv_norm", std::make_shared<RMSNorm>(o.kv_lora_rank, o.norm_eps));
  wkv_b = register_module("wkv_b", xavier_linear(o.kv_lora_rank, H * (o.qk_nope_head_dim + o.v_head_dim), gen));
  wo = register_module("wo", std::make_shared<Linear>(H * o.v_head_dim, D, LinearOptions{.bias = false}, gen));
  if (o.dtype != kFloat32) to(o.dtype);
}

Tensor MultiHeadLatentAttention::queries(const Tensor& x) const {
  const int64_t B = x.size(0), L = x.size(1), H = opts_.n_heads;
  const int64_t dn = opts_.qk_nope_head_dim, dr = opts_.qk_rope_head_dim;
  Tensor q = opts_.q_lora_rank == 0 ? linear(x, wq->weight)
                                    : linear(q_norm->forward(linear(x, wq_a->weight)), wq_b->weight);  // (B, L, H d_qk)
  q = reshape(q, {B, L, H, dn + dr});
  Tensor q_pe = reshape(narrow(q, -1, dn, dr), {B, L, H * dr});
  q_pe = reshape(apply_rotary_emb(q_pe, 0, opts_.rope_base, dr), {B, L, H, dr});
  return cat({narrow(q, -1, 0, dn), q_pe}, -1);  // (B, L, H, d_qk)
}

Tensor MultiHeadLatentAttention::latents(const Tensor& x) const {
  const int64_t dc = opts_.kv_lora_rank, dr = opts_.qk_rope_head_dim;
  Tensor kv = linear(x, wkv_a->weight);                                     // (B, L, d_c + d_rope)
  Tensor c = kv_norm->forward(narrow(kv, -1, 0, dc));                       // (B, L, d_c)
  Tensor r = apply_rotary_emb(narrow(kv, -1, dc, dr), 0, opts_.rope_base);  // (B, L, d_rope)
  return cat({c, r}, -1);
}

Tensor MultiHeadLatentAttention::forward(const Tensor& x) { return attend(x, Tensor(), false).output; }

Tensor MultiHeadLatentAttention::forward(const Tensor& x, const Tensor& key_padding_mask) {
  return attend(x, key_padding_mask, false).output;
}

std::pair<Tensor, Tensor> MultiHeadLatentAttention::forward_with_entropy(const Tensor& x,
                                                                         const Tensor& key_padding_mask) {
  AttentionResult r = attend(x, key_padding_mask, true);
  return {r.output, r.entropy};
}

std::pair<Tensor, Tensor> MultiHeadLatentAttention::forward_with_weights(const Tensor& x,
                                                                         const Tensor& key_padding_mask) {
  AttentionResult r = attend(x, key_padding_mask, false, true);
  return {r.output, r.weights};
}

AttentionResult MultiHeadLatentAttention::attend(const Tensor& x, const Tensor& key_padding_mask, bool need_entropy,
                                                 bool need_weights) {
  const char* me = "MultiHeadLatentAttention";
  ATTO_CHECK(x.defined() && x.dim() == 3 && x.size(2) == opts_.d_model, me,
             "input must be (B, L, d_model=", opts_.d_model, ")",
             x.defined() ? str_cat(", got shape ", x.shape()) : std::string());
  const int64_t B = x.size(0), L = x.size(1), H = opts_.n_heads;
  const int64_t dn = opts_.qk_nope_head_dim, dr = opts_.qk_rope_head_dim, dv = opts_.v_head_dim;
  const int64_t dc = opts_.kv_lora_rank;
  Tensor q = reshape(queries(x), {B, L, H * (dn + dr)});
  Tensor lat = latents(x);
  Tensor kvb = reshape(linear(narrow(lat, -1, 0, dc), wkv_b->weight), {B, L, H, dn + dv});
  Tensor k_r = broadcast_to(unsqueeze(narrow(lat, -1, dc, dr), 2), {B, L, H, dr});
  Tensor k = reshape(cat({narrow(kvb, -1, 0, dn), k_r}, -1), {B, L, H * (dn + dr)});
  Tensor v = reshape(narrow(kvb, -1, dn, dv), {B, L, H * dv});
  AttentionOptions ao;
  ao.is_causal = true;
  ao.scale = 1.0 / std::sqrt(static_cast<double>(dn + dr));
  ao.dropout_p = is_training() ? opts_.dropout : 0.0;
  ao.generator = dropout_gen_;
  ao.need_entropy = need_entropy;
  ao.need_weights = need_weights;
  if (key_padding_mask.defined()) {
    ATTO_CHECK(key_padding_mask.dtype() == kBool && key_padding_mask.shape() == (Shape{B, L}), me,
               "key_padding_mask must be Bool (B=", B, ", L=", L, "), got ", dtype_name(key_padding_mask.dtype()), " ",
               key_padding_mask.shape());
    ao.attn_mask = reshape(key_padding_mask, {B, 1, 1, L});  // TRUE = blocked, broadcast over heads and queries
  }
  AttentionResult r = multi_head_attention(q, k, v, H, ao);  // output (B, L, H d_v), entropy (B, H, L)
  r.output = wo->forward(r.output);
  return r;
}

MlaCache MultiHeadLatentAttention::make_latent_cache(int64_t B, int64_t C) const {
  ATTO_CHECK(B > 0 && C > 0, "MultiHeadLatentAttention::make_cache", "B and C must be positive, got B=", B, ", C=", C);
  return {zeros({B, C, opts_.kv_lora_rank + opts_.qk_rope_head_dim}, {.dtype = wkv_a->weight.dtype()})};
}

int64_t MultiHeadLatentAttention::cache_bytes_per_token() const {
  return (opts_.kv_lora_rank + opts_.qk_rope_head_dim) * static_cast<int64_t>(dtype_size(wkv_a->weight.dtype()));
}

Tensor MultiHeadLatentAttention::decode(const Tensor& x, MlaCache& cache, int64_t start, bool absorbed) const {
  ATTO_CHECK(x.defined() && x.dim() == 3, "MultiHeadLatentAttention::decode",
             "input must be (B, N > 0, d_model=", opts_.d_model, ")",
             x.defined() ? str_cat(", got shape ", x.shape()) : std::string());
  const int64_t W = opts_.kv_lora_rank + opts_.qk_rope_head_dim;
  ATTO_CHECK(cache.latent.defined() && cache.latent.dim() == 3 && cache.latent.size(0) == x.size(0) &&
                 cache.latent.size(2) == W && cache.latent.dtype() == x.dtype(),
             "MultiHeadLatentAttention::decode", "cache must be (B=", x.size(0), ", C, ", W,
             ") of the input's dtype (make_cache), got ",
             cache.latent.defined() ? str_cat(cache.latent.shape()) : std::string("an undefined tensor"));
  CachedAttentionRows rows;
  for (int64_t b = 0; b < x.size(0); ++b) {
    rows.cache_row.push_back(b);
    rows.start.push_back(start);
    rows.count.push_back(x.size(1));
  }
  return decode(x, cache, rows, absorbed);
}

Tensor MultiHeadLatentAttention::decode(const Tensor& x, MlaCache& cache, const CachedAttentionRows& rows,
                                        bool absorbed) const {
  const char* me = "MultiHeadLatentAttention::decode";
  const int64_t H = opts_.n_heads, dn = opts_.qk_nope_head_dim, dr = opts_.qk_rope_head_dim;
  const int64_t dv = opts_.v_head_dim, dc = opts_.kv_lora_rank, W = dc + dr;
  ATTO_CHECK(x.defined() && x.dim() == 3 && x.size(2) == opts_.d_model && x.size(1) > 0, me,
             "input must be (A, N > 0, d_model=", opts_.d_model, ")",
             x.defined() ? str_cat(", got shape ", x.shape()) : std::string());
  const int64_t A = x.size(0), N = x.size(1);
  ATTO_CHECK(cache.latent.defined() && cache.latent.dim() == 3 && cache.latent.size(2) == W &&
                 cache.latent.dtype() == x.dtype(),
             me, "cache must be (B, C, ", W, ") of the input's dtype (make_cache), got ",
             cache.latent.defined() ? str_cat(cache.latent.shape()) : std::string("an undefined tensor"));
  const int64_t B = cache.latent.size(0), C = cache.latent.size(1);
  ATTO_CHECK(rows.cache_row.size() == static_cast<size_t>(A) && rows.start.size() == static_cast<size_t>(A) &&
                 rows.count.size() == static_cast<size_t>(A),
             me, "rows must list cache_row, start and count for each of the ", A, " input rows, got ",
             rows.cache_row.size(), ", ", rows.start.size(), ", ", rows.count.size());
  // The RoPE tables cover the fed positions [lo, hi), padding included (only the new positions: a step's cost must
  // not grow with the positions already cached).
  int64_t lo = std::numeric_limits<int64_t>::max(), hi = 0;
  for (size_t a = 0; a < rows.start.size(); ++a) {
    ATTO_CHECK(rows.cache_row[a] >= 0 && rows.cache_row[a] < B, me, "row ", a, ": cache row ", rows.cache_row[a],
               " is outside the cache's ", B, " rows");
    ATTO_CHECK(rows.count[a] >= 0 && rows.count[a] <= N, me, "row ", a, ": count ", rows.count[a],
               " must be in [0, N=", N, "]");
    ATTO_CHECK(rows.start[a] >= 0 && rows.start[a] + rows.count[a] <= C, me, "row ", a, ": positions [", rows.start[a],
               ", ", rows.start[a] + rows.count[a], ") fall outside the cache's ", C, " positions");
    lo = std::min(lo, rows.start[a]);
    hi = std::max(hi, rows.start[a] + N);
  }
  NoGradGuard no_grad;
  // The new positions' queries and [c_KV | k_R] (decode_linear, then RMSNorm and RoPE in place at each row's own
  // positions), the real ones copied into the cache.
  Tensor kv = decode_linear(x, wkv_a->weight);  // (A, N, W)
  Tensor q;                                     // (A, N, H d_qk)
  if (opts_.q_lora_rank == 0) {
    q = decode_linear(x, wq->weight);
  } else {
    Tensor cq = decode_linear(x, wq_a->weight);  // (A, N, q_lora_rank)
    dispatch_float(x.dtype(), me, [&]<typename T>() {
      rms_rows<T>(cq.data<T>(), A * N, opts_.q_lora_rank, opts_.q_lora_rank, std::as_const(q_norm->weight).data<T>(),
                  q_norm->eps);
    });
    q = decode_linear(cq, wq_b->weight);
  }
  if (A == 0) lo = 0;
  std::vector<int64_t> first(rows.start);  // each row's first position, relative to the tables' first (lo)
  for (int64_t& f : first) f -= lo;
  const std::pair<Tensor, Tensor> cos_sin = rotary_cos_sin(hi - lo, dr, lo, opts_.rope_base, x.dtype());
  const Tensor& cos = cos_sin.first;  // a plain reference, not a structured binding: lambdas capture it (clang 14)
  const Tensor& sin = cos_sin.second;
  const size_t es = dtype_size(x.dtype());
  dispatch_float(x.dtype(), me, [&]<typename T>() {
    T* kp = kv.data<T>();
    rms_rows<T>(kp, A * N, dc, W, std::as_const(kv_norm->weight).data<T>(), kv_norm->eps);
    rope_rows<T>(kp, A, N, 1, W, dc, dr, first, cos.data<T>(), sin.data<T>());
    rope_rows<T>(q.data<T>(), A, N, H, dn + dr, dn, dr, first, cos.data<T>(), sin.data<T>());
  });
  char* dst = static_cast<char*>(cache.latent.raw_data());
  const char* src = static_cast<const char*>(kv.const_raw_data());
  for (int64_t a = 0; a < A; ++a) {
    const auto ua = static_cast<size_t>(a);
    std::memcpy(dst + ((rows.cache_row[ua] * C + rows.start[ua]) * W) * es, src + (a * N * W) * es,
                static_cast<size_t>(rows.count[ua] * W) * es);
  }
  const double scale = 1.0 / std::sqrt(static_cast<double>(dn + dr));
  const Tensor& cached = cache.latent;
  Tensor o = zeros({A, N, H * dv}, {.dtype = x.dtype()});  // (A, N, H d_v); padding positions stay 0
  if (!absorbed) {
    // Per row: expand its cached latents into per-head keys and values, then attend.
    for (int64_t a = 0; a < A; ++a) {
      const auto ua = static_cast<size_t>(a);
      const int64_t n = rows.count[ua], first = rows.start[ua], Tk = first + n;
      if (n == 0) continue;
      Tensor all = narrow(narrow(cached, 0, rows.cache_row[ua], 1), 1, 0, Tk);  // (1, T, W)
      Tensor kvb = reshape(linear(narrow(all, -1, 0, dc), wkv_b->weight), {1, Tk, H, dn + dv});
      Tensor k_r = broadcast_to(unsqueeze(narrow(all, -1, dc, dr), 2), {1, Tk, H, dr});
      Tensor k = reshape(cat({narrow(kvb, -1, 0, dn), k_r}, -1), {1, Tk, H * (dn + dr)});
      Tensor v = reshape(narrow(kvb, -1, dn, dv), {1, Tk, H * dv});
      AttentionOptions ao;
      ao.scale = scale;
      if (n > 1)
        ao.attn_mask = x.dtype() == kFloat64 ? causal_offset_mask<double>(n, Tk, first, x.dtype())
                                             : causal_offset_mask<float>(n, Tk, first, x.dtype());
      const Tensor qa = narrow(narrow(q, 0, a, 1), 1, 0, n);           // (1, n, H d_qk)
      const Tensor oa = multi_head_attention(qa, k, v, H, ao).output;  // (1, n, H d_v)
      std::memcpy(static_cast<char*>(o.raw_data()) + (a * N * H * dv) * es, oa.const_raw_data(),
                  static_cast<size_t>(n * H * dv) * es);
    }
  } else {
    const Tensor& w = wkv_b->weight;  // read through const: the weight is not marked as written
    if (x.dtype() == kFloat64)
      absorbed_attention<double>(q.data<double>(), cached.data<double>(), w.data<double>(), o.data<double>(), N, C,
                                 rows, H, dn, dr, dv, dc, scale);
    else
      absorbed_attention<float>(q.data<float>(), cached.data<float>(), w.data<float>(), o.data<float>(), N, C, rows, H,
                                dn, dr, dv, dc, scale);
  }
  return decode_linear(o, wo->weight);
}

std::string MultiHeadLatentAttention::extra_repr() const {
  const MlaOptions& o = opts_;
  return str_cat("d_model=", o.d_model, ", n_heads=", o.n_heads, ", qk_nope_head_dim=", o.qk_nope_head_dim,
                 ", qk_rope_head_dim=", o.qk_rope_head_dim, ", v_head_dim=", o.v_head_dim,
                 ", kv_lora_rank=", o.kv_lora_rank, ", q_lora_rank=", o.q_lora_rank);
}

Tensor MultiHeadLatentAttention::output_projection() const { return wo->weight; }

}  // namespace attograd::nn
