// The float32 GEMM kernel (autograd/gemm.cpp splits a product between threads and calls it per block): BLIS-style
// (Goto & van de Geijn, "Anatomy of high-performance matrix multiplication", 2008). B is packed in KC x NR
// micro-panels, and an AVX-512 micro-kernel keeps an MR x NR block of C in registers (MR * NR / 16 accumulators),
// loading one NR-wide row of B and broadcasting MR elements of A per step of k. A is read in place, except A^T
// (weight gradients), which is packed one MC x KC block at a time into MR-interleaved micro-panels, so the MR
// broadcasts of each k come from one contiguous stream. The avx2 and generic sets run the same blocking with a
// smaller register block on GCC vector types (and have no prepacked variant: packed_gemm_available() is false).
//
// Every element of C is computed by the same sequence of FMAs whatever the tile it falls in (edges are handled by
// zero padding in the packed panels and masked stores), and the k dimension is always split at the same KC
// boundaries, so splitting C between threads never changes a result bit.

#include <algorithm>
#include <cstring>

#include "autograd/cpu/kernels.h"
#include "autograd/cpu/scratch.h"
#include "autograd/cpu/simd.h"

namespace attograd::cpu::ATTOGRAD_CPU_ISA {

#if ATTOGRAD_AVX512

namespace {

// Register blocks: MR rows x 16 * NV columns of C (MR * NV accumulators). NV = 2 for wide products; NV = 1
// (16 columns, 16 rows) when C has at most 16 columns (attention heads of 16 features), so no lane is wasted.
template <int NV>
struct Block {
  static constexpr int kNV = NV;
  static constexpr int kNR = 16 * NV;            // columns of the register block
  static constexpr int kMR = NV == 2 ? 12 : 16;  // rows of the register block (more spill row pointers)
};
constexpr int64_t kKC = 256;  // k per panel (a KC x NR micro-panel of B is at most 32 KB: L1)
constexpr int64_t kMC = 96;   // rows of A per block (MC x KC = 96 KB: L2); a multiple of both kMR
constexpr int64_t kNC = 512;  // columns of B per packed panel (KC x NC = 512 KB: L2)

// dst[k * ldd + j] = src[j * ld + k] for j < 16, k < kcount (<= 16), where rows j >= rows of src read as zero: a
// 16 x 16 transpose in registers (unpack, shuffle, then two rounds of 128-bit lane shuffles).
inline void transpose16(const float* src, int64_t ld, int64_t rows, int64_t kcount, float* dst, int64_t ldd) {
  __m512 r[16], t[16];
  const __mmask16 km = first_lanes(kcount);
  for (int j = 0; j < 16; ++j) r[j] = j < rows ? _mm512_maskz_loadu_ps(km, src + j * ld) : _mm512_setzero_ps();
  for (int j = 0; j < 16; j += 2) {
    t[j] = _mm512_unpacklo_ps(r[j], r[j + 1]);
    t[j + 1] = _mm512_unpackhi_ps(r[j], r[j + 1]);
  }
  for (int j = 0; j < 16; j += 4) {
    r[j] = _mm512_shuffle_ps(t[j], t[j + 2], 0x44);
    r[j + 1] = _mm512_shuffle_ps(t[j], t[j + 2], 0xee);
    r[j + 2] = _mm512_shuffle_ps(t[j + 1], t[j + 3], 0x44);
    r[j + 3] = _mm512_shuffle_ps(t[j + 1], t[j + 3], 0xee);
  }
  for (int g = 0; g < 16; g += 8)
    for (int j = 0; j < 4; ++j) {
      t[g + j] = _mm512_shuffle_f32x4(r[g + j], r[g + j + 4], 0x88);
      t[g + j + 4] = _mm512_shuffle_f32x4(r[g + j], r[g + j + 4], 0xdd);
    }
  for (int j = 0; j < 8; ++j) {
    r[j] = _mm512_shuffle_f32x4(t[j], t[j + 8], 0x88);
    r[j + 8] = _mm512_shuffle_f32x4(t[j], t[j + 8], 0xdd);
  }
  for (int k = 0; k < 16 && k < kcount; ++k) _mm512_storeu_ps(dst + k * ldd, r[k]);
}

// Packs rows [p0, p0 + kc) x cols [j0, j0 + nc) of op(B) into micro-panels of NR columns: panel jr holds
// [k * NR + j] = op(B)(p0 + k, j0 + jr + j), columns past nc zero.
template <int NV>
void pack_b(const GemmOperand<float>& B, int64_t p0, int64_t kc, int64_t j0, int64_t nc, float* dst) {
  constexpr int kNR = Block<NV>::kNR;
  if (!B.trans) {
    // op(B)(k, j) = data[k * ld + j]: row k of the block is nc contiguous floats, dealt out NR at a time to the
    // panels (masked past nc). Row by row, so that the source streams in order (a weight gradient's B is the
    // layer's input, cold by the backward).
    const int64_t full = nc / kNR * kNR;
    __mmask16 tail[NV];
    for (int v = 0; v < NV; ++v) tail[v] = first_lanes(nc - full - 16 * v);
    for (int64_t k = 0; k < kc; ++k) {
      const float* sk = B.data + (p0 + k) * B.ld + j0;
      float* o = dst + k * kNR;
      for (int64_t jr = 0; jr < full; jr += kNR)
        for (int v = 0; v < NV; ++v) _mm512_store_ps(o + jr * kc + 16 * v, _mm512_loadu_ps(sk + jr + 16 * v));
      if (full < nc)
        for (int v = 0; v < NV; ++v)
          _mm512_store_ps(o + full * kc + 16 * v, _mm512_maskz_loadu_ps(tail[v], sk + full + 16 * v));
    }
    return;
  }
  for (int64_t jr = 0; jr < nc; jr += kNR) {
    const int64_t nr = std::min<int64_t>(kNR, nc - jr);
    float* d = dst + jr * kc;
    {  // op(B)(k, j) = data[j * ld + k]: transpose NR rows of the stored matrix, 16 x 16 at a time
      const float* src = B.data + (j0 + jr) * B.ld + p0;
      for (int v = 0; v < NV; ++v) {
        const int64_t rows = std::clamp<int64_t>(nr - 16 * v, 0, 16);
        for (int64_t k = 0; k < kc; k += 16)
          transpose16(src + 16 * v * B.ld + k, B.ld, rows, std::min<int64_t>(16, kc - k), d + k * kNR + 16 * v, kNR);
      }
    }
  }
}

// The C tile is written at the end of a micro-kernel: start fetching its lines at the beginning.
template <int NV>
inline __attribute__((always_inline)) void prefetch_c_tile(const float* c, int64_t ldc, int mr) {
  for (int i = 0; i < mr; ++i) {
    _mm_prefetch(reinterpret_cast<const char*>(c + i * ldc), _MM_HINT_T0);
    _mm_prefetch(reinterpret_cast<const char*>(c + i * ldc + Block<NV>::kNR - 1), _MM_HINT_T0);
  }
}

// The micro-kernels' epilogue: C[0:mr, 0:nr] = alpha * r, plus C's old values when acc, else plus the bias row
// when bias is non-null (the first k panel of a bias product: where C's old values would be added).
template <int NV>
inline __attribute__((always_inline)) void store_c_tile(const __m512 (&r)[Block<NV>::kMR][NV], float* c, int64_t ldc,
                                                        int mr, int nr, float alpha, bool acc, const float* bias) {
  __mmask16 mask[NV];
  for (int v = 0; v < NV; ++v) mask[v] = first_lanes(nr - 16 * v);
  const __m512 va = _mm512_set1_ps(alpha);
  const bool scale = alpha != 1.0f;
  __m512 vb[NV];
  for (int v = 0; v < NV; ++v) vb[v] = bias ? _mm512_maskz_loadu_ps(mask[v], bias + 16 * v) : _mm512_setzero_ps();
  for (int i = 0; i < Block<NV>::kMR; ++i) {
    if (i >= mr) break;
    float* ci = c + i * ldc;
    for (int v = 0; v < NV; ++v) {
      __m512 x = scale ? _mm512_mul_ps(r[i][v], va) : r[i][v];
      if (acc)
        x = _mm512_add_ps(x, _mm512_maskz_loadu_ps(mask[v], ci + 16 * v));
      else if (bias)
        x = _mm512_add_ps(x, vb[v]);
      store_first_lanes(ci + 16 * v, mask[v], x);
    }
  }
}

// C[0:mr, 0:nr] (row stride ldc) = alpha * sum_k A(r, k) b[k * NR + j] (+ C when acc), with A read in place
// (no packing: its rows stream through L1 and a block of MC x KC stays in L2): A(r, k) = a[r * ld + k], or
// a[k * ld + r] when kTransA. Rows past mr repeat row mr - 1 (computed, never stored).
template <int NV, bool kTransA>
inline void micro_kernel(int64_t kc, const float* __restrict a, int64_t ld, const float* __restrict b, float* c,
                         int64_t ldc, int mr, int nr, float alpha, bool acc, const float* bias) {
  constexpr int kMR = Block<NV>::kMR, kNR = Block<NV>::kNR;
  __m512 r[kMR][NV];
  for (int i = 0; i < kMR; ++i)
    for (int v = 0; v < NV; ++v) r[i][v] = _mm512_setzero_ps();
  const float* rows[kMR];
  for (int i = 0; i < kMR; ++i) rows[i] = kTransA ? a + std::min(i, mr - 1) : a + std::min(i, mr - 1) * ld;
  // The C tile is written at the end: start fetching its lines now.
  prefetch_c_tile<NV>(c, ldc, mr);
  for (int64_t k0 = 0; k0 < kc; k0 += 16) {
    // A streams from memory the first time a block is read: prefetch ahead of it (each row two lines ahead, one
    // line per 16 steps of k; for A^T the rows of the stored matrix 16 steps ahead). Measured 15-25% faster on
    // products whose operands are not in cache, as in a training step.
    if constexpr (kTransA) {
      for (int64_t q = k0 + 16; q < std::min(kc, k0 + 32); ++q) {
        _mm_prefetch(reinterpret_cast<const char*>(rows[0] + q * ld), _MM_HINT_T0);
        _mm_prefetch(reinterpret_cast<const char*>(rows[kMR - 1] + q * ld), _MM_HINT_T0);
      }
    } else {
      for (int i = 0; i < kMR; ++i) _mm_prefetch(reinterpret_cast<const char*>(rows[i] + k0 + 32), _MM_HINT_T0);
    }
    const int64_t k1 = std::min(kc, k0 + 16);
    for (int64_t k = k0; k < k1; ++k) {
      __m512 bv[NV];
      for (int v = 0; v < NV; ++v) bv[v] = _mm512_load_ps(b + k * kNR + 16 * v);
      for (int i = 0; i < kMR; ++i) {
        const __m512 av = _mm512_set1_ps(kTransA ? rows[i][k * ld] : rows[i][k]);
        for (int v = 0; v < NV; ++v) r[i][v] = _mm512_fmadd_ps(av, bv[v], r[i][v]);
      }
    }
  }
  store_c_tile<NV>(r, c, ldc, mr, nr, alpha, acc, bias);
}

// Packs rows [i, i + mr) x k in [0, kc) of op(A) (first element `a`: a[r * ld + k], or a[k * ld + r] when trans)
// into an MR-interleaved micro-panel dst[k * MR + r]; rows past mr are zero (computed, never stored). dst needs
// kc * MR + 16 floats (the last transposed row may spill 4 lanes past the panel).
template <int kMR>
void pack_a(const float* a, int64_t ld, bool trans, int mr, int64_t kc, float* dst) {
  if (trans) {  // the MR elements of each k are contiguous in memory
    const __mmask16 m = first_lanes(mr);
    for (int64_t k = 0; k < kc; ++k) {
      // A whole-vector store: its 16 - MR extra lanes land where the next k's store goes (stored in order; the last
      // spills into the slack), and AMD cores run plain stores faster than masked ones.
      _mm512_storeu_ps(dst + k * kMR, _mm512_maskz_loadu_ps(m, a + k * ld));
    }
  } else {  // transpose 16 k at a time; consecutive k rows overlap by 16 - MR lanes and are stored in order
    for (int64_t k = 0; k < kc; k += 16) transpose16(a + k, ld, mr, std::min<int64_t>(16, kc - k), dst + k * kMR, kMR);
  }
}

// C[0:mr, 0:nr] (row stride ldc) = alpha * sum_k ap[k * MR + r] b[k * NR + j] (+ C when acc): A and B both packed,
// so every step of k is NV aligned loads of B and MR broadcasts of A from one contiguous stream.
template <int NV>
inline void micro_kernel_packed(int64_t kc, const float* __restrict ap, const float* __restrict b, float* c,
                                int64_t ldc, int mr, int nr, float alpha, bool acc, const float* bias) {
  constexpr int kMR = Block<NV>::kMR, kNR = Block<NV>::kNR;
  __m512 r[kMR][NV];
  for (int i = 0; i < kMR; ++i)
    for (int v = 0; v < NV; ++v) r[i][v] = _mm512_setzero_ps();
  prefetch_c_tile<NV>(c, ldc, mr);
  for (int64_t k = 0; k < kc; ++k) {
    __m512 bv[NV];
    for (int v = 0; v < NV; ++v) bv[v] = _mm512_load_ps(b + k * kNR + 16 * v);
    const float* ak = ap + k * kMR;
    for (int i = 0; i < kMR; ++i) {
      const __m512 av = _mm512_set1_ps(ak[i]);
      for (int v = 0; v < NV; ++v) r[i][v] = _mm512_fmadd_ps(av, bv[v], r[i][v]);
    }
  }
  store_c_tile<NV>(r, c, ldc, mr, nr, alpha, acc, bias);
}

// The serial blocked product on one block of C, with register blocks of 16 * NV columns.
template <int NV>
void packed_gemm(int64_t m, int64_t n, int64_t k, const GemmOperand<float>& a, const GemmOperand<float>& b, float* c,
                 int64_t ldc, bool accumulate, float alpha, const float* bias) {
  constexpr int kMR = Block<NV>::kMR, kNR = Block<NV>::kNR;
  thread_local Scratch b_buf;
  const int64_t kc_max = std::min(kKC, k);
  float* pb = b_buf.get<float>(static_cast<size_t>(std::min(kNC, (n + kNR - 1) / kNR * kNR) * kc_max));
  thread_local Scratch a_buf;
  float* pa = a_buf.get<float>(static_cast<size_t>((kMC + kMR) * kc_max + 16));
  for (int64_t j0 = 0; j0 < n; j0 += kNC) {
    const int64_t nc = std::min(kNC, n - j0);
    for (int64_t p0 = 0; p0 < k; p0 += kKC) {
      const int64_t kc = std::min(kKC, k - p0);
      const bool acc = accumulate || p0 > 0;
      pack_b<NV>(b, p0, kc, j0, nc, pb);
      for (int64_t i0 = 0; i0 < m; i0 += kMC) {
        const int64_t mc = std::min(kMC, m - i0);
        // op(A) = A^T (weight gradients: k = tokens): its MR elements per k are one short row of a different
        // line each step, so pack this MC x KC block once when more than two NR panels of B reuse it (measured:
        // 5-15% faster from n = 128 on, 10-30% slower at n <= 64). A itself is read in place: packing it costs
        // more than it saves.
        const bool pack = a.trans && nc > 2 * kNR;
        if (pack)
          for (int64_t ir = 0; ir < mc; ir += kMR)
            pack_a<kMR>(a.data + p0 * a.ld + i0 + ir, a.ld, true, static_cast<int>(std::min<int64_t>(kMR, mc - ir)), kc,
                        pa + ir * kc);
        for (int64_t jr = 0; jr < nc; jr += kNR) {
          const int nr = static_cast<int>(std::min<int64_t>(kNR, nc - jr));
          const float* bp = pb + jr * kc;
          for (int64_t ir = 0; ir < mc; ir += kMR) {
            const int mr = static_cast<int>(std::min<int64_t>(kMR, mc - ir));
            float* ct = c + (i0 + ir) * ldc + j0 + jr;
            const float* bt = bias && p0 == 0 ? bias + j0 + jr : nullptr;
            if (pack)
              micro_kernel_packed<NV>(kc, pa + ir * kc, bp, ct, ldc, mr, nr, alpha, acc, bt);
            else if (a.trans)
              micro_kernel<NV, true>(kc, a.data + p0 * a.ld + i0 + ir, a.ld, bp, ct, ldc, mr, nr, alpha, acc, bt);
            else
              micro_kernel<NV, false>(kc, a.data + (i0 + ir) * a.ld + p0, a.ld, bp, ct, ldc, mr, nr, alpha, acc, bt);
          }
        }
      }
    }
  }
}

// C (m, n) (+)= alpha * op(A) B[0:k, 0:n] with B packed whole (kb rows per panel) by pack_gemm_b.
template <int NV>
void prepacked_gemm(int64_t m, int64_t n, int64_t k, const GemmOperand<float>& a, const float* pb, int64_t kb, float* c,
                    int64_t ldc, bool accumulate, float alpha) {
  constexpr int kMR = Block<NV>::kMR, kNR = Block<NV>::kNR;
  for (int64_t p0 = 0; p0 < k; p0 += kKC) {
    const int64_t kc = std::min(kKC, k - p0);
    const bool acc = accumulate || p0 > 0;
    for (int64_t i0 = 0; i0 < m; i0 += kMC) {
      const int64_t mc = std::min(kMC, m - i0);
      for (int64_t jr = 0; jr < n; jr += kNR) {
        const int nr = static_cast<int>(std::min<int64_t>(kNR, n - jr));
        const float* bp = pb + jr * kb + p0 * kNR;
        for (int64_t ir = 0; ir < mc; ir += kMR) {
          const int mr = static_cast<int>(std::min<int64_t>(kMR, mc - ir));
          const int64_t i = i0 + ir;
          float* ct = c + i * ldc + jr;
          if (a.trans)
            micro_kernel<NV, true>(kc, a.data + p0 * a.ld + i, a.ld, bp, ct, ldc, mr, nr, alpha, acc, nullptr);
          else
            micro_kernel<NV, false>(kc, a.data + i * a.ld + p0, a.ld, bp, ct, ldc, mr, nr, alpha, acc, nullptr);
        }
      }
    }
  }
}

// ---- bfloat16 products (AVX512-BF16: vdpbf16ps). Both operands are rounded to bf16 (round to nearest even) while
// packed; vdpbf16ps adds the products of a pair of k into float32 lanes: C = sum over pairs, in float32. The pairs
// are (2p, 2p + 1) of each KC2 panel (an odd panel's last pair has a zero second element), so, as for float32,
// every element is the same sequence of operations whatever the tile and the thread split.

constexpr int64_t kKC2 = 512;  // k per bf16 panel: 256 pairs; a micro-panel of B (256 x 32 pairs of 4 bytes) is 32 KB

// 32 bf16 of (lo[0..16), hi[0..16)) interleaved as 16 pairs (lo[j], hi[j]): one 32-bit word per lane.
[[gnu::target("avx512bf16"), gnu::always_inline]] inline __m512i pair_words(__m512 lo, __m512 hi) {
  const __m512i idx = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8, 23, 7, 22, 6, 21,
                                       5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
  return _mm512_permutexvar_epi16(idx, reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(hi, lo)));
}

// The 16 pair words of 32 consecutive floats x[0..count) (zero past count): word p = (x[2p], x[2p + 1]).
[[gnu::target("avx512bf16"), gnu::always_inline]] inline __m512i row_words(const float* x, int64_t count) {
  const __m512 lo = _mm512_maskz_loadu_ps(first_lanes(count), x);
  const __m512 hi = _mm512_maskz_loadu_ps(first_lanes(count - 16), x + 16);
  return reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(hi, lo));  // lanes 0-15 lo, 16-31 hi: the k order
}

