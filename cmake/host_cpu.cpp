// Prints the kernel set (autograd/cpu.h) this machine runs: configure-time probe of the native build.
#include <cstdio>

int main() {
  __builtin_cpu_init();
  std::puts(__builtin_cpu_supports("x86-64-v4") ? "avx512" : __builtin_cpu_supports("x86-64-v3") ? "avx2" : "generic");
}
