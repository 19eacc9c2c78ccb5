#pragma once
// Tensor memory (the public face of the caching allocator behind every tensor's Storage, autograd/allocator.h
// describes how it works): its counters, emptying the cache, and the cap on cached bytes -- what
// torch.cuda.memory_allocated / max_memory_allocated / empty_cache are to PyTorch users. The cap defaults to
// 1 GiB or ATTOGRAD_CACHE_LIMIT_MB (read at first use); 0 disables caching.

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

}  // namespace attograd
