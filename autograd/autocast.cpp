#include "autograd/autocast.h"

#include "autograd/error.h"

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

Autocast::Autocast(Precision p) : prev_(t_precision) { t_precision = p; }

Autocast::~Autocast() { t_precision = prev_; }

}  // namespace attograd
