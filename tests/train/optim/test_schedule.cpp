// Learning-rate schedules: closed-form values by hand, the schedulers against PyTorch's StepLR,
// ConstantLR, CosineAnnealingLR and LambdaLR, against the seed's ScheduledOptim and nanoGPT's get_lr (golden file
// from tests/train/optim/golden_optim.py), parameter groups, resuming, and errors.

#include <cmath>
#include <numbers>

#include "testing.h"
#include "train/optim/optimizers.h"
#include "train/optim/schedule.h"

using namespace attograd;
using namespace attograd::testing;
using namespace attograd::optim;

namespace {

const std::map<std::string, Tensor>& golden() {
  static const std::map<std::string, Tensor> g = load_golden("train/schedule.golden");
  return g;
}

// Expects scheduler.last_lr() and the optimizer's lr to follow `expected` (value k after k steps).
void expect_follows(LRScheduler& s, Optimizer& opt, const std::string& golden_name, double rtol) {
  const Tensor& expected = golden().at(golden_name);
  for (int64_t k = 0; k < expected.numel(); ++k) {
    if (k > 0) {
      opt.step();
      s.step();
    }
    EXPECT_EQ(s.step_count(), k);
    EXPECT_NEAR(s.last_lr(), expected.flat(k), rtol * std::fabs(expected.flat(k))) << golden_name << " step " << k;
    EXPECT_EQ(opt.lr(), s.last_lr());
    EXPECT_EQ(s.lr_at(k), s.last_lr());
  }
}

std::vector<Tensor> one_param() { return {zeros({1}, {.requires_grad = true})}; }

SGD& opt_for_errors() {
  static SGD opt(one_param(), {.lr = 0.1});
  return opt;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Values

TEST(ScheduleValues, Noam) {
  // lr_mul * d_model^-0.5 * min(step^-0.5, step * warmup^-1.5); d_model = 16 gives the factor 1/4.
  const double w = 1.0 / (3.0 * std::sqrt(3.0));  // 3^-1.5
  EXPECT_DOUBLE_EQ(noam_lr(1, 0.5, 16, 3), 0.5 * 0.25 * w);
  EXPECT_DOUBLE_EQ(noam_lr(2, 0.5, 16, 3), 0.5 * 0.25 * 2 * w);
  EXPECT_DOUBLE_EQ(noam_lr(3, 0.5, 16, 3), 0.5 * 0.25 / std::sqrt(3.0));  // the peak: both branches agree
  EXPECT_DOUBLE_EQ(noam_lr(10, 0.5, 16, 3), 0.5 * 0.25 / std::sqrt(10.0));
  EXPECT_NEAR(noam_lr(10, 0.5, 16, 3), 0.03952847075210474, 1e-17);
  // The seed's defaults (d_model 512, warmup 4000): peak at 4000.
  EXPECT_GT(noam_lr(4000, 2.0, 512, 4000), noam_lr(3999, 2.0, 512, 4000));
  EXPECT_GT(noam_lr(4000, 2.0, 512, 4000), noam_lr(4001, 2.0, 512, 4000));
  EXPECT_DOUBLE_EQ(noam_lr(4000, 2.0, 512, 4000), 2.0 / std::sqrt(512.0) / std::sqrt(4000.0));
}

TEST(ScheduleValues, StepConstantWarmupCosine) {
  EXPECT_DOUBLE_EQ(step_lr(0, 0.1, 3, 0.5), 0.1);
  EXPECT_DOUBLE_EQ(step_lr(2, 0.1, 3, 0.5), 0.1);
  EXPECT_DOUBLE_EQ(step_lr(3, 0.1, 3, 0.5), 0.05);
  EXPECT_DOUBLE_EQ(step_lr(9, 0.1, 3, 0.5), 0.0125);
  EXPECT_DOUBLE_EQ(constant_lr(0, 0.1, 0.25, 4), 0.025);
  EXPECT_DOUBLE_EQ(constant_lr(3, 0.1, 0.25, 4), 0.025);
  EXPECT_DOUBLE_EQ(constant_lr(4, 0.1, 0.25, 4), 0.1);
  EXPECT_DOUBLE_EQ(constant_lr(1000, 0.1), 0.1);
  // warm-up 4, total 12, min 0.01, base 0.1
  EXPECT_DOUBLE_EQ(warmup_cosine_lr(0, 0.1, 4, 12, 0.01), 0.0);
  EXPECT_DOUBLE_EQ(warmup_cosine_lr(1, 0.1, 4, 12, 0.01), 0.025);
  EXPECT_DOUBLE_EQ(warmup_cosine_lr(4, 0.1, 4, 12, 0.01), 0.1);
  EXPECT_DOUBLE_EQ(warmup_cosine_lr(8, 0.1, 4, 12, 0.01), 0.055);  // halfway: (base + min) / 2
  EXPECT_NEAR(warmup_cosine_lr(6, 0.1, 4, 12, 0.01), 0.01 + 0.09 * (1 + std::cos(std::numbers::pi / 4)) / 2, 1e-16);
  EXPECT_DOUBLE_EQ(warmup_cosine_lr(12, 0.1, 4, 12, 0.01), 0.01);
  EXPECT_DOUBLE_EQ(warmup_cosine_lr(100, 0.1, 4, 12, 0.01), 0.01);
  EXPECT_DOUBLE_EQ(warmup_cosine_lr(0, 0.1, 0, 10), 0.1);        // no warm-up starts at base
  EXPECT_DOUBLE_EQ(warmup_cosine_lr(5, 0.1, 5, 5, 0.02), 0.02);  // no cosine phase
}

// ---------------------------------------------------------------------------------------------
// Schedulers against PyTorch

TEST(Schedulers, StepLRMatchesPyTorch) {
  SGD opt(one_param(), {.lr = 0.1});
  StepLR s(opt, 3, 0.5);
  expect_follows(s, opt, "steplr", 1e-15);
}

TEST(Schedulers, ConstantLRMatchesPyTorch) {
  SGD opt(one_param(), {.lr = 0.1});
  ConstantLR s(opt, 0.25, 4);
  expect_follows(s, opt, "constantlr", 1e-15);
  SGD opt2(one_param(), {.lr = 0.3});
  ConstantLR plain(opt2);
  for (int k = 0; k < 5; ++k, plain.step()) EXPECT_EQ(opt2.lr(), 0.3);
}

TEST(Schedulers, WarmupCosineMatchesPyTorch) {
  SGD opt(one_param(), {.lr = 0.1});
  WarmupCosine cosine(opt, 0, 10, 0.01);  // CosineAnnealingLR(T_max=10, eta_min=0.01)
  expect_follows(cosine, opt, "cosine", 1e-13);
  SGD opt2(one_param(), {.lr = 0.1});
  WarmupCosine warm(opt2, 4, 12, 0.01);  // LambdaLR with the same formula
  expect_follows(warm, opt2, "warmup_cosine", 1e-15);
}

TEST(Schedulers, NoamMatchesTheSeed) {
  // The seed's ScheduledOptim sets lr = noam(n) before its n-th update; here the lr set after k steps is
  // the one for update k + 1.
  Adam opt(one_param(), {.lr = 1.0, .betas = {0.9, 0.98}, .eps = 1e-9});
  NoamLR s(opt, 0.5, 16, 3);
  const Tensor& small = golden().at("noam_seed_small");
  for (int64_t k = 0; k < small.numel(); ++k) {
    if (k > 0) s.step();
    EXPECT_DOUBLE_EQ(opt.lr(), small.flat(k)) << "update " << k + 1;
    EXPECT_DOUBLE_EQ(opt.lr(), noam_lr(k + 1, 0.5, 16, 3));
  }
  Adam opt2(one_param(), {.lr = 1.0});
  NoamLR big(opt2, 2.0, 512, 4000);
  const Tensor& seed = golden().at("noam_seed_big");
  for (int64_t k = 0; k < seed.numel(); ++k, big.step()) EXPECT_DOUBLE_EQ(opt2.lr(), seed.flat(k));
}

TEST(Schedulers, DriveTheOptimizer) {
  // The lr the optimizer uses for its t-th update is lr_at(t - 1): SGD on a gradient of 1 moves by it.
  Tensor p = zeros({1}, {.dtype = kFloat64, .requires_grad = true});
  SGD opt({p}, {.lr = 0.1});
  StepLR s(opt, 2, 0.5);
  double expected = 0;
  for (int t = 1; t <= 6; ++t) {
    p.set_grad(ones({1}, {.dtype = kFloat64}));
    expected -= step_lr(t - 1, 0.1, 2, 0.5);
    opt.step();
    s.step();
    EXPECT_DOUBLE_EQ(p.flat(0), expected) << "update " << t;
  }
}

TEST(Schedulers, ResumeWithSetStepCount) {
  SGD opt(one_param(), {.lr = 0.1});
  WarmupCosine s(opt, 4, 12, 0.01);
  for (int k = 0; k < 7; ++k) s.step();
  // A fresh optimizer and scheduler resumed at step 7 agree with the original from there on.
  SGD opt2(one_param(), {.lr = 0.1});
  WarmupCosine r(opt2, 4, 12, 0.01);
  EXPECT_EQ(opt2.lr(), 0.0);
  r.set_step_count(7);
  EXPECT_EQ(r.step_count(), 7);
  for (int k = 0; k < 6; ++k) {
    EXPECT_EQ(opt2.lr(), opt.lr());
    EXPECT_EQ(r.last_lr(), s.last_lr());
    s.step();
    r.step();
  }
  // The base lr is the optimizer's initial lr even when a schedule has already changed its lr.
  SGD opt3(one_param(), {.lr = 0.2});
  StepLR first(opt3, 1, 0.5);
  first.step();
  EXPECT_DOUBLE_EQ(opt3.lr(), 0.1);
  ConstantLR second(opt3);
  EXPECT_EQ(second.base_lr(), 0.2);
  EXPECT_EQ(opt3.lr(), 0.2);
  EXPECT_EQ(&second.optimizer(), &opt3);
}

// ---------------------------------------------------------------------------------------------
// nanoGPT's get_lr, and schedules of parameter groups

TEST(ScheduleValues, NanoGPTEqualsGetLrExactly) {
  // The golden values are nanoGPT's get_lr, written out in golden_optim.py; every one must agree to the bit.
  struct Case {
    const char* name;
    double lr;
    int64_t warmup, decay;
    double min_lr;
  };
  for (const Case& c : {Case{"nanogpt_shakespeare", 1e-3, 100, 2000, 1e-4}, Case{"nanogpt_short", 1e-3, 10, 40, 1e-4},
                        Case{"nanogpt_no_warmup", 6e-4, 0, 20, 6e-5}}) {
    const Tensor& expected = golden().at(c.name);
    ASSERT_GT(expected.numel(), c.decay + 1) << c.name;
    for (int64_t it = 0; it < expected.numel(); ++it)
      ASSERT_EQ(nanogpt_lr(it, c.lr, c.warmup, c.decay, c.min_lr), expected.flat(it)) << c.name << " it " << it;
    // The scheduler sets the same values on the optimizer (after `it` steps: the lr of update it + 1).
    SGD opt(one_param(), {.lr = c.lr});
    WarmupCosine s(opt, c.warmup, c.decay, c.min_lr, WarmupStyle::NanoGPT);
    EXPECT_EQ(s.style(), WarmupStyle::NanoGPT);
    expect_follows(s, opt, c.name, 0.0);
  }
  // By hand: the first update has lr / (warmup + 1), not 0; the peak is reached at it = warmup; the floor after.
  EXPECT_DOUBLE_EQ(nanogpt_lr(0, 1e-3, 9, 100, 1e-4), 1e-4);
  EXPECT_DOUBLE_EQ(nanogpt_lr(8, 1e-3, 9, 100, 1e-4), 9e-4);
  EXPECT_EQ(nanogpt_lr(9, 1e-3, 9, 100, 1e-4), 1e-3);
  EXPECT_EQ(nanogpt_lr(100, 1e-3, 9, 100, 1e-4), 1e-4);
  EXPECT_EQ(nanogpt_lr(101, 1e-3, 9, 100, 1e-4), 1e-4);
  EXPECT_EQ(nanogpt_lr(5, 1e-3, 5, 5, 1e-4), 1e-4);  // no cosine phase (nanoGPT: 0 / 0)
  // attograd's default warm-up starts at 0: the two styles differ only in the warm-up.
  EXPECT_EQ(warmup_cosine_lr(0, 1e-3, 10, 40, 1e-4), 0.0);
  EXPECT_EQ(warmup_cosine_lr(10, 1e-3, 10, 40, 1e-4), nanogpt_lr(10, 1e-3, 10, 40, 1e-4));
  EXPECT_EQ(warmup_cosine_lr(25, 1e-3, 10, 40, 1e-4), nanogpt_lr(25, 1e-3, 10, 40, 1e-4));
  EXPECT_EQ(parse_warmup_style("nanogpt"), WarmupStyle::NanoGPT);
  EXPECT_EQ(parse_warmup_style("from-zero"), WarmupStyle::FromZero);
  EXPECT_STREQ(warmup_style_name(WarmupStyle::NanoGPT), "nanogpt");
  EXPECT_ATTO_ERROR(parse_warmup_style("linear", "--warmup-style"),
                    "--warmup-style must be from-zero or nanogpt, got \"linear\"");
  EXPECT_ATTO_ERROR(nanogpt_lr(0, 1e-3, 10, 5, 0), "lr_decay_iters must be >= 1 and >= warmup_iters (10), got 5");
  EXPECT_ATTO_ERROR(nanogpt_lr(-1, 1e-3, 10, 50, 0), "it must be >= 0, got -1");
  EXPECT_ATTO_ERROR(WarmupCosine(opt_for_errors(), 0, 5, -1.0, WarmupStyle::NanoGPT), "min_lr must be finite and >= 0");
}

TEST(Schedulers, ScaleEachGroupsInitialLr) {
  Tensor a = zeros({1}, {.requires_grad = true}), b = zeros({1}, {.requires_grad = true});
  auto groups = [&](double lr0, double lr1) {
    return std::vector<SGDParamGroup>{{.params = {{"a", a}}, .lr = lr0}, {.params = {{"b", b}}, .lr = lr1}};
  };
  {
    SGD opt(groups(0.1, 0.4), {});
    StepLR s(opt, 2, 0.5);
    EXPECT_EQ(s.base_lrs(), (std::vector<double>{0.1, 0.4}));
    for (int k = 0; k < 6; ++k, s.step()) {
      EXPECT_EQ(opt.lr(0), step_lr(k, 0.1, 2, 0.5));
      EXPECT_EQ(opt.lr(1), step_lr(k, 0.4, 2, 0.5));
      EXPECT_EQ(s.last_lrs(), (std::vector<double>{opt.lr(0), opt.lr(1)}));
      EXPECT_EQ(s.last_lr(), opt.lr(0));
    }
  }
  {
    // The cosine's floor is shared (CosineAnnealingLR's eta_min, nanoGPT's min_lr); the warm-up scales each group.
    SGD opt(groups(1e-3, 2e-3), {});
    WarmupCosine s(opt, 4, 12, 1e-4, WarmupStyle::NanoGPT);
    for (int k = 0; k < 15; ++k, s.step()) {
      EXPECT_EQ(opt.lr(0), nanogpt_lr(k, 1e-3, 4, 12, 1e-4));
      EXPECT_EQ(opt.lr(1), nanogpt_lr(k, 2e-3, 4, 12, 1e-4));
      EXPECT_EQ(s.lr_at(k), opt.lr(0));
      EXPECT_EQ(s.lr_at(k, 2e-3), opt.lr(1));
    }
    EXPECT_EQ(opt.lr(1), 1e-4);
    // Resuming sets every group.
    SGD opt2(groups(1e-3, 2e-3), {});
    WarmupCosine r(opt2, 4, 12, 1e-4, WarmupStyle::NanoGPT);
    r.set_step_count(7);
    EXPECT_EQ(opt2.lr(1), nanogpt_lr(7, 2e-3, 4, 12, 1e-4));
  }
  {
    // Noam with an explicit lr_mul sets every group alike (the seed's ScheduledOptim); without one, each group's
    // initial lr is its lr_mul.
    Adam opt({{.params = {{"a", a}}, .lr = 1.0}, {.params = {{"b", b}}, .lr = 3.0}});
    NoamLR seed(opt, 0.5, 16, 3);
    EXPECT_EQ(opt.lr(0), noam_lr(1, 0.5, 16, 3));
    EXPECT_EQ(opt.lr(1), noam_lr(1, 0.5, 16, 3));
    NoamLR scaled(opt, 16, 3);
    scaled.step();
    EXPECT_EQ(opt.lr(0), noam_lr(2, 1.0, 16, 3));
    EXPECT_EQ(opt.lr(1), noam_lr(2, 3.0, 16, 3));
  }
}

TEST(Schedulers, Errors) {
  SGD opt(one_param(), {.lr = 0.1});
  EXPECT_ATTO_ERROR(StepLR(opt, 0, 0.5), "step_lr: step_size must be >= 1, got 0");
  EXPECT_ATTO_ERROR(StepLR(opt, 2, 0.0), "gamma must be finite and > 0, got 0");
  EXPECT_ATTO_ERROR(ConstantLR(opt, 1.5, 3), "constant_lr: factor must be in [0, 1], got 1.5");
  EXPECT_ATTO_ERROR(ConstantLR(opt, 0.5, -1), "total_iters must be >= 0, got -1");
  EXPECT_ATTO_ERROR(WarmupCosine(opt, 10, 5), "total_steps must be >= 1 and >= warmup_steps (10), got 5");
  EXPECT_ATTO_ERROR(WarmupCosine(opt, -1, 5), "warmup_steps must be >= 0, got -1");
  EXPECT_ATTO_ERROR(WarmupCosine(opt, 0, 5, -0.1), "min_lr must be finite and >= 0, got -0.1");
  EXPECT_ATTO_ERROR(NoamLR(opt, 1.0, 0, 10), "noam_lr: d_model must be >= 1, got 0");
  EXPECT_ATTO_ERROR(NoamLR(opt, 1.0, 512, 0), "warmup must be >= 1, got 0");
  EXPECT_ATTO_ERROR(NoamLR(opt, -1.0, 512, 10), "lr_mul must be finite and >= 0, got -1");
  EXPECT_ATTO_ERROR(noam_lr(0, 1.0, 512, 10), "step is counted from 1, got 0");
  EXPECT_ATTO_ERROR(step_lr(-1, 0.1, 1, 0.5), "step must be >= 0, got -1");
  StepLR s(opt, 2, 0.5);
  EXPECT_ATTO_ERROR(s.set_step_count(-3), "set_step_count: step count must be >= 0, got -3");
  EXPECT_EQ(s.step_count(), 0);
}
