// Connection: the pending Batch, flushing, fetch and sync; the registry of remote devices
// (Note [Remote values] in kiln/client/connection.h).
#include "kiln/client/connection.h"

#include <unordered_map>

#include "kiln/storage.h"
#include "kiln/tensor_impl.h"
#include "kiln/proto/codec.h"

namespace kiln::client {

Connection::Connection(std::unique_ptr<Transport> transport, Device device)
    : transport_(std::move(transport)), device_(device) {}

Connection::~Connection() = default;

void Connection::check_open() const {
  KILN_CHECK(!closed_, Runtime, "remote device ", device_, " (", transport_->name(),
             ") belongs to a closed session");
}

proto::Instruction* Connection::add_instruction() { return add_command()->mutable_op(); }

proto::Command* Connection::add_command() {
  queue_frees_locked();
  proto::Command* c = pending_.add_commands();
  if (const std::vector<int>* ranks = StageScope::current())  // Note [Gang stages]
    c->mutable_ranks()->Add(ranks->begin(), ranks->end());
  return c;
}

void Connection::queue_frees_locked() {
  if (!has_frees_.load(std::memory_order_acquire)) return;
  std::lock_guard<std::mutex> lock(free_mu_);
  if (to_free_.empty()) return;
  const int n = pending_.commands_size();  // a Free just before joins this one
  proto::Command* last = n > 0 ? pending_.mutable_commands(n - 1) : nullptr;
  auto* ids = (last && last->has_free() ? last : pending_.add_commands())->mutable_free()->mutable_ids();
  ids->Add(to_free_.begin(), to_free_.end());
  to_free_.clear();
  has_frees_.store(false, std::memory_order_release);
}

size_t append_create(proto::Batch& batch, int64_t id, const Tensor& t) {
  size_t bytes = 0;
  const std::vector<int>* ranks = StageScope::current();  // Note [Gang stages]
  for (proto::TensorData& p : proto::encode_tensor(t)) {
    bytes += p.data().size();
    proto::Command* cmd = batch.add_commands();
    if (ranks) cmd->mutable_ranks()->Add(ranks->begin(), ranks->end());
    proto::Create* c = cmd->mutable_create();
    c->set_id(id);
    c->set_wrapped_number(t.impl()->is_wrapped_number());
    *c->mutable_data() = std::move(p);
  }
  return bytes;
}

void Connection::add_create(int64_t id, const Tensor& t) {
  queue_frees_locked();
  pending_bytes_ += append_create(pending_, id, t);
}

void Connection::maybe_flush() {
  if (static_cast<size_t>(pending_.commands_size()) >= kMaxPendingCommands ||
      pending_bytes_ >= kMaxPendingBytes)
    flush_locked();
}

void Connection::flush() {
  std::lock_guard<std::mutex> lock(mu_);
  flush_locked();
}

void Connection::flush_locked() {
  if (closed_) return;
  queue_frees_locked();
  if (pending_.commands_size() == 0) return;
  // Whatever happens, the batch is gone: a failed send leaves nothing to resend.
  proto::Batch batch;
  batch.Swap(&pending_);
  pending_bytes_ = 0;
  transport_->send(std::move(batch));
}

void Connection::release(int64_t id) {
  std::lock_guard<std::mutex> lock(free_mu_);
  to_free_.push_back(id);
  has_frees_.store(true, std::memory_order_release);
}

void Connection::note_call_site(uint64_t seq, std::string site) {
  if (call_sites_.empty()) call_sites_.resize(kCallSites);
  call_sites_[seq % kCallSites] = {seq, std::move(site)};
}

namespace {
std::atomic<CallSiteFn> g_call_site_provider{nullptr};
}  // namespace

void set_call_site_provider(CallSiteFn fn) { g_call_site_provider.store(fn); }
CallSiteFn call_site_provider() { return g_call_site_provider.load(std::memory_order_relaxed); }

void Connection::raise_remote(const proto::Error& e) const {
  static const std::unordered_map<std::string, ErrorKind> kinds = {
      {"value", ErrorKind::Value},
      {"type", ErrorKind::Type},
      {"index", ErrorKind::Index},
      {"not_implemented", ErrorKind::NotImplemented}};
  auto it = kinds.find(e.kind());
  ErrorKind kind = it == kinds.end() ? ErrorKind::Runtime : it->second;
  std::string what = e.op().empty() ? std::string("a control command")
                                    : "op '" + e.op() + "' (seq " + std::to_string(e.seq()) + ")";
  if (!call_sites_.empty() && e.seq() != 0) {
    const auto& [seq, site] = call_sites_[e.seq() % kCallSites];
    if (seq == e.seq()) what += " recorded at " + site;
  }
  detail::throw_error(kind, "remote " + what + " failed on " + transport_->name() + " (" +
                                device_.str() + "): " + e.code() + ": " + e.message());
}

Tensor Connection::fetch(int64_t id) {
  std::lock_guard<std::mutex> lock(mu_);
  check_open();
  uint64_t request = next_request_++;
  proto::Fetch* f = pending_.add_commands()->mutable_fetch();
  f->set_request(request);
  f->set_id(id);
  flush_locked();
  proto::TensorAssembler assembler;
  for (;;) {
    proto::WorkerMessage m = transport_->receive();
    KILN_CHECK(m.has_fetch() && m.fetch().request() == request, Runtime, transport_->name(),
               ": expected the reply to fetch ", request, ", got ", m.ShortDebugString());
    if (m.fetch().has_error()) raise_remote(m.fetch().error());
    assembler.add(m.fetch().data());
    if (assembler.complete()) return assembler.take();
  }
}

void Connection::sync() {
  std::lock_guard<std::mutex> lock(mu_);
  if (closed_) return;
  uint64_t request = next_request_++;
  pending_.add_commands()->mutable_sync()->set_request(request);
  flush_locked();
  proto::WorkerMessage m = transport_->receive();
  KILN_CHECK(m.has_sync() && m.sync().request() == request, Runtime, transport_->name(),
             ": expected the reply to sync ", request, ", got ", m.ShortDebugString());
  if (m.sync().has_error()) raise_remote(m.sync().error());
}

void Connection::close() {
  std::lock_guard<std::mutex> lock(mu_);
  if (closed_) return;
  try {
    flush_locked();
  } catch (const Error&) {
    // Closing a session whose worker is gone: nothing left to tell it.
  }
  closed_ = true;
  transport_->close();
}

RemoteValue::~RemoteValue() {
  if (!conn->closed()) conn->release(id);
}

Tensor make_remote_tensor(const std::shared_ptr<Connection>& conn, int64_t id, ScalarType dtype,
                          IntArrayRef sizes, IntArrayRef strides, int64_t offset) {
  int64_t hi = offset;
  bool empty = false;
  for (size_t i = 0; i < sizes.size(); ++i) {
    if (sizes[i] == 0) empty = true;
    else hi += (sizes[i] - 1) * std::max<int64_t>(strides[i], 0);
  }
  size_t nbytes = empty ? 0 : static_cast<size_t>(hi + 1) * element_size(dtype);
  auto storage = Storage::create_dataless(nbytes, conn->device());
  auto impl = TensorImpl::make(storage, dtype, sizes, strides, offset);
  impl->set_backend_handle(std::make_shared<RemoteValue>(conn, id));
  return Tensor(std::move(impl));
}

const RemoteValue& remote_value(const Tensor& t, const char* op) {
  const auto* v = dynamic_cast<const RemoteValue*>(t.impl()->backend_handle());
  KILN_CHECK(v != nullptr, Value, op, ": a tensor on ", t.device(),
             " has no remote value (was it made outside the Remote backend?)");
  return *v;
}

namespace {

// Records `x` for `ranks` (empty: its senders and receivers, as routed; Note [Gang stages]).
void record_transfer(Connection& c, const proto::Transfer& x, const std::vector<int>& ranks) {
  std::lock_guard<std::mutex> lock(c.mutex());
  c.check_open();
  proto::Command* cmd = c.add_command();
  cmd->clear_ranks();
  cmd->mutable_ranks()->Add(ranks.begin(), ranks.end());
  *cmd->mutable_transfer() = x;
  cmd->mutable_transfer()->set_seq(c.new_seq());
  c.maybe_flush();
}

}  // namespace

std::pair<Tensor, proto::Transfer> transfer_send(const Tensor& t, const std::vector<int>& src,
                                                 const std::vector<int>& dst, bool both) {
  const RemoteValue& v = remote_value(t, "transfer");
  Connection& c = *v.conn;
  const int n = c.transport().world_size();
  KILN_CHECK(!src.empty() && src.size() == dst.size(), Value, "transfer: ", src.size(),
             " senders for ", dst.size(), " receivers");
  for (size_t i = 0; i < src.size(); ++i)
    KILN_CHECK(src[i] >= 0 && src[i] < n && dst[i] >= 0 && dst[i] < n && src[i] != dst[i], Value,
               "transfer: worker ", src[i], " to worker ", dst[i],
               " is not a pair of distinct workers of ", c.transport().name());
  proto::Transfer x;
  {
    std::lock_guard<std::mutex> lock(c.mutex());
    x.set_output(c.new_id());
  }
  x.set_input(v.id);
  x.mutable_src()->Add(src.begin(), src.end());
  x.mutable_dst()->Add(dst.begin(), dst.end());
  x.set_dtype(scalar_type_name(t.dtype()));
  x.mutable_sizes()->Add(t.sizes().begin(), t.sizes().end());
  record_transfer(c, x, both ? std::vector<int>{} : src);
  Tensor out = make_remote_tensor(v.conn, x.output(), t.dtype(), t.sizes(),
                                  contiguous_strides(t.sizes()), 0);
  return {out, x};
}

void transfer_receive(const Tensor& moved, const proto::Transfer& sent) {
  const RemoteValue& v = remote_value(moved, "transfer");
  record_transfer(*v.conn, sent, std::vector<int>(sent.dst().begin(), sent.dst().end()));
}

Tensor transfer(const Tensor& t, const std::vector<int>& src, const std::vector<int>& dst) {
  return transfer_send(t, src, dst, /*both=*/true).first;
}

// ---- The registry of remote devices ----------------------------------------------------------

namespace {
std::mutex registry_mu;
std::vector<std::shared_ptr<Connection>>& registry() {
  static std::vector<std::shared_ptr<Connection>> r;
  return r;
}
}  // namespace

std::shared_ptr<Connection> open_connection(std::unique_ptr<Transport> transport) {
  std::lock_guard<std::mutex> lock(registry_mu);
  auto& r = registry();
  KILN_CHECK(r.size() < 32767, Runtime, "too many remote connections in one process");
  Device d(DeviceType::Remote, static_cast<int16_t>(r.size()));
  r.push_back(std::make_shared<Connection>(std::move(transport), d));
  return r.back();
}

std::shared_ptr<Connection> connection_for(Device device) {
  std::lock_guard<std::mutex> lock(registry_mu);
  auto& r = registry();
  size_t i = static_cast<size_t>(device.index());
  KILN_CHECK(device.type() == DeviceType::Remote && i < r.size() && r[i], Value, "device ",
             device, " is not connected (kiln::client::connect returns the session's devices)");
  return r[i];
}

void unregister_connection(Device device) {
  std::lock_guard<std::mutex> lock(registry_mu);
  auto& r = registry();
  size_t i = static_cast<size_t>(device.index());
  if (i < r.size()) r[i].reset();
}

}  // namespace kiln::client
