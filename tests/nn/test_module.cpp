// Module registration, names, modes, counting, dtype conversion and the init functions.

#include "nn/init.h"
#include "nn/module.h"
#include "testing.h"

using namespace attograd;
using namespace attograd::testing;
using namespace attograd::nn;

namespace {
struct Leaf : Module {
  Tensor w, b, buf;
  Leaf() {
    w = register_parameter("weight", zeros({3, 2}));
    b = register_parameter("bias", zeros({3}));
    buf = register_buffer("table", ones({4}));
  }
  std::string type_name() const override { return "Leaf"; }
};
struct Tree : Module {
  std::shared_ptr<Leaf> a, c;
  Tree() {
    a = register_module("a", std::make_shared<Leaf>());
    register_parameter("scale", ones({1}));
    c = register_module("c", std::make_shared<Leaf>());
  }
  std::string type_name() const override { return "Tree"; }
};
}  // namespace

TEST(Module, NamedParametersInRegistrationOrder) {
  Tree t;
  std::vector<std::string> names;
  for (auto& [n, p] : t.named_parameters()) names.push_back(n);
  EXPECT_EQ(names, (std::vector<std::string>{"scale", "a.weight", "a.bias", "c.weight", "c.bias"}));
  std::vector<std::string> bufs;
  for (auto& [n, p] : t.named_buffers()) bufs.push_back(n);
  EXPECT_EQ(bufs, (std::vector<std::string>{"a.table", "c.table"}));
  EXPECT_EQ(t.num_parameters(), 1 + 2 * (6 + 3));
  EXPECT_EQ(t.parameters().size(), 5u);
  EXPECT_EQ(t.named_parameters(false).size(), 1u);
  EXPECT_TRUE(t.parameter("c.bias").is_same(t.c->b));
  EXPECT_ATTO_ERROR(t.parameter("c.nope"), "no parameter named 'c.nope'");
  std::vector<std::string> mods;
  for (auto& [n, m] : t.named_modules()) mods.push_back(n);
  EXPECT_EQ(mods, (std::vector<std::string>{"", "a", "c"}));
}

TEST(Module, ParametersRequireGradAndTiedOnesCountOnce) {
  Tree t;
  for (auto& p : t.parameters()) EXPECT_TRUE(p.requires_grad());
  Module m;
  Tensor shared = zeros({5});
  m.register_parameter("x", shared);
  auto child = m.register_module("child", std::make_shared<Module>());
  child->register_parameter("tied", shared);
  EXPECT_EQ(m.named_parameters().size(), 1u);
  EXPECT_EQ(m.num_parameters(), 5);
}

TEST(Module, TrainEvalPropagates) {
  Tree t;
  EXPECT_TRUE(t.is_training());
  t.eval();
  EXPECT_FALSE(t.is_training());
  EXPECT_FALSE(t.a->is_training());
  EXPECT_FALSE(t.c->is_training());
  t.train();
  EXPECT_TRUE(t.c->is_training());
}

TEST(Module, ZeroGrad) {
  Leaf l;
  (l.w * 2.0).backward(ones({3, 2}));
  EXPECT_EQ(l.w.grad().to_vector<float>(), std::vector<float>(6, 2.f));
  l.zero_grad();
  EXPECT_EQ(l.w.grad().to_vector<float>(), std::vector<float>(6, 0.f));
  l.zero_grad(true);
  EXPECT_FALSE(l.w.grad().defined());
}

TEST(Module, ToDoubleConvertsInPlaceForEveryHandle) {
  Tree t;
  Tensor held = t.a->w;
  held.set({0, 0}, 1.5);
  t.to(kFloat64);
  EXPECT_EQ(held.dtype(), kFloat64);
  EXPECT_EQ(t.a->buf.dtype(), kFloat64);
  EXPECT_DOUBLE_EQ(held.at({0, 0}), 1.5);
  EXPECT_TRUE(held.requires_grad());
}

TEST(Module, RegistrationErrors) {
  Leaf l;
  EXPECT_ATTO_ERROR(l.register_parameter("weight", zeros({1})), "name 'weight' is already a parameter");
  EXPECT_ATTO_ERROR(l.register_buffer("a.b", zeros({1})), "invalid name 'a.b'");
  EXPECT_ATTO_ERROR(l.forward(zeros({1})), "Leaf: this module does not take a single tensor");
}

TEST(Module, ToStringNestsChildren) {
  Tree t;
  EXPECT_EQ(t.to_string(), "Tree(\n  (a): Leaf()\n  (c): Leaf()\n)");
}

TEST(Init, XavierUniformBoundsAndSpread) {
  Generator g(1);
  Tensor w = zeros({200, 300}, {.dtype = kFloat64});
  init::xavier_uniform_(w, 1.0, g);
  double a = std::sqrt(6.0 / 500.0), mx = 0, s2 = 0;
  for (double v : w.to_vector<double>()) {
    mx = std::max(mx, std::fabs(v));
    s2 += v * v;
  }
  EXPECT_LE(mx, a);
  EXPECT_GT(mx, 0.99 * a);
  EXPECT_NEAR(s2 / w.numel(), a * a / 3.0, 0.02 * a * a / 3.0);
}

TEST(Init, XavierNormalKaimingAndConstants) {
  Generator g(2);
  Tensor w = zeros({400, 100}, {.dtype = kFloat64});
  init::xavier_normal_(w, 2.0, g);
  double s2 = 0;
  for (double v : w.to_vector<double>()) s2 += v * v;
  double std = 2.0 * std::sqrt(2.0 / 500.0);
  EXPECT_NEAR(std::sqrt(s2 / w.numel()), std, 0.02 * std);
  Tensor k = zeros({50, 64}, {.dtype = kFloat64});
  init::kaiming_uniform_(k, std::sqrt(5.0), "fan_in", g);  // nn.Linear's default: bound 1/sqrt(in)
  for (double v : k.to_vector<double>()) EXPECT_LE(std::fabs(v), 1.0 / 8.0 + 1e-12);
  init::ones_(k);
  EXPECT_DOUBLE_EQ(k.at({3, 3}), 1.0);
  init::zeros_(k);
  EXPECT_DOUBLE_EQ(k.at({3, 3}), 0.0);
  EXPECT_ATTO_ERROR(init::xavier_uniform_(zeros({3})), "at least 2 dimensions, got shape [3]");
  EXPECT_ATTO_ERROR(init::kaiming_uniform_(zeros({3, 3}), 0, "fan_xx"), "mode must be fan_in or fan_out");
  EXPECT_DOUBLE_EQ(init::calculate_gain("relu"), std::sqrt(2.0));
}

TEST(Init, SameSeedSameWeights) {
  Generator a(9), b(9);
  Tensor x = zeros({4, 4}), y = zeros({4, 4});
  init::xavier_uniform_(x, 1.0, a);
  init::xavier_uniform_(y, 1.0, b);
  EXPECT_EQ(x.to_vector<float>(), y.to_vector<float>());
}
