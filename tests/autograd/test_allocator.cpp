// The caching Storage allocator: size classes, reuse, peak accounting, the cache cap, empty_cache, thread safety,
// and no growth across identical training steps.

#include <thread>
#include <vector>

#include "autograd/memory.h"
#include "nn/models.h"
#include "testing.h"
#include "train/optim/optimizers.h"

using namespace attograd;
using namespace attograd::testing;

TEST(Allocator, SizeClasses) {
  EXPECT_EQ(allocator_size_class(0), 64u);
  EXPECT_EQ(allocator_size_class(1), 64u);
  EXPECT_EQ(allocator_size_class(64), 64u);
  EXPECT_EQ(allocator_size_class(65), 128u);
  EXPECT_EQ(allocator_size_class(512), 512u);
  EXPECT_EQ(allocator_size_class(513), 640u);   // 512 * 5/4
  EXPECT_EQ(allocator_size_class(1024), 1024u);
  EXPECT_EQ(allocator_size_class(1025), 1280u);
  EXPECT_EQ(allocator_size_class(1536), 1536u);
  EXPECT_EQ(allocator_size_class(1537), 1792u);
  EXPECT_EQ(allocator_size_class(65535), size_t{64} << 10);  // 32 KiB * 8/4, the largest class
  // From 64 KiB: whole 4 KiB pages
  EXPECT_EQ(allocator_size_class(size_t{64} << 10), size_t{64} << 10);
  EXPECT_EQ(allocator_size_class((size_t{64} << 10) + 1), size_t{68} << 10);
  EXPECT_EQ(allocator_size_class(size_t{3} << 20), size_t{3} << 20);
  EXPECT_EQ(allocator_size_class(12345678), size_t{3015} * 4096);
  for (size_t n : {size_t{100}, size_t{777}, size_t{4097}, size_t{1} << 20, (size_t{1} << 20) + 1, size_t{12345678}}) {
    const size_t c = allocator_size_class(n);
    EXPECT_GE(c, n);
    EXPECT_EQ(c % 64, 0u);
    EXPECT_LE(c, n + n / 4 + 64);  // at most 25% slack above 512 bytes
  }
}

// Large blocks: a free segment is split for smaller requests and its pieces merge again when freed.
TEST(Allocator, LargeSegmentsSplitAndCoalesce) {
  empty_cache();
  const AllocatorStats s0 = allocator_stats();
  char* base = nullptr;
  { Tensor a = empty({1 << 19}); base = static_cast<char*>(a.raw_data()); }  // a 2 MiB segment, now free
  const AllocatorStats s1 = allocator_stats();
  EXPECT_EQ(s1.cache_misses, s0.cache_misses + 1);
  EXPECT_EQ(s1.reserved_bytes, s0.reserved_bytes + (size_t{2} << 20));
  {
    Tensor b = empty({1 << 17});  // 512 KiB: the front of the segment
    Tensor c = empty({1 << 18});  // 1 MiB: the next piece
    EXPECT_EQ(b.raw_data(), base);
    EXPECT_EQ(c.raw_data(), base + (512 << 10));
    EXPECT_EQ(allocator_stats().cache_misses, s1.cache_misses);  // no new system block
    EXPECT_EQ(allocator_stats().reserved_bytes, s1.reserved_bytes);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(c.raw_data()) % 4096, 0u);
    {  // 1 MiB: only 512 KiB left in the segment, so a new one
      Tensor d = empty({1 << 18});
      const char* pd = static_cast<const char*>(d.raw_data());
      EXPECT_TRUE(pd < base || pd >= base + (2 << 20));
    }
    EXPECT_EQ(allocator_stats().cache_misses, s1.cache_misses + 1);
    b = Tensor();  // the front piece is free, c still in use
    empty_cache();  // gives back whole free segments only: d's, not the piece of a's
    EXPECT_EQ(allocator_stats().reserved_bytes, s1.reserved_bytes);
  }
  // All pieces free again: merged into the 2 MiB segment, which serves a 2 MiB request at the same address
  Tensor e = empty({1 << 19});
  EXPECT_EQ(e.raw_data(), base);
  EXPECT_EQ(allocator_stats().cache_misses, s1.cache_misses + 1);  // only d's segment was new
  e = Tensor();
  empty_cache();
  EXPECT_EQ(allocator_stats().cached_bytes, 0u);
}

