#include <cmath>

#include "autograd/dropout.h"
#include "autograd/matmul.h"
#include "testing.h"

using namespace attograd;
using namespace attograd::testing;

TEST(Dropout, EvalAndZeroProbabilityReturnTheInputItself) {
  Generator gen(1);
  Tensor x = rand_leaf({3, 4}, gen);
  const GeneratorState before = gen.get_state();
  EXPECT_TRUE(dropout(x, 0.5, /*training=*/false, gen).is_same(x));
  EXPECT_TRUE(dropout(x, 0.0, /*training=*/true, gen).is_same(x));
  EXPECT_EQ(gen.get_state(), before);  // no draws
}

TEST(Dropout, ProbabilityOneGivesZerosAndZeroGradient) {
  Generator gen(2);
  Tensor x = rand_leaf({3, 4}, gen);
  const GeneratorState before = gen.get_state();
  Tensor y = dropout(x, 1.0, true, gen);
  EXPECT_EQ(gen.get_state(), before);
  EXPECT_TRUE(all_close(y, zeros({3, 4}, {.dtype = kFloat64}), 0));
  EXPECT_TRUE(y.requires_grad());
  y.backward(ones({3, 4}, {.dtype = kFloat64}));
  EXPECT_TRUE(all_close(x.grad(), zeros({3, 4}, {.dtype = kFloat64}), 0));
  EXPECT_TRUE(all_close(dropout_mask({2, 2}, 1.0, gen, kFloat32), zeros({2, 2}), 0));
}

TEST(Dropout, KeptValuesAreScaledAndGradientIsTheMask) {
  Generator gen(3);
  const double p = 0.25;
  Tensor x = rand_leaf({50, 40}, gen, 0.5, 1.5);  // never 0, so a zero output means dropped
  Tensor y = dropout(x, p, true, gen);
  EXPECT_EQ(y.grad_fn_name(), "dropout");
  Tensor g = rand(y.shape(), gen, {.dtype = kFloat64});
  y.backward(g);
  const auto xv = x.to_vector<double>(), yv = y.to_vector<double>(), gv = g.to_vector<double>(),
             dx = x.grad().to_vector<double>();
  int64_t kept = 0;
  for (size_t i = 0; i < xv.size(); ++i) {
    if (yv[i] == 0.0) {
      EXPECT_EQ(dx[i], 0.0);
    } else {
      ++kept;
      EXPECT_EQ(yv[i], xv[i] * (1.0 / (1.0 - p)));
      EXPECT_EQ(dx[i], gv[i] * (1.0 / (1.0 - p)));
    }
  }
  EXPECT_GT(kept, 0);
  EXPECT_LT(kept, 2000);
}

TEST(Dropout, StatisticsOnManyElements) {
  Generator gen(4);
  const int64_t n = 100000;
  for (double p : {0.1, 0.3, 0.5, 0.9}) {
    SCOPED_TRACE("p = " + std::to_string(p));
    Tensor x = ones({n}, {.dtype = kFloat64});
    Tensor y = dropout(x, p, true, gen);
    auto v = y.to_vector<double>();
    double kept = 0, sum = 0;
    for (double e : v) {
      kept += e != 0.0;
      sum += e;
    }
    // The kept fraction has standard deviation sqrt(p (1 - p) / n) <= 0.0016: allow about 6 of them.
    EXPECT_NEAR(kept / n, 1.0 - p, 0.01);
    // The mean is preserved: E[y] = x; its standard deviation is sqrt(p / ((1 - p) n)) <= 0.0095 at p = 0.9.
    EXPECT_NEAR(sum / n, 1.0, 6 * std::sqrt(p / ((1.0 - p) * n)));
  }
}

TEST(Dropout, SameSeedReplaysTheSameMask) {
  Generator gen(5);
  Tensor x = rand({8, 16}, gen);
  Generator g1(77), g2(77), g3(78);
  Tensor y1 = dropout(x, 0.4, true, g1);
  Tensor y2 = dropout(x, 0.4, true, g2);
  Tensor y3 = dropout(x, 0.4, true, g3);
  EXPECT_TRUE(all_close(y1, y2, 0));
  EXPECT_FALSE(all_close(y1, y3, 0));
  EXPECT_EQ(g1.get_state(), g2.get_state());
  // One 32-bit draw per element.
  Generator ref(77);
  for (int i = 0; i < 8 * 16; ++i) ref.next_u32();
  EXPECT_EQ(g1.get_state(), ref.get_state());
  // The next call continues the stream: a different mask.
  EXPECT_FALSE(all_close(dropout(x, 0.4, true, g1), y1, 0));
}

