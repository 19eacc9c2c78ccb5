// The thread pool: coverage of the range, fixed chunking, nesting, exceptions, an idle pool that does not spin,
// and bit-reproducible training for a given thread count.

#include <atomic>
#include <chrono>
#include <ctime>
#include <thread>
#include <vector>

#include "autograd/gemm.h"
#include "autograd/parallel.h"
#include "nn/models.h"
#include "testing.h"
#include "train/optim/optimizers.h"

using namespace attograd;
using namespace attograd::testing;

namespace {

// Restores the thread count a test changed.
struct ThreadsGuard {
  int saved = get_num_threads();
  ~ThreadsGuard() { set_num_threads(saved); }
};

double process_cpu_seconds() {
  timespec t{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
}

}  // namespace

TEST(Parallel, DefaultIsOneThreadAndSetChecksItsArgument) {
  ThreadsGuard guard;
  if (!std::getenv("ATTOGRAD_NUM_THREADS")) {
    EXPECT_EQ(get_num_threads(), 1);
  }
  set_num_threads(3);
  EXPECT_EQ(get_num_threads(), 3);
  EXPECT_ATTO_ERROR(set_num_threads(0), "in [1, 1024], got 0");
  EXPECT_EQ(get_num_threads(), 3);
  // 4096 threads: refused when set (a later matmul would have met the system's thread limit as std::system_error).
  EXPECT_ATTO_ERROR(set_num_threads(4096), "in [1, 1024], got 4096");
  EXPECT_EQ(get_num_threads(), 3);
  const Tensor a = ones({64, 64});
  EXPECT_EQ(matmul(a, a).to_vector<float>()[0], 64.0f);
}

TEST(Parallel, EveryIndexRunsExactlyOnce) {
  ThreadsGuard guard;
  for (int threads : {1, 2, 3, 5}) {
    set_num_threads(threads);
    for (int64_t n : {0, 1, 2, 7, 100, 1001}) {
      for (int64_t grain : {1, 3, 64, 5000}) {
        std::vector<std::atomic<int>> hits(static_cast<size_t>(n));
        std::atomic<int> calls{0};
        parallel_for(10, 10 + n, grain, [&](int64_t b, int64_t e) {
          ++calls;
          EXPECT_LE(10, b);
          EXPECT_LT(b, e);
          EXPECT_LE(e, 10 + n);
          for (int64_t i = b; i < e; ++i) ++hits[static_cast<size_t>(i - 10)];
        });
        for (int64_t i = 0; i < n; ++i) EXPECT_EQ(hits[static_cast<size_t>(i)].load(), 1) << "index " << i;
        EXPECT_EQ(calls.load(), n == 0 ? 0 : parallel_num_chunks(n, grain));
        EXPECT_LE(calls.load(), threads);
      }
    }
  }
}

TEST(Parallel, ChunksAreAFixedSplitOfTheRange) {
  ThreadsGuard guard;
  set_num_threads(4);
  EXPECT_EQ(parallel_num_chunks(100, 1), 4);
  EXPECT_EQ(parallel_num_chunks(100, 30), 3);  // at least `grain` elements per chunk
  EXPECT_EQ(parallel_num_chunks(100, 200), 1);
  EXPECT_EQ(parallel_num_chunks(0, 1), 0);
  for (int run = 0; run < 3; ++run) {
    std::vector<std::pair<int64_t, int64_t>> chunks(4, {-1, -1});
    parallel_for_chunks(0, 10, 1, [&](int64_t b, int64_t e, int64_t c) { chunks[static_cast<size_t>(c)] = {b, e}; });
    EXPECT_EQ(chunks, (std::vector<std::pair<int64_t, int64_t>>{{0, 2}, {2, 5}, {5, 7}, {7, 10}}));
  }
}

TEST(Parallel, NestedCallsRunSerially) {
  ThreadsGuard guard;
  set_num_threads(2);
  EXPECT_FALSE(in_parallel_region());
  std::atomic<int> inner_calls{0}, outer_calls{0};
  parallel_for(0, 2, 1, [&](int64_t, int64_t) {
    ++outer_calls;
    EXPECT_TRUE(in_parallel_region());
    EXPECT_EQ(parallel_num_chunks(100, 1), 1);
    parallel_for(0, 100, 1, [&](int64_t b, int64_t e) {
      ++inner_calls;
      EXPECT_EQ(b, 0);
      EXPECT_EQ(e, 100);
    });
  });
  EXPECT_EQ(outer_calls.load(), 2);
  EXPECT_EQ(inner_calls.load(), 2);
  EXPECT_FALSE(in_parallel_region());
  EXPECT_ATTO_ERROR(parallel_for(0, 2, 1, [](int64_t, int64_t) { set_num_threads(1); }), "inside a parallel region");
}

TEST(Parallel, ExceptionsReachTheCaller) {
  ThreadsGuard guard;
  set_num_threads(3);
  for (int64_t bad : {0, 50, 99}) {
    std::atomic<int> done{0};
    EXPECT_ATTO_ERROR(parallel_for(0, 100, 1,
                                   [&](int64_t b, int64_t e) {
                                     ++done;
                                     if (bad >= b && bad < e) throw Error("kernel", "boom at " + std::to_string(bad));
                                   }),
                      "boom at " + std::to_string(bad));
    EXPECT_EQ(done.load(), 3);  // every chunk ran to completion before the rethrow
  }
  // The pool still works afterwards.
  std::atomic<int64_t> sum{0};
  parallel_for(0, 100, 1, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) sum += i;
  });
  EXPECT_EQ(sum.load(), 4950);
}

