// examples/chargpt's GPT against PyTorch's: the files of tests/golden/chargpt_parity_* (written by
// tests/golden/chargpt_parity_gen.cpp with libtorch) hold a reduced GPT's initial weights (context
// 32, 2 layers, 4 heads, width 64), a 32 KiB slice of the fortunes text, the batch windows of 30
// AdamW steps, PyTorch's loss at each step and its validation loss after the last one. Kiln
// starts from the same weights, trains on the same batches, and must match step 1's loss to 1e-5
// and the validation loss within 3% (each step's loss within 1e-4 relative; the measured
// differences are about 2e-6).
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <iterator>
#include <string>

#include "../../examples/chargpt/gpt.h"
#include "golden/golden_file.h"
#include "kiln/autograd/grad_mode.h"
#include "kiln/safetensors.h"

namespace kiln::nn {
namespace {

using testing::Golden;

constexpr size_t kTrainBytes = 28672;  // chargpt_parity_gen.cpp: the slice's first 28 KiB train

class ChargptParity : public ::testing::Test {
 protected:
  void SetUp() override {
    golden = testing::read_golden_file("chargpt_parity.bin");
    ASSERT_TRUE(golden.count("config") && golden.count("losses") && golden.count("val_loss"));
    const std::vector<double>& c = golden.at("config").values;
    config = {.vocab = int64_t(c[0]),
              .block = int64_t(c[1]),
              .layers = int64_t(c[2]),
              .heads = int64_t(c[3]),
              .width = int64_t(c[4]),
              .fused_attention = false};
    batch = int64_t(c[5]);
    std::filesystem::path text_path = testing::find_golden_file("chargpt_parity_text.bin");
    ASSERT_FALSE(text_path.empty()) << "tests/golden/chargpt_parity_text.bin not found";
    std::ifstream in(text_path, std::ios::binary);
    text.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
    ASSERT_EQ(text.size(), 32768u);
    std::filesystem::path init = testing::find_golden_file("chargpt_parity_init.safetensors");
    ASSERT_FALSE(init.empty()) << "tests/golden/chargpt_parity_init.safetensors not found";
    for (const auto& [name, t] : load_safetensors(init.string()).tensors) weights.insert(name, t);
  }

  // x, y: (n, block) windows of `part` at starts[first, first + n).
  std::pair<Tensor, Tensor> windows(const std::string& part, const std::vector<double>& starts,
                                    size_t first, int64_t n) const {
    const int64_t T = config.block;
    Tensor x = empty({n, T}, kInt64), y = empty({n, T}, kInt64);
    int64_t *px = x.data_ptr<int64_t>(), *py = y.data_ptr<int64_t>();
    for (int64_t b = 0; b < n; ++b) {
      const int64_t s = static_cast<int64_t>(starts[first + b]);
      for (int64_t t = 0; t < T; ++t) {
        px[b * T + t] = static_cast<unsigned char>(part[s + t]);
        py[b * T + t] = static_cast<unsigned char>(part[s + t + 1]);
      }
    }
    return {x, y};
  }

  Tensor loss_of(chargpt::GPT& model, const Tensor& x, const Tensor& y) const {
    return cross_entropy(model.forward(x).reshape({-1, config.vocab}), y.reshape({-1}));
  }

  std::map<std::string, Golden> golden;
  chargpt::GPTConfig config;
  int64_t batch = 0;
  std::string text;
  StateDict weights;
};

TEST_F(ChargptParity, StateDictKeysMatchPyTorch) {
  chargpt::GPT model(config);
  std::vector<std::string> ours = model.state_dict().keys(), theirs = weights.keys();
  std::sort(ours.begin(), ours.end());
  std::sort(theirs.begin(), theirs.end());
  EXPECT_EQ(ours, theirs);
}

TEST_F(ChargptParity, TrainingMatchesPyTorch) {
  chargpt::GPT model(config);
  model.load_state_dict(weights);
  optim::AdamW opt(chargpt::decay_groups(model, 0.1), {.lr = 1e-3});
  const std::string train = text.substr(0, kTrainBytes), val = text.substr(kTrainBytes);
  const std::vector<double>& starts = golden.at("starts").values;
  const std::vector<double>& want = golden.at("losses").values;
  double max_rel = 0;
  for (size_t s = 0; s < want.size(); ++s) {
    auto [x, y] = windows(train, starts, s * batch, batch);
    opt.zero_grad();
    Tensor loss = loss_of(model, x, y);
    loss.backward();
    opt.step();
    const double got = loss.item<float>();
    if (s == 0) {
      EXPECT_NEAR(got, want[0], 1e-5) << "step 1 loss";
    }
    max_rel = std::max(max_rel, std::abs(got - want[s]) / want[s]);
    EXPECT_NEAR(got, want[s], 1e-4 * want[s]) << "step " << s + 1 << " loss";
  }
  autograd::NoGradGuard no_grad;
  const std::vector<double>& val_starts = golden.at("val_starts").values;
  auto [x, y] = windows(val, val_starts, 0, static_cast<int64_t>(val_starts.size()));
  const double val_loss = loss_of(model, x, y).item<float>();
  const double want_val = golden.at("val_loss").values[0];
  EXPECT_NEAR(val_loss, want_val, 0.03 * want_val)
      << "validation loss after " << want.size() << " steps";
  std::printf(
      "chargpt parity: %zu steps, largest relative loss difference %.2e; validation loss "
      "%.6f vs PyTorch's %.6f (%.2e relative)\n",
      want.size(), max_rel, val_loss, want_val, std::abs(val_loss - want_val) / want_val);
}

// The fused attention kernel computes the written-out attention's loss.
TEST_F(ChargptParity, FusedAttentionMatchesWrittenOut) {
  chargpt::GPTConfig fused_config = config;
  fused_config.fused_attention = true;
  chargpt::GPT model(fused_config);
  model.load_state_dict(weights);
  auto [x, y] = windows(text, golden.at("starts").values, 0, batch);
  EXPECT_NEAR(loss_of(model, x, y).item<float>(), golden.at("losses").values[0], 1e-5);
}

TEST_F(ChargptParity, TooLongSequenceIsAClearError) {
  chargpt::GPT model(config);
  Tensor idx = zeros({1, config.block + 1}, kInt64);
  try {
    model.forward(idx);
    FAIL() << "expected a ValueError";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::Value);
    EXPECT_NE(std::string(e.what()).find("sequence length 33 exceeds the context of 32"),
              std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace kiln::nn
