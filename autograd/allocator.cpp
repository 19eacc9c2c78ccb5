// The caching Storage allocator (see allocator.h): size-class free lists for small blocks, split and coalesced
// segments for large ones, under one mutex.

#include "autograd/allocator.h"

#include <algorithm>
#include <cstdlib>
#include <mutex>
#include <set>
#include <unordered_map>
#include <utility>
#include <vector>

#if defined(__unix__) || defined(__APPLE__)
#include <sys/mman.h>
#endif

#include "autograd/error.h"

namespace attograd {

namespace {

constexpr size_t kSmallStep = 64;    // classes 64, 128, ..., 512
constexpr size_t kSmallMax = 512;
constexpr int kSmallClasses = 8;
constexpr int kNumClasses = kSmallClasses + 4 * 7;  // classes up to 64 KiB (2^15 * 8/4); larger requests use segments

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

// Requests of at least this many bytes (large) are served from segments that are split and coalesced (below);
// smaller ones from the size-class free lists.
constexpr size_t kLargeMin = size_t{64} << 10;
// Large requests are rounded up to whole pages; segments (one system mapping each) to whole 2 MiB, so that tensors
// whose sizes change from step to step (variable sequence lengths) share segments instead of each leaving its own.
constexpr size_t kPage = 4096;
constexpr size_t kSegmentRound = size_t{2} << 20;

size_t round_large(size_t n) { return (n + kPage - 1) / kPage * kPage; }
size_t segment_bytes(size_t n) { return (n + kSegmentRound - 1) / kSegmentRound * kSegmentRound; }

// Segments come straight from the kernel (mmap) and go straight back (munmap): malloc would keep freed ones
// mapped (its heap does not shrink and its mmap threshold adapts upwards), and giving memory back is their point.
void* map_segment(size_t bytes) {
#if defined(__unix__) || defined(__APPLE__)
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  return p == MAP_FAILED ? nullptr : p;
#else
  return std::aligned_alloc(kPage, bytes);
#endif
}

void unmap_segment(void* p, size_t bytes) {
#if defined(__unix__) || defined(__APPLE__)
  munmap(p, bytes);
#else
  (void)bytes;
  std::free(p);
#endif
}

// A piece of a segment (one system allocation): in use, or free in the best-fit set. Neighbours in address order
// within the segment, so that a freed piece merges with free neighbours and a whole free segment can go back.
struct Block {
  char* ptr = nullptr;
  size_t size = 0;
  Block* prev = nullptr;
  Block* next = nullptr;
  bool free = false;
};

struct BySizeThenAddress {
  bool operator()(const Block* a, const Block* b) const {
    return a->size != b->size ? a->size < b->size : a->ptr < b->ptr;
  }
};

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
    if (nbytes >= kLargeMin) return alloc_large(nbytes, capacity);
    size_t size = 0;
    const int c = class_index(nbytes, &size);
    {
      std::lock_guard<std::mutex> lock(mu_);
      ++s_.num_allocs;
      s_.requested_bytes += nbytes;
      std::vector<void*>& list = free_[c];
      if (!list.empty()) {
        void* p = list.back();
        list.pop_back();
        s_.cached_bytes -= size;
        count_allocated(size);
        ++s_.cache_hits;
        *capacity = size;
        return p;
      }
      count_system_alloc(size);
    }
    void* p = system_alloc(size, nbytes);
    *capacity = size;
    return p;
  }

