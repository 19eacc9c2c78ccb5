// The library's matrix product: the split of C between threads, and the products themselves: float32 on the
// active kernel set's packed GEMM (autograd/cpu/gemm.cpp), float64 on Eigen's product.
//
// The split never changes a result bit: the packed kernel computes every element of C by the same sequence of FMAs
// whatever the block it falls in.

#include "autograd/gemm.h"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <new>
#include <vector>

#include "autograd/cpu/kernels.h"
#include "autograd/eigen_util.h"
#include "autograd/parallel.h"

namespace attograd::detail {

namespace {

// Splits C (m, n) into blocks for the threads of the pool and calls run(i0, i1, j0, j1) for each. Rows are split
// in multiples of `mr` when there are enough of them, else columns in multiples of `nr`; with prefer_cols, columns
// whenever there are enough of them. Small products run on the calling thread: waking a worker costs more than a
// few million flops.
template <class F>
void split_for_threads(int64_t m, int64_t n, int64_t k, int64_t mr, int64_t nr, bool parallel, F run,
                       bool prefer_cols = false) {
  constexpr double kMinFlopsPerChunk = 1.5e6;
  const double flops = 2.0 * static_cast<double>(m) * static_cast<double>(n) * static_cast<double>(std::max<int64_t>(k, 1));
  if (!parallel || get_num_threads() <= 1 || in_parallel_region() || flops < 2 * kMinFlopsPerChunk) {
    run(0, m, 0, n);
    return;
  }
  const int64_t threads = get_num_threads();
  const int64_t row_units = (m + mr - 1) / mr, col_units = (n + nr - 1) / nr;
  if (!(prefer_cols && col_units >= 2 * threads) && (row_units >= 4 * threads || row_units >= col_units)) {
    const double unit_flops = flops / static_cast<double>(row_units);
    const int64_t grain = std::max<int64_t>(1, static_cast<int64_t>(kMinFlopsPerChunk / unit_flops));
    parallel_for(0, row_units, grain, [&](int64_t u0, int64_t u1) { run(u0 * mr, std::min(m, u1 * mr), 0, n); });
  } else {
    const double unit_flops = flops / static_cast<double>(col_units);
    const int64_t grain = std::max<int64_t>(1, static_cast<int64_t>(kMinFlopsPerChunk / unit_flops));
    parallel_for(0, col_units, grain, [&](int64_t u0, int64_t u1) { run(0, m, u0 * nr, std::min(n, u1 * nr)); });
  }
}

template <class T>
const T* sub_operand_rows(const GemmOperand<T>& x, int64_t r0) {
  // First element of rows r0.. of op(X).
  return x.trans ? x.data + r0 : x.data + r0 * x.ld;
}

template <class T>
const T* sub_operand_cols(const GemmOperand<T>& x, int64_t c0) {
  // First element of columns c0.. of op(X).
  return x.trans ? x.data + c0 * x.ld : x.data + c0;
}

// ---------------------------------------------------------------------------------------------
// Eigen path (float64)

template <class T>
void eigen_gemm(int64_t m, int64_t n, int64_t k, GemmOperand<T> a, GemmOperand<T> b, T* c, int64_t ldc,
                bool accumulate, T alpha) {
  using Mat = Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
  using CMap = Eigen::Map<const Mat, 0, Eigen::OuterStride<>>;
  using MMap = Eigen::Map<Mat, 0, Eigen::OuterStride<>>;
  MMap C(c, m, n, Eigen::OuterStride<>(ldc));
  if (k == 0) {
    if (!accumulate) C.setZero();
    return;
  }
  // op(X) as an Eigen expression needs one branch per transposition.
  auto product = [&](const auto& A, const auto& B) {
    if (accumulate) {
      if (alpha == T(1))
        C.noalias() += A * B;
      else
        C.noalias() += alpha * (A * B);
    } else {
      if (alpha == T(1))
        C.noalias() = A * B;
      else
        C.noalias() = alpha * (A * B);
    }
  };
  const CMap A = a.trans ? CMap(a.data, k, m, Eigen::OuterStride<>(a.ld)) : CMap(a.data, m, k, Eigen::OuterStride<>(a.ld));
  const CMap B = b.trans ? CMap(b.data, n, k, Eigen::OuterStride<>(b.ld)) : CMap(b.data, k, n, Eigen::OuterStride<>(b.ld));
  if (!a.trans && !b.trans) product(A, B);
  else if (!a.trans && b.trans) product(A, B.transpose());
  else if (a.trans && !b.trans) product(A.transpose(), B);
  else product(A.transpose(), B.transpose());
}

template <class T>
void split_eigen(int64_t m, int64_t n, int64_t k, GemmOperand<T> a, GemmOperand<T> b, T* c, int64_t ldc,
                 bool accumulate, T alpha, bool parallel) {
  split_for_threads(m, n, k, 8, 8, parallel, [&](int64_t i0, int64_t i1, int64_t j0, int64_t j1) {
    GemmOperand<T> as = {sub_operand_rows(a, i0), a.ld, a.trans};
    GemmOperand<T> bs = {sub_operand_cols(b, j0), b.ld, b.trans};
    eigen_gemm<T>(i1 - i0, j1 - j0, k, as, bs, c + i0 * ldc + j0, ldc, accumulate, alpha);
  });
}

}  // namespace

bool gemm_prepack_available() { return ATTO_CPU(packed_gemm_available)(); }

size_t packed_b_floats(int64_t k, int64_t n) { return ATTO_CPU(packed_b_floats)(k, n); }

void pack_gemm_b(int64_t k, int64_t n, GemmOperand<float> b, float* dst) {
  ATTO_CHECK(gemm_prepack_available(), "gemm", "pack_gemm_b needs the AVX-512 kernels (check gemm_prepack_available())");
  ATTO_CPU(pack_gemm_b)(k, n, b, dst);
}

void gemm_packed(int64_t m, int64_t n, int64_t k, GemmOperand<float> a, const float* packed_b, int64_t kb, int64_t nb,
                 float* c, int64_t ldc, bool accumulate, float alpha) {
  ATTO_CHECK(gemm_prepack_available(), "gemm", "gemm_packed needs the AVX-512 kernels (check gemm_prepack_available())");
  ATTO_CPU(gemm_packed)(m, n, k, a, packed_b, kb, nb, c, ldc, accumulate, alpha);
}

namespace {

// C's rows = bias (the start of a bias product on the paths that accumulate onto C).
template <class T>
void fill_bias_rows(int64_t m, int64_t n, const T* bias, T* c, int64_t ldc) {
  for (int64_t i = 0; i < m; ++i) std::copy(bias, bias + n, c + i * ldc);
}

}  // namespace

namespace {

// Runs a packed kernel (packed_gemm or packed_gemm_bf16 of the active set) on the threads' blocks of C. Each thread
// packs the B columns of its own block and the A rows of its own block: a weight gradient (A^T packed, k = tokens)
// with more columns than rows packs less per thread when split by columns.
template <class Kernel>
void split_packed(Kernel kernel, int64_t m, int64_t n, int64_t k, const GemmOperand<float>& a,
                  const GemmOperand<float>& b, float* c, int64_t ldc, bool accumulate, float alpha, bool parallel,
                  const float* bias) {
  split_for_threads(
      m, n, k, 24, 32, parallel,
      [&](int64_t i0, int64_t i1, int64_t j0, int64_t j1) {
        GemmOperand<float> as = {sub_operand_rows(a, i0), a.ld, a.trans};
        GemmOperand<float> bs = {sub_operand_cols(b, j0), b.ld, b.trans};
        kernel(i1 - i0, j1 - j0, k, as, bs, c + i0 * ldc + j0, ldc, accumulate, alpha, bias ? bias + j0 : nullptr);
      },
      a.trans && n > m);
}

}  // namespace

void gemm(int64_t m, int64_t n, int64_t k, GemmOperand<float> a, GemmOperand<float> b, float* c, int64_t ldc,
          bool accumulate, float alpha, bool parallel, const float* bias) {
  if (m <= 0 || n <= 0) return;
  if (bias && accumulate) throw Error("gemm", "internal error: a bias product cannot accumulate onto C");
  // The bias goes in the first k panel's epilogue where C's old values would be added: the same sums, in the same
  // order, as filling C with the bias rows and accumulating, without the extra pass over C.
  if (bias && k == 0) {
    fill_bias_rows(m, n, bias, c, ldc);
    return;
  }
  split_packed(ATTO_CPU(packed_gemm), m, n, k, a, b, c, ldc, accumulate, alpha, parallel, bias);
}

namespace {

std::atomic<bool> g_bf16_native_allowed{true};

// op(X) (rows x cols) rounded to bf16 into dst, in the stored layout (row stride cols, or rows when trans).
void round_operand(const GemmOperand<float>& x, int64_t rows, int64_t cols, float* dst) {
  const int64_t outer = x.trans ? cols : rows, inner = x.trans ? rows : cols;
  parallel_for(0, outer, std::max<int64_t>(1, (1 << 15) / std::max<int64_t>(inner, 1)), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) round_bf16(x.data + r * x.ld, dst + r * inner, inner);
  });
}

}  // namespace

