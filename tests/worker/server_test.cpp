// kiln-worker as a process: raw gRPC streams against it (Hello, ops, fetch), refusals (version,
// token, malformed and oversized messages, a second stream) that leave it serving, health,
// metrics (slow clients included), SIGTERM.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <future>

#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/impl/rpc_method.h>
#include <grpcpp/support/sync_stream.h>

#include "daemon.h"
#include "kiln/proto/service.h"
#include "kiln/proto/worker.grpc.pb.h"
#include "kiln/proto/codec.h"
#include "test_util.h"

namespace kiln {
namespace {

using testing::Daemon;

constexpr auto kDeadline = std::chrono::seconds(30);

struct Client {
  std::unique_ptr<proto::Worker::Stub> stub;
  grpc::ClientContext ctx;
  std::unique_ptr<grpc::ClientReaderWriter<proto::ClientMessage, proto::WorkerMessage>> stream;

  explicit Client(const std::string& address, const std::string& token = "") {
    stub = proto::Worker::NewStub(grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
    ctx.set_deadline(std::chrono::system_clock::now() + kDeadline);
    proto::add_token(ctx, token);
    stream = stub->Session(&ctx);
  }
  bool hello(uint32_t version = proto::kProtocolVersion) {
    proto::ClientMessage m;
    m.mutable_hello()->set_protocol_version(version);
    m.mutable_hello()->set_client("kiln_worker_tests");
    return stream->Write(m);
  }
  bool send(const proto::Batch& b) {
    proto::ClientMessage m;
    *m.mutable_batch() = b;
    return stream->Write(m);
  }
  std::optional<proto::WorkerMessage> read() {
    proto::WorkerMessage m;
    if (!stream->Read(&m)) return std::nullopt;
    return m;
  }
  grpc::Status finish() {
    stream->WritesDone();
    proto::WorkerMessage m;
    while (stream->Read(&m)) {
    }
    return stream->Finish();
  }
};

proto::Batch add_and_fetch(const Tensor& x, const Tensor& y) {
  proto::Batch b;
  for (auto [id, t] : {std::pair<int64_t, Tensor>{1, x}, {2, y}}) {
    for (auto& p : proto::encode_tensor(t)) {
      proto::Create& c = *b.add_commands()->mutable_create();
      c.set_id(id);
      *c.mutable_data() = p;
    }
  }
  proto::Instruction& in = *b.add_commands()->mutable_op();
  in.set_seq(1);
  in.set_op("add");
  in.add_args()->set_value(1);
  in.add_args()->set_value(2);
  *in.add_args()->mutable_attribute() = proto::encode_attribute(IValue(Scalar(1)));
  in.add_outputs(3);
  b.add_commands()->mutable_fetch()->set_request(5);
  b.mutable_commands(b.commands_size() - 1)->mutable_fetch()->set_id(3);
  b.add_commands()->mutable_sync()->set_request(6);
  return b;
}

// A full session: Hello, create, add, fetch, sync; the fetched sum is right.
void expect_session_works(const std::string& address, const std::string& token = "") {
  Client c(address, token);
  ASSERT_TRUE(c.hello());
  auto hr = c.read();
  ASSERT_TRUE(hr && hr->has_hello()) << c.finish().error_message();
  EXPECT_EQ(hr->hello().protocol_version(), proto::kProtocolVersion);
  EXPECT_EQ(hr->hello().device(), "cpu");
  EXPECT_EQ(hr->hello().world_size(), 1);
  Tensor x = testing::random({3, 4}), y = testing::random({4}, kFloat32, -1, 1, 5);
  ASSERT_TRUE(c.send(add_and_fetch(x, y)));
  auto f = c.read();
  ASSERT_TRUE(f && f->has_fetch());
  EXPECT_EQ(f->fetch().request(), 5u);
  proto::TensorAssembler a;
  a.add(f->fetch().data());
  testing::expect_close(a.take(), add(x, y), 0, 0);
  auto s = c.read();
  ASSERT_TRUE(s && s->has_sync());
  EXPECT_FALSE(s->sync().has_error());
  EXPECT_TRUE(c.finish().ok());
}

std::unique_ptr<Daemon> start(std::vector<std::string> args = {}) {
  auto d = std::make_unique<Daemon>(KILN_WORKER, std::move(args));
  EXPECT_TRUE(d->wait_ready()) << d->stderr_text();
  return d;
}

TEST(WorkerServer, HelloOpsAndFetch) {
  auto d = start();
  expect_session_works(d->address());
  expect_session_works(d->address());  // and again on a new stream
}

TEST(WorkerServer, VersionMismatchIsRefusedClearly) {
  auto d = start();
  Client c(d->address());
  ASSERT_TRUE(c.hello(999));
  grpc::Status st = c.finish();
  EXPECT_EQ(st.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_EQ(st.error_message(), "the client speaks kiln protocol 999 but this kiln-worker speaks " +
                                    std::to_string(proto::kProtocolVersion) +
                                    "; use matching Kiln versions");
}

TEST(WorkerServer, TokenIsRequiredWhenConfigured) {
  auto d = start({"--token", "s3cret"});
  Client c(d->address());
  c.hello();
  grpc::Status st = c.finish();
  EXPECT_EQ(st.error_code(), grpc::StatusCode::UNAUTHENTICATED) << st.error_message();
  Client wrong(d->address(), "guess");
  wrong.hello();
  EXPECT_EQ(wrong.finish().error_code(), grpc::StatusCode::UNAUTHENTICATED);
  expect_session_works(d->address(), "s3cret");
}

TEST(WorkerServer, MalformedStreamsEndAndTheWorkerServesOn) {
  auto d = start();
  {
    Client c(d->address());
    proto::Batch b;
    b.add_commands()->mutable_sync()->set_request(1);
    ASSERT_TRUE(c.send(b));
    grpc::Status st = c.finish();
    EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_EQ(st.error_message(), "expected Hello as the first message");
  }
  expect_session_works(d->address());
  {
    Client c(d->address());
    c.hello();
    ASSERT_TRUE(c.read());
    proto::Batch b;
    b.add_commands();
    ASSERT_TRUE(c.send(b));
    grpc::Status st = c.finish();
    EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_EQ(st.error_message(), "command 0 of the batch has no kind (empty command)");
  }
  {
    Client c(d->address());
    c.hello();
    ASSERT_TRUE(c.read());
    c.stream->Write(proto::ClientMessage());
    grpc::Status st = c.finish();
    EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_EQ(st.error_message(), "empty client message");
  }
  {  // out of order: a Create continuing a tensor at the wrong byte
    Client c(d->address());
    c.hello();
    ASSERT_TRUE(c.read());
    proto::Batch b = add_and_fetch(ones({2}), ones({2}));
    b.mutable_commands(0)->mutable_create()->mutable_data()->mutable_data()->resize(4);
    b.mutable_commands(1)->mutable_create()->set_id(1);  // restarts value 1 at byte 0
    c.send(b);
    grpc::Status st = c.finish();
    EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_NE(st.error_message().find("piece at byte 0, expected the next at byte 4"), std::string::npos) << st.error_message();
  }
  expect_session_works(d->address());
}

// Bytes that are no ClientMessage, first or after the Hello (Note [Raw Session stream]).
TEST(WorkerServer, GarbageMessagesAreInvalidArgument) {
  auto d = start();
  using RawStream = grpc::ClientReaderWriter<grpc::ByteBuffer, grpc::ByteBuffer>;
  auto raw_session = [&](const std::vector<std::string>& messages) {
    auto channel = grpc::CreateChannel(d->address(), grpc::InsecureChannelCredentials());
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + kDeadline);
    const grpc::internal::RpcMethod method("/kiln.proto.Worker/Session",
                                           grpc::internal::RpcMethod::BIDI_STREAMING);
    std::unique_ptr<RawStream> stream(
        grpc::internal::ClientReaderWriterFactory<grpc::ByteBuffer, grpc::ByteBuffer>::Create(
            channel.get(), method, &ctx));
    for (const std::string& bytes : messages) {
      grpc::Slice slice(bytes);
      grpc::ByteBuffer buffer(&slice, 1);
      stream->Write(buffer);
    }
    stream->WritesDone();
    grpc::ByteBuffer reply;
    while (stream->Read(&reply)) {
    }
    return stream->Finish();
  };
  const std::string garbage = "\xff\xff\xff\xff\x0f";  // a field tag past the varint's end
  proto::ClientMessage hello;
  hello.mutable_hello()->set_protocol_version(proto::kProtocolVersion);
  for (const auto& messages : {std::vector<std::string>{garbage},
                               std::vector<std::string>{hello.SerializeAsString(), garbage}}) {
    grpc::Status st = raw_session(messages);
    EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << st.error_message();
    EXPECT_NE(st.error_message().find("is not a kiln.proto.ClientMessage"), std::string::npos)
        << st.error_message();
  }
  expect_session_works(d->address());
}

// A second client waits briefly, then is refused; the memory limit binds the worker, not each
// stream (See Note [One stream per worker] in kiln/worker/stream_gate.h).
TEST(WorkerServer, OneStreamAtATime) {
  auto d = start({"--memory-limit", "1M"});
  Client first(d->address());
  ASSERT_TRUE(first.hello());
  ASSERT_TRUE(first.read());
  Client second(d->address());
  ASSERT_TRUE(second.hello());
  grpc::Status st = second.finish();
  EXPECT_EQ(st.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << st.error_message();
  EXPECT_NE(st.error_message().find("serves one session at a time"), std::string::npos)
      << st.error_message();
  EXPECT_TRUE(first.finish().ok());
  expect_session_works(d->address());  // the next client, once the first has gone
}

TEST(WorkerServer, OversizedMessageIsResourceExhausted) {
  auto d = start();
  {
    Client c(d->address());
    c.hello();
    ASSERT_TRUE(c.read());
    proto::Batch b;
    proto::Create& cr = *b.add_commands()->mutable_create();
    cr.set_id(1);
    cr.mutable_data()->set_dtype("uint8");
    cr.mutable_data()->add_shape(proto::kMaxMessageBytes + 1024);
    cr.mutable_data()->set_data(std::string(proto::kMaxMessageBytes + 1024, '\0'));
    c.send(b);
    grpc::Status st = c.finish();
    EXPECT_EQ(st.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << st.error_message();
  }
  expect_session_works(d->address());
}

TEST(WorkerServer, HealthCheckServing) {
  auto d = start();
  grpc::GenericStub stub(grpc::CreateChannel(d->address(), grpc::InsecureChannelCredentials()));
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + kDeadline);
  grpc::ByteBuffer request(nullptr, 0), response;  // HealthCheckRequest{service: ""}
  std::promise<grpc::Status> done;
  stub.UnaryCall(&ctx, "/grpc.health.v1.Health/Check", grpc::StubOptions(), &request, &response,
                 [&](grpc::Status st) { done.set_value(st); });
  auto fut = done.get_future();
  ASSERT_EQ(fut.wait_for(kDeadline), std::future_status::ready);
  ASSERT_TRUE(fut.get().ok());
  grpc::Slice slice;
  ASSERT_TRUE(response.DumpToSingleSlice(&slice).ok());
  // HealthCheckResponse{status: SERVING (1)}
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(slice.begin()), slice.size()),
            std::string("\x08\x01", 2));
}

std::string http_get(int port, const std::string& path, const std::string& headers = "") {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(port);
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  timeval tv{10, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  std::string out;
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0) {
    std::string req = "GET " + path + " HTTP/1.0\r\nHost: localhost\r\n" + headers + "\r\n";
    (void)!write(fd, req.data(), req.size());
    char buf[4096];
    for (ssize_t n; (n = read(fd, buf, sizeof(buf))) > 0;) out.append(buf, n);
  }
  close(fd);
  return out;
}

int metrics_port(const Daemon& d) {
  std::string err = d.stderr_text();
  auto at = err.find("metrics on port ");
  EXPECT_NE(at, std::string::npos) << err;
  return at == std::string::npos ? 0 : std::stoi(err.substr(at + 16));
}

TEST(WorkerServer, PrometheusMetrics) {
  auto d = start({"--metrics-listen", "127.0.0.1:0"});
  expect_session_works(d->address());
  std::string text = http_get(metrics_port(*d), "/metrics");
  EXPECT_NE(text.find("kiln_worker_instructions_total 1"), std::string::npos) << text;
  EXPECT_NE(text.find("kiln_worker_memory_in_use_bytes 0"), std::string::npos) << text;
  EXPECT_NE(text.find("kiln_worker_step_seconds_bucket"), std::string::npos) << text;
}

// With a token, /metrics wants HTTP basic auth whose password is the token.
TEST(WorkerServer, MetricsNeedTheTokenWhenOneIsSet) {
  auto d = start({"--metrics-listen", "127.0.0.1:0", "--token", "s3cret"});
  int port = metrics_port(*d);
  EXPECT_NE(http_get(port, "/metrics").find(" 401 "), std::string::npos);
  std::string ok = http_get(port, "/metrics", "Authorization: Basic a2lsbjpzM2NyZXQ=\r\n");  // kiln:s3cret
  EXPECT_NE(ok.find(" 200 "), std::string::npos) << ok;
  EXPECT_NE(ok.find("kiln_worker_instructions_total"), std::string::npos) << ok;
}

// 50 clients that connect and send half a request do not hold back a scrape (one connection at a
// time with a 2 s read timeout each took over a minute)
// (See Note [Metrics endpoint] in worker/src/metrics.h).
TEST(WorkerServer, SlowMetricsClientsDoNotBlockAScrape) {
  auto d = start({"--metrics-listen", "127.0.0.1:0"});
  const int port = metrics_port(*d);
  std::vector<int> slow;
  for (int i = 0; i < 50; ++i) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(port);
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ASSERT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
    const std::string half = "GET /metrics HTTP/1.0\r\nHost: local";
    ASSERT_EQ(write(fd, half.data(), half.size()), static_cast<ssize_t>(half.size()));
    slow.push_back(fd);
  }
  const auto t0 = std::chrono::steady_clock::now();
  const std::string text = http_get(port, "/metrics");
  const auto took = std::chrono::steady_clock::now() - t0;
  EXPECT_NE(text.find(" 200 "), std::string::npos) << text;
  EXPECT_LT(took, std::chrono::seconds(1));
  for (int fd : slow) close(fd);
}

TEST(WorkerServer, SigtermDrainsAndExitsZero) {
  auto d = start();
  Client idle(d->address());  // an open stream does not hold the worker past its drain
  idle.hello();
  ASSERT_TRUE(idle.read());
  auto t0 = std::chrono::steady_clock::now();
  kill(d->pid(), SIGTERM);
  EXPECT_EQ(d->wait_exit(std::chrono::seconds(5)), 0) << d->stderr_text();
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(5));
}

