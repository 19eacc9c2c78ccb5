#pragma once
// Shared by the GEMM tests: random cases (every transposition, padded leading dimensions) and a check against a
// double-precision reference.

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "autograd/gemm.h"

namespace attograd::testing {

using detail::GemmOperand;

/// detail::gemm with the defaults of its last arguments.
template <class T>
void default_product(int64_t m, int64_t n, int64_t k, GemmOperand<T> a, GemmOperand<T> b, T* c, int64_t ldc, bool acc,
                     T alpha) {
  detail::gemm(m, n, k, a, b, c, ldc, acc, alpha);
}

/// The identity on operand values.
template <class T>
T same_value(T x) {
  return x;
}

/// One product: A, B and C's old values uniform in [-1, 1), each leading dimension padded by 0-2.
template <class T>
struct Case {
  int64_t m, n, k, lda, ldb, ldc;
  bool ta, tb, acc;
  T alpha;
  std::vector<T> a, b, c0;
};

/// A random case (m, n, k) with the given transpositions, accumulation and scale.
template <class T>
Case<T> make_case(std::mt19937& rng, int64_t m, int64_t n, int64_t k, bool ta, bool tb, bool acc, T alpha) {
  std::uniform_real_distribution<double> u(-1, 1);
  Case<T> c{m,
            n,
            k,
            (ta ? m : k) + static_cast<int64_t>(rng() % 3),
            (tb ? k : n) + static_cast<int64_t>(rng() % 3),
            n + static_cast<int64_t>(rng() % 3),
            ta,
            tb,
            acc,
            alpha,
            {},
            {},
            {}};
  c.a.resize(static_cast<size_t>((ta ? k : m) * c.lda + 1));
  c.b.resize(static_cast<size_t>((tb ? n : k) * c.ldb + 1));
  c.c0.resize(static_cast<size_t>(m * c.ldc + 1));
  for (auto* v : {&c.a, &c.b, &c.c0})
    for (auto& x : *v) x = static_cast<T>(u(rng));
  return c;
}

// Checks product's result (gemm unless given) against a double reference of the operands as `operand` maps them
// (unchanged unless given); returns the result.
template <class T, class P = decltype(&default_product<T>), class O = decltype(&same_value<T>)>
std::vector<T> check(const Case<T>& c, double tol, P product = &default_product<T>, O operand = &same_value<T>) {
  std::vector<T> out = c.c0;
  product(c.m, c.n, c.k, {c.a.data(), c.lda, c.ta}, {c.b.data(), c.ldb, c.tb}, out.data(), c.ldc, c.acc, c.alpha);
  for (int64_t i = 0; i < c.m; ++i) {
    for (int64_t j = 0; j < c.ldc; ++j) {
      const size_t o = static_cast<size_t>(i * c.ldc + j);
      if (j >= c.n) {  // the padding between rows of C is never written
        EXPECT_EQ(out[o], c.c0[o]);
        continue;
      }
      double s = 0, mag = 0;
      for (int64_t p = 0; p < c.k; ++p) {
        const double av =
            operand(c.ta ? c.a[static_cast<size_t>(p * c.lda + i)] : c.a[static_cast<size_t>(i * c.lda + p)]);
        const double bv =
            operand(c.tb ? c.b[static_cast<size_t>(j * c.ldb + p)] : c.b[static_cast<size_t>(p * c.ldb + j)]);
        s += av * bv;
        mag += std::fabs(av * bv);
      }
      const double ref = static_cast<double>(c.alpha) * s + (c.acc ? static_cast<double>(c.c0[o]) : 0.0);
      EXPECT_NEAR(static_cast<double>(out[o]), ref, tol * (mag + 1))
          << "m " << c.m << " n " << c.n << " k " << c.k << " ta " << c.ta << " tb " << c.tb << " at (" << i << ", "
          << j << ")";
    }
  }
  return out;
}

}  // namespace attograd::testing
