// Optimizer updates against PyTorch's (libtorch C++ API): 5 steps of each optimizer
// configuration on fixed float32 parameters and gradients, and a StepLR curve
// (tests/golden/optim_golden_gen.cpp made optim_golden.bin; it holds the configurations).
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "golden/golden_file.h"
#include "kiln/optim/optim.h"
#include "test_util.h"

namespace kiln::optim {
namespace {

using testing::Golden;
using Make = std::function<std::unique_ptr<Optimizer>(std::vector<Tensor>)>;

Tensor to_tensor(const Golden& g) {
  std::vector<float> v(g.values.begin(), g.values.end());  // float32 values stored exactly
  return testing::from_vector<float>(v, g.sizes);
}

template <typename Opt, typename Options>
Make make(Options o) {
  return [o](std::vector<Tensor> params) { return std::make_unique<Opt>(std::move(params), o); };
}

// The configurations of optim_golden_gen.cpp, in Kiln's option names.
const std::vector<std::pair<std::string, Make>>& configs() {
  static const std::vector<std::pair<std::string, Make>> c = {
      {"sgd", make<SGD>(SGDOptions{.lr = .1})},
      {"sgd_momentum",
       make<SGD>(SGDOptions{.lr = .1, .momentum = .9, .dampening = .1, .weight_decay = .01})},
      {"sgd_nesterov",
       make<SGD>(SGDOptions{.lr = .1, .momentum = .9, .weight_decay = .01, .nesterov = true})},
      {"adam", make<Adam>(AdamOptions{.lr = .01, .beta1 = .8, .beta2 = .99, .weight_decay = .05})},
      {"adam_amsgrad", make<Adam>(AdamOptions{.lr = .01, .amsgrad = true})},
      {"adamw", make<AdamW>(AdamWOptions{.lr = .01, .weight_decay = .1})},
      {"adamw_amsgrad",
       make<AdamW>(AdamWOptions{.lr = .01, .eps = 1e-6, .weight_decay = .1, .amsgrad = true})},
      {"rmsprop", make<RMSprop>(RMSpropOptions{.lr = .01, .alpha = .9, .weight_decay = .01})},
      {"rmsprop_centered_momentum",
       make<RMSprop>(RMSpropOptions{.lr = .01, .momentum = .9, .centered = true})},
      {"adagrad",
       make<Adagrad>(AdagradOptions{
           .lr = .1, .lr_decay = .01, .weight_decay = .01, .initial_accumulator_value = .1})},
  };
  return c;
}

TEST(OptimGolden, FiveStepsMatchLibtorch) {
  auto golden = testing::read_golden_file("optim_golden.bin");
  ASSERT_FALSE(golden.empty());
  for (const auto& [name, make_opt] : configs()) {
    std::vector<Tensor> params;
    for (int j = 0; j < 2; ++j)
      params.push_back(to_tensor(golden.at("p" + std::to_string(j) + ".init")).requires_grad_());
    std::unique_ptr<Optimizer> opt = make_opt(params);
    double worst = 0;
    for (int k = 1; k <= 5; ++k) {
      for (int j = 0; j < 2; ++j)
        params[j].set_grad(
            to_tensor(golden.at("p" + std::to_string(j) + ".grad" + std::to_string(k))));
      opt->step();
      for (int j = 0; j < 2; ++j) {
        const std::string key = name + ".p" + std::to_string(j) + ".step" + std::to_string(k);
        const std::vector<double>& want = golden.at(key).values;
        std::vector<double> got = testing::to_doubles(params[j]);
        ASSERT_EQ(got.size(), want.size()) << key;
        for (size_t i = 0; i < want.size(); ++i) {
          // Relative to the value, or to 1e-2 for values near zero.
          const double err = std::abs(got[i] - want[i]) / std::max(std::abs(want[i]), 1e-2);
          worst = std::max(worst, err);
          EXPECT_LE(err, 1e-6) << key << "[" << i << "]: " << got[i] << " vs PyTorch's " << want[i];
        }
      }
    }
    std::printf("%-26s worst relative difference from libtorch over 5 steps: %.2g\n", name.c_str(),
                worst);
  }
}

// libtorch 1.13's C++ StepLR, unlike Python's, takes no step in its constructor, so its lr
// after e + 1 step() calls is Python's (and Kiln's) after e; the first lr is the same.
TEST(OptimGolden, StepLRMatchesLibtorch) {
  auto golden = testing::read_golden_file("optim_golden.bin");
  const std::vector<double>& libtorch = golden.at("step_lr.lr").values;
  Tensor w = zeros({1}).requires_grad_();
  SGD sgd({w}, {.lr = .5});
  StepLR sched(sgd, {.step_size = 3, .gamma = .5});
  EXPECT_DOUBLE_EQ(sgd.param_groups()[0].options.at("lr"), libtorch[0]);
  for (size_t e = 0; e + 1 < libtorch.size(); ++e) {
    EXPECT_DOUBLE_EQ(sgd.param_groups()[0].options.at("lr"), libtorch[e + 1]) << "epoch " << e;
    w.set_grad(ones({1}));
    sgd.step();
    sched.step();
  }
}

}  // namespace
}  // namespace kiln::optim
