// DistributedDataParallel (kiln/dist/ddp.h): with a one-process group (parity with plain
// training, buckets, no_sync, unused parameters), and with two ranks started by `kiln run`
// (DdpTwoRanks re-runs this binary's DdpRanks.* cases as the ranks): the loss and weights match
// single-process training on the doubled batch, no_sync accumulates locally.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "golden/golden_file.h"
#include "kiln/dist/ddp.h"
#include "kiln/nn/nn.h"
#include "kiln/optim/optim.h"
#include "kiln/safetensors.h"
#include "test_util.h"

using namespace kiln;
using dist::DDPOptions;
using dist::DistributedDataParallel;

namespace {

std::shared_ptr<nn::Sequential> small_mlp() {
  return std::make_shared<nn::Sequential>(std::vector<nn::ModulePtr>{
      std::make_shared<nn::Linear>(8, 16), std::make_shared<nn::ReLU>(),
      std::make_shared<nn::Linear>(16, 4)});
}

// A model with rank 0's initial weights (every rank seeds the same way).
std::shared_ptr<nn::Sequential> reference_mlp(uint64_t seed) {
  manual_seed(seed);
  return small_mlp();
}

std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

// A model with a Linear its forward never uses.
struct WithUnused : nn::Module {
  std::shared_ptr<nn::Linear> used = register_module("used", std::make_shared<nn::Linear>(3, 2));
  std::shared_ptr<nn::Linear> unused = register_module("unused", std::make_shared<nn::Linear>(3, 2));
  WithUnused() : nn::Module("WithUnused") {}
  Tensor forward(const Tensor& x) override { return used->forward(x); }
};

namespace fs = std::filesystem;

// Runs `command` through the shell; its exit status, and its stdout in `out`.
int run_command(const std::string& command, std::string* out = nullptr) {
  FILE* p = popen(command.c_str(), "r");
  if (p == nullptr) return -1;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0)
    if (out) out->append(buf, n);
  int status = pclose(p);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

fs::path bin_dir() { return fs::read_symlink("/proc/self/exe").parent_path(); }

// A C-contiguous little-endian .npy file (version 1.0) holding `t`.
void write_npy(const fs::path& path, const Tensor& t) {
  std::ostringstream shape;
  for (int64_t d : t.sizes()) shape << d << ", ";
  std::string header = std::string("{'descr': '") + (t.dtype() == kFloat32 ? "<f4" : "<i8") +
                       "', 'fortran_order': False, 'shape': (" + shape.str() + "), }";
  header.append(63 - (10 + header.size()) % 64, ' ').push_back('\n');
  std::ofstream f(path, std::ios::binary);
  f.write("\x93NUMPY\x01\x00", 8);
  uint16_t len = static_cast<uint16_t>(header.size());
  f.write(reinterpret_cast<const char*>(&len), 2);
  f << header;
  Tensor c = t.contiguous();
  f.write(static_cast<const char*>(c.data_ptr()), c.numel() * c.element_size());
}

// The "train loss" figures of examples/digits' output, one per epoch.
std::vector<double> epoch_losses(const std::string& out) {
  std::vector<double> v;
  std::istringstream in(out);
  for (std::string line; std::getline(in, line);) {
    size_t at = line.find("train loss ");
    if (at != std::string::npos) v.push_back(std::stod(line.substr(at + 11)));
  }
  return v;
}

int group_counter = 0;
DDPOptions local_options() {
  return {.process_group = dist::new_local_group("ddp_test_" + std::to_string(group_counter++))};
}

}  // namespace

TEST(Ddp, OneProcessMatchesPlainTraining) {
  auto plain = reference_mlp(3);
  auto inner = reference_mlp(3);
  auto ddp = std::make_shared<DistributedDataParallel>(inner, local_options());
  EXPECT_EQ(ddp->state_dict().keys()[0], "module.0.weight");
  optim::AdamW opt_plain(plain->parameters(), {});
  optim::AdamW opt_ddp(ddp->parameters(), {});
  manual_seed(7);
  for (int step = 0; step < 4; ++step) {
    Tensor x = randn({5, 8}), y = randint(0, 4, {5});
    Tensor l_plain = cross_entropy(plain->forward(x), y);
    Tensor l_ddp = cross_entropy(ddp->forward(x), y);
    opt_plain.zero_grad();
    opt_ddp.zero_grad();
    l_plain.backward();
    l_ddp.backward();
    EXPECT_EQ(l_plain.item<float>(), l_ddp.item<float>());
    auto pp = plain->parameters(), pd = ddp->parameters();
    for (size_t i = 0; i < pp.size(); ++i) kiln::testing::expect_close(pd[i].grad(), pp[i].grad(), 0, 0);
    opt_plain.step();
    opt_ddp.step();
  }
  auto pp = plain->parameters(), pd = ddp->parameters();
  for (size_t i = 0; i < pp.size(); ++i) kiln::testing::expect_close(pd[i], pp[i], 0, 0);
}