// Writes rows r < rows (zero from rows on) of pair words, 16 rows of `pcount` words from row_words(src + r * ld,
// 2 * pcount) each, transposed: dst[p * ldd + r] = word p of row r.
[[gnu::target("avx512bf16")]] inline void transpose_pairs(const float* src, int64_t ld, int64_t rows, int64_t kcount,
                                                          uint32_t* dst, int64_t ldd) {
  alignas(64) uint32_t tmp[16 * 16];
  for (int r = 0; r < 16; ++r)
    _mm512_store_si512(tmp + 16 * r, r < rows ? row_words(src + r * ld, kcount) : _mm512_setzero_si512());
  transpose16(reinterpret_cast<const float*>(tmp), 16, 16, (kcount + 1) / 2, reinterpret_cast<float*>(dst), ldd);
}

// Packs rows [p0, p0 + kc) x cols [j0, j0 + nc) of op(B) as bf16 pairs in micro-panels of NR columns: panel jr
// holds word [p * NR + j] = (op(B)(p0 + 2p, j0 + jr + j), op(B)(p0 + 2p + 1, ...)); columns and k past the block zero.
template <int NV>
[[gnu::target("avx512bf16")]] void pack_b_bf16(const GemmOperand<float>& B, int64_t p0, int64_t kc, int64_t j0,
                                               int64_t nc, uint32_t* dst) {
  constexpr int kNR = Block<NV>::kNR;
  const int64_t kcp = (kc + 1) / 2;
  if (!B.trans) {  // rows 2p and 2p + 1 of the block, 16 columns at a time
    const __m512 zero = _mm512_setzero_ps();
    for (int64_t p = 0; p < kcp; ++p) {
      const float* r0 = B.data + (p0 + 2 * p) * B.ld + j0;
      const bool has1 = 2 * p + 1 < kc;
      for (int64_t jr = 0; jr < nc; jr += kNR) {
        uint32_t* o = dst + jr * kcp + p * kNR;
        for (int v = 0; v < NV; ++v) {
          const __mmask16 m = first_lanes(nc - jr - 16 * v);
          const __m512 lo = _mm512_maskz_loadu_ps(m, r0 + jr + 16 * v);
          const __m512 hi = has1 ? _mm512_maskz_loadu_ps(m, r0 + B.ld + jr + 16 * v) : zero;
          _mm512_store_si512(o + 16 * v, pair_words(lo, hi));
        }
      }
    }
    return;
  }
  for (int64_t jr = 0; jr < nc; jr += kNR) {  // op(B)(k, j) = data[j * ld + k]: each column's pairs are contiguous
    const int64_t nr = std::min<int64_t>(kNR, nc - jr);
    uint32_t* d = dst + jr * kcp;
    const float* src = B.data + (j0 + jr) * B.ld + p0;
    for (int v = 0; v < NV; ++v) {
      const int64_t rows = std::clamp<int64_t>(nr - 16 * v, 0, 16);
      for (int64_t k = 0; k < kc; k += 32)
        transpose_pairs(src + 16 * v * B.ld + k, B.ld, rows, std::min<int64_t>(32, kc - k), d + k / 2 * kNR + 16 * v,
                        kNR);
    }
  }
}

