#pragma once
// A small thread pool for the engine's kernels (GEMMs, attention, normalisation, elementwise ops, the optimizer).
//
// - The pool has get_num_threads() - 1 worker threads; the calling thread always takes a share of the work.
//   Default: 1 thread (no workers), unless the environment variable ATTOGRAD_NUM_THREADS (read once, on first
//   use) or set_num_threads() says otherwise.
// - Between jobs a worker checks for the next one for at most 50 microseconds (jobs of a training step come a few
//   microseconds apart, and waking a sleeping thread costs more), then sleeps on a condition variable: an idle pool
//   costs no CPU time.
// - parallel_for splits [begin, end) into at most get_num_threads() contiguous chunks of at least `grain`
//   elements, a fixed function of (end - begin, grain, thread count): every run with the same thread count gives
//   the same chunks, so kernels that combine per-chunk partial results in chunk order are bit-reproducible.
// - A parallel_for called from inside a chunk (nested) runs serially on the calling thread.
// - An exception thrown by a chunk is rethrown by parallel_for after all chunks have finished.

#include <cstdint>
#include <type_traits>

namespace attograd {

/// The most threads set_num_threads (and ATTOGRAD_NUM_THREADS, which is capped to it) accepts.
inline constexpr int kMaxNumThreads = 1024;
/// Sets the number of threads kernels may use, in [1, kMaxNumThreads] (1 = everything on the calling thread; an
/// Error otherwise). Must not be called from inside a parallel_for chunk. Threads are created lazily, at the first
/// parallel_for that needs them; should the system refuse one, that parallel_for throws an Error and the pool
/// goes back to 1 thread.
void set_num_threads(int n);
/// The number of threads kernels may use (the calling thread included).
int get_num_threads();
/// True on a thread that is running a parallel_for chunk (where nested parallel_for runs serially).
bool in_parallel_region();

namespace detail {
/// Type-erased chunk function: fn(ctx, chunk_begin, chunk_end, chunk_index).
using ChunkFn = void (*)(void* ctx, int64_t begin, int64_t end, int64_t chunk);
/// Number of chunks parallel_for uses for n elements with this grain and the current thread count.
int64_t parallel_chunks(int64_t n, int64_t grain);
/// Runs fn over `chunks` even contiguous chunks of [begin, end) on the pool (chunk 0 on the calling thread).
void parallel_run(int64_t begin, int64_t end, int64_t chunks, ChunkFn fn, void* ctx);
}  // namespace detail

/// Calls f(chunk_begin, chunk_end) over a split of [begin, end) into at most get_num_threads() contiguous chunks
/// of at least `grain` elements each (one chunk, on the calling thread, when the range is small, the pool has one
/// thread, or the call is nested). Chunks run concurrently: f must only write what its own chunk owns.
template <class F>
void parallel_for(int64_t begin, int64_t end, int64_t grain, F&& f) {
  if (end <= begin) return;
  const int64_t chunks = detail::parallel_chunks(end - begin, grain);
  if (chunks <= 1) {
    f(begin, end);
    return;
  }
  using Fn = std::remove_reference_t<F>;
  detail::parallel_run(
      begin, end, chunks, [](void* ctx, int64_t b, int64_t e, int64_t) { (*static_cast<Fn*>(ctx))(b, e); },
      const_cast<void*>(static_cast<const void*>(&f)));
}

/// Like parallel_for, but f(chunk_begin, chunk_end, chunk_index) also receives its chunk's index in
/// [0, parallel_chunks(end - begin, grain)), for kernels that keep one partial result per chunk and combine them
/// in chunk order afterwards (deterministic for a given thread count).
template <class F>
void parallel_for_chunks(int64_t begin, int64_t end, int64_t grain, F&& f) {
  if (end <= begin) return;
  const int64_t chunks = detail::parallel_chunks(end - begin, grain);
  if (chunks <= 1) {
    f(begin, end, int64_t{0});
    return;
  }
  using Fn = std::remove_reference_t<F>;
  detail::parallel_run(
      begin, end, chunks, [](void* ctx, int64_t b, int64_t e, int64_t c) { (*static_cast<Fn*>(ctx))(b, e, c); },
      const_cast<void*>(static_cast<const void*>(&f)));
}

/// The number of chunks parallel_for(begin, end, grain, ...) and parallel_for_chunks use for n = end - begin.
inline int64_t parallel_num_chunks(int64_t n, int64_t grain) { return n <= 0 ? 0 : detail::parallel_chunks(n, grain); }

}  // namespace attograd