// Idle workers sleep on a condition variable: a pool of 4 threads burns (almost) no CPU time while the process
// waits.
TEST(Parallel, IdlePoolDoesNotSpin) {
  ThreadsGuard guard;
  set_num_threads(4);
  std::atomic<int64_t> sink{0};
  parallel_for(0, 4, 1, [&](int64_t b, int64_t) { sink += b; });  // the workers exist now
  const double cpu0 = process_cpu_seconds();
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  const double used = process_cpu_seconds() - cpu0;
  EXPECT_LT(used, 0.05) << "CPU seconds used by an idle pool in 0.3 s of wall time";
}

// A matrix product split between threads equals the serial product bit for bit (the blocking never depends on
// the thread count).
TEST(Parallel, GemmIsTheSameForEveryThreadCount) {
  ThreadsGuard guard;
  Generator gen(3);
  Tensor a = randn({300, 200}, gen), b = randn({200, 170}, gen);
  set_num_threads(1);
  Tensor c1 = matmul(a, b);
  Tensor l1 = linear(a, transpose(b, 0, 1), randn({170}, gen));
  for (int threads : {2, 3}) {
    set_num_threads(threads);
    EXPECT_TRUE(all_close(matmul(a, b), c1, 0));
  }
  // A weight gradient with more columns than rows (split by columns) and one with more rows (split by rows).
  for (int64_t out : {40, 400}) {
    Tensor x = randn({300, 170}, gen), w = randn({out, 170}, gen), g = randn({300, out}, gen);
    std::vector<Tensor> grads;
    for (int threads : {1, 2, 3}) {
      set_num_threads(threads);
      Tensor wl = w.clone().requires_grad_();
      linear(x, wl, Tensor()).backward(g);
      grads.push_back(wl.grad());
    }
    EXPECT_TRUE(all_close(grads[1], grads[0], 0)) << out;
    EXPECT_TRUE(all_close(grads[2], grads[0], 0)) << out;
  }
  Tensor ad = a.to(kFloat64), bd = b.to(kFloat64);
  set_num_threads(1);
  Tensor d1 = matmul(ad, bd);
  set_num_threads(2);
  Tensor d2 = matmul(ad, bd);
  EXPECT_TRUE(all_close(d2, d1, 1e-12));
  EXPECT_EQ(l1.shape(), (Shape{300, 170}));
}

