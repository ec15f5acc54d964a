// kiln-worker --coordinator against a small fake Coordinator in this process: registration,
// heartbeats, re-registration when forgotten, LookupSession on Hello, closing a session.
#include <condition_variable>
#include <mutex>

#include <grpcpp/grpcpp.h>

#include "daemon.h"
#include "kiln/proto/coordinator.grpc.pb.h"
#include "kiln/proto/service.h"
#include "kiln/proto/worker.grpc.pb.h"

namespace kiln {
namespace {

using testing::Daemon;

constexpr auto kWait = std::chrono::seconds(20);

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
    registrations.push_back(*req);
    reply->set_epoch(registrations.size());
    reply->set_heartbeat_interval_ms(50);
    forget = false;
    cv.notify_all();
    return grpc::Status::OK;
  }
  grpc::Status Heartbeat(grpc::ServerContext*, const proto::HeartbeatRequest* req,
                         proto::HeartbeatReply* reply) override {
    std::lock_guard<std::mutex> lock(mu);
    heartbeats.push_back(*req);
    cv.notify_all();
    if (forget) return grpc::Status(grpc::StatusCode::NOT_FOUND, "unknown worker");
    for (const auto& s : close) reply->add_close_sessions(s);
    return grpc::Status::OK;
  }
  grpc::Status LookupSession(grpc::ServerContext*, const proto::LookupSessionRequest* req,
                             proto::SessionInfo* info) override {
    if (req->session_id() == "s1" || req->session_id() == "s2") {
      info->set_session_id(req->session_id());
      info->add_worker_ids(req->session_id() == "s1" ? "peer" : "someone-else");
      if (req->session_id() == "s1") info->add_worker_ids(req->worker_id());
      info->set_rank(1);
      info->set_world_size(2);
      return grpc::Status::OK;
    }
    return grpc::Status(grpc::StatusCode::NOT_FOUND, "no session '" + req->session_id() + "'");
  }

  // Waits until `pred` holds (under the lock); false after kWait.
  template <typename P>
  bool wait(P pred) {
    std::unique_lock<std::mutex> lock(mu);
    return cv.wait_for(lock, kWait, pred);
  }

  std::mutex mu;
  std::condition_variable cv;
  std::vector<proto::RegisterWorkerRequest> registrations;
  std::vector<proto::HeartbeatRequest> heartbeats;
  bool forget = false;
  std::vector<std::string> close;

 private:
  int port_ = 0;
  std::unique_ptr<grpc::Server> server_;
};

struct Stream {
  std::unique_ptr<proto::Worker::Stub> stub;
  grpc::ClientContext ctx;
  std::unique_ptr<grpc::ClientReaderWriter<proto::ClientMessage, proto::WorkerMessage>> rw;
  Stream(const std::string& address, const std::string& session_id) {
    stub = proto::Worker::NewStub(grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
    rw = stub->Session(&ctx);
    proto::ClientMessage m;
    m.mutable_hello()->set_protocol_version(proto::kProtocolVersion);
    m.mutable_hello()->set_session_id(session_id);
    rw->Write(m);
  }
  grpc::Status finish() {
    rw->WritesDone();
    proto::WorkerMessage m;
    while (rw->Read(&m)) {
    }
    return rw->Finish();
  }
};

TEST(WorkerCoordinator, RegistersBeatsAndChecksSessions) {
  FakeCoordinator fake;
  Daemon d(KILN_WORKER, {"--coordinator", fake.address(), "--worker-id", "w-test",
                         "--memory-limit", "1M"});
  ASSERT_TRUE(d.wait_ready()) << d.stderr_text();
  ASSERT_TRUE(fake.wait([&] { return fake.heartbeats.size() >= 2; })) << d.stderr_text();
  {
    std::lock_guard<std::mutex> lock(fake.mu);
    ASSERT_EQ(fake.registrations.size(), 1u);
    const auto& r = fake.registrations[0];
    EXPECT_EQ(r.protocol_version(), proto::kProtocolVersion);
    EXPECT_EQ(r.worker_id(), "w-test");
    EXPECT_EQ(r.address(), d.address());
    EXPECT_EQ(r.device(), "cpu");
    EXPECT_EQ(r.memory_limit_bytes(), 1u << 20);
    EXPECT_EQ(fake.heartbeats.back().worker_id(), "w-test");
    EXPECT_EQ(fake.heartbeats.back().epoch(), 1u);
    fake.forget = true;  // as after a coordinator restart
  }
  ASSERT_TRUE(fake.wait([&] {
    return fake.registrations.size() == 2 && fake.heartbeats.back().epoch() == 2;
  }));

  // A Hello naming a session this worker belongs to: rank and world size from the coordinator.
  Stream s1(d.address(), "s1");
  proto::WorkerMessage hr;
  ASSERT_TRUE(s1.rw->Read(&hr));
  EXPECT_EQ(hr.hello().rank(), 1);
  EXPECT_EQ(hr.hello().world_size(), 2);
  ASSERT_TRUE(fake.wait([&] {
    const auto& hb = fake.heartbeats.back();
    return hb.sessions_size() == 1 && hb.sessions(0) == "s1";
  }));

  for (std::string other : {"s2", "s9"}) {
    Stream s(d.address(), other);
    grpc::Status st = s.finish();
    EXPECT_EQ(st.error_code(), grpc::StatusCode::PERMISSION_DENIED);
    EXPECT_NE(st.error_message().find("worker 'w-test' is not in session '" + other + "'"),
              std::string::npos)
        << st.error_message();
  }

  {  // the coordinator closes s1: its stream ends
    std::lock_guard<std::mutex> lock(fake.mu);
    fake.close = {"s1"};
  }
  proto::WorkerMessage m;
  while (s1.rw->Read(&m)) {
  }
  EXPECT_EQ(s1.rw->Finish().error_code(), grpc::StatusCode::CANCELLED);
}

TEST(WorkerCoordinator, DirectWorkerRefusesSessionsAndUnreachableCoordinatorFails) {
  Daemon direct(KILN_WORKER, {});
  ASSERT_TRUE(direct.wait_ready()) << direct.stderr_text();
  Stream s(direct.address(), "s1");
  grpc::Status st = s.finish();
  EXPECT_EQ(st.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_NE(st.error_message().find("started without --coordinator"), std::string::npos);

  // Nothing listens on port 1 of loopback.
  Daemon d(KILN_WORKER, {"--coordinator", "127.0.0.1:1"});
  EXPECT_EQ(d.wait_exit(std::chrono::seconds(20)), 1);
  EXPECT_NE(d.stderr_text().find("registering with the coordinator at 127.0.0.1:1"),
            std::string::npos)
      << d.stderr_text();
}

}  // namespace
}  // namespace kiln