// Packs rows [0, mr) x k in [0, kc) of op(A) (first element `a`) as MR-interleaved pair words dst[p * MR + r]; rows
// past mr zero. dst needs ceil(kc / 2) * MR + 16 words.
template <int kMR>
[[gnu::target("avx512bf16")]] void pack_a_bf16(const float* a, int64_t ld, bool trans, int mr, int64_t kc,
                                               uint32_t* dst) {
  const int64_t kcp = (kc + 1) / 2;
  if (trans) {  // element (r, k) at a[k * ld + r]: rows k = 2p and 2p + 1 hold the MR elements
    const __mmask16 m = first_lanes(mr);
    const __m512 zero = _mm512_setzero_ps();
    for (int64_t p = 0; p < kcp; ++p) {
      const __m512 lo = _mm512_maskz_loadu_ps(m, a + 2 * p * ld);
      const __m512 hi = 2 * p + 1 < kc ? _mm512_maskz_loadu_ps(m, a + (2 * p + 1) * ld) : zero;
      const __m512i w = pair_words(lo, hi);
      if constexpr (kMR == 16)
        _mm512_storeu_si512(dst + p * kMR, w);
      else
        _mm512_mask_storeu_epi32(dst + p * kMR, static_cast<__mmask16>((1u << kMR) - 1u), w);
    }
  } else {  // 32 k of 16 rows at a time; consecutive blocks overlap by 16 - MR lanes and are stored in order
    for (int64_t k = 0; k < kc; k += 32)
      transpose_pairs(a + k, ld, mr, std::min<int64_t>(32, kc - k), dst + k / 2 * kMR, kMR);
  }
}