TEST(Ddp, BucketsFollowReverseRegistrationOrderUpToTheCap) {
  auto one = std::make_shared<DistributedDataParallel>(reference_mlp(0), local_options());
  using Names = std::vector<std::vector<std::string>>;
  EXPECT_EQ(one->bucket_parameter_names(), (Names{{"2.bias", "2.weight", "0.bias", "0.weight"}}));
  DDPOptions o = local_options();
  o.bucket_cap_mb = 200.0 / (1024 * 1024);  // 200 bytes: 2.bias (16 B) + 2.weight (256 B) fill one
  auto small = std::make_shared<DistributedDataParallel>(reference_mlp(0), o);
  EXPECT_EQ(small->bucket_parameter_names(), (Names{{"2.bias", "2.weight"}, {"0.bias", "0.weight"}}));
  // Several buckets give the same gradients as one.
  Tensor x = randn({3, 8});
  one->forward(x).sum().backward();
  small->forward(x).sum().backward();
  auto a = one->parameters(), b = small->parameters();
  for (size_t i = 0; i < a.size(); ++i) kiln::testing::expect_close(b[i].grad(), a[i].grad(), 0, 0);
}

TEST(Ddp, NoSyncAccumulatesThenTheNextBackwardSynchronises) {
  auto plain = reference_mlp(1);
  auto ddp = std::make_shared<DistributedDataParallel>(reference_mlp(1), local_options());
  Tensor x = randn({4, 8});
  {
    auto guard = ddp->no_sync();
    EXPECT_FALSE(ddp->require_backward_grad_sync());
    ddp->forward(x).sum().backward();
    ddp->forward(x).sum().backward();
  }
  EXPECT_TRUE(ddp->require_backward_grad_sync());
  ddp->forward(x).sum().backward();
  for (int i = 0; i < 3; ++i) plain->forward(x).sum().backward();
  auto pp = plain->parameters(), pd = ddp->parameters();
  for (size_t i = 0; i < pp.size(); ++i) kiln::testing::expect_close(pd[i].grad(), pp[i].grad(), 1e-6, 1e-6);
}

TEST(Ddp, UnusedParametersRaiseUnlessFindUnusedParameters) {
  Tensor x = randn({2, 3});
  auto strict = std::make_shared<DistributedDataParallel>(std::make_shared<WithUnused>(), local_options());
  std::string err = error_of([&] { strict->forward(x).sum().backward(); });
  EXPECT_NE(err.find("received no gradient in this backward pass: unused.bias, unused.weight"),
            std::string::npos) << err;
  EXPECT_NE(err.find("find_unused_parameters=true"), std::string::npos) << err;
  // The state was reset: the next backward reports the same, not a stale bucket.
  err = error_of([&] { strict->forward(x).sum().backward(); });
  EXPECT_NE(err.find("unused.bias, unused.weight"), std::string::npos) << err;

  DDPOptions o = local_options();
  o.find_unused_parameters = true;
  auto model = std::make_shared<WithUnused>();
  auto lenient = std::make_shared<DistributedDataParallel>(model, o);
  lenient->forward(x).sum().backward();
  kiln::testing::expect_close(model->unused->weight.grad(), zeros({2, 3}), 0, 0);
  EXPECT_TRUE(model->used->weight.grad().defined());
}

