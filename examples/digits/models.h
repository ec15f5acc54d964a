// examples/digits/models.h: the two models and the training settings of examples/digits, shared
// with the PyTorch parity test (tests/nn/digits_parity_test.cpp), which trains them from
// PyTorch's initial weights.
//
//   manual_seed(0);
//   auto mlp = digits::make_mlp();                      // (B, 64) -> (B, 10) logits
//   auto cnn = digits::make_cnn();                      // (B, 1, 8, 8) -> (B, 10) logits
//   kiln::optim::AdamW opt(mlp->parameters(), digits::optimizer_options(digits::kMlpLr));
#pragma once

#include <memory>
#include <vector>

#include "kiln/nn/nn.h"
#include "kiln/optim/optim.h"

namespace digits {

constexpr int64_t kBatchSize = 32;
constexpr double kMlpLr = 2e-3, kCnnLr = 2e-3;

// Linear(64, 128) -> ReLU -> Linear(128, 10). State-dict keys: 0.weight, 0.bias, 2.weight, 2.bias.
inline std::shared_ptr<kiln::nn::Sequential> make_mlp() {
  using namespace kiln::nn;
  return std::make_shared<Sequential>(std::vector<ModulePtr>{std::make_shared<Linear>(64, 128),
                                                             std::make_shared<ReLU>(),
                                                             std::make_shared<Linear>(128, 10)});
}

// x: (B, 1, 8, 8) -> conv3x3(16) -> ReLU -> maxpool2 -> conv3x3(32) -> ReLU -> (B, 512) -> (B, 10).
// State-dict keys: 0.*, 3.*, 6.* (weight, bias).
inline std::shared_ptr<kiln::nn::Sequential> make_cnn() {
  using namespace kiln::nn;
  return std::make_shared<Sequential>(std::vector<ModulePtr>{
      std::make_shared<Conv2d>(1, 16, std::vector<int64_t>{3}, ConvArgs{.padding = {1}}),
      std::make_shared<ReLU>(),
      std::make_shared<MaxPool2d>(std::vector<int64_t>{2}),
      std::make_shared<Conv2d>(16, 32, std::vector<int64_t>{3}, ConvArgs{.padding = {1}}),
      std::make_shared<ReLU>(),
      std::make_shared<Flatten>(),
      std::make_shared<Linear>(32 * 4 * 4, 10),
  });
}

// AdamW, as the example trains both models.
inline kiln::optim::AdamWOptions optimizer_options(double lr) {
  return {.lr = lr, .weight_decay = 1e-4};
}

}  // namespace digits
