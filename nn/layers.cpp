#include "nn/layers.h"

#include <charconv>
#include <cmath>

#include "autograd/activation.h"
#include "autograd/dropout.h"
#include "autograd/indexing.h"
#include "autograd/matmul.h"
#include "autograd/norm.h"
#include "nn/init.h"

namespace attograd::nn {

namespace detail {

std::string py_float(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  if (v == 0.0) return std::signbit(v) ? "-0.0" : "0.0";
  char buf[64];
  auto res = std::to_chars(buf, buf + sizeof(buf), v, std::chars_format::scientific);  // shortest round trip
  std::string sci(buf, res.ptr);
  const size_t epos = sci.find('e');
  const int exp = std::stoi(sci.substr(epos + 1));
  if (exp < -4 || exp >= 16) return sci;  // Python's repr switches to exponent form outside [1e-4, 1e16)
  std::string sign, digits;
  for (size_t i = 0; i < epos; ++i) {
    if (sci[i] == '-')
      sign = "-";
    else if (sci[i] != '.')
      digits.push_back(sci[i]);
  }
  std::string out;
  if (exp < 0) {
    out = "0." + std::string(static_cast<size_t>(-exp - 1), '0') + digits;
  } else {
    const size_t int_len = static_cast<size_t>(exp) + 1;
    if (digits.size() < int_len) digits.append(int_len - digits.size(), '0');
    std::string frac = digits.substr(int_len);
    out = digits.substr(0, int_len) + "." + (frac.empty() ? "0" : frac);
  }
  return sign + out;
}

}  // namespace detail

namespace {

const char* py_bool(bool b) { return b ? "True" : "False"; }

// Resolves a possibly negative position against a container of n modules.
size_t container_index(int64_t i, size_t n, const std::string& who) {
  const int64_t size = static_cast<int64_t>(n);
  ATTO_CHECK(i >= -size && i < size, who, "index ", i, " is out of range for ", size, " modules");
  return static_cast<size_t>(i < 0 ? i + size : i);
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Linear

Linear::Linear(int64_t in, int64_t out, const LinearOptions& options, Generator& gen)
    : in_features(in), out_features(out) {
  const bool with_bias = options.bias;
  // PyTorch accepts in_features = 0 (with a warning that initialising the empty weight is a no-op): the layer then
  // ignores its input and returns its bias. That is a size bug upstream, never a model: refused. out_features = 0
  // stays valid, as in PyTorch (an empty (..., 0) output).
  ATTO_CHECK(in >= 1 && out >= 0, "Linear", "in_features must be >= 1 and out_features >= 0, got in_features=", in,
             ", out_features=", out);
  NoGradGuard no_grad;
  weight = register_parameter("weight", empty({out, in}));
  // PyTorch's reset_parameters: kaiming_uniform_(a = sqrt(5)) is U(-1/sqrt(in), 1/sqrt(in)) on (out, in);
  // the bias is U(-1/sqrt(in), 1/sqrt(in)) too.
  if (weight.numel() > 0) init::kaiming_uniform_(weight, std::sqrt(5.0), "fan_in", gen);
  const double bound = 1.0 / std::sqrt(static_cast<double>(in));
  if (with_bias) {
    bias = register_parameter("bias", empty({out}));
    init::uniform_(bias, -bound, bound, gen);
  }
  to(options.dtype);  // drawn in float32, then converted (see nn/layers.h)
}

Tensor Linear::forward(const Tensor& x) {
  ATTO_CHECK(x.defined(), type_name(), "called with an undefined input");
  ATTO_CHECK(x.dim() >= 1 && x.size(-1) == in_features, type_name(),
             "expected input of shape (..., in_features=", in_features, "), got shape ", x.shape());
  return linear(x, weight, bias);
}

std::string Linear::extra_repr() const {
  return str_cat("in_features=", in_features, ", out_features=", out_features, ", bias=", py_bool(bias.defined()));
}

// ---------------------------------------------------------------------------------------------
// Embedding

Embedding::Embedding(int64_t num, int64_t dim, const EmbeddingOptions& options, Generator& gen)
    : num_embeddings(num), embedding_dim(dim), padding_idx(options.padding_idx < 0 ? -1 : options.padding_idx) {
  const int64_t pad = options.padding_idx;
  ATTO_CHECK(num >= 0 && dim >= 0, "Embedding", "num_embeddings and embedding_dim must be non-negative, got ", num,
             " and ", dim);
  ATTO_CHECK(pad < num, "Embedding", "padding_idx ", pad, " must be within num_embeddings ", num);
  NoGradGuard no_grad;
  weight = register_parameter("weight", empty({num, dim}));
  init::normal_(weight, 0.0, 1.0, gen);
  if (padding_idx >= 0) {
    float* row = weight.data<float>() + padding_idx * dim;
    std::fill(row, row + dim, 0.0f);
  }
  to(options.dtype);  // drawn in float32, then converted (see nn/layers.h)
}

Tensor Embedding::forward(const Tensor& indices) {
  ATTO_CHECK(indices.defined(), type_name(), "called with an undefined input");
  ATTO_CHECK(indices.dtype() == kInt64, type_name(), "expected int64 indices, got ", dtype_name(indices.dtype()),
             " of shape ", indices.shape());
  return embedding(weight, indices, padding_idx);
}

std::string Embedding::extra_repr() const {
  std::string s = str_cat(num_embeddings, ", ", embedding_dim);
  if (padding_idx >= 0) s += str_cat(", padding_idx=", padding_idx);
  return s;
}

// ---------------------------------------------------------------------------------------------
// LayerNorm

LayerNorm::LayerNorm(int64_t normalized_size, const LayerNormOptions& options)
    : LayerNorm(Shape{normalized_size}, options) {}

LayerNorm::LayerNorm(Shape shape, const LayerNormOptions& options)
    : normalized_shape(std::move(shape)), eps(options.eps), elementwise_affine(options.elementwise_affine) {
  ATTO_CHECK(!normalized_shape.empty(), "LayerNorm", "normalized_shape must have at least one dimension");
  for (int64_t d : normalized_shape)
    ATTO_CHECK(d >= 0, "LayerNorm", "normalized_shape must be non-negative, got ", normalized_shape);
  ATTO_CHECK(eps >= 0, "LayerNorm", "eps must be non-negative, got ", eps);
  if (elementwise_affine) {
    weight = register_parameter("weight", ones(normalized_shape, {.dtype = options.dtype}));
    if (options.bias) bias = register_parameter("bias", zeros(normalized_shape, {.dtype = options.dtype}));
  }
  to(options.dtype);  // a check that the dtype is a float type (the parameters are already in it)
}

Tensor LayerNorm::forward(const Tensor& x) {
  ATTO_CHECK(x.defined(), type_name(), "called with an undefined input");
  const Shape& xs = x.shape();
  const Shape& ns = normalized_shape;
  const bool trailing = xs.size() >= ns.size() && std::equal(ns.begin(), ns.end(), xs.end() - ns.size());
  ATTO_CHECK(trailing, type_name(), "expected input whose trailing dimensions are normalized_shape ", ns,
             ", got shape ", xs);
  return layer_norm(x, ns, weight, bias, eps);
}

std::string LayerNorm::extra_repr() const {
  std::string tuple = "(";
  for (size_t i = 0; i < normalized_shape.size(); ++i) tuple += (i ? ", " : "") + std::to_string(normalized_shape[i]);
  tuple += normalized_shape.size() == 1 ? ",)" : ")";
  return str_cat(tuple, ", eps=", detail::py_float(eps), ", elementwise_affine=", py_bool(elementwise_affine),
                 elementwise_affine && !bias.defined() ? ", bias=False" : "");
}

// ---------------------------------------------------------------------------------------------
// Dropout and the activations

Dropout::Dropout(double p, Generator& gen) : p_(p), gen_(&gen) {
  ATTO_CHECK(p >= 0.0 && p <= 1.0, "Dropout", "dropout probability has to be between 0 and 1, but got ", p);
}

Tensor Dropout::forward(const Tensor& x) { return dropout(x, p_, is_training(), *gen_); }

std::string Dropout::extra_repr() const { return "p=" + detail::py_float(p_) + ", inplace=False"; }

Tensor ReLU::forward(const Tensor& x) { return relu(x); }

GELU::GELU(std::string approx) : approximate(std::move(approx)) {
  ATTO_CHECK(approximate == "none" || approximate == "tanh", "GELU", "approximate must be 'none' or 'tanh', got '",
             approximate, "'");
}

Tensor GELU::forward(const Tensor& x) { return gelu(x, approximate); }

std::string GELU::extra_repr() const { return "approximate='" + approximate + "'"; }

Tensor Tanh::forward(const Tensor& x) { return tanh(x); }

Tensor Sigmoid::forward(const Tensor& x) { return sigmoid(x); }

Tensor SiLU::forward(const Tensor& x) { return x * sigmoid(x); }

Tensor Softmax::forward(const Tensor& x) { return softmax(x, dim); }

std::string Softmax::extra_repr() const { return str_cat("dim=", dim); }

Tensor LogSoftmax::forward(const Tensor& x) { return log_softmax(x, dim); }

std::string LogSoftmax::extra_repr() const { return str_cat("dim=", dim); }

Tensor Identity::forward(const Tensor& x) { return x; }

// ---------------------------------------------------------------------------------------------
// Sequential and ModuleList

void Sequential::push_back(std::shared_ptr<Module> module) {
  ATTO_CHECK(module != nullptr, type_name(), "cannot append a null module at position ", modules_.size());
  register_module(std::to_string(modules_.size()), module);
  modules_.push_back(std::move(module));
}

std::shared_ptr<Module> Sequential::operator[](int64_t i) const {
  return modules_[container_index(i, modules_.size(), type_name())];
}

Tensor Sequential::forward(const Tensor& x) {
  Tensor h = x;
  for (auto& m : modules_) h = m->forward(h);
  return h;
}

void ModuleList::push_back(std::shared_ptr<Module> module) {
  ATTO_CHECK(module != nullptr, type_name(), "cannot append a null module at position ", modules_.size());
  register_module(std::to_string(modules_.size()), module);
  modules_.push_back(std::move(module));
}

std::shared_ptr<Module> ModuleList::operator[](int64_t i) const {
  return modules_[container_index(i, modules_.size(), type_name())];
}

}  // namespace attograd::nn
