#pragma once
// Tensor: a cheap, shallow-copy handle to an N-dimensional, row-major, contiguous array that can
// take part in reverse-mode automatic differentiation.

#include <atomic>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <iosfwd>
#include <memory>
#include <string>
#include <vector>

#include "autograd/dtype.h"
#include "autograd/error.h"
#include "autograd/random.h"

namespace attograd {

/// A tensor's shape: sizes of each dimension, outermost first.
using Shape = std::vector<int64_t>;

/// Number of elements of a shape (1 for a scalar shape []); throws on negative sizes and on a count above 2^63 - 1.
int64_t shape_numel(const Shape& shape);
/// Largest tensor the creation functions accept: 2^62 bytes (so that no size computed from it overflows; a request
/// the system cannot serve is an Error saying how many bytes were asked for).
inline constexpr uint64_t kMaxTensorBytes = uint64_t{1} << 62;
/// Bytes of a tensor of this shape and dtype, computed without overflow; throws above kMaxTensorBytes.
size_t shape_nbytes(const Shape& shape, Dtype dtype);

/// Raw, 64-byte aligned memory shared by a tensor and its views, from the caching allocator (allocator.h).
struct Storage {
  /// Allocates `nbytes` of uninitialised memory (a reused cached block when one of its size class is free).
  explicit Storage(size_t nbytes);
  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;
  void* data = nullptr;  ///< start of the buffer
  size_t nbytes = 0;     ///< size in bytes
  size_t capacity = 0;   ///< size of the allocator block holding it (>= nbytes)
  /// Set by every write access (non-const Tensor::data<T>(), raw_data(), copy_): a recompute recipe (TensorImpl::recompute)
  /// describes the data only while this is clear (the op that attaches one clears it after writing).
  bool modified = false;
  /// Version counter (PyTorch's): incremented by Tensor::set() and, with grad mode off (NoGradGuard: optimizer
  /// steps, init, in-place changes of parameters), by every write access (non-const data<T>(), raw_data(), copy_,
  /// in-place ops); not with grad mode on, where ops take writable pointers to read. A recorded op notes the version
  /// of each leaf input's storage, and backward refuses to run the op's backward when one has changed (an in-place
  /// change between the forward and the backward would silently give gradients of the new values).
  uint32_t version = 0;
};

class Tensor;
struct Node;

/// The shared state behind a Tensor handle.
struct TensorImpl {
  Shape shape;                       ///< sizes, outermost first
  Dtype dtype = kFloat32;            ///< element type
  std::shared_ptr<Storage> storage;  ///< data (always contiguous, row-major)
  size_t offset = 0;                 ///< byte offset into storage
  bool requires_grad = false;        ///< leaf flag set by the user, or derived for op outputs
  bool retains_grad = false;         ///< keep .grad on a non-leaf (retain_grad())
  std::shared_ptr<TensorImpl> grad;  ///< accumulated gradient (leaves, or non-leaves with retain_grad)
  std::shared_ptr<Node> grad_fn;     ///< the op that produced this tensor (null for leaves)
  /// Engine bookkeeping: how many recorded ops hold this (non-leaf) tensor as an input. When every remaining owner
  /// is such an op (no Tensor handle is left), the data is released: backward never reads it (ops save what they
  /// need with detach()), so a forward pass keeps only what the backward will use.
  std::atomic<int32_t> graph_refs{0};
  /// Set by ops whose output is cheap to rebuild, bit for bit, from values their own node already keeps
  /// (layer_norm): consumers then save this recipe instead of the data (see SavedTensor), so the output's memory
  /// goes with the forward pass. Dropped as soon as no new op can use it (the last handle goes, or the backward
  /// pass reaches the tensor): the consumers keep their own copies.
  std::shared_ptr<const std::function<Tensor()>> recompute;
  ~TensorImpl();
};

/// Options for creation functions, read like PyTorch keyword arguments:
/// zeros({2, 3}, {.dtype = kFloat64, .requires_grad = true}).
struct TensorOptions {
  Dtype dtype = kFloat32;      ///< element type
  bool requires_grad = false;  ///< make the new tensor a leaf that records gradients
};

/// N-dimensional array handle. Copies share data and autograd history; detach() makes a new leaf.
class Tensor {
 public:
  /// An undefined tensor (defined() is false).
  Tensor() = default;
  /// Wraps an existing impl (engine and op implementations use this).
  explicit Tensor(std::shared_ptr<TensorImpl> impl) : impl_(std::move(impl)) {}
  /// Another handle to the same tensor.
  Tensor(const Tensor&) = default;
  /// Takes over the handle.
  Tensor(Tensor&&) noexcept = default;
  /// Refers to other's tensor (releasing this handle's as the destructor does).
  Tensor& operator=(const Tensor& other) {
    if (this != &other) {
      release_if_graph_only();
      impl_ = other.impl_;
    }
    return *this;
  }
  /// Takes over other's handle (releasing this handle's as the destructor does).
  Tensor& operator=(Tensor&& other) noexcept {
    if (this != &other) {
      release_if_graph_only();
      impl_ = std::move(other.impl_);
    }
    return *this;
  }
  /// Drops the handle; the last handle of an intermediate result that only the graph still refers to releases its
  /// data (see TensorImpl::graph_refs).
  ~Tensor() { release_if_graph_only(); }

