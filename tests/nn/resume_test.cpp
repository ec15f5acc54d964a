// Resuming from a training checkpoint reproduces the uninterrupted run bit for bit: a model with
// dropout, a shuffling DataLoader (with and without worker threads), AdamW and OneCycleLR train
// 2K steps straight, or K steps, a checkpoint (kiln/nn/checkpoint.h: model, optimizer,
// scheduler, RNG state, loader position), brand-new objects loaded from it, and K more steps.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <cstring>
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <tuple>
#include <vector>

#include "kiln/data/dataloader.h"
#include "kiln/nn/checkpoint.h"
#include "kiln/nn/nn.h"
#include "kiln/optim/optim.h"
#include "test_util.h"

namespace kiln {
namespace {

using json = nlohmann::json;
// Steps before the checkpoint (K): 8 batches per epoch, so 11 lands mid-epoch and 8 right after
// an epoch's last batch.
constexpr int64_t kStepsMidEpoch = 11, kStepsEpochEnd = 8;

std::shared_ptr<data::Dataset> dataset() {
  Tensor x = testing::random({60, 8}, kFloat32, -1, 1, 3);
  Tensor y = testing::random({60}, kInt64, 0, 3, 4);
  return std::make_shared<data::TensorDataset>(std::vector<Tensor>{x, y});
}

// One training run's objects, built from the RNG's current state.
struct Trainer {
  std::shared_ptr<nn::Sequential> model;
  std::unique_ptr<optim::AdamW> opt;
  std::unique_ptr<optim::OneCycleLR> sched;
  std::unique_ptr<data::DataLoader> loader;

  Trainer(int num_workers, int64_t total_steps) {
    model = std::make_shared<nn::Sequential>(std::vector<nn::ModulePtr>{
        std::make_shared<nn::Linear>(8, 32), std::make_shared<nn::ReLU>(),
        std::make_shared<nn::Dropout>(0.3), std::make_shared<nn::Linear>(32, 3)});
    opt = std::make_unique<optim::AdamW>(model->parameters(),
                                         optim::AdamWOptions{.lr = 1e-2, .weight_decay = 0.1});
    sched = std::make_unique<optim::OneCycleLR>(
        *opt, optim::OneCycleLROptions{.max_lr = {1e-2}, .total_steps = total_steps});
    loader = std::make_unique<data::DataLoader>(
        dataset(), data::DataLoaderOptions{
                       .batch_size = 8, .shuffle = true, .seed = 5, .num_workers = num_workers});
  }

  float step() {
    std::optional<data::Example> batch = loader->next();
    if (!batch) batch = loader->next();  // the end of an epoch
    Tensor loss = cross_entropy(model->forward((*batch)[0]), (*batch)[1]);
    opt->zero_grad();
    loss.backward();
    opt->step();
    sched->step();
    return loss.item<float>();
  }

  nn::Checkpoint save() const {
    nn::Checkpoint c;
    for (const auto& [name, t] : model->state_dict()) c.groups["model"][name] = t;
    optim::StateDict osd = opt->state_dict();
    c.groups["optimizer"] = TensorMap(osd.state.begin(), osd.state.end());
    GeneratorState rng = default_generator().get_state();
    c.metadata = json{{"optimizer", json::parse(osd.groups_to_json())},
                      {"scheduler", sched->state_dict()},
                      {"rng", {{"seed", rng.seed}, {"offset", rng.offset}}},
                      {"loader", json::parse(loader->position().to_json())}}
                     .dump();
    return c;
  }

  void load(const nn::Checkpoint& c) {
    json meta = json::parse(c.metadata);
    nn::StateDict sd;
    for (const auto& [name, t] : c.groups.at("model")) sd.insert(name, t);
    model->load_state_dict(sd);
    optim::StateDict osd;
    const TensorMap& state = c.groups.at("optimizer");
    osd.state = std::map<std::string, Tensor>(state.begin(), state.end());
    osd.param_groups = optim::StateDict::groups_from_json(meta.at("optimizer").dump());
    opt->load_state_dict(osd);
    sched->load_state_dict(meta.at("scheduler").get<std::map<std::string, double>>());
    default_generator().set_state(
        {meta.at("rng").at("seed").get<uint64_t>(), meta.at("rng").at("offset").get<uint64_t>()});
    loader->set_position(data::LoaderPosition::from_json(meta.at("loader").dump()));
  }
};

std::string temp_dir() {
  std::string tmpl = (std::filesystem::path(::testing::TempDir()) / "kiln_resume_XXXXXX").string();
  KILN_ASSERT(mkdtemp(tmpl.data()) != nullptr);
  return tmpl;
}

void expect_same_bits(const std::vector<Tensor>& a, const std::vector<Tensor>& b,
                      const char* what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  for (size_t i = 0; i < a.size(); ++i) {
    ASSERT_EQ(a[i].sizes(), b[i].sizes()) << what << " " << i;
    Tensor x = a[i].contiguous(), y = b[i].contiguous();
    EXPECT_EQ(std::memcmp(x.data_ptr(), y.data_ptr(), x.nbytes()), 0) << what << " " << i;
  }
}

class Resume : public ::testing::TestWithParam<std::tuple<int, int64_t>> {};

TEST_P(Resume, EqualsTheUninterruptedRunBitForBit) {
  const auto [workers, k] = GetParam();  // K
  const int64_t total = 2 * k + 1;
  manual_seed(1);
  Trainer straight(workers, total);
  std::vector<float> want;
  for (int64_t i = 0; i < 2 * k; ++i) want.push_back(straight.step());

  manual_seed(1);
  std::vector<float> got;
  const std::string dir = temp_dir();
  {
    Trainer first(workers, total);
    for (int64_t i = 0; i < k; ++i) got.push_back(first.step());
    nn::save_checkpoint(dir, first.save());
    for (int i = 0; i < 3; ++i) first.step();  // the process goes on, then dies
  }
  manual_seed(99);  // the new process starts elsewhere: other weights, another RNG state
  Trainer resumed(workers, total);
  resumed.load(nn::load_checkpoint(dir));
  std::filesystem::remove_all(dir);
  for (int64_t i = 0; i < k; ++i) got.push_back(resumed.step());

  ASSERT_EQ(got.size(), want.size());
  EXPECT_EQ(std::memcmp(got.data(), want.data(), want.size() * sizeof(float)), 0);
  for (size_t i = 0; i < want.size(); ++i) EXPECT_EQ(got[i], want[i]) << "step " << i;
  expect_same_bits(resumed.model->parameters(), straight.model->parameters(), "parameter");
  std::vector<Tensor> a, b;
  for (const auto& [key, t] : resumed.opt->state_dict().state) a.push_back(t);
  for (const auto& [key, t] : straight.opt->state_dict().state) b.push_back(t);
  expect_same_bits(a, b, "optimizer state");
  EXPECT_EQ(resumed.opt->param_groups()[0].options, straight.opt->param_groups()[0].options);
  EXPECT_EQ(resumed.loader->position(), straight.loader->position());
}

INSTANTIATE_TEST_SUITE_P(Loaders, Resume,
                         ::testing::Combine(::testing::Values(0, 2),
                                            ::testing::Values(kStepsMidEpoch, kStepsEpochEnd)),
                         [](const auto& info) {
                           return std::to_string(std::get<0>(info.param)) + "_workers_" +
                                  std::to_string(std::get<1>(info.param)) + "_steps";
                         });

}  // namespace
}  // namespace kiln
