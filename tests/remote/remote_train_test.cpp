// Training on a remote device: the client's autograd records forward, backward and optimizer
// ops like any op, so an MLP step (and several) on an embedded worker equals the CPU step.
#include <gtest/gtest.h>

#include "kiln/client/session.h"
#include "kiln/nn/nn.h"
#include "kiln/optim/optimizers.h"
#include "test_util.h"

namespace kiln::testing {
namespace {

std::shared_ptr<nn::Sequential> make_mlp() {
  manual_seed(7);
  return std::make_shared<nn::Sequential>(std::vector<nn::ModulePtr>{
      std::make_shared<nn::Linear>(8, 16), std::make_shared<nn::ReLU>(),
      std::make_shared<nn::Linear>(16, 4)});
}

// `steps` SGD steps (momentum) on a fixed batch; returns the losses and the final parameters.
std::pair<std::vector<float>, std::vector<Tensor>> train(std::optional<Device> dev, int steps) {
  auto net = make_mlp();
  Tensor x = random({32, 8}, kFloat32, -1, 1, 11);
  Tensor y = from_vector<int64_t>(std::vector<int64_t>(32, 0), {32});
  for (int i = 0; i < 32; ++i) y.data_ptr<int64_t>()[i] = i % 4;
  if (dev) {
    net->to(*dev);
    x = x.to(std::nullopt, *dev);
    y = y.to(std::nullopt, *dev);
  }
  optim::SGD opt(net->parameters(), {.lr = 0.1, .momentum = 0.9});
  std::vector<float> losses;
  for (int i = 0; i < steps; ++i) {
    opt.zero_grad();
    Tensor loss = nn::functional::cross_entropy(net->forward(x), y);
    loss.backward();
    opt.step();
    losses.push_back(loss.item<float>());
  }
  std::vector<Tensor> params;
  for (const Tensor& p : net->parameters()) params.push_back(p.to(std::nullopt, Device(kCPU)));
  return {losses, params};
}

TEST(RemoteTrain, MlpStepsEqualCpu) {
  auto s = client::connect_in_process();
  auto [cpu_losses, cpu_params] = train(std::nullopt, 3);
  auto [rem_losses, rem_params] = train(s.device(), 3);
  ASSERT_EQ(cpu_losses.size(), rem_losses.size());
  for (size_t i = 0; i < cpu_losses.size(); ++i) EXPECT_NEAR(rem_losses[i], cpu_losses[i], 1e-6);
  ASSERT_EQ(cpu_params.size(), rem_params.size());
  for (size_t i = 0; i < cpu_params.size(); ++i) expect_close(rem_params[i], cpu_params[i], 1e-6, 1e-6);
  EXPECT_LT(rem_losses.back(), rem_losses.front());
}

TEST(RemoteTrain, ModuleToMovesParametersAndGrads) {
  auto s = client::connect_in_process();
  auto net = make_mlp();
  net->to(s.device());
  for (const Tensor& p : net->parameters()) {
    EXPECT_EQ(p.device(), s.device());
    EXPECT_TRUE(p.requires_grad());
    EXPECT_TRUE(p.is_leaf());
  }
}

}  // namespace
}  // namespace kiln::testing
