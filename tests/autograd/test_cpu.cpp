// The kernel sets (autograd/cpu.h): selection, errors, and agreement between the sets this CPU can run.

#include <cstdlib>
#include <functional>
#include <string>

#include "autograd/cpu.h"
#include "autograd/cpu/kernels.h"
#include "autograd/parallel.h"
#include "testing.h"

namespace attograd {
namespace {

using testing::all_close;
using testing::bitwise_equal;

// Runs the rest of a test under one kernel set and restores the previous one.
class KernelSetGuard {
 public:
  explicit KernelSetGuard(std::string_view name) : saved_(cpu_kernels()) { set_cpu_kernels(name); }
  ~KernelSetGuard() { set_cpu_kernels(saved_); }
  KernelSetGuard(const KernelSetGuard&) = delete;
  KernelSetGuard& operator=(const KernelSetGuard&) = delete;

 private:
  std::string saved_;
};

// Restores a thread count on exit.
class ThreadsGuard {
 public:
  explicit ThreadsGuard(int n) : saved_(get_num_threads()) { set_num_threads(n); }
  ~ThreadsGuard() { set_num_threads(saved_); }
  ThreadsGuard(const ThreadsGuard&) = delete;
  ThreadsGuard& operator=(const ThreadsGuard&) = delete;

