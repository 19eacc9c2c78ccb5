#pragma once
// The CPU kernels in use. The library's vectorised kernels (autograd/cpu/) are compiled once per kernel set and
// one set is picked at run time, once, before the first kernel runs: "avx512" (AVX-512 F/BW/DQ/VL), "avx2" (AVX2 +
// FMA) or "generic" (any x86-64; the only set on other processors). The best set the CPU supports is the default;
// the environment variable ATTOGRAD_CPU=generic|avx2|avx512 forces one. For a given kernel set and thread count
// every result is bit-reproducible; different sets agree to float rounding.

#include <string_view>
#include <vector>

namespace attograd {

/// The active kernel set ("avx512", "avx2" or "generic"); throws Error when ATTOGRAD_CPU is unknown or names a set
/// this CPU cannot run.
std::string_view cpu_kernels();
/// The kernel sets this build has and this CPU can run, best first (always ends with "generic").
std::vector<std::string_view> supported_cpu_kernels();
/// Switches every later kernel call to the set `name` (tests compare the sets in one process); throws Error when the
/// name is unknown or the CPU cannot run it. Must not be called while ops run on other threads.
void set_cpu_kernels(std::string_view name);

namespace detail {
/// The set ATTOGRAD_CPU = `env` selects on a CPU that can run `supported` (best first): the first of `supported`
/// when env is null or empty; throws Error for an unknown or unsupported name.
std::string_view select_cpu_kernels(const char* env, const std::vector<std::string_view>& supported);
}  // namespace detail

}  // namespace attograd
