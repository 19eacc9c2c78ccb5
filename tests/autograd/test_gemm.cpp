// The library's internal matrix product (autograd/gemm.h): every transposition, leading dimension, accumulation
// and scale against a double-precision reference, edge sizes around the register blocks, the pre-packed variant,
// and bitwise equality between thread counts.

#include <cstdlib>
#include <random>
#include <vector>

#include "autograd/gemm.h"
#include "autograd/parallel.h"
#include "gemm_cases.h"
#include "testing.h"

using namespace attograd;
using namespace attograd::detail;
using attograd::testing::Case;
using attograd::testing::check;
using attograd::testing::make_case;

TEST(Gemm, EveryLayoutAgainstADoubleReference) {
  std::mt19937 rng(1);
  const int64_t sizes[] = {1, 2, 11, 12, 13, 16, 17, 31, 32, 33, 97};
  for (int trial = 0; trial < 120; ++trial) {
    const int64_t m = sizes[rng() % 11], n = sizes[rng() % 11], k = trial % 10 == 0 ? 0 : 1 + rng() % 300;
    const bool ta = rng() % 2, tb = rng() % 2, acc = rng() % 2;
    check(make_case<float>(rng, m, n, k, ta, tb, acc, trial % 3 == 0 ? 0.5f : 1.0f), 1e-5);
    check(make_case<double>(rng, m, n, k, ta, tb, acc, trial % 3 == 0 ? 0.5 : 1.0), 1e-12);
  }
  // Past the cache blocks: k > 256 (several k panels), n > 512 (several packed panels), m > 96 rows.
  check(make_case<float>(rng, 130, 600, 700, false, true, true, 1.0f), 1e-5);
  check(make_case<float>(rng, 200, 530, 300, true, false, false, 1.0f), 1e-5);
}

TEST(Gemm, ThreadsGiveTheSameBits) {
  const int saved = get_num_threads();
  std::mt19937 rng(2);
  for (bool ta : {false, true})
    for (bool tb : {false, true}) {
      Case<float> c = make_case<float>(rng, 301, 257, 300, ta, tb, true, 1.0f);
      set_num_threads(1);
      const std::vector<float> one = check(c, 1e-5);
      for (int t : {2, 3}) {
        set_num_threads(t);
        EXPECT_EQ(check(c, 1e-5), one);
      }
      Case<float> wide = make_case<float>(rng, 20, 900, 200, ta, tb, false, 1.0f);  // split by columns
      set_num_threads(1);
      const std::vector<float> w1 = check(wide, 1e-5);
      set_num_threads(2);
      EXPECT_EQ(check(wide, 1e-5), w1);
    }
  set_num_threads(saved);
}

TEST(Gemm, PrepackedEqualsGemmBitwise) {
  if (!gemm_prepack_available()) GTEST_SKIP() << "no AVX-512 kernel on this machine";
  std::mt19937 rng(3);
  for (int trial = 0; trial < 60; ++trial) {
    const int64_t kb = 1 + rng() % 400, nb = 1 + rng() % 80;
    const int64_t k = 1 + rng() % kb, n = 1 + rng() % nb, m = 1 + rng() % 40;
    const bool ta = rng() % 2, tb = rng() % 2, acc = rng() % 2;
    Case<float> c = make_case<float>(rng, m, nb, kb, ta, tb, acc, trial % 2 ? 1.0f : 0.25f);
    float* packed = static_cast<float*>(std::aligned_alloc(64, (packed_b_floats(kb, nb) * sizeof(float) + 63) / 64 * 64));
    pack_gemm_b(kb, nb, {c.b.data(), c.ldb, tb}, packed);
    std::vector<float> via_pack = c.c0, direct = c.c0;
    const int64_t lda = ta ? m : kb;  // the case's A holds k rows/cols of kb
    gemm_packed(m, n, k, {c.a.data(), c.lda, ta}, packed, kb, nb, via_pack.data(), c.ldc, acc, c.alpha);
    gemm(m, n, k, {c.a.data(), c.lda, ta}, {c.b.data(), c.ldb, tb}, direct.data(), c.ldc, acc, c.alpha);
    EXPECT_EQ(via_pack, direct) << "m " << m << " n " << n << " k " << k << " kb " << kb << " nb " << nb << " lda " << lda;
    std::free(packed);
  }
}

// A bias product equals filling C with the bias rows and accumulating, bit for bit, on every path (k = 0, several
// k panels, ragged columns, A^T packed or not, 1 and 2 threads), and leaves the padding between C's rows alone.
TEST(Gemm, BiasEqualsFillingCAndAccumulating) {
  const int saved = get_num_threads();
  std::mt19937 rng(4);
  const int64_t shapes[][3] = {{1, 1, 1}, {13, 17, 0}, {37, 70, 300}, {100, 33, 64}, {130, 600, 520}, {24, 200, 2048}};
  for (int threads : {1, 2})
    for (const auto& s : shapes)
      for (bool ta : {false, true})
        for (bool tb : {false, true}) {
          set_num_threads(threads);
          Case<float> c = make_case<float>(rng, s[0], s[1], s[2], ta, tb, false, 1.0f);
          std::vector<float> bias(static_cast<size_t>(s[1]));
          std::normal_distribution<float> nd;
          for (float& v : bias) v = nd(rng);
          std::vector<float> fused = c.c0, reference = c.c0;
          gemm(c.m, c.n, c.k, {c.a.data(), c.lda, ta}, {c.b.data(), c.ldb, tb}, fused.data(), c.ldc, false, 1.0f, true,
               bias.data());
          for (int64_t i = 0; i < c.m; ++i)
            for (int64_t j = 0; j < c.n; ++j) reference[static_cast<size_t>(i * c.ldc + j)] = bias[static_cast<size_t>(j)];
          gemm(c.m, c.n, c.k, {c.a.data(), c.lda, ta}, {c.b.data(), c.ldb, tb}, reference.data(), c.ldc, true);
          EXPECT_EQ(fused, reference) << "m " << c.m << " n " << c.n << " k " << c.k << " ta " << ta << " tb " << tb
                                      << " threads " << threads;
        }
  set_num_threads(saved);
  float a = 1, b = 1, c = 0, bias = 1;
  EXPECT_ATTO_ERROR(gemm(1, 1, 1, {&a, 1, false}, {&b, 1, false}, &c, 1, true, 1.0f, true, &bias), "cannot accumulate");
}
