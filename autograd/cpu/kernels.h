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
#define ATTO_CPU(...)                                                                                  \
  (::attograd::cpu::active_isa() == ::attograd::cpu::Isa::avx512 ? &::attograd::cpu::avx512::__VA_ARGS__ \
   : ::attograd::cpu::active_isa() == ::attograd::cpu::Isa::avx2 ? &::attograd::cpu::avx2::__VA_ARGS__   \
                                                                  : &::attograd::cpu::generic::__VA_ARGS__)
#else
#define ATTO_CPU(...) (&::attograd::cpu::generic::__VA_ARGS__)
#endif
