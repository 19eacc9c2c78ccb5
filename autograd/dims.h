#pragma once
// Internal: dimension arguments of ops. Include only from .cpp files.

#include <cstdint>

#include "autograd/error.h"
#include "autograd/tensor.h"

namespace attograd::detail {

/// A possibly negative dim of a tensor of `shape` wrapped into [0, n) (n = the number of valid dims: shape.size(),
/// one more for unsqueeze, at least 1 so that a 0-d tensor accepts 0 and -1); the error names the op, the dim and
/// the shape.
inline int64_t wrap_dim(int64_t d, int64_t n, const Shape& shape, const char* op) {
  ATTO_CHECK(d >= -n && d < n, op, "dimension ", d, " out of range for a tensor of shape ", shape, " (expected in [",
             -n, ", ", n - 1, "])");
  return d < 0 ? d + n : d;
}

}  // namespace attograd::detail
