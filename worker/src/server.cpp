// The Worker gRPC service and its server (kiln/worker/server.h).
#include "kiln/worker/server.h"

#include <unistd.h>

#include <mutex>
#include <set>
#include <unordered_map>

#include <absl/strings/str_cat.h>
#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>

#include "coordinator_link.h"
#include "gang.h"
#include "kiln/proto/service.h"
#include "kiln/proto/worker.grpc.pb.h"
#include "kiln/worker/session.h"
#include "metrics.h"

namespace kiln::worker {

namespace {

using Stream = grpc::ServerReaderWriter<proto::WorkerMessage, proto::ClientMessage>;

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

struct Server::Impl final : proto::Worker::Service {
  ServerOptions opt;
  std::unique_ptr<Metrics> metrics;
  std::unique_ptr<CoordinatorLink> coordinator;
  std::unique_ptr<grpc::Server> server;
  int port = 0;
  std::string address;  // as registered with the coordinator
  Gang gang;

  // The open streams, for heartbeats (sessions served, memory) and for closing a session.
  struct Open {
    std::string session_id;
    const worker::Session* session;
  };
  std::mutex mu;
  std::unordered_map<grpc::ServerContext*, Open> open;

  grpc::Status Session(grpc::ServerContext* ctx, Stream* stream) override {
    try {
      return proto::to_grpc(serve(ctx, stream));
    } catch (const std::exception& e) {  // no exception crosses the handler
      return grpc::Status(grpc::StatusCode::INTERNAL, e.what());
    }
  }

  absl::Status serve(grpc::ServerContext* ctx, Stream* stream) {
    // Note [Session credentials]: a client of a coordinator's session need not know the
    // workers' token: the session id (random, 64 bits, handed out only on an authenticated
    // OpenSession) is its credential, checked with LookupSession below. Anyone else presents
    // the token; a directly serving worker checks it before reading anything.
    const absl::Status token = proto::check_token(*ctx, opt.token);
    if (!token.ok() && !coordinator) return token;
    proto::ClientMessage msg;
    if (!stream->Read(&msg)) return absl::OkStatus();  // the client left without a word
    if (!token.ok() && !(msg.has_hello() && !msg.hello().session_id().empty())) return token;
    if (!msg.has_hello()) return absl::InvalidArgumentError("expected Hello as the first message");
    const proto::Hello& hello = msg.hello();
    if (auto st = proto::check_version(hello.protocol_version(), "the client", "kiln-worker");
        !st.ok())
      return st;
    std::shared_future<absl::Status> gang_ready;
    SessionOptions so{.worker_id = opt.worker_id,
                      .device = opt.device,
                      .memory_limit_bytes = opt.memory_limit_bytes,
                      .rank = hello.rank(),
                      .world_size = hello.world_size() > 0 ? hello.world_size() : 1};
    if (!hello.session_id().empty()) {
      if (!coordinator)
        return absl::FailedPreconditionError(absl::StrCat(
            "Hello names session '", hello.session_id(),
            "' but this worker serves directly (started without --coordinator)"));
      absl::StatusOr<proto::SessionInfo> info = coordinator->lookup(hello.session_id());
      if (!info.ok()) return info.status();
      so.rank = info->rank();
      so.world_size = info->world_size() > 0 ? info->world_size() : 1;
      if (so.world_size > 1)  // Note [Gang process group]
        gang_ready = gang.join(*coordinator, hello.session_id(), so.rank, so.world_size,
                               address.substr(0, address.rfind(':')), opt.device);
    }
    worker::Session session(so);
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
    if (!stream->Write(hr)) return absl::OkStatus();

    auto last_sync = std::chrono::steady_clock::now();
    bool synced = false;
    auto reply = [&](proto::WorkerMessage&& m) {
      if (m.has_sync()) {
        auto now = std::chrono::steady_clock::now();
        if (synced) metrics->observe_step(std::chrono::duration<double>(now - last_sync).count());
        last_sync = now;
        synced = true;
      }
      stream->Write(m);  // a client that left is noticed at the next Read
    };
    uint64_t instructions = 0, memory = 0;
    while (stream->Read(&msg)) {
      if (!msg.has_batch())
        return absl::InvalidArgumentError(msg.has_hello() ? "Hello sent twice on one stream"
                                                           : "empty client message");
      if (gang_ready.valid()) {  // the first batch waits for the gang's process group
        if (absl::Status st = gang_ready.get(); !st.ok()) return st;
        gang_ready = {};
      }
      absl::Status st = session.run(msg.batch(), reply);
      uint64_t n = session.instructions_run(), m = session.memory_in_use_bytes();
      metrics->add_instructions(n - instructions);
      metrics->add_memory(static_cast<int64_t>(m) - static_cast<int64_t>(memory));
      instructions = n;
      memory = m;
      if (!st.ok()) return st;
    }
    return absl::OkStatus();
  }

  CoordinatorLink::Load load() {
    CoordinatorLink::Load l;
    std::set<std::string> ids;
    std::lock_guard<std::mutex> lock(mu);
    for (const auto& [ctx, o] : open) {
      if (!o.session_id.empty()) ids.insert(o.session_id);
      l.memory_in_use_bytes += o.session->memory_in_use_bytes();
    }
    l.sessions.assign(ids.begin(), ids.end());
    return l;
  }

  void close_session(const std::string& id) {
    std::lock_guard<std::mutex> lock(mu);
    for (const auto& [ctx, o] : open)
      if (o.session_id == id) ctx->TryCancel();
  }
};

absl::StatusOr<std::unique_ptr<Server>> Server::start(ServerOptions options) {
  auto impl = std::make_unique<Impl>();
  impl->opt = std::move(options);
  ServerOptions& opt = impl->opt;
  if (opt.worker_id.empty()) opt.worker_id = default_worker_id();
  if (auto st = proto::check_listen_address(opt.listen, !opt.token.empty()); !st.ok()) return st;
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
    auto link = CoordinatorLink::start(
        opt.coordinator, opt.token, std::move(req), [self] { return self->load(); },
        [self](const std::string& id) { self->close_session(id); });
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