  /// True when the handle refers to a tensor.
  bool defined() const { return impl_ != nullptr; }
  /// Sizes of each dimension.
  const Shape& shape() const;
  /// Alias of shape() (PyTorch's sizes()).
  const Shape& sizes() const { return shape(); }
  /// Number of dimensions.
  int64_t dim() const;
  /// Size of dimension d (negative d counts from the end).
  int64_t size(int64_t d) const;
  /// Number of elements.
  int64_t numel() const;
  /// Element type.
  Dtype dtype() const;
  /// Size in bytes of the data.
  size_t nbytes() const;

  /// Typed pointer to the first element; throws if T does not match dtype().
  template <class T> T* data();
  /// Typed pointer to the first element; throws if T does not match dtype().
  template <class T> const T* data() const;
  /// Untyped writable pointer to the first element; like the non-const data<T>(), it marks the storage as
  /// written (Storage::modified), so a recompute recipe is not trusted afterwards. Read through const_raw_data().
  void* raw_data() const;
  /// Untyped read-only pointer to the first element (does not mark the storage as written).
  const void* const_raw_data() const;

  /// The value of a one-element tensor as double.
  double item() const;
  /// The value of a one-element tensor as T.
  template <class T> T item() const { return static_cast<T>(item()); }
  /// The element at a full index (negative indices count from the end), as double.
  double at(std::initializer_list<int64_t> index) const;
  /// The element at a flat (row-major) index, as double.
  double flat(int64_t i) const;
  /// Sets the element at a full index (no autograd record; the tensor must not need grad history).
  void set(std::initializer_list<int64_t> index, double value);
  /// All elements converted to T, in row-major order.
  template <class T> std::vector<T> to_vector() const;

  /// Marks a leaf as needing gradients (float dtypes only).
  Tensor& requires_grad_(bool value = true);
  /// True if gradients flow to or through this tensor.
  bool requires_grad() const;
  /// True for tensors not produced by a recorded op.
  bool is_leaf() const;
  /// The accumulated gradient (undefined until a backward reaches this tensor).
  Tensor grad() const;
  /// Sets the gradient (undefined tensor clears it).
  void set_grad(const Tensor& g);
  /// Makes backward() keep the gradient of this non-leaf tensor in grad().
  void retain_grad();
  /// Zeros the gradient in place (no allocation), or drops it when set_to_none.
  void zero_grad(bool set_to_none = false);
  /// Name of the op that produced this tensor ("" for leaves).
  std::string grad_fn_name() const;

  /// Back-propagates from this tensor. A one-element tensor may omit `gradient` (seed 1);
  /// otherwise `gradient` must have this tensor's shape. The graph is freed unless retain_graph.
  void backward(const Tensor& gradient = Tensor(), bool retain_graph = false) const;

  /// A new leaf sharing this tensor's data, without history.
  Tensor detach() const;
  /// A deep copy (records a differentiable copy when grad is enabled).
  Tensor clone() const;
  /// Converts to another dtype (differentiable between float types; returns *this if same).
  Tensor to(Dtype dtype) const;
  /// True if both handles share one impl.
  bool is_same(const Tensor& other) const { return impl_ == other.impl_; }

  /// PyTorch-style text, e.g. "tensor([[1., 2.]], requires_grad=True)".
  std::string to_string() const;

