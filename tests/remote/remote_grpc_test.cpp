// The Remote backend against real kiln-worker processes on loopback: an MLP training step
// equals CPU, a killed worker surfaces as UNAVAILABLE within seconds, a protocol mismatch is
// refused with a clear message, a token is sent. Every wait has a deadline.
#include <gtest/gtest.h>
#include <signal.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>

#include "kiln/client/session.h"
#include "worker_process.h"
#include "kiln/nn/nn.h"
#include "kiln/optim/optimizers.h"
#include "test_util.h"

namespace kiln::testing {
namespace {

using Clock = std::chrono::steady_clock;

std::shared_ptr<nn::Sequential> make_mlp() {
  manual_seed(3);
  return std::make_shared<nn::Sequential>(std::vector<nn::ModulePtr>{
      std::make_shared<nn::Linear>(8, 16), std::make_shared<nn::ReLU>(),
      std::make_shared<nn::Linear>(16, 4)});
}

std::vector<Tensor> mlp_step(std::optional<Device> dev) {
  auto net = make_mlp();
  Tensor x = random({16, 8}, kFloat32, -1, 1, 5);
  Tensor y = from_vector<int64_t>({0, 1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3}, {16});
  if (dev) {
    net->to(*dev);
    x = x.to(std::nullopt, *dev);
    y = y.to(std::nullopt, *dev);
  }
  optim::SGD opt(net->parameters(), {.lr = 0.1});
  Tensor loss = nn::functional::cross_entropy(net->forward(x), y);
  loss.backward();
  opt.step();
  std::vector<Tensor> out{loss.to(std::nullopt, Device(kCPU))};
  for (const Tensor& p : net->parameters()) out.push_back(p.to(std::nullopt, Device(kCPU)));
  return out;
}

TEST(RemoteGrpc, MlpStepEqualsCpu) {
  WorkerProcess w;
  auto s = client::connect(w.address());
  EXPECT_EQ(s.device().type(), DeviceType::Remote);
  auto want = mlp_step(std::nullopt);
  auto got = mlp_step(s.device());
  ASSERT_EQ(want.size(), got.size());
  for (size_t i = 0; i < want.size(); ++i) expect_close(got[i], want[i], 1e-6, 1e-6);
  s.sync();
  s.close();
}

TEST(RemoteGrpc, LargeTensorsRoundTrip) {
  WorkerProcess w;
  auto s = client::connect(w.address());
  Tensor a = random({5 << 18});  // 5 MiB: several messages each way
  expect_close((a.to(std::nullopt, s.device()) + 1.0).to(std::nullopt, Device(kCPU)), a + 1.0, 0, 0);
}

TEST(RemoteGrpc, KilledWorkerIsUnavailableWithinSeconds) {
  WorkerProcess w;
  auto s = client::connect(w.address());
  Tensor r = random({4}).to(std::nullopt, s.device());
  EXPECT_EQ(r.sum().to(std::nullopt, Device(kCPU)).numel(), 1);
  w.kill(SIGKILL);
  auto start = Clock::now();
  try {
    (void)(r * 2.0).sum().item<float>();
    FAIL() << "expected UNAVAILABLE";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("UNAVAILABLE"), std::string::npos) << e.what();
  }
  EXPECT_LT(Clock::now() - start, std::chrono::seconds(5));
  // Every later read fails the same way, at once.
  EXPECT_THROW(s.sync(), Error);
}

// README ("Remote workers"): a frozen worker raises UNAVAILABLE KILN_KEEPALIVE_S seconds
// (default 10) after its last answer (grpc_transport.cpp: a ping after 4 s of silence,
// unanswered for 6 s).
TEST(RemoteGrpc, FrozenWorkerIsUnavailableWithinTheKeepalive) {
  unsetenv("KILN_KEEPALIVE_S");
  WorkerProcess w;
  auto s = client::connect(w.address());
  Tensor r = ones({4}).to(std::nullopt, s.device());
  EXPECT_EQ(r.sum().item<float>(), 4.0f);
  w.freeze();
  auto start = Clock::now();
  try {
    (void)(r + 1.0).sum().item<float>();
    FAIL() << "expected UNAVAILABLE";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("UNAVAILABLE"), std::string::npos) << e.what();
  }
  const double took = std::chrono::duration<double>(Clock::now() - start).count();
  std::printf("[ info ] a frozen worker was noticed after %.1f s\n", took);
  EXPECT_LT(took, 11.0);
  w.thaw();
}

// A second client of a direct worker is refused while the first is connected, and served once it
// closed (See Note [One stream per worker] in kiln/worker/stream_gate.h).
TEST(RemoteGrpc, ADirectWorkerServesOneSessionAtATime) {
  WorkerProcess w;
  auto first = client::connect(w.address());
  EXPECT_EQ(ones({2}).to(std::nullopt, first.device()).sum().item<float>(), 2.0f);
  try {
    client::connect(w.address());
    FAIL() << "expected RESOURCE_EXHAUSTED";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("RESOURCE_EXHAUSTED"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("one session at a time"), std::string::npos) << e.what();
  }
  first.close();
  auto next = client::connect(w.address());
  EXPECT_EQ(ones({2}).to(std::nullopt, next.device()).sum().item<float>(), 2.0f);
}

TEST(RemoteGrpc, UnreachableWorkerFailsFast) {
  auto start = Clock::now();
  try {
    client::connect("127.0.0.1:1", {.connect_timeout_ms = 1000});
    FAIL() << "expected UNAVAILABLE";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("UNAVAILABLE"), std::string::npos) << e.what();
  }
  EXPECT_LT(Clock::now() - start, std::chrono::seconds(5));
}

TEST(RemoteGrpc, VersionMismatchIsRefused) {
  WorkerProcess w;
  try {
    client::make_grpc_transport(w.address(), {.protocol_version = 999});
    FAIL() << "expected a refusal";
  } catch (const Error& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find("FAILED_PRECONDITION"), std::string::npos) << msg;
    EXPECT_NE(msg.find("999"), std::string::npos) << msg;
  }
}

TEST(RemoteGrpc, TokenIsSent) {
  WorkerProcess w({"--token", "s3cret"});
  try {
    client::connect(w.address(), {.token = "wrong"});
    FAIL() << "expected UNAUTHENTICATED";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("UNAUTHENTICATED"), std::string::npos) << e.what();
  }
  auto s = client::connect(w.address(), {.token = "s3cret"});
  EXPECT_EQ(random({3}).to(std::nullopt, s.device()).sum().numel(), 1);
  s.sync();
}

}  // namespace
}  // namespace kiln::testing
