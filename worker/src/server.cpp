// The Worker gRPC service and its server (kiln/worker/server.h).
#include "kiln/worker/server.h"

#include <absl/strings/str_cat.h>
#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>
#include <grpcpp/impl/rpc_service_method.h>
#include <grpcpp/support/method_handler.h>
#include <unistd.h>

#include <mutex>
#include <set>
#include <unordered_map>

#include "batch.h"
#include "coordinator_link.h"
#include "gang.h"
#include "kiln/dist/process_group.h"
#include "kiln/proto/service.h"
#include "kiln/proto/worker.pb.h"
#include "kiln/worker/session.h"
#include "kiln/worker/stream_gate.h"
#include "metrics.h"
#include "stacks.h"

namespace kiln::worker {

namespace {

// Note [Raw Session stream]: the Session method is registered over raw bytes rather than through
// the generated proto::Worker::Service, whose reader answers false both at the end of the stream
// and for bytes that are no ClientMessage. Parsing here tells them apart, so garbage is
// INVALID_ARGUMENT instead of a stream that ends OK without a word.
constexpr const char* kSessionMethod = "/kiln.proto.Worker/Session";
using RawStream = grpc::ServerReaderWriter<grpc::ByteBuffer, grpc::ByteBuffer>;

class Stream {
 public:
  explicit Stream(RawStream* raw) : raw_(raw) {}
  // true with the next message; false at the end of the stream (status OK) or for bytes that do
  // not parse (status INVALID_ARGUMENT).
  bool read(proto::ClientMessage* msg) {
    grpc::ByteBuffer bytes;
    if (!raw_->Read(&bytes)) return false;
    if (grpc::SerializationTraits<proto::ClientMessage>::Deserialize(&bytes, msg).ok()) return true;
    status_ = absl::InvalidArgumentError(
        "a message on the Session stream is not a kiln.proto.ClientMessage (malformed protobuf)");
    return false;
  }
  bool write(const proto::WorkerMessage& msg) {
    grpc::ByteBuffer bytes;
    bool own = false;
    if (!grpc::SerializationTraits<proto::WorkerMessage>::Serialize(msg, &bytes, &own).ok())
      return false;
    return raw_->Write(bytes);
  }
  // How the stream ended, once read() returned false.
  const absl::Status& status() const { return status_; }

 private:
  RawStream* raw_;
  absl::Status status_;
};

// How long a stream waits for the worker to be free (Note [One stream per worker]): long
// enough for the previous client's stream to be torn down after it closed.
constexpr auto kEnterWait = std::chrono::seconds(2);
// The worker pings its client's connection, so that a client that vanished without closing
// (a lost host) frees the worker: a ping after this much silence, unanswered for kClientTimeout.
constexpr int kClientKeepaliveMs = 30000;
constexpr int kClientTimeoutMs = 20000;

std::string default_worker_id() {
  char host[256] = {};
  if (gethostname(host, sizeof(host) - 1) != 0) host[0] = '\0';
  return absl::StrCat(host[0] ? host : "worker", "-", getpid());
}

// host:port clients can reach: the listen host, or this machine's name for a wildcard.
std::string reachable_address(const std::string& listen, int port) {
  std::string host = listen.substr(0, listen.rfind(':'));
  if (host.empty() || host == "0.0.0.0" || host == "[::]") {
    char name[256] = {};
    host = gethostname(name, sizeof(name) - 1) == 0 ? name : "localhost";
  }
  return absl::StrCat(host, ":", port);
}

}  // namespace

struct Server::Impl final : grpc::Service {
  ServerOptions opt;
  std::unique_ptr<Metrics> metrics;
  std::unique_ptr<CoordinatorLink> coordinator;
  std::unique_ptr<StreamGate> gate;
  std::unique_ptr<grpc::Server> server;
  int port = 0;
  std::string address;  // as registered with the coordinator
  Gang gang;

  // The open stream (Note [One stream per worker]: at most one), for heartbeats (the session
  // served, memory).
  struct Open {
    std::string session_id;
    const worker::Session* session;
  };
  std::mutex mu;
  std::unordered_map<grpc::ServerContext*, Open> open;

  Impl() {  // Note [Raw Session stream]
    AddMethod(new grpc::internal::RpcServiceMethod(
        kSessionMethod, grpc::internal::RpcMethod::BIDI_STREAMING,
        new grpc::internal::BidiStreamingHandler<Impl, grpc::ByteBuffer, grpc::ByteBuffer>(
            [](Impl* self, grpc::ServerContext* ctx, RawStream* raw) {
              return self->Session(ctx, raw);
            },
            this)));
  }

