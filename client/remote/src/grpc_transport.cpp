// GrpcTransport: one bidirectional Worker.Session stream (proto/kiln/proto/worker.proto).
// Writes and reads are synchronous on the caller's thread: a fetch is one write and one read,
// the cheapest round trip the sync API has. A worker that dies closes its socket, so a blocked
// read fails at once with UNAVAILABLE; the first failure is kept and raised by every later call.
#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <mutex>

#include "kiln/client/transport.h"
#include "kiln/error.h"
#include "kiln/proto/service.h"
#include "kiln/proto/worker.grpc.pb.h"

namespace kiln::client {

[[noreturn]] void raise_status(const absl::Status& st, const std::string& context) {
  ErrorKind kind = ErrorKind::Runtime;
  if (st.code() == absl::StatusCode::kInvalidArgument) kind = ErrorKind::Value;
  if (st.code() == absl::StatusCode::kUnimplemented) kind = ErrorKind::NotImplemented;
  detail::throw_error(kind, absl::StatusCodeToString(st.code()) + ": " + context + ": " +
                                std::string(st.message()));
}

namespace {

int keepalive_seconds() {
  const char* v = std::getenv("KILN_KEEPALIVE_S");
  const int s = v ? std::atoi(v) : 0;
  return s > 0 ? s : 10;
}

class GrpcTransport final : public Transport {
 public:
  GrpcTransport(const std::string& address, const GrpcOptions& o) : name_(address) {
    grpc::ChannelArguments args;
    args.SetMaxReceiveMessageSize(proto::kMaxMessageBytes);
    args.SetMaxSendMessageSize(proto::kMaxMessageBytes);
    // A killed worker resets the connection at once; a frozen one (SIGSTOP, a lost host) only
    // stops answering. An HTTP/2 ping after `ping_ms` of silence, unanswered for `timeout_ms`,
    // turns that into UNAVAILABLE instead of a read that never returns, so a frozen worker is
    // noticed KILN_KEEPALIVE_S seconds (default 10) after its last word (measured: 9.8-10.0 s
    // for 10, RemoteGrpc.FrozenWorkerIsUnavailableWithinTheKeepalive). The answer to a ping
    // sent while this client waits on nothing is read only by gRPC's backup poller (every 5 s),
    // so the timeout is never shorter than 6 s, and neither is the detection shorter than 7 s.
    const int keepalive_ms = keepalive_seconds() * 1000;
    const int timeout_ms = std::max(keepalive_ms / 2, 6000);
    const int ping_ms = std::max(keepalive_ms - timeout_ms, 1000);
    args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, ping_ms);
    args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, timeout_ms);
    args.SetInt(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
    args.SetInt(GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, 0);
    channel_ = grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(), args);
    auto deadline = std::chrono::system_clock::now() + std::chrono::milliseconds(o.connect_timeout_ms);
    if (!channel_->WaitForConnected(deadline))
      raise_status(absl::UnavailableError("no answer within " + std::to_string(o.connect_timeout_ms) +
                                          " ms"),
                   "cannot reach the kiln worker at " + address);
    stub_ = proto::Worker::NewStub(channel_);
    proto::add_token(ctx_, o.token);
    stream_ = stub_->Session(&ctx_);

    proto::ClientMessage hello;
    proto::Hello* h = hello.mutable_hello();
    h->set_protocol_version(o.protocol_version ? o.protocol_version : proto::kProtocolVersion);
    h->set_client("kiln-cpp");
    h->set_session_id(o.session_id);
    h->set_session_secret(o.session_secret);
    h->set_rank(o.rank);
    h->set_world_size(o.world_size);
    proto::WorkerMessage reply;
    if (!stream_->Write(hello) || !stream_->Read(&reply)) fail();
    if (!reply.has_hello()) {
      raise_status(absl::InternalError("answered Hello with " + reply.ShortDebugString()), name_);
    }
    device_ = reply.hello().device().empty() ? "cpu" : reply.hello().device();
    name_ = "worker '" + reply.hello().worker_id() + "' at " + address;
  }

  ~GrpcTransport() override {
    try {
      close();
    } catch (const Error&) {
      // Destructors do not raise; a broken stream is already reported to whoever used it.
    }
  }

  void send(proto::Batch&& batch) override {
    raise_if_failed();
    proto::ClientMessage msg;
    msg.mutable_batch()->Swap(&batch);
    if (!stream_->Write(msg)) fail();
  }

  // Note [Gang writers] (transport.h): one writer thread and one reading thread. A failed write
  // leaves closing the stream to the reader, whose read fails too.
  bool can_send_concurrently() const override { return true; }
  void send_concurrently(proto::Batch&& batch) override {
    raise_if_failed();
    proto::ClientMessage msg;
    msg.mutable_batch()->Swap(&batch);
    if (!stream_->Write(msg))
      raise_status(absl::UnavailableError("the stream broke while sending a batch"), name_);
  }
  void cancel() override { ctx_.TryCancel(); }

  proto::WorkerMessage receive() override {
    raise_if_failed();
    proto::WorkerMessage m;
    if (!stream_->Read(&m)) fail();
    return m;
  }

  const std::string& worker_device() const override { return device_; }
  const std::string& name() const override { return name_; }

  void close() override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (closed_) return;
      closed_ = true;
      if (!failed_.ok()) return;
    }
    // Nothing after the last read can matter to the client, so the stream is cancelled rather
    // than drained: closing never waits on a slow or hung worker.
    stream_->WritesDone();
    ctx_.TryCancel();
    stream_->Finish();
  }

 private:
  void raise_if_failed() {
    absl::Status st;
    {
      std::lock_guard<std::mutex> lock(mu_);
      st = failed_;
    }
    if (!st.ok()) raise_status(st, name_);
  }

  // The stream broke: its status says why (the worker's refusal, or UNAVAILABLE).
  [[noreturn]] void fail() {
    absl::Status st = proto::from_grpc(stream_->Finish());
    if (st.ok()) st = absl::UnavailableError("the worker ended the session");
    {
      std::lock_guard<std::mutex> lock(mu_);
      failed_ = st;
      closed_ = true;
    }
    raise_status(st, name_);
  }

  std::string name_;
  std::string device_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<proto::Worker::Stub> stub_;
  grpc::ClientContext ctx_;
  std::unique_ptr<grpc::ClientReaderWriter<proto::ClientMessage, proto::WorkerMessage>> stream_;
  std::mutex mu_;  // failed_ and closed_ (Note [Gang writers]: a writer thread reads them)
  absl::Status failed_;
  bool closed_ = false;
};

}  // namespace

std::unique_ptr<Transport> make_grpc_transport(const std::string& address, GrpcOptions options) {
  return std::make_unique<GrpcTransport>(address, options);
}

}  // namespace kiln::client
