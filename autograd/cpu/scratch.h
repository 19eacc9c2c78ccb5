#pragma once
// Internal, for the kernel files (autograd/cpu/*.cpp) only: per-thread scratch memory.

#include <algorithm>
#include <cstddef>
#include <cstdlib>
#include <initializer_list>
#include <new>

namespace attograd::cpu::ATTOGRAD_CPU_ISA {

/// 64-byte aligned scratch, grown on demand and kept (no allocation in steady state); hold one per thread and per
/// use (thread_local). reserve() makes room for buffers of the given byte sizes and rewinds; take<U>(n) then hands
/// out consecutive 64-byte aligned buffers of n elements; get<U>(n) is reserve + take for a single buffer.
class Scratch {
 public:
  Scratch() = default;
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
  ~Scratch() { std::free(data_); }
  void reserve(std::initializer_list<size_t> bytes) {
    size_t total = 0;
    for (size_t b : bytes) total += round(b);
    if (total > cap_) {
      std::free(data_);
      data_ = nullptr;
      cap_ = 0;
      data_ = static_cast<char*>(std::aligned_alloc(64, std::max<size_t>(total, 64)));
      if (!data_) throw std::bad_alloc();
      cap_ = std::max<size_t>(total, 64);
    }
    next_ = data_;
  }
  template <class U>
  U* take(size_t n) {
    U* p = reinterpret_cast<U*>(next_);
    next_ += round(n * sizeof(U));
    return p;
  }
  template <class U>
  U* get(size_t n) {
    reserve({n * sizeof(U)});
    return take<U>(n);
  }

 private:
  static size_t round(size_t b) { return (b + 63) / 64 * 64; }
  char* data_ = nullptr;
  char* next_ = nullptr;
  size_t cap_ = 0;
};

}  // namespace attograd::cpu::ATTOGRAD_CPU_ISA