 private:
  int saved_;
};

// Every element within rel * max |expected|: the sets sum in different orders, and an element that is a small
// difference of large terms (a gradient) carries the rounding of the terms, not of itself.
::testing::AssertionResult close_at_scale(const Tensor& actual, const Tensor& expected, double rel) {
  double scale = 0;
  for (double v : expected.to_vector<double>()) scale = std::max(scale, std::fabs(v));
  return all_close(actual, expected, rel * scale);
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(CpuKernels, ActiveSetIsOneTheCpuSupports) {
  const auto sets = supported_cpu_kernels();
  ASSERT_FALSE(sets.empty());
  EXPECT_EQ(sets.back(), "generic");
  const std::string_view active = cpu_kernels();
  EXPECT_NE(std::find(sets.begin(), sets.end(), active), sets.end()) << active;
  const char* env = std::getenv("ATTOGRAD_CPU");
  EXPECT_EQ(active, env && *env ? std::string_view(env) : sets.front());
}

TEST(CpuKernels, SelectionPicksTheBestOrTheNamedSet) {
  const std::vector<std::string_view> avx2_cpu = {"avx2", "generic"};
  EXPECT_EQ(detail::select_cpu_kernels(nullptr, avx2_cpu), "avx2");
  EXPECT_EQ(detail::select_cpu_kernels("", avx2_cpu), "avx2");
  EXPECT_EQ(detail::select_cpu_kernels("generic", avx2_cpu), "generic");
  EXPECT_EQ(detail::select_cpu_kernels("avx2", avx2_cpu), "avx2");
}

TEST(CpuKernels, UnknownOrUnsupportedSetsAreErrors) {
  const std::vector<std::string_view> avx2_cpu = {"avx2", "generic"};
  std::string msg = error_of([&] { detail::select_cpu_kernels("avx512", avx2_cpu); });
  EXPECT_NE(msg.find("ATTOGRAD_CPU=avx512"), std::string::npos) << msg;
  EXPECT_NE(msg.find("cannot run"), std::string::npos) << msg;
  EXPECT_NE(msg.find("avx2, generic"), std::string::npos) << msg;
  msg = error_of([&] { detail::select_cpu_kernels("sse9", avx2_cpu); });
  EXPECT_NE(msg.find("ATTOGRAD_CPU=sse9 is not a kernel set (expected generic, avx2 or avx512)"), std::string::npos)
      << msg;
  EXPECT_THROW(detail::select_cpu_kernels("AVX2", avx2_cpu), Error);  // names are lower case
  EXPECT_THROW(set_cpu_kernels("native"), Error);
}

TEST(CpuKernels, TheEnvironmentVariableIsCheckedAtFirstUse) {
  const std::string saved(cpu_kernels());
  const char* old = std::getenv("ATTOGRAD_CPU");
  const std::string old_value = old ? old : "";
  ::setenv("ATTOGRAD_CPU", "sse9", 1);
  cpu::g_active_isa.store(-1);  // as before the first kernel call
  const std::string msg = error_of([] { cpu_kernels(); });
  EXPECT_NE(msg.find("cpu_kernels: ATTOGRAD_CPU=sse9 is not a kernel set"), std::string::npos) << msg;
  EXPECT_THROW(matmul(ones({2, 2}), ones({2, 2})), Error);  // an op's first kernel call reports it too
  if (old)
    ::setenv("ATTOGRAD_CPU", old_value.c_str(), 1);
  else
    ::unsetenv("ATTOGRAD_CPU");
  set_cpu_kernels(saved);
  EXPECT_EQ(cpu_kernels(), saved);
}

// ---------------------------------------------------------------------------------------------
// The sets agree: every op below, run under each set this CPU supports, against the first (best) set.

struct Outputs {
  std::vector<Tensor> values;  // compared within float tolerance
  std::vector<Tensor> exact;   // compared bitwise (dropout masks)
};

Tensor leaf(const Shape& shape, uint64_t seed, Dtype dtype = kFloat32) {
  Generator gen(seed);
  Tensor t = randn(shape, gen, {.dtype = dtype});
  t.requires_grad_(true);
  return t;
}

// The ops under test, forward and backward, on fixed inputs.
Outputs run_ops() {
  Outputs o;
  // GEMM: every transposition, odd sizes (edges of the register blocks), a bias, and a long k (several panels).
  for (auto [m, k, n] : {std::tuple{37, 300, 45}, std::tuple{5, 7, 3}, std::tuple{64, 64, 16}}) {
    Tensor a = leaf({m, k}, 1), b = leaf({k, n}, 2), bias = leaf({n}, 3), w = leaf({n, k}, 4);
    Tensor y = matmul(a, b);
    Tensor z = linear(a, w, bias);
    sum(mul(y, y)).backward();
    sum(mul(z, z)).backward();
    o.values.insert(o.values.end(), {y, z, a.grad(), b.grad(), w.grad(), bias.grad()});
  }
  {  // layer_norm, with and without affine parameters
    Tensor x = leaf({7, 33}, 5), w = leaf({33}, 6), b = leaf({33}, 7), g = leaf({7, 33}, 8);
    Tensor y = layer_norm(x, {33}, w, b, 1e-5);
    sum(mul(y, g.detach())).backward();
    Tensor x2 = leaf({4, 17}, 9), g2 = leaf({4, 17}, 20);
    Tensor y2 = layer_norm(x2, {17});
    sum(mul(y2, g2.detach())).backward();  // (not y2 * y2: sum y^2 is constant, its gradient pure rounding)
    o.values.insert(o.values.end(), {y, x.grad(), w.grad(), b.grad(), y2, x2.grad()});
  }
  {  // softmax and log_softmax along the last dim and another one; cross-entropy
    Tensor x = leaf({3, 5, 19}, 10), g = leaf({3, 5, 19}, 11);
    for (int64_t dim : {-1, 1}) {
      Tensor s = softmax(x, dim), l = log_softmax(x, dim);
      sum(mul(add(s, l), g.detach())).backward();
      o.values.insert(o.values.end(), {s, l, x.grad()});
      x.zero_grad();
    }
    Tensor logits = leaf({6, 11}, 12);
    Generator gen(13);
    Tensor target = randint(0, 11, {6}, gen);
    Tensor loss = cross_entropy(logits, target, {.label_smoothing = 0.1});
    loss.backward();
    o.values.insert(o.values.end(), {loss, logits.grad()});
  }
  {  // attention: a bool mask, causal, dropout; short (saved probabilities) and long (recomputed) sequences
    for (int64_t L : {9, 80}) {
      Tensor q = leaf({2, 3, L, 16}, 14), k = leaf({2, 3, L, 16}, 15), v = leaf({2, 3, L, 8}, 16);
      Generator gen(17);
      AttentionOptions opts{.is_causal = true, .dropout_p = 0.2, .generator = &gen, .need_weights = true};
      AttentionResult r = scaled_dot_product_attention(q, k, v, opts);
      sum(mul(r.output, r.output)).backward();
      o.values.insert(o.values.end(), {r.output, q.grad(), k.grad(), v.grad()});
      o.values.push_back(r.weights);
      o.exact.push_back(eq(r.weights, 0.0));  // the dropped (and blocked) entries
    }
  }
  {  // dropout masks are the same bits in every set
    for (Dtype dt : {kFloat32, kFloat64}) {
      Generator gen(18);
      Tensor x = leaf({1000 + 37}, 19, dt);
      Tensor y = dropout(x, 0.3, true, gen);
      Tensor r = relu_dropout(x, 0.4, true, gen);
      Tensor d = dropout_add(x, x, 0.5, true, gen);
      sum(add(add(y, r), d)).backward();
      o.exact.insert(o.exact.end(), {y, r, d, x.grad(), dropout_mask({5, 33}, 0.25, gen, kBool)});
    }
  }
  return o;
}

TEST(CpuKernels, EverySupportedSetAgreesWithTheBest) {
  const auto sets = supported_cpu_kernels();
  Outputs ref;
  {
    KernelSetGuard guard(sets.front());
    ref = run_ops();
  }
  for (std::string_view set : sets) {
    KernelSetGuard guard(set);
    const Outputs o = run_ops();
    ASSERT_EQ(o.values.size(), ref.values.size());
    for (size_t i = 0; i < o.values.size(); ++i)
      EXPECT_TRUE(close_at_scale(o.values[i], ref.values[i], 1e-5))
          << set << " vs " << sets.front() << ", output " << i;
    ASSERT_EQ(o.exact.size(), ref.exact.size());
    for (size_t i = 0; i < o.exact.size(); ++i)
      EXPECT_TRUE(bitwise_equal(o.exact[i], ref.exact[i])) << set << " vs " << sets.front() << ", exact output " << i;
  }
}

TEST(CpuKernels, EverySetIsBitReproducibleAndIndependentOfTheThreadCount) {
  for (std::string_view set : supported_cpu_kernels()) {
    KernelSetGuard guard(set);
    Outputs one, again, two;
    {
      ThreadsGuard threads(1);
      one = run_ops();
      again = run_ops();
    }
    {
      ThreadsGuard threads(2);
      two = run_ops();
    }
    for (size_t i = 0; i < one.values.size(); ++i) {
      EXPECT_TRUE(bitwise_equal(again.values[i], one.values[i])) << set << ", output " << i;
      EXPECT_TRUE(bitwise_equal(two.values[i], one.values[i])) << set << ", 2 threads, output " << i;
    }
  }
}

}  // namespace
}  // namespace attograd