// C[0:mr, 0:nr] = alpha * sum_p ap[p * MR + r] . b[p * NR + j] (+ C when acc / + bias): MR x NV vdpbf16ps per pair.
template <int NV>
[[gnu::target("avx512bf16")]] inline void micro_kernel_bf16(int64_t kcp, const uint32_t* __restrict ap,
                                                            const uint32_t* __restrict b, float* c, int64_t ldc, int mr,
                                                            int nr, float alpha, bool acc, const float* bias) {
  constexpr int kMR = Block<NV>::kMR, kNR = Block<NV>::kNR;
  __m512 r[kMR][NV];
  for (int i = 0; i < kMR; ++i)
    for (int v = 0; v < NV; ++v) r[i][v] = _mm512_setzero_ps();
  prefetch_c_tile<NV>(c, ldc, mr);
  for (int64_t p = 0; p < kcp; ++p) {
    __m512bh bv[NV];
    for (int v = 0; v < NV; ++v) bv[v] = reinterpret_cast<__m512bh>(_mm512_load_si512(b + p * kNR + 16 * v));
    const uint32_t* ak = ap + p * kMR;
    for (int i = 0; i < kMR; ++i) {
      const __m512bh av = reinterpret_cast<__m512bh>(_mm512_set1_epi32(static_cast<int>(ak[i])));
      for (int v = 0; v < NV; ++v) r[i][v] = _mm512_dpbf16_ps(r[i][v], av, bv[v]);
    }
  }
  store_c_tile<NV>(r, c, ldc, mr, nr, alpha, acc, bias);
}

