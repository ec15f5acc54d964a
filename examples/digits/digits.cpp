// Trains an MLP and a small CNN on scikit-learn's 8x8 handwritten digits (1,797 real images)
// and reports their accuracy on a held-out 20%. Run it with the README's first command
// (scripts/demo), or by hand:
//   .venv/bin/python examples/digits/export_digits.py build/data/digits
//   build/bin/digits build/data/digits
// Exits with status 1 if a model's held-out accuracy is below 95%.
//
// Data-parallel: under `kiln run --nproc N build/bin/digits` (WORLD_SIZE > 1) every rank trains a
// DistributedDataParallel replica on its DistributedSampler share, batch_size images per rank per
// step, so the run takes the steps of single-process training on batches N times as large
// (`digits --batch-size 64` for two ranks of 32) and prints the same losses within float32
// tolerance. Rank 0 prints and sets the exit status. Flags: --epochs E (both models), --batch-size B, --mlp-only.
//
// Remote: `digits --remote HOST:PORT` (or KILN_REMOTE=HOST:PORT) trains on a kiln-worker (or a
// coordinator's session): the client records every op, the worker runs them, same accuracy.
// `--remote COORDINATOR --workers N` trains data-parallel on a gang of N workers: one recorded
// program, each worker a 1/N share of every batch, gradients averaged over the gang. Run by
// `kiln submit --workers N -- digits` it trains on the job's gang.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "kiln/autograd/grad_mode.h"
#include "kiln/client/session.h"
#include "kiln/data/dataloader.h"
#include "kiln/data/numpy.h"
#include "kiln/data/sampler.h"
#include "kiln/dist/ddp.h"
#include "kiln/kiln.h"
#include "kiln/nn/nn.h"
#include "kiln/optim/optim.h"
#include "models.h"

using namespace kiln;

namespace {

constexpr uint64_t kSeed = 0;

struct Flags {
  std::string dir = "build/data/digits";
  int epochs = 0;  // 0: each model's default
  int64_t batch_size = digits::kBatchSize;
  bool mlp_only = false;
  std::string remote;  // a worker or coordinator address; "" trains here
  int workers = 1;     // remote workers (a gang when > 1)
};

// Where the models train: the CPU, or the remote session's device.
Device g_device = kCPU;
client::Session g_session;

// The default group when launched with WORLD_SIZE > 1, else null (single process).
dist::ProcessGroupPtr g_group;
bool is_rank0() { return !g_group || g_group->rank() == 0; }

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
// per epoch; returns the final held-out accuracy. Data-parallel when g_group is set.
double fit(const std::string& name, nn::ModulePtr model, const Split& s,
           const std::vector<int64_t>& shape, int epochs, double lr, int64_t batch_size) {
  auto shaped = [&](const Tensor& x) {
    std::vector<int64_t> sizes{x.size(0)};
    sizes.insert(sizes.end(), shape.begin(), shape.end());
    return x.reshape(sizes);
  };
  Tensor x_test = shaped(s.x_test).to(std::nullopt, g_device);
  Tensor y_test = s.y_test.to(std::nullopt, g_device);
  model->to(g_device);
  auto dataset =
      std::make_shared<data::TensorDataset>(std::vector<Tensor>{shaped(s.x_train), s.y_train});
  data::DataLoaderOptions options{.batch_size = batch_size, .shuffle = true, .seed = kSeed};
  nn::ModulePtr trained = model;
  if (g_group) {
    // The same per-epoch order as the single-process shuffle, dealt out across the ranks.
    options.shuffle = false;
    options.sampler = std::make_shared<data::DistributedSampler>(
        dataset->size(), data::DistributedSamplerOptions{.seed = kSeed});
    trained = std::make_shared<dist::DistributedDataParallel>(model);
  }
  data::DataLoader loader(dataset, options);
  optim::AdamW opt(trained->parameters(), digits::optimizer_options(lr));
  auto start = std::chrono::steady_clock::now();
  double acc = 0;
  for (int epoch = 1; epoch <= epochs; ++epoch) {
    Tensor loss_sum = zeros({1}, std::nullopt, g_device);
    int64_t batches = 0;
    for (const data::Example& batch : loader) {
      bool gang = g_session.world_size() > 1 && batch[0].size(0) % g_session.world_size() == 0;
      auto place = [&](const Tensor& t) {
        return gang ? g_session.scatter(t) : t.to(std::nullopt, g_device);
      };
      Tensor loss = cross_entropy(trained->forward(place(batch[0])), place(batch[1]));
      opt.zero_grad();
      loss.backward();
      if (gang) g_session.all_reduce_gradients(trained->parameters());
      opt.step();
      loss_sum.add_(loss.detach());
      ++batches;
    }
    if (g_group) g_group->all_reduce(loss_sum, dist::ReduceOp::Avg)->wait();
    acc = accuracy(*model, x_test, y_test);
    if (is_rank0())
      std::printf("%-3s epoch %2d  train loss %.6f  held-out accuracy %.2f%%\n", name.c_str(),
                  epoch, loss_sum.item<float>() / batches, 100 * acc);
  }
  double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (is_rank0())
    std::printf("%s: held-out accuracy %.2f%% (%lld images) after %d epochs, %.1f s\n",
                name.c_str(), 100 * acc, static_cast<long long>(s.y_test.size(0)), epochs, seconds);
  return acc;
}

Flags parse_flags(int argc, char** argv) {
  Flags f;
  bool have_dir = false;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "digits: %s needs a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--epochs") f.epochs = std::stoi(value());
    else if (a == "--batch-size") f.batch_size = std::stoll(value());
    else if (a == "--mlp-only") f.mlp_only = true;
    else if (a == "--remote") f.remote = value();
    else if (a == "--workers") f.workers = std::stoi(value());
    else if (!a.starts_with("--") && !have_dir) f.dir = a, have_dir = true;
    else {
      std::fprintf(stderr, "digits: unknown argument '%s' (usage: digits [DIR] [--epochs E] "
                   "[--batch-size B] [--mlp-only] [--remote ADDR [--workers N]])\n", a.c_str());
      std::exit(2);
    }
  }
  if (const char* r = std::getenv("KILN_REMOTE"); r && f.remote.empty()) f.remote = r;
  return f;
}

}  // namespace