TEST(Dropout, MaskHelperReplaysDropout) {
  Generator gen(6);
  Tensor x = rand({5, 7}, gen, {.dtype = kFloat64});
  for (Dtype dt : {kFloat32, kFloat64}) {
    Generator g1(9), g2(9), g3(9);
    Tensor xd = x.to(dt);
    Tensor y = dropout(xd, 0.3, true, g1);
    Tensor mask = dropout_mask(x.shape(), 0.3, g2, dt);
    EXPECT_EQ(mask.dtype(), dt);
    EXPECT_TRUE(all_close(y, xd * mask, 0));  // bitwise the same values
    Tensor keep = dropout_mask(x.shape(), 0.3, g3, kBool);
    EXPECT_EQ(keep.dtype(), kBool);
    const auto mv = mask.to_vector<double>();
    const auto kv = keep.to_vector<double>();
    // The kept value is 1 / (1 - p) rounded to the mask's dtype.
    const double scale = dt == kFloat32 ? static_cast<double>(static_cast<float>(1.0 / 0.7)) : 1.0 / 0.7;
    for (size_t i = 0; i < mv.size(); ++i) EXPECT_EQ(mv[i], kv[i] * scale);
    EXPECT_EQ(g1.get_state(), g2.get_state());
    EXPECT_EQ(g1.get_state(), g3.get_state());
  }
  Generator g(10);
  EXPECT_TRUE(all_close(dropout_mask({3}, 0.0, g, kFloat64), ones({3}, {.dtype = kFloat64}), 0));
  EXPECT_EQ(g.get_state(), Generator(10).get_state());
}

TEST(Dropout, MaskMatchesSequentialDraws) {
  // Element i is kept when the i-th gen.next_u32() is >= round(p * 2^32); sizes cover the vectorised
  // lanes' tail (16 at a time) and the float mask's blocks (4096 at a time).
  for (int64_t n : {0, 1, 15, 16, 17, 100, 4096, 4096 * 2 + 37}) {
    // 1e-12 and 1 - 1e-12 round to the thresholds 0 (every draw kept) and 2^32 (none kept, draws still made).
    for (double p : {0.5, 0.3, 1e-12, 1 - 1e-12}) {
      SCOPED_TRACE("n = " + std::to_string(n) + ", p = " + std::to_string(p));
      const uint64_t seed = 1000 + static_cast<uint64_t>(n);
      Generator gb(seed), gf(seed), gd(seed), ref(seed);
      const auto keep = dropout_mask({n}, p, gb, kBool).to_vector<double>();
      const auto mask = dropout_mask({n}, p, gf, kFloat64).to_vector<double>();
      // The float32 op itself (whole vectors of 16 plus a tail) on ones: the kept value is 1 / (1 - p) in float.
      const auto dropped = dropout(ones({n}, {.dtype = kFloat32}), p, true, gd).to_vector<double>();
      const auto kept32 = static_cast<double>(static_cast<float>(1.0 / (1.0 - p)));
      const auto threshold = static_cast<uint64_t>(std::llround(p * 4294967296.0));
      int64_t mismatches = 0, kept = 0;
      for (int64_t i = 0; i < n; ++i) {
        const bool expected = ref.next_u32() >= threshold;
        kept += expected;
        mismatches += (keep[static_cast<size_t>(i)] != 0) != expected;
        mismatches += mask[static_cast<size_t>(i)] != (expected ? 1.0 / (1.0 - p) : 0.0);
        mismatches += dropped[static_cast<size_t>(i)] != (expected ? kept32 : 0.0);
      }
      EXPECT_EQ(mismatches, 0);
      if (p == 1e-12) {
        EXPECT_EQ(kept, n);
      }
      if (p == 1 - 1e-12) {
        EXPECT_EQ(kept, 0);
      }
      EXPECT_EQ(gb.get_state(), ref.get_state());
      EXPECT_EQ(gf.get_state(), ref.get_state());
      EXPECT_EQ(gd.get_state(), ref.get_state());
    }
  }
}