// A large request that no free piece fits first gives the whole free segments back, so tensors whose sizes change
// from step to step (variable sequence lengths) do not leave one cached segment per size behind.
TEST(Allocator, WholeFreeSegmentsGoBackBeforeANewOne) {
  empty_cache();
  const AllocatorStats s0 = allocator_stats();
  { Tensor a = empty({3 << 18}); }  // 3 MiB: a 4 MiB segment, then free
  EXPECT_EQ(allocator_stats().reserved_bytes, s0.reserved_bytes + (size_t{4} << 20));
  {
    Tensor b = empty({5 << 18});  // 5 MiB: does not fit; the free 4 MiB segment goes back, a 6 MiB one comes
    const AllocatorStats s1 = allocator_stats();
    EXPECT_EQ(s1.reserved_bytes, s0.reserved_bytes + (size_t{6} << 20));
    EXPECT_EQ(s1.system_frees, s0.system_frees + 1);
    EXPECT_EQ(s1.reserved_bytes, s1.allocated_bytes + s1.cached_bytes);
  }
  empty_cache();
  EXPECT_EQ(allocator_stats().reserved_bytes, s0.reserved_bytes);
}

TEST(Allocator, FreedBlocksAreReused) {
  empty_cache();
  const AllocatorStats s0 = allocator_stats();
  void* first = nullptr;
  {
    Tensor a = empty({1000, 10});  // 40000 bytes: a small size class
    first = a.raw_data();
  }
  const AllocatorStats s1 = allocator_stats();
  EXPECT_EQ(s1.cache_misses, s0.cache_misses + 1);
  EXPECT_EQ(s1.cached_bytes, s0.cached_bytes + allocator_size_class(40000));
  {
    Tensor b = empty({100, 100});  // same size class: the same block again, no system allocation
    EXPECT_EQ(b.raw_data(), first);
    Tensor c = zeros({99, 101});  // 39996 bytes: also the 40000-byte class (a second block)
    EXPECT_NE(c.raw_data(), first);
  }
  const AllocatorStats s2 = allocator_stats();
  EXPECT_EQ(s2.cache_hits, s1.cache_hits + 1);
  EXPECT_EQ(s2.cache_misses, s1.cache_misses + 1);
  EXPECT_EQ(s2.num_allocs, s0.num_allocs + 3);
  EXPECT_EQ(s2.num_frees, s0.num_frees + 3);
  EXPECT_EQ(s2.allocated_bytes, s0.allocated_bytes);
  {  // large: 400000 bytes (page-rounded to 401408) from a 2 MiB segment; a second one from the same segment
    Tensor a = empty({1000, 100});
    Tensor b = zeros({99, 1001});
    EXPECT_EQ(static_cast<char*>(b.raw_data()), static_cast<char*>(a.raw_data()) + 401408);
  }
  const AllocatorStats s3 = allocator_stats();
  EXPECT_EQ(s3.cache_misses, s2.cache_misses + 1);
  EXPECT_EQ(s3.cache_hits, s2.cache_hits + 1);
  EXPECT_EQ(s3.cached_bytes, s2.cached_bytes + (size_t{2} << 20));  // the whole segment, merged again
}

TEST(Allocator, PeakAccounting) {
  empty_cache();
  reset_peak_allocator_stats();
  const AllocatorStats s0 = allocator_stats();
  EXPECT_EQ(s0.peak_allocated_bytes, s0.allocated_bytes);
  const size_t ca = allocator_size_class(1 << 20), cb = allocator_size_class(2 << 20);
  {
    Tensor a = empty({1 << 18});  // 1 MiB of float32
    Tensor b = empty({1 << 19});  // 2 MiB
    EXPECT_EQ(allocator_stats().allocated_bytes, s0.allocated_bytes + ca + cb);
    EXPECT_EQ(allocator_stats().requested_bytes, s0.requested_bytes + (size_t{3} << 20));
  }
  {
    Tensor c = empty({1 << 17});  // 0.5 MiB: below the peak
  }
  const AllocatorStats s1 = allocator_stats();
  EXPECT_EQ(s1.allocated_bytes, s0.allocated_bytes);
  EXPECT_EQ(s1.peak_allocated_bytes, s0.allocated_bytes + ca + cb);
  EXPECT_EQ(s1.reserved_bytes, s1.allocated_bytes + s1.cached_bytes);
  EXPECT_GE(s1.peak_reserved_bytes, s0.reserved_bytes + ca + cb);
  reset_peak_allocator_stats();
  EXPECT_EQ(allocator_stats().peak_allocated_bytes, s1.allocated_bytes);
}

