// Trains an MLP and a small CNN on scikit-learn's 8x8 handwritten digits (1,797 real images)
// and reports their accuracy on a held-out 20%. Run it with the README's first command
// (scripts/demo), or by hand:
//   .venv/bin/python examples/digits/export_digits.py build/data/digits
//   build/bin/digits build/data/digits
// Exits with status 1 if a model's held-out accuracy is below 95%.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "kiln/autograd/grad_mode.h"
#include "kiln/data/dataloader.h"
#include "kiln/data/numpy.h"
#include "kiln/data/sampler.h"
#include "kiln/kiln.h"
#include "kiln/nn/nn.h"
#include "kiln/optim/optim.h"
#include "models.h"

using namespace kiln;

namespace {

constexpr uint64_t kSeed = 0;

// The rows of `t` at `rows`, in that order.
Tensor take_rows(const Tensor& t, const std::vector<int64_t>& rows) {
  Tensor index = empty({static_cast<int64_t>(rows.size())}, kInt64);
  std::copy(rows.begin(), rows.end(), index.data_ptr<int64_t>());
  return index_select(t, 0, index);
}

struct Split {
  Tensor x_train, y_train, x_test, y_test;
};

// A seeded shuffle of the examples; the last 20% are held out.
Split split(const Tensor& x, const Tensor& y) {
  int64_t n = x.size(0);
  std::vector<int64_t> order = data::RandomSampler(n, kSeed).indices(0);
  int64_t n_train = n - n / 5;
  std::vector<int64_t> train(order.begin(), order.begin() + n_train);
  std::vector<int64_t> test(order.begin() + n_train, order.end());
  return {take_rows(x, train), take_rows(y, train), take_rows(x, test), take_rows(y, test)};
}

// The fraction of `x` that `model` labels as `y`.
double accuracy(nn::Module& model, const Tensor& x, const Tensor& y) {
  autograd::NoGradGuard no_grad;
  model.eval();
  Tensor correct = eq(argmax(model.forward(x), 1), y).to(kFloat32).sum();
  model.train();
  return correct.item<float>() / static_cast<double>(y.size(0));
}

// Trains `model` on the split's training part (inputs reshaped by `shape`), printing one line
// per epoch; returns the final held-out accuracy.
double fit(const std::string& name, nn::Module& model, const Split& s,
           const std::vector<int64_t>& shape, int epochs, double lr) {
  auto shaped = [&](const Tensor& x) {
    std::vector<int64_t> sizes{x.size(0)};
    sizes.insert(sizes.end(), shape.begin(), shape.end());
    return x.reshape(sizes);
  };
  Tensor x_test = shaped(s.x_test);
  auto dataset =
      std::make_shared<data::TensorDataset>(std::vector<Tensor>{shaped(s.x_train), s.y_train});
  data::DataLoader loader(dataset,
                          {.batch_size = digits::kBatchSize, .shuffle = true, .seed = kSeed});
  optim::AdamW opt(model.parameters(), digits::optimizer_options(lr));
  auto start = std::chrono::steady_clock::now();
  double acc = 0;
  for (int epoch = 1; epoch <= epochs; ++epoch) {
    double loss_sum = 0;
    int64_t batches = 0;
    for (const data::Example& batch : loader) {
      Tensor loss = cross_entropy(model.forward(batch[0]), batch[1]);
      opt.zero_grad();
      loss.backward();
      opt.step();
      loss_sum += loss.item<float>();
      ++batches;
    }
    acc = accuracy(model, x_test, s.y_test);
    std::printf("%-3s epoch %2d  train loss %.4f  held-out accuracy %.2f%%\n", name.c_str(), epoch,
                loss_sum / batches, 100 * acc);
  }
  double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("%s: held-out accuracy %.2f%% (%lld images) after %d epochs, %.1f s\n", name.c_str(),
              100 * acc, static_cast<long long>(s.y_test.size(0)), epochs, seconds);
  return acc;
}

}  // namespace

int main(int argc, char** argv) {
  std::string dir = argc > 1 ? argv[1] : "build/data/digits";
  Tensor x, y;
  try {
    x = data::load_npy(dir + "/X.npy");  // (1797, 64) float32 in [0, 1]
    y = data::load_npy(dir + "/y.npy");  // (1797) int64 labels 0..9
  } catch (const Error& e) {
    std::fprintf(stderr, "digits: %s\n(export the data first: .venv/bin/python "
                 "examples/digits/export_digits.py %s)\n", e.what(), dir.c_str());
    return 2;
  }
  Split s = split(x, y);
  std::printf("digits: %lld images, %lld train / %lld held out\n",
              static_cast<long long>(x.size(0)), static_cast<long long>(s.y_train.size(0)),
              static_cast<long long>(s.y_test.size(0)));

  manual_seed(kSeed);
  auto mlp = digits::make_mlp();
  auto cnn = digits::make_cnn();

  bool ok = true;
  for (auto [name, model, shape, epochs, lr] :
       {std::tuple<std::string, nn::Module*, std::vector<int64_t>, int, double>{
            "mlp", mlp.get(), {64}, 30, digits::kMlpLr},
        {"cnn", cnn.get(), {1, 8, 8}, 20, digits::kCnnLr}}) {
    double acc = fit(name, *model, s, shape, epochs, lr);
    if (acc < 0.95) {
      std::printf("%s: FAILED, held-out accuracy below 95%%\n", name.c_str());
      ok = false;
    }
  }
  return ok ? 0 : 1;
}