TEST(Dropout, DefaultGeneratorIsReplayableWithManualSeed) {
  Tensor x = ones({64});
  manual_seed(123);
  Tensor y1 = dropout(x, 0.5);
  manual_seed(123);
  Tensor y2 = dropout(x, 0.5);
  EXPECT_TRUE(all_close(y1, y2, 0));
}

TEST(Dropout, GradcheckWithDropoutOn) {
  Generator gen(7);
  Tensor x = rand_leaf({4, 5}, gen);
  std::vector<Tensor> inputs{x};
  // The function re-seeds its own generator, so every evaluation draws the same mask.
  EXPECT_GRADCHECK(
      [&] {
        Generator g(42);
        return dropout(x, 0.4, true, g);
      },
      inputs);
  // Inside a composition, with the input reused (dropout(x) * x) and a broadcast shape through matmul.
  Tensor w = rand_leaf({5, 3}, gen);
  std::vector<Tensor> both{x, w};
  EXPECT_GRADCHECK(
      [&] {
        Generator g(43);
        return matmul(dropout(x, 0.5, true, g) * x, dropout(w, 0.2, true, g));
      },
      both);
  // A zero-size input.
  Tensor e = rand_leaf({0, 3}, gen);
  std::vector<Tensor> empty_in{e};
  EXPECT_GRADCHECK(
      [&] {
        Generator g(44);
        return dropout(e, 0.5, true, g);
      },
      empty_in);
}

TEST(Dropout, Float32) {
  Generator gen(8);
  Tensor x = rand({1000}, gen).requires_grad_();
  Generator g1(11), g2(11);
  Tensor y = dropout(x, 0.2, true, g1);
  EXPECT_EQ(y.dtype(), kFloat32);
  y.backward(ones({1000}));
  EXPECT_EQ(x.grad().dtype(), kFloat32);
  const auto keep = dropout_mask({1000}, 0.2, g2, kBool).to_vector<double>();
  const auto xv = x.to_vector<float>(), yv = y.to_vector<float>(), dv = x.grad().to_vector<float>();
  const float s = static_cast<float>(1.0 / 0.8);
  for (size_t i = 0; i < xv.size(); ++i) {
    EXPECT_EQ(yv[i], keep[i] != 0 ? xv[i] * s : 0.0f);
    EXPECT_EQ(dv[i], keep[i] != 0 ? s : 0.0f);
  }
  NoGradGuard ng;
  Generator g3(11);
  Tensor y_nograd = dropout(x, 0.2, true, g3);
  EXPECT_FALSE(y_nograd.requires_grad());
  EXPECT_TRUE(all_close(y_nograd, y, 0));
}

TEST(Dropout, Errors) {
  Tensor x = zeros({2, 3});
  Generator gen(9);
  EXPECT_ATTO_ERROR(dropout(x, 1.5, true, gen),
                    "dropout: dropout probability has to be between 0 and 1, but got p = 1.5");
  EXPECT_ATTO_ERROR(dropout(x, -0.1, true, gen), "but got p = -0.1");
  EXPECT_ATTO_ERROR(dropout(x, -0.1, false, gen), "but got p = -0.1");  // checked in eval mode too
  EXPECT_ATTO_ERROR(dropout(x, std::nan(""), true, gen), "but got p = nan");
  EXPECT_ATTO_ERROR(dropout(zeros({2}, {.dtype = kInt64}), 0.5, true, gen),
                    "dropout: expected a float32 or float64 tensor, got int64 of shape [2]");
  EXPECT_ATTO_ERROR(dropout(Tensor(), 0.5, true, gen), "dropout: called with an undefined tensor");
  EXPECT_ATTO_ERROR(dropout_mask({2}, 2.0, gen, kFloat32),
                    "dropout_mask: dropout probability has to be between 0 and 1, but got p = 2");
  EXPECT_ATTO_ERROR(dropout_mask({2}, 0.5, gen, kInt64),
                    "dropout_mask: dtype must be float32, float64 or bool, got int64");
}
