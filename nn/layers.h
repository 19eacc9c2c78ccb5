#pragma once
// The basic layers (torch.nn): Linear, Embedding, LayerNorm, Dropout, the activations (ReLU, GELU, Tanh, Sigmoid,
// SiLU, Softmax, LogSoftmax, Identity), and the containers Sequential and ModuleList. Names, constructor
// arguments, parameter names and default initialisation are PyTorch's. Modules that draw random numbers take a
// Generator: at construction (the initialisers of Linear and Embedding) or at run time (Dropout, through a pointer
// that Module::set_generator sets).
//
// Layers with parameters take a `dtype` (PyTorch's factory keyword): Linear(4, 2, {.dtype = kFloat64}). The
// parameters are initialised exactly as in float32 (the same draws from the generator) and then converted, so a
// float64 layer holds the float32 layer's values widened: the same as building it in float32 and calling
// to(kFloat64).

#include <concepts>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "autograd/autograd.h"
#include "nn/module.h"

namespace attograd::nn {

/// Options of Linear: Linear(4, 2, {.bias = false, .dtype = kFloat64}).
struct LinearOptions {
  bool bias = true;        ///< learn an additive bias
  Dtype dtype = kFloat32;  ///< parameter dtype (see the file comment)
};

/// y = x W^T + b (torch.nn.Linear). Parameters "weight" (out_features, in_features) and "bias"
/// (out_features), both U(-1/sqrt(in_features), 1/sqrt(in_features)) (PyTorch's
/// kaiming_uniform_(a = sqrt(5)) for the weight), drawn from `gen`: weight first, then bias.
/// in_features must be >= 1 (PyTorch allows 0, a layer that returns its bias whatever the input: refused here as a
/// size bug); out_features may be 0 (an empty output, as in PyTorch).
class Linear : public Module {
 public:
  /// in_features -> out_features (see LinearOptions).
  Linear(int64_t in_features, int64_t out_features, const LinearOptions& options = {},
         Generator& gen = default_generator());
  /// in_features -> out_features, with a bias unless `bias` is false (PyTorch's positional form). A template so
  /// that Linear(4, 2, {}, gen) means default options, not bias = false.
  template <std::same_as<bool> B>
  Linear(int64_t in_features, int64_t out_features, B bias, Generator& gen = default_generator())
      : Linear(in_features, out_features, LinearOptions{.bias = bias}, gen) {}
  /// "Linear".
  std::string type_name() const override { return "Linear"; }
  /// x (..., in_features) -> (..., out_features), one fused GEMM.
  Tensor forward(const Tensor& x) override;

  const int64_t in_features;   ///< size of each input sample
  const int64_t out_features;  ///< size of each output sample
  Tensor weight;               ///< (out_features, in_features)
  Tensor bias;                 ///< (out_features), undefined when built with bias = false

 protected:
  /// "in_features=4, out_features=3, bias=True".
  std::string extra_repr() const override;
};

/// Options of Embedding: Embedding(10, 3, {.padding_idx = 0, .dtype = kFloat64}).
struct EmbeddingOptions {
  int64_t padding_idx = -1;  ///< the row that is zero and gets no gradient; < 0 means none
  Dtype dtype = kFloat32;    ///< weight dtype (see the file comment)
};

/// A lookup table of embedding vectors (torch.nn.Embedding). Parameter "weight"
/// (num_embeddings, embedding_dim) ~ N(0, 1) from `gen`; the row padding_idx (if >= 0) is zeroed and
/// gets no gradient. Unlike PyTorch, a negative padding_idx means "no padding row" (PyTorch's None).
class Embedding : public Module {
 public:
  /// num_embeddings rows of size embedding_dim (see EmbeddingOptions).
  Embedding(int64_t num_embeddings, int64_t embedding_dim, const EmbeddingOptions& options = {},
            Generator& gen = default_generator());
  /// num_embeddings rows of size embedding_dim; padding_idx < 0 means none (PyTorch's positional form). A template
  /// so that Embedding(10, 3, {}, gen) means default options, not padding_idx = 0.
  template <std::integral I>
  requires(!std::same_as<I, bool>)
      Embedding(int64_t num_embeddings, int64_t embedding_dim, I padding_idx, Generator& gen = default_generator())
      : Embedding(num_embeddings, embedding_dim, EmbeddingOptions{.padding_idx = padding_idx}, gen) {}
  /// "Embedding".
  std::string type_name() const override { return "Embedding"; }
  /// indices (any shape, Int64) -> indices.shape + [embedding_dim].
  Tensor forward(const Tensor& indices) override;

  const int64_t num_embeddings;  ///< number of rows
  const int64_t embedding_dim;   ///< size of each row
  const int64_t padding_idx;     ///< the padding row, or -1
  Tensor weight;                 ///< (num_embeddings, embedding_dim)