TEST(Ddp, ABackwardThatFailsMidwayLeavesNoStaleState) {
  DDPOptions o = local_options();
  o.bucket_cap_mb = 200.0 / (1024 * 1024);  // two buckets: the first starts before the failure
  auto inner = reference_mlp(2);
  auto plain = reference_mlp(2);
  auto ddp = std::make_shared<DistributedDataParallel>(inner, o);
  Tensor first_weight = inner->named_parameters()[0].second;  // "0.weight": its gradient comes last
  bool fail = true;
  autograd::register_hook(first_weight, [&](const Tensor& g) {
    KILN_CHECK(!fail, Runtime, "injected failure");
    return Tensor();
  });
  Tensor x = randn({3, 8});
  EXPECT_NE(error_of([&] { ddp->forward(x).sum().backward(); }).find("injected failure"),
            std::string::npos);
  fail = false;
  ddp->zero_grad();
  ddp->forward(x).sum().backward();
  plain->forward(x).sum().backward();
  auto pp = plain->parameters(), pd = ddp->parameters();
  for (size_t i = 0; i < pp.size(); ++i) kiln::testing::expect_close(pd[i].grad(), pp[i].grad(), 0, 0);
}

TEST(Ddp, BadArguments) {
  EXPECT_NE(error_of([] { DistributedDataParallel(nullptr, local_options()); }).find("module is null"),
            std::string::npos);
  DDPOptions o = local_options();
  o.bucket_cap_mb = 0;
  EXPECT_NE(error_of([&] { DistributedDataParallel(small_mlp(), o); }).find("bucket_cap_mb must be > 0"),
            std::string::npos);
}

// ---- Two ranks --------------------------------------------------------------------------------

// Runs as a rank of `kiln run --nproc 2` (DdpTwoRanks below); skipped otherwise.
TEST(DdpRanks, ParityWithTheDoubledBatchAndNoSync) {
  if (!std::getenv("KILN_DDP_TEST_RANK")) GTEST_SKIP() << "runs under DdpTwoRanks.*";
  auto pg = dist::init_process_group();
  const int rank = pg->rank(), world = pg->size();
  ASSERT_EQ(world, 2);
  constexpr int64_t kB = 6;  // per rank
  manual_seed(100 + rank);  // each rank starts from different weights: DDP copies rank 0's
  auto inner = small_mlp();
  DDPOptions o;
  o.bucket_cap_mb = 200.0 / (1024 * 1024);  // two buckets, launched during backward
  auto ddp = std::make_shared<DistributedDataParallel>(inner, o);
  auto reference = reference_mlp(100);  // rank 0's initial weights
  {
    auto pr = reference->parameters(), pd = ddp->parameters();
    for (size_t i = 0; i < pr.size(); ++i) kiln::testing::expect_close(pd[i], pr[i], 0, 0);
  }
  optim::AdamW opt_ref(reference->parameters(), {});
  optim::AdamW opt_ddp(ddp->parameters(), {});
  Generator data(5);
  for (int step = 0; step < 5; ++step) {
    Tensor x = randn({world * kB, 8}, data), y = randint(0, 4, {world * kB}, data);
    Tensor l_ref = cross_entropy(reference->forward(x), y);
    Tensor l_ddp = cross_entropy(ddp->forward(x.narrow(0, rank * kB, kB)), y.narrow(0, rank * kB, kB));
    opt_ref.zero_grad();
    opt_ddp.zero_grad();
    l_ref.backward();
    l_ddp.backward();
    Tensor mean = l_ddp.detach().clone();
    pg->all_reduce(mean, dist::ReduceOp::Avg)->wait();
    EXPECT_NEAR(mean.item<float>(), l_ref.item<float>(), 1e-5) << "step " << step;
    opt_ref.step();
    opt_ddp.step();
  }
  auto pr = reference->parameters(), pd = ddp->parameters();
  for (size_t i = 0; i < pr.size(); ++i) kiln::testing::expect_close(pd[i], pr[i], 1e-4, 1e-5);

  // no_sync: local gradients only; then one synchronised backward averages the accumulation.
  Tensor x = randn({world * kB, 8}, data);
  auto grads_of = [](nn::Module& m, const Tensor& in) {
    m.zero_grad();
    Tensor out = m.forward(in);
    (out * out).mean().backward();
    std::vector<Tensor> g;
    for (auto& p : m.parameters()) g.push_back(p.grad().clone());
    return g;
  };
  auto local = grads_of(*reference, x.narrow(0, rank * kB, kB));
  auto other = grads_of(*reference, x.narrow(0, (1 - rank) * kB, kB));
  ddp->zero_grad();
  {
    auto guard = ddp->no_sync();
    Tensor out = ddp->forward(x.narrow(0, rank * kB, kB));
    (out * out).mean().backward();
  }
  for (size_t i = 0; i < pd.size(); ++i) kiln::testing::expect_close(pd[i].grad(), local[i], 1e-5, 1e-6);
  Tensor out = ddp->forward(x.narrow(0, rank * kB, kB));
  (out * out).mean().backward();
  for (size_t i = 0; i < pd.size(); ++i)
    kiln::testing::expect_close(pd[i].grad(), local[i] + other[i], 1e-5, 1e-6);  // mean of 2 * each

  // find_unused_parameters: rank 1 never uses `extra`; both ranks get half of rank 0's gradient.
  struct SometimesUnused : nn::Module {
    std::shared_ptr<nn::Linear> used = register_module("used", std::make_shared<nn::Linear>(3, 2));
    std::shared_ptr<nn::Linear> extra = register_module("extra", std::make_shared<nn::Linear>(3, 2));
    bool use_extra;
    explicit SometimesUnused(bool u) : nn::Module("SometimesUnused"), use_extra(u) {}
    Tensor forward(const Tensor& x) override {
      return use_extra ? used->forward(x) + extra->forward(x) : used->forward(x);
    }
  };
  manual_seed(4);
  auto model = std::make_shared<SometimesUnused>(rank == 0);
  DDPOptions lenient;
  lenient.find_unused_parameters = true;
  auto ddp2 = std::make_shared<DistributedDataParallel>(model, lenient);
  Tensor x2 = ones({2, 3});
  ddp2->forward(x2).sum().backward();
  // d(sum)/d(extra.weight) on rank 0 is 2 (rows of x2) per element; the average is 1.
  kiln::testing::expect_close(model->extra->weight.grad(), full({2, 3}, 1.0), 0, 0);
  kiln::testing::expect_close(model->used->weight.grad(), full({2, 3}, 2.0), 0, 0);
  dist::destroy_process_group();
}