int main(int argc, char** argv) {
  Flags flags = parse_flags(argc, argv);
  const std::string& dir = flags.dir;
  Tensor x, y;
  try {
    x = data::load_npy(dir + "/X.npy");  // (1797, 64) float32 in [0, 1]
    y = data::load_npy(dir + "/y.npy");  // (1797) int64 labels 0..9
  } catch (const Error& e) {
    std::fprintf(stderr, "digits: %s\n(export the data first: .venv/bin/python "
                 "examples/digits/export_digits.py %s)\n", e.what(), dir.c_str());
    return 2;
  }
  const char* world = std::getenv("WORLD_SIZE");
  if (world && std::atoi(world) > 1) g_group = dist::init_process_group();
  // A job's driver (`kiln submit`) trains on the job's workers.
  if (!flags.remote.empty() || std::getenv("KILN_JOB_ID")) {
    g_session = client::connect(flags.remote, {.workers = flags.workers});
    g_device = g_session.device();
  }
  Split s = split(x, y);
  if (is_rank0())
    std::printf("digits: %lld images, %lld train / %lld held out%s\n",
                static_cast<long long>(x.size(0)), static_cast<long long>(s.y_train.size(0)),
                static_cast<long long>(s.y_test.size(0)),
                g_group ? (", " + std::to_string(g_group->size()) + " ranks of batch " +
                           std::to_string(flags.batch_size)).c_str() : "");

  manual_seed(kSeed);
  auto mlp = digits::make_mlp();
  auto cnn = digits::make_cnn();

  bool ok = true;
  for (auto [name, model, shape, epochs, lr] :
       {std::tuple<std::string, nn::ModulePtr, std::vector<int64_t>, int, double>{
            "mlp", mlp, {64}, 30, digits::kMlpLr},
        {"cnn", cnn, {1, 8, 8}, 20, digits::kCnnLr}}) {
    if (flags.mlp_only && name != "mlp") continue;
    double acc = fit(name, model, s, shape, flags.epochs > 0 ? flags.epochs : epochs, lr,
                     flags.batch_size);
    if (acc < 0.95) {
      if (is_rank0()) std::printf("%s: FAILED, held-out accuracy below 95%%\n", name.c_str());
      ok = false;
    }
  }
  const bool reporter = is_rank0();  // the ranks agree on the accuracy: rank 0 reports it
  if (g_group) dist::destroy_process_group();
  g_session.close();
  return ok || !reporter ? 0 : 1;
}