 protected:
  /// "10, 3" or "10, 3, padding_idx=0".
  std::string extra_repr() const override;
};

/// Options of LayerNorm: LayerNorm(8, {.eps = 1e-6, .dtype = kFloat64}).
struct LayerNormOptions {
  double eps = 1e-5;               ///< added to the variance
  bool elementwise_affine = true;  ///< learn weight and bias
  bool bias = true;                ///< with elementwise_affine: also learn the bias (PyTorch 2.1's bias=False: none)
  Dtype dtype = kFloat32;          ///< parameter dtype
};

/// Layer normalisation over the trailing dims `normalized_shape` (torch.nn.LayerNorm), using the
/// fused layer_norm op. Parameters "weight" (ones) and "bias" (zeros) of shape normalized_shape when
/// elementwise_affine.
class LayerNorm : public Module {
 public:
  /// Normalises over the trailing dims `normalized_shape` (see LayerNormOptions).
  explicit LayerNorm(Shape normalized_shape, const LayerNormOptions& options = {});
  /// Normalises over the last dim of size `normalized_size` (see LayerNormOptions).
  explicit LayerNorm(int64_t normalized_size, const LayerNormOptions& options = {});
  /// Normalises over the trailing dims `normalized_shape` (PyTorch's positional form; a template so that
  /// LayerNorm(shape, {}) means default options, not eps = 0).
  template <std::floating_point F>
  LayerNorm(Shape normalized_shape, F eps, bool elementwise_affine = true)
      : LayerNorm(std::move(normalized_shape), LayerNormOptions{.eps = eps, .elementwise_affine = elementwise_affine}) {
  }
  /// Normalises over the last dim of size `normalized_size` (PyTorch's positional form).
  template <std::floating_point F>
  LayerNorm(int64_t normalized_size, F eps, bool elementwise_affine = true)
      : LayerNorm(Shape{normalized_size}, LayerNormOptions{.eps = eps, .elementwise_affine = elementwise_affine}) {}
  /// "LayerNorm".
  std::string type_name() const override { return "LayerNorm"; }
  /// x (..., *normalized_shape) -> same shape.
  Tensor forward(const Tensor& x) override;

  const Shape normalized_shape;   ///< the trailing dims normalised over
  const double eps;               ///< added to the variance
  const bool elementwise_affine;  ///< whether weight and bias exist
  Tensor weight;                  ///< normalized_shape, ones (undefined without affine)
  Tensor bias;                    ///< normalized_shape, zeros (undefined without affine or with bias=false)

 protected:
  /// "(4,), eps=1e-05, elementwise_affine=True".
  std::string extra_repr() const override;
};

/// Inverted dropout (torch.nn.Dropout): in training, zeros each element with probability p and
/// scales the rest by 1 / (1 - p); identity in eval mode. Masks are drawn from the generator it
/// holds (default_generator() unless given or set), so re-seeding that generator replays them.
class Dropout : public Module {
 public:
  /// Drop probability p in [0, 1]; masks are drawn from `gen`, which must outlive the module.
  explicit Dropout(double p = 0.5, Generator& gen = default_generator());
  /// "Dropout".
  std::string type_name() const override { return "Dropout"; }
  /// Same shape as x.
  Tensor forward(const Tensor& x) override;
  /// The generator masks are drawn from.
  Generator& generator() const { return *gen_; }
  /// The drop probability.
  double p() const { return p_; }

 protected:
  /// "p=0.5, inplace=False".
  std::string extra_repr() const override;
  /// Draws future masks from `gen` (set_generator's hook).
  void set_own_generator(Generator& gen) override { gen_ = &gen; }

 private:
  double p_;
  Generator* gen_;
};

/// max(x, 0) (torch.nn.ReLU).
class ReLU : public Module {
 public:
  /// "ReLU".
  std::string type_name() const override { return "ReLU"; }
  /// Same shape as x.
  Tensor forward(const Tensor& x) override;
};

/// x * Phi(x) (torch.nn.GELU), exact ("none") or with the tanh approximation ("tanh").
class GELU : public Module {
 public:
  /// approximate is "none" or "tanh".
  explicit GELU(std::string approximate = "none");
  /// "GELU".
  std::string type_name() const override { return "GELU"; }
  /// Same shape as x.
  Tensor forward(const Tensor& x) override;

  const std::string approximate;  ///< "none" or "tanh"

 protected:
  /// "approximate='none'".
  std::string extra_repr() const override;
};

/// tanh(x) (torch.nn.Tanh).
class Tanh : public Module {
 public:
  /// "Tanh".
  std::string type_name() const override { return "Tanh"; }
  /// Same shape as x.
  Tensor forward(const Tensor& x) override;
};

/// 1 / (1 + e^-x) (torch.nn.Sigmoid).
class Sigmoid : public Module {
 public:
  /// "Sigmoid".
  std::string type_name() const override { return "Sigmoid"; }
  /// Same shape as x.
  Tensor forward(const Tensor& x) override;
};

/// x * sigmoid(x) (torch.nn.SiLU, "swish"), composed from the sigmoid and mul ops.
class SiLU : public Module {
 public:
  /// "SiLU".
  std::string type_name() const override { return "SiLU"; }
  /// Same shape as x.
  Tensor forward(const Tensor& x) override;
};

/// softmax along `dim` (torch.nn.Softmax); the row max is subtracted.
class Softmax : public Module {
 public:
  /// Normalises along `dim` (negative counts from the end). PyTorch's implicit dim is not offered.
  explicit Softmax(int64_t d) : dim(d) {}
  /// "Softmax".
  std::string type_name() const override { return "Softmax"; }
  /// Same shape as x.
  Tensor forward(const Tensor& x) override;

