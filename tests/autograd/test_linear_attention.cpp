// linear_attention: equal in float64 to the explicit L x L formulation (forward and gradients, causal and not,
// Lq != Lk), gradcheck in float64, float32 close to float64, the linear cost (no L x L buffer), and the errors.

#include <gtest/gtest.h>

#include "autograd/activation.h"
#include "autograd/elementwise.h"
#include "autograd/indexing.h"
#include "autograd/linear_attention.h"
#include "autograd/matmul.h"
#include "autograd/reduce.h"
#include "autograd/shape.h"
#include "testing.h"

namespace attograd {
namespace {

// phi(x) = elu(x) + 1 composed: relu(x) + exp(-relu(-x)) (x + 1 above 0, exp(x) below).
Tensor phi(const Tensor& x) { return add(relu(x), exp(neg(relu(neg(x))))); }

// The quadratic reference: A_ij = phi(q_i) . phi(k_j) (0 where j > i when causal), out_i = sum_j A_ij v_j /
// (sum_j A_ij + eps).
Tensor reference(const Tensor& q, const Tensor& k, const Tensor& v, bool causal, double eps = 1e-6) {
  Tensor a = matmul(phi(q), transpose(phi(k), -1, -2));  // (..., Lq, Lk)
  if (causal) {
    const int64_t l = q.size(-2);
    Tensor keep = zeros({l, l}, {.dtype = q.dtype()});
    for (int64_t i = 0; i < l; ++i)
      for (int64_t j = 0; j <= i; ++j) keep.set({i, j}, 1.0);
    a = mul(a, keep);
  }
  return div(matmul(a, v), add(sum(a, {-1}, true), eps));
}

struct Case {
  Shape q, k, v;
  bool causal;
};

class LinearAttentionVsReference : public ::testing::TestWithParam<Case> {};

TEST_P(LinearAttentionVsReference, ForwardAndGradientsMatchInFloat64) {
  const Case c = GetParam();
  Generator gen(17);
  Tensor q = testing::rand_leaf(c.q, gen, -2, 2), k = testing::rand_leaf(c.k, gen, -2, 2),
         v = testing::rand_leaf(c.v, gen);
  Shape ws = c.q;
  ws.back() = c.v.back();
  Tensor w = rand(ws, gen, {.dtype = kFloat64});
  Tensor fused = linear_attention(q, k, v, c.causal);
  EXPECT_EQ(fused.grad_fn_name(), "linear_attention");
  sum(mul(fused, w)).backward();
  const Tensor gq = q.grad().clone(), gk = k.grad().clone(), gv = v.grad().clone();
  q.zero_grad(true);
  k.zero_grad(true);
  v.zero_grad(true);
  Tensor ref = reference(q, k, v, c.causal);
  sum(mul(ref, w)).backward();
  EXPECT_TRUE(testing::all_close(fused, ref, 1e-13, 1e-12));
  EXPECT_TRUE(testing::all_close(gq, q.grad(), 1e-13, 1e-12));
  EXPECT_TRUE(testing::all_close(gk, k.grad(), 1e-13, 1e-12));
  EXPECT_TRUE(testing::all_close(gv, v.grad(), 1e-13, 1e-12));
}

TEST_P(LinearAttentionVsReference, Gradcheck) {
  const Case c = GetParam();
  Generator gen(18);
  Tensor q = testing::rand_leaf(c.q, gen, -2, 2), k = testing::rand_leaf(c.k, gen, -2, 2),
         v = testing::rand_leaf(c.v, gen);
  EXPECT_TRUE(testing::gradcheck_ok([&] { return linear_attention(q, k, v, c.causal); }, {q, k, v}));
}

INSTANTIATE_TEST_SUITE_P(Shapes, LinearAttentionVsReference,
                         ::testing::Values(Case{{2, 3, 5, 4}, {2, 3, 5, 4}, {2, 3, 5, 3}, false},
                                           Case{{2, 3, 5, 4}, {2, 3, 5, 4}, {2, 3, 5, 3}, true},
                                           Case{{2, 4, 3}, {2, 6, 3}, {2, 6, 5}, false},  // Lq != Lk, d_k != d_v
                                           Case{{1, 7, 2}, {1, 7, 2}, {1, 7, 2}, true}));

TEST(LinearAttention, Float32AgreesWithFloat64) {
  Generator gen(19);
  for (bool causal : {false, true}) {
    Tensor q = rand({2, 2, 64, 16}, gen, {.dtype = kFloat64}), k = rand({2, 2, 64, 16}, gen, {.dtype = kFloat64}),
           v = rand({2, 2, 64, 16}, gen, {.dtype = kFloat64});
    Tensor q32 = q.to(kFloat32).requires_grad_(true), k32 = k.to(kFloat32).requires_grad_(true),
           v32 = v.to(kFloat32).requires_grad_(true);
    q.requires_grad_(true);
    k.requires_grad_(true);
    v.requires_grad_(true);
    Tensor o64 = linear_attention(q, k, v, causal), o32 = linear_attention(q32, k32, v32, causal);
    EXPECT_TRUE(testing::all_close(o32, o64, 1e-5, 1e-5));
    sum(mul(o64, o64)).backward();
    sum(mul(o32, o32)).backward();
    EXPECT_TRUE(testing::all_close(q32.grad(), q.grad(), 1e-4, 1e-4));
    EXPECT_TRUE(testing::all_close(k32.grad(), k.grad(), 1e-4, 1e-4));
    EXPECT_TRUE(testing::all_close(v32.grad(), v.grad(), 1e-4, 1e-4));
  }
}

TEST(LinearAttention, CausalRowsSeeOnlyThePast) {
  // Changing the last key and value changes only the last causal output row.
  Generator gen(20);
  Tensor q = rand({1, 6, 4}, gen, {.dtype = kFloat64}), k = rand({1, 6, 4}, gen, {.dtype = kFloat64}),
         v = rand({1, 6, 4}, gen, {.dtype = kFloat64});
  Tensor a = linear_attention(q, k, v, true);
  k.set({0, 5, 0}, 3.0);
  v.set({0, 5, 1}, -3.0);
  Tensor b = linear_attention(q, k, v, true);
  EXPECT_TRUE(testing::bitwise_equal(narrow(a, 1, 0, 5), narrow(b, 1, 0, 5)));
  EXPECT_NE(a.at({0, 5, 1}), b.at({0, 5, 1}));
  // The first causal row is v_0 scaled by phi(q_0).phi(k_0) / (phi(q_0).phi(k_0) + eps).
  EXPECT_NEAR(a.at({0, 0, 2}), v.at({0, 0, 2}), 1e-6);
}

TEST(LinearAttention, Errors) {
  Tensor q = zeros({2, 3, 4}), k = zeros({2, 5, 4}), v = zeros({2, 5, 2});
  EXPECT_NO_THROW(linear_attention(q, k, v, false));
  try {
    linear_attention(q, k, v, true);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("Lq == Lk"), std::string::npos) << e.what();
  }
  EXPECT_THROW(linear_attention(q, zeros({2, 5, 3}), v), Error);              // d_k differs
  EXPECT_THROW(linear_attention(q, k, zeros({2, 4, 2})), Error);              // Lk differs
  EXPECT_THROW(linear_attention(q, k, v.to(kFloat64)), Error);                // dtype
  EXPECT_THROW(linear_attention(zeros({3, 3, 4}), k, v), Error);              // batch
  EXPECT_THROW(linear_attention(q, k, v, false, 0.0), Error);                 // eps
  EXPECT_THROW(linear_attention(zeros({4}), zeros({4}), zeros({4})), Error);  // rank
}

}  // namespace
}  // namespace attograd
