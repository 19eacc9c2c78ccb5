#pragma once
// Post-accumulate-grad hooks (PyTorch's Tensor.register_post_accumulate_grad_hook): a function the engine calls
// right after backward() has added a leaf's gradient of this pass into its .grad. The engine sums every
// contribution to a leaf before it accumulates, so a hook runs once per leaf and backward pass, when that leaf's
// gradient is final. Data-parallel training (train/dist) uses them to start reducing gradients while the backward
// is still computing the others.

#include <cstdint>
#include <functional>

#include "autograd/tensor.h"

namespace attograd {

/// Removes its hook when destroyed (movable, not copyable).
class GradHookHandle {
 public:
  /// No hook.
  GradHookHandle() = default;
  /// Removes the hook.
  ~GradHookHandle() { remove(); }
  /// Takes over another handle's hook.
  GradHookHandle(GradHookHandle&& other) noexcept : id_(other.id_) { other.id_ = 0; }
  /// Removes this hook, then takes over the other's.
  GradHookHandle& operator=(GradHookHandle&& other) noexcept;
  GradHookHandle(const GradHookHandle&) = delete;
  GradHookHandle& operator=(const GradHookHandle&) = delete;
  /// Removes the hook now (idempotent).
  void remove() noexcept;

 private:
  friend GradHookHandle register_post_accumulate_grad_hook(const Tensor&, std::function<void(const Tensor&)>);
  uint64_t id_ = 0;
};

/// Calls fn(leaf) after each backward pass has accumulated into leaf.grad() (leaf: a tensor that requires grad and
/// was not produced by a recorded op; Error otherwise). Hooks of one leaf run in registration order, on the thread
/// that runs backward().
GradHookHandle register_post_accumulate_grad_hook(const Tensor& leaf, std::function<void(const Tensor&)> fn);

}  // namespace attograd