  /// The shared state (for op implementations).
  const std::shared_ptr<TensorImpl>& impl() const { return impl_; }

 private:
  void check_defined(const char* op) const;
  void release_if_graph_only() noexcept {
    if (impl_ && impl_->graph_refs.load(std::memory_order_relaxed) != 0) release_data_if_unreachable();
  }
  void release_data_if_unreachable() noexcept;
  std::shared_ptr<TensorImpl> impl_;
};

/// Streams Tensor::to_string().
std::ostream& operator<<(std::ostream& os, const Tensor& t);

// ---------------------------------------------------------------------------------------------
// Creation

/// Uninitialised tensor of the given shape.
Tensor empty(const Shape& shape, TensorOptions opts = {});
/// All zeros.
Tensor zeros(const Shape& shape, TensorOptions opts = {});
/// All ones.
Tensor ones(const Shape& shape, TensorOptions opts = {});
/// All `value`.
Tensor full(const Shape& shape, double value, TensorOptions opts = {});
/// Same shape and dtype as `like`, zeros.
Tensor zeros_like(const Tensor& like);
/// Same shape and dtype as `like`, ones.
Tensor ones_like(const Tensor& like);
/// Same shape and dtype as `like`, uninitialised.
Tensor empty_like(const Tensor& like);
/// Values start, start+step, ... up to end, exclusive (1-D; torch.arange). Error for a zero or non-finite step, or
/// one whose sign points away from end (start == end: empty).
Tensor arange(double start, double end, double step = 1.0, TensorOptions opts = {});
/// Values 0, 1, ..., end-1 (1-D).
Tensor arange(int64_t end, TensorOptions opts = {});
/// A 1-D tensor holding `values` (converted to opts.dtype).
template <class T>
Tensor from_vector(const std::vector<T>& values, TensorOptions opts = {.dtype = dtype_of<T>()});
/// A tensor holding `values` (converted to opts.dtype) with the given shape; an empty shape {} is a 0-d tensor
/// (exactly one value), as torch.tensor(v).reshape(()).
template <class T>
Tensor from_vector(const std::vector<T>& values, const Shape& shape, TensorOptions opts = {.dtype = dtype_of<T>()});
/// A 0-d tensor holding one value.
Tensor scalar_tensor(double value, TensorOptions opts = {});
/// Uniform samples in [0, 1).
Tensor rand(const Shape& shape, Generator& gen = default_generator(), TensorOptions opts = {});
/// Standard normal samples.
Tensor randn(const Shape& shape, Generator& gen = default_generator(), TensorOptions opts = {});
/// Integers uniform in [low, high), dtype Int64 unless opts says otherwise.
Tensor randint(int64_t low, int64_t high, const Shape& shape, Generator& gen = default_generator(),
               TensorOptions opts = {.dtype = kInt64});

// ---------------------------------------------------------------------------------------------
// Autograd

/// Whether ops record history on this thread.
bool is_grad_enabled();
/// Enables or disables recording on this thread.
void set_grad_enabled(bool enabled);

/// RAII switch that turns off recording on this thread for its lifetime (torch.no_grad()).
class NoGradGuard {
 public:
  NoGradGuard() : prev_(is_grad_enabled()) { set_grad_enabled(false); }
  ~NoGradGuard() { set_grad_enabled(prev_); }
  NoGradGuard(const NoGradGuard&) = delete;
  NoGradGuard& operator=(const NoGradGuard&) = delete;

 private:
  bool prev_;
};

/// Gradients handed to an op's backward: grads[i] is to be set (input i's shape) when needs(i).
class GradInputs {
 public:
  /// n slots; need[i] tells whether input i wants a gradient.
  explicit GradInputs(std::vector<bool> need) : need_(std::move(need)), g_(need_.size()) {}
  /// True when input i wants a gradient.
  bool needs(size_t i) const { return need_[i]; }
  /// The slot for input i.
  Tensor& operator[](size_t i) { return g_[i]; }
  /// Number of inputs.
  size_t size() const { return g_.size(); }

