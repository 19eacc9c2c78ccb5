#pragma once
// Internal: the CPU kernels, compiled once per kernel set (autograd/cpu/*.cpp with ATTOGRAD_CPU_ISA = generic, avx2,
// avx512 and that set's -march, see CMakeLists.txt), each set in its own namespace attograd::cpu::<set> so that
// nothing of one set can stand in for another at link time. Ops call a kernel through ATTO_CPU(name)(args...),
// which picks the function of the active set (autograd/cpu.h).

#include <atomic>
#include <cstdint>

namespace attograd::cpu {

/// A kernel set; the values index supported_cpu_kernels' names.
enum class Isa : int { generic = 0, avx2 = 1, avx512 = 2 };

/// The active set as chosen by select_isa(); -1 until the first call.
extern std::atomic<int> g_active_isa;
/// Chooses the active set (ATTOGRAD_CPU or the best the CPU supports); throws Error like cpu_kernels().
Isa select_isa();

/// Throws Error(op, what). Kernels call this instead of constructing an Error: the error's inline functions would be
/// compiled into the kernel set's objects, and the linker may keep that copy for the whole library.
[[noreturn]] void kernel_error(const char* op, const char* what);

/// x viewed as (outer, n, inner), reduced over n: softmax along one dim.
struct Slices {
  int64_t outer = 1, n = 1, inner = 1;
};

/// Rows per block of layer_norm_backward's partial dweight/dbias sums (the caller allocates one row of N per block).
constexpr int64_t kLayerNormBlockRows = 32;

/// The kind of attention mask: none, bool (true = blocked) or float (added to the scores).
enum class MaskKind { None, Bool, Float };

/// mask_mod / score_mod (autograd/flex.h) as the attention kernels see them. The op fills it; the kernels call the
/// mods only through flex_mask / flex_score / flex_score_backward, compiled once outside the kernel sets.
struct FlexArgs {
  const uint8_t* kinds = nullptr;  // block mask (mB, mH, nbq, nbk) of BlockKind (0 empty, 1 partial, 2 full); null =
                                   // no mask_mod
  int64_t mB = 1, mH = 1, nbq = 0, nbk = 0, bs = 1;  // its dims (mB, mH = 1: broadcast) and block side
  const int64_t* bits_at = nullptr;  // per block (as kinds): its partial elements' start in bits, -1 = call mask
  const uint8_t* bits = nullptr;     // partial blocks' elements, bs x bs bytes each (1 = attended)
  // The dense path may take this mask (no score_mod; every row of blocks is non-empty blocks [0, end), every partial
  // block's elements kept; the dense rows of queries never cross a block): causal-like masks then cost what
  // is_causal costs.
  bool dense = false;
  const void* mask = nullptr;                        // the MaskFn
  const void* score = nullptr;                       // the ScoreFn; null = no score_mod
  const void* captures = nullptr;                    // the Captures
  int64_t q_offset = 0;                              // absolute position of query row 0
  // Backward: per key/value-head group g (B * H_kv) the slice cap_grad + g * cap_numel receives the captured
  // tensors' gradients (tensor i's flat elements from cap_offset[i]); null = none wanted.
  double* cap_grad = nullptr;
  int64_t cap_numel = 0;
  const int64_t* cap_offset = nullptr;
  /// The block kinds of query block qb of head (b, h).
  [[gnu::always_inline]] const uint8_t* row(int64_t b, int64_t h, int64_t qb) const {
    return kinds + (((mB == 1 ? 0 : b) * mH + (mH == 1 ? 0 : h)) * nbq + qb) * nbk;
  }
  /// bits_at of query block qb of head (b, h).
  [[gnu::always_inline]] const int64_t* bits_row(int64_t b, int64_t h, int64_t qb) const {
    return bits_at + (((mB == 1 ? 0 : b) * mH + (mH == 1 ? 0 : h)) * nbq + qb) * nbk;
  }
};
/// mask_mod(b, h, q_offset + i, j): true = the score exists.
bool flex_mask(const FlexArgs& f, int64_t b, int64_t h, int64_t i, int64_t j);
/// score_mod's value at raw score s of (b, h, query row i, key j).
double flex_score(const FlexArgs& f, double s, int64_t b, int64_t h, int64_t i, int64_t j);
/// score_mod's d/dscore at s; adds g * d mod / d capture into cap_grad (a group's slice; null = not wanted).
double flex_score_backward(const FlexArgs& f, double s, int64_t b, int64_t h, int64_t i, int64_t j, double g,
                           double* cap_grad);

/// Everything the attention forward and backward need to recompute a block of scores and its dropout mask.
struct AttentionPlan {
  int64_t B = 0, H = 0, Lq = 0, Lk = 0, dk = 0, dv = 0;
  double scale = 1.0;
  bool causal = false;
  MaskKind mask_kind = MaskKind::None;
  int64_t mb = 0, mh = 0, mi = 0, mj = 0;  // mask strides (elements) over (b, h, i, j); 0 where broadcast
  bool dropout = false;
  uint64_t seed = 0;        // drawn once per call from the generator
  uint64_t drop_below = 0;  // an element is dropped when its 32-bit hash is below this (= ceil(p * 2^32))
  double keep_scale = 1.0;  // 1 / (1 - p)
  int64_t Hkv = 0;          // key/value heads (divides H; 0 = H): query head h reads key/value head h / (H / Hkv)
  int64_t window = 0;       // sliding window (0 = off): causal i - window < j <= i, else |i - j| <= window
  int64_t block = 0;        // block-sparse block size (0 = off) of layout (nbq, nbk), true = the block is computed
  const bool* layout = nullptr;
  int64_t nbq = 0, nbk = 0;
  /// mask_mod / score_mod (autograd/flex.h), null when neither is given (the paths of before, unchanged).
  const FlexArgs* flex = nullptr;
  /// Rows of at most 64 keys take the avx512 set's one-pass row kernels (false: the separate passes, the same bits).
  bool one_pass_rows = true;
  /// Query heads per key/value head.
  int64_t group() const { return Hkv > 0 ? H / Hkv : 1; }
  /// True when the pattern (window or block layout) lets the kernels skip blocks of keys.
  bool sparse() const { return window > 0 || block > 0 || (flex != nullptr && !flex->dense); }
};

/// The heads of a (B, H, L, d) operand: feature x of row l of head (b, h) at p + b * sb + h * sh + l * sl + x.
template <class T>
struct HeadView {
  T* p = nullptr;
  int64_t sb = 0, sh = 0, sl = 0;
  [[gnu::always_inline]] T* head(int64_t b, int64_t h) const { return p + b * sb + h * sh; }
  [[gnu::always_inline]] explicit operator bool() const { return p != nullptr; }
};

/// The active kernel set.
inline Isa active_isa() {
  const int isa = g_active_isa.load(std::memory_order_relaxed);
  return isa >= 0 ? static_cast<Isa>(isa) : select_isa();
}

}  // namespace attograd::cpu

