#pragma once
// Mixed precision (torch.autocast("cpu", dtype=torch.bfloat16)): while an Autocast is alive on a thread, the float32
// matrix products of linear, matmul and scaled_dot_product_attention take bfloat16 operands (rounded to nearest
// even) with float32 accumulation and float32 results; every other op, the parameters, the optimizer state and the
// loss stay float32, and float64 is never touched (gradcheck). An op records the precision of its forward, and its
// backward products run in the same precision whether or not the Autocast is still alive (as PyTorch's bf16 tensors
// do). The list of ops is in docs/CPU.md.

#include <string>

#include "autograd/tensor.h"

namespace attograd {

/// The precision of the matmul-class ops: float32 (the default) or bfloat16 operands with float32 accumulation.
enum class Precision { float32, bfloat16 };

/// "fp32"/"float32" or "bf16"/"bfloat16"; anything else is an Error naming it.
Precision parse_precision(const std::string& name);
/// "fp32" or "bf16" (the CLI's spelling).
std::string precision_name(Precision p);

/// The precision this thread's float32 linear, matmul and attention run in now.
Precision autocast_precision();

/// x.to(torch.bfloat16).to(torch.float32): a float32 tensor's values rounded to the nearest bfloat16 (ties to even;
/// denormals become zero, as vcvtne2ps2bf16 does). Its gradient passes through unchanged, as a cast's does. float64
/// is returned as is.
Tensor round_to_bf16(const Tensor& x);

/// RAII switch (torch.autocast("cpu", dtype=torch.bfloat16, enabled=enabled)): sets this thread's precision to
/// bfloat16 (or float32 when !enabled) for its lifetime, then restores the previous one. Nests.
class Autocast {
 public:
  /// Runs the scope in `p` (Precision::bfloat16 = autocast on).
  explicit Autocast(Precision p = Precision::bfloat16);
  /// torch.autocast's enabled flag: bfloat16 when true, float32 when false.
  explicit Autocast(bool enabled) : Autocast(enabled ? Precision::bfloat16 : Precision::float32) {}
  ~Autocast();
  Autocast(const Autocast&) = delete;
  Autocast& operator=(const Autocast&) = delete;

 private:
  Precision prev_;
};

}  // namespace attograd
