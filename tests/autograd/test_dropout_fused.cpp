// relu_dropout and dropout_add: the fused ops give exactly the values, mask draws and gradients of the ops they
// replace.

#include "autograd/dropout.h"
#include "testing.h"

using namespace attograd;
using namespace attograd::testing;

TEST(ReluDropout, EqualsDropoutOfRelu) {
  for (Dtype dt : {kFloat32, kFloat64}) {
    for (int64_t n : {1, 15, 4096, 10001}) {  // below, at and past one 4096-flag block
      Generator gen(3);
      Tensor x = randn({n}, gen, {.dtype = dt}).requires_grad_();
      Tensor x2 = x.detach().clone().requires_grad_();
      Generator g1(8), g2(8);
      Tensor y = relu_dropout(x, 0.3, true, g1);
      Tensor r = dropout(relu(x2), 0.3, true, g2);
      EXPECT_EQ(y.grad_fn_name(), "relu_dropout");
      EXPECT_TRUE(all_close(y, r, 0));
      EXPECT_EQ(g1.get_state(), g2.get_state());  // the same number of draws
      Tensor g = randn({n}, gen, {.dtype = dt});
      y.backward(g);
      r.backward(g);
      EXPECT_TRUE(all_close(x.grad(), x2.grad(), 0));
    }
  }
}

TEST(ReluDropout, EvalZeroAndOneProbability) {
  Generator gen(4);
  Tensor x = randn({3, 5}, gen);
  const GeneratorState s = gen.get_state();
  EXPECT_TRUE(all_close(relu_dropout(x, 0.5, false, gen), relu(x), 0));
  EXPECT_TRUE(all_close(relu_dropout(x, 0.0, true, gen), relu(x), 0));
  EXPECT_EQ(gen.get_state(), s);
  EXPECT_TRUE(all_close(relu_dropout(x, 1.0, true, gen), zeros({3, 5}), 0));
  EXPECT_ATTO_ERROR(relu_dropout(x, 1.5), "between 0 and 1");
  EXPECT_ATTO_ERROR(relu_dropout(zeros({2}, {.dtype = kInt64}), 0.5), "float32 or float64");
}

TEST(ReluDropout, Gradcheck) {
  Generator gen(5);
  Tensor x = rand_leaf({4, 7}, gen, 0.1, 1.0);  // away from relu's kink
  auto* p = x.data<double>();
  for (int64_t i = 0; i < x.numel(); i += 3) p[i] = -p[i];
  auto f = [&]() {
    Generator g(6);
    return relu_dropout(x, 0.4, true, g);
  };
  EXPECT_GRADCHECK(f, {x});
}

TEST(DropoutAdd, EqualsAddOfDropout) {
  for (Dtype dt : {kFloat32, kFloat64}) {
    Generator gen(7);
    Tensor x = randn({6, 50}, gen, {.dtype = dt}).requires_grad_(), y = randn({6, 50}, gen, {.dtype = dt}).requires_grad_();
    Tensor x2 = x.detach().clone().requires_grad_(), y2 = y.detach().clone().requires_grad_();
    Generator g1(9), g2(9);
    Tensor out = dropout_add(x, y, 0.2, true, g1);
    Tensor ref = x2 + dropout(y2, 0.2, true, g2);
    EXPECT_EQ(out.grad_fn_name(), "dropout_add");
    // x + y * s may be one fused multiply-add: within an ulp of the operands (values below 8 here).
    EXPECT_TRUE(all_close(out, ref, dt == kFloat32 ? 1e-6 : 2e-15));
    EXPECT_EQ(g1.get_state(), g2.get_state());
    Tensor g = randn({6, 50}, gen, {.dtype = dt});
    out.backward(g);
    ref.backward(g);
    EXPECT_TRUE(all_close(x.grad(), x2.grad(), 0));
    EXPECT_TRUE(all_close(y.grad(), y2.grad(), 0));
  }
}

