// Multi-head linear attention (see linear_attention.h).

#include "nn/linear_attention.h"

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

std::string LinearAttention::extra_repr() const {
  return str_cat("embed_dim=", opts_.embed_dim, ", num_heads=", opts_.num_heads,
                 ", causal=", opts_.causal ? "true" : "false");
}

}  // namespace attograd::nn
