// The umbrella header in the source tree: "attograd.h" alone is enough to build, train and check a model.

#include <gtest/gtest.h>

#include "attograd.h"

namespace attograd {
namespace {

TEST(Umbrella, OneIncludeBuildsATrainsAndChecksAModel) {
  Generator gen(1);
  nn::Linear model(3, 2, true, gen);
  model.to(kFloat64);
  Tensor x = randn({4, 3}, gen, {.dtype = kFloat64});
  Tensor y = randn({4, 2}, gen, {.dtype = kFloat64});
  optim::SGD opt(model.named_parameters(), {.lr = 0.1});
  double first = 0, last = 0;
  for (int step = 0; step < 10; ++step) {
    opt.zero_grad();
    Tensor loss = mse_loss(model.forward(x), y);
    loss.backward();
    opt.step();
    (step == 0 ? first : last) = loss.item();
  }
  EXPECT_LT(last, first);
  const checks::CheckResult r = checks::run_checks("Linear", {}).front();
  EXPECT_TRUE(r.result.passed) << r.result.message;
}

}  // namespace
}  // namespace attograd
