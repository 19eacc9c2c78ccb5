#pragma once
// Internal: the library's matrix product, C = alpha * op(A) op(B) (+ C), for the ops' kernels (matmul, linear,
// attention). float32 runs the active kernel set's packed, cache-blocked GEMM (BLIS-style, autograd/cpu/gemm.cpp:
// AVX-512, AVX2 or SSE2 register blocks); float64 runs Eigen's product. The result of every element is a fixed
// function of the shapes and the kernel set (the blocking never depends on the thread count), so a parallel product
// equals the serial one bit for bit.

#include <cstddef>
#include <cstdint>

namespace attograd::detail {

/// One operand of gemm: element (i, j) of op(X) is data[i * ld + j], or data[j * ld + i] when `trans`.
template <class T>
struct GemmOperand {
  const T* data = nullptr;  ///< first element
  int64_t ld = 0;           ///< distance between consecutive rows of the stored matrix, in elements
  bool trans = false;       ///< the stored matrix is op(X)^T
};

/// C (m, n; row stride ldc) = alpha * op(A) (m, k) op(B) (k, n), plus C's old values when `accumulate`, or plus
/// `bias` (n values, added to every row; then accumulate must be false) when bias is non-null: the same result,
/// bit for bit, as filling C with the bias rows and accumulating. With `parallel`, splits C into per-thread blocks
/// on the pool (parallel.h); nested calls run serially.
void gemm(int64_t m, int64_t n, int64_t k, GemmOperand<float> a, GemmOperand<float> b, float* c, int64_t ldc,
          bool accumulate, float alpha = 1.0f, bool parallel = true, const float* bias = nullptr);
/// float64 variant (Eigen's product; `parallel` splits C into per-thread blocks the same way).
void gemm(int64_t m, int64_t n, int64_t k, GemmOperand<double> a, GemmOperand<double> b, double* c, int64_t ldc,
          bool accumulate, double alpha = 1.0, bool parallel = true, const double* bias = nullptr);

/// True when pack_gemm_b / gemm_packed are available (the avx512 kernel set); otherwise callers use gemm.
bool gemm_prepack_available();
/// Floats (64-byte aligned storage) that pack_gemm_b(k, n, ...) writes.
size_t packed_b_floats(int64_t k, int64_t n);
/// Packs op(B) (k, n) once, for several gemm_packed products that share it (attention reuses K^T, V^T and K for
/// every block of query rows). dst must be 64-byte aligned.
void pack_gemm_b(int64_t k, int64_t n, GemmOperand<float> b, float* dst);
/// C (m, n) = alpha * op(A) (m, k) B[0:k, 0:n] (+ C when accumulate), where packed_b = pack_gemm_b(kb, nb, B) with
/// k <= kb and n <= nb. Serial. The same result, bit for bit, as gemm(m, n, k, a, B[0:k, 0:n], ...).
void gemm_packed(int64_t m, int64_t n, int64_t k, GemmOperand<float> a, const float* packed_b, int64_t kb, int64_t nb,
                 float* c, int64_t ldc, bool accumulate, float alpha = 1.0f);

/// Shorthand for a row-major operand: op(X) = X stored with row stride ld (trans = false) or X^T (trans = true).
template <class T>
GemmOperand<T> operand(const T* data, int64_t ld, bool trans = false) {
  return {data, ld, trans};
}

}  // namespace attograd::detail