// Training with a given number of threads is bit-reproducible run to run.
TEST(Parallel, TrainingIsReproducibleForAGivenThreadCount) {
  ThreadsGuard guard;
  auto run = [](int threads) {
    set_num_threads(threads);
    Generator gen(11), drop(12), data(13);
    nn::CausalLM model(
        {.vocab = 20, .d_model = 64, .n_head = 4, .d_ff = 128, .n_layers = 2, .dropout = 0.1, .max_len = 32}, gen);
    model.set_generator(drop);
    model.train();
    optim::Adam adam(model.named_parameters(), {.lr = 1e-3});
    std::vector<double> losses;
    for (int s = 0; s < 3; ++s) {
      Tensor tokens = randint(0, 20, {8, 32}, data);
      Tensor target = randint(0, 20, {8 * 32}, data);
      adam.zero_grad(true);
      Tensor loss = cross_entropy(reshape(model.forward(tokens), {8 * 32, 20}), target);
      loss.backward();
      adam.step();
      losses.push_back(loss.item());
    }
    std::vector<float> params;
    for (auto& [name, p] : model.named_parameters())
      for (float v : p.to_vector<float>()) params.push_back(v);
    return std::make_pair(losses, params);
  };
  for (int threads : {1, 2, 3}) {
    SCOPED_TRACE("threads = " + std::to_string(threads));
    auto first = run(threads);
    auto second = run(threads);
    EXPECT_EQ(first.first, second.first);
    EXPECT_EQ(first.second, second.second);
  }
}

// layer_norm and the dropout ops split rows / mask blocks between threads: every thread count gives the same bits
// (outputs, gradients, the generator's state afterwards).
TEST(Parallel, LayerNormAndDropoutAreTheSameForEveryThreadCount) {
  ThreadsGuard guard;
  Generator gen(21);
  const Tensor x0 = randn({1285, 64}, gen), w0 = randn({64}, gen), b0 = randn({64}, gen), g0 = randn({1285, 64}, gen);
  const Tensor h0 = randn({20 * 4096 + 37}, gen), r0 = randn({20 * 4096 + 37}, gen);
  auto run = [&](int threads) {
    set_num_threads(threads);
    std::vector<Tensor> out;
    Tensor x = x0.clone().requires_grad_(), w = w0.clone().requires_grad_(), b = b0.clone().requires_grad_();
    Tensor y = layer_norm(x, {64}, w, b, 1e-6);
    y.backward(g0);
    for (const Tensor& t : {y.detach(), x.grad(), w.grad(), b.grad()}) out.push_back(t);
    Generator drop(5);
    Tensor h = h0.clone().requires_grad_(), r = r0.clone().requires_grad_();
    Tensor d = dropout(h, 0.1, true, drop);
    Tensor a = dropout_add(r, h, 0.2, true, drop);
    Tensor e = relu_dropout(h, 0.3, true, drop);
    Tensor m = dropout_mask({3, 4096 * 7}, 0.4, drop, kBool);
    (sum(d) + sum(a * r0) + sum(e * h0)).backward();
    for (const Tensor& t : {d.detach(), a.detach(), e.detach(), m, h.grad(), r.grad()}) out.push_back(t);
    out.push_back(from_vector<double>({static_cast<double>(drop.get_state().state)}, {1}));
    return out;
  };
  const auto one = run(1);
  for (int threads : {2, 3}) {
    const auto many = run(threads);
    for (size_t i = 0; i < one.size(); ++i) EXPECT_TRUE(bitwise_equal(many[i], one[i])) << threads << " threads, tensor " << i;
  }
  // The generator ends as many draws further as the elements masked.
  Generator seq(5);
  for (int64_t i = 0; i < 3 * (20 * 4096 + 37) + 3 * 4096 * 7; ++i) seq.next_u32();
  EXPECT_EQ(static_cast<double>(seq.get_state().state), one.back().to_vector<double>()[0]);
}
