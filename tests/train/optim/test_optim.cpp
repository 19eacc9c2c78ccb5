// Optimizers (SGD, Adam, AdamW) and gradient clipping: PyTorch 1.13 trajectories (golden files from
// tests/train/optim/golden_optim.py), with one list of parameters and with two parameter groups, hand-computed steps,
// state export/restore, option and state errors.

#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <set>

#include "nn/layers.h"
#include "nn/module.h"
#include "testing.h"
#include "train/optim/optimizers.h"
#include "train/optim/schedule.h"

using namespace attograd;
using namespace attograd::testing;
using namespace attograd::optim;

namespace {

const std::map<std::string, Tensor>& golden() {
  static const std::map<std::string, Tensor> g = load_golden("train/optim.golden");
  return g;
}

Tensor gold(const std::string& name) {
  auto it = golden().find(name);
  if (it == golden().end()) throw Error("test", "no golden tensor " + name);
  return it->second;
}

// Slice k of the first dimension, as a new tensor of the remaining shape.
Tensor row(const Tensor& t, int64_t k) {
  Shape rest(t.shape().begin() + 1, t.shape().end());
  Tensor out = empty(rest, {.dtype = t.dtype()});
  const size_t bytes = out.nbytes();
  std::memcpy(out.raw_data(), static_cast<const char*>(t.raw_data()) + static_cast<size_t>(k) * bytes, bytes);
  return out;
}

// A fresh leaf holding a copy of t, requiring grad.
Tensor leaf_copy(const Tensor& t) {
  Tensor c = empty(t.shape(), {.dtype = t.dtype()});
  if (t.nbytes()) std::memcpy(c.raw_data(), t.raw_data(), t.nbytes());
  c.requires_grad_(true);
  return c;
}

Tensor copy_of(const Tensor& t) {
  Tensor c = empty(t.shape(), {.dtype = t.dtype()});
  if (t.nbytes()) std::memcpy(c.raw_data(), t.raw_data(), t.nbytes());
  return c;
}

using Factory = std::function<std::unique_ptr<Optimizer>(const std::vector<Tensor>&)>;

struct Case {
  std::string name;
  Factory make;
  std::set<int> p1_skipped;  // steps at which parameter 1 has no gradient
  bool step_lr = false;      // StepLR(2, 0.5) stepped after each optimizer step
};

// Runs the golden case in float64 ("f64") or float32 ("f32") and matches every parameter after every step,
// and the final state against PyTorch's optimizer.state.
void run_case(const Case& c, const std::string& tag) {
  SCOPED_TRACE(c.name + " " + tag);
  const double atol = tag == "f64" ? 1e-12 : 1e-6, rtol = atol;
  std::vector<Tensor> params = {leaf_copy(gold("init." + tag + ".p0")), leaf_copy(gold("init." + tag + ".p1"))};
  std::unique_ptr<Optimizer> opt = c.make(params);
  std::unique_ptr<StepLR> sched;
  if (c.step_lr) sched = std::make_unique<StepLR>(*opt, 2, 0.5);
  for (int k = 0; k < 5; ++k) {
    for (int i = 0; i < 2; ++i) {
      const bool skip = i == 1 && c.p1_skipped.count(k);
      params[i].set_grad(skip ? Tensor() : row(gold("grads." + tag + ".p" + std::to_string(i)), k));
    }
    opt->step();
    if (sched) sched->step();
    for (int i = 0; i < 2; ++i) {
      Tensor expected = row(gold(c.name + "." + tag + ".p" + std::to_string(i)), k);
      EXPECT_TRUE(all_close(params[i], expected, atol, rtol)) << "parameter " << i << " after step " << k + 1;
    }
  }
  EXPECT_EQ(opt->step_count(), 5);
  // The exported state has exactly PyTorch's keys and values.
  const std::string prefix = c.name + "." + tag + ".state.";
  std::set<std::string> expected_names;
  for (const auto& [name, _] : golden())
    if (name.rfind(prefix, 0) == 0) expected_names.insert(name.substr(prefix.size()));
  std::set<std::string> names;
  for (const auto& [name, t] : opt->state_tensors()) {
    names.insert(name);
    if (!expected_names.count(name)) continue;
    Tensor expected = gold(prefix + name);
    if (name.ends_with(".step")) {
      EXPECT_EQ(t.dtype(), kFloat64);
      EXPECT_EQ(t.item(), expected.item()) << name;
    } else {
      EXPECT_EQ(t.dtype(), params[0].dtype()) << name;
      EXPECT_TRUE(all_close(t, expected, atol, rtol)) << name;
    }
  }
  EXPECT_EQ(names, expected_names);
}

template <class O, class Opts>
Factory make(Opts o) {
  return [o](const std::vector<Tensor>& p) { return std::make_unique<O>(p, o); };
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Trajectories against PyTorch

TEST(SGD, MatchesPyTorchTrajectories) {
  const std::vector<Case> cases = {
      {"sgd_plain", make<SGD>(SGDOptions{.lr = 0.1}), {}},
      {"sgd_weight_decay_only", make<SGD>(SGDOptions{.lr = 0.1, .weight_decay = 0.1}), {}},
      {"sgd_momentum", make<SGD>(SGDOptions{.lr = 0.1, .momentum = 0.9}), {}},
      {"sgd_dampening", make<SGD>(SGDOptions{.lr = 0.1, .momentum = 0.9, .dampening = 0.3}), {}},
      {"sgd_nesterov", make<SGD>(SGDOptions{.lr = 0.1, .momentum = 0.9, .nesterov = true}), {}},
      {"sgd_weight_decay", make<SGD>(SGDOptions{.lr = 0.1, .momentum = 0.5, .weight_decay = 0.05}), {}},
      {"sgd_nesterov_wd_skip",
       make<SGD>(SGDOptions{.lr = 0.05, .momentum = 0.8, .weight_decay = 0.1, .nesterov = true}),
       {0, 2}},
  };
  for (const auto& c : cases)
    for (const char* tag : {"f64", "f32"}) run_case(c, tag);
}

TEST(Adam, MatchesPyTorchTrajectories) {
  const std::vector<Case> cases = {
      {"adam_plain", make<Adam>(AdamOptions{.lr = 0.01}), {}},
      {"adam_seed", make<Adam>(AdamOptions{.lr = 0.01, .betas = {0.9, 0.98}, .eps = 1e-9}), {}},
      {"adam_weight_decay", make<Adam>(AdamOptions{.lr = 0.01, .weight_decay = 0.1}), {}},
      {"adam_amsgrad", make<Adam>(AdamOptions{.lr = 0.01, .amsgrad = true}), {}},
      {"adam_amsgrad_wd", make<Adam>(AdamOptions{.lr = 0.02, .weight_decay = 0.05, .amsgrad = true}), {}},
      {"adam_skip", make<Adam>(AdamOptions{.lr = 0.01}), {1, 2}},
      {"adam_steplr", make<Adam>(AdamOptions{.lr = 0.1}), {}, true},
  };
  for (const auto& c : cases)
    for (const char* tag : {"f64", "f32"}) run_case(c, tag);
}

TEST(AdamW, MatchesPyTorchTrajectories) {
  const std::vector<Case> cases = {
      {"adamw", make<AdamW>(AdamWOptions{.lr = 0.01}), {}},
      {"adamw_wd_amsgrad", make<AdamW>(AdamWOptions{.lr = 0.01, .weight_decay = 0.1, .amsgrad = true}), {}},
  };
  for (const auto& c : cases)
    for (const char* tag : {"f64", "f32"}) run_case(c, tag);
}

// ---------------------------------------------------------------------------------------------
// Hand-computed steps

TEST(SGD, HandComputedSteps) {
  Tensor p = from_vector<double>({1.0, -2.0}, {2});
  p.requires_grad_(true);
  SGD opt({p}, {.lr = 0.1, .momentum = 0.5, .dampening = 0.2, .weight_decay = 0.1});
  p.set_grad(from_vector<double>({0.5, 1.0}, {2}));
  opt.step();
  // g = (0.5 + 0.1*1, 1 - 0.1*2) = (0.6, 0.8); b = g; p = (1 - 0.06, -2 - 0.08)
  EXPECT_DOUBLE_EQ(p.flat(0), 0.94);
  EXPECT_DOUBLE_EQ(p.flat(1), -2.08);
  opt.step();
  // g = (0.5 + 0.094, 1 - 0.208) = (0.594, 0.792); b = 0.5*(0.6, 0.8) + 0.8*g = (0.7752, 1.0336)
  EXPECT_NEAR(p.flat(0), 0.94 - 0.1 * 0.7752, 1e-15);
  EXPECT_NEAR(p.flat(1), -2.08 - 0.1 * 1.0336, 1e-15);
  auto st = opt.state_tensors();
  ASSERT_EQ(st.size(), 1u);
  EXPECT_EQ(st[0].first, "0.momentum_buffer");
  EXPECT_NEAR(st[0].second.flat(0), 0.7752, 1e-15);
}

TEST(SGD, NesterovHandComputed) {
  Tensor p = zeros({1}, {.dtype = kFloat64, .requires_grad = true});
  SGD opt({p}, {.lr = 1.0, .momentum = 0.9, .nesterov = true});
  p.set_grad(full({1}, 1.0, {.dtype = kFloat64}));
  opt.step();  // b = 1; g = 1 + 0.9 = 1.9
  EXPECT_DOUBLE_EQ(p.flat(0), -1.9);
  opt.step();  // b = 0.9 + 1 = 1.9; g = 1 + 0.9*1.9 = 2.71
  EXPECT_DOUBLE_EQ(p.flat(0), -1.9 - 2.71);
}

TEST(Adam, HandComputedFirstSteps) {
  Tensor p = from_vector<double>({1.0, 2.0}, {2});
  p.requires_grad_(true);
  Adam opt({p}, {.lr = 0.1, .betas = {0.9, 0.99}, .eps = 1e-8});
  p.set_grad(from_vector<double>({0.5, -2.0}, {2}));
  opt.step();
  // t = 1: mhat = g, vhat = g^2, so p -= lr * g / (|g| + eps)
  EXPECT_NEAR(p.flat(0), 1.0 - 0.1 * 0.5 / (0.5 + 1e-8), 1e-15);
  EXPECT_NEAR(p.flat(1), 2.0 + 0.1 * 2.0 / (2.0 + 1e-8), 1e-15);
  p.set_grad(from_vector<double>({1.0, -2.0}, {2}));
  const double p0 = p.flat(0);
  opt.step();
  // t = 2: m = 0.9*0.05 + 0.1*1 = 0.145, v = 0.99*0.0025 + 0.01*1 = 0.012475
  const double m = 0.145, v = 0.012475;
  const double expected = p0 - (0.1 / (1 - 0.81)) * m / (std::sqrt(v) / std::sqrt(1 - 0.9801) + 1e-8);
  EXPECT_NEAR(p.flat(0), expected, 1e-15);
}

TEST(AdamW, DecoupledDecayHandComputed) {
  // With a zero gradient m = v = 0, so the only change is p *= 1 - lr * wd.
  Tensor p = full({3}, 2.0, {.dtype = kFloat64, .requires_grad = true});
  AdamW opt({p}, {.lr = 0.1, .weight_decay = 0.5});
  p.set_grad(zeros({3}, {.dtype = kFloat64}));
  opt.step();
  for (int i = 0; i < 3; ++i) EXPECT_DOUBLE_EQ(p.flat(i), 2.0 * (1 - 0.05));
  // Adam's L2 decay instead feeds wd * p into the gradient: first step moves by lr (sign of p).
  Tensor q = full({3}, 2.0, {.dtype = kFloat64, .requires_grad = true});
  Adam adam({q}, {.lr = 0.1, .weight_decay = 0.5});
  q.set_grad(zeros({3}, {.dtype = kFloat64}));
  adam.step();
  EXPECT_NEAR(q.flat(0), 2.0 - 0.1 * 1.0 / (1.0 + 1e-8), 1e-15);
}

// ---------------------------------------------------------------------------------------------
// Parameters, names, state

TEST(Optimizer, NamedParametersKeyTheState) {
  struct Net : nn::Module {
    Net() {
      auto child = std::make_shared<nn::Module>();
      child->register_parameter("weight", ones({2, 3}));
      register_module("layer", child);
      register_parameter("scale", ones({1}));
    }
  } net;
  Adam opt(net.named_parameters(), {.lr = 0.01, .amsgrad = true});
  ASSERT_EQ(opt.named_params().size(), 2u);
  EXPECT_EQ(opt.named_params()[0].first, "scale");  // a module's own parameters come before its children's
  EXPECT_EQ(opt.type_name(), "Adam");
  EXPECT_TRUE(opt.state_tensors().empty());
  for (auto& p : net.parameters()) p.set_grad(ones_like(p));
  opt.step();
  std::vector<std::string> names;
  for (auto& [n, t] : opt.state_tensors()) names.push_back(n);
  EXPECT_EQ(names, (std::vector<std::string>{"scale.step", "scale.exp_avg", "scale.exp_avg_sq", "scale.max_exp_avg_sq",
                                             "layer.weight.step", "layer.weight.exp_avg", "layer.weight.exp_avg_sq",
                                             "layer.weight.max_exp_avg_sq"}));
  // The module's own parameters moved (the optimizer shares their data).
  EXPECT_NEAR(net.parameter("scale").flat(0), 1.0 - 0.01, 1e-6);
}

TEST(Optimizer, PlainParametersAreNumbered) {
  Tensor a = ones({2}, {.requires_grad = true}), b = ones({3}, {.requires_grad = true});
  SGD opt({a, b}, {.lr = 0.1, .momentum = 0.9});
  EXPECT_EQ(opt.named_params()[0].first, "0");
  EXPECT_EQ(opt.named_params()[1].first, "1");
  EXPECT_EQ(opt.params().size(), 2u);
  EXPECT_TRUE(opt.params()[1].is_same(b));
}

TEST(Optimizer, SkipsParametersWithoutGradient) {
  Tensor a = ones({2}, {.requires_grad = true}), b = ones({2}, {.requires_grad = true});
  Adam opt({a, b}, {.lr = 0.1});
  a.set_grad(ones({2}));
  opt.step();
  EXPECT_EQ(b.flat(0), 1.0);
  for (auto& [n, t] : opt.state_tensors()) EXPECT_EQ(n.rfind("0.", 0), 0u) << n;
  // b's first step later is its own step 1 (bias correction from t = 1), as in PyTorch.
  b.set_grad(ones({2}));
  opt.step();
  EXPECT_NEAR(b.flat(0), 1.0 - 0.1, 1e-6);
  EXPECT_EQ(opt.step_count(), 2);
  for (auto& [n, t] : opt.state_tensors()) {
    if (n == "0.step") {
      EXPECT_EQ(t.item(), 2.0);
    }
    if (n == "1.step") {
      EXPECT_EQ(t.item(), 1.0);
    }
  }
}

TEST(Optimizer, StepsInPlaceWithoutAllocatingOrRecording) {
  Tensor w = randn({4, 5}, default_generator(), {.requires_grad = true});
  AdamW opt({w}, {.lr = 0.01, .amsgrad = true});
  const void* data = w.raw_data();
  w.set_grad(ones({4, 5}));
  opt.step();
  std::vector<const void*> buffers;
  for (auto& [n, t] : opt.state_tensors())
    if (!n.ends_with(".step")) buffers.push_back(t.raw_data());
  ASSERT_EQ(buffers.size(), 3u);
  for (int k = 0; k < 3; ++k) opt.step();
  EXPECT_EQ(w.raw_data(), data);
  size_t j = 0;
  for (auto& [n, t] : opt.state_tensors())
    if (!n.ends_with(".step")) {
      EXPECT_EQ(t.raw_data(), buffers[j++]) << n;
    }
  EXPECT_TRUE(w.is_leaf());
  EXPECT_TRUE(w.requires_grad());
  EXPECT_TRUE(is_grad_enabled());
}

TEST(Optimizer, ZeroGrad) {
  Tensor a = ones({2}, {.requires_grad = true}), b = ones({2}, {.requires_grad = true});
  SGD opt({a, b}, {.lr = 0.1});
  (a * b).backward(ones({2}));
  const void* g = a.grad().raw_data();
  opt.zero_grad();
  ASSERT_TRUE(a.grad().defined());
  EXPECT_EQ(a.grad().raw_data(), g);
  EXPECT_EQ(a.grad().flat(0), 0.0);
  EXPECT_EQ(b.grad().flat(1), 0.0);
  opt.zero_grad(/*set_to_none=*/true);
  EXPECT_FALSE(a.grad().defined());
  EXPECT_FALSE(b.grad().defined());
}

TEST(Optimizer, LearningRateAccessors) {
  Tensor a = ones({2}, {.requires_grad = true});
  SGD opt({a}, {.lr = 0.5});
  EXPECT_EQ(opt.lr(), 0.5);
  opt.set_lr(0.25);
  EXPECT_EQ(opt.lr(), 0.25);
  EXPECT_EQ(opt.initial_lr(), 0.5);
  EXPECT_EQ(opt.options().lr, 0.5);
  a.set_grad(ones({2}));
  opt.step();
  EXPECT_FLOAT_EQ(static_cast<float>(a.flat(0)), 0.75f);
  EXPECT_ATTO_ERROR(opt.set_lr(-1.0), "invalid learning rate lr=-1");
  EXPECT_ATTO_ERROR(opt.set_lr(std::nan("")), "invalid learning rate lr=nan");
  EXPECT_EQ(opt.lr(), 0.25);
}

// ---------------------------------------------------------------------------------------------
// State round trip

namespace {
// Steps `a` twice, restores its state into `b` (built over copies of a's parameters), then steps both three
// more times with the same gradients: parameters and state must stay bitwise equal.
void check_round_trip(const Factory& make_opt, Dtype dtype) {
  Generator gen(7);
  std::vector<Tensor> pa = {randn({3, 4}, gen, {.dtype = dtype}), randn({4}, gen, {.dtype = dtype})};
  for (auto& p : pa) p.requires_grad_(true);
  std::vector<std::vector<Tensor>> grads(5);
  for (auto& g : grads) g = {randn({3, 4}, gen, {.dtype = dtype}), randn({4}, gen, {.dtype = dtype})};
  auto a = make_opt(pa);
  for (int k = 0; k < 2; ++k) {
    for (int i = 0; i < 2; ++i) pa[i].set_grad(copy_of(grads[k][i]));
    a->step();
  }
  std::vector<Tensor> pb = {leaf_copy(pa[0]), leaf_copy(pa[1])};
  auto b = make_opt(pb);
  b->load_state(a->state_tensors(), a->step_count());
  EXPECT_EQ(b->step_count(), 2);
  for (int k = 2; k < 5; ++k) {
    for (int i = 0; i < 2; ++i) {
      pa[i].set_grad(copy_of(grads[k][i]));
      pb[i].set_grad(copy_of(grads[k][i]));
    }
    a->step();
    b->step();
    for (int i = 0; i < 2; ++i) EXPECT_TRUE(bitwise_equal(pa[i], pb[i])) << "parameter " << i << " step " << k;
  }
  auto sa = a->state_tensors(), sb = b->state_tensors();
  ASSERT_EQ(sa.size(), sb.size());
  for (size_t j = 0; j < sa.size(); ++j) {
    EXPECT_EQ(sa[j].first, sb[j].first);
    EXPECT_TRUE(bitwise_equal(sa[j].second, sb[j].second)) << sa[j].first;
    EXPECT_NE(sa[j].second.raw_data(), sb[j].second.raw_data()) << "load_state must copy " << sa[j].first;
  }
}
}  // namespace

TEST(Optimizer, StateRoundTripIsBitwise) {
  for (Dtype dt : {kFloat32, kFloat64}) {
    SCOPED_TRACE(dtype_name(dt));
    check_round_trip(make<SGD>(SGDOptions{.lr = 0.1, .momentum = 0.9, .nesterov = true}), dt);
    check_round_trip(make<Adam>(AdamOptions{.lr = 0.01, .amsgrad = true}), dt);
    check_round_trip(make<Adam>(AdamOptions{.lr = 0.01, .weight_decay = 0.1}), dt);
    check_round_trip(make<AdamW>(AdamWOptions{.lr = 0.01}), dt);
  }
}

TEST(Optimizer, LoadStateConvertsDtypeAndFollowsModuleTo) {
  // float64 state into a float32 optimizer is converted to the parameter's dtype.
  Tensor p64 = ones({2}, {.dtype = kFloat64, .requires_grad = true});
  Adam a({p64}, {.lr = 0.1});
  p64.set_grad(full({2}, 0.5, {.dtype = kFloat64}));
  a.step();
  Tensor p32 = ones({2}, {.requires_grad = true});
  Adam b({p32}, {.lr = 0.1});
  b.load_state(a.state_tensors(), 1);
  for (auto& [n, t] : b.state_tensors())
    if (!n.ends_with(".step")) {
      EXPECT_EQ(t.dtype(), kFloat32) << n;
    }
  // A module converted with to() after some steps: the state follows on the next step.
  struct One : nn::Module {
    One() { register_parameter("w", ones({3})); }
  } m;
  SGD opt(m.named_parameters(), {.lr = 0.1, .momentum = 0.9});
  m.parameter("w").set_grad(ones({3}));
  opt.step();
  m.to(kFloat64);
  m.parameter("w").set_grad(ones({3}, {.dtype = kFloat64}));
  opt.step();
  EXPECT_EQ(opt.state_tensors().at(0).second.dtype(), kFloat64);
  EXPECT_NEAR(m.parameter("w").flat(0), 1.0 - 0.1 - 0.1 * 1.9, 1e-6);
}

TEST(Optimizer, LoadStateErrors) {
  Tensor w = ones({2, 3}, {.requires_grad = true});
  Adam opt({{"fc.weight", w}}, {.lr = 0.1});
  w.set_grad(ones({2, 3}));
  opt.step();
  const NamedTensors good = opt.state_tensors();
  auto with = [&](const std::string& name, Tensor t) {
    NamedTensors s;
    for (auto& [n, v] : good) s.emplace_back(n, n == name ? t : v);
    return s;
  };
  auto without = [&](const std::string& name) {
    NamedTensors s;
    for (auto& [n, v] : good)
      if (n != name) s.emplace_back(n, v);
    return s;
  };
  EXPECT_ATTO_ERROR(opt.load_state({{"fc.bias.exp_avg", zeros({3})}}, 1),
                    "no parameter of this optimizer (no 'fc.bias')");
  EXPECT_ATTO_ERROR(opt.load_state({{"fc.exp_avg", zeros({3})}}, 1), "names no parameter");
  EXPECT_ATTO_ERROR(opt.load_state({{"noname", zeros({3})}}, 1), "'<parameter>.<key>'");
  EXPECT_ATTO_ERROR(opt.load_state({{"fc.weight.momentum_buffer", zeros({2, 3})}}, 1),
                    "unknown state key 'momentum_buffer' in 'fc.weight.momentum_buffer' (this Adam keeps step, "
                    "exp_avg, exp_avg_sq)");
  EXPECT_ATTO_ERROR(opt.load_state(with("fc.weight.exp_avg", zeros({3, 2})), 1),
                    "'fc.weight.exp_avg' has shape [3, 2] but parameter 'fc.weight' has shape [2, 3]");
  EXPECT_ATTO_ERROR(opt.load_state(with("fc.weight.exp_avg", zeros({2, 3}, {.dtype = kInt64})), 1), "dtype int64");
  EXPECT_ATTO_ERROR(opt.load_state(without("fc.weight.exp_avg_sq"), 1), "missing state 'fc.weight.exp_avg_sq'");
  EXPECT_ATTO_ERROR(opt.load_state(without("fc.weight.step"), 1), "missing state 'fc.weight.step'");
  EXPECT_ATTO_ERROR(opt.load_state(with("fc.weight.step", scalar_tensor(0.0, {.dtype = kFloat64})), 1),
                    "whole number >= 1, got 0");
  EXPECT_ATTO_ERROR(opt.load_state(with("fc.weight.step", scalar_tensor(1.5, {.dtype = kFloat64})), 1),
                    "whole number >= 1, got 1.5");
  EXPECT_ATTO_ERROR(opt.load_state(with("fc.weight.step", zeros({2})), 1), "one-element number");
  NamedTensors twice = good;
  twice.push_back(good[1]);
  EXPECT_ATTO_ERROR(opt.load_state(twice, 1), "appears more than once");
  EXPECT_ATTO_ERROR(opt.load_state(good, -1), "step_count must be >= 0, got -1");
  EXPECT_ATTO_ERROR(opt.load_state({{"fc.weight.exp_avg", Tensor()}}, 1), "is undefined");
  // A failed load leaves the state as it was.
  auto after = opt.state_tensors();
  ASSERT_EQ(after.size(), good.size());
  for (size_t i = 0; i < good.size(); ++i) EXPECT_TRUE(after[i].second.is_same(good[i].second) || i == 0);
  EXPECT_EQ(opt.step_count(), 1);
  // SGD without momentum keeps nothing.
  SGD sgd({w}, {.lr = 0.1});
  EXPECT_ATTO_ERROR(sgd.load_state({{"0.momentum_buffer", zeros({2, 3})}}, 1), "(this SGD keeps nothing)");
  EXPECT_ATTO_ERROR(sgd.load_state({{"0.step", scalar_tensor(1.0)}}, 1), "unknown state key 'step'");
  // An empty state resets.
  opt.load_state({}, 0);
  EXPECT_TRUE(opt.state_tensors().empty());
  EXPECT_EQ(opt.step_count(), 0);
}

// ---------------------------------------------------------------------------------------------
// Option and parameter errors

TEST(Optimizer, OptionErrors) {
  std::vector<Tensor> p = {ones({2}, {.requires_grad = true})};
  EXPECT_ATTO_ERROR(SGD(p, {}),
                    "SGD: invalid learning rate lr=nan (must be finite and >= 0; SGDOptions.lr has no default");
  EXPECT_ATTO_ERROR(SGD(p, {.lr = -0.1}), "invalid learning rate lr=-0.1");
  EXPECT_ATTO_ERROR(SGD(p, {.lr = 0.1, .momentum = -0.5}), "invalid momentum value momentum=-0.5");
  EXPECT_ATTO_ERROR(SGD(p, {.lr = 0.1, .weight_decay = -1}), "invalid weight_decay value weight_decay=-1");
  EXPECT_ATTO_ERROR(SGD(p, {.lr = 0.1, .nesterov = true}),
                    "Nesterov momentum requires a momentum and zero dampening, got momentum=0 dampening=0");
  EXPECT_ATTO_ERROR(SGD(p, {.lr = 0.1, .momentum = 0.9, .dampening = 0.1, .nesterov = true}), "dampening=0.1");
  EXPECT_ATTO_ERROR(Adam(p, {.lr = -1}), "Adam: invalid learning rate lr=-1");
  EXPECT_ATTO_ERROR(Adam(p, {.eps = -1e-8}), "invalid epsilon value eps=-1e-08");
  EXPECT_ATTO_ERROR(Adam(p, {.betas = {1.0, 0.999}}), "invalid beta parameter at index 0: betas.first=1");
  EXPECT_ATTO_ERROR(Adam(p, {.betas = {0.9, -0.1}}), "invalid beta parameter at index 1: betas.second=-0.1");
  EXPECT_ATTO_ERROR(Adam(p, {.weight_decay = -0.1}), "invalid weight_decay value weight_decay=-0.1");
  EXPECT_ATTO_ERROR(AdamW(p, {.betas = {0.9, 1.0}}), "AdamW: invalid beta parameter at index 1: betas.second=1");
  EXPECT_ATTO_ERROR(AdamW(p, {.lr = std::numeric_limits<double>::infinity()}), "AdamW: invalid learning rate lr=inf");
  // Defaults are PyTorch's.
  Adam adam(p);
  EXPECT_EQ(adam.lr(), 1e-3);
  EXPECT_EQ(adam.options().betas.second, 0.999);
  EXPECT_EQ(adam.options().eps, 1e-8);
  AdamW adamw(p);
  EXPECT_EQ(adamw.options().weight_decay, 1e-2);
  EXPECT_EQ(adamw.type_name(), "AdamW");
}

TEST(Optimizer, ParameterErrors) {
  Tensor a = ones({2}, {.requires_grad = true});
  EXPECT_ATTO_ERROR(SGD(std::vector<Tensor>{}, {.lr = 0.1}), "SGD: got an empty parameter list");
  EXPECT_ATTO_ERROR(Adam(std::vector<Tensor>{a, a}), "parameters '0' and '1' are the same tensor");
  EXPECT_ATTO_ERROR(Adam(NamedTensors{{"w", a}, {"w", ones({2})}}), "parameter name 'w' appears more than once");
  EXPECT_ATTO_ERROR(Adam(NamedTensors{{"x", Tensor()}}), "parameter 'x' is undefined");
  EXPECT_ATTO_ERROR(Adam(NamedTensors{{"ids", zeros({2}, {.dtype = kInt64})}}),
                    "parameter 'ids' has dtype int64; only float32 and float64");
  Tensor derived = a * 2.0;
  EXPECT_ATTO_ERROR(Adam(NamedTensors{{"d", derived}}), "parameter 'd' is not a leaf (it comes from 'mul");
}

// ---------------------------------------------------------------------------------------------
// Gradient clipping

TEST(ClipGradNorm, HandComputed) {
  Tensor a = zeros({2}, {.dtype = kFloat64, .requires_grad = true});
  Tensor b = zeros({1}, {.dtype = kFloat64, .requires_grad = true});
  Tensor c = zeros({3}, {.dtype = kFloat64, .requires_grad = true});  // no gradient: skipped
  a.set_grad(from_vector<double>({3.0, 0.0}, {2}));
  b.set_grad(from_vector<double>({-4.0}, {1}));
  EXPECT_DOUBLE_EQ(clip_grad_norm_({a, b, c}, 1.0), 5.0);
  const double coef = 1.0 / (5.0 + 1e-6);
  EXPECT_DOUBLE_EQ(a.grad().flat(0), 3.0 * coef);
  EXPECT_DOUBLE_EQ(b.grad().flat(0), -4.0 * coef);
  EXPECT_FALSE(c.grad().defined());
  // Below the limit: untouched, bitwise.
  a.set_grad(from_vector<double>({0.3, 0.4}, {2}));
  b.set_grad(Tensor());
  EXPECT_DOUBLE_EQ(clip_grad_norm_({a, b}, 1.0), 0.5);
  EXPECT_EQ(a.grad().flat(0), 0.3);
  EXPECT_EQ(a.grad().flat(1), 0.4);
  // Other orders.
  a.set_grad(from_vector<double>({0.3, -0.4}, {2}));
  EXPECT_DOUBLE_EQ(clip_grad_norm_({a}, 10.0, 1.0), 0.7);
  EXPECT_DOUBLE_EQ(clip_grad_norm_({a}, 10.0, std::numeric_limits<double>::infinity()), 0.4);
  EXPECT_NEAR(clip_grad_norm_({a}, 10.0, 3.0), std::cbrt(0.027 + 0.064), 1e-15);
  // No gradients at all.
  EXPECT_EQ(clip_grad_norm_({c}, 1.0), 0.0);
}

TEST(ClipGradNorm, MatchesPyTorch) {
  const std::vector<std::pair<std::string, double>> cases = {{"l2_clipped", 2.0},
                                                             {"l2_unclipped", 2.0},
                                                             {"l1", 1.0},
                                                             {"inf", std::numeric_limits<double>::infinity()},
                                                             {"l3", 3.0}};
  const std::map<std::string, double> max_norms = {
      {"l2_clipped", 1.0}, {"l2_unclipped", 100.0}, {"l1", 0.5}, {"inf", 0.5}, {"l3", 0.7}};
  for (const auto& [name, norm_type] : cases) {
    for (Dtype dt : {kFloat64, kFloat32}) {
      const std::string tag = dt == kFloat64 ? "f64" : "f32";
      SCOPED_TRACE(name + " " + tag);
      const double tol = dt == kFloat64 ? 1e-12 : 1e-6;
      std::vector<Tensor> params;
      for (int i = 0; i < 3; ++i) {
        Tensor g = copy_of(gold("clip.grads.p" + std::to_string(i)).to(dt));  // clipping writes into it
        Tensor p = zeros(g.shape(), {.dtype = dt, .requires_grad = true});
        p.set_grad(g);
        params.push_back(p);
      }
      const double total = clip_grad_norm_(params, max_norms.at(name), norm_type);
      const double expected = gold("clip." + name + "." + tag + ".total").item();
      EXPECT_NEAR(total, expected, tol * std::fabs(expected));
      for (int i = 0; i < 3; ++i)
        EXPECT_TRUE(all_close(params[i].grad(), gold("clip." + name + "." + tag + ".p" + std::to_string(i)), tol, tol))
            << "parameter " << i;
    }
  }
}

TEST(ClipGradNorm, NonFiniteAndErrors) {
  Tensor a = zeros({2}, {.dtype = kFloat64, .requires_grad = true});
  a.set_grad(from_vector<double>({std::nan(""), 1.0}, {2}));
  EXPECT_TRUE(std::isnan(clip_grad_norm_({a}, 1.0)));
  EXPECT_TRUE(std::isnan(a.grad().flat(1)));  // scaled by the NaN coefficient, as PyTorch does
  a.set_grad(from_vector<double>({std::nan(""), 1.0}, {2}));
  EXPECT_ATTO_ERROR(clip_grad_norm_({a}, 1.0, 2.0, /*error_if_nonfinite=*/true), "of the gradients is nan");
  EXPECT_TRUE(std::isnan(clip_grad_norm_({a}, 1.0, std::numeric_limits<double>::infinity())));
  EXPECT_ATTO_ERROR(clip_grad_norm_({a}, -1.0), "clip_grad_norm_: max_norm must be >= 0, got -1");
  EXPECT_ATTO_ERROR(clip_grad_norm_({a}, 1.0, 0.0), "norm_type must be > 0 (or infinity), got 0");
  EXPECT_ATTO_ERROR(clip_grad_norm_({Tensor()}, 1.0), "parameter 0 is undefined");
}

TEST(ClipGradValue, ClampsInPlace) {
  Tensor a = zeros({4}, {.requires_grad = true});
  Tensor b = zeros({1}, {.dtype = kFloat64, .requires_grad = true});
  a.set_grad(from_vector<float>({-3.0f, -0.5f, 0.25f, 2.0f}, {4}));
  const void* data = a.grad().raw_data();
  clip_grad_value_({a, b}, 1.0);
  EXPECT_EQ(a.grad().raw_data(), data);
  EXPECT_EQ(a.grad().to_vector<float>(), (std::vector<float>{-1.0f, -0.5f, 0.25f, 1.0f}));
  EXPECT_FALSE(b.grad().defined());
  EXPECT_ATTO_ERROR(clip_grad_value_({a}, -1.0), "clip_value must be >= 0, got -1");
}

// ---------------------------------------------------------------------------------------------
// Parameter groups

namespace {

// Parameter 0 alone in group 0, parameter 1 in group 1, named "0" and "1" as PyTorch's state_dict numbers them.
template <class G>
std::vector<G> two_groups(const std::vector<Tensor>& p, G g0, G g1) {
  g0.params = numbered({p[0]}, 0);
  g1.params = numbered({p[1]}, 1);
  return {g0, g1};
}

struct GroupCase {
  std::string name;
  std::function<std::unique_ptr<Optimizer>(const std::vector<Tensor>&)> make;
  std::function<std::unique_ptr<LRScheduler>(Optimizer&)> schedule;
};

// Runs a two-group golden case: every parameter after every step, the lr each group's update used, the final state.
void run_group_case(const GroupCase& c, const std::string& tag) {
  SCOPED_TRACE(c.name + " " + tag);
  const double atol = tag == "f64" ? 1e-12 : 1e-6, rtol = atol;
  std::vector<Tensor> params = {leaf_copy(gold("init." + tag + ".p0")), leaf_copy(gold("init." + tag + ".p1"))};
  std::unique_ptr<Optimizer> opt = c.make(params);
  ASSERT_EQ(opt->num_groups(), 2u);
  std::unique_ptr<LRScheduler> sched = c.schedule(*opt);
  const Tensor lrs = gold(c.name + "." + tag + ".lr");  // (5, 2)
  for (int k = 0; k < 5; ++k) {
    for (size_t g = 0; g < 2; ++g) {
      const double want = lrs.flat(k * 2 + static_cast<int64_t>(g));
      EXPECT_NEAR(opt->lr(g), want, 1e-15 * want) << "group " << g << " lr of update " << k + 1;
      EXPECT_EQ(sched->last_lrs()[g], opt->lr(g));
    }
    for (int i = 0; i < 2; ++i) params[i].set_grad(row(gold("grads." + tag + ".p" + std::to_string(i)), k));
    opt->step();
    sched->step();
    for (int i = 0; i < 2; ++i) {
      Tensor expected = row(gold(c.name + "." + tag + ".p" + std::to_string(i)), k);
      EXPECT_TRUE(all_close(params[i], expected, atol, rtol)) << "parameter " << i << " after step " << k + 1;
    }
  }
  const std::string prefix = c.name + "." + tag + ".state.";
  std::set<std::string> expected_names, names;
  for (const auto& [name, _] : golden())
    if (name.rfind(prefix, 0) == 0) expected_names.insert(name.substr(prefix.size()));
  for (const auto& [name, t] : opt->state_tensors()) {
    names.insert(name);
    if (!expected_names.count(name)) continue;
    const Tensor expected = gold(prefix + name);
    if (name.ends_with(".step"))
      EXPECT_EQ(t.item(), expected.item()) << name;
    else
      EXPECT_TRUE(all_close(t, expected, atol, rtol)) << name;
  }
  EXPECT_EQ(names, expected_names);
}

}  // namespace

TEST(ParamGroups, MatchPyTorchTrajectoriesAndSchedules) {
  const std::vector<GroupCase> cases = {
      {"adamw_groups",
       [](const std::vector<Tensor>& p) {
         return std::make_unique<AdamW>(two_groups<AdamParamGroup>(p, {}, {.lr = 0.02, .weight_decay = 0.0}),
                                        AdamWOptions{.lr = 0.01, .betas = {0.9, 0.95}, .weight_decay = 0.1});
       },
       [](Optimizer& o) { return std::make_unique<WarmupCosine>(o, 2, 5, 0.0, WarmupStyle::NanoGPT); }},
      {"adam_groups",
       [](const std::vector<Tensor>& p) {
         return std::make_unique<Adam>(
             two_groups<AdamParamGroup>(
                 p, {}, {.lr = 0.003, .betas = std::pair{0.8, 0.99}, .weight_decay = 0.0, .amsgrad = true}),
             AdamOptions{.lr = 0.01, .weight_decay = 0.05});
       },
       [](Optimizer& o) { return std::make_unique<WarmupCosine>(o, 0, 4, 0.001); }},
      {"sgd_groups",
       [](const std::vector<Tensor>& p) {
         return std::make_unique<SGD>(
             two_groups<SGDParamGroup>(p, {.lr = 0.2},
                                       {.lr = 0.05, .momentum = 0.5, .weight_decay = 0.0, .nesterov = true}),
             SGDOptions{.lr = 0.1, .momentum = 0.9, .weight_decay = 0.1});
       },
       [](Optimizer& o) { return std::make_unique<StepLR>(o, 2, 0.5); }},
  };
  for (const auto& c : cases)
    for (const char* tag : {"f64", "f32"}) run_group_case(c, tag);
}

TEST(ParamGroups, UnsetOptionsComeFromTheDefaults) {
  Tensor w = ones({2, 3}, {.requires_grad = true}), b = ones({3}, {.requires_grad = true});
  Tensor g = ones({3}, {.requires_grad = true});
  AdamW opt({{.params = {{"fc.weight", w}}}, {.params = {{"fc.bias", b}, {"ln.weight", g}}, .weight_decay = 0.0}},
            {.lr = 6e-4, .betas = {0.9, 0.95}, .weight_decay = 0.1});
  EXPECT_EQ(opt.num_groups(), 2u);
  EXPECT_EQ(opt.group_options(0).weight_decay, 0.1);
  EXPECT_EQ(opt.group_options(1).weight_decay, 0.0);
  EXPECT_EQ(opt.group_options(1).betas.second, 0.95);
  EXPECT_EQ(opt.group_options(1).eps, 1e-8);  // AdamWOptions' default
  EXPECT_EQ(opt.group_options(1).lr, 6e-4);
  EXPECT_EQ(opt.options().weight_decay, 0.1);
  EXPECT_EQ(opt.lr(0), 6e-4);
  EXPECT_EQ(opt.lr(1), 6e-4);
  ASSERT_EQ(opt.group_params(1).size(), 2u);
  EXPECT_EQ(opt.group_params(1)[1].first, "ln.weight");
  ASSERT_EQ(opt.named_params().size(), 3u);
  EXPECT_EQ(opt.named_params()[2].first, "ln.weight");
  // set_lr(lr) sets every group; set_lr(g, lr) one.
  opt.set_lr(1, 1e-4);
  EXPECT_EQ(opt.lr(0), 6e-4);
  EXPECT_EQ(opt.lr(1), 1e-4);
  EXPECT_EQ(opt.initial_lr(1), 6e-4);
  opt.set_lr(2e-4);
  EXPECT_EQ(opt.lr(0), 2e-4);
  EXPECT_EQ(opt.lr(1), 2e-4);
  // A step uses each group's own lr and decay: with zero gradients only the decay moves a parameter.
  opt.set_lr(0, 0.5);
  opt.set_lr(1, 0.25);
  for (Tensor p : {w, b, g}) p.set_grad(zeros_like(p));
  opt.step();
  EXPECT_FLOAT_EQ(static_cast<float>(w.flat(0)), 1.0f - 0.5f * 0.1f);
  EXPECT_EQ(b.flat(0), 1.0);
  EXPECT_EQ(g.flat(2), 1.0);
  // SGD: a group without momentum keeps no buffer; one with momentum does.
  Tensor x = ones({2}, {.requires_grad = true}), y = ones({2}, {.requires_grad = true});
  SGD sgd({{.params = {{"x", x}}, .momentum = 0.0}, {.params = {{"y", y}}}}, {.lr = 0.1, .momentum = 0.9});
  x.set_grad(ones({2}));
  y.set_grad(ones({2}));
  sgd.step();
  const NamedTensors st = sgd.state_tensors();
  ASSERT_EQ(st.size(), 1u);
  EXPECT_EQ(st[0].first, "y.momentum_buffer");
  EXPECT_EQ(sgd.group_options(0).momentum, 0.0);
  // An SGD's lr may be given per group only.
  SGD per_group({{.params = {{"x", x}}, .lr = 0.1}, {.params = {{"y", y}}, .lr = 0.2}}, {});
  EXPECT_EQ(per_group.lr(1), 0.2);
}

TEST(ParamGroups, OneGroupIsTheListConstructorBitwise) {
  auto run = [](auto make) {
    Generator gen(3);
    std::vector<Tensor> p = {randn({3, 4}, gen), randn({4}, gen)};
    for (auto& t : p) t.requires_grad_(true);
    std::unique_ptr<Optimizer> opt = make(p);
    for (int k = 0; k < 4; ++k) {
      for (auto& t : p) t.set_grad(randn(t.shape(), gen));
      opt->step();
    }
    return p;
  };
  auto same = [](const std::vector<Tensor>& a, const std::vector<Tensor>& b) {
    for (size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(bitwise_equal(a[i], b[i])) << "parameter " << i;
  };
  same(run([](const std::vector<Tensor>& p) { return std::make_unique<AdamW>(p, AdamWOptions{.lr = 0.01}); }),
       run([](const std::vector<Tensor>& p) {
         return std::make_unique<AdamW>(std::vector<AdamParamGroup>{{.params = numbered(p)}}, AdamWOptions{.lr = 0.01});
       }));
  same(run([](const std::vector<Tensor>& p) {
         return std::make_unique<SGD>(p, SGDOptions{.lr = 0.1, .momentum = 0.9, .weight_decay = 0.01});
       }),
       run([](const std::vector<Tensor>& p) {
         return std::make_unique<SGD>(
             std::vector<SGDParamGroup>{{.params = numbered({p[0]})}, {.params = numbered({p[1]}, 1)}},
             SGDOptions{.lr = 0.1, .momentum = 0.9, .weight_decay = 0.01});
       }));
}

TEST(ParamGroups, StateRoundTripIsBitwise) {
  for (Dtype dt : {kFloat32, kFloat64}) {
    SCOPED_TRACE(dtype_name(dt));
    check_round_trip(
        [](const std::vector<Tensor>& p) {
          return std::make_unique<Adam>(
              two_groups<AdamParamGroup>(p, {.weight_decay = 0.1},
                                         {.lr = 0.03, .betas = std::pair{0.8, 0.9}, .amsgrad = true}),
              AdamOptions{.lr = 0.01});
        },
        dt);
    check_round_trip(
        [](const std::vector<Tensor>& p) {
          return std::make_unique<AdamW>(two_groups<AdamParamGroup>(p, {}, {.weight_decay = 0.0}),
                                         AdamWOptions{.lr = 0.01, .weight_decay = 0.1});
        },
        dt);
    check_round_trip(
        [](const std::vector<Tensor>& p) {
          return std::make_unique<SGD>(two_groups<SGDParamGroup>(p, {.momentum = 0.0}, {.nesterov = true}),
                                       SGDOptions{.lr = 0.1, .momentum = 0.9});
        },
        dt);
  }
}

TEST(ParamGroups, Errors) {
  Tensor a = ones({2}, {.requires_grad = true}), b = ones({2}, {.requires_grad = true});
  EXPECT_ATTO_ERROR(Adam({{.params = {{"a", a}}}, {.params = {{"b", b}}, .betas = std::pair{1.0, 0.9}}}),
                    "Adam: param group 1: invalid beta parameter at index 0: betas.first=1");
  EXPECT_ATTO_ERROR(AdamW({{.params = {{"a", a}}, .eps = -1.0}, {.params = {{"b", b}}}}),
                    "AdamW: param group 0: invalid epsilon value eps=-1");
  EXPECT_ATTO_ERROR(AdamW({{.params = {{"a", a}}}, {.params = {{"b", b}}, .lr = -1.0}}),
                    "AdamW: param group 1: invalid learning rate lr=-1");
  EXPECT_ATTO_ERROR(SGD({{.params = {{"a", a}}, .lr = 0.1}, {.params = {{"b", b}}}}, {}),
                    "SGD: param group 1: invalid learning rate lr=nan");
  EXPECT_ATTO_ERROR(SGD({{.params = {{"a", a}}}, {.params = {{"b", b}}, .nesterov = true}}, {.lr = 0.1}),
                    "SGD: param group 1: Nesterov momentum requires a momentum");
  EXPECT_ATTO_ERROR(SGD({{.params = {{"a", a}}}, {.params = {{"b", b}}, .weight_decay = -1.0}}, {.lr = 0.1}),
                    "param group 1: invalid weight_decay value weight_decay=-1");
  EXPECT_ATTO_ERROR(Adam({{.params = {{"w", a}}}, {.params = {{"w", b}}}}),
                    "parameter name 'w' appears more than once (names must be unique across the parameter groups)");
  EXPECT_ATTO_ERROR(Adam({{.params = {{"a", a}}}, {.params = {{"b", a}}}}),
                    "parameters 'a' and 'b' are the same tensor; some parameters appear more than once (in param "
                    "groups 0 and 1)");
  EXPECT_ATTO_ERROR(Adam(std::vector<AdamParamGroup>{{}, {}}), "Adam: got an empty parameter list");
  // An empty group is allowed (nanoGPT's no-decay group of a model without biases or gains).
  Adam with_empty(std::vector<AdamParamGroup>{{.params = {{"a", a}}}, {}});
  EXPECT_EQ(with_empty.num_groups(), 2u);
  EXPECT_TRUE(with_empty.group_params(1).empty());
  EXPECT_ATTO_ERROR(with_empty.lr(2), "Adam: lr: no param group 2 (this Adam has 2)");
  EXPECT_ATTO_ERROR(with_empty.set_lr(2, 0.1), "set_lr: no param group 2");
  EXPECT_ATTO_ERROR(with_empty.set_lr(1, -0.5), "Adam: param group 1: invalid learning rate lr=-0.5");
  EXPECT_ATTO_ERROR(with_empty.group_options(3), "group_options: no param group 3");
  // State keys follow each group's options.
  Adam opt({{.params = {{"a", a}}, .amsgrad = true}, {.params = {{"b", b}}}}, {.lr = 0.1});
  a.set_grad(ones({2}));
  b.set_grad(ones({2}));
  opt.step();
  NamedTensors st = opt.state_tensors();
  std::vector<std::string> names;
  for (auto& [n, t] : st) names.push_back(n);
  EXPECT_EQ(names, (std::vector<std::string>{"a.step", "a.exp_avg", "a.exp_avg_sq", "a.max_exp_avg_sq", "b.step",
                                             "b.exp_avg", "b.exp_avg_sq"}));
  st.emplace_back("b.max_exp_avg_sq", zeros({2}));
  EXPECT_ATTO_ERROR(opt.load_state(st, 1),
                    "unknown state key 'max_exp_avg_sq' in 'b.max_exp_avg_sq' (this Adam keeps, for param group 1 "
                    "step, exp_avg, exp_avg_sq)");
}

TEST(ParamGroups, SplitByDimIsNanoGPTsDecayRule) {
  const NamedTensors params = {{"wte", ones({5, 4})},
                               {"ln.weight", ones({4})},
                               {"fc.weight", ones({4, 4})},
                               {"fc.bias", ones({4})},
                               {"scale", scalar_tensor(1.0)}};
  const auto [decay, no_decay] = split_by_dim(params);
  std::vector<std::string> d, n;
  for (auto& [name, _] : decay) d.push_back(name);
  for (auto& [name, _] : no_decay) n.push_back(name);
  EXPECT_EQ(d, (std::vector<std::string>{"wte", "fc.weight"}));
  EXPECT_EQ(n, (std::vector<std::string>{"ln.weight", "fc.bias", "scale"}));
  EXPECT_EQ(split_by_dim(params, 1).second.size(), 1u);
  EXPECT_EQ(numbered({ones({1}), ones({1})}, 3).back().first, "4");
}

TEST(ParamGroups, TrainingDocsExampleRuns) {
  // docs/TRAINING.md's example of nanoGPT's configure_optimizers and get_lr, on a Linear and a LayerNorm.
  struct Model : nn::Module {
    std::shared_ptr<nn::Linear> fc;
    std::shared_ptr<nn::LayerNorm> ln;
    Model() {
      Generator gen(5);
      fc = std::make_shared<nn::Linear>(4, 3, nn::LinearOptions{}, gen);
      ln = std::make_shared<nn::LayerNorm>(3, 1e-5);
      register_module("fc", fc);
      register_module("ln", ln);
    }
  } model;
  auto [matrices, others] = optim::split_by_dim(model.named_parameters());
  ASSERT_EQ(matrices.size(), 1u);
  ASSERT_EQ(others.size(), 3u);  // fc.bias, ln.weight, ln.bias
  optim::AdamW opt({{.params = matrices}, {.params = others, .weight_decay = 0.0}},
                   {.lr = 1e-3, .betas = {0.9, 0.99}, .weight_decay = 0.1});
  optim::WarmupCosine schedule(opt, 3, 8, 1e-4, optim::WarmupStyle::NanoGPT);
  Generator gen(6);
  const Tensor x = randn({5, 4}, gen);
  const Tensor w0 = copy_of(model.fc->weight);
  double first_loss = 0, loss_value = 0;
  for (int it = 0; it < 10; ++it) {
    EXPECT_EQ(opt.lr(0), nanogpt_lr(it, 1e-3, 3, 8, 1e-4)) << "it " << it;
    EXPECT_EQ(opt.lr(1), opt.lr(0));
    opt.zero_grad();
    const Tensor y = model.ln->forward(model.fc->forward(x));  // (5, 3)
    const Tensor loss = mean(y * narrow(x, 1, 0, 3));
    loss_value = loss.item();
    if (it == 0) first_loss = loss_value;
    loss.backward();
    optim::clip_grad_norm_(model.parameters(), 1.0);
    opt.step();
    schedule.step();
  }
  EXPECT_LT(loss_value, first_loss);
  EXPECT_FALSE(bitwise_equal(w0, model.fc->weight));
  EXPECT_EQ(opt.lr(0), 1e-4);
}