// Starts this binary's DdpRanks.* case as two ranks of `kiln run` (built next to it).
TEST(DdpTwoRanks, ParityWithTheDoubledBatchAndNoSync) {
  fs::path kiln = bin_dir() / "kiln";
  ASSERT_TRUE(fs::exists(kiln)) << kiln << " is missing: build the kiln target too";
  std::string out;
  std::string cmd = "KILN_DDP_TEST_RANK=1 OMP_NUM_THREADS=1 KILN_COMM_TIMEOUT_S=30 " +
                    kiln.string() + " run --nproc 2 --timeout 120 " +
                    fs::read_symlink("/proc/self/exe").string() +
                    " --gtest_filter=DdpRanks.ParityWithTheDoubledBatchAndNoSync 2>&1";
  EXPECT_EQ(run_command(cmd, &out), 0) << cmd << "\n" << out;
}

// examples/digits under `kiln run --nproc 2` (batch 32 per rank) prints the losses of a single
// process on batches of 64, on the digits of tests/golden (the example's data, as .npy files).
TEST(DdpTwoRanks, DigitsMatchesOneProcessOnTheDoubledBatch) {
  fs::path kiln = bin_dir() / "kiln", digits = bin_dir() / "digits";
  ASSERT_TRUE(fs::exists(kiln) && fs::exists(digits)) << "build the kiln and digits targets too";
  fs::path golden = kiln::testing::find_golden_file("digits_parity_data.safetensors");
  ASSERT_FALSE(golden.empty());
  auto data = load_safetensors(golden.string()).tensors;
  fs::path dir = fs::temp_directory_path() / ("kiln_ddp_digits_" + std::to_string(getpid()));
  fs::create_directories(dir);
  write_npy(dir / "X.npy", div(data.at("pixels").to(kFloat32), scalar_tensor_of(16, kFloat32)));
  write_npy(dir / "y.npy", data.at("labels").to(kInt64));
  const std::string args = dir.string() + " --mlp-only --epochs 3 --batch-size ";
  std::string one, two;
  EXPECT_EQ(run_command("OMP_NUM_THREADS=1 " + digits.string() + " " + args + "64", &one), 1)
      << one;  // 3 epochs stay below the 95% bar: status 1 in both runs
  EXPECT_EQ(run_command(kiln.string() + " run --nproc 2 --timeout 120 " + digits.string() + " " +
                            args + "32 2>&1",
                        &two),
            1)
      << two;
  fs::remove_all(dir);
  std::vector<double> a = epoch_losses(one), b = epoch_losses(two);
  ASSERT_EQ(a.size(), 3u) << one;
  ASSERT_EQ(b.size(), 3u) << two;
  for (size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(b[i], a[i], 1e-5 * std::abs(a[i]) + 2e-6) << i;
}
