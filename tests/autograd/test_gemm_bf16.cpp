// The bfloat16 product (autograd/gemm.h's gemm_bf16, autocast's matmuls): the rounding of its operands, every
// layout and edge size against a double reference of the rounded operands, on both paths (the AVX512-BF16 kernel
// where the CPU has it, and the portable one: rounded operands through the float32 kernel), bitwise equality
// between thread counts and the bias epilogue.

#include <array>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "autograd/cpu.h"
#include "autograd/gemm.h"
#include "autograd/parallel.h"
#include "gemm_cases.h"
#include "testing.h"

using namespace attograd;
using namespace attograd::detail;
using attograd::testing::Case;
using attograd::testing::check;
using attograd::testing::make_case;

namespace {

uint32_t bits(float x) {
  uint32_t u;
  std::memcpy(&u, &x, sizeof u);
  return u;
}

float from_bits(uint32_t u) {
  float x;
  std::memcpy(&x, &u, sizeof x);
  return x;
}

void bf16_product(int64_t m, int64_t n, int64_t k, GemmOperand<float> a, GemmOperand<float> b, float* c, int64_t ldc,
                  bool acc, float alpha) {
  gemm_bf16(m, n, k, a, b, c, ldc, acc, alpha);
}

float rounded(float x) { return round_bf16(x); }

// Runs f once per path this machine has: the native kernel (when the CPU has AVX512-BF16 and the active set is
// avx512) and the portable one. The name of the path goes to the test's trace.
template <class F>
void on_every_path(F f) {
  const bool native = gemm_bf16_native();
  for (bool use_native : {true, false}) {
    if (use_native && !native) continue;
    set_gemm_bf16_native(use_native);
    SCOPED_TRACE(use_native ? "AVX512-BF16 kernel" : "portable path");
    f();
  }
  set_gemm_bf16_native(true);
}

}  // namespace

TEST(GemmBf16, RoundsToNearestEvenLikeTheHardware) {
  EXPECT_EQ(round_bf16(1.0f), 1.0f);
  EXPECT_EQ(round_bf16(1.0f + 0x1p-8f), 1.0f);                       // a tie: to the even mantissa
  EXPECT_EQ(round_bf16(1.0f + 3 * 0x1p-8f), 1.0f + 0x1p-6f);         // a tie: up to the even mantissa
  EXPECT_EQ(round_bf16(1.0f + 0x1p-8f + 0x1p-20f), 1.0f + 0x1p-7f);  // above the tie: up
  EXPECT_EQ(round_bf16(-3.14159265f), -3.140625f);
  EXPECT_EQ(bits(round_bf16(-0.0f)), 0x80000000u);
  EXPECT_EQ(bits(round_bf16(-1e-40f)), 0x80000000u);  // a denormal is a signed zero (DAZ)
  EXPECT_EQ(round_bf16(std::numeric_limits<float>::max()), std::numeric_limits<float>::infinity());
  EXPECT_EQ(round_bf16(-std::numeric_limits<float>::infinity()), -std::numeric_limits<float>::infinity());
  EXPECT_TRUE(std::isnan(round_bf16(std::numeric_limits<float>::quiet_NaN())));
  EXPECT_TRUE(std::isnan(round_bf16(from_bits(0x7f800001u))));  // a NaN whose payload is all in the low bits
  std::mt19937 rng(5);
  for (int i = 0; i < 100000; ++i) {  // the nearest of the two bf16 neighbours, always
    const float x = from_bits(static_cast<uint32_t>(rng()) & 0xbfffffffu);  // finite, |x| < 2
    if ((bits(x) & 0x7f800000u) == 0) continue;
    const float r = round_bf16(x), lo = from_bits(bits(x) & 0xffff0000u),
                hi = from_bits((bits(x) & 0xffff0000u) + 0x10000u);
    ASSERT_TRUE(r == lo || r == hi) << x;
    ASSERT_LE(std::fabs(static_cast<double>(r) - x), std::fabs(static_cast<double>(r == lo ? hi : lo) - x)) << x;
    ASSERT_EQ(bits(r) & 0xffffu, 0u);
  }
}

