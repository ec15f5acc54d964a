// connect() through a coordinator: OpenSession hands out a session's workers, the Hello names
// the session (the worker checks it with LookupSession), close() ends it with CloseSession.
// The coordinator here is a fake in this process (tests/fake_coordinator.h); the worker is a
// real kiln-worker.
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <mutex>

#include "fake_coordinator.h"
#include "kiln/client/session.h"
#include "kiln/client/gang_pipeline.h"
#include "kiln/client/transport.h"
#include "kiln/dist/pipelining.h"
#include "kiln/nn/nn.h"
#include "kiln/optim/optimizers.h"
#include "kiln/proto/coordinator.grpc.pb.h"
#include "kiln/proto/service.h"
#include "test_util.h"
#include "worker_process.h"

namespace kiln::testing {
namespace {

TEST(RemoteCoordinator, ConnectOpensAndClosesASession) {
  FakeCoordinator coord;
  WorkerProcess w({"--coordinator", coord.address()});
  auto s = client::connect(coord.address(), {.connect_timeout_ms = 5000});
  EXPECT_EQ(s.session_id(), "sess-1");
  EXPECT_EQ(s.world_size(), 1);
  Tensor a = random({3, 4});
  expect_close((a.to(std::nullopt, s.device()) * 2.0).to(std::nullopt, Device(kCPU)), a * 2.0);
  s.close();
  std::lock_guard<std::mutex> lock(coord.mu);
  ASSERT_EQ(coord.opened.size(), 1u);
  EXPECT_EQ(coord.opened[0].protocol_version(), proto::kProtocolVersion);
  EXPECT_EQ(coord.closed, std::vector<std::string>{"sess-1"});
}

// Data-parallel training with one program for two workers: each gets half the batch, the
// gradients are averaged over the gang's process group, and the step equals the full-batch
// step on the CPU.
TEST(RemoteCoordinator, TwoWorkersTrainDataParallel) {
  FakeCoordinator coord;
  WorkerProcess w0({"--coordinator", coord.address(), "--worker-id", "w0"});
  WorkerProcess w1({"--coordinator", coord.address(), "--worker-id", "w1"});
  auto s = client::connect(coord.address(), {.workers = 2, .connect_timeout_ms = 10000});
  ASSERT_EQ(s.world_size(), 2);
  auto make = [] {
    manual_seed(5);
    return std::make_shared<nn::Sequential>(std::vector<nn::ModulePtr>{
        std::make_shared<nn::Linear>(6, 8), std::make_shared<nn::ReLU>(),
        std::make_shared<nn::Linear>(8, 3)});
  };
  Tensor x = random({8, 6}, kFloat32, -1, 1, 9);
  Tensor y = from_vector<int64_t>({0, 1, 2, 0, 1, 2, 0, 1}, {8});
  auto cpu = make();
  optim::SGD cpu_opt(cpu->parameters(), {.lr = 0.5});
  nn::functional::cross_entropy(cpu->forward(x), y).backward();
  cpu_opt.step();

  auto net = make();
  net->to(s.device());
  optim::SGD opt(net->parameters(), {.lr = 0.5});
  nn::functional::cross_entropy(net->forward(s.scatter(x)), s.scatter(y)).backward();
  s.all_reduce_gradients(net->parameters());
  opt.step();
  auto want = cpu->parameters(), got = net->parameters();
  for (size_t i = 0; i < want.size(); ++i)
    expect_close(got[i].to(std::nullopt, Device(kCPU)), want[i], 1e-5, 1e-6);
  s.sync();
}

// A two-stage pipeline on two workers (Note [Gang stages]): each stage's module lives on its
// worker alone, one client drives both through 1F1B, and the step equals the CPU's.
TEST(RemoteCoordinator, TwoWorkersRunAPipeline) {
  FakeCoordinator coord;
  WorkerProcess w0({"--coordinator", coord.address(), "--worker-id", "w0"});
  WorkerProcess w1({"--coordinator", coord.address(), "--worker-id", "w1"});
  auto s = client::connect(coord.address(), {.workers = 2, .connect_timeout_ms = 10000});
  auto make = [] {
    manual_seed(7);
    auto a = std::make_shared<nn::Sequential>(std::vector<nn::ModulePtr>{
        std::make_shared<nn::Linear>(6, 8), std::make_shared<nn::Tanh>()});
    auto b = std::make_shared<nn::Linear>(8, 3);
    return std::make_pair(a, b);
  };
  Tensor x = random({8, 6}, kFloat32, -1, 1, 3);
  Tensor y = from_vector<int64_t>({0, 1, 2, 0, 1, 2, 0, 1}, {8});
  auto [ca, cb] = make();
  nn::functional::cross_entropy(cb->forward(ca->forward(x)), y).backward();

  auto [ra, rb] = make();
  {
    client::StageScope on0({0});
    ra->to(s.device());
  }
  {
    client::StageScope on1({1});
    rb->to(s.device());
  }
  namespace pp = dist::pipelining;
  pp::PipelineStage s0(ra, 0, 2, nullptr), s1(rb, 1, 2, nullptr);
  pp::Schedule sched(
      {&s0, &s1}, pp::ScheduleKind::OneFOneB, 4,
      [](const std::vector<Tensor>& out, const Tensor& target) {
        return nn::functional::cross_entropy(out[0], target);
      },
      false, client::gang_controller(2));
  std::vector<Tensor> losses;
  Tensor xr, yr;
  {
    client::StageScope on0({0});
    xr = x.to(std::nullopt, s.device());
  }
  {
    client::StageScope on1({1});
    yr = y.to(std::nullopt, s.device());
  }
  sched.step({xr}, yr, &losses);
  ASSERT_EQ(losses.size(), 4u);
  auto want = ca->parameters(), got = ra->parameters();
  for (size_t i = 0; i < want.size(); ++i)
    expect_close(got[i].grad().to(std::nullopt, Device(kCPU)), want[i].grad(), 1e-5, 1e-6);
  expect_close(rb->parameters()[0].grad().to(std::nullopt, Device(kCPU)),
               cb->parameters()[0].grad(), 1e-5, 1e-6);
  s.sync();
}

// Malformed transfers (a raw proto, as a bad client could send): every worker named rejects
// the command alike, or the sender reports what differs, and the pair's stream stays in step: a
// good transfer afterwards arrives intact.
TEST(RemoteCoordinator, MalformedTransfersFailCleanly) {
  FakeCoordinator coord;
  WorkerProcess w0({"--coordinator", coord.address(), "--worker-id", "w0"});
  WorkerProcess w1({"--coordinator", coord.address(), "--worker-id", "w1"});
  auto s = client::connect(coord.address(), {.workers = 2, .connect_timeout_ms = 10000});
  client::Connection& c = s.connection();
  Tensor x = random({3});
  Tensor a;
  {
    client::StageScope on0({0});
    a = x.to(std::nullopt, s.device());
  }
  const int64_t a_id = client::remote_value(a, "test").id;
  auto raw = [&](const std::string& dtype, std::vector<int64_t> sizes) {
    std::lock_guard<std::mutex> lock(c.mutex());
    proto::Transfer* t = c.add_command()->mutable_transfer();
    t->set_seq(c.new_seq());
    t->set_input(a_id);
    t->set_output(c.new_id());
    t->add_src(0);
    t->add_dst(1);
    t->set_dtype(dtype);
    for (int64_t n : sizes) t->add_sizes(n);
  };
  auto expect_error = [&](const char* needle) {
    try {
      s.sync();
      FAIL() << "expected an error naming " << needle;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  raw("float32", {4});  // the sender's value is [3]
  expect_error("is [3] float32 here, the command says [4] float32");
  raw("complex999", {3});  // rejected by both, before anything is sent
  expect_error("complex999");
  raw("float32", {-1});
  expect_error("negative size");
  Tensor b = client::transfer(a, {0}, {1});
  expect_close(b.to(std::nullopt, Device(kCPU)), x);
  s.sync();
}

TEST(RemoteCoordinator, ConnectWithoutAddressReadsTheEnvironment) {
  FakeCoordinator coord;
  WorkerProcess w({"--coordinator", coord.address()});
  setenv("KILN_COORDINATOR", coord.address().c_str(), 1);
  setenv("KILN_JOB_ID", "job-42", 1);
  auto s = client::connect();
  unsetenv("KILN_COORDINATOR");
  unsetenv("KILN_JOB_ID");
  EXPECT_EQ(random({2}).to(std::nullopt, s.device()).sum().numel(), 1);
  s.sync();
  std::lock_guard<std::mutex> lock(coord.mu);
  ASSERT_EQ(coord.opened.size(), 1u);
  EXPECT_EQ(coord.opened[0].job_id(), "job-42");
}

TEST(RemoteCoordinator, ADirectWorkerTakesOneWorkerOnly) {
  WorkerProcess w;
  try {
    client::connect(w.address(), {.workers = 2});
    FAIL() << "expected a ValueError";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("is a worker, not a coordinator"), std::string::npos)
        << e.what();
  }
}

TEST(RemoteCoordinator, NoAddressAndNoEnvironmentIsAValueError) {
  unsetenv("KILN_SESSION");
  unsetenv("KILN_COORDINATOR");
  EXPECT_THROW(client::connect(), Error);
}

}  // namespace
}  // namespace kiln::testing
