// kiln-coordinator's surroundings: Prometheus /metrics, TLS, and a driver's OpenSession by job.
#include <arpa/inet.h>
#include <grpcpp/generic/generic_stub.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include "harness.h"

namespace kiln::test {
namespace {

int free_port() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a);
  getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  close(fd);
  return ntohs(a.sin_port);
}

// A plain HTTP/1.0 GET of 127.0.0.1:port/path; the whole response.
std::string http_get(int port, const std::string& path) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  timeval tv{5, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  std::string out;
  if (connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0) {
    const std::string req = "GET " + path + " HTTP/1.0\r\nHost: localhost\r\n\r\n";
    if (write(fd, req.data(), req.size()) == static_cast<ssize_t>(req.size())) {
      char buf[4096];
      for (ssize_t n; (n = read(fd, buf, sizeof buf)) > 0;) out.append(buf, n);
    }
  }
  close(fd);
  return out;
}

TEST(CoordinatorService, PrometheusMetrics) {
  TempDir dir;
  const int port = free_port();
  Daemon d(dir.path(), {"--metrics-listen", "127.0.0.1:" + std::to_string(port)});
  FakeWorker w0(d, "w0");
  proto::GetJobRequest get;
  get.set_job_id("job-9");
  proto::Job job;
  EXPECT_TRUE(absl::IsNotFound(d.call(&Stub::GetJob, get, &job)));
  const std::string text = http_get(port, "/metrics");
  EXPECT_NE(text.find("kiln_coordinator_workers{state=\"idle\"} 1"), std::string::npos) << text;
  EXPECT_NE(text.find("kiln_coordinator_jobs{state=\"queued\"} 0"), std::string::npos) << text;
  EXPECT_NE(text.find("kiln_coordinator_rpcs_total{code=\"NOT_FOUND\",method=\"GetJob\"} 1"),
            std::string::npos)
      << text;
}

// grpc.health.v1.Health/Check without its generated code: an empty HealthCheckRequest (the
// whole server) is zero bytes, and SERVING answers field 1 = 1, the bytes 08 01.
TEST(CoordinatorService, HealthCheckServing) {
  TempDir dir;
  Daemon d(dir.path());
  grpc::GenericStub stub(grpc::CreateChannel(d.address(), grpc::InsecureChannelCredentials()));
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  grpc::CompletionQueue cq;
  grpc::ByteBuffer request, response;
  grpc::Slice empty;
  request = grpc::ByteBuffer(&empty, 1);
  auto call = stub.PrepareUnaryCall(&ctx, "/grpc.health.v1.Health/Check", request, &cq);
  call->StartCall();
  grpc::Status status;
  call->Finish(&response, &status, reinterpret_cast<void*>(1));
  void* tag = nullptr;
  bool ok = false;
  ASSERT_TRUE(cq.Next(&tag, &ok));
  ASSERT_TRUE(status.ok()) << status.error_message();
  std::vector<grpc::Slice> slices;
  ASSERT_TRUE(response.Dump(&slices).ok());
  std::string bytes;
  for (const auto& sl : slices) bytes.append(reinterpret_cast<const char*>(sl.begin()), sl.size());
  EXPECT_EQ(bytes, std::string("\x08\x01", 2));
  cq.Shutdown();
  while (cq.Next(&tag, &ok)) {
  }
}

TEST(CoordinatorService, Tls) {
  TempDir dir;
  const fs::path key = dir.path() / "key.pem", cert = dir.path() / "cert.pem";
  const pid_t gen =
      spawn({"/usr/bin/openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
             "-subj", "/CN=localhost", "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost",
             "-keyout", key.string(), "-out", cert.string()},
            dir.path() / "ssl.out", dir.path() / "ssl.err");
  if (gen < 0 || wait_for(gen, std::chrono::seconds(30)) != 0) GTEST_SKIP() << "no openssl";
  // TLS makes a non-loopback listener acceptable; the test still dials loopback.
  Daemon d(dir.path(), {"--tls-cert", cert.string(), "--tls-key", key.string()}, "", slurp(cert));
  proto::ListWorkersReply reply;
  EXPECT_TRUE(d.call(&Stub::ListWorkers, proto::ListWorkersRequest(), &reply).ok());

  auto plain = proto::Coordinator::NewStub(
      grpc::CreateChannel(d.address(), grpc::InsecureChannelCredentials()));
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(2));
  EXPECT_FALSE(plain->ListWorkers(&ctx, {}, &reply).ok());

  const pid_t cli =
      spawn({KILN_CLI, "workers", "--coordinator", d.address(), "--tls-ca", cert.string()},
            dir.path() / "cli.out", dir.path() / "cli.err");
  EXPECT_EQ(wait_for(cli, std::chrono::seconds(20)), 0) << slurp(dir.path() / "cli.err");
}