template <int NV>
[[gnu::target("avx512bf16")]] void packed_gemm_bf16(int64_t m, int64_t n, int64_t k, const GemmOperand<float>& a,
                                                    const GemmOperand<float>& b, float* c, int64_t ldc, bool accumulate,
                                                    float alpha, const float* bias) {
  constexpr int kMR = Block<NV>::kMR, kNR = Block<NV>::kNR;
  const int64_t kcp_max = (std::min(kKC2, k) + 1) / 2;
  thread_local Scratch b_buf;
  uint32_t* pb = b_buf.get<uint32_t>(static_cast<size_t>(std::min(kNC, (n + kNR - 1) / kNR * kNR) * kcp_max));
  thread_local Scratch a_buf;
  uint32_t* pa = a_buf.get<uint32_t>(static_cast<size_t>((kMC + kMR) * kcp_max + 16));
  for (int64_t j0 = 0; j0 < n; j0 += kNC) {
    const int64_t nc = std::min(kNC, n - j0);
    for (int64_t p0 = 0; p0 < k; p0 += kKC2) {
      const int64_t kc = std::min(kKC2, k - p0), kcp = (kc + 1) / 2;
      const bool acc = accumulate || p0 > 0;
      pack_b_bf16<NV>(b, p0, kc, j0, nc, pb);
      for (int64_t i0 = 0; i0 < m; i0 += kMC) {
        const int64_t mc = std::min(kMC, m - i0);
        for (int64_t ir = 0; ir < mc; ir += kMR) {
          const int64_t i = i0 + ir;
          pack_a_bf16<kMR>(a.trans ? a.data + p0 * a.ld + i : a.data + i * a.ld + p0, a.ld, a.trans,
                           static_cast<int>(std::min<int64_t>(kMR, mc - ir)), kc, pa + ir * kcp);
        }
        for (int64_t jr = 0; jr < nc; jr += kNR) {
          const int nr = static_cast<int>(std::min<int64_t>(kNR, nc - jr));
          for (int64_t ir = 0; ir < mc; ir += kMR) {
            const int mr = static_cast<int>(std::min<int64_t>(kMR, mc - ir));
            micro_kernel_bf16<NV>(kcp, pa + ir * kcp, pb + jr * kcp, c + (i0 + ir) * ldc + j0 + jr, ldc, mr, nr, alpha,
                                  acc, bias && p0 == 0 ? bias + j0 + jr : nullptr);
          }
        }
      }
    }
  }
}

}  // namespace

