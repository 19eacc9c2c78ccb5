#pragma once
// Internal: walking the outer indices of a strided view (the permute copy and the reductions share it).

#include <cstdint>
#include <vector>

namespace attograd::detail {

/// One dimension of a strided walk: its size and its stride in the input, in elements.
struct Run {
  int64_t size;    ///< number of indices
  int64_t stride;  ///< input elements between consecutive indices
};

/// Calls f(offset) for every index of dims[0, m) in row-major order, offset = sum of index * stride.
template <class F>
void for_each_outer(const std::vector<Run>& dims, size_t m, F f) {
  int64_t count = 1;
  for (size_t i = 0; i < m; ++i) count *= dims[i].size;
  std::vector<int64_t> idx(m, 0);
  int64_t off = 0;
  for (int64_t c = 0; c < count; ++c) {
    f(off);
    for (size_t d = m; d-- > 0;) {
      off += dims[d].stride;
      if (++idx[d] < dims[d].size) break;
      off -= dims[d].stride * dims[d].size;
      idx[d] = 0;
    }
  }
}

}  // namespace attograd::detail