TEST(CoordinatorService, DriverOpensItsJobsSession) {
  TempDir dir;
  Daemon d(dir.path());
  FakeWorker w0(d, "w0"), w1(d, "w1");
  proto::Job job = submit(d, 2, 0, {"train"});
  ASSERT_FALSE(job.job_id().empty());
  ASSERT_EQ(job.state(), "running");
  proto::OpenSessionRequest open;
  open.set_protocol_version(proto::kProtocolVersion);
  open.set_job_id(job.job_id());
  proto::SessionInfo info;
  ASSERT_TRUE(d.call(&Stub::OpenSession, open, &info).ok());
  EXPECT_EQ(info.session_id(), job.session_id());
  EXPECT_EQ(info.world_size(), 2);
  EXPECT_EQ(info.job_id(), job.job_id());
  proto::CloseSessionRequest close;
  close.set_session_id(info.session_id());
  proto::CloseSessionReply closed;
  EXPECT_TRUE(absl::IsFailedPrecondition(d.call(&Stub::CloseSession, close, &closed)));

  proto::CancelJobRequest cancel;
  cancel.set_job_id(job.job_id());
  ASSERT_TRUE(d.call(&Stub::CancelJob, cancel, &job).ok());
  absl::Status st = d.call(&Stub::OpenSession, open, &info);
  EXPECT_TRUE(absl::IsFailedPrecondition(st)) << st;
  EXPECT_NE(st.message().find("cancelled"), std::string::npos) << st;
}

TEST(CoordinatorService, WatchJobFollowsUntilTheEnd) {
  TempDir dir;
  Daemon d(dir.path());
  FakeWorker w0(d, "w0");
  proto::Job job = submit(d, 1, 0, {"train"});
  ASSERT_FALSE(job.job_id().empty());

  grpc::ClientContext watch_ctx;
  watch_ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  proto::WatchJobRequest watch;
  watch.set_job_id(job.job_id());
  watch.set_follow(true);
  auto reader = d.stub().WatchJob(&watch_ctx, watch);
  std::vector<std::string> seen;
  proto::JobEvent first;
  ASSERT_TRUE(reader->Read(&first));  // the watch is under way before the driver reports
  seen.push_back("state " + first.job().state());

  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  proto::Job reply;
  auto writer = d.stub().ReportJob(&ctx, &reply);
  for (const char* line : {"step 1", "step 2"}) {
    proto::JobReport r;
    r.set_job_id(job.job_id());
    r.add_log_lines(line);
    ASSERT_TRUE(writer->Write(r));
  }
  proto::JobReport last;
  last.set_finished(true);
  writer->Write(last);
  writer->WritesDone();
  ASSERT_TRUE(writer->Finish().ok());
  EXPECT_EQ(reply.state(), "succeeded");

  for (proto::JobEvent e; reader->Read(&e);) {
    seen.push_back(e.has_job() ? "state " + e.job().state() : e.log_line());
  }
  EXPECT_TRUE(reader->Finish().ok());
  ASSERT_GE(seen.size(), 4u) << ::testing::PrintToString(seen);
  EXPECT_EQ(seen.front(), "state running");
  EXPECT_EQ(seen.back(), "state succeeded");
  EXPECT_NE(std::find(seen.begin(), seen.end(), "step 2"), seen.end());
}

}  // namespace
}  // namespace kiln::test