bool packed_gemm_available() { return true; }

void packed_gemm(int64_t m, int64_t n, int64_t k, GemmOperand<float> a, GemmOperand<float> b, float* c, int64_t ldc,
                 bool accumulate, float alpha, const float* bias) {
  if (k == 0) {
    if (!accumulate)
      for (int64_t i = 0; i < m; ++i) std::memset(c + i * ldc, 0, static_cast<size_t>(n) * sizeof(float));
    return;
  }
  if (n <= 16)
    packed_gemm<1>(m, n, k, a, b, c, ldc, accumulate, alpha, bias);
  else
    packed_gemm<2>(m, n, k, a, b, c, ldc, accumulate, alpha, bias);
}

size_t packed_b_floats(int64_t k, int64_t n) {
  const int64_t nr = n <= 16 ? 16 : 32;
  return static_cast<size_t>(std::max<int64_t>(k, 1) * ((n + nr - 1) / nr * nr));
}

void pack_gemm_b(int64_t k, int64_t n, GemmOperand<float> b, float* dst) {
  if (n <= 16)
    pack_b<1>(b, 0, k, 0, n, dst);
  else
    pack_b<2>(b, 0, k, 0, n, dst);
}

bool bf16_gemm_available() {
  static const bool has = __builtin_cpu_supports("avx512bf16");
  return has;
}

void packed_gemm_bf16(int64_t m, int64_t n, int64_t k, GemmOperand<float> a, GemmOperand<float> b, float* c,
                      int64_t ldc, bool accumulate, float alpha, const float* bias) {
  if (!bf16_gemm_available()) kernel_error("gemm_bf16", "internal error: this CPU has no AVX512-BF16");
  if (k == 0) {
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) c[i * ldc + j] = accumulate ? c[i * ldc + j] : bias ? bias[j] : 0.0f;
    return;
  }
  if (n <= 16)
    packed_gemm_bf16<1>(m, n, k, a, b, c, ldc, accumulate, alpha, bias);
  else
    packed_gemm_bf16<2>(m, n, k, a, b, c, ldc, accumulate, alpha, bias);
}

namespace {

// ---- A few rows against bfloat16 weight rows (decoding): memory-bound, so the weights stream once per call, R rows
// at a time, every row of X passing while they are in L1; the groups kAhead ahead are prefetched (a bf16 row is a
// short stream, 1 KB at K = 512, too short for the hardware prefetcher to reach full speed on its own).
constexpr int kRowsR = 8;
constexpr int64_t kRowsAhead = 4;

// The float32 value of bf16 bits.
inline float bf16_value(uint16_t b) {
  const uint32_t u = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

// sum over k in [k0, K) of W[k] * x[k], in float (each product exact).
inline float dot_tail(const uint16_t* w, const float* x, int64_t k0, int64_t K) {
  float s = 0;
  for (int64_t k = k0; k < K; ++k) s += bf16_value(w[k]) * x[k];
  return s;
}

// vdpbf16ps: 32 products per instruction, x as bf16 bits (xb) beside its float values (x, for the tail).
template <int R>
[[gnu::target("avx512bf16")]] void rows_group_dp(const uint16_t* w, int64_t K, const uint16_t* xb, const float* x,
                                                 const uint16_t* next, float* y) {
  const int64_t Kv = K / 32 * 32;
  __m512 a[R];
  for (int r = 0; r < R; ++r) a[r] = _mm512_setzero_ps();
  for (int64_t k = 0; k < Kv; k += 32) {
    if (next)
      for (int r = 0; r < R; ++r) _mm_prefetch(reinterpret_cast<const char*>(next + r * K + k), _MM_HINT_T0);
    const __m512bh xv = reinterpret_cast<__m512bh>(_mm512_loadu_si512(xb + k));
    for (int r = 0; r < R; ++r)
      a[r] = _mm512_dpbf16_ps(a[r], reinterpret_cast<__m512bh>(_mm512_loadu_si512(w + r * K + k)), xv);
  }
  for (int r = 0; r < R; ++r) y[r] = _mm512_reduce_add_ps(a[r]) + dot_tail(w + r * K, x, Kv, K);
}

// Without AVX512-BF16: each 16 weights widened to float32 (a shift), then an FMA.
template <int R>
void rows_group_widen(const uint16_t* w, int64_t K, const float* x, const uint16_t* next, float* y) {
  const int64_t Kv = K / 16 * 16;
  __m512 a[R];
  for (int r = 0; r < R; ++r) a[r] = _mm512_setzero_ps();
  for (int64_t k = 0; k < Kv; k += 16) {
    if (next && k % 32 == 0)
      for (int r = 0; r < R; ++r) _mm_prefetch(reinterpret_cast<const char*>(next + r * K + k), _MM_HINT_T0);
    const __m512 xv = _mm512_loadu_ps(x + k);
    for (int r = 0; r < R; ++r) {
      const __m512i wi = _mm512_slli_epi32(
          _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + r * K + k))), 16);
      a[r] = _mm512_fmadd_ps(_mm512_castsi512_ps(wi), xv, a[r]);
    }
  }
  for (int r = 0; r < R; ++r) y[r] = _mm512_reduce_add_ps(a[r]) + dot_tail(w + r * K, x, Kv, K);
}

