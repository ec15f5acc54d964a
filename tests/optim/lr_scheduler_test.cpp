// LR schedulers (kiln/optim/lr_scheduler.h): curves over two param groups with different base lrs
// against closed forms written out here (and a few values worked by hand from PyTorch's
// formulas), SequentialLR, OneCycleLR's momentum, state dicts and bad input.
#include "kiln/optim/lr_scheduler.h"

#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <numbers>

#include "kiln/optim/optimizers.h"
#include "test_util.h"

namespace kiln::testing {
namespace {

using optim::Optimizer;

std::vector<optim::ParamGroup> two_groups() {
  return {{{zeros({2})}, {}}, {{zeros({3})}, {{"lr", 0.5}}}};
}

// The lrs of `epochs` epochs (epoch 0 first) against want(base_lr, epoch) for every group.
void expect_curve(optim::LRScheduler& s, const Optimizer& opt, int epochs,
                  const std::function<double(double, int)>& want) {
  const std::vector<double> base = {1.0, 0.5};
  for (int e = 0; e < epochs; ++e) {
    ASSERT_EQ(s.last_epoch(), e);
    for (size_t g = 0; g < 2; ++g) {
      EXPECT_NEAR(opt.param_groups()[g].options.at("lr"), want(base[g], e), 1e-12)
          << "epoch " << e << " group " << g;
      EXPECT_EQ(s.get_last_lr()[g], opt.param_groups()[g].options.at("lr"));
    }
    if (e + 1 < epochs) s.step();
  }
}

TEST(LRScheduler, StepLR) {
  optim::SGD opt(two_groups(), {.lr = 1.0});
  optim::StepLR s(opt, {.step_size = 3, .gamma = 0.5});
  const double f[] = {1, 1, 1, 0.5, 0.5, 0.5, 0.25, 0.25, 0.25, 0.125};
  expect_curve(s, opt, 10, [&](double b, int e) { return b * f[e]; });
}

TEST(LRScheduler, MultiStepLR) {
  optim::SGD opt(two_groups(), {.lr = 1.0});
  optim::MultiStepLR s(opt, {.milestones = {5, 2, 5}, .gamma = 0.1});  // 5 twice: gamma²
  const double f[] = {1, 1, 0.1, 0.1, 0.1, 1e-3, 1e-3};
  expect_curve(s, opt, 7, [&](double b, int e) { return b * f[e]; });
}

TEST(LRScheduler, ExponentialLR) {
  optim::SGD opt(two_groups(), {.lr = 1.0});
  optim::ExponentialLR s(opt, 0.9);
  expect_curve(s, opt, 8, [](double b, int e) { return b * std::pow(0.9, e); });
}

TEST(LRScheduler, CosineAnnealingLR) {
  optim::SGD opt(two_groups(), {.lr = 1.0});
  optim::CosineAnnealingLR s(opt, {.T_max = 4, .eta_min = 0.1});
  // Hand-worked for base 1: (0.1 + 0.9 * (1 + cos(pi e / 4)) / 2).
  const double hand[] = {1.0, 0.1 + 0.45 * (1 + std::sqrt(0.5)), 0.55,
                         0.1 + 0.45 * (1 - std::sqrt(0.5)), 0.1};
  EXPECT_NEAR(opt.param_groups()[0].options.at("lr"), hand[0], 1e-12);
  expect_curve(s, opt, 9, [](double b, int e) {
    return 0.1 + (b - 0.1) * (1 + std::cos(std::numbers::pi * e / 4)) / 2;
  });
  optim::SGD opt2(two_groups(), {.lr = 1.0});
  optim::CosineAnnealingLR s2(opt2, {.T_max = 4, .eta_min = 0.1});
  for (int e = 0; e < 5; ++e, s2.step()) EXPECT_NEAR(s2.get_last_lr()[0], hand[e], 1e-12);
}

TEST(LRScheduler, LinearLR) {
  optim::SGD opt(two_groups(), {.lr = 1.0});
  optim::LinearLR s(opt, {.start_factor = 0.5, .end_factor = 1.0, .total_iters = 4});
  const double f[] = {0.5, 0.625, 0.75, 0.875, 1, 1, 1};
  expect_curve(s, opt, 7, [&](double b, int e) { return b * f[e]; });
}

TEST(LRScheduler, OneCycleLRWithAdam) {
  optim::Adam opt(two_groups(), {.lr = 1.0});
  optim::OneCycleLR s(opt, {.max_lr = {1.0, 0.5}, .total_steps = 10});
  // initial = max / 25, min = initial / 1e4; warm-up ends at step 0.3 * 10 - 1 = 2.
  auto cos_anneal = [](double a, double b, double pct) {
    return b + (a - b) / 2 * (std::cos(std::numbers::pi * pct) + 1);
  };
  expect_curve(s, opt, 11, [&](double m, int e) {
    const double initial = m / 25, min = initial / 1e4;
    if (e <= 2) return cos_anneal(initial, m, e / 2.0);
    return cos_anneal(m, min, (e - 2) / 7.0);
  });
  EXPECT_THROW(s.step(), Error);  // step 11 of 10
  optim::Adam opt2(two_groups(), {.lr = 1.0});
  optim::OneCycleLR s2(opt2, {.max_lr = {1.0}, .total_steps = 10});
  const double lr_hand[] = {0.04, 0.52, 1.0};
  const double beta1_hand[] = {0.95, 0.90, 0.85};
  for (int e = 0; e < 3; ++e, s2.step()) {
    EXPECT_NEAR(opt2.param_groups()[0].options.at("lr"), lr_hand[e], 1e-12);
    EXPECT_NEAR(opt2.param_groups()[1].options.at("lr"), lr_hand[e], 1e-12);  // one max_lr
    EXPECT_NEAR(opt2.param_groups()[0].options.at("beta1"), beta1_hand[e], 1e-12);
  }
  for (int e = 3; e < 9; ++e) s2.step();  // to step 9, the last
  EXPECT_NEAR(opt2.param_groups()[0].options.at("lr"), 0.04 / 1e4, 1e-15);
  EXPECT_NEAR(opt2.param_groups()[0].options.at("beta1"), 0.95, 1e-12);
}

TEST(LRScheduler, OneCycleLRThreePhaseLinearWithSGD) {
  optim::SGD opt(two_groups(), {.lr = 1.0, .momentum = 0.9});
  optim::OneCycleLR s(opt, {.max_lr = {1.0},
                            .epochs = 2,
                            .steps_per_epoch = 5,
                            .anneal_cos = false,
                            .three_phase = true});
  // Phases end at steps 2, 4 and 9: 0.04 -> 1 -> 0.04 -> 4e-6; momentum 0.95 -> 0.85 -> 0.95.
  const double lr[] = {0.04, 0.52, 1.0, 0.52, 0.04};
  const double mom[] = {0.95, 0.90, 0.85, 0.90, 0.95};
  for (int e = 0; e < 5; ++e, s.step()) {
    EXPECT_NEAR(opt.param_groups()[1].options.at("lr"), lr[e], 1e-12) << e;
    EXPECT_NEAR(opt.param_groups()[1].options.at("momentum"), mom[e], 1e-12) << e;
  }
  for (int e = 5; e < 9; ++e) s.step();
  EXPECT_NEAR(opt.param_groups()[0].options.at("lr"), 0.04 / 1e4, 1e-15);
}

TEST(LRScheduler, SequentialLRWarmupThenCosine) {
  optim::SGD opt(two_groups(), {.lr = 1.0});
  auto warmup = std::make_shared<optim::LinearLR>(
      opt, optim::LinearLROptions{.start_factor = 0.1, .total_iters = 3});
  auto cosine =
      std::make_shared<optim::CosineAnnealingLR>(opt, optim::CosineAnnealingLROptions{.T_max = 5});
  optim::SequentialLR s(opt, {warmup, cosine}, {3});
  expect_curve(s, opt, 10, [](double b, int e) {
    if (e < 3) return b * (0.1 + 0.9 * e / 3.0);
    return b * (1 + std::cos(std::numbers::pi * (e - 3) / 5)) / 2;
  });
}

TEST(LRScheduler, StateDictResumes) {
  optim::SGD a(two_groups(), {.lr = 1.0});
  optim::CosineAnnealingLR sa(a, {.T_max = 10});
  for (int e = 0; e < 4; ++e) sa.step();
  const std::map<std::string, double> sd = sa.state_dict();
  EXPECT_EQ(sd.at("last_epoch"), 4);
  EXPECT_EQ(sd.at("base_lr.1"), 0.5);
  optim::SGD b(two_groups(), {.lr = 1.0});
  optim::CosineAnnealingLR sb(b, {.T_max = 10});
  sb.load_state_dict(sd);
  for (int e = 0; e < 3; ++e) {
    EXPECT_EQ(sa.get_last_lr(), sb.get_last_lr());
    sa.step(), sb.step();
  }
  expect_error(ErrorKind::Value, "CosineAnnealingLR: state dict has no \"base_lr.1\"", [&] {
    sb.load_state_dict({{"last_epoch", 1}, {"base_lr.0", 1}});
  });
}

TEST(LRScheduler, TheOptimizerStepsWithTheScheduledLr) {
  Tensor p = zeros({1});
  p.requires_grad_(true);
  optim::SGD opt({p}, {.lr = 1.0});
  optim::StepLR s(opt, {.step_size = 1, .gamma = 0.5});
  for (int e = 0; e < 3; ++e) {
    p.set_grad(ones({1}));
    opt.step();
    s.step();
  }
  EXPECT_DOUBLE_EQ(to_doubles(p)[0], -(1 + 0.5 + 0.25));
}

TEST(LRScheduler, BadInput) {
  optim::SGD opt(two_groups(), {.lr = 1.0});
  expect_error(ErrorKind::Value, "StepLR: step_size must be positive, got 0",
               [&] { optim::StepLR(opt, {.step_size = 0}); });
  expect_error(ErrorKind::Value, "LinearLR: start_factor must be in (0, 1], got 0",
               [&] { optim::LinearLR(opt, {.start_factor = 0}); });
  expect_error(ErrorKind::Value, "OneCycleLR: expected 1 max_lr or one per param group (2), got 3",
               [&] {
                 optim::OneCycleLR(opt, {.max_lr = {1, 2, 3}, .total_steps = 5});
               });
  expect_error(ErrorKind::Value, "give total_steps, or epochs and steps_per_epoch",
               [&] { optim::OneCycleLR(opt, {.max_lr = {1}}); });
  optim::Adagrad adagrad(two_groups());
  expect_error(ErrorKind::Value, "no momentum or beta1 to cycle",
               [&] { optim::OneCycleLR(adagrad, {.max_lr = {1}, .total_steps = 5}); });
  auto a = std::make_shared<optim::StepLR>(opt, optim::StepLROptions{.step_size = 2});
  expect_error(ErrorKind::Value, "SequentialLR: expected 0 milestones for 1 schedulers, got 1",
               [&] { optim::SequentialLR(opt, {a}, {3}); });
  optim::SGD other(two_groups());
  auto b = std::make_shared<optim::StepLR>(other, optim::StepLROptions{.step_size = 2});
  expect_error(ErrorKind::Value, "scheduler 1 is not built on this optimizer", [&] {
    optim::SequentialLR(opt, {a, b}, {3});
  });
}

}  // namespace
}  // namespace kiln::testing
