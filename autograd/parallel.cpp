// The thread pool behind parallel_for: T - 1 workers that wait briefly (spinning for at most kSpin) and then sleep on
// a condition variable between jobs, a
// static split of every job into at most T chunks (chunk 0 on the calling thread, chunk w on worker w), and
// serial execution for nested calls and for callers that find the pool busy.

#include "autograd/parallel.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <exception>
#include <mutex>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

#include "autograd/error.h"

namespace attograd {

namespace {

thread_local bool t_in_parallel = false;

// How long a worker (or the dispatching thread waiting for the workers) checks for the next event before it goes to
// sleep. A training step posts hundreds of jobs a few microseconds apart: waking a sleeping thread costs tens of
// microseconds each time, so a short spin keeps 2 threads from being slower than 1 on small models, while a pool
// with nothing to do still sleeps (it burns at most kSpin of CPU time after its last job).
constexpr auto kSpin = std::chrono::microseconds(50);

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

// Calls done() until it returns true or kSpin has passed; returns its last answer.
template <class F>
bool spin_until(F done) {
  const auto deadline = std::chrono::steady_clock::now() + kSpin;
  for (int i = 0;; ++i) {
    if (done()) return true;
    cpu_relax();
    if ((i & 63) == 63 && std::chrono::steady_clock::now() >= deadline) return done();
  }
}

int env_threads() {
  const char* s = std::getenv("ATTOGRAD_NUM_THREADS");
  if (!s || !*s) return 1;
  char* end = nullptr;
  const long v = std::strtol(s, &end, 10);
  if (end == s || *end != '\0' || v < 1) return 1;
  return static_cast<int>(std::min<long>(v, kMaxNumThreads));
}

class Pool {
 public:
  ~Pool() { stop_workers(); }

  int threads() {
    std::call_once(init_, [this] { threads_ = env_threads(); });
    return threads_;
  }

  void set_threads(int n) {
    threads();  // resolve the environment default first, so it never overrides an explicit call later
    std::lock_guard<std::mutex> dispatch(dispatch_mu_);
    if (n == threads_) return;
    stop_workers();
    threads_ = n;
  }

  // Runs fn over `chunks` chunks of [begin, end); chunks <= threads().
  void run(int64_t begin, int64_t end, int64_t chunks, detail::ChunkFn fn, void* ctx) {
    std::unique_lock<std::mutex> dispatch(dispatch_mu_, std::try_to_lock);
    if (!dispatch.owns_lock() || chunks > threads_) {  // another thread is using the pool: run serially
      run_serial(begin, end, chunks, fn, ctx);
      return;
    }
    ensure_workers();
    {
      std::lock_guard<std::mutex> lock(mu_);
      fn_ = fn;
      ctx_ = ctx;
      begin_ = begin;
      end_ = end;
      chunks_ = chunks;
      pending_.store(chunks - 1, std::memory_order_relaxed);
      error_ = nullptr;
      generation_.fetch_add(1, std::memory_order_release);
    }
    work_cv_.notify_all();
    std::exception_ptr mine;
    t_in_parallel = true;
    try {
      fn(ctx, begin, chunk_end(begin, end, chunks, 0), 0);
    } catch (...) {
      mine = std::current_exception();
    }
    t_in_parallel = false;
    spin_until([this] { return pending_.load(std::memory_order_acquire) == 0; });
    std::unique_lock<std::mutex> lock(mu_);
    done_cv_.wait(lock, [this] { return pending_.load(std::memory_order_relaxed) == 0; });
    std::exception_ptr err = mine ? mine : error_;
    error_ = nullptr;
    lock.unlock();
    if (err) std::rethrow_exception(err);
  }

 private:
  static int64_t chunk_end(int64_t begin, int64_t end, int64_t chunks, int64_t i) {
    return begin + (end - begin) * (i + 1) / chunks;
  }

  static void run_serial(int64_t begin, int64_t end, int64_t chunks, detail::ChunkFn fn, void* ctx) {
    const bool was = t_in_parallel;
    t_in_parallel = true;
    try {
      for (int64_t i = 0; i < chunks; ++i)
        fn(ctx, begin + (end - begin) * i / chunks, chunk_end(begin, end, chunks, i), i);
    } catch (...) {
      t_in_parallel = was;
      throw;
    }
    t_in_parallel = was;
  }