TEST(GemmBf16, ArrayConversionsEqualTheScalarRounding) {
  // round_bf16 over an array and to_bf16_bits (the decoding cache's weights) against the rule written out with
  // branches: every class of float (zeros, denormals, normals of every exponent, ties, the largest finite values,
  // infinities, NaNs with payloads high and low) at every position of a vector and its tail.
  auto reference = [](uint32_t u) {
    if ((u & 0x7f800000u) == 0) return u & 0x80000000u;
    if ((u & 0x7fffffffu) > 0x7f800000u) return (u | 0x00400000u) & 0xffff0000u;
    return (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;
  };
  std::vector<uint32_t> in = {0u,          0x80000000u, 0x00000001u, 0x807fffffu, 0x00800000u, 0x3f808000u,
                              0x3f818000u, 0x3f808001u, 0x7f7fffffu, 0xff7f8000u, 0x7f7f7fffu, 0x7f800000u,
                              0xff800000u, 0x7fc00000u, 0x7f800001u, 0xffbfffffu, 0x7fffffffu, 0x3f800000u};
  std::mt19937 rng(11);
  for (int i = 0; i < 20000; ++i) in.push_back(static_cast<uint32_t>(rng()));
  for (size_t n : {in.size(), size_t{1}, size_t{7}, size_t{17}}) {
    std::vector<float> src(n), rounded(n);
    std::vector<uint16_t> half(n);
    for (size_t i = 0; i < n; ++i) src[i] = from_bits(in[i]);
    round_bf16(src.data(), rounded.data(), static_cast<int64_t>(n));
    to_bf16_bits(src.data(), half.data(), static_cast<int64_t>(n));
    for (size_t i = 0; i < n; ++i) {
      ASSERT_EQ(bits(rounded[i]), reference(in[i])) << std::hex << in[i];
      ASSERT_EQ(static_cast<uint32_t>(half[i]) << 16, reference(in[i])) << std::hex << in[i];
      ASSERT_EQ(bits(round_bf16(src[i])), reference(in[i])) << std::hex << in[i];
    }
  }
}

// The kernel runs wherever it can: the avx512 set on a CPU with AVX512-BF16 (nowhere else).
TEST(GemmBf16, TheNativeKernelRunsWhereTheCpuHasIt) {
  EXPECT_EQ(gemm_bf16_native(), cpu_kernels() == "avx512" && __builtin_cpu_supports("avx512bf16"));
}

// The hardware's rounding (vcvtne2ps2bf16, through a product by 1) is round_bf16's, on every class of float:
// normal, denormal, zero, infinite and NaN.
TEST(GemmBf16, TheKernelRoundsAsRoundBf16) {
  if (!gemm_bf16_native()) GTEST_SKIP() << "no AVX512-BF16 kernel here";
  std::mt19937 rng(6);
  std::vector<float> a;
  for (uint32_t u : {0x00000000u, 0x80000000u, 0x00000001u, 0x807fffffu, 0x00800000u, 0x7f7fffffu, 0xff7fffffu,
                     0x7f800000u, 0xff800000u, 0x7fc00000u, 0x7f800001u, 0x3f808000u, 0x3f818000u, 0x3f80ffffu})
    a.push_back(from_bits(u));
  for (int i = 0; i < 4000; ++i) a.push_back(from_bits(static_cast<uint32_t>(rng())));
  const int64_t n = static_cast<int64_t>(a.size());
  const float one = 1.0f;
  std::vector<float> c(a.size());
  gemm_bf16(n, 1, 1, {a.data(), 1, false}, {&one, 1, false}, c.data(), 1, false);  // C (n, 1) = A (n, 1) x 1
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::isnan(a[i])) {
      EXPECT_TRUE(std::isnan(c[i])) << std::hex << bits(a[i]);
      continue;
    }
    if (round_bf16(a[i]) == 0.0f)  // a zero (denormals included): the sum 0 + (-0) is +0
      EXPECT_EQ(bits(c[i]), 0u) << std::hex << bits(a[i]);
    else
      EXPECT_EQ(bits(c[i]), bits(round_bf16(a[i]))) << std::hex << bits(a[i]);
  }
}

// Against the double product of the rounded operands: the result differs only by float32 accumulation.
TEST(GemmBf16, EveryLayoutAgainstADoubleReferenceOfTheRoundedOperands) {
  on_every_path([] {
    std::mt19937 rng(1);
    const int64_t sizes[] = {1, 2, 11, 12, 13, 16, 17, 31, 32, 33, 97};
    for (int trial = 0; trial < 120; ++trial) {
      const int64_t m = sizes[rng() % 11], n = sizes[rng() % 11], k = trial % 10 == 0 ? 0 : 1 + rng() % 300;
      const bool ta = rng() % 2, tb = rng() % 2, acc = rng() % 2;
      check(make_case<float>(rng, m, n, k, ta, tb, acc, trial % 3 == 0 ? 0.5f : 1.0f), 1e-5, &bf16_product, &rounded);
    }
    // Past the cache blocks: k > 512 (several bf16 panels, an odd last one), n > 512, m > 96.
    check(make_case<float>(rng, 130, 600, 1101, false, true, true, 1.0f), 1e-5, &bf16_product, &rounded);
    check(make_case<float>(rng, 200, 530, 700, true, false, false, 1.0f), 1e-5, &bf16_product, &rounded);
    check(make_case<float>(rng, 3, 40, 515, true, true, false, 1.0f), 1e-5, &bf16_product, &rounded);
  });
}

