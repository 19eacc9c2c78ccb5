#pragma once
// Shared test helpers: gradcheck assertions, tolerance comparisons and golden-file reading.

#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <sstream>
#include <string>

#include "autograd/autograd.h"

namespace attograd::testing {

/// Asserts that two tensors have the same dtype, shape and bytes (so NaN payloads and -0.0 count).
inline ::testing::AssertionResult bitwise_equal(const Tensor& a, const Tensor& b) {
  if (a.dtype() != b.dtype())
    return ::testing::AssertionFailure() << dtype_name(a.dtype()) << " vs " << dtype_name(b.dtype());
  if (a.shape() != b.shape())
    return ::testing::AssertionFailure() << shape_str(a.shape()) << " vs " << shape_str(b.shape());
  if (a.nbytes() && std::memcmp(a.raw_data(), b.raw_data(), a.nbytes()) != 0)
    return ::testing::AssertionFailure() << "data differs";
  return ::testing::AssertionSuccess();
}

/// Asserts that two tensors have the same shape and every element within atol + rtol * |expected|.
inline ::testing::AssertionResult all_close(const Tensor& actual, const Tensor& expected, double atol = 1e-6,
                                            double rtol = 0) {
  if (actual.shape() != expected.shape())
    return ::testing::AssertionFailure() << "shape " << shape_str(actual.shape()) << " vs expected "
                                         << shape_str(expected.shape());
  auto a = actual.to_vector<double>();
  auto e = expected.to_vector<double>();
  for (size_t i = 0; i < a.size(); ++i) {
    double err = std::fabs(a[i] - e[i]);
    bool both_nan = std::isnan(a[i]) && std::isnan(e[i]);
    bool same_inf = std::isinf(a[i]) && a[i] == e[i];
    if (!(err <= atol + rtol * std::fabs(e[i])) && !both_nan && !same_inf)
      return ::testing::AssertionFailure() << "element " << i << ": " << a[i] << " vs expected " << e[i]
                                           << " (|diff| " << err << " > " << atol + rtol * std::fabs(e[i]) << ")";
  }
  return ::testing::AssertionSuccess();
}

/// Runs gradcheck and turns its result into a gtest assertion carrying the worst-element report.
template <class F>
::testing::AssertionResult gradcheck_ok(F&& f, const std::vector<Tensor>& inputs, GradcheckOptions opt = {}) {
  GradcheckResult r = gradcheck(std::forward<F>(f), inputs, opt);
  if (r.passed) return ::testing::AssertionSuccess() << r.message;
  return ::testing::AssertionFailure() << r.message;
}

/// A float64 leaf with values uniform in [lo, hi), requiring grad.
inline Tensor rand_leaf(const Shape& shape, Generator& gen, double lo = -1.0, double hi = 1.0) {
  Tensor t = rand(shape, gen, {.dtype = kFloat64});
  auto* p = t.data<double>();
  for (int64_t i = 0; i < t.numel(); ++i) p[i] = lo + (hi - lo) * p[i];
  t.requires_grad_(true);
  return t;
}

/// Path of a file under tests/data (the ATTOGRAD_TEST_DATA directory).
inline std::string data_path(const std::string& relative) {
  const char* env = std::getenv("ATTOGRAD_TEST_DATA");
  std::string base = env ? env : ATTOGRAD_TEST_DATA;
  return base + "/" + relative;
}

/// Reads a golden file written by tests/golden.py: name -> tensor (float dtypes as written).
inline std::map<std::string, Tensor> load_golden(const std::string& relative) {
  std::string path = data_path(relative);
  std::ifstream in(path);
  if (!in) throw Error("load_golden", "cannot open " + path);
  std::string magic;
  int version = 0;
  in >> magic >> version;
  if (magic != "attograd-golden" || version != 1) throw Error("load_golden", "bad header in " + path);
  std::map<std::string, Tensor> out;
  std::string word;
  while (in >> word) {
    if (word != "tensor") throw Error("load_golden", "expected 'tensor' in " + path + ", got " + word);
    std::string name, dt;
    int ndim = 0;
    in >> name >> dt >> ndim;
    Shape shape(static_cast<size_t>(ndim));
    for (auto& d : shape) in >> d;
    int64_t n = shape_numel(shape);
    Dtype dtype = dt == "float64" ? kFloat64 : dt == "float32" ? kFloat32 : dt == "int64" ? kInt64 : kBool;
    std::vector<double> values(static_cast<size_t>(n));
    for (auto& v : values) {
      std::string tok;
      in >> tok;
      v = std::strtod(tok.c_str(), nullptr);  // handles inf, -inf, nan
    }
    if (!in) throw Error("load_golden", "truncated tensor " + name + " in " + path);
    out[name] = ndim == 0 ? scalar_tensor(values.at(0), {.dtype = dtype})
                          : from_vector<double>(values, shape, {.dtype = dtype});
  }
  return out;
}

/// Expects `stmt` to throw attograd::Error whose message contains `substr`.
#define EXPECT_ATTO_ERROR(stmt, substr)                                                  \
  do {                                                                                   \
    try {                                                                                \
      stmt;                                                                              \
      ADD_FAILURE() << "expected attograd::Error containing \"" << (substr) << "\"";     \
    } catch (const ::attograd::Error& e) {                                               \
      EXPECT_NE(std::string(e.what()).find(substr), std::string::npos)                   \
          << "message was: " << e.what();                                                \
    }                                                                                    \
  } while (0)

}  // namespace attograd::testing

/// Asserts gradcheck passes for f over inputs (options optional).
#define EXPECT_GRADCHECK(f, inputs, ...) EXPECT_TRUE(::attograd::testing::gradcheck_ok(f, inputs, ##__VA_ARGS__))
