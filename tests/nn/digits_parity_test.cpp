// Parity with PyTorch for examples/digits: Kiln trains the example's MLP and CNN from PyTorch's
// initial weights on PyTorch's batch order and must match PyTorch's step-1 loss to 1e-5 and its
// held-out loss after N steps within 3%, and every step's loss within 1% (measured: about 1e-7
// relative at step 1, 1e-4 over the steps; tests/golden/digits_parity_gen.cpp made the files).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "../../examples/digits/models.h"
#include "golden/golden_file.h"
#include "kiln/autograd/grad_mode.h"
#include "kiln/safetensors.h"
#include "test_util.h"

namespace kiln {
namespace {

using testing::Golden;

Tensor load(const std::string& file, const std::string& name) {
  std::filesystem::path path = testing::find_golden_file(file);
  KILN_ASSERT(!path.empty(), "tests/golden/", file, " not found");
  return load_safetensors(path.string()).tensors.at(name);
}

nn::StateDict load_weights(const std::string& file) {
  std::filesystem::path path = testing::find_golden_file(file);
  KILN_ASSERT(!path.empty(), "tests/golden/", file, " not found");
  nn::StateDict sd;
  for (const auto& [name, t] : load_safetensors(path.string()).tensors) sd.insert(name, t);
  return sd;
}

Tensor indices(const Golden& g) {
  std::vector<int64_t> v(g.values.begin(), g.values.end());
  return testing::from_vector<int64_t>(v, g.sizes);
}

struct ParityRun {
  std::vector<double> losses;
  double heldout_loss;
};

// The generator's loop: per step, cross-entropy of the batch, zero_grad, backward, AdamW step.
ParityRun train(nn::Module& model, const std::vector<int64_t>& shape, double lr) {
  auto golden = testing::read_golden_file("digits_parity.bin");
  Tensor x = div(load("digits_parity_data.safetensors", "pixels").to(kFloat32),
                 scalar_tensor_of(16, kFloat32));  // exact, as export_digits.py
  Tensor y = load("digits_parity_data.safetensors", "labels");
  auto shaped = [&](const Tensor& idx) {
    std::vector<int64_t> sizes{idx.size(0)};
    sizes.insert(sizes.end(), shape.begin(), shape.end());
    return index_select(x, 0, idx).reshape(sizes);
  };
  Tensor batches = indices(golden.at("train_batches")), heldout = indices(golden.at("heldout"));
  optim::AdamW opt(model.parameters(), digits::optimizer_options(lr));
  ParityRun run;
  for (int64_t step = 0; step < batches.size(0); ++step) {
    Tensor idx = batches.select(0, step).contiguous();
    Tensor loss = cross_entropy(model.forward(shaped(idx)), index_select(y, 0, idx));
    opt.zero_grad();
    loss.backward();
    opt.step();
    run.losses.push_back(loss.item<float>());
  }
  autograd::NoGradGuard no_grad;
  run.heldout_loss =
      cross_entropy(model.forward(shaped(heldout)), index_select(y, 0, heldout)).item<float>();
  return run;
}

void check_parity(const std::string& name, nn::Module& model, const std::vector<int64_t>& shape,
                  double lr) {
  model.load_state_dict(load_weights("digits_parity_" + name + ".safetensors"));
  auto golden = testing::read_golden_file("digits_parity.bin");
  const std::vector<double>& want = golden.at(name + ".losses").values;
  const double want_heldout = golden.at(name + ".heldout_loss").values.at(0);
  ParityRun got = train(model, shape, lr);
  ASSERT_EQ(got.losses.size(), want.size());
  EXPECT_NEAR(got.losses[0], want[0], 1e-5) << name << " step-1 loss";
  double worst = 0;
  for (size_t i = 0; i < want.size(); ++i)
    worst = std::max(worst, std::abs(got.losses[i] - want[i]) / std::abs(want[i]));
  EXPECT_LT(worst, 1e-2) << name << ": a training loss strays from PyTorch's";
  const double heldout_rel = std::abs(got.heldout_loss - want_heldout) / want_heldout;
  EXPECT_LT(heldout_rel, 0.03) << name << " held-out loss " << got.heldout_loss << " vs PyTorch's "
                               << want_heldout;
  std::printf(
      "%s parity: step-1 loss %.9g (PyTorch %.9g, |diff| %.2g); worst per-step relative "
      "loss difference over %zu steps %.2g; held-out loss %.9g (PyTorch %.9g, relative "
      "difference %.2g)\n",
      name.c_str(), got.losses[0], want[0], std::abs(got.losses[0] - want[0]), want.size(), worst,
      got.heldout_loss, want_heldout, heldout_rel);
}

TEST(DigitsParity, Mlp) {
  auto mlp = digits::make_mlp();
  check_parity("mlp", *mlp, {64}, digits::kMlpLr);
}

TEST(DigitsParity, Cnn) {
  auto cnn = digits::make_cnn();
  check_parity("cnn", *cnn, {1, 8, 8}, digits::kCnnLr);
}

// The committed weights are exactly the example's models' state dicts: same keys and shapes.
TEST(DigitsParity, WeightsMatchTheExampleModels) {
  for (auto [name, model] :
       {std::pair<std::string, std::shared_ptr<nn::Sequential>>{"mlp", digits::make_mlp()},
        {"cnn", digits::make_cnn()}}) {
    nn::StateDict mine = model->state_dict(),
                  theirs = load_weights("digits_parity_" + name + ".safetensors");
    EXPECT_EQ(mine.size(), theirs.size()) << name;
    for (const auto& [key, t] : mine) {
      ASSERT_TRUE(theirs.contains(key)) << name << " " << key;
      EXPECT_EQ(theirs.at(key).sizes(), t.sizes()) << name << " " << key;
      EXPECT_EQ(theirs.at(key).dtype(), kFloat32) << name << " " << key;
    }
  }
}

}  // namespace
}  // namespace kiln