  void release(void* p, size_t nbytes, size_t size) {
    if (!p) return;
    if (nbytes >= kLargeMin) return release_large(p, nbytes);
    size_t ignored = 0;
    const int c = class_index(size, &ignored);
    {
      std::lock_guard<std::mutex> lock(mu_);
      ++s_.num_frees;
      s_.allocated_bytes -= size;
      s_.requested_bytes -= nbytes;
      // Runs in Storage's destructor, possibly while an out-of-memory exception unwinds: it must not throw, so a
      // block whose free-list entry cannot be allocated goes back to the system instead.
      if (s_.cached_bytes + size <= limit() && push_free(free_[c], p)) {
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
    std::vector<std::pair<void*, size_t>> segments;
    {
      std::lock_guard<std::mutex> lock(mu_);
      size_t freed = 0;
      for (int k = 0; k < kNumClasses; ++k) {
        out.insert(out.end(), free_[k].begin(), free_[k].end());
        freed += free_[k].size() * class_size(k);
        free_[k].clear();
        free_[k].shrink_to_fit();
      }
      s_.reserved_bytes -= freed;
      s_.cached_bytes -= freed;
      s_.system_frees += out.size();
      // Whole free segments go back; a free piece of a segment still in use stays until the segment is whole.
      take_whole_free_segments(&segments);
    }
    for (void* p : out) std::free(p);
    for (auto [p, bytes] : segments) unmap_segment(p, bytes);
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
  // With mu_ held: a block of `size` bytes now in use.
  void count_allocated(size_t size) {
    s_.allocated_bytes += size;
    s_.peak_allocated_bytes = std::max(s_.peak_allocated_bytes, s_.allocated_bytes);
  }

  // With mu_ held: a new block of `size` bytes about to be asked from the system.
  void count_system_alloc(size_t size) {
    count_allocated(size);
    ++s_.cache_misses;
    s_.reserved_bytes += size;
    s_.peak_reserved_bytes = std::max(s_.peak_reserved_bytes, s_.reserved_bytes);
  }

  // Without mu_: get() from the system; when it fails, the cache is given back and get() tried once more.
  template <class Get>
  void* from_system(Get get) {
    void* p = get();
    if (!p) {
      try {
        empty();
      } catch (...) {  // out of memory for empty()'s lists: nothing more to give back
      }
      p = get();
    }
    return p;
  }

  // Without mu_: the small block counted by count_system_alloc (the counts are undone before throwing).
  void* system_alloc(size_t size, size_t nbytes) {
    void* p = from_system([size] { return std::aligned_alloc(64, size); });
    if (!p) {
      std::lock_guard<std::mutex> lock(mu_);
      s_.allocated_bytes -= size;
      s_.requested_bytes -= nbytes;
      s_.reserved_bytes -= size;
      throw Error("alloc", str_cat("out of memory allocating ", nbytes, " bytes"));
    }
    return p;
  }

  // A large request: the smallest free piece that fits, split when what is left could serve another large
  // request. When none fits, the whole free segments (each too small for it) go back to the system first, then a
  // new segment of the request rounded up to 2 MiB is mapped and split the same way.
  void* alloc_large(size_t nbytes, size_t* capacity) {
    const size_t size = round_large(nbytes);
    std::vector<std::pair<void*, size_t>> unmap;
    size_t seg = 0;
    {
      std::lock_guard<std::mutex> lock(mu_);
      ++s_.num_allocs;
      s_.requested_bytes += nbytes;
      Block key;
      key.size = size;
      auto it = large_free_.lower_bound(&key);
      if (it != large_free_.end()) {
        Block* b = *it;
        large_free_.erase(it);
        s_.cached_bytes -= b->size;
        ++s_.cache_hits;
        return take(b, size, capacity);
      }
      take_whole_free_segments(&unmap);
      seg = segment_bytes(size);
      ++s_.cache_misses;
      s_.reserved_bytes += seg;
      s_.peak_reserved_bytes = std::max(s_.peak_reserved_bytes, s_.reserved_bytes);
    }
    for (auto [p, bytes] : unmap) unmap_segment(p, bytes);
    char* p = static_cast<char*>(from_system([seg] { return map_segment(seg); }));
    std::lock_guard<std::mutex> lock(mu_);
    if (!p) {
      s_.reserved_bytes -= seg;
      s_.requested_bytes -= nbytes;
      throw Error("alloc", str_cat("out of memory allocating ", nbytes, " bytes (a segment of ", seg, ")"));
    }
    return take(new Block{p, seg, nullptr, nullptr, true}, size, capacity);
  }

  // With mu_ held: merges b's right neighbour (free) into b; the neighbour leaves the free set and is deleted.
  void absorb_next(Block* b) {
    Block* n = b->next;
    large_free_.erase(n);
    b->size += n->size;
    b->next = n->next;
    if (n->next) n->next->prev = b;
    delete n;
  }

  // With mu_ held: takes every entirely free segment out of the cache and the counts (they are to be unmapped, by
  // the caller, without the lock).
  void take_whole_free_segments(std::vector<std::pair<void*, size_t>>* out) {
    for (auto it = large_free_.begin(); it != large_free_.end();) {
      Block* b = *it;
      if (b->prev || b->next) {
        ++it;
        continue;
      }
      it = large_free_.erase(it);
      out->emplace_back(b->ptr, b->size);
      s_.cached_bytes -= b->size;
      s_.reserved_bytes -= b->size;
      ++s_.system_frees;
      delete b;
    }
  }

  // With mu_ held: hands out the front `size` bytes of the free piece b (taken out of the free set and the cached
  // count), the rest staying a free piece when it could serve another large request.
  void* take(Block* b, size_t size, size_t* capacity) {
    if (b->size - size >= kLargeMin) {
      Block* rest = new Block{b->ptr + size, b->size - size, b, b->next, true};
      if (b->next) b->next->prev = rest;
      b->next = rest;
      b->size = size;
      large_free_.insert(rest);
      s_.cached_bytes += rest->size;
    }
    b->free = false;
    large_live_[b->ptr] = b;
    count_allocated(b->size);
    *capacity = b->size;
    return b->ptr;
  }

  // Frees a large block: merged with free neighbours; a whole free segment goes back to the system when the cache
  // is over its cap (a piece of a segment in use cannot, and stays cached).
  void release_large(void* p, size_t nbytes) {
    void* to_system = nullptr;
    size_t to_system_bytes = 0;
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto found = large_live_.find(p);
      if (found == large_live_.end()) return;  // not ours (cannot happen through Storage)
      Block* b = found->second;
      large_live_.erase(found);
      ++s_.num_frees;
      s_.allocated_bytes -= b->size;
      s_.requested_bytes -= nbytes;
      s_.cached_bytes += b->size;
      b->free = true;
      if (b->next && b->next->free) absorb_next(b);
      if (Block* pv = b->prev; pv && pv->free) {
        large_free_.erase(pv);  // its size changes: out of the set first
        absorb_next(pv);
        b = pv;
      }
      if (!b->prev && !b->next && s_.cached_bytes > limit()) {
        s_.cached_bytes -= b->size;
        s_.reserved_bytes -= b->size;
        ++s_.system_frees;
        to_system = b->ptr;
        to_system_bytes = b->size;
        delete b;
      } else if (!insert_free(b)) {
        // No memory for the free set's node (this runs in Storage's destructor, which must not throw): a whole
        // segment goes back to the system; a piece stays out of the set, unused, until a neighbour merges it.
        if (!b->prev && !b->next) {
          s_.cached_bytes -= b->size;
          s_.reserved_bytes -= b->size;
          ++s_.system_frees;
          to_system = b->ptr;
          to_system_bytes = b->size;
          delete b;
        }
      }
    }
    if (to_system) unmap_segment(to_system, to_system_bytes);
  }

  // With mu_ held: false instead of throwing when the list cannot grow (out of memory).
  static bool push_free(std::vector<void*>& list, void* p) noexcept {
    try {
      list.push_back(p);
      return true;
    } catch (...) {
      return false;
    }
  }

  // With mu_ held: false instead of throwing when the set's node cannot be allocated.
  bool insert_free(Block* b) noexcept {
    try {
      large_free_.insert(b);
      return true;
    } catch (...) {
      return false;
    }
  }

  size_t limit() {  // with mu_ held
    if (!limit_known_) {
      limit_ = env_limit();
      limit_known_ = true;
    }
    return limit_;
  }

  std::mutex mu_;
  std::vector<void*> free_[kNumClasses];                 // small blocks by size class
  std::set<Block*, BySizeThenAddress> large_free_;       // free pieces of segments
  std::unordered_map<void*, Block*> large_live_;         // pieces in use, by address
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
  if (nbytes >= kLargeMin) return round_large(nbytes);
  size_t size = 0;
  class_index(nbytes, &size);
  return size;
}

namespace detail {
void* storage_alloc(size_t nbytes, size_t* capacity) { return allocator().alloc(nbytes, capacity); }
void storage_free(void* p, size_t nbytes, size_t capacity) { allocator().release(p, nbytes, capacity); }
}  // namespace detail

}  // namespace attograd
