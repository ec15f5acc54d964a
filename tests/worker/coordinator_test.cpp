// kiln-worker --coordinator against a small fake Coordinator in this process: registration,
// heartbeats, re-registration when forgotten, LookupSession on Hello (the session's secret
// included), one stream at a time, closing a session, and a gang of two workers running a
// collective (Note [Gang process group]).
#include <grpcpp/grpcpp.h>

#include <optional>

#include "daemon.h"
#include "fake_coordinator.h"
#include "kiln/proto/service.h"
#include "kiln/proto/worker.grpc.pb.h"
#include "kiln/proto/codec.h"
#include "test_util.h"

namespace kiln {
namespace {

using testing::Daemon;
using testing::FakeCoordinator;

struct Stream {
  std::unique_ptr<proto::Worker::Stub> stub;
  grpc::ClientContext ctx;
  std::unique_ptr<grpc::ClientReaderWriter<proto::ClientMessage, proto::WorkerMessage>> rw;
  // A Hello naming `session_id` with `secret` (default: the fake's secret of that session).
  Stream(const std::string& address, const std::string& session_id,
         std::optional<std::string> secret = std::nullopt, const std::string& token = "") {
    stub = proto::Worker::NewStub(grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
    proto::add_token(ctx, token);
    rw = stub->Session(&ctx);
    proto::ClientMessage m;
    m.mutable_hello()->set_protocol_version(proto::kProtocolVersion);
    m.mutable_hello()->set_session_id(session_id);
    m.mutable_hello()->set_session_secret(secret ? *secret : FakeCoordinator::secret_of(session_id));
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
  fake.sessions = {{"s1", {"peer", "w-test"}}, {"s2", {"someone-else"}}};
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

  for (auto [other, why] : {std::pair<std::string, std::string>{"s2", "is not in session 's2'"},
                            {"s9", "refuses session 's9': no session 's9'"}}) {
    Stream s(d.address(), other);
    grpc::Status st = s.finish();
    EXPECT_EQ(st.error_code(), grpc::StatusCode::PERMISSION_DENIED);
    EXPECT_NE(st.error_message().find("worker 'w-test' " + why), std::string::npos)
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

// A session's stream needs the session's secret, not the workers' token; a session id alone opens
// nothing, with or without a token; a worker of a coordinator serves no direct streams
// (See Note [One stream per worker] in kiln/worker/stream_gate.h).
TEST(WorkerCoordinator, ASessionIdWithoutItsSecretOpensNothing) {
  FakeCoordinator fake;
  fake.sessions = {{"s1", {"w-test"}}};
  Daemon d(KILN_WORKER, {"--coordinator", fake.address(), "--worker-id", "w-test", "--token",
                         "sekrit"});
  ASSERT_TRUE(d.wait_ready()) << d.stderr_text();
  struct Case {
    std::string session, secret, token;
    grpc::StatusCode code;
    std::string why;
  };
  for (const Case& c : std::vector<Case>{
           {"s1", "", "", grpc::StatusCode::PERMISSION_DENIED, "wrong session secret"},
           {"s1", "", "sekrit", grpc::StatusCode::PERMISSION_DENIED, "wrong session secret"},
           {"s1", "", "another-tenants-token", grpc::StatusCode::PERMISSION_DENIED,
            "wrong session secret"},
           {"s1", "secret-s2", "", grpc::StatusCode::PERMISSION_DENIED, "wrong session secret"},
           {"s-guessed", "secret-s-guessed", "", grpc::StatusCode::PERMISSION_DENIED,
            "no session"},
           {"", "", "", grpc::StatusCode::FAILED_PRECONDITION, "sessions only"},
           {"", "", "sekrit", grpc::StatusCode::FAILED_PRECONDITION, "sessions only"}}) {
    Stream s(d.address(), c.session, c.secret, c.token);
    grpc::Status st = s.finish();
    EXPECT_EQ(st.error_code(), c.code) << c.session << ": " << st.error_message();
    EXPECT_NE(st.error_message().find(c.why), std::string::npos) << st.error_message();
  }
  Stream s1(d.address(), "s1");  // the secret, no token: served
  proto::WorkerMessage hr;
  ASSERT_TRUE(s1.rw->Read(&hr)) << s1.finish().error_message();
  EXPECT_EQ(hr.hello().world_size(), 1);
}

// One stream per session; a newer session of this worker (the coordinator moved it) takes over from
// a stale one (See Note [One stream per worker] in kiln/worker/stream_gate.h).
TEST(WorkerCoordinator, OneStreamPerSessionAndANewSessionTakesOver) {
  FakeCoordinator fake;
  fake.sessions = {{"s1", {"w-test"}}, {"s2", {"w-test"}}};
  Daemon d(KILN_WORKER, {"--coordinator", fake.address(), "--worker-id", "w-test"});
  ASSERT_TRUE(d.wait_ready()) << d.stderr_text();
  Stream first(d.address(), "s1");
  proto::WorkerMessage hr;
  ASSERT_TRUE(first.rw->Read(&hr)) << first.finish().error_message();
  {
    Stream again(d.address(), "s1");
    grpc::Status st = again.finish();
    EXPECT_EQ(st.error_code(), grpc::StatusCode::ALREADY_EXISTS) << st.error_message();
    EXPECT_NE(st.error_message().find("session 's1' already has a client stream"),
              std::string::npos)
        << st.error_message();
  }
  Stream next(d.address(), "s2");
  ASSERT_TRUE(next.rw->Read(&hr)) << next.finish().error_message();
  proto::WorkerMessage m;
  while (first.rw->Read(&m)) {
  }
  EXPECT_EQ(first.rw->Finish().error_code(), grpc::StatusCode::CANCELLED);
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

// Two workers of session g1 each all_reduce their own tensor over the gang's group "world".
TEST(WorkerCoordinator, GangRunsCollectives) {
  FakeCoordinator fake;
  fake.sessions = {{"g1", {"w0", "w1"}}};
  std::vector<std::unique_ptr<Daemon>> workers;
  for (const char* id : {"w0", "w1"}) {
    workers.push_back(std::make_unique<Daemon>(
        KILN_WORKER, std::vector<std::string>{"--coordinator", fake.address(), "--worker-id", id}));
    ASSERT_TRUE(workers.back()->wait_ready()) << workers.back()->stderr_text();
  }
  std::vector<std::unique_ptr<Stream>> streams;
  for (auto& w : workers) streams.push_back(std::make_unique<Stream>(w->address(), "g1"));
  for (int r = 0; r < 2; ++r) {
    proto::WorkerMessage hr;
    ASSERT_TRUE(streams[r]->rw->Read(&hr)) << streams[r]->finish().error_message();
    EXPECT_EQ(hr.hello().rank(), r);
    EXPECT_EQ(hr.hello().world_size(), 2);
  }
  for (int r = 0; r < 2; ++r) {
    proto::ClientMessage m;
    proto::Batch& b = *m.mutable_batch();
    proto::Create& c = *b.add_commands()->mutable_create();
    c.set_id(1);
    *c.mutable_data() = proto::encode_tensor(full({4}, double(r + 1)))[0];
    proto::Instruction& in = *b.add_commands()->mutable_op();
    in.set_seq(1);
    in.set_op("all_reduce");
    in.add_args()->set_value(1);
    *in.add_args()->mutable_attribute() = proto::encode_attribute(IValue(std::string("sum")));
    *in.add_args()->mutable_attribute() = proto::encode_attribute(IValue(std::string("world")));
    in.add_outputs(2);
    proto::Fetch& f = *b.add_commands()->mutable_fetch();
    f.set_request(3);
    f.set_id(2);
    ASSERT_TRUE(streams[r]->rw->Write(m));
  }
  for (int r = 0; r < 2; ++r) {
    proto::WorkerMessage reply;
    ASSERT_TRUE(streams[r]->rw->Read(&reply)) << streams[r]->finish().error_message();
    ASSERT_TRUE(reply.fetch().has_data()) << reply.fetch().error().message();
    proto::TensorAssembler a;
    a.add(reply.fetch().data());
    testing::expect_close(a.take(), full({4}, 3.0), 0, 0);
    EXPECT_TRUE(streams[r]->finish().ok());
  }
  std::lock_guard<std::mutex> lock(fake.mu);  // the rendezvous went as the gang's workers
  ASSERT_FALSE(fake.store_callers.empty());
  for (const std::string& id : fake.store_callers) EXPECT_TRUE(id == "w0" || id == "w1") << id;
}

}  // namespace
}  // namespace kiln
