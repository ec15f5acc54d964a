// connect() through a coordinator: OpenSession hands out a session's workers, the Hello names
// the session (the worker checks it with LookupSession), close() ends it with CloseSession.
// The coordinator here is a fake in this process; the worker is a real kiln-worker.
#include <gtest/gtest.h>
#include <grpcpp/grpcpp.h>

#include <condition_variable>
#include <mutex>

#include "kiln/client/session.h"
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
    }
    return grpc::Status::OK;
  }
  grpc::Status LookupSession(grpc::ServerContext*, const proto::LookupSessionRequest* req,
                             proto::SessionInfo* info) override {
    std::lock_guard<std::mutex> lock(mu);
    if (req->session_id() != "sess-1")
      return grpc::Status(grpc::StatusCode::NOT_FOUND, "no session " + req->session_id());
    info->set_session_id(req->session_id());
    info->set_world_size(1);
    info->set_rank(0);
    info->add_worker_ids(req->worker_id());
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