  grpc::Status Session(grpc::ServerContext* ctx, RawStream* raw) {
    try {
      Stream stream(raw);
      return proto::to_grpc(serve(ctx, stream));
    } catch (const std::exception& e) {  // no exception crosses the handler
      return grpc::Status(grpc::StatusCode::INTERNAL, e.what());
    }
  }

  absl::Status serve(grpc::ServerContext* ctx, Stream& stream) {
    // A direct worker checks the token before reading anything
    // (See Note [One stream per worker] in kiln/worker/stream_gate.h).
    if (auto st = gate->check_caller(proto::authorization_of(*ctx)); !st.ok()) return st;
    proto::ClientMessage msg;
    if (!stream.read(&msg)) return stream.status();  // the client left without a word, or garbage
    if (!msg.has_hello()) return absl::InvalidArgumentError("expected Hello as the first message");
    const proto::Hello& hello = msg.hello();
    absl::StatusOr<proto::SessionInfo> info =
        gate->admit(hello, [this](const std::string& id, const std::string& secret) {
          return coordinator->lookup(id, secret);
        });
    if (!info.ok()) return info.status();
    // Another session for this worker, or the coordinator's close, ends this one: its stream,
    // and any collective its executor waits in (See Note [Aborting process groups]).
    auto end = [this, ctx, id = hello.session_id()] {
      ctx->TryCancel();
      gang.abort(id, "ended (the coordinator closed it, or gave this worker to another session)");
    };
    absl::StatusOr<StreamGate::Lease> lease = gate->enter(hello.session_id(), end, kEnterWait);
    if (!lease.ok()) return lease.status();
    std::shared_future<absl::Status> gang_ready;
    SessionOptions so{.worker_id = opt.worker_id,
                      .device = opt.device,
                      .memory_limit_bytes = opt.memory_limit_bytes,
                      .rank = info->rank(),
                      .world_size = info->world_size() > 0 ? info->world_size() : 1,
                      .session_id = hello.session_id()};
    if (so.world_size > 1)  // Note [Gang process group]
      gang_ready = gang.join(*coordinator, hello.session_id(), so.rank, so.world_size,
                             address.substr(0, address.rfind(':')), opt.device);
    worker::Session session(so);  // destroyed before the lease frees the worker
    {
      std::lock_guard<std::mutex> lock(mu);
      open[ctx] = Open{hello.session_id(), &session};
    }
    struct Close {  // however the stream ends
      Impl* self;
      grpc::ServerContext* ctx;
      const worker::Session* s;
      ~Close() {
        self->metrics->add_memory(-static_cast<int64_t>(s->memory_in_use_bytes()));
        std::lock_guard<std::mutex> lock(self->mu);
        self->open.erase(ctx);
      }
    } close{this, ctx, &session};

    proto::WorkerMessage hr;
    proto::HelloReply& r = *hr.mutable_hello();
    r.set_protocol_version(proto::kProtocolVersion);
    r.set_worker_id(opt.worker_id);
    r.set_device(opt.device.str());
    r.set_rank(so.rank);
    r.set_world_size(so.world_size);
    if (!stream.write(hr)) return absl::OkStatus();

    auto last_sync = std::chrono::steady_clock::now();
    bool synced = false;
    auto reply = [&](proto::WorkerMessage&& m) {
      if (m.has_sync()) {
        auto now = std::chrono::steady_clock::now();
        if (synced) metrics->observe_step(std::chrono::duration<double>(now - last_sync).count());
        last_sync = now;
        synced = true;
      }
      stream.write(m);  // a client that left is noticed at the next read
    };
    uint64_t instructions = 0, memory = 0, compiled = 0;
    while (stream.read(&msg)) {
      if (!msg.has_batch())
        return absl::InvalidArgumentError(msg.has_hello() ? "Hello sent twice on one stream"
                                                           : "empty client message");
      if (gang_ready.valid()) {  // the first batch waits for the gang's process group
        if (absl::Status st = gang_ready.get(); !st.ok()) return st;
        gang_ready = {};
      }
      absl::Status st = session.run(msg.batch(), reply);
      uint64_t n = session.instructions_run(), m = session.memory_in_use_bytes();
      uint64_t c = session.compiled_runs();
      metrics->add_instructions(n - instructions);
      metrics->add_compiled_runs(c - compiled);
      compiled = c;
      metrics->add_memory(static_cast<int64_t>(m) - static_cast<int64_t>(memory));
      instructions = n;
      memory = m;
      if (!st.ok()) return st;
    }
    return stream.status();
  }

  CoordinatorLink::Load load() {
    CoordinatorLink::Load l;
    std::set<std::string> ids;
    std::lock_guard<std::mutex> lock(mu);
    for (const auto& [ctx, o] : open) {
      if (!o.session_id.empty()) ids.insert(o.session_id);
      l.memory_in_use_bytes += o.session->memory_in_use_bytes();
    }
    if (batches)
      for (std::string& b : batches->running()) ids.insert(std::move(b));
    l.sessions.assign(ids.begin(), ids.end());
    return l;
  }

