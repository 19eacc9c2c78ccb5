// Autocast (autograd/autocast.h): linear, matmul and attention take bfloat16 operands under it (float32 only), their
// backward runs in the precision of their forward, float64 is never touched, and the switch nests.

#include <gtest/gtest.h>

#include "autograd/autograd.h"
#include "autograd/gemm.h"
#include "testing.h"

using namespace attograd;
using namespace attograd::testing;

namespace {

// A float32 leaf with values that bf16 cannot hold (uniform in [-1, 1)).
Tensor leaf32(const Shape& s, Generator& gen) {
  Tensor t = rand(s, gen) * 2.0 - 1.0;
  t = t.detach();
  t.requires_grad_(true);
  return t;
}

// Runs f on every bf16 GEMM path this machine has (the AVX512-BF16 kernel, the portable one).
template <class F>
void on_every_path(F f) {
  const bool native = detail::gemm_bf16_native();
  for (bool use_native : {true, false}) {
    if (use_native && !native) continue;
    detail::set_gemm_bf16_native(use_native);
    SCOPED_TRACE(use_native ? "AVX512-BF16 kernel" : "portable path");
    f();
  }
  detail::set_gemm_bf16_native(true);
}

}  // namespace

TEST(Autocast, NestsAndRestores) {
  EXPECT_EQ(autocast_precision(), Precision::float32);
  {
    Autocast on;
    EXPECT_EQ(autocast_precision(), Precision::bfloat16);
    {
      Autocast off(false);
      EXPECT_EQ(autocast_precision(), Precision::float32);
    }
    EXPECT_EQ(autocast_precision(), Precision::bfloat16);
  }
  EXPECT_EQ(autocast_precision(), Precision::float32);
  EXPECT_EQ(parse_precision("bf16"), Precision::bfloat16);
  EXPECT_EQ(parse_precision("bfloat16"), Precision::bfloat16);
  EXPECT_EQ(parse_precision("fp32"), Precision::float32);
  EXPECT_ATTO_ERROR(parse_precision("fp16"), "unknown precision 'fp16'");
}

TEST(Autocast, RoundToBf16PassesTheGradientThrough) {
  Generator gen(1);
  Tensor x = leaf32({3, 5}, gen);
  Tensor y = round_to_bf16(x);
  for (float v : y.to_vector<float>()) EXPECT_EQ(v, detail::round_bf16(v));
  EXPECT_FALSE(bitwise_equal(y, x.detach()));
  sum(y * y.detach()).backward();
  EXPECT_TRUE(bitwise_equal(x.grad(), y.detach()));
  Tensor d = rand({4}, gen, {.dtype = kFloat64});
  EXPECT_TRUE(bitwise_equal(round_to_bf16(d), d));
}

// linear under autocast = linear of the rounded operands (float32 accumulation); its three gradients are the
// products of the rounded G, X and W, computed after the scope ended.
TEST(Autocast, LinearTakesBf16OperandsForwardAndBackward) {
  on_every_path([] {
    Generator gen(2);
    Tensor x = leaf32({4, 7, 96}, gen), w = leaf32({40, 96}, gen), b = leaf32({40}, gen);
    Tensor y;
    {
      Autocast on;
      y = linear(x, w, b);
    }
    Tensor g = rand({4, 7, 40}, gen) - 0.5;
    y.backward(g);
    NoGradGuard no_grad;
    const Tensor xr = round_to_bf16(x.detach()), wr = round_to_bf16(w.detach()), gr = round_to_bf16(g);
    EXPECT_TRUE(all_close(y.detach(), linear(xr, wr, b.detach()), 1e-5));
    EXPECT_FALSE(all_close(y.detach(), linear(x.detach(), w.detach(), b.detach()), 1e-4));
    EXPECT_TRUE(all_close(x.grad(), matmul(gr, wr), 1e-5));
    EXPECT_TRUE(all_close(w.grad(), matmul(transpose(reshape(gr, {28, 40}), 0, 1), reshape(xr, {28, 96})), 1e-5));
    EXPECT_TRUE(all_close(b.grad(), sum(g, {0, 1}), 1e-5));  // the bias gradient is a float32 sum
  });
}

