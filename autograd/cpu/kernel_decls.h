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

/// True when this set runs packed_gemm_bf16 on this CPU (the avx512 set on a CPU with AVX512-BF16).
bool bf16_gemm_available();
/// As packed_gemm with both operands rounded to bfloat16 (nearest even) and vdpbf16ps products (detail::gemm_bf16).
void packed_gemm_bf16(int64_t m, int64_t n, int64_t k, GemmOperand<float> a, GemmOperand<float> b, float* c,
                      int64_t ldc, bool accumulate, float alpha, const float* bias);

/// Y (M, N) = X (M, K) W (N, K)^T (+ bias) for a few rows (decoding), W as bfloat16 bits, X holding bf16 values:
/// the weights stream once; vdpbf16ps when `native` and bf16_gemm_available(), else the weights widened to float32.
void rows_bf16(const uint16_t* W, const float* X, int64_t M, const float* bias, float* Y, int64_t N, int64_t K,
               bool native);

// ---- norm.cpp: row reductions, softmax, layer_norm

/// The maximum of x[0..n) (-inf when n == 0; NaN entries ignored).
template <class T>
T row_max(const T* x, int64_t n);
/// The sum of x[0..n) accumulated in double.
template <class T>
double row_sum(const T* x, int64_t n);
/// Writes exp(x[i] - shift) to out[i] (shift >= max x; -inf entries give exactly 0) and returns their sum in double.
template <class T>
double exp_shifted_sum(const T* x, T shift, T* out, int64_t n);
/// The sum of exp(x[i] - shift) in double, without storing.
template <class T>
double sum_exp_shifted(const T* x, T shift, int64_t n);
/// y = softmax (Log = false) or log_softmax (Log = true) of x over the n of each slice.
template <class T, bool Log>
void softmax_forward(const T* x, T* y, Slices s);
/// dx = y * (g - sum(g * y)) per slice (zero for an all-zero slice).
template <class T>
void softmax_backward(const T* y, const T* g, T* dx, Slices s);
/// dx = g - exp(y) * sum(g) per slice (zero for an all -inf slice).
template <class T>
void log_softmax_backward(const T* y, const T* g, T* dx, Slices s);
/// y = (x - mean) * rstd * w + b over `rows` rows of N (w, b may be null), statistics in double; writes the per-row
/// mean and rstd when mean_out is non-null. Splits rows on the thread pool.
template <class T>
void layer_norm_forward(const T* x, const T* w, const T* b, T* y, double* mean_out, double* rstd_out, int64_t rows,
                        int64_t N, double eps);
/// The forward's y again, bit for bit, from the saved per-row mean and rstd. Splits rows on the thread pool.
template <class T>
void layer_norm_recompute(const T* x, const T* w, const T* b, T* y, const double* mean, const double* rstd,
                          int64_t rows, int64_t N);
/// layer_norm's backward: dx (may alias g; null when not wanted), and dw, db (N doubles, accumulated into; null when
/// not wanted) through dw_part, db_part: zeroed (ceil(rows / kLayerNormBlockRows), N) scratch for each wanted one.
/// Splits blocks of rows on the thread pool.
template <class T>
void layer_norm_backward(const T* x, const T* w, const T* g, const double* mean, const double* rstd, T* dx, double* dw,
                         double* db, int64_t rows, int64_t N, T* dw_part, T* db_part);

// ---- loss.cpp: cross-entropy over logits viewed as (N, C, inner) = (L.outer, L.n, L.inner)

/// Writes the per-position loss (0 where the target is ignore_index) and, when lse_out is non-null, the log-sum-exp
/// of every position (0 where ignored); returns the sum of the losses in double.
template <class T>
double cross_entropy_forward(const T* x, const int64_t* t, Slices L, double label_smoothing, int64_t ignore_index,
                             T* loss, T* lse_out);
/// dx = k * (softmax - smoothed one-hot target) per position, k = scale[p * scale_stride]; 0 where ignored.
template <class T>
void cross_entropy_backward(const T* x, const int64_t* t, const T* lse, const T* scale, int64_t scale_stride, Slices L,
                            double label_smoothing, int64_t ignore_index, T* dx);

// ---- attention.cpp: scaled dot-product attention

/// The forward over all heads (split between threads): out, and per row {max score, 1 / sum exp} in stats (B, H, Lq,
/// 2); stats, weights (B, H, Lq, Lk) and probs (the probabilities before dropout, block by block) may be null; so may
/// entropy (B, H, Lq), which receives each row's -sum_j p_j log p_j before dropout (0 for a fully blocked row).
template <class T>
void attention_forward(const AttentionPlan& p, HeadView<const T> q, HeadView<const T> k, HeadView<const T> v,
                       const void* mask, HeadView<T> out, T* stats, T* weights, T* probs, T* entropy);
/// The backward over all heads (split between threads): dq assigned, dk and dv (zero-filled by the caller)
/// accumulated; each may be null. P is recomputed from stats, or read from the forward's probs when non-null. When
/// dentropy (B, H, Lq) is non-null, the gradient of the rows' entropies (the forward's, in entropy) joins dS in the
/// same pass: dS_ij += dentropy_i * -P_ij (log P_ij + H_i).
template <class T>
void attention_backward(const AttentionPlan& p, HeadView<const T> q, HeadView<const T> k, HeadView<const T> v,
                        const void* mask, HeadView<const T> out, const T* stats, const T* probs, HeadView<const T> dout,
                        HeadView<T> dq, HeadView<T> dk, HeadView<T> dv, const T* entropy, const T* dentropy);

}  // namespace attograd::cpu::ATTOGRAD_CPU_NS
