// Gradient accumulation: 4 micro-batches, each backward of loss / 4, then one optimizer step,
// equal one step on the whole batch (float32 tolerance), for SGD with momentum and AdamW over
// several iterations, with zero_grad's set_to_none and zero-filling forms.
#include <gtest/gtest.h>

#include <functional>
#include <memory>

#include "kiln/nn/nn.h"
#include "kiln/optim/optimizers.h"
#include "test_util.h"

namespace kiln::testing {
namespace {

constexpr int64_t kBatch = 32, kMicro = 4;

std::shared_ptr<nn::Sequential> make_mlp() {
  return std::make_shared<nn::Sequential>(
      std::vector<nn::ModulePtr>{std::make_shared<nn::Linear>(6, 16), std::make_shared<nn::Tanh>(),
                                 std::make_shared<nn::Linear>(16, 4)});
}

using MakeOpt = std::function<std::unique_ptr<optim::Optimizer>(std::vector<Tensor>)>;

// Trains two copies of one model for `iters` iterations: one on the whole batch, one on
// kMicro micro-batches with loss / kMicro; compares gradients before each step and parameters
// after it.
void check_accumulation(const MakeOpt& make_opt, bool set_to_none, int iters = 3) {
  auto whole = make_mlp(), accum = make_mlp();
  accum->load_state_dict(whole->state_dict());
  auto opt_whole = make_opt(whole->parameters()), opt_accum = make_opt(accum->parameters());
  nn::CrossEntropyLoss criterion;
  for (int it = 0; it < iters; ++it) {
    SCOPED_TRACE("iteration " + std::to_string(it));
    Tensor x = random({kBatch, 6}, kFloat32, -1, 1, 100 + it);
    Tensor y = random({kBatch}, kInt64, 0, 4, 200 + it);

    criterion(whole->forward(x), y).backward();
    const int64_t m = kBatch / kMicro;
    for (int64_t k = 0; k < kMicro; ++k) {
      Tensor xk = x.narrow(0, k * m, m), yk = y.narrow(0, k * m, m);
      (criterion(accum->forward(xk), yk) / static_cast<double>(kMicro)).backward();
    }
    auto pw = whole->named_parameters(), pa = accum->named_parameters();
    for (size_t i = 0; i < pw.size(); ++i) {
      SCOPED_TRACE(pw[i].first);
      ASSERT_TRUE(pa[i].second.grad().defined());
      expect_close(pa[i].second.grad(), pw[i].second.grad(), 1e-5, 1e-6);
    }
    opt_whole->step();
    opt_accum->step();
    opt_whole->zero_grad(set_to_none);
    opt_accum->zero_grad(set_to_none);
    for (size_t i = 0; i < pw.size(); ++i) {
      SCOPED_TRACE(pw[i].first);
      expect_close(pa[i].second, pw[i].second, 1e-5, 1e-6);
      const Tensor g = pa[i].second.grad();
      if (set_to_none) {
        EXPECT_FALSE(g.defined());
      } else {
        ASSERT_TRUE(g.defined());
        EXPECT_EQ(g.abs().max().item<float>(), 0.0f);
      }
    }
  }
}

TEST(GradAccumulation, SgdMomentumEqualsTheWholeBatch) {
  for (bool set_to_none : {true, false}) {
    SCOPED_TRACE(set_to_none ? "set_to_none" : "zero-filled");
    check_accumulation(
        [](std::vector<Tensor> ps) {
          return std::make_unique<optim::SGD>(std::move(ps),
                                              optim::SGDOptions{.lr = 0.1, .momentum = 0.9});
        },
        set_to_none);
  }
}

TEST(GradAccumulation, AdamWEqualsTheWholeBatch) {
  for (bool set_to_none : {true, false}) {
    SCOPED_TRACE(set_to_none ? "set_to_none" : "zero-filled");
    check_accumulation(
        [](std::vector<Tensor> ps) {
          return std::make_unique<optim::AdamW>(
              std::move(ps), optim::AdamWOptions{.lr = 1e-2, .weight_decay = 0.1});
        },
        set_to_none);
  }
}

// Without zero_grad the gradients of two iterations add up (the reason it is needed), and a
// set_to_none step leaves no stale gradient for the next first micro-batch to add to.
TEST(GradAccumulation, GradientsAddUpUntilCleared) {
  auto model = make_mlp();
  Tensor x = random({8, 6}, kFloat32, -1, 1, 1), y = random({8}, kInt64, 0, 4, 2);
  nn::CrossEntropyLoss criterion;
  criterion(model->forward(x), y).backward();
  const Tensor once = model->parameters()[0].grad().clone();
  criterion(model->forward(x), y).backward();
  expect_close(model->parameters()[0].grad(), once * 2.0, 1e-6, 1e-7);
  optim::SGD opt(model->parameters(), {.lr = 0.0});
  opt.zero_grad();
  EXPECT_FALSE(model->parameters()[0].grad().defined());
  criterion(model->forward(x), y).backward();
  expect_close(model->parameters()[0].grad(), once, 1e-6, 1e-7);
}

}  // namespace
}  // namespace kiln::testing
