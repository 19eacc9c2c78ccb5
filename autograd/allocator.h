#pragma once
// The caching allocator behind every tensor's Storage. Freed blocks are kept and serve later requests, so a training
// loop whose steps allocate the same tensors every time stops calling malloc (and stops page-faulting fresh memory)
// after its first step. Thread-safe (one mutex).
// - Small requests (under 64 KiB) use size classes: multiples of 64 bytes up to 512 bytes, then four steps per power
//   of two (2^k * 5/4, 6/4, 7/4, 8/4: at most 25% slack), each class with its own free list.
// - Large requests (64 KiB and up) are rounded up to whole 4 KiB pages and served like PyTorch's CUDA caching
//   allocator: the smallest free piece that fits is taken and split when the rest could serve another large request;
//   a freed piece merges with free neighbours of its segment. Segments are mapped from the kernel in multiples of
//   2 MiB (several tensors share one) and unmapped when given back. When no free piece fits, the whole free segments
//   (each too small for the request) are given back before a new one is mapped. So the memory the activations of the
//   forward pass leave behind serves the gradients of the backward pass whatever their sizes, tensors whose sizes
//   change from step to step (variable sequence lengths) do not pile up one cached segment per size, and what the
//   allocator holds stays close to the peak of live tensors.
// The bytes kept free are capped (default 1 GiB, or ATTOGRAD_CACHE_LIMIT_MB read at first use; 0 disables caching):
// a freed small block or whole free segment that would exceed the cap goes back to the system (a free piece of a
// segment still in use stays until the segment is whole). When the system allocator fails, the cache is emptied and
// the request retried before throwing.

#include <cstddef>
#include <cstdint>

namespace attograd {

/// Counters of the Storage allocator (bytes are as reserved: size-class or page rounded, unless noted).
struct AllocatorStats {
  size_t allocated_bytes = 0;       ///< bytes in live storages
  size_t peak_allocated_bytes = 0;  ///< maximum of allocated_bytes since start or reset_peak_allocator_stats()
  size_t requested_bytes = 0;       ///< bytes requested by live storages (unrounded)
  size_t cached_bytes = 0;          ///< bytes held in the free lists, ready for reuse
  size_t reserved_bytes = 0;        ///< allocated_bytes + cached_bytes: what the allocator holds from the system
  size_t peak_reserved_bytes = 0;   ///< maximum of reserved_bytes since start or reset_peak_allocator_stats()
  uint64_t num_allocs = 0;          ///< storages allocated
  uint64_t num_frees = 0;           ///< storages freed
  uint64_t cache_hits = 0;          ///< allocations served from the free lists
  uint64_t cache_misses = 0;        ///< allocations that called the system allocator
  uint64_t system_frees = 0;        ///< blocks given back to the system (cap exceeded or empty_cache)
};

/// The allocator's counters now.
AllocatorStats allocator_stats();
/// Sets both peaks to the current values (and leaves every other counter alone).
void reset_peak_allocator_stats();
/// Gives every cached small block and whole free segment back to the system.
void empty_cache();
/// Sets the cap on cached bytes (0 disables caching); blocks above the new cap are released at once.
void set_allocator_cache_limit(size_t bytes);
/// The cap on cached bytes.
size_t allocator_cache_limit();
/// The bytes reserved for a request of `nbytes`: its size class under 64 KiB, whole 4 KiB pages from 64 KiB (a large
/// request served by a free piece too small to split may get up to 64 KiB more).
size_t allocator_size_class(size_t nbytes);

namespace detail {
/// Allocates a 64-byte aligned block of at least nbytes (Storage uses it) and sets *capacity to the block's size;
/// throws Error when out of memory.
void* storage_alloc(size_t nbytes, size_t* capacity);
/// Returns a block from storage_alloc (the same nbytes and capacity) to the cache or the system.
void storage_free(void* p, size_t nbytes, size_t capacity);
}  // namespace detail

}  // namespace attograd
