// Picks the kernel set once: ATTOGRAD_CPU when set, else the best set this build has and the CPU runs.

#include "autograd/cpu.h"

#include <array>
#include <cstdlib>

#include "autograd/cpu/kernels.h"
#include "autograd/error.h"

namespace attograd {

namespace cpu {

std::atomic<int> g_active_isa{-1};

namespace {

constexpr std::array<std::string_view, 3> kNames = {"generic", "avx2", "avx512"};

Isa isa_of(std::string_view name) {
  for (size_t i = 0; i < kNames.size(); ++i)
    if (kNames[i] == name) return static_cast<Isa>(i);
  throw Error("cpu_kernels", "internal error: no kernel set \"" + std::string(name) + "\"");
}

}  // namespace

void kernel_error(const char* op, const char* what) { throw Error(op, what); }

Isa select_isa() {
  const Isa isa = isa_of(detail::select_cpu_kernels(std::getenv("ATTOGRAD_CPU"), supported_cpu_kernels()));
  g_active_isa.store(static_cast<int>(isa), std::memory_order_relaxed);
  return isa;
}

}  // namespace cpu

std::vector<std::string_view> supported_cpu_kernels() {
  std::vector<std::string_view> sets;
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
  __builtin_cpu_init();
#if defined(ATTOGRAD_CPU_HAS_AVX512)
  // x86-64-v4 (AVX-512 F, BW, CD, DQ, VL on top of v3), by feature: clang 14 knows no "x86-64-v4". The check
  // includes the OS saving the zmm and ymm registers.
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512cd") &&
      __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx2") &&
      __builtin_cpu_supports("fma") && __builtin_cpu_supports("bmi2"))
    sets.push_back("avx512");
#endif
#if defined(ATTOGRAD_CPU_HAS_AVX2)
  // x86-64-v3: AVX2, FMA, BMI1/2 (every such CPU also has the F16C, LZCNT and MOVBE of the level).
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("bmi") &&
      __builtin_cpu_supports("bmi2"))
    sets.push_back("avx2");
#endif
#endif
  sets.push_back("generic");
  return sets;
}

std::string_view detail::select_cpu_kernels(const char* env, const std::vector<std::string_view>& supported) {
  if (!env || !*env) return supported.front();
  const std::string_view want(env);
  bool known = false;
  for (std::string_view name : cpu::kNames) known = known || name == want;
  ATTO_CHECK(known, "cpu_kernels", "ATTOGRAD_CPU=", want, " is not a kernel set (expected generic, avx2 or avx512)");
  for (std::string_view name : supported)
    if (name == want) return name;
  std::string have;
  for (std::string_view name : supported) have += (have.empty() ? "" : ", ") + std::string(name);
  throw Error("cpu_kernels", "ATTOGRAD_CPU=" + std::string(want) +
                                 " asks for kernels this CPU (or build) cannot run; " + "supported here: " + have);
}

std::string_view cpu_kernels() { return cpu::kNames[static_cast<size_t>(cpu::active_isa())]; }

void set_cpu_kernels(std::string_view name) {
  const std::string s(name);
  const cpu::Isa isa = cpu::isa_of(detail::select_cpu_kernels(s.c_str(), supported_cpu_kernels()));
  cpu::g_active_isa.store(static_cast<int>(isa), std::memory_order_relaxed);
}

}  // namespace attograd