// Rows [n0, n1) in groups of R (the last group smaller), every row of X against each group.
template <int R>
void rows_groups(const uint16_t* W, const float* X, const uint16_t* XB, int64_t M, const float* bias, float* Y,
                 int64_t N, int64_t K, int64_t n0, int64_t n1, bool dp) {
  for (int64_t n = n0; n + R <= n1; n += R) {
    const uint16_t* w = W + n * K;
    const uint16_t* next = n + (kRowsAhead + 1) * R <= N ? w + kRowsAhead * R * K : nullptr;
    for (int64_t m = 0; m < M; ++m) {
      float y[R];
      if (dp)
        rows_group_dp<R>(w, K, XB + m * K, X + m * K, m == 0 ? next : nullptr, y);
      else
        rows_group_widen<R>(w, K, X + m * K, m == 0 ? next : nullptr, y);
      for (int r = 0; r < R; ++r) Y[m * N + n + r] = bias ? y[r] + bias[n + r] : y[r];
    }
  }
}

}  // namespace

void rows_bf16(const uint16_t* W, const float* X, int64_t M, const float* bias, float* Y, int64_t N, int64_t K,
               bool native) {
  const bool dp = native && bf16_gemm_available();
  thread_local Scratch xb_buf;
  uint16_t* XB = nullptr;
  if (dp) {  // X's bf16 bits (X holds bf16 values: the top half of each float)
    XB = xb_buf.get<uint16_t>(static_cast<size_t>(std::max<int64_t>(M * K, 1)));
    for (int64_t i = 0; i < M * K; ++i) {
      uint32_t u;
      std::memcpy(&u, X + i, sizeof u);
      XB[i] = static_cast<uint16_t>(u >> 16);
    }
  }
  const int64_t full = N / kRowsR * kRowsR;
  rows_groups<kRowsR>(W, X, XB, M, bias, Y, N, K, 0, full, dp);
  rows_groups<1>(W, X, XB, M, bias, Y, N, K, full, N, dp);
}

void gemm_packed(int64_t m, int64_t n, int64_t k, GemmOperand<float> a, const float* packed_b, int64_t kb, int64_t nb,
                 float* c, int64_t ldc, bool accumulate, float alpha) {
  if (m <= 0 || n <= 0) return;
  if (k == 0) {
    if (!accumulate)
      for (int64_t i = 0; i < m; ++i) std::memset(c + i * ldc, 0, static_cast<size_t>(n) * sizeof(float));
    return;
  }
  if (nb <= 16)
    prepacked_gemm<1>(m, n, k, a, packed_b, kb, c, ldc, accumulate, alpha);
  else
    prepacked_gemm<2>(m, n, k, a, packed_b, kb, c, ldc, accumulate, alpha);
}

#else  // the avx2 and generic sets: the same blocking on GCC vector types (8 lanes with AVX2, 4 with SSE2)

namespace {

#if defined(__AVX2__)
constexpr int kW = 8;         // floats per vector
constexpr int kMR = 6;        // rows of the register block: 6 x 2 accumulators of 8 lanes (12 of the 16 ymm registers)
#else
constexpr int kW = 4;
constexpr int kMR = 4;  // 4 x 2 accumulators of 4 lanes (8 of the 16 xmm registers)
#endif
constexpr int kNR = 2 * kW;   // columns of the register block
constexpr int64_t kKC = 256;  // k per panel
constexpr int64_t kNC = 512;  // columns of B per packed panel
typedef float Vec __attribute__((vector_size(kW * sizeof(float))));

// pb = op(B)[p0 : p0 + kc, j0 : j0 + nc] as micro-panels of kNR columns (kc rows of kNR floats each, zero padded).
void pack_b_panels(const GemmOperand<float>& b, int64_t p0, int64_t kc, int64_t j0, int64_t nc, float* pb) {
  for (int64_t jr = 0; jr < nc; jr += kNR) {
    const int64_t nr = std::min<int64_t>(kNR, nc - jr);
    float* dst = pb + jr * kc;
    for (int64_t kk = 0; kk < kc; ++kk) {
      for (int64_t j = 0; j < nr; ++j) {
        const int64_t r = p0 + kk, col = j0 + jr + j;
        dst[kk * kNR + j] = b.trans ? b.data[col * b.ld + r] : b.data[r * b.ld + col];
      }
      for (int64_t j = nr; j < kNR; ++j) dst[kk * kNR + j] = 0.0f;
    }
  }
}

// C tile (mr, nr) = alpha * op(A)[i, p0 : p0 + kc] packed-B + (C when acc, else the bias row when bias, else 0).
void micro_tile(int64_t kc, const GemmOperand<float>& a, int64_t i, int64_t p0, const float* bp, float* c, int64_t ldc,
                int mr, int nr, float alpha, bool acc, const float* bias) {
  Vec r[kMR][2] = {};
  const float* arow[kMR];
  for (int q = 0; q < kMR; ++q)
    arow[q] = a.data + (a.trans ? p0 * a.ld + i + std::min(q, mr - 1) : (i + std::min(q, mr - 1)) * a.ld + p0);
  const int64_t astep = a.trans ? a.ld : 1;
  for (int64_t kk = 0; kk < kc; ++kk) {
    Vec b0, b1;
    std::memcpy(&b0, bp + kk * kNR, sizeof(Vec));
    std::memcpy(&b1, bp + kk * kNR + kW, sizeof(Vec));
    for (int q = 0; q < kMR; ++q) {
      const float av = arow[q][kk * astep];
      r[q][0] += av * b0;
      r[q][1] += av * b1;
    }
  }
  for (int q = 0; q < mr; ++q) {
    float t[kNR];
    std::memcpy(t, &r[q][0], sizeof(Vec));
    std::memcpy(t + kW, &r[q][1], sizeof(Vec));
    float* cr = c + q * ldc;
    for (int j = 0; j < nr; ++j) cr[j] = alpha * t[j] + (acc ? cr[j] : bias ? bias[j] : 0.0f);
  }
}

}  // namespace

