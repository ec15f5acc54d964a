// connect(): a direct worker, a coordinator's session, or embedded workers
// (kiln/client/session.h).
#include "kiln/client/session.h"

#include <chrono>
#include <cstdlib>

#include "kiln/proto/coordinator.grpc.pb.h"
#include "kiln/proto/service.h"

namespace kiln::client {

struct Session::State {
  std::vector<std::shared_ptr<Connection>> conns;
  std::string session_id;
  std::string coordinator;  // "" unless the session came from a coordinator
  std::string token;
  bool closed = false;

  void close() {
    if (closed) return;
    closed = true;
    for (auto& c : conns) {
      c->close();
      unregister_connection(c->device());
    }
    if (coordinator.empty()) return;
    // Best effort: the coordinator also ends sessions whose client stopped renewing them.
    auto stub = proto::Coordinator::NewStub(
        grpc::CreateChannel(coordinator, grpc::InsecureChannelCredentials()));
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    proto::add_token(ctx, token);
    proto::CloseSessionRequest req;
    req.set_session_id(session_id);
    proto::CloseSessionReply reply;
    stub->CloseSession(&ctx, req, &reply);
  }
  ~State() {
    try {
      close();
    } catch (const std::exception&) {
      // Destructors do not raise.
    }
  }
};

Device Session::device(int rank) const { return connection(rank).device(); }

int Session::world_size() const { return state_ ? static_cast<int>(state_->conns.size()) : 0; }

void Session::sync() const {
  KILN_CHECK(state_ != nullptr, Value, "sync() on a Session that was never connected");
  for (auto& c : state_->conns) c->sync();
}

void Session::close() const {
  if (state_) state_->close();
}

const std::string& Session::session_id() const {
  static const std::string none;
  return state_ ? state_->session_id : none;
}

Connection& Session::connection(int rank) const {
  KILN_CHECK(state_ != nullptr, Value, "a Session that was never connected has no devices");
  KILN_CHECK(rank >= 0 && rank < world_size(), Index, "rank ", rank, " is out of range for a session of ",
             world_size(), " worker(s)");
  return *state_->conns[rank];
}

namespace {

std::string env(const char* name) {
  const char* v = std::getenv(name);
  return v ? std::string(v) : std::string();
}

// OpenSession at `address`; nullopt when the server is not a coordinator (UNIMPLEMENTED).
std::optional<proto::SessionInfo> open_session(const std::string& address,
                                               const ConnectOptions& o, const std::string& token) {
  auto channel = grpc::CreateChannel(address, grpc::InsecureChannelCredentials());
  auto stub = proto::Coordinator::NewStub(channel);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() +
                   std::chrono::milliseconds(o.connect_timeout_ms + o.wait_ms));
  proto::add_token(ctx, token);
  proto::OpenSessionRequest req;
  req.set_protocol_version(proto::kProtocolVersion);
  req.set_workers(o.workers);
  req.set_job_id(env("KILN_JOB_ID"));
  req.set_wait_ms(o.wait_ms);
  proto::SessionInfo info;
  absl::Status st = proto::from_grpc(stub->OpenSession(&ctx, req, &info));
  if (st.code() == absl::StatusCode::kUnimplemented) return std::nullopt;
  if (!st.ok()) raise_status(st, "cannot open a session at " + address);
  return info;
}

}  // namespace

Session connect(const std::string& address_in, ConnectOptions o) {
  std::string address = address_in;
  if (address.empty()) address = env("KILN_SESSION");
  if (address.empty()) address = env("KILN_COORDINATOR");
  KILN_CHECK(!address.empty(), Value,
             "connect(): no address given and neither KILN_SESSION nor KILN_COORDINATOR is set");
  KILN_CHECK(o.workers >= 1, Value, "connect(): workers must be >= 1, got ", o.workers);
  if (address == "inproc") return connect_in_process(o.workers);
  std::string token = o.token.empty() ? env("KILN_TOKEN") : o.token;

  Session s;
  s.state_ = std::make_shared<Session::State>();
  s.state_->token = token;
  GrpcOptions g{.token = token, .connect_timeout_ms = o.connect_timeout_ms};
  std::optional<proto::SessionInfo> info = open_session(address, o, token);
  if (!info) {
    KILN_CHECK(o.workers == 1, Value, "connect(): ", address,
               " is a worker, not a coordinator; a direct connection has one worker, not ",
               o.workers);
    s.state_->conns.push_back(open_connection(make_grpc_transport(address, g)));
    return s;
  }
  s.state_->coordinator = address;
  s.state_->session_id = info->session_id();
  g.session_id = info->session_id();
  g.world_size = info->worker_addresses_size();
  for (int r = 0; r < info->worker_addresses_size(); ++r) {
    g.rank = r;
    s.state_->conns.push_back(open_connection(make_grpc_transport(info->worker_addresses(r), g)));
  }
  return s;
}

Session connect_in_process(int workers, worker::SessionOptions options) {
  KILN_CHECK(workers >= 1, Value, "connect_in_process(): workers must be >= 1, got ", workers);
  Session s;
  s.state_ = std::make_shared<Session::State>();
  std::string base = options.worker_id;
  for (int r = 0; r < workers; ++r) {
    worker::SessionOptions w = options;
    w.rank = r;
    w.world_size = workers;
    if (workers > 1) w.worker_id = base + std::to_string(r);
    s.state_->conns.push_back(open_connection(std::make_unique<InProcessTransport>(w)));
  }
  return s;
}

}  // namespace kiln::client
