#pragma once
// Element types and the dispatch from a runtime dtype to a compile-time type.

#include <cstdint>
#include <string>

#include "autograd/error.h"

namespace attograd {

/// Element type of a tensor. Math ops run in Float32 or Float64; Int64 holds indices, Bool holds masks.
enum class Dtype : uint8_t { Float32 = 0, Float64 = 1, Int64 = 2, Bool = 3 };

inline constexpr Dtype kFloat32 = Dtype::Float32;  ///< float, the training type
inline constexpr Dtype kFloat64 = Dtype::Float64;  ///< double, the gradient-check type
inline constexpr Dtype kInt64 = Dtype::Int64;      ///< int64_t, token ids and targets
inline constexpr Dtype kBool = Dtype::Bool;        ///< bool (stored as one byte), masks

/// PyTorch's name for a dtype ("float32", "float64", "int64", "bool").
inline std::string dtype_name(Dtype d) {
  switch (d) {
    case Dtype::Float32: return "float32";
    case Dtype::Float64: return "float64";
    case Dtype::Int64: return "int64";
    case Dtype::Bool: return "bool";
  }
  return "unknown";
}

/// Size of one element in bytes.
inline size_t dtype_size(Dtype d) {
  switch (d) {
    case Dtype::Float32: return 4;
    case Dtype::Float64: return 8;
    case Dtype::Int64: return 8;
    case Dtype::Bool: return 1;
  }
  return 0;
}

/// True for Float32 and Float64.
inline bool is_floating(Dtype d) { return d == Dtype::Float32 || d == Dtype::Float64; }

/// The Dtype of a C++ element type.
template <class T> constexpr Dtype dtype_of();
template <> constexpr Dtype dtype_of<float>() { return Dtype::Float32; }
template <> constexpr Dtype dtype_of<double>() { return Dtype::Float64; }
template <> constexpr Dtype dtype_of<int64_t>() { return Dtype::Int64; }
template <> constexpr Dtype dtype_of<bool>() { return Dtype::Bool; }

/// Calls f.template operator()<T>() with T = float or double; throws for other dtypes.
/// Usage: dispatch_float(x.dtype(), "exp", [&]<typename T>() { ... });
template <class F>
decltype(auto) dispatch_float(Dtype d, const char* op, F&& f) {
  switch (d) {
    case Dtype::Float32: return f.template operator()<float>();
    case Dtype::Float64: return f.template operator()<double>();
    default: throw Error(op, "expected a float32 or float64 tensor, got " + dtype_name(d));
  }
}

/// Like dispatch_float but also accepts Int64 and Bool.
template <class F>
decltype(auto) dispatch_all(Dtype d, F&& f) {
  switch (d) {
    case Dtype::Float32: return f.template operator()<float>();
    case Dtype::Float64: return f.template operator()<double>();
    case Dtype::Int64: return f.template operator()<int64_t>();
    case Dtype::Bool: return f.template operator()<bool>();
  }
  return f.template operator()<float>();
}

}  // namespace attograd