// Not a benchmark, a floor: one-element adds streamed in batches of 1000 (as the Remote backend
// batches them) through gRPC, each batch freeing the previous batch's results. The issue's
// target is 100,000 ops/s end to end; the bound here is loose for a busy machine.
TEST(WorkerServer, TinyOpsThroughGrpc) {
  auto d = start();
  Client c(d->address());
  c.hello();
  ASSERT_TRUE(c.read());
  proto::Batch init = add_and_fetch(ones({1}), ones({1}));
  init.mutable_commands()->DeleteSubrange(2, 3);  // keep the two creates
  ASSERT_TRUE(c.send(init));
  constexpr int kOps = 100000, kPerBatch = 1000;
  proto::Attribute one = proto::encode_attribute(IValue(Scalar(1)));
  int64_t next = 10;
  auto t0 = std::chrono::steady_clock::now();
  for (int b = 0; b < kOps / kPerBatch; ++b) {
    proto::Batch batch;
    proto::Free& f = *batch.add_commands()->mutable_free();
    for (int64_t id = next - kPerBatch; b > 0 && id < next; ++id) f.add_ids(id);
    for (int i = 0; i < kPerBatch; ++i) {
      proto::Instruction& in = *batch.add_commands()->mutable_op();
      in.set_seq(next);
      in.set_op("add");
      in.add_args()->set_value(1);
      in.add_args()->set_value(2);
      *in.add_args()->mutable_attribute() = one;
      in.add_outputs(next++);
    }
    if (b + 1 == kOps / kPerBatch) batch.add_commands()->mutable_sync()->set_request(1);
    ASSERT_TRUE(c.send(batch));
  }
  auto s = c.read();
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ASSERT_TRUE(s && s->has_sync());
  EXPECT_FALSE(s->sync().has_error()) << s->sync().error().message();
  std::printf("[ info ] kiln-worker over gRPC: %.0f one-element ops/s (client building included)\n",
              kOps / secs);
  EXPECT_GT(kOps / secs, 10000.0);
  EXPECT_TRUE(c.finish().ok());
}

