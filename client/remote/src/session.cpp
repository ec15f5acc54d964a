// connect(): a direct worker, a coordinator's session, or embedded workers
// (kiln/client/session.h).
#include "kiln/client/session.h"

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <map>

#include "kiln/generated/ops.h"
#include "kiln/proto/coordinator.grpc.pb.h"
#include "kiln/proto/service.h"

namespace kiln::client {

struct Session::State {
  std::shared_ptr<Connection> conn;
  int world_size = 1;
  std::string session_id;
  std::string coordinator;  // "" unless the session came from a coordinator
  std::string token;
  bool closed = false;
  int64_t steps = 0;  // log_step's count

  void close() {
    if (closed || !conn) return;  // (no conn: connect() failed half-way)
    closed = true;
    conn->close();
    unregister_connection(conn->device());
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

Connection& Session::connection() const {
  KILN_CHECK(state_ != nullptr, Value, "a Session that was never connected has no device");
  return *state_->conn;
}

Device Session::device() const { return connection().device(); }

int Session::world_size() const { return state_ ? state_->world_size : 0; }

Tensor Session::scatter(const Tensor& t) const {
  Connection& c = connection();
  auto* gang = dynamic_cast<GangTransport*>(&c.transport());
  if (!gang) return t.to(std::nullopt, c.device());
  int n = gang->world_size();
  KILN_CHECK(t.device().has_data(), Value, "scatter: expected a tensor with data, got one on ",
             t.device());
  KILN_CHECK(t.dim() >= 1 && t.size(0) % n == 0, Value, "scatter: dim 0 of a tensor of shape ",
             t.sizes(), " does not split into ", n, " equal shards");
  int64_t rows = t.size(0) / n;
  std::lock_guard<std::mutex> lock(c.mutex());
  c.check_open();
  c.flush_locked();  // everything recorded before the scatter runs before its Creates
  int64_t id = c.new_id();
  for (int r = 0; r < n; ++r) {
    proto::Batch b;
    append_create(b, id, t.slice(0, r * rows, (r + 1) * rows));
    gang->send_to(r, std::move(b));
  }
  std::vector<int64_t> sizes(t.sizes().begin(), t.sizes().end());
  sizes[0] = rows;
  return make_remote_tensor(state_->conn, id, t.dtype(), sizes, contiguous_strides(sizes), 0);
}

void Session::all_reduce_gradients(const std::vector<Tensor>& params) const {
  if (world_size() <= 1) return;
  // One collective per dtype over the flattened gradients (DDP's buckets): a collective is a
  // rendezvous of every worker, so fewer is much faster than one per parameter.
  std::map<ScalarType, std::vector<Tensor>> by_dtype;
  for (const Tensor& p : params)
    if (Tensor g = p.grad(); g.defined()) by_dtype[g.dtype()].push_back(g);
  for (auto& [dtype, grads] : by_dtype) {
    std::vector<Tensor> flat;
    for (const Tensor& g : grads) flat.push_back(g.reshape({-1}));
    Tensor sum = kiln::all_reduce(kiln::cat(flat), "avg", "world");
    int64_t at = 0;
    for (const Tensor& g : grads) {
      g.copy_(sum.slice(0, at, at + g.numel()).view(g.sizes()));
      at += g.numel();
    }
  }
}

void Session::log_step(const Tensor& loss, double tokens) const {
  KILN_CHECK(std::isfinite(tokens) && tokens >= 0, Value,
             "log_step: tokens must be a finite number >= 0, got ", tokens);
  Connection& c = connection();
  std::optional<int64_t> id;
  if (loss.defined()) {
    KILN_CHECK(loss.device() == c.device(), Value,
               "log_step: the loss must be on the session's device ", c.device(), ", got one on ",
               loss.device());
    KILN_CHECK(loss.numel() == 1, Value, "log_step: the loss must have one element, got shape ",
               loss.sizes());
    id = remote_value(loss, "log_step").id;
  }
  std::lock_guard<std::mutex> lock(c.mutex());
  c.check_open();
  proto::StepMark* m = c.add_command()->mutable_step_mark();
  m->set_step(++state_->steps);
  if (id) m->set_loss(*id);
  m->set_tokens(tokens);
  c.maybe_flush();
}

void Session::sync() const { connection().sync(); }

Tensor scatter_to(const Tensor& t, Device device, const std::vector<int>& ranks) {
  std::shared_ptr<Connection> conn = connection_for(device);
  const int n = static_cast<int>(ranks.size()), world = conn->transport().world_size();
  KILN_CHECK(n >= 1, Value, "scatter_to: no workers");
  for (int r : ranks)
    KILN_CHECK(r >= 0 && r < world, Value, "scatter_to: no worker ", r, " in ",
               conn->transport().name());
  KILN_CHECK(t.device().has_data(), Value, "scatter_to: expected a tensor with data, got one on ",
             t.device());
  KILN_CHECK(t.dim() >= 1 && t.size(0) % n == 0, Value, "scatter_to: dim 0 of a tensor of shape ",
             t.sizes(), " does not split into ", n, " equal shards");
  const int64_t rows = t.size(0) / n;
  std::lock_guard<std::mutex> lock(conn->mutex());
  conn->check_open();
  const int64_t id = conn->new_id();
  for (int i = 0; i < n; ++i) {
    StageScope on({ranks[i]});  // Note [Gang stages]: the id is held by all of `ranks`
    conn->add_create(id, t.slice(0, i * rows, (i + 1) * rows));
  }
  conn->maybe_flush();
  std::vector<int64_t> sizes(t.sizes().begin(), t.sizes().end());
  sizes[0] = rows;
  return make_remote_tensor(conn, id, t.dtype(), sizes, contiguous_strides(sizes), 0);
}

void Session::close() const {
  if (state_) state_->close();
}

const std::string& Session::session_id() const {
  static const std::string none;
  return state_ ? state_->session_id : none;
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

// One connection over the ranks' transports: the transport itself, or a gang of them.
std::shared_ptr<Connection> open_ranks(std::vector<std::unique_ptr<Transport>> ranks) {
  if (ranks.size() == 1) return open_connection(std::move(ranks[0]));
  return open_connection(std::make_unique<GangTransport>(std::move(ranks)));
}

}  // namespace

namespace {
std::atomic<InProcessFactory> g_in_process{nullptr};
}  // namespace

void set_in_process_factory(InProcessFactory factory) { g_in_process = factory; }
InProcessFactory in_process_factory() { return g_in_process.load(); }

Session connect(const std::string& address_in, ConnectOptions o) {
  std::string address = address_in;
  if (address.empty()) address = env("KILN_COORDINATOR");  // a job's driver (kiln submit)
  KILN_CHECK(!address.empty(), Value,
             "connect(): no address given and KILN_COORDINATOR is not set");
  KILN_CHECK(o.workers >= 1, Value, "connect(): workers must be >= 1, got ", o.workers);
  if (address == "inproc") return connect_in_process(o.workers);
  std::string token = o.token.empty() ? env("KILN_TOKEN") : o.token;

  Session s;
  s.state_ = std::make_shared<Session::State>();
  s.state_->token = token;
  GrpcOptions g{.token = token, .connect_timeout_ms = o.connect_timeout_ms};
  std::optional<proto::SessionInfo> info = open_session(address, o, token);
  std::vector<std::unique_ptr<Transport>> ranks;
  if (!info) {
    KILN_CHECK(o.workers == 1, Value, "connect(): ", address,
               " is a worker, not a coordinator; a direct connection has one worker, not ",
               o.workers);
    ranks.push_back(make_grpc_transport(address, g));
  } else {
    s.state_->coordinator = address;
    s.state_->session_id = info->session_id();
    g.session_id = info->session_id();
    g.session_secret = info->session_secret();
    g.world_size = info->worker_addresses_size();
    for (int r = 0; r < info->worker_addresses_size(); ++r) {
      g.rank = r;
      ranks.push_back(make_grpc_transport(info->worker_addresses(r), g));
    }
    KILN_CHECK(!ranks.empty(), Runtime, "the coordinator at ", address,
               " opened session '", info->session_id(), "' without workers");
  }
  s.state_->world_size = static_cast<int>(ranks.size());
  s.state_->conn = open_ranks(std::move(ranks));
  return s;
}

Session connect_in_process(int workers, worker::SessionOptions options) {
  KILN_CHECK(workers >= 1, Value, "connect_in_process(): workers must be >= 1, got ", workers);
  const InProcessFactory make = in_process_factory();
  KILN_CHECK(make, Runtime,
             "connect_in_process(): this program has no embedded worker (library kiln_embedded "
             "is not linked); connect to a kiln-worker or a coordinator instead");
  Session s;
  s.state_ = std::make_shared<Session::State>();
  std::string base = options.worker_id;
  std::vector<std::unique_ptr<Transport>> ranks;
  for (int r = 0; r < workers; ++r) {
    worker::SessionOptions w = options;
    w.rank = r;
    w.world_size = workers;
    if (workers > 1) w.worker_id = base + std::to_string(r);
    ranks.push_back(make(w));
  }
  s.state_->world_size = workers;
  s.state_->conn = open_ranks(std::move(ranks));
  return s;
}

}  // namespace kiln::client
