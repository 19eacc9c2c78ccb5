#pragma once
// Internal: Eigen views of contiguous tensors. Include only from .cpp files (never from a public
// header), so that Eigen stays a private dependency of the library.

// GCC 12 reports false -Wuninitialized warnings inside Eigen's AVX-512 kernels (avx512fintrin.h's masked
// intrinsics) at -O2 with sanitizers; silence them for Eigen's headers only.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <Eigen/Core>
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif

#include "autograd/tensor.h"

namespace attograd::detail {

/// A dynamic-size row-major Eigen matrix of T.
template <class T>
using RowMatrix = Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
/// A writable row-major view of raw memory.
template <class T>
using MatrixMap = Eigen::Map<RowMatrix<T>>;
/// A read-only row-major view of raw memory.
template <class T>
using ConstMatrixMap = Eigen::Map<const RowMatrix<T>>;

/// Views `rows * cols` contiguous elements at p as a (rows, cols) row-major matrix.
template <class T>
MatrixMap<T> matrix_map(T* p, int64_t rows, int64_t cols) {
  return MatrixMap<T>(p, static_cast<Eigen::Index>(rows), static_cast<Eigen::Index>(cols));
}

/// Read-only variant of matrix_map.
template <class T>
ConstMatrixMap<T> matrix_map(const T* p, int64_t rows, int64_t cols) {
  return ConstMatrixMap<T>(p, static_cast<Eigen::Index>(rows), static_cast<Eigen::Index>(cols));
}

/// Views a contiguous tensor (numel == rows * cols) as a writable (rows, cols) row-major matrix.
template <class T>
MatrixMap<T> as_matrix(Tensor& t, int64_t rows, int64_t cols) {
  return matrix_map<T>(t.data<T>(), rows, cols);
}

/// Views a contiguous tensor (numel == rows * cols) as a read-only (rows, cols) row-major matrix.
template <class T>
ConstMatrixMap<T> as_matrix(const Tensor& t, int64_t rows, int64_t cols) {
  return matrix_map<T>(t.data<T>(), rows, cols);
}

/// Product of all dimensions but the last (1 for 0-d and 1-D tensors).
inline int64_t leading_numel(const Tensor& t) {
  int64_t r = 1;
  for (int64_t d = 0; d + 1 < t.dim(); ++d) r *= t.shape()[static_cast<size_t>(d)];
  return r;
}

/// Views a tensor as a (leading_numel, last) matrix: all leading dimensions folded into rows.
template <class T>
MatrixMap<T> as_rows(Tensor& t) {
  return as_matrix<T>(t, leading_numel(t), t.dim() == 0 ? 1 : t.shape().back());
}

/// Read-only variant of as_rows.
template <class T>
ConstMatrixMap<T> as_rows(const Tensor& t) {
  return as_matrix<T>(t, leading_numel(t), t.dim() == 0 ? 1 : t.shape().back());
}

}  // namespace attograd::detail
