// connect() through a coordinator: OpenSession hands out a session's workers, the Hello names
// the session (the worker checks it with LookupSession), close() ends it with CloseSession.
// The coordinator here is a fake in this process; the worker is a real kiln-worker.
#include <gtest/gtest.h>
#include <grpcpp/grpcpp.h>

#include <condition_variable>
#include <map>
#include <mutex>

#include "kiln/client/session.h"
#include "kiln/nn/nn.h"
#include "kiln/optim/optimizers.h"
#include "kiln/proto/coordinator.grpc.pb.h"
#include "kiln/proto/service.h"
#include "test_util.h"
#include "worker_process.h"

namespace kiln::testing {
namespace {

class FakeCoordinator final : public proto::Coordinator::Service {
 public:
  FakeCoordinator() {
    grpc::ServerBuilder b;
    b.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port_);
    b.RegisterService(this);
    server_ = b.BuildAndStart();
  }
  ~FakeCoordinator() override { server_->Shutdown(std::chrono::system_clock::now()); }
  std::string address() const { return "127.0.0.1:" + std::to_string(port_); }

  grpc::Status RegisterWorker(grpc::ServerContext*, const proto::RegisterWorkerRequest* req,
                              proto::RegisterWorkerReply* reply) override {
    std::lock_guard<std::mutex> lock(mu);
    workers.push_back(*req);
    reply->set_epoch(1);
    reply->set_heartbeat_interval_ms(200);
    cv.notify_all();
    return grpc::Status::OK;
  }
  grpc::Status Heartbeat(grpc::ServerContext*, const proto::HeartbeatRequest*,
                         proto::HeartbeatReply*) override {
    return grpc::Status::OK;
  }
  grpc::Status OpenSession(grpc::ServerContext*, const proto::OpenSessionRequest* req,
                           proto::SessionInfo* info) override {
    std::unique_lock<std::mutex> lock(mu);
    opened.push_back(*req);
    if (!cv.wait_for(lock, std::chrono::seconds(10),
                     [&] { return static_cast<int>(workers.size()) >= req->workers(); }))
      return grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED, "not enough workers");
    info->set_session_id("sess-1");
    info->set_world_size(req->workers());
    for (int r = 0; r < req->workers(); ++r) {
      info->add_worker_addresses(workers[r].address());
      info->add_worker_ids(workers[r].worker_id());
      session_workers.push_back(workers[r].worker_id());
    }
    return grpc::Status::OK;
  }
  grpc::Status LookupSession(grpc::ServerContext*, const proto::LookupSessionRequest* req,
                             proto::SessionInfo* info) override {
    std::lock_guard<std::mutex> lock(mu);
    if (req->session_id() != "sess-1")
      return grpc::Status(grpc::StatusCode::NOT_FOUND, "no session " + req->session_id());
    info->set_session_id(req->session_id());
    for (size_t r = 0; r < session_workers.size(); ++r) {
      info->add_worker_ids(session_workers[r]);
      if (session_workers[r] == req->worker_id()) info->set_rank(static_cast<int>(r));
    }
    info->set_world_size(static_cast<int>(session_workers.size()));
    return grpc::Status::OK;
  }
  // The gang's rendezvous: set, and get waiting up to wait_ms.
  grpc::Status Store(grpc::ServerContext*, const proto::StoreRequest* req,
                     proto::StoreReply* reply) override {
    std::unique_lock<std::mutex> lock(mu);
    std::string key = req->session_id() + "/" + req->key();
    if (req->op() == "set") {
      store[key] = req->value();
      cv.notify_all();
      return grpc::Status::OK;
    }
    if (!cv.wait_for(lock, std::chrono::milliseconds(req->wait_ms()),
                     [&] { return store.count(key) > 0; }))
      return grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED, key);
    reply->set_value(store[key]);
    return grpc::Status::OK;
  }
  grpc::Status CloseSession(grpc::ServerContext*, const proto::CloseSessionRequest* req,
                            proto::CloseSessionReply*) override {
    std::lock_guard<std::mutex> lock(mu);
    closed.push_back(req->session_id());
    return grpc::Status::OK;
  }

  std::mutex mu;
  std::condition_variable cv;
  std::vector<proto::RegisterWorkerRequest> workers;
  std::vector<proto::OpenSessionRequest> opened;
  std::vector<std::string> closed;
  std::vector<std::string> session_workers;  // of sess-1, rank order
  std::map<std::string, std::string> store;

 private:
  int port_ = 0;
  std::unique_ptr<grpc::Server> server_;
};

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