  void close_session(const std::string& id) { gate->cancel(id); }
  std::unique_ptr<BatchRunner> batches;  // See Note [Batch jobs] in batch.h

  // See Note [Hang detection] in coordinator/src/coordinator.cpp.
  std::string dump(const std::string& id) {
    std::string out;
    {
      std::lock_guard<std::mutex> lock(mu);
      for (const auto& [ctx, o] : open)
        if (o.session_id == id) out += "executor: " + o.session->activity() + "\n";
    }
    if (out.empty()) out = "executor: no client stream of this session\n";
    const std::string groups = dist::dump_all_groups();
    out += groups.empty() ? "process groups: none\n" : "process groups:\n" + groups;
    return out + "threads:\n" + thread_stacks();
  }
};

absl::StatusOr<std::unique_ptr<Server>> Server::start(ServerOptions options) {
  auto impl = std::make_unique<Impl>();
  impl->opt = std::move(options);
  ServerOptions& opt = impl->opt;
  if (opt.worker_id.empty()) opt.worker_id = default_worker_id();
  if (!opt.token.empty())
    if (auto st = proto::check_token_text(opt.token, "--token (or KILN_TOKEN)"); !st.ok()) return st;
  if (auto st = proto::check_listen_address(opt.listen, !opt.token.empty()); !st.ok()) return st;
  impl->gate = std::make_unique<StreamGate>(StreamGate::Options{
      .token = opt.token, .coordinated = !opt.coordinator.empty(), .worker_id = opt.worker_id});
  absl::StatusOr<std::unique_ptr<Metrics>> metrics = Metrics::create(opt.metrics_listen, opt.token);
  if (!metrics.ok()) return metrics.status();
  impl->metrics = std::move(*metrics);

  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  builder.AddListeningPort(opt.listen, grpc::InsecureServerCredentials(), &impl->port);
  builder.SetMaxReceiveMessageSize(proto::kMaxMessageBytes);
  builder.SetMaxSendMessageSize(proto::kMaxMessageBytes);
  // Clients ping idle streams to notice a frozen worker (client/remote grpc_transport.cpp);
  // allow it rather than answering their pings with GOAWAY.
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS, 500);
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MAX_PING_STRIKES, 0);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIME_MS, kClientKeepaliveMs);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, kClientTimeoutMs);
  builder.RegisterService(impl.get());
  impl->server = builder.BuildAndStart();
  if (!impl->server || impl->port == 0)
    return absl::UnavailableError(absl::StrCat("cannot listen on '", opt.listen, "'"));

  if (!opt.coordinator.empty()) {
    proto::RegisterWorkerRequest req;
    req.set_worker_id(opt.worker_id);
    impl->address =
        opt.advertise.empty() ? reachable_address(opt.listen, impl->port) : opt.advertise;
    req.set_address(impl->address);
    req.set_device(opt.device.str());
    req.set_memory_limit_bytes(opt.memory_limit_bytes);
    Impl* self = impl.get();
    self->batches = std::make_unique<BatchRunner>(
        *self->gate, self->gang, self->address.substr(0, self->address.rfind(':')), opt.device);
    auto link = CoordinatorLink::start(
        opt.coordinator, opt.token, std::move(req), [self] { return self->load(); },
        [self](const std::string& id) { self->close_session(id); },
        [self](const std::string& id) { return self->dump(id); },
        [self](const proto::BatchRun& r) {  // a later beat repeats it until it runs
          if (self->coordinator) self->batches->start(*self->coordinator, r);
        },
        [self](const std::string& id) { self->batches->drain(id); });
    if (!link.ok()) {
      impl->server->Shutdown();
      return link.status();
    }
    impl->coordinator = std::move(*link);
  }
  return std::unique_ptr<Server>(new Server(std::move(impl)));
}

Server::Server(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Server::~Server() { shutdown(std::chrono::milliseconds(0)); }

int Server::port() const { return impl_->port; }
int Server::metrics_port() const { return impl_->metrics->port(); }
const std::string& Server::worker_id() const { return impl_->opt.worker_id; }

void Server::shutdown(std::chrono::milliseconds deadline) {
  if (!impl_->server) return;
  if (auto* health = impl_->server->GetHealthCheckService()) health->SetServingStatus(false);
  impl_->server->Shutdown(std::chrono::system_clock::now() + deadline);
  impl_->server->Wait();
  impl_->server.reset();
  impl_->gang.leave();         // its rendezvous may still use the coordinator link
  impl_->coordinator.reset();  // stops the heartbeats
}

}  // namespace kiln::worker