// The kernels' declarations, once per set.
#define ATTOGRAD_CPU_NS generic
#include "autograd/cpu/kernel_decls.h"
#undef ATTOGRAD_CPU_NS
#define ATTOGRAD_CPU_NS avx2
#include "autograd/cpu/kernel_decls.h"
#undef ATTOGRAD_CPU_NS
#define ATTOGRAD_CPU_NS avx512
#include "autograd/cpu/kernel_decls.h"
#undef ATTOGRAD_CPU_NS

#if defined(ATTOGRAD_CPU_HAS_AVX512) && defined(ATTOGRAD_CPU_HAS_AVX2)
/// The active set's kernel `name` (a function pointer): ATTO_CPU(layer_norm_forward<float>)(args...).
#define ATTO_CPU(...)                                                                                    \
  (::attograd::cpu::active_isa() == ::attograd::cpu::Isa::avx512 ? &::attograd::cpu::avx512::__VA_ARGS__ \
   : ::attograd::cpu::active_isa() == ::attograd::cpu::Isa::avx2 ? &::attograd::cpu::avx2::__VA_ARGS__   \
                                                                 : &::attograd::cpu::generic::__VA_ARGS__)
#else
#define ATTO_CPU(...) (&::attograd::cpu::generic::__VA_ARGS__)
#endif
