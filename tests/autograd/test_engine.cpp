#include "testing.h"

using namespace attograd;
using namespace attograd::testing;

TEST(Engine, ScalarBackwardSeedsOne) {
  Tensor x = from_vector<double>({2.0}, {}, {.dtype = kFloat64, .requires_grad = true});
  Tensor y = x * x * 3.0;
  y.backward();
  EXPECT_DOUBLE_EQ(x.grad().item(), 12.0);
}