 private:
  std::vector<bool> need_;
  std::vector<Tensor> g_;
};

/// An op's backward: receives the output's gradient and fills the inputs' gradients.
/// It must not capture the output's own handle (use out.detach()).
using BackwardFn = std::function<void(const Tensor& grad_output, GradInputs& grads)>;

/// A value a backward function keeps: a detached view of the tensor, or, for an output with a recompute recipe
/// (TensorImpl::recompute), only the recipe, the value being rebuilt (bit-identical) when the backward asks for it.
class SavedTensor {
 public:
  /// Nothing saved.
  SavedTensor() = default;
  /// Saves t (undefined stays undefined).
  explicit SavedTensor(const Tensor& t);
  /// The saved value; a fresh tensor when it is recomputed.
  Tensor get() const;
  /// Drops the value (or its recipe).
  void reset();

 private:
  Tensor value_;
  std::shared_ptr<const std::function<Tensor()>> recompute_;
};

namespace detail {
/// True when a write access counts in Storage::version: grad mode off, outside a backward pass.
bool writes_bump_version();
}  // namespace detail

/// True while a backward pass that frees the graph as it goes (retain_graph = false) runs a backward function on
/// this thread: the function may then drop a saved value as soon as it has used it, so that its memory serves
/// the function's later results.
bool backward_frees_saved();

/// A recorded op's reference to one of its inputs (null when that input gets no gradient). While it holds a
/// non-leaf input it counts in the input's graph_refs.
class InputRef {
 public:
  /// A null reference.
  InputRef() = default;
  /// Refers to `impl` (may be null).
  explicit InputRef(std::shared_ptr<TensorImpl> impl);
  InputRef(const InputRef&) = delete;
  InputRef& operator=(const InputRef&) = delete;
  /// Takes over other's reference.
  InputRef(InputRef&& other) noexcept : impl_(std::move(other.impl_)), counted_(other.counted_) { other.counted_ = false; }
  /// Takes over other's reference.
  InputRef& operator=(InputRef&& other) noexcept;
  /// Drops the reference.
  ~InputRef() { reset(); }
  /// Drops the reference (uncounting it).
  void reset() noexcept;
  /// The input.
  TensorImpl* get() const { return impl_.get(); }
  /// The input.
  TensorImpl* operator->() const { return impl_.get(); }
  /// The owning pointer.
  const std::shared_ptr<TensorImpl>& ptr() const { return impl_; }
  /// True when it refers to an input.
  explicit operator bool() const { return impl_ != nullptr; }

 private:
  std::shared_ptr<TensorImpl> impl_;
  bool counted_ = false;
};

/// The version of a leaf input's storage when an op was recorded (see Storage::version).
struct SavedVersion {
  std::weak_ptr<Storage> storage;    ///< the input's data
  std::weak_ptr<TensorImpl> tensor;  ///< the input (for its shape in the error)
  uint32_t version = 0;              ///< Storage::version at record time
  size_t input = 0;                  ///< which input of the op
};

/// A recorded op in the graph.
struct Node {
  const char* name = "";        ///< op name, for errors and printing
  std::vector<InputRef> inputs;  ///< the op's tensor inputs (null: no grad)
  BackwardFn backward;          ///< null once the graph is freed
  std::vector<SavedVersion> leaf_versions;  ///< versions of the leaf inputs' data, checked before backward
};

/// Records `out` as the result of op `name` applied to `inputs` when grad mode is on and some
/// input requires grad; returns `out`. Call at the end of every differentiable op.
Tensor record(const char* name, Tensor out, std::initializer_list<Tensor> inputs, BackwardFn backward);
/// Same as above with a vector of inputs (concat, stack).
Tensor record(const char* name, Tensor out, const std::vector<Tensor>& inputs, BackwardFn backward);
/// True when grad mode is on and any of `inputs` requires grad (ops use it to skip saving).
bool any_requires_grad(std::initializer_list<Tensor> inputs);
/// For backward functions whose result has g's shape and whose element i depends only on g's element i (and saved
/// values): g itself when nothing else can see its values, so the result may be written over it (one buffer less),
/// else a new uninitialised tensor like g.
Tensor reuse_or_empty_like(const Tensor& g);
/// For forward ops whose element i depends only on element i of an input handed over as an rvalue: a new tensor on
/// that input's storage when nothing else can see its values (the last handle, no view, no saved copy: the op that
/// produced it does not need it), so the op may write its result over it (one buffer less at the peak); else a new
/// uninitialised tensor like it. The input keeps its place in the graph.
Tensor reuse_temporary_or_empty(Tensor&& x);

}  // namespace attograd
