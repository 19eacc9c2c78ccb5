#include "autograd/dropout.h"

#include <algorithm>
#include <cmath>

#include "autograd/activation.h"
#include "autograd/cpu/kernels.h"
#include "autograd/elementwise.h"
#include "autograd/parallel.h"

namespace attograd {

namespace {

void check_probability(double p, const char* op) {
  ATTO_CHECK(p >= 0.0 && p <= 1.0, op, "dropout probability has to be between 0 and 1, but got p = ", p);
}

// An element is kept when its 32-bit draw is >= this threshold: probability (2^32 - t) / 2^32 = 1 - p.
uint64_t keep_threshold(double p) { return static_cast<uint64_t>(std::llround(p * 4294967296.0)); }

// Generator is PCG32: next_u32() returns xsh_rr(state) and steps state = state * kPcgMultiplier + inc.
constexpr uint64_t kPcgMultiplier = 6364136223846793005ULL;

constexpr int64_t kBlock = 4096;  // elements per block of keep bits (a multiple of 16)

// The LCG state `delta` steps after s (Brown, "Random number generation with arbitrary strides", 1994: the jump's
// multiplier and increment by repeated squaring).
uint64_t lcg_advance(uint64_t s, uint64_t inc, uint64_t delta) {
  uint64_t mul = kPcgMultiplier, add = inc, acc_mul = 1, acc_add = 0;
  for (; delta > 0; delta >>= 1) {
    if (delta & 1) {
      acc_mul *= mul;
      acc_add = acc_add * mul + add;
    }
    add = (mul + 1) * add;
    mul *= mul;
  }
  return acc_mul * s + acc_add;
}

// Calls f(start, len, words) for the consecutive blocks [start, start + len) of [0, n) (len <= kBlock), words holding
// the block's keep bits exactly as n sequential draws from gen give them (the draw_keep_bits kernel). Blocks run in
// parallel, each from gen's state advanced to its first draw, so the bits never depend on the thread count; gen ends n
// draws further, as after the sequential draws.
template <class F>
void for_keep_blocks(Generator& gen, int64_t n, uint64_t threshold, F&& f) {
  const GeneratorState st = gen.get_state();
  const int64_t blocks = (n + kBlock - 1) / kBlock;
  const auto draw_keep_bits = ATTO_CPU(draw_keep_bits);
  parallel_for(0, blocks, 8, [&](int64_t b0, int64_t b1) {
    uint64_t state = lcg_advance(st.state, st.inc, static_cast<uint64_t>(b0 * kBlock));
    uint16_t words[kBlock / 16];
    for (int64_t b = b0; b < b1; ++b) {
      const int64_t start = b * kBlock, len = std::min(kBlock, n - start);
      state = draw_keep_bits(state, st.inc, len, threshold, words);
      f(start, len, words);
    }
  });
  gen.set_state({lcg_advance(st.state, st.inc, static_cast<uint64_t>(n)), st.inc});
}

// dst[i] = base[i] + src[i] * (keep_i ? scale : 0) (base may be null: no addition), keep_i drawn exactly as
// dropout_mask draws its n flags from gen (which advances by n draws). The backward replays a mask by calling this
// with a generator restored to the state the forward started from, so no mask is stored.
template <class T>
void apply_keep(Generator& gen, uint64_t threshold, double scale, int64_t n, const T* base, const T* src, T* dst) {
  const T s = static_cast<T>(scale);
  const auto apply_keep_block = ATTO_CPU(apply_keep_block<T>);
  for_keep_blocks(gen, n, threshold, [&](int64_t start, int64_t len, const uint16_t* words) {
    apply_keep_block(words, len, s, base ? base + start : nullptr, src + start, dst + start);
  });
}

}  // namespace

Tensor dropout_mask(const Shape& shape, double p, Generator& gen, Dtype dtype) {
  check_probability(p, "dropout_mask");
  ATTO_CHECK(dtype != kInt64, "dropout_mask", "dtype must be float32, float64 or bool, got ", dtype_name(dtype));
  Tensor mask = empty(shape, {.dtype = dtype});
  if (p == 0.0 || p == 1.0) {  // deterministic: no draws
    fill_(mask, p == 0.0 ? 1.0 : 0.0);
    return mask;
  }
  const int64_t n = mask.numel();
  const uint64_t threshold = keep_threshold(p);
  dispatch_all(dtype, [&]<typename T>() {
    const T kept = dtype == kBool ? T(1) : static_cast<T>(1.0 / (1.0 - p));
    T* q = static_cast<T*>(mask.raw_data());
    for_keep_blocks(gen, n, threshold, [&](int64_t start, int64_t len, const uint16_t* words) {
      for (int64_t i = 0; i < len; ++i) q[start + i] = (words[i / 16] >> (i % 16)) & 1 ? kept : T(0);
    });
  });
  return mask;
}

// y = x * m / (1 - p) with m ~ Bernoulli(1 - p); dy/dx = m / (1 - p).
Tensor dropout(const Tensor& x, double p, bool training, Generator& gen) {
  ATTO_CHECK(x.defined(), "dropout", "called with an undefined tensor");
  check_probability(p, "dropout");
  ATTO_CHECK(is_floating(x.dtype()), "dropout", "expected a float32 or float64 tensor, got ", dtype_name(x.dtype()),
             " of shape ", x.shape());
  if (!training || p == 0.0) return x;
  if (p == 1.0) {
    Tensor out = zeros(x.shape(), {.dtype = x.dtype()});
    return record("dropout", out, {x},
                  [](const Tensor& g, GradInputs& gi) { gi[0] = zeros(g.shape(), {.dtype = g.dtype()}); });
  }
  // The mask is drawn as dropout_mask(x.shape(), p, gen, kBool) would draw it; the backward replays it from the
  // generator state the forward started from instead of keeping it (no memory per element).
  const GeneratorState start = gen.get_state();
  const uint64_t threshold = keep_threshold(p);
  const double scale = 1.0 / (1.0 - p);
  const int64_t n = x.numel();
  Tensor out = empty(x.shape(), {.dtype = x.dtype()});
  dispatch_float(x.dtype(), "dropout",
                 [&]<typename T>() { apply_keep<T>(gen, threshold, scale, n, nullptr, x.data<T>(), out.data<T>()); });
  if (!any_requires_grad({x})) return out;
  return record("dropout", out, {x}, [start, threshold, scale](const Tensor& g, GradInputs& gi) {
    Tensor dx = reuse_or_empty_like(g);  // elementwise: may overwrite g
    Generator replay;
    replay.set_state(start);
    dispatch_float(g.dtype(), "dropout_backward", [&]<typename T>() {
      apply_keep<T>(replay, threshold, scale, g.numel(), nullptr, g.data<T>(), dx.data<T>());
    });
    gi[0] = dx;
  });
}

// y = relu(x) * m / (1 - p). Where y > 0 the element was positive and kept: dy/dx = 1 / (1 - p); elsewhere 0.
namespace {

// relu_dropout; `temporary` is x when the caller handed it over as an rvalue (its storage may take the result).
Tensor relu_dropout_impl(const Tensor& x, double p, bool training, Generator& gen, Tensor* temporary) {
  ATTO_CHECK(x.defined(), "relu_dropout", "called with an undefined tensor");
  check_probability(p, "relu_dropout");
  ATTO_CHECK(is_floating(x.dtype()), "relu_dropout", "expected a float32 or float64 tensor, got ",
             dtype_name(x.dtype()), " of shape ", x.shape());
  if (!training || p == 0.0) return relu(x);
  if (p == 1.0) return dropout(relu(x), p, training, gen);
  const double scale = 1.0 / (1.0 - p);
  const uint64_t threshold = keep_threshold(p);
  const int64_t n = x.numel();
  const bool save = any_requires_grad({x});
  // Element i of the result depends on element i of x only, so it may be written over a temporary x.
  Tensor out = temporary ? reuse_temporary_or_empty(std::move(*temporary)) : empty(x.shape(), {.dtype = x.dtype()});
  Tensor mask = save ? empty({(n + 7) / 8}, {.dtype = kBool}) : Tensor();  // bit i: out[i] > 0
  uint8_t* bits = save ? static_cast<uint8_t*>(mask.raw_data()) : nullptr;
  dispatch_float(x.dtype(), "relu_dropout", [&]<typename T>() {
    const T s = static_cast<T>(scale);
    const T* px = x.data<T>();
    T* q = out.data<T>();
    // Blocks of keep bits (the draws dropout_mask makes), then applied (kBlock is a multiple of 16: each block
    // fills whole bytes of the saved mask; 1 bit per element instead of the output, so an FFN's hidden layer is kept
    // by the next linear only and freed by its backward).
    const auto relu_keep_block = ATTO_CPU(relu_keep_block<T>);
    const auto positive_bits = ATTO_CPU(positive_bits<T>);
    for_keep_blocks(gen, n, threshold, [&](int64_t start, int64_t len, const uint16_t* words) {
      relu_keep_block(words, len, s, px + start, q + start);
      if (bits) positive_bits(q + start, len, bits + start / 8);  // the block is still in L1
    });
  });
  if (!save) return out;
  return record("relu_dropout", out, {x}, [mask, scale](const Tensor& g, GradInputs& gi) {
    Tensor dx = reuse_or_empty_like(g);  // elementwise: may overwrite g
    dispatch_float(g.dtype(), "relu_dropout_backward", [&]<typename T>() {
      const auto masked_scale = ATTO_CPU(masked_scale<T>);
      masked_scale(static_cast<const uint8_t*>(mask.raw_data()), g.data<T>(), static_cast<T>(scale), dx.data<T>(),
                   g.numel());
    });
    gi[0] = dx;
  });
}

}  // namespace

Tensor relu_dropout(const Tensor& x, double p, bool training, Generator& gen) {
  return relu_dropout_impl(x, p, training, gen, nullptr);
}

Tensor relu_dropout(Tensor&& x, double p, bool training, Generator& gen) {
  return relu_dropout_impl(x, p, training, gen, &x);
}

// out = x + y * m / (1 - p); d out / dx = 1, d out / dy = m / (1 - p).
namespace {

// dropout_add; `temporary` is y when the caller handed it over as an rvalue (its storage may take the result).
Tensor dropout_add_impl(const Tensor& x, const Tensor& y, double p, bool training, Generator& gen, Tensor* temporary) {
  ATTO_CHECK(x.defined() && y.defined(), "dropout_add", "called with an undefined tensor");
  check_probability(p, "dropout_add");
  ATTO_CHECK(x.shape() == y.shape() && x.dtype() == y.dtype(), "dropout_add", "x ", x.shape(), " (",
             dtype_name(x.dtype()), ") and y ", y.shape(), " (", dtype_name(y.dtype()),
             ") must have the same shape and dtype");
  ATTO_CHECK(is_floating(x.dtype()), "dropout_add", "expected float32 or float64 tensors, got ", dtype_name(x.dtype()));
  if (!training || p == 0.0 || p == 1.0) return add(x, dropout(y, p, training, gen));
  const GeneratorState start = gen.get_state();  // the backward replays the mask from here (nothing stored)
  const uint64_t threshold = keep_threshold(p);
  const double scale = 1.0 / (1.0 - p);
  const int64_t n = x.numel();
  // Element i of the result depends on element i of x and y only, so it may be written over a temporary y.
  Tensor out = temporary ? reuse_temporary_or_empty(std::move(*temporary)) : empty(x.shape(), {.dtype = x.dtype()});
  dispatch_float(x.dtype(), "dropout_add", [&]<typename T>() {
    apply_keep<T>(gen, threshold, scale, n, x.data<T>(), y.data<T>(), out.data<T>());
  });
  if (!any_requires_grad({x, y})) return out;
  return record("dropout_add", out, {x, y}, [start, threshold, scale](const Tensor& g, GradInputs& gi) {
    if (gi.needs(0)) gi[0] = g;
    if (!gi.needs(1)) return;
    Tensor dy = gi.needs(0) ? empty(g.shape(), {.dtype = g.dtype()}) : reuse_or_empty_like(g);
    Generator replay;
    replay.set_state(start);
    dispatch_float(g.dtype(), "dropout_add_backward", [&]<typename T>() {
      apply_keep<T>(replay, threshold, scale, g.numel(), nullptr, g.data<T>(), dy.data<T>());
    });
    gi[1] = dy;
  });
}

}  // namespace

Tensor dropout_add(const Tensor& x, const Tensor& y, double p, bool training, Generator& gen) {
  return dropout_add_impl(x, y, p, training, gen, nullptr);
}

Tensor dropout_add(const Tensor& x, Tensor&& y, double p, bool training, Generator& gen) {
  return dropout_add_impl(x, y, p, training, gen, &y);
}

}  // namespace attograd
