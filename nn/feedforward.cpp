#include "nn/feedforward.h"

#include "autograd/activation.h"

namespace attograd::nn {

PositionwiseFeedForward::PositionwiseFeedForward(int64_t d_model_, int64_t d_ff_, FeedForwardOptions opts,
                                                 Generator& gen)
    : d_model(d_model_), d_ff(d_ff_), options(std::move(opts)) {
  const char* me = "PositionwiseFeedForward";
  ATTO_CHECK(d_model > 0 && d_ff > 0, me, "d_model and d_ff must be positive, got d_model=", d_model, ", d_ff=", d_ff);
  ATTO_CHECK(options.activation == "relu" || options.activation == "gelu", me,
             "activation must be 'relu' or 'gelu', got '", options.activation, "'");
  ATTO_CHECK(options.dropout >= 0.0 && options.dropout <= 1.0, me,
             "dropout probability has to be between 0 and 1, but got ", options.dropout);
  auto fc1 = std::make_shared<Linear>(d_model, d_ff, true, gen);
  auto fc2 = std::make_shared<Linear>(d_ff, d_model, true, gen);
  auto drop = std::make_shared<Dropout>(options.dropout);
  if (options.residual_norm) {  // the seed's registration order and names
    linear1 = register_module("w_1", fc1);
    linear2 = register_module("w_2", fc2);
    layer_norm = register_module("layer_norm", std::make_shared<LayerNorm>(d_model, options.layer_norm_eps));
    dropout = register_module("dropout", drop);
  } else {  // PyTorch TransformerEncoderLayer's
    linear1 = register_module("linear1", fc1);
    dropout = register_module("dropout", drop);
    linear2 = register_module("linear2", fc2);
  }
  to(options.dtype);  // drawn in float32, then converted (see nn/layers.h)
}

Tensor PositionwiseFeedForward::forward(const Tensor& x) {
  ATTO_CHECK(x.defined(), type_name(), "called with an undefined input");
  ATTO_CHECK(x.dim() >= 1 && x.size(-1) == d_model, type_name(), "expected input of shape (..., d_model=", d_model,
             "), got shape ", x.shape());
  Tensor h = linear1->forward(x);  // (..., d_ff)
  h = options.activation == "gelu" ? gelu(h) : relu(h);
  if (!options.residual_norm) return linear2->forward(dropout->forward(h));  // (..., d_model)
  Tensor y = dropout->forward(linear2->forward(h));
  return layer_norm->forward(y + x);
}

std::string PositionwiseFeedForward::extra_repr() const {
  std::string s = "activation=" + options.activation;
  if (options.residual_norm) s += ", residual_norm=True";
  return s;
}

}  // namespace attograd::nn
