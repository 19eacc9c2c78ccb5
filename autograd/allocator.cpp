// The caching Storage allocator (see allocator.h): size-class free lists under one mutex.

#include "autograd/allocator.h"

#include <algorithm>
#include <cstdlib>
#include <mutex>
#include <vector>

#include "autograd/error.h"

namespace attograd {

namespace {

constexpr size_t kSmallStep = 64;    // classes 64, 128, ..., 512
constexpr size_t kSmallMax = 512;
constexpr int kSmallClasses = 8;
constexpr int kNumClasses = kSmallClasses + 4 * 64;

// Class index and size of a request: multiples of 64 up to 512, then 2^k * (4 + i) / 4 for i = 1..4.
int class_index(size_t n, size_t* size) {
  if (n <= kSmallMax) {
    const size_t c = n == 0 ? 1 : (n + kSmallStep - 1) / kSmallStep;
    *size = c * kSmallStep;
    return static_cast<int>(c) - 1;
  }
  const int k = 63 - __builtin_clzll(static_cast<unsigned long long>(n - 1));  // 2^k < n <= 2^(k+1)
  const size_t base = size_t{1} << k, quarter = base / 4;
  const size_t i = (n - base + quarter - 1) / quarter;  // 1..4
  *size = base + i * quarter;
  return kSmallClasses + (k - 9) * 4 + static_cast<int>(i) - 1;
}

// Size of class k (the inverse of class_index).
size_t class_size(int k) {
  if (k < kSmallClasses) return static_cast<size_t>(k + 1) * kSmallStep;
  const int j = k - kSmallClasses;
  const size_t base = size_t{1} << (9 + j / 4);
  return base + static_cast<size_t>(j % 4 + 1) * (base / 4);
}

// Requests of at least this many bytes may take a block of the next two classes.
constexpr size_t kBestFitMin = size_t{64} << 10;

size_t env_limit() {
  const char* s = std::getenv("ATTOGRAD_CACHE_LIMIT_MB");
  if (!s || !*s) return size_t{1} << 30;
  char* end = nullptr;
  const unsigned long long v = std::strtoull(s, &end, 10);
  if (end == s || *end != '\0') return size_t{1} << 30;
  return static_cast<size_t>(v) << 20;
}

class CachingAllocator {
 public:
  void* alloc(size_t nbytes, size_t* capacity) {
    size_t size = 0;
    const int c = class_index(nbytes, &size);
    {
      std::lock_guard<std::mutex> lock(mu_);
      ++s_.num_allocs;
      s_.requested_bytes += nbytes;
      // Its own class first; for large requests, then a free block of the next two classes.
      const int last = size >= kBestFitMin ? std::min(c + 2, kNumClasses - 1) : c;
      for (int k = c; k <= last; ++k) {
        std::vector<void*>& list = free_[k];
        if (list.empty()) continue;
        void* p = list.back();
        list.pop_back();
        const size_t block = class_size(k);
        s_.cached_bytes -= block;
        s_.allocated_bytes += block;
        s_.peak_allocated_bytes = std::max(s_.peak_allocated_bytes, s_.allocated_bytes);
        ++s_.cache_hits;
        *capacity = block;
        return p;
      }
      s_.allocated_bytes += size;
      s_.peak_allocated_bytes = std::max(s_.peak_allocated_bytes, s_.allocated_bytes);
      ++s_.cache_misses;
      s_.reserved_bytes += size;
      s_.peak_reserved_bytes = std::max(s_.peak_reserved_bytes, s_.reserved_bytes);
    }
    void* p = std::aligned_alloc(64, size);
    if (!p) {  // give the cache back and try once more
      empty();
      p = std::aligned_alloc(64, size);
    }
    if (!p) {
      std::lock_guard<std::mutex> lock(mu_);
      s_.allocated_bytes -= size;
      s_.requested_bytes -= nbytes;
      s_.reserved_bytes -= size;
      throw Error("alloc", cat("out of memory allocating ", nbytes, " bytes"));
    }
    *capacity = size;
    return p;
  }

  void release(void* p, size_t nbytes, size_t size) {
    if (!p) return;
    size_t ignored = 0;
    const int c = class_index(size, &ignored);  // the block's own class (a best fit may be larger than nbytes')
    {
      std::lock_guard<std::mutex> lock(mu_);
      ++s_.num_frees;
      s_.allocated_bytes -= size;
      s_.requested_bytes -= nbytes;
      if (s_.cached_bytes + size <= limit()) {
        free_[c].push_back(p);
        s_.cached_bytes += size;
        return;
      }
      s_.reserved_bytes -= size;
      ++s_.system_frees;
    }
    std::free(p);
  }

  void empty() {
    std::vector<void*> out;
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (auto& list : free_) {
        out.insert(out.end(), list.begin(), list.end());
        list.clear();
        list.shrink_to_fit();
      }
      s_.reserved_bytes -= s_.cached_bytes;
      s_.cached_bytes = 0;
      s_.system_frees += out.size();
    }
    for (void* p : out) std::free(p);
  }

  void set_limit(size_t bytes) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      limit();
      limit_ = bytes;
      if (s_.cached_bytes <= limit_) return;
    }
    empty();
  }

  size_t get_limit() {
    std::lock_guard<std::mutex> lock(mu_);
    return limit();
  }

  AllocatorStats stats() {
    std::lock_guard<std::mutex> lock(mu_);
    return s_;
  }

  void reset_peaks() {
    std::lock_guard<std::mutex> lock(mu_);
    s_.peak_allocated_bytes = s_.allocated_bytes;
    s_.peak_reserved_bytes = s_.reserved_bytes;
  }

 private:
  size_t limit() {  // with mu_ held
    if (!limit_known_) {
      limit_ = env_limit();
      limit_known_ = true;
    }
    return limit_;
  }

  std::mutex mu_;
  std::vector<void*> free_[kNumClasses];
  AllocatorStats s_;
  size_t limit_ = 0;
  bool limit_known_ = false;
};

CachingAllocator& allocator() {
  static CachingAllocator* a = new CachingAllocator();  // never destroyed: storages may be freed at exit
  return *a;
}

}  // namespace

AllocatorStats allocator_stats() { return allocator().stats(); }
void reset_peak_allocator_stats() { allocator().reset_peaks(); }
void empty_cache() { allocator().empty(); }
void set_allocator_cache_limit(size_t bytes) { allocator().set_limit(bytes); }
size_t allocator_cache_limit() { return allocator().get_limit(); }

size_t allocator_size_class(size_t nbytes) {
  size_t size = 0;
  class_index(nbytes, &size);
  return size;
}

namespace detail {
void* storage_alloc(size_t nbytes, size_t* capacity) { return allocator().alloc(nbytes, capacity); }
void storage_free(void* p, size_t nbytes, size_t capacity) { allocator().release(p, nbytes, capacity); }
}  // namespace detail

}  // namespace attograd