namespace {

// The bits of round_bf16 for the float of bits u, without branches (selects), so that loops over it vectorise.
inline uint32_t round_bf16_bits(uint32_t u) {
  const uint32_t nearest = u + 0x7fffu + ((u >> 16) & 1u);  // ties to even (a carry into the exponent: infinity)
  uint32_t r = (u & 0x7fffffffu) > 0x7f800000u ? u | 0x00400000u : nearest;  // NaN: quiet, its top bits kept
  r = (u & 0x7f800000u) == 0 ? u & 0x80000000u : r;  // a denormal is treated as zero, as vcvtne2ps2bf16 does
  return r & 0xffff0000u;
}

inline uint32_t bits_of(float x) {
  uint32_t u;
  std::memcpy(&u, &x, sizeof u);
  return u;
}

}  // namespace

float round_bf16(float x) {
  const uint32_t u = round_bf16_bits(bits_of(x));
  std::memcpy(&x, &u, sizeof x);
  return x;
}

void round_bf16(const float* src, float* dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const uint32_t u = round_bf16_bits(bits_of(src[i]));
    std::memcpy(dst + i, &u, sizeof u);
  }
}

void to_bf16_bits(const float* src, uint16_t* dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] = static_cast<uint16_t>(round_bf16_bits(bits_of(src[i])) >> 16);
}

