#include "nn/positional.h"

#include <cmath>
#include <cstdio>
#include <tuple>

#include "autograd/rope.h"
#include "autograd/shape.h"

namespace attograd::nn {

Tensor sinusoidal_table(int64_t max_len, int64_t d_model) {
  ATTO_CHECK(max_len >= 0 && d_model >= 0, "sinusoidal_table", "max_len and d_model must be non-negative, got ",
             max_len, " and ", d_model);
  Tensor table = empty({max_len, d_model});
  float* p = table.data<float>();
  for (int64_t pos = 0; pos < max_len; ++pos)
    for (int64_t j = 0; j < d_model; ++j) {
      // The seed's formula: pos / 10000^(2 * (j // 2) / d_model), in double, then sin (even j) or cos (odd j).
      const double angle =
          static_cast<double>(pos) / std::pow(10000.0, 2.0 * static_cast<double>(j / 2) / static_cast<double>(d_model));
      p[pos * d_model + j] = static_cast<float>(j % 2 == 0 ? std::sin(angle) : std::cos(angle));
    }
  return table;
}

PositionalEncoding::PositionalEncoding(int64_t d_model_, int64_t max_len_, double p, Generator& gen, Dtype dtype)
    : d_model(d_model_), max_len(max_len_) {
  ATTO_CHECK(d_model > 0 && max_len > 0, "PositionalEncoding",
             "d_model and max_len must be positive, got d_model=", d_model, ", max_len=", max_len);
  pe = register_buffer("pe", reshape(sinusoidal_table(max_len, d_model), {1, max_len, d_model}));
  dropout = register_module("dropout", std::make_shared<Dropout>(p, gen));
  to(dtype);
}

Tensor PositionalEncoding::forward(const Tensor& x) {
  const std::string me = type_name();
  ATTO_CHECK(x.defined(), me, "called with an undefined input");
  ATTO_CHECK(x.dim() == 3 && x.size(2) == d_model, me, "expected input of shape (B, L, d_model=", d_model,
             "), got shape ", x.shape());
  const int64_t B = x.size(0), L = x.size(1);
  ATTO_CHECK(L <= max_len, me, "sequence length L=", L, " of input ", x.shape(), " exceeds max_len=", max_len);
  ATTO_CHECK(x.dtype() == pe.dtype(), me, "input dtype ", dtype_name(x.dtype()), " does not match the table's ",
             dtype_name(pe.dtype()), " (convert the module with to())");
  // out[b, l, :] = x[b, l, :] + pe[0, l, :]: one pass, no broadcast machinery; d out / d x = identity.
  Tensor out = empty(x.shape(), {.dtype = x.dtype()});
  const int64_t block = L * d_model;
  dispatch_float(x.dtype(), "positional_encoding", [&]<typename T>() {
    const T* px = x.data<T>();
    const T* table = pe.data<T>();
    T* q = out.data<T>();
    for (int64_t b = 0; b < B; ++b)
      for (int64_t i = 0; i < block; ++i) q[b * block + i] = px[b * block + i] + table[i];
  });
  out = record("positional_encoding", out, {x}, [](const Tensor& g, GradInputs& gi) { gi[0] = g; });
  return dropout->forward(out);
}

std::string PositionalEncoding::extra_repr() const { return str_cat("d_model=", d_model, ", max_len=", max_len); }

}  // namespace attograd::nn

namespace attograd::nn {

RotaryEmbedding::RotaryEmbedding(int64_t head_dim_, int64_t max_len_, double base_)
    : head_dim(head_dim_), max_len(max_len_), base(base_) {
  ATTO_CHECK(max_len > 0, "RotaryEmbedding", "max_len must be positive, got ", max_len);
  NoGradGuard no_grad;
  std::tie(cos64_, sin64_) = rotary_cos_sin(max_len, head_dim, 0, base, kFloat64);
  cos32_ = cos64_.to(kFloat32);  // the rounding rotary_cos_sin does for float32 tables
  sin32_ = sin64_.to(kFloat32);
}

Tensor RotaryEmbedding::forward(const Tensor& x, int64_t offset) {
  const char* me = "RotaryEmbedding";
  ATTO_CHECK(x.defined() && x.dim() >= 2 && x.size(-1) > 0 && x.size(-1) % head_dim == 0, me,
             "x must be (..., L, head_dim=", head_dim, ") or (..., L, heads * head_dim)",
             x.defined() ? str_cat(", got shape ", x.shape()) : std::string());
  ATTO_CHECK(x.dtype() == kFloat32 || x.dtype() == kFloat64, me, "x must be float32 or float64, got ",
             dtype_name(x.dtype()));
  const int64_t len = x.size(-2);
  ATTO_CHECK(offset >= 0, me, "offset must be >= 0, got ", offset);
  const bool f64 = x.dtype() == kFloat64;
  Tensor c, s;
  {
    NoGradGuard no_grad;
    if (offset + len <= max_len) {
      c = narrow(f64 ? cos64_ : cos32_, 0, offset, len);
      s = narrow(f64 ? sin64_ : sin32_, 0, offset, len);
    } else {  // beyond the tables: the rows a longer table would hold (the same double angles, rounded alike)
      std::tie(c, s) = rotary_cos_sin(len, head_dim, offset, base, x.dtype());
    }
  }
  return apply_rotary_emb(x, c, s);
}

std::string RotaryEmbedding::extra_repr() const {
  char b[32];
  std::snprintf(b, sizeof b, "%g", base);
  return str_cat("head_dim=", head_dim, ", max_len=", max_len, ", base=", b);
}

}  // namespace attograd::nn
