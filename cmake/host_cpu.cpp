// Prints the kernel set (autograd/cpu.h) this machine runs, by the tests of supported_cpu_kernels() in
// autograd/cpu.cpp: the configure-time probe of the native build.
#include <cstdio>

int main() {
  __builtin_cpu_init();
  const bool v3 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("bmi") &&
                  __builtin_cpu_supports("bmi2");
  const bool v4 = v3 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                  __builtin_cpu_supports("avx512cd") && __builtin_cpu_supports("avx512dq") &&
                  __builtin_cpu_supports("avx512vl");
  std::puts(v4 ? "avx512" : v3 ? "avx2" : "generic");
}