// The operands really are rounded: on values that bf16 cannot hold the result is the rounded product, not float32's.
TEST(GemmBf16, DiffersFromFloat32ByTheOperandRounding) {
  on_every_path([] {
    const float a[2] = {1.0f + 0x1p-9f, 3.0f}, b[2] = {1.0f, 1.0f + 0x1p-10f};
    float c = 0;
    gemm_bf16(1, 1, 2, {a, 2, false}, {b, 1, false}, &c, 1, false);
    EXPECT_EQ(c, 4.0f);  // float32 would give 4 + 2^-9 + 3 * 2^-10
  });
}

TEST(GemmBf16, ThreadsGiveTheSameBits) {
  const int saved = get_num_threads();
  on_every_path([] {
    std::mt19937 rng(2);
    for (bool ta : {false, true})
      for (bool tb : {false, true}) {
        Case<float> c = make_case<float>(rng, 301, 257, 600, ta, tb, true, 1.0f);
        set_num_threads(1);
        const std::vector<float> one = check(c, 1e-5, &bf16_product, &rounded);
        for (int t : {2, 3}) {  // the same bits (checked against the reference once, above)
          set_num_threads(t);
          std::vector<float> out = c.c0;
          bf16_product(c.m, c.n, c.k, {c.a.data(), c.lda, c.ta}, {c.b.data(), c.ldb, c.tb}, out.data(), c.ldc, c.acc,
                       c.alpha);
          EXPECT_EQ(out, one);
        }
      }
  });
  set_num_threads(saved);
}

TEST(GemmBf16, BiasEqualsFillingCAndAccumulating) {
  on_every_path([] {
    std::mt19937 rng(4);
    const int64_t shapes[][3] = {{1, 1, 1}, {13, 17, 0}, {37, 70, 300}, {130, 600, 1030}};
    for (const auto& s : shapes)
      for (bool ta : {false, true})
        for (bool tb : {false, true}) {
          Case<float> c = make_case<float>(rng, s[0], s[1], s[2], ta, tb, false, 1.0f);
          std::vector<float> bias(static_cast<size_t>(s[1]));
          std::normal_distribution<float> nd;
          for (float& v : bias) v = nd(rng);
          std::vector<float> fused = c.c0, reference = c.c0;
          gemm_bf16(c.m, c.n, c.k, {c.a.data(), c.lda, ta}, {c.b.data(), c.ldb, tb}, fused.data(), c.ldc, false, 1.0f,
                    true, bias.data());
          for (int64_t i = 0; i < c.m; ++i)
            for (int64_t j = 0; j < c.n; ++j)
              reference[static_cast<size_t>(i * c.ldc + j)] = bias[static_cast<size_t>(j)];
          gemm_bf16(c.m, c.n, c.k, {c.a.data(), c.lda, ta}, {c.b.data(), c.ldb, tb}, reference.data(), c.ldc, true);
          EXPECT_EQ(fused, reference) << "m " << c.m << " n " << c.n << " k " << c.k << " ta " << ta << " tb " << tb;
        }
  });
}

// The documented tolerance between the two paths: the same rounded operands, float32 sums in another order, so every
// element within 1e-5 of the sum of the products' magnitudes (k up to 1,100; several bf16 panels).
TEST(GemmBf16, TheTwoPathsAgreeToFloat32Accumulation) {
  if (!gemm_bf16_native()) GTEST_SKIP() << "one path here (no AVX512-BF16 kernel)";
  std::mt19937 rng(7);
  for (const auto& s : {std::array<int64_t, 3>{37, 70, 300}, {100, 120, 1101}, {5, 16, 513}})
    for (bool ta : {false, true})
      for (bool tb : {false, true}) {
        Case<float> c = make_case<float>(rng, s[0], s[1], s[2], ta, tb, false, 1.0f);
        std::vector<float> native = c.c0, portable = c.c0;
        gemm_bf16(c.m, c.n, c.k, {c.a.data(), c.lda, ta}, {c.b.data(), c.ldb, tb}, native.data(), c.ldc, false);
        set_gemm_bf16_native(false);
        gemm_bf16(c.m, c.n, c.k, {c.a.data(), c.lda, ta}, {c.b.data(), c.ldb, tb}, portable.data(), c.ldc, false);
        set_gemm_bf16_native(true);
        double worst = 0;
        for (int64_t i = 0; i < c.m; ++i)
          for (int64_t j = 0; j < c.n; ++j) {
            double mag = 0;
            for (int64_t p = 0; p < c.k; ++p)
              mag += std::fabs(static_cast<double>(round_bf16(ta ? c.a[p * c.lda + i] : c.a[i * c.lda + p])) *
                               round_bf16(tb ? c.b[j * c.ldb + p] : c.b[p * c.ldb + j]));
            const size_t o = static_cast<size_t>(i * c.ldc + j);
            worst = std::max(worst, std::fabs(static_cast<double>(native[o]) - portable[o]) / (mag + 1e-30));
          }
        EXPECT_LE(worst, 1e-5) << "m " << c.m << " n " << c.n << " k " << c.k << " ta " << ta << " tb " << tb;
        EXPECT_GT(worst, 0.0) << "the paths sum in different orders: some element should differ";
      }
}