  const int64_t dim;  ///< the dimension normalised over

 protected:
  /// "dim=-1".
  std::string extra_repr() const override;
};

/// log(softmax(x)) along `dim` (torch.nn.LogSoftmax), computed with the max shifted out.
class LogSoftmax : public Module {
 public:
  /// Normalises along `dim` (negative counts from the end).
  explicit LogSoftmax(int64_t d) : dim(d) {}
  /// "LogSoftmax".
  std::string type_name() const override { return "LogSoftmax"; }
  /// Same shape as x.
  Tensor forward(const Tensor& x) override;

  const int64_t dim;  ///< the dimension normalised over

 protected:
  /// "dim=-1".
  std::string extra_repr() const override;
};

/// Returns its input (torch.nn.Identity): a placeholder, e.g. for an optional layer in a Sequential.
class Identity : public Module {
 public:
  /// "Identity".
  std::string type_name() const override { return "Identity"; }
  /// x itself (the same handle).
  Tensor forward(const Tensor& x) override;
};

/// Modules applied in order (torch.nn.Sequential); children are named "0", "1", ...
class Sequential : public Module {
 public:
  /// Sequential(make_shared<Linear>(4, 8), make_shared<ReLU>(), ...); no arguments: empty.
  template <class... M>
  explicit Sequential(std::shared_ptr<M>... modules) {
    (push_back(std::move(modules)), ...);
  }
  /// "Sequential".
  std::string type_name() const override { return "Sequential"; }
  /// Appends a module (named by its position).
  void push_back(std::shared_ptr<Module> module);
  /// Number of modules.
  size_t size() const { return modules_.size(); }
  /// The module at position i (negative counts from the end).
  std::shared_ptr<Module> operator[](int64_t i) const;
  /// The module at position i as a T; throws if it is not a T.
  template <class T>
  std::shared_ptr<T> at(int64_t i) const {
    std::shared_ptr<Module> m = (*this)[i];
    auto t = std::dynamic_pointer_cast<T>(m);
    ATTO_CHECK(t != nullptr, type_name(), "module ", i, " is a ", m->type_name(), ", not the requested type");
    return t;
  }
  /// Feeds x through every module in order (identity when empty).
  Tensor forward(const Tensor& x) override;
  /// Iteration over the modules.
  std::vector<std::shared_ptr<Module>>::const_iterator begin() const { return modules_.begin(); }
  /// Iteration over the modules.
  std::vector<std::shared_ptr<Module>>::const_iterator end() const { return modules_.end(); }

 private:
  std::vector<std::shared_ptr<Module>> modules_;
};

/// A list of modules whose parameters are registered (torch.nn.ModuleList); children are named
/// "0", "1", ... It has no forward: the owner calls its elements.
class ModuleList : public Module {
 public:
  /// ModuleList(make_shared<Linear>(4, 4), ...); no arguments: empty.
  template <class... M>
  explicit ModuleList(std::shared_ptr<M>... modules) {
    (push_back(std::move(modules)), ...);
  }
  /// "ModuleList".
  std::string type_name() const override { return "ModuleList"; }
  /// Appends a module (named by its position).
  void push_back(std::shared_ptr<Module> module);
  /// Number of modules.
  size_t size() const { return modules_.size(); }
  /// True when there are no modules.
  bool empty() const { return modules_.empty(); }
  /// The module at position i (negative counts from the end).
  std::shared_ptr<Module> operator[](int64_t i) const;
  /// The module at position i as a T; throws if it is not a T.
  template <class T>
  std::shared_ptr<T> at(int64_t i) const {
    std::shared_ptr<Module> m = (*this)[i];
    auto t = std::dynamic_pointer_cast<T>(m);
    ATTO_CHECK(t != nullptr, type_name(), "module ", i, " is a ", m->type_name(), ", not the requested type");
    return t;
  }
  /// Iteration over the modules.
  std::vector<std::shared_ptr<Module>>::const_iterator begin() const { return modules_.begin(); }
  /// Iteration over the modules.
  std::vector<std::shared_ptr<Module>>::const_iterator end() const { return modules_.end(); }

 private:
  std::vector<std::shared_ptr<Module>> modules_;
};

namespace detail {
/// Python's repr of a float ("0.5", "1e-05", "0.0001", "1.0"), for extra_repr().
std::string py_float(double v);
}  // namespace detail

}  // namespace attograd::nn
