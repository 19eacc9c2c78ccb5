// Multi-head linear attention (see linear_attention.h).

#include "nn/linear_attention.h"

#include <cmath>
#include <vector>

#include "autograd/linear_attention.h"
#include "autograd/matmul.h"
#include "autograd/shape.h"
#include "nn/init.h"

namespace attograd::nn {

LinearAttention::LinearAttention(const LinearAttentionOptions& options, Generator& gen) : opts_(options) {
  const char* me = "LinearAttention";
  const int64_t E = opts_.embed_dim, H = opts_.num_heads;
  ATTO_CHECK(E > 0 && H > 0, me, "embed_dim and num_heads must be positive, got embed_dim=", E, ", num_heads=", H);
  ATTO_CHECK(E % H == 0, me, "embed_dim must be divisible by num_heads, got embed_dim=", E, ", num_heads=", H);
  ATTO_CHECK(opts_.eps > 0, me, "eps must be positive, got ", opts_.eps);
  NoGradGuard no_grad;
  auto proj = std::make_shared<Linear>(E, E, opts_.bias, gen);  // drawn first, as in MultiheadAttention
  in_proj_weight = register_parameter("in_proj_weight", empty({3 * E, E}));
  if (opts_.bias) in_proj_bias = register_parameter("in_proj_bias", zeros({3 * E}));
  out_proj = register_module("out_proj", proj);
  init::xavier_uniform_(in_proj_weight, 1.0, gen);
  if (opts_.bias) init::zeros_(out_proj->bias);
  if (opts_.dtype != kFloat32) to(opts_.dtype);
}

Tensor LinearAttention::forward(const Tensor& query, const Tensor& key, const Tensor& value, bool is_causal) {
  const char* me = "LinearAttention";
  const int64_t E = opts_.embed_dim, H = opts_.num_heads, d = E / H;
  for (const Tensor* t : {&query, &key, &value})
    ATTO_CHECK(t->defined() && t->dim() == 3 && t->size(2) == E, me, "query, key and value must be (B, L, E=", E, ")",
               t->defined() ? str_cat(", got shape ", t->shape()) : std::string());
  ATTO_CHECK(key.size(0) == query.size(0) && value.size(0) == query.size(0) && key.size(1) == value.size(1), me,
             "batch or key length differ: query ", query.shape(), ", key ", key.shape(), ", value ", value.shape());
  const int64_t B = query.size(0), Lq = query.size(1), Lk = key.size(1);
  auto project = [&](const Tensor& x, int64_t i, int64_t L) {  // (B, L, E) -> (B, H, L, d)
    Tensor w = narrow(in_proj_weight, 0, i * E, E);
    Tensor b = opts_.bias ? narrow(in_proj_bias, 0, i * E, E) : Tensor();
    return transpose(reshape(linear(x, w, b), {B, L, H, d}), 1, 2);
  };
  Tensor q = project(query, 0, Lq), k = project(key, 1, Lk), v = project(value, 2, Lk);
  Tensor o = linear_attention(q, k, v, is_causal, opts_.eps);  // (B, H, Lq, d)
  return out_proj->forward(reshape(transpose(o, 1, 2), {B, Lq, E}));
}

Tensor LinearAttention::attention_weights(const Tensor& x) const {
  const char* me = "LinearAttention::attention_weights";
  const int64_t E = opts_.embed_dim, H = opts_.num_heads, d = E / H;
  ATTO_CHECK(x.defined() && x.dim() == 3 && x.size(2) == E, me, "x must be (B, L, E=", E, ")",
             x.defined() ? str_cat(", got shape ", x.shape()) : std::string());
  const int64_t B = x.size(0), L = x.size(1);
  NoGradGuard no_grad;
  auto project = [&](int64_t i) {  // (B, L, E) -> (B, H, L, d) as doubles
    Tensor w = narrow(in_proj_weight, 0, i * E, E);
    Tensor b = opts_.bias ? narrow(in_proj_bias, 0, i * E, E) : Tensor();
    return transpose(reshape(linear(x, w, b), {B, L, H, d}), 1, 2).to_vector<double>();
  };
  std::vector<double> q = project(0), k = project(1);
  for (double& v : q) v = v > 0 ? v + 1 : std::exp(v);  // phi = elu + 1, as autograd/linear_attention.cpp
  for (double& v : k) v = v > 0 ? v + 1 : std::exp(v);
  std::vector<double> w(static_cast<size_t>(B * H * L * L), 0.0);
  for (int64_t bh = 0; bh < B * H; ++bh) {
    const double* qb = q.data() + bh * L * d;
    const double* kb = k.data() + bh * L * d;
    double* wb = w.data() + bh * L * L;
    for (int64_t i = 0; i < L; ++i) {
      double total = 0;
      for (int64_t j = 0; j <= i; ++j) {
        double s = 0;
        for (int64_t c = 0; c < d; ++c) s += qb[i * d + c] * kb[j * d + c];
        wb[i * L + j] = s;
        total += s;
      }
      for (int64_t j = 0; j <= i; ++j) wb[i * L + j] /= total + opts_.eps;
    }
  }
  return from_vector(w, {B, H, L, L}, {.dtype = in_proj_weight.dtype()});
}

std::pair<Tensor, Tensor> LinearAttention::make_state(int64_t B) const {
  ATTO_CHECK(B > 0, "LinearAttention::make_state", "B must be positive, got ", B);
  const int64_t H = opts_.num_heads, d = opts_.embed_dim / H;
  const Dtype dt = in_proj_weight.dtype();
  return {zeros({B, H, d, d}, {.dtype = dt}), zeros({B, H, d}, {.dtype = dt})};
}

int64_t LinearAttention::state_bytes_per_row() const {
  const int64_t H = opts_.num_heads, d = opts_.embed_dim / H;
  return H * d * (d + 1) * static_cast<int64_t>(dtype_size(in_proj_weight.dtype()));
}

namespace {

// phi(x) = elu(x) + 1, autograd/linear_attention.cpp's feature map.
template <typename T>
T phi(T x) {
  return x > T(0) ? x + T(1) : std::exp(x);
}

// The decoding recurrence (see linear_attention.h) for every real position of every fed row and head, in the causal
// forward's order: S += phi(k) v^T, z += phi(k), then out = phi(q)^T S / (phi(q)^T z + eps).
// qkv (A, N, 3E) = [q | k | v], S (B, H, d, d), z (B, H, d), out (A, N, E) (padding positions left as they are).
template <typename T>
void decode_recurrence(const T* qkv, T* S, T* z, T* out, int64_t N, int64_t H, int64_t d,
                       const CachedAttentionRows& rows, double eps) {
  const int64_t E = H * d;
  std::vector<T> pk(static_cast<size_t>(d)), pq(static_cast<size_t>(d));
  for (size_t a = 0; a < rows.count.size(); ++a) {
    const int64_t b = rows.cache_row[a];
    for (int64_t i = 0; i < rows.count[a]; ++i) {
      const T* row = qkv + (static_cast<int64_t>(a) * N + i) * 3 * E;
      for (int64_t h = 0; h < H; ++h) {
        T* Sh = S + (b * H + h) * d * d;
        T* zh = z + (b * H + h) * d;
        const T* q = row + h * d;
        const T* k = row + E + h * d;
        const T* v = row + 2 * E + h * d;
        for (int64_t j = 0; j < d; ++j) pk[static_cast<size_t>(j)] = phi(k[j]);
        for (int64_t j = 0; j < d; ++j) {
          const T p = pk[static_cast<size_t>(j)];
          T* Sj = Sh + j * d;
          for (int64_t c = 0; c < d; ++c) Sj[c] += p * v[c];
          zh[j] += p;
        }
        for (int64_t j = 0; j < d; ++j) pq[static_cast<size_t>(j)] = phi(q[j]);
        T* o = out + ((static_cast<int64_t>(a) * N + i) * H + h) * d;
        T den = T(0);
        for (int64_t j = 0; j < d; ++j) {
          const T p = pq[static_cast<size_t>(j)];
          const T* Sj = Sh + j * d;
          for (int64_t c = 0; c < d; ++c) o[c] += p * Sj[c];
          den += p * zh[j];
        }
        const T inv = T(1) / (den + static_cast<T>(eps));
        for (int64_t c = 0; c < d; ++c) o[c] *= inv;
      }
    }
  }
}

}  // namespace

Tensor LinearAttention::decode(const Tensor& x, Tensor& state, Tensor& normalizer,
                               const CachedAttentionRows& rows) const {
  const char* me = "LinearAttention::decode";
  const int64_t E = opts_.embed_dim, H = opts_.num_heads, d = E / H;
  ATTO_CHECK(x.defined() && x.dim() == 3 && x.size(2) == E && x.size(1) > 0, me, "input must be (A, N > 0, E=", E, ")",
             x.defined() ? str_cat(", got shape ", x.shape()) : std::string());
  const int64_t A = x.size(0), N = x.size(1);
  ATTO_CHECK(state.defined() && state.dim() == 4 && state.size(1) == H && state.size(2) == d && state.size(3) == d &&
                 state.dtype() == x.dtype(),
             me, "state must be (B, H=", H, ", ", d, ", ", d, ") of the input's dtype (make_state), got ",
             state.defined() ? str_cat(state.shape()) : std::string("an undefined tensor"));
  const int64_t B = state.size(0);
  ATTO_CHECK(normalizer.defined() && normalizer.shape() == (Shape{B, H, d}) && normalizer.dtype() == x.dtype(), me,
             "normalizer must be (B=", B, ", H=", H, ", ", d, ") of the input's dtype (make_state), got ",
             normalizer.defined() ? str_cat(normalizer.shape()) : std::string("an undefined tensor"));
  ATTO_CHECK(rows.cache_row.size() == static_cast<size_t>(A) && rows.count.size() == static_cast<size_t>(A), me,
             "rows must list cache_row and count for each of the ", A, " input rows, got ", rows.cache_row.size(), ", ",
             rows.count.size());
  for (size_t a = 0; a < rows.count.size(); ++a) {
    ATTO_CHECK(rows.cache_row[a] >= 0 && rows.cache_row[a] < B, me, "row ", a, ": state row ", rows.cache_row[a],
               " is outside the state's ", B, " rows");
    ATTO_CHECK(rows.count[a] >= 0 && rows.count[a] <= N, me, "row ", a, ": count ", rows.count[a],
               " must be in [0, N=", N, "]");
  }
  NoGradGuard no_grad;
  const Tensor qkv = decode_linear(x, in_proj_weight, in_proj_bias);  // (A, N, 3E) = [q | k | v]
  Tensor o = zeros({A, N, E}, {.dtype = x.dtype()});                  // (A, N, E)
  dispatch_float(x.dtype(), me, [&]<typename T>() {
    decode_recurrence<T>(qkv.data<T>(), state.data<T>(), normalizer.data<T>(), o.data<T>(), N, H, d, rows, opts_.eps);
  });
  return decode_linear(o, out_proj->weight, out_proj->bias);
}

std::string LinearAttention::extra_repr() const {
  return str_cat("embed_dim=", opts_.embed_dim, ", num_heads=", opts_.num_heads,
                 ", causal=", opts_.causal ? "true" : "false");
}

}  // namespace attograd::nn