TEST(WorkerServer, BadFlagsExitTwo) {
  struct Case {
    std::vector<std::string> args;
    std::string needle;
  };
  for (const Case& c : std::vector<Case>{
           {{"--listen", "0.0.0.0:0"}, "refusing to listen on '0.0.0.0:0' without a token"},
           {{"--frobnicate"}, "unknown option '--frobnicate'"},
           {{"--memory-limit", "lots"}, "--memory-limit: 'lots' is not a byte count"},
           {{"--device", "tpu"}, "unknown device 'tpu'"},
           {{"--metrics-listen", "0.0.0.0:0"}, "refusing to listen on '0.0.0.0:0'"},
           {{"--token", " "}, "--token (or KILN_TOKEN): a token must be printable ASCII without "
                              "spaces"},
           {{"--token", "two words"}, "got 9 characters with a space"}}) {
    Daemon d(KILN_WORKER, c.args);
    EXPECT_EQ(d.wait_exit(std::chrono::seconds(20)), 2) << c.needle;
    EXPECT_NE(d.stderr_text().find(c.needle), std::string::npos) << d.stderr_text();
  }
  Daemon ok(KILN_WORKER, {"--listen", "0.0.0.0:0", "--token", "t", "--memory-limit", "64M"});
  EXPECT_TRUE(ok.wait_ready()) << ok.stderr_text();
}

}  // namespace
}  // namespace kiln
