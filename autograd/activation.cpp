// Pointwise math and activations: each forward is one vectorised Eigen pass over the data, and each
// backward is one fused pass over (grad, saved value) with its formula in the comment above it.

#include "autograd/activation.h"

#include <Eigen/Core>
#include <cmath>
#include <string>
#include <type_traits>
#include <unsupported/Eigen/SpecialFunctions>

namespace attograd {

namespace {

template <class T>
using VecMap = Eigen::Map<Eigen::Array<T, Eigen::Dynamic, 1>>;
template <class T>
using ConstVecMap = Eigen::Map<const Eigen::Array<T, Eigen::Dynamic, 1>>;

// out = f(x): f(o, a) assigns into the writable array view o from the read-only view a of x.
// f is a template lambda []<class T>(VecMap<T> o, ConstVecMap<T> a) {...}.
template <class F>
Tensor unary_kernel(const Tensor& x, const char* op, F f) {
  Tensor out = empty(x.shape(), {.dtype = x.dtype()});
  const Eigen::Index n = static_cast<Eigen::Index>(x.numel());
  dispatch_float(x.dtype(), op, [&]<typename T>() { f(VecMap<T>(out.data<T>(), n), ConstVecMap<T>(x.data<T>(), n)); });
  return out;
}

// dx = f(g, s) for a saved tensor s of g's shape and dtype: f(o, g, s) assigns into o.
template <class F>
Tensor backward_kernel(const Tensor& g, const Tensor& s, const char* op, F f) {
  Tensor out = empty(g.shape(), {.dtype = g.dtype()});
  const Eigen::Index n = static_cast<Eigen::Index>(g.numel());
  dispatch_float(g.dtype(), op, [&]<typename T>() {
    f(VecMap<T>(out.data<T>(), n), ConstVecMap<T>(g.data<T>(), n), ConstVecMap<T>(s.data<T>(), n));
  });
  return out;
}

// o = a^p, with the common exponents as exact vectorised special cases.
template <class T>
void pow_into(VecMap<T> o, ConstVecMap<T> a, double p) {
  if (p == 0.0) {
    o.setOnes();
  } else if (p == 1.0) {
    o = a;
  } else if (p == 2.0) {
    o = a.square();
  } else if (p == 3.0) {
    o = a.cube();
  } else if (p == 0.5) {
    o = a.sqrt();
  } else if (p == -1.0) {
    o = a.inverse();
  } else if (p == -2.0) {
    o = a.square().inverse();
  } else {
    const T e = static_cast<T>(p);
    for (Eigen::Index i = 0; i < a.size(); ++i) o[i] = std::pow(a[i], e);
  }
}

constexpr double kSqrt1_2 = 0.70710678118654752440;      // 1/sqrt(2)
constexpr double kInvSqrt2Pi = 0.39894228040143267794;   // 1/sqrt(2 pi)
constexpr double kSqrt2OverPi = 0.79788456080286535588;  // sqrt(2/pi)
constexpr double kGeluCubic = 0.044715;                  // PyTorch's tanh-approximation coefficient

// o <- e^o, exactly 0 where e^o underflows. Eigen 3.4's generic vectorised exp (its SSE and AVX2 packets) clamps
// its argument at -88.723 (float) or -709.784 (double) and returns e^clamp, a denormal, for anything below, where
// its AVX-512 exp returns 0: sigmoid(-1000) was 5.6e-309 and a GELU gradient at -1000 was -1.2e-36 without AVX-512.
// At and above the clamp the result is Eigen's exp, unchanged.
//
// Eigen 3.4 evaluates a select() one coefficient at a time, so `select(..., o.exp())` called the scalar std::exp on
// every element (5.4% of a nanoGPT-recipe step, in GELU's backward). Instead each chunk runs Eigen's vectorised exp,
// and the few elements outside its accurate range are redone by std::exp: its packets clamp the argument (the
// AVX-512 packet at +-88.376 for float, so exp(100) came out finite, 2.4e38) where std::exp overflows to inf or
// returns a denormal. Elements below the clamp (lo) stay exactly 0, as before.
template <class T>
void exp_in_place(VecMap<T> o) {
  constexpr bool f32 = std::is_same_v<T, float>;
  constexpr T lo = f32 ? T(-88.723f) : T(-709.784);
  constexpr T lo_packet = f32 ? T(-87.0f) : T(-708.0), hi_packet = f32 ? T(88.0f) : T(709.0);  // inside both clamps
  constexpr Eigen::Index kChunk = 256;
  alignas(64) T x[kChunk];
  for (Eigen::Index s = 0; s < o.size(); s += kChunk) {
    const Eigen::Index m = std::min(kChunk, o.size() - s);
    VecMap<T> seg(o.data() + s, m);
    // Vectorised reductions (a per-element flag was a scalar loop); a NaN anywhere makes the sum NaN.
    if (seg.minCoeff() >= lo_packet && seg.maxCoeff() <= hi_packet && !std::isnan(seg.sum())) {
      seg = seg.exp();
      continue;
    }
    VecMap<T> xm(x, m);
    xm = seg;
    seg = xm.exp();
    for (Eigen::Index j = 0; j < m; ++j)
      if (!(x[j] >= lo_packet && x[j] <= hi_packet)) seg[j] = x[j] < lo ? T(0) : std::exp(x[j]);
  }
}

}  // namespace

// d exp(x) = g * exp(x) = g * y
Tensor exp(const Tensor& x) {
  Tensor out = unary_kernel(x, "exp", []<class T>(VecMap<T> o, ConstVecMap<T> a) {
    o = a;
    exp_in_place<T>(o);
  });
  if (!any_requires_grad({x})) return out;
  Tensor y = out.detach();
  return record("exp", out, {x}, [y](const Tensor& g, GradInputs& gi) {
    gi[0] = backward_kernel(g, y, "exp_backward",
                            []<class T>(VecMap<T> o, ConstVecMap<T> gg, ConstVecMap<T> yy) { o = gg * yy; });
  });
}

// d log(x) = g / x
Tensor log(const Tensor& x) {
  Tensor out = unary_kernel(x, "log", []<class T>(VecMap<T> o, ConstVecMap<T> a) { o = a.log(); });
  if (!any_requires_grad({x})) return out;
  Tensor xs = x.detach();
  return record("log", out, {x}, [xs](const Tensor& g, GradInputs& gi) {
    gi[0] = backward_kernel(g, xs, "log_backward",
                            []<class T>(VecMap<T> o, ConstVecMap<T> gg, ConstVecMap<T> xx) { o = gg / xx; });
  });
}

// d sqrt(x) = g / (2 sqrt(x)) = g / (2 y)
Tensor sqrt(const Tensor& x) {
  Tensor out = unary_kernel(x, "sqrt", []<class T>(VecMap<T> o, ConstVecMap<T> a) { o = a.sqrt(); });
  if (!any_requires_grad({x})) return out;
  Tensor y = out.detach();
  return record("sqrt", out, {x}, [y](const Tensor& g, GradInputs& gi) {
    gi[0] = backward_kernel(g, y, "sqrt_backward", []<class T>(VecMap<T> o, ConstVecMap<T> gg, ConstVecMap<T> yy) {
      o = gg / (T(2) * yy);
    });
  });
}

// d |x| = g * sign(x), sign(0) = 0
Tensor abs(const Tensor& x) {
  Tensor out = unary_kernel(x, "abs", []<class T>(VecMap<T> o, ConstVecMap<T> a) { o = a.abs(); });
  if (!any_requires_grad({x})) return out;
  Tensor xs = x.detach();
  return record("abs", out, {x}, [xs](const Tensor& g, GradInputs& gi) {
    gi[0] = backward_kernel(g, xs, "abs_backward",
                            []<class T>(VecMap<T> o, ConstVecMap<T> gg, ConstVecMap<T> xx) { o = gg * xx.sign(); });
  });
}

// d x^p = g * p * x^(p-1); zero when p == 0
Tensor pow(const Tensor& x, double exponent) {
  Tensor out = unary_kernel(x, "pow", [exponent]<class T>(VecMap<T> o, ConstVecMap<T> a) { pow_into<T>(o, a, exponent); });
  if (!any_requires_grad({x})) return out;
  Tensor xs = x.detach();
  return record("pow", out, {x}, [xs, exponent](const Tensor& g, GradInputs& gi) {
    if (exponent == 0.0) {
      gi[0] = zeros_like(g);
      return;
    }
    gi[0] = backward_kernel(g, xs, "pow_backward",
                            [exponent]<class T>(VecMap<T> o, ConstVecMap<T> gg, ConstVecMap<T> xx) {
                              pow_into<T>(o, xx, exponent - 1.0);
                              o *= gg * static_cast<T>(exponent);
                            });
  });
}

// d tanh(x) = g * (1 - y^2)
Tensor tanh(const Tensor& x) {
  Tensor out = unary_kernel(x, "tanh", []<class T>(VecMap<T> o, ConstVecMap<T> a) { o = a.tanh(); });
  if (!any_requires_grad({x})) return out;
  Tensor y = out.detach();
  return record("tanh", out, {x}, [y](const Tensor& g, GradInputs& gi) {
    gi[0] = backward_kernel(g, y, "tanh_backward", []<class T>(VecMap<T> o, ConstVecMap<T> gg, ConstVecMap<T> yy) {
      o = gg * (T(1) - yy.square());
    });
  });
}

// d sigmoid(x) = g * y * (1 - y)
Tensor sigmoid(const Tensor& x) {
  // With e = exp(-|x|) <= 1 nothing overflows: y = 1/(1+e) for x >= 0 and e/(1+e) for x < 0.
  Tensor out = unary_kernel(x, "sigmoid", []<class T>(VecMap<T> o, ConstVecMap<T> a) {
    o = -a.abs();
    exp_in_place<T>(o);
    o = (a >= T(0)).select(T(1) / (T(1) + o), o / (T(1) + o));
  });
  if (!any_requires_grad({x})) return out;
  Tensor y = out.detach();
  return record("sigmoid", out, {x}, [y](const Tensor& g, GradInputs& gi) {
    gi[0] = backward_kernel(g, y, "sigmoid_backward", []<class T>(VecMap<T> o, ConstVecMap<T> gg, ConstVecMap<T> yy) {
      o = gg * yy * (T(1) - yy);
    });
  });
}

// d relu(x) = g * [x > 0] = g * [y > 0]
Tensor relu(const Tensor& x) {
  Tensor out = unary_kernel(x, "relu", []<class T>(VecMap<T> o, ConstVecMap<T> a) {
    o = (a > T(0)).select(a, T(0));
  });
  if (!any_requires_grad({x})) return out;
  Tensor y = out.detach();
  return record("relu", out, {x}, [y](const Tensor& g, GradInputs& gi) {
    gi[0] = backward_kernel(g, y, "relu_backward", []<class T>(VecMap<T> o, ConstVecMap<T> gg, ConstVecMap<T> yy) {
      o = (yy > T(0)).select(gg, T(0));
    });
  });
}

Tensor gelu(const Tensor& x, std::string_view approximate) {
  const bool use_tanh = approximate == "tanh";
  ATTO_CHECK(use_tanh || approximate == "none", "gelu", "approximate must be \"none\" or \"tanh\", got \"",
             std::string(approximate), "\"");
  Tensor out;
  if (use_tanh) {
    // y = x/2 * (1 + tanh(u)), u = sqrt(2/pi) * (x + 0.044715 x^3)
    out = unary_kernel(x, "gelu", []<class T>(VecMap<T> o, ConstVecMap<T> a) {
      o = (T(kSqrt2OverPi) * (a + T(kGeluCubic) * a.cube())).tanh();
      o = T(0.5) * a * (T(1) + o);
    });
  } else {
    // y = x * Phi(x), Phi(x) = (1 + erf(x / sqrt(2))) / 2
    out = unary_kernel(x, "gelu", []<class T>(VecMap<T> o, ConstVecMap<T> a) {
      o = T(0.5) * a * (T(1) + (a * T(kSqrt1_2)).erf());
    });
  }
  if (!any_requires_grad({x})) return out;
  Tensor xs = x.detach();
  if (use_tanh) {
    // d gelu_tanh(x) = g * (0.5 (1 + t) + 0.5 x (1 - t^2) sqrt(2/pi) (1 + 3 * 0.044715 x^2)), t = tanh(u)
    return record("gelu", out, {x}, [xs](const Tensor& g, GradInputs& gi) {
      gi[0] = backward_kernel(g, xs, "gelu_backward", []<class T>(VecMap<T> o, ConstVecMap<T> gg, ConstVecMap<T> xx) {
        o = (T(kSqrt2OverPi) * (xx + T(kGeluCubic) * xx.cube())).tanh();
        o = gg * (T(0.5) * (T(1) + o) +
                  T(0.5) * xx * (T(1) - o.square()) * T(kSqrt2OverPi) * (T(1) + T(3 * kGeluCubic) * xx.square()));
      });
    });
  }
  // d gelu(x) = g * (Phi(x) + x * phi(x)), phi(x) = exp(-x^2 / 2) / sqrt(2 pi). One chunk at a time, so that the three
  // passes (the exponent, its exp, the product) stay in L1: over whole (B, L, F) activations they each went to
  // memory (a GELU backward of 393K elements: 3.9 cycles an element).
  return record("gelu", out, {x}, [xs](const Tensor& g, GradInputs& gi) {
    gi[0] = backward_kernel(g, xs, "gelu_backward", []<class T>(VecMap<T> o, ConstVecMap<T> gg, ConstVecMap<T> xx) {
      constexpr Eigen::Index kChunk = 1024;
      for (Eigen::Index s = 0; s < o.size(); s += kChunk) {
        const Eigen::Index m = std::min(kChunk, o.size() - s);
        VecMap<T> oc(o.data() + s, m);
        const ConstVecMap<T> gc(gg.data() + s, m), xc(xx.data() + s, m);
        oc = T(-0.5) * xc.square();
        exp_in_place<T>(oc);
        oc = gc * (T(0.5) * (T(1) + (xc * T(kSqrt1_2)).erf()) + xc * T(kInvSqrt2Pi) * oc);
      }
    });
  });
}

}  // namespace attograd
