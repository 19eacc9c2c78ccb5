#include "nn/positional.h"

#include <cmath>

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
