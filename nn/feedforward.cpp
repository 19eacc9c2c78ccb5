#include "nn/feedforward.h"

#include "autograd/activation.h"

namespace attograd::nn {

PositionwiseFeedForward::PositionwiseFeedForward(int64_t d_model_, int64_t d_ff_, FeedForwardOptions opts,
                                                 Generator& gen)
    : d_model(d_model_), d_ff(d_ff_), options(std::move(opts)) {
  const char* me = "PositionwiseFeedForward";
  ATTO_CHECK(d_model > 0 && d_ff > 0, me, "d_model and d_ff must be positive, got d_model=", d_model, ", d_ff=", d_ff);
  const std::string& act = options.activation;
  ATTO_CHECK(act == "relu" || act == "gelu" || act == "gelu-tanh" || act == "swiglu", me,
             "activation must be 'relu', 'gelu', 'gelu-tanh' or 'swiglu', got '", act, "'");
  ATTO_CHECK(act != "swiglu" || !options.residual_norm, me, "activation 'swiglu' is not available with residual_norm");
  ATTO_CHECK(options.dropout >= 0.0 && options.dropout <= 1.0, me,
             "dropout probability has to be between 0 and 1, but got ", options.dropout);
  auto fc1 = std::make_shared<Linear>(d_model, d_ff, options.bias, gen);
  auto fc3 = act == "swiglu" ? std::make_shared<Linear>(d_model, d_ff, options.bias, gen) : nullptr;
  auto fc2 = std::make_shared<Linear>(d_ff, d_model, options.bias, gen);
  auto drop = std::make_shared<Dropout>(options.dropout);
  if (options.residual_norm) {  // the seed's registration order and names
    linear1 = register_module("w_1", fc1);
    linear2 = register_module("w_2", fc2);
    layer_norm = register_module("layer_norm", std::make_shared<LayerNorm>(d_model, options.layer_norm_eps));
    dropout = register_module("dropout", drop);
  } else {  // PyTorch TransformerEncoderLayer's
    linear1 = register_module("linear1", fc1);
    if (fc3) linear3 = register_module("linear3", fc3);
    dropout = register_module("dropout", drop);
    linear2 = register_module("linear2", fc2);
  }
  to(options.dtype);  // drawn in float32, then converted (see nn/layers.h)
}

Tensor PositionwiseFeedForward::forward(const Tensor& x) {
  ATTO_CHECK(x.defined(), type_name(), "called with an undefined input");
  ATTO_CHECK(x.dim() >= 1 && x.size(-1) == d_model, type_name(), "expected input of shape (..., d_model=", d_model,
             "), got shape ", x.shape());
  Tensor h = activate(x);  // (..., d_ff)
  if (!options.residual_norm) return linear2->forward(dropout->forward(h));  // (..., d_model)
  Tensor y = dropout->forward(linear2->forward(h));
  return layer_norm->forward(y + x);
}

Tensor PositionwiseFeedForward::activate(const Tensor& x) {
  Tensor h = linear1->forward(x);  // (..., d_ff)
  const std::string& act = options.activation;
  if (act == "relu") return relu(h);
  if (act == "gelu") return gelu(h);
  if (act == "gelu-tanh") return gelu(h, "tanh");
  return h * sigmoid(h) * linear3->forward(x);  // swiglu: silu(linear1 x) * linear3 x
}

std::string PositionwiseFeedForward::extra_repr() const {
  std::string s = "activation=" + options.activation;
  if (!options.bias) s += ", bias=False";
  if (options.residual_norm) s += ", residual_norm=True";
  return s;
}

}  // namespace attograd::nn
