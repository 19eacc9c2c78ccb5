#include "autograd/tensor.h"

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <iomanip>
#include <ostream>
#include <sstream>
#include <utility>

#include "autograd/allocator.h"
#include "autograd/elementwise.h"

namespace attograd {

int64_t shape_numel(const Shape& shape) {
  int64_t n = 1;
  for (int64_t s : shape) {
    ATTO_CHECK(s >= 0, "shape", "negative dimension ", s, " in shape ", shape);
    if (__builtin_mul_overflow(n, s, &n)) {
      // A zero later on makes the count 0 (an empty tensor), whatever the other sizes.
      for (int64_t z : shape) {
        ATTO_CHECK(z >= 0, "shape", "negative dimension ", z, " in shape ", shape);
        if (z == 0) return 0;
      }
      throw Error("shape", str_cat("shape ", shape, " has more than 2^63 elements"));
    }
  }
  return n;
}

size_t shape_nbytes(const Shape& shape, Dtype dtype) {
  const int64_t n = shape_numel(shape);
  uint64_t bytes = 0;
  if (__builtin_mul_overflow(static_cast<uint64_t>(n), static_cast<uint64_t>(dtype_size(dtype)), &bytes) ||
      bytes > kMaxTensorBytes)
    throw Error("shape", str_cat("a ", dtype_name(dtype), " tensor of shape ", shape, " (", n,
                             " elements) would need more than the largest tensor size of 2^62 bytes"));
  return static_cast<size_t>(bytes);
}

// Storage memory comes from the caching allocator (allocator.h): steady-state training reuses freed blocks.
Storage::Storage(size_t n) : nbytes(n) { data = detail::storage_alloc(n, &capacity); }

Storage::~Storage() { detail::storage_free(data, nbytes, capacity); }

// ---------------------------------------------------------------------------------------------
// Handle accessors

void Tensor::check_defined(const char* op) const {
  if (!impl_) throw Error(op, "called on an undefined tensor");
}

const Shape& Tensor::shape() const {
  check_defined("shape");
  return impl_->shape;
}

int64_t Tensor::dim() const { return static_cast<int64_t>(shape().size()); }

int64_t Tensor::size(int64_t d) const {
  int64_t n = dim();
  int64_t w = d < 0 ? d + n : d;
  ATTO_CHECK(w >= 0 && w < n, "size", "dimension ", d, " out of range for a tensor of shape ", shape());
  return impl_->shape[w];
}

int64_t Tensor::numel() const { return shape_numel(shape()); }

Dtype Tensor::dtype() const {
  check_defined("dtype");
  return impl_->dtype;
}

size_t Tensor::nbytes() const { return static_cast<size_t>(numel()) * dtype_size(dtype()); }

void* Tensor::raw_data() const {
  void* p = const_cast<void*>(const_raw_data());
  impl_->storage->modified = true;  // a writable pointer: a write access (see Storage::modified)
  if (detail::writes_bump_version()) ++impl_->storage->version;  // see Storage::version
  return p;
}

const void* Tensor::const_raw_data() const {
  check_defined("data");
  return static_cast<const char*>(impl_->storage->data) + impl_->offset;
}

template <class T>
T* Tensor::data() {
  T* p = const_cast<T*>(std::as_const(*this).data<T>());
  impl_->storage->modified = true;  // a write access (see Storage::modified)
  if (detail::writes_bump_version()) ++impl_->storage->version;  // see Storage::version
  return p;
}

template <class T>
const T* Tensor::data() const {
  check_defined("data");
  ATTO_CHECK(impl_->dtype == dtype_of<T>(), "data", "requested ", dtype_name(dtype_of<T>()),
             " pointer from a ", dtype_name(impl_->dtype), " tensor");
  return static_cast<const T*>(const_raw_data());
}

template float* Tensor::data<float>();
template double* Tensor::data<double>();
template int64_t* Tensor::data<int64_t>();
template bool* Tensor::data<bool>();
template const float* Tensor::data<float>() const;
template const double* Tensor::data<double>() const;
template const int64_t* Tensor::data<int64_t>() const;
template const bool* Tensor::data<bool>() const;

double Tensor::flat(int64_t i) const {
  int64_t n = numel();
  ATTO_CHECK(i >= 0 && i < n, "flat", "index ", i, " out of range for ", n, " elements");
  return dispatch_all(dtype(), [&]<typename T>() { return static_cast<double>(data<T>()[i]); });
}

double Tensor::item() const {
  ATTO_CHECK(numel() == 1, "item", "only a one-element tensor can be converted to a scalar, got shape ",
             shape());
  return flat(0);
}

static int64_t flat_index(const Shape& shape, std::initializer_list<int64_t> index, const char* op) {
  ATTO_CHECK(index.size() == shape.size(), op, "index has ", index.size(), " entries for a tensor of shape ",
             shape);
  int64_t f = 0, d = 0;
  for (int64_t i : index) {
    int64_t w = i < 0 ? i + shape[d] : i;
    ATTO_CHECK(w >= 0 && w < shape[d], op, "index ", i, " out of range for dimension ", d, " of shape ", shape);
    f = f * shape[d] + w;
    ++d;
  }
  return f;
}

double Tensor::at(std::initializer_list<int64_t> index) const { return flat(flat_index(shape(), index, "at")); }

void Tensor::set(std::initializer_list<int64_t> index, double value) {
  int64_t f = flat_index(shape(), index, "set");
  dispatch_all(dtype(), [&]<typename T>() { data<T>()[f] = static_cast<T>(value); });
  if (is_grad_enabled()) ++impl_->storage->version;  // a write in any mode (data<T>() counts it without grad mode)
}

template <class T>
std::vector<T> Tensor::to_vector() const {
  std::vector<T> out(static_cast<size_t>(numel()));
  dispatch_all(dtype(), [&]<typename S>() {
    const S* p = data<S>();
    for (size_t i = 0; i < out.size(); ++i) out[i] = static_cast<T>(p[i]);
  });
  return out;
}
template std::vector<float> Tensor::to_vector<float>() const;
template std::vector<double> Tensor::to_vector<double>() const;
template std::vector<int64_t> Tensor::to_vector<int64_t>() const;
template std::vector<bool> Tensor::to_vector<bool>() const;

// ---------------------------------------------------------------------------------------------
// Autograd accessors

Tensor& Tensor::requires_grad_(bool value) {
  check_defined("requires_grad_");
  ATTO_CHECK(!value || is_floating(impl_->dtype), "requires_grad_",
             "only float32/float64 tensors can require gradients, got ", dtype_name(impl_->dtype));
  ATTO_CHECK(impl_->grad_fn == nullptr, "requires_grad_",
             "can only change requires_grad of a leaf tensor (this one comes from '", impl_->grad_fn->name,
             "'); use detach()");
  impl_->requires_grad = value;
  return *this;
}

bool Tensor::requires_grad() const { return impl_ && impl_->requires_grad; }

bool Tensor::is_leaf() const { return impl_ && impl_->grad_fn == nullptr; }

Tensor Tensor::grad() const {
  check_defined("grad");
  return Tensor(impl_->grad);
}

void Tensor::set_grad(const Tensor& g) {
  check_defined("set_grad");
  if (g.defined())
    ATTO_CHECK(g.shape() == shape() && g.dtype() == dtype(), "set_grad", "gradient of shape ", g.shape(), " (",
               dtype_name(g.dtype()), ") does not match tensor of shape ", shape(), " (", dtype_name(dtype()), ")");
  impl_->grad = g.impl();
}

void Tensor::retain_grad() {
  check_defined("retain_grad");
  ATTO_CHECK(requires_grad(), "retain_grad", "tensor does not require grad");
  impl_->retains_grad = true;
}

void Tensor::zero_grad(bool set_to_none) {
  check_defined("zero_grad");
  if (!impl_->grad) return;
  if (set_to_none) {
    impl_->grad.reset();
    return;
  }
  std::memset(Tensor(impl_->grad).raw_data(), 0, Tensor(impl_->grad).nbytes());
}

std::string Tensor::grad_fn_name() const {
  check_defined("grad_fn");
  return impl_->grad_fn ? impl_->grad_fn->name : "";
}

Tensor Tensor::detach() const {
  check_defined("detach");
  auto t = std::make_shared<TensorImpl>();
  t->shape = impl_->shape;
  t->dtype = impl_->dtype;
  t->storage = impl_->storage;
  t->offset = impl_->offset;
  return Tensor(std::move(t));
}

Tensor Tensor::clone() const {
  check_defined("clone");
  Tensor out = empty(shape(), {.dtype = dtype()});
  std::memcpy(out.raw_data(), const_raw_data(), nbytes());
  return record("clone", out, {*this}, [](const Tensor& g, GradInputs& gi) { gi[0] = g; });
}

Tensor Tensor::to(Dtype target) const {
  check_defined("to");
  if (target == dtype()) return *this;
  Tensor out = empty(shape(), {.dtype = target});
  int64_t n = numel();
  dispatch_all(dtype(), [&]<typename S>() {
    const S* src = data<S>();
    dispatch_all(target, [&]<typename D>() {
      D* dst = out.data<D>();
      for (int64_t i = 0; i < n; ++i) dst[i] = static_cast<D>(src[i]);
    });
  });
  if (!is_floating(dtype()) || !is_floating(target)) return out;
  Dtype from = dtype();
  return record("to", out, {*this}, [from](const Tensor& g, GradInputs& gi) { gi[0] = g.to(from); });
}

// ---------------------------------------------------------------------------------------------
// Printing

std::string Tensor::to_string() const {
  if (!impl_) return "tensor(undefined)";
  std::ostringstream os;
  const Shape& s = shape();
  int64_t n = numel();
  bool fl = is_floating(dtype());
  auto elem = [&](int64_t i) {
    double v = flat(i);
    if (dtype() == kBool) {
      os << (v != 0 ? "True" : "False");
    } else if (!fl) {
      os << static_cast<int64_t>(v);
    } else if (std::isnan(v)) {
      os << "nan";
    } else if (std::isinf(v)) {
      os << (v > 0 ? "inf" : "-inf");
    } else if (v == std::floor(v) && std::fabs(v) < 1e6) {
      os << static_cast<int64_t>(v) << ".";
    } else {
      os << std::setprecision(4) << v;
    }
  };
  os << "tensor(";
  if (s.empty()) {
    elem(0);
  } else {
    // Recursive over dimensions is fine here: depth is the rank, not the graph.
    std::function<void(size_t, int64_t)> rec = [&](size_t d, int64_t base) {
      os << "[";
      int64_t stride = 1;
      for (size_t k = d + 1; k < s.size(); ++k) stride *= s[k];
      const int64_t limit = 6;
      for (int64_t i = 0; i < s[d]; ++i) {
        if (s[d] > 2 * limit && i == limit) {
          os << "...";
          i = s[d] - limit - 1;
          if (d + 1 < s.size()) os << ",\n" << std::string(8 + d, ' ');
          else os << ", ";
          continue;
        }
        if (d + 1 == s.size()) elem(base + i);
        else rec(d + 1, base + i * stride);
        if (i + 1 < s[d]) {
          if (d + 1 < s.size()) os << ",\n" << std::string(8 + d, ' ');
          else os << ", ";
        }
      }
      os << "]";
    };
    if (n == 0) os << "[]";
    else rec(0, 0);
  }
  if (n == 0 || s.size() > 1 || dtype() != kFloat32) {
    if (n == 0) os << ", size=" << shape_str(s);
  }
  if (dtype() != kFloat32 && dtype() != kInt64 && dtype() != kBool) os << ", dtype=" << dtype_name(dtype());
  if (dtype() == kInt64 && false) os << ", dtype=int64";
  if (impl_->grad_fn) os << ", grad_fn=<" << impl_->grad_fn->name << ">";
  else if (impl_->requires_grad) os << ", requires_grad=True";
  os << ")";
  return os.str();
}

std::ostream& operator<<(std::ostream& os, const Tensor& t) { return os << t.to_string(); }

// ---------------------------------------------------------------------------------------------
// Creation

Tensor empty(const Shape& shape, TensorOptions opts) {
  const size_t nbytes = shape_nbytes(shape, opts.dtype);
  auto t = std::make_shared<TensorImpl>();
  t->shape = shape;
  t->dtype = opts.dtype;
  t->storage = std::make_shared<Storage>(nbytes);
  Tensor out(std::move(t));
  if (opts.requires_grad) out.requires_grad_(true);
  return out;
}

Tensor full(const Shape& shape, double value, TensorOptions opts) {
  Tensor out = empty(shape, {.dtype = opts.dtype});
  int64_t n = out.numel();
  dispatch_all(opts.dtype, [&]<typename T>() {
    T* p = out.data<T>();
    T v = static_cast<T>(value);
    for (int64_t i = 0; i < n; ++i) p[i] = v;
  });
  if (opts.requires_grad) out.requires_grad_(true);
  return out;
}

Tensor zeros(const Shape& shape, TensorOptions opts) {
  Tensor out = empty(shape, {.dtype = opts.dtype});
  std::memset(out.raw_data(), 0, out.nbytes());
  if (opts.requires_grad) out.requires_grad_(true);
  return out;
}

Tensor ones(const Shape& shape, TensorOptions opts) { return full(shape, 1.0, opts); }
Tensor zeros_like(const Tensor& like) { return zeros(like.shape(), {.dtype = like.dtype()}); }
Tensor ones_like(const Tensor& like) { return ones(like.shape(), {.dtype = like.dtype()}); }
Tensor empty_like(const Tensor& like) { return empty(like.shape(), {.dtype = like.dtype()}); }

Tensor arange(double start, double end, double step, TensorOptions opts) {
  ATTO_CHECK(step != 0 && std::isfinite(step), "arange", "step must be finite and non-zero, got ", step);
  ATTO_CHECK(std::isfinite(start) && std::isfinite(end), "arange", "start and end must be finite, got ", start,
             " and ", end);
  // PyTorch: "upper bound and larger bound inconsistent with step sign" (start == end gives an empty tensor).
  ATTO_CHECK((step > 0 && end >= start) || (step < 0 && end <= start), "arange", "a step of ", step,
             " points away from end ", end, " (start ", start, "): the step's sign must take start towards end");
  double count = std::ceil((end - start) / step);
  int64_t n = count > 0 ? static_cast<int64_t>(count) : 0;
  Tensor out = empty({n}, {.dtype = opts.dtype});
  dispatch_all(opts.dtype, [&]<typename T>() {
    T* p = out.data<T>();
    for (int64_t i = 0; i < n; ++i) p[i] = static_cast<T>(start + static_cast<double>(i) * step);
  });
  if (opts.requires_grad) out.requires_grad_(true);
  return out;
}

Tensor arange(int64_t end, TensorOptions opts) { return arange(0.0, static_cast<double>(end), 1.0, opts); }

template <class T>
Tensor from_vector(const std::vector<T>& values, TensorOptions opts) {
  return from_vector(values, Shape{static_cast<int64_t>(values.size())}, opts);
}

template <class T>
Tensor from_vector(const std::vector<T>& values, const Shape& shape, TensorOptions opts) {
  ATTO_CHECK(shape_numel(shape) == static_cast<int64_t>(values.size()), "from_vector", "got ", values.size(),
             " values for shape ", shape, " (", shape_numel(shape), " elements", shape.empty() ? ", a 0-d tensor" : "",
             ")");
  Tensor out = empty(shape, {.dtype = opts.dtype});
  dispatch_all(opts.dtype, [&]<typename D>() {
    D* p = out.data<D>();
    for (size_t i = 0; i < values.size(); ++i) p[i] = static_cast<D>(values[i]);
  });
  if (opts.requires_grad) out.requires_grad_(true);
  return out;
}
template Tensor from_vector<float>(const std::vector<float>&, TensorOptions);
template Tensor from_vector<float>(const std::vector<float>&, const Shape&, TensorOptions);
template Tensor from_vector<double>(const std::vector<double>&, TensorOptions);
template Tensor from_vector<double>(const std::vector<double>&, const Shape&, TensorOptions);
template Tensor from_vector<int64_t>(const std::vector<int64_t>&, TensorOptions);
template Tensor from_vector<int64_t>(const std::vector<int64_t>&, const Shape&, TensorOptions);
template Tensor from_vector<int>(const std::vector<int>&, TensorOptions);
template Tensor from_vector<int>(const std::vector<int>&, const Shape&, TensorOptions);
template Tensor from_vector<bool>(const std::vector<bool>&, TensorOptions);
template Tensor from_vector<bool>(const std::vector<bool>&, const Shape&, TensorOptions);

Tensor scalar_tensor(double value, TensorOptions opts) { return full({}, value, opts); }

Tensor rand(const Shape& shape, Generator& gen, TensorOptions opts) {
  Tensor out = empty(shape, {.dtype = opts.dtype});
  int64_t n = out.numel();
  dispatch_float(opts.dtype, "rand", [&]<typename T>() {
    T* p = out.data<T>();
    for (int64_t i = 0; i < n; ++i) p[i] = static_cast<T>(gen.uniform());
  });
  if (opts.requires_grad) out.requires_grad_(true);
  return out;
}

Tensor randn(const Shape& shape, Generator& gen, TensorOptions opts) {
  Tensor out = empty(shape, {.dtype = opts.dtype});
  int64_t n = out.numel();
  dispatch_float(opts.dtype, "randn", [&]<typename T>() {
    T* p = out.data<T>();
    for (int64_t i = 0; i < n; ++i) p[i] = static_cast<T>(gen.normal());
  });
  if (opts.requires_grad) out.requires_grad_(true);
  return out;
}

Tensor randint(int64_t low, int64_t high, const Shape& shape, Generator& gen, TensorOptions opts) {
  ATTO_CHECK(high > low, "randint", "high (", high, ") must be greater than low (", low, ")");
  Tensor out = empty(shape, {.dtype = opts.dtype});
  int64_t n = out.numel();
  auto range = static_cast<uint64_t>(high - low);
  dispatch_all(opts.dtype, [&]<typename T>() {
    T* p = out.data<T>();
    for (int64_t i = 0; i < n; ++i) p[i] = static_cast<T>(low + static_cast<int64_t>(gen.randint(range)));
  });
  return out;
}

}  // namespace attograd