TEST(Allocator, EmptyCacheAndCapReleaseBlocks) {
  const size_t old_limit = allocator_cache_limit();
  { Tensor a = empty({1 << 16}); }
  EXPECT_GT(allocator_stats().cached_bytes, 0u);
  empty_cache();
  AllocatorStats s = allocator_stats();
  EXPECT_EQ(s.cached_bytes, 0u);
  EXPECT_EQ(s.reserved_bytes, s.allocated_bytes);

  set_allocator_cache_limit(0);  // no caching: every free goes back to the system
  EXPECT_EQ(allocator_cache_limit(), 0u);
  const uint64_t frees = allocator_stats().system_frees;
  { Tensor b = empty({1 << 16}); }
  EXPECT_EQ(allocator_stats().system_frees, frees + 1);
  EXPECT_EQ(allocator_stats().cached_bytes, 0u);

  set_allocator_cache_limit(size_t{2} << 20);  // room for one 2 MiB segment
  {
    Tensor c = empty({1 << 19});  // 2 MiB each: two segments
    Tensor d = empty({1 << 19});
  }
  s = allocator_stats();
  EXPECT_EQ(s.cached_bytes, size_t{2} << 20);  // d's segment kept, c's given back
  EXPECT_EQ(s.system_frees, frees + 2);
  set_allocator_cache_limit(old_limit);
}

TEST(Allocator, ConcurrentAllocationsKeepConsistentCounts) {
  const AllocatorStats s0 = allocator_stats();
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([t] {
      for (int i = 0; i < 500; ++i) {
        Tensor a = empty({(i % 7 + 1) * 100 + t});
        Tensor b = ones({i % 13 + 1, 33});
        EXPECT_EQ(b.at({0, 0}), 1.0);
      }
    });
  for (auto& th : threads) th.join();
  const AllocatorStats s1 = allocator_stats();
  EXPECT_EQ(s1.num_allocs - s0.num_allocs, 4000u);
  EXPECT_EQ(s1.num_frees - s0.num_frees, 4000u);
  EXPECT_EQ(s1.allocated_bytes, s0.allocated_bytes);
  EXPECT_EQ(s1.reserved_bytes, s1.allocated_bytes + s1.cached_bytes);
}

// After a warm-up step, identical training steps are served entirely from the cache: no system allocation and
// no growth of the memory the allocator holds.
TEST(Allocator, NoGrowthAcrossIdenticalTrainingSteps) {
  Generator gen(7), drop(8), data(9);
  nn::CausalLM model({.vocab = 12, .d_model = 32, .n_head = 4, .d_ff = 64, .n_layers = 2, .dropout = 0.1, .max_len = 16},
                     gen);
  model.set_generator(drop);
  model.train();
  optim::Adam adam(model.named_parameters(), {.lr = 1e-3});
  Tensor tokens = randint(0, 12, {4, 16}, data);
  Tensor target = randint(0, 12, {4 * 16}, data);
  auto step = [&] {
    adam.zero_grad(/*set_to_none=*/true);
    Tensor logits = model.forward(tokens);
    Tensor loss = cross_entropy(reshape(logits, {4 * 16, 12}), target);
    loss.backward();
    adam.step();
    return loss.item();
  };
  step();
  step();
  const AllocatorStats warm = allocator_stats();
  double last = 0;
  for (int i = 0; i < 4; ++i) last = step();
  const AllocatorStats after = allocator_stats();
  EXPECT_TRUE(std::isfinite(last));
  EXPECT_EQ(after.cache_misses, warm.cache_misses);
  EXPECT_EQ(after.reserved_bytes, warm.reserved_bytes);
  EXPECT_EQ(after.allocated_bytes, warm.allocated_bytes);
  EXPECT_GT(after.cache_hits, warm.cache_hits);
}

// A request the system cannot map gives the cache back, retries once, then throws an error naming the size; the
// counters are as before.
TEST(Allocator, ImpossibleRequestThrowsAndLeavesCountsAlone) {
  const AllocatorStats s0 = allocator_stats();
  EXPECT_ATTO_ERROR(empty({int64_t{1} << 50}), "out of memory allocating 4503599627370496 bytes");  // 4 PiB
  const AllocatorStats s1 = allocator_stats();
  EXPECT_EQ(s1.allocated_bytes, s0.allocated_bytes);
  EXPECT_EQ(s1.requested_bytes, s0.requested_bytes);
  EXPECT_EQ(s1.reserved_bytes, s1.allocated_bytes + s1.cached_bytes);
  Tensor ok = ones({4});  // still usable
  EXPECT_EQ(ok.at({3}), 1.0);
}