bool packed_gemm_available() { return false; }

// Every element of C is the same sequence of multiply-adds whatever the block it falls in (k split at the same kKC
// boundaries, each panel's sum kept in one vector lane): a split between threads never changes a bit.
void packed_gemm(int64_t m, int64_t n, int64_t k, GemmOperand<float> a, GemmOperand<float> b, float* c, int64_t ldc,
                 bool accumulate, float alpha, const float* bias) {
  if (k == 0) {
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) c[i * ldc + j] = accumulate ? c[i * ldc + j] : bias ? bias[j] : 0.0f;
    return;
  }
  thread_local Scratch b_buf;
  const int64_t kc_max = std::min(kKC, k);
  float* pb = b_buf.get<float>(static_cast<size_t>(std::min(kNC, (n + kNR - 1) / kNR * kNR) * kc_max));
  for (int64_t j0 = 0; j0 < n; j0 += kNC) {
    const int64_t nc = std::min(kNC, n - j0);
    for (int64_t p0 = 0; p0 < k; p0 += kKC) {
      const int64_t kc = std::min(kKC, k - p0);
      const bool acc = accumulate || p0 > 0;
      pack_b_panels(b, p0, kc, j0, nc, pb);
      for (int64_t jr = 0; jr < nc; jr += kNR) {
        const int nr = static_cast<int>(std::min<int64_t>(kNR, nc - jr));
        for (int64_t i = 0; i < m; i += kMR) {
          const int mr = static_cast<int>(std::min<int64_t>(kMR, m - i));
          micro_tile(kc, a, i, p0, pb + jr * kc, c + i * ldc + j0 + jr, ldc, mr, nr, alpha, acc,
                     bias && p0 == 0 ? bias + j0 + jr : nullptr);
        }
      }
    }
  }
}

// Y (M, N) = X (M, K) W (N, K)^T (+ bias), W as bf16 bits: each 16 weights widened to float32 by a shift, four rows
// at a time (the avx512 set's kernel, on GCC vector types).
void rows_bf16(const uint16_t* W, const float* X, int64_t M, const float* bias, float* Y, int64_t N, int64_t K, bool) {
  typedef uint16_t Half16 __attribute__((vector_size(32)));
  typedef uint32_t Word16 __attribute__((vector_size(64)));
  typedef float Float16 __attribute__((vector_size(64)));
  constexpr int64_t kLanes = 16, kRows = 4;
  const int64_t Kv = K / kLanes * kLanes;
  auto widen = [](Float16& v, const uint16_t* p) {
    Half16 h;
    std::memcpy(&h, p, sizeof h);
    const Word16 w = __builtin_convertvector(h, Word16) << 16;
    std::memcpy(&v, &w, sizeof v);
  };
  auto finish = [&](const Float16& acc, const float* x, int64_t n) {
    float s = 0;
    for (int64_t l = 0; l < kLanes; ++l) s += acc[l];
    const uint16_t* w = W + n * K;
    for (int64_t k = Kv; k < K; ++k) {
      const uint32_t u = static_cast<uint32_t>(w[k]) << 16;
      float f;
      std::memcpy(&f, &u, sizeof f);
      s += f * x[k];
    }
    return bias ? s + bias[n] : s;
  };
  int64_t n = 0;
  for (; n + kRows <= N; n += kRows) {
    const uint16_t* w = W + n * K;
    for (int64_t m = 0; m < M; ++m) {
      const float* x = X + m * K;
      Float16 a[kRows] = {}, xv, wv;
      for (int64_t k = 0; k < Kv; k += kLanes) {
        std::memcpy(&xv, x + k, sizeof xv);
        for (int64_t r = 0; r < kRows; ++r) {
          widen(wv, w + r * K + k);
          a[r] += wv * xv;
        }
      }
      for (int64_t r = 0; r < kRows; ++r) Y[m * N + n + r] = finish(a[r], x, n + r);
    }
  }
  for (; n < N; ++n)
    for (int64_t m = 0; m < M; ++m) {
      const float* x = X + m * K;
      Float16 a = {}, xv, wv;
      for (int64_t k = 0; k < Kv; k += kLanes) {
        std::memcpy(&xv, x + k, sizeof xv);
        widen(wv, W + n * K + k);
        a += wv * xv;
      }
      Y[m * N + n] = finish(a, x, n);
    }
}

bool bf16_gemm_available() { return false; }
void packed_gemm_bf16(int64_t, int64_t, int64_t, GemmOperand<float>, GemmOperand<float>, float*, int64_t, bool, float,
                      const float*) {
  kernel_error("gemm_bf16", "internal error: no bfloat16 GEMM kernel in this kernel set");
}

size_t packed_b_floats(int64_t, int64_t) { return 0; }
void pack_gemm_b(int64_t, int64_t, GemmOperand<float>, float*) {
  kernel_error("gemm", "internal error: no prepacked GEMM kernel in this kernel set");
}
void gemm_packed(int64_t, int64_t, int64_t, GemmOperand<float>, const float*, int64_t, int64_t, float*, int64_t, bool,
                 float) {
  kernel_error("gemm", "internal error: no prepacked GEMM kernel in this kernel set");
}

#endif

}  // namespace attograd::cpu::ATTOGRAD_CPU_ISA
