// Internal: the kernels of one set, declared in namespace attograd::cpu::ATTOGRAD_CPU_NS. Included once per set by
// autograd/cpu/kernels.h (no include guard). Each kernel is defined in the autograd/cpu/*.cpp named in its section;
// T is float or double. Kernels run serially unless their comment says they split work on the thread pool.

#include <cstddef>
#include <cstdint>

#include "autograd/gemm.h"

namespace attograd::cpu::ATTOGRAD_CPU_NS {

using detail::GemmOperand;

// ---- dropout.cpp: keep masks drawn from the PCG32 stream, applied with vector masks

/// Sets bit i % 16 of words[i / 16] to (draw_i >= threshold) for i in [0, n) (the last word's unused bits 0), draw_i
/// being the i-th PCG32 output from (state, inc); returns the state after the n draws.
uint64_t draw_keep_bits(uint64_t state, uint64_t inc, int64_t n, uint64_t threshold, uint16_t* words);
/// dst[i] = base[i] + src[i] * (keep_i ? s : 0) over [0, len) (base may be null: no addition), keep_i bit i % 16 of
/// words[i / 16].
template <class T>
void apply_keep_block(const uint16_t* words, int64_t len, T s, const T* base, const T* src, T* dst);
/// y[i] = max(x[i], 0) * (keep_i ? s : 0) over [0, len) (NaN and -0 give 0).
template <class T>
void relu_keep_block(const uint16_t* words, int64_t len, T s, const T* x, T* y);
/// bits[i / 8] bit i % 8 = (y[i] > 0) for i in [0, n), n a multiple of 8 or the last block.
template <class T>
void positive_bits(const T* y, int64_t n, uint8_t* bits);
/// dx[i] = bit i of bits ? g[i] * s : 0 over [0, n).
template <class T>
void masked_scale(const uint8_t* bits, const T* g, T s, T* dx, int64_t n);

// ---- gemm.cpp: the packed float32 GEMM

/// True when this set has the prepacked products below (pack_gemm_b, gemm_packed: avx512); they throw otherwise.
bool packed_gemm_available();
/// C (m, n) = alpha * op(A) op(B) (+ C when accumulate, or + the bias row when bias is non-null) on one block.
void packed_gemm(int64_t m, int64_t n, int64_t k, GemmOperand<float> a, GemmOperand<float> b, float* c, int64_t ldc,
                 bool accumulate, float alpha, const float* bias);
/// As detail::packed_b_floats, detail::pack_gemm_b and detail::gemm_packed (autograd/gemm.h).
size_t packed_b_floats(int64_t k, int64_t n);
/// Packs op(B) (k, n) for gemm_packed; dst 64-byte aligned.
void pack_gemm_b(int64_t k, int64_t n, GemmOperand<float> b, float* dst);
/// C (m, n) = alpha * op(A) B[0:k, 0:n] (+ C when accumulate) from a pack_gemm_b(kb, nb, B).
void gemm_packed(int64_t m, int64_t n, int64_t k, GemmOperand<float> a, const float* packed_b, int64_t kb, int64_t nb,
                 float* c, int64_t ldc, bool accumulate, float alpha);

}  // namespace attograd::cpu::ATTOGRAD_CPU_NS
