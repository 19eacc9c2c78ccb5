#include "autograd/autocast.h"

#include "autograd/error.h"
#include "autograd/gemm.h"
#include "autograd/parallel.h"

namespace attograd {

namespace {
thread_local Precision t_precision = Precision::float32;
}  // namespace

Precision parse_precision(const std::string& name) {
  if (name == "fp32" || name == "float32") return Precision::float32;
  if (name == "bf16" || name == "bfloat16") return Precision::bfloat16;
  throw Error("precision", "unknown precision '" + name + "' (expected fp32 or bf16)");
}

std::string precision_name(Precision p) { return p == Precision::bfloat16 ? "bf16" : "fp32"; }

Precision autocast_precision() { return t_precision; }

Tensor round_to_bf16(const Tensor& x) {
  ATTO_CHECK(x.defined(), "round_to_bf16", "x must be a defined tensor");
  if (x.dtype() != kFloat32) return x;
  Tensor out = empty(x.shape());
  const float* src = x.data<float>();
  float* dst = out.data<float>();
  parallel_for(0, x.numel(), 1 << 16, [&](int64_t i0, int64_t i1) { detail::round_bf16(src + i0, dst + i0, i1 - i0); });
  if (!x.requires_grad() || !is_grad_enabled()) return out;
  return record("round_to_bf16", out, {x}, [](const Tensor& g, GradInputs& gi) { gi[0] = g; });
}

Autocast::Autocast(Precision p) : prev_(t_precision) { t_precision = p; }

Autocast::~Autocast() { t_precision = prev_; }

}  // namespace attograd