TEST(Autocast, MatmulTakesBf16OperandsWithBroadcasting) {
  on_every_path([] {
    Generator gen(3);
    Tensor a = leaf32({2, 3, 5, 33}, gen), b = leaf32({3, 33, 17}, gen);
    Tensor y;
    {
      Autocast on;
      y = matmul(a, b);
    }
    Tensor g = rand({2, 3, 5, 17}, gen) - 0.5;
    y.backward(g);
    NoGradGuard no_grad;
    const Tensor ar = round_to_bf16(a.detach()), br = round_to_bf16(b.detach()), gr = round_to_bf16(g);
    EXPECT_TRUE(all_close(y.detach(), matmul(ar, br), 1e-5));
    EXPECT_TRUE(all_close(a.grad(), matmul(gr, transpose(br, 1, 2)), 1e-5));
    EXPECT_TRUE(all_close(b.grad(), sum(matmul(transpose(ar, 2, 3), gr), {0}), 1e-5));
  });
}

// Attention's q, k and v enter rounded: the same bits as attention of the rounded inputs, gradients passed through.
TEST(Autocast, AttentionTakesBf16Inputs) {
  Generator gen(4);
  Tensor q = leaf32({2, 3, 9, 16}, gen), k = leaf32({2, 3, 9, 16}, gen), v = leaf32({2, 3, 9, 16}, gen);
  AttentionOptions o;
  o.is_causal = true;
  Tensor y;
  {
    Autocast on;
    y = scaled_dot_product_attention(q, k, v, o).output;
  }
  Tensor g = rand({2, 3, 9, 16}, gen) - 0.5;
  y.backward(g);
  Tensor qr = round_to_bf16(q.detach()), kr = round_to_bf16(k.detach()), vr = round_to_bf16(v.detach());
  qr.requires_grad_(true);
  kr.requires_grad_(true);
  vr.requires_grad_(true);
  Tensor yr = scaled_dot_product_attention(qr, kr, vr, o).output;
  yr.backward(g);
  EXPECT_TRUE(bitwise_equal(y.detach(), yr.detach()));
  EXPECT_TRUE(bitwise_equal(q.grad(), qr.grad()));
  EXPECT_TRUE(bitwise_equal(k.grad(), kr.grad()));
  EXPECT_TRUE(bitwise_equal(v.grad(), vr.grad()));
}

// float64 (gradcheck's type) is never touched: the same bits with and without autocast.
TEST(Autocast, LeavesFloat64Alone) {
  Generator gen(5);
  Tensor x = rand_leaf({6, 20}, gen), w = rand_leaf({8, 20}, gen);
  Tensor plain = linear(x, w), cast;
  {
    Autocast on;
    cast = linear(x, w);
    EXPECT_TRUE(bitwise_equal(matmul(x, transpose(w, 0, 1)), matmul(x, transpose(w, 0, 1))));
  }
  EXPECT_TRUE(bitwise_equal(plain, cast));
  EXPECT_GRADCHECK(
      [&] {
        Autocast on;
        return linear(x, w);
      },
      {x, w});
}

// A checkpointed function recomputes in the precision of its forward, even when the backward runs outside the
// Autocast: the same gradients, bit for bit, as without checkpointing.
TEST(Autocast, CheckpointRecomputesInTheForwardsPrecision) {
  Generator gen(6);
  Tensor x = leaf32({5, 24}, gen), w = leaf32({16, 24}, gen), v = leaf32({8, 16}, gen);
  Tensor plain, ckpt;
  {
    Autocast on;
    plain = sum(linear(relu(linear(x, w)), v));
  }
  plain.backward();
  const Tensor gx = x.grad().detach(), gw = w.grad().detach();
  x.zero_grad(true);
  w.zero_grad(true);
  {
    Autocast on;
    ckpt =
        sum(checkpoint([&](const std::vector<Tensor>& in) { return linear(relu(linear(in[0], in[1])), v); }, {x, w}));
  }
  ckpt.backward();  // outside the Autocast: the recomputation must still take bf16 operands
  EXPECT_TRUE(bitwise_equal(x.grad(), gx));
  EXPECT_TRUE(bitwise_equal(w.grad(), gw));
}