void rows_bf16(const uint16_t* W, const float* X, int64_t M, const float* bias, float* Y, int64_t N, int64_t K) {
  if (M <= 0 || N <= 0) return;
  ATTO_CPU(rows_bf16)(W, X, M, bias, Y, N, K, gemm_bf16_native());
}

bool gemm_bf16_native() {
  return g_bf16_native_allowed.load(std::memory_order_relaxed) && ATTO_CPU(bf16_gemm_available)();
}

void set_gemm_bf16_native(bool allowed) { g_bf16_native_allowed.store(allowed, std::memory_order_relaxed); }

void gemm_bf16(int64_t m, int64_t n, int64_t k, GemmOperand<float> a, GemmOperand<float> b, float* c, int64_t ldc,
               bool accumulate, float alpha, bool parallel, const float* bias) {
  if (m <= 0 || n <= 0) return;
  if (bias && accumulate) throw Error("gemm_bf16", "internal error: a bias product cannot accumulate onto C");
  if (!gemm_bf16_native()) {
    // The portable path: the operands rounded once (the products are then exact in float32), the float32 kernel.
    thread_local std::vector<float> ra, rb;
    ra.resize(static_cast<size_t>(m * k));
    rb.resize(static_cast<size_t>(k * n));
    round_operand(a, m, k, ra.data());
    round_operand(b, k, n, rb.data());
    gemm(m, n, k, {ra.data(), a.trans ? m : k, a.trans}, {rb.data(), b.trans ? k : n, b.trans}, c, ldc, accumulate,
         alpha, parallel, bias);
    return;
  }
  split_packed(ATTO_CPU(packed_gemm_bf16), m, n, k, a, b, c, ldc, accumulate, alpha, parallel, bias);
}

void gemm(int64_t m, int64_t n, int64_t k, GemmOperand<double> a, GemmOperand<double> b, double* c, int64_t ldc,
          bool accumulate, double alpha, bool parallel, const double* bias) {
  if (m <= 0 || n <= 0) return;
  if (bias && accumulate) throw Error("gemm", "internal error: a bias product cannot accumulate onto C");
  if (bias) {
    fill_bias_rows(m, n, bias, c, ldc);
    accumulate = true;
  }
  split_eigen<double>(m, n, k, a, b, c, ldc, accumulate, alpha, parallel);
}

}  // namespace attograd::detail
