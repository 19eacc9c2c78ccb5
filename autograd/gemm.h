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

/// As gemm (float32 C, same arguments), with both operands rounded to bfloat16 (round to nearest even): the
/// products of autocast's matmuls. With AVX512-BF16 (gemm_bf16_native()) the active set's vdpbf16ps kernel adds the
/// products of each pair of k into float32; otherwise the rounded operands go through the float32 kernel, which
/// gives the same products (a product of two bf16 is exact in float32) summed in another order: the two agree to
/// float32 accumulation rounding (tests/autograd/test_gemm_bf16.cpp).
void gemm_bf16(int64_t m, int64_t n, int64_t k, GemmOperand<float> a, GemmOperand<float> b, float* c, int64_t ldc,
               bool accumulate, float alpha = 1.0f, bool parallel = true, const float* bias = nullptr);
/// True when gemm_bf16 runs the AVX512-BF16 kernel (the avx512 set on a CPU that has it, unless disabled below).
bool gemm_bf16_native();
/// Lets gemm_bf16 use the AVX512-BF16 kernel (true, the default) or forces the portable path (tests compare them).
void set_gemm_bf16_native(bool allowed);
/// x rounded to the nearest bfloat16 (ties to even; a float32 denormal becomes a signed zero, NaN stays NaN, a value
/// beyond bf16's range becomes infinity: the rounding of vcvtne2ps2bf16),
/// returned as the float32 of the same value.
float round_bf16(float x);
/// dst[i] = round_bf16(src[i]) for i < n (dst may be src).
void round_bf16(const float* src, float* dst, int64_t n);
/// dst[i] = the bfloat16 bits of round_bf16(src[i]) (its top 16 bits) for i < n.
void to_bf16_bits(const float* src, uint16_t* dst, int64_t n);

/// Y (M, N) = X (M, K) W (N, K)^T (+ bias: N values, or null) for a few rows (cached decoding), W as bfloat16 bits
/// (the top halves of float32 values), X holding bf16 values (round_bf16): memory-bound, the weights stream once
/// (half the bytes of float32). The active set's kernel: vdpbf16ps when gemm_bf16_native(), else the weights
/// widened to float32; the same values to float32 summation order. A row's result does not depend on M. Serial.
void rows_bf16(const uint16_t* W, const float* X, int64_t M, const float* bias, float* Y, int64_t N, int64_t K);

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