TEST(DropoutAdd, GradcheckEvalAndErrors) {
  Generator gen(8);
  Tensor x = rand_leaf({3, 4}, gen), y = rand_leaf({3, 4}, gen);
  auto f = [&]() {
    Generator g(2);
    return dropout_add(x, y, 0.5, true, g);
  };
  EXPECT_GRADCHECK(f, {x, y});
  auto same = [&]() {
    Generator g(2);
    return dropout_add(x, x, 0.5, true, g);  // one tensor as both operands
  };
  EXPECT_GRADCHECK(same, {x});
  EXPECT_TRUE(all_close(dropout_add(x, y, 0.5, false, gen), x + y, 0));
  EXPECT_ATTO_ERROR(dropout_add(x, zeros({4, 3}, {.dtype = kFloat64}), 0.5), "must have the same shape and dtype");
  EXPECT_ATTO_ERROR(dropout_add(x, y, -0.5), "between 0 and 1");
}

// Handed a temporary, both ops write their result over its storage (one buffer less); the values and gradients are
// those of the lvalue call. A temporary that something else can still see (a saved or viewed storage) and an lvalue
// are never overwritten.
TEST(FusedDropout, TemporaryInputsAreReusedOnlyWhenNothingElseSeesThem) {
  for (Dtype dt : {kFloat32, kFloat64}) {
    Generator gen(5);
    Tensor w = randn({6, 5}, gen, {.dtype = dt}).requires_grad_();
    Tensor x = randn({7, 5}, gen, {.dtype = dt});
    Tensor base = randn({7, 6}, gen, {.dtype = dt}).requires_grad_();
    Tensor g = randn({7, 6}, gen, {.dtype = dt});
    auto run = [&](bool temporary, Tensor* w_grad, Tensor* base_grad) {
      w.zero_grad();
      base.zero_grad();
      Generator d(11);
      Tensor h;
      const void* hidden_data = nullptr;
      if (temporary) {
        Tensor pre = matmul(x, transpose(w, 0, 1));  // (7, 6); matmul does not keep its output
        hidden_data = pre.raw_data();
        h = relu_dropout(std::move(pre), 0.25, true, d);
        EXPECT_EQ(h.raw_data(), hidden_data) << "relu_dropout should reuse its temporary input";
      } else {
        Tensor pre = matmul(x, transpose(w, 0, 1));
        Tensor copy = pre.detach().clone();
        h = relu_dropout(pre, 0.25, true, d);
        EXPECT_NE(h.raw_data(), pre.raw_data());
        EXPECT_TRUE(all_close(pre, copy, 0));  // an lvalue input is left alone
      }
      Tensor out;
      if (temporary) {
        out = dropout_add(base, h * 2.0, 0.25, true, d);
      } else {
        Tensor branch = h * 2.0;
        Tensor copy = branch.detach().clone();
        out = dropout_add(base, branch, 0.25, true, d);
        EXPECT_TRUE(all_close(branch, copy, 0));  // an lvalue branch is left alone
      }
      out.backward(g);
      *w_grad = w.grad().clone();
      *base_grad = base.grad().clone();
      return out.detach().clone();
    };
    Tensor wg1, bg1, wg2, bg2;
    Tensor a = run(true, &wg1, &bg1), b = run(false, &wg2, &bg2);
    EXPECT_TRUE(all_close(a, b, 0));
    EXPECT_TRUE(all_close(wg1, wg2, 0));
    EXPECT_TRUE(all_close(bg1, bg2, 0));

    // exp keeps its output for the backward: a temporary from exp must not be overwritten.
    Generator d(12);
    Tensor e = exp(base);
    Tensor keep = e.detach();  // another owner of the storage
    Tensor e_copy = keep.clone();
    Tensor y = relu_dropout(std::move(e), 0.5, true, d);
    EXPECT_NE(y.raw_data(), keep.raw_data());
    EXPECT_TRUE(all_close(keep, e_copy, 0));
    // exp's temporary output is saved by exp's backward: the result goes to a new buffer, and the gradient through
    // exp is the one of the lvalue call.
    Generator d1(13), d2(13);
    base.zero_grad();
    Tensor z = dropout_add(base, exp(base), 0.5, true, d1);
    z.backward(g);
    Tensor gz = base.grad().clone();
    base.zero_grad();
    Tensor ex = exp(base);
    Tensor z2 = dropout_add(base, ex, 0.5, true, d2);
    z2.backward(g);
    EXPECT_TRUE(all_close(z, z2, 0));
    EXPECT_TRUE(all_close(gz, base.grad(), 0));
  }
}