  void ensure_workers() {
    const size_t want = static_cast<size_t>(threads_ - 1);
    if (workers_.size() == want) return;
    stop_workers();
    uint64_t generation = 0;
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = false;
      stop_flag_.store(false, std::memory_order_relaxed);
      generation = generation_.load(std::memory_order_relaxed);
    }
    // Each worker starts from the generation before the job about to be posted: a worker that starts running
    // only after that job was posted still sees it as new.
    workers_.reserve(want);
    try {
      for (size_t w = 0; w < want; ++w)
        workers_.emplace_back([this, w, generation] { worker_loop(static_cast<int64_t>(w) + 1, generation); });
    } catch (const std::system_error& e) {
      // The system refuses more threads (a process or cgroup limit): join the ones started, run with one thread
      // from now on, and say so in the project's Error.
      const size_t started = workers_.size();
      stop_workers();
      threads_ = 1;
      throw Error("parallel_for", str_cat("could not start worker thread ", started + 1, " of ", want, " for ", want + 1,
                                          " threads (", e.what(), "); the pool is back to 1 thread: call "
                                          "set_num_threads with fewer"));
    }
  }

  void stop_workers() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
      stop_flag_.store(true, std::memory_order_relaxed);
    }
    work_cv_.notify_all();
    for (std::thread& t : workers_) t.join();
    workers_.clear();
  }

  void worker_loop(int64_t index, uint64_t seen) {
    t_in_parallel = true;
    for (;;) {
      detail::ChunkFn fn;
      void* ctx;
      int64_t begin, end, chunks;
      // A new job usually follows within microseconds: check for it briefly, then sleep.
      spin_until([&] { return stop_flag_.load(std::memory_order_relaxed) || generation_.load(std::memory_order_acquire) != seen; });
      {
        std::unique_lock<std::mutex> lock(mu_);
        work_cv_.wait(lock, [&] { return stop_ || generation_.load(std::memory_order_relaxed) != seen; });
        if (stop_) return;
        seen = generation_.load(std::memory_order_relaxed);
        if (index >= chunks_) continue;  // this job has fewer chunks than workers
        fn = fn_, ctx = ctx_, begin = begin_, end = end_, chunks = chunks_;
      }
      std::exception_ptr err;
      try {
        fn(ctx, begin + (end - begin) * index / chunks, chunk_end(begin, end, chunks, index), index);
      } catch (...) {
        err = std::current_exception();
      }
      bool last;
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (err && !error_) error_ = err;
        last = pending_.fetch_sub(1, std::memory_order_acq_rel) == 1;
      }
      if (last) done_cv_.notify_one();
    }
  }

  std::once_flag init_;
  int threads_ = 1;
  std::mutex dispatch_mu_;  // one job at a time; held by the dispatching thread for the whole job
  std::mutex mu_;           // guards the job description below
  std::condition_variable work_cv_, done_cv_;
  std::vector<std::thread> workers_;
  bool stop_ = false;
  std::atomic<bool> stop_flag_{false};       // stop_, readable while spinning
  std::atomic<uint64_t> generation_{0};      // bumped (under mu_) when a job is posted
  detail::ChunkFn fn_ = nullptr;
  void* ctx_ = nullptr;
  int64_t begin_ = 0, end_ = 0, chunks_ = 0;
  std::atomic<int64_t> pending_{0};          // chunks of the current job not finished by the workers
  std::exception_ptr error_;
};

Pool& pool() {
  static Pool* p = new Pool();  // never destroyed: workers may outlive static destruction order otherwise
  return *p;
}

}  // namespace

void set_num_threads(int n) {
  ATTO_CHECK(n >= 1 && n <= kMaxNumThreads, "set_num_threads", "the number of threads must be in [1, ",
             kMaxNumThreads, "], got ", n);
  ATTO_CHECK(!t_in_parallel, "set_num_threads", "cannot change the number of threads inside a parallel region");
  pool().set_threads(n);
}

int get_num_threads() { return pool().threads(); }

bool in_parallel_region() { return t_in_parallel; }

namespace detail {

int64_t parallel_chunks(int64_t n, int64_t grain) {
  if (n <= 0) return 0;
  if (t_in_parallel) return 1;
  const int64_t t = pool().threads();
  if (t <= 1) return 1;
  const int64_t g = std::max<int64_t>(grain, 1);
  return std::max<int64_t>(1, std::min<int64_t>(t, n / g));
}

void parallel_run(int64_t begin, int64_t end, int64_t chunks, ChunkFn fn, void* ctx) {
  pool().run(begin, end, chunks, fn, ctx);
}

}  // namespace detail

}  // namespace attograd
