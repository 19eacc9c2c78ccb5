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

#include "autograd/memory.h"

namespace attograd {

namespace detail {
/// Allocates a 64-byte aligned block of at least nbytes (Storage uses it) and sets *capacity to the block's size;
/// throws Error when out of memory.
void* storage_alloc(size_t nbytes, size_t* capacity);
/// Returns a block from storage_alloc (the same nbytes and capacity) to the cache or the system.
void storage_free(void* p, size_t nbytes, size_t capacity);
}  // namespace detail

}  // namespace attograd
