// kiln/client/connection.h: the client side of one worker session: the pending Batch the Remote
// backend records into, value ids and their lifetimes, flushing, fetching and syncing.
//
// Note [Remote values]: a Remote tensor is a data-less TensorImpl on Device(Remote, N) whose
// BackendHandle (RemoteValue) holds the connection and the worker's value id. Views get fresh
// ids (the worker builds the same view); in-place and out= results keep their input's id (the
// worker re-binds it). When the last handle to an id dies the id is queued, and a Free command
// goes into the batch ahead of whatever is recorded next: after every instruction that used the
// id, and before any later allocation, so an allocation never fails for memory the client has
// already released.
//
// Note [Call sites]: a remote error names the failed op and its seq; when a call-site provider
// is set (set_call_site_provider: e.g. the Python binding's "file.py:12 in step"), each
// recorded op also keeps its call site, client side, in a ring of the last kCallSites ops, and
// the error names it too. C++ callers get no source_location through the dispatcher, so the
// default is op name and seq only.
//
// Flushing: on a read (fetch), on sync(), and when the pending Batch reaches kMaxPendingCommands
// commands or kMaxPendingBytes bytes of uploads. Errors of instructions surface at the next
// fetch or sync as kiln::Error naming the failed op and its seq.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "kiln/client/transport.h"
#include "kiln/tensor.h"

namespace kiln::client {

class Connection {
 public:
  static constexpr size_t kMaxPendingCommands = 4096;
  static constexpr size_t kMaxPendingBytes = size_t{8} << 20;
  static constexpr size_t kCallSites = 4096;

  Connection(std::unique_ptr<Transport> transport, Device device);
  ~Connection();
  Connection(const Connection&) = delete;
  Connection& operator=(const Connection&) = delete;

  Device device() const { return device_; }
  Transport& transport() { return *transport_; }
  // Guards the pending batch; the Remote backend holds it while it records one op.
  std::mutex& mutex() { return mu_; }

  // ---- Recording (caller holds mutex()) ----
  int64_t new_id() { return next_id_++; }
  uint64_t new_seq() { return next_seq_++; }
  // Keeps `site` as the call site of op `seq` (Note [Call sites]).
  void note_call_site(uint64_t seq, std::string site);
  proto::Instruction* add_instruction();
  proto::Command* add_command();  // a control command (MeshCreate, Redistribute)
  // Uploads a tensor with data (any device, any layout) as value `id`.
  void add_create(int64_t id, const Tensor& t);
  // Flushes when the batch is full.
  void maybe_flush();
  void flush_locked();  // sends the pending batch now
  void flush();         // as flush_locked, taking the mutex
  // ---- Reads (take the mutex themselves) ----
  Tensor fetch(int64_t id);  // a CPU tensor with the value's sizes
  void sync();
  // Queues `id` for Free (thread-safe; callable while another thread records).
  void release(int64_t id);
  void close();
  bool closed() const { return closed_; }
  void check_open() const;

 private:
  [[noreturn]] void raise_remote(const proto::Error& e) const;

  std::unique_ptr<Transport> transport_;
  Device device_;
  std::mutex mu_;
  proto::Batch pending_;
  size_t pending_bytes_ = 0;
  int64_t next_id_ = 1;
  uint64_t next_seq_ = 1;
  uint64_t next_request_ = 1;
  std::vector<std::pair<uint64_t, std::string>> call_sites_;  // by seq % kCallSites
  // Moves the released ids into the pending batch as one Free (caller holds mutex()).
  void queue_frees_locked();

  std::mutex free_mu_;
  std::vector<int64_t> to_free_;
  std::atomic<bool> has_frees_{false};  // !to_free_.empty(), read without free_mu_
  std::atomic<bool> closed_{false};
};

// Appends the Create commands of value `id` holding `t` (pieces of at most kChunkBytes).
size_t append_create(proto::Batch& batch, int64_t id, const Tensor& t);

// The call site of the op being recorded, for remote errors (Note [Call sites]); nullptr: none.
using CallSiteFn = std::string (*)();
void set_call_site_provider(CallSiteFn fn);
CallSiteFn call_site_provider();

// The BackendHandle of a Remote tensor (Note [Remote values]).
struct RemoteValue final : BackendHandle {
  RemoteValue(std::shared_ptr<Connection> c, int64_t i) : conn(std::move(c)), id(i) {}
  ~RemoteValue() override;
  std::shared_ptr<Connection> conn;
  int64_t id;
};

// A data-less tensor on the connection's device naming value `id`.
Tensor make_remote_tensor(const std::shared_ptr<Connection>& conn, int64_t id, ScalarType dtype,
                          IntArrayRef sizes, IntArrayRef strides, int64_t offset);
// The RemoteValue of a Remote tensor; ValueError when it has none.
const RemoteValue& remote_value(const Tensor& t, const char* op);
// A gang's remote tensor `t`, held by workers src[i], as a new value held by workers dst[i]
// (each src[i] sends its own to dst[i]; Note [Gang stages] in kiln/client/transport.h). Recorded
// like an op: a failure shows at the next read or sync.
Tensor transfer(const Tensor& t, const std::vector<int>& src, const std::vector<int>& dst);
// The two halves of a transfer, recorded apart: the senders' half (`both`: the whole command)
// when the value is made, the receivers' half when it is needed. A pipeline's stages then send
// as soon as they can and receive as late as they can (Note [Gang stages]).
std::pair<Tensor, proto::Transfer> transfer_send(const Tensor& t, const std::vector<int>& src,
                                                 const std::vector<int>& dst, bool both = false);
void transfer_receive(const Tensor& moved, const proto::Transfer& sent);

// Remote devices: Device(Remote, N) names the N-th connection opened by this process.
std::shared_ptr<Connection> open_connection(std::unique_ptr<Transport> transport);
// ValueError naming the device when nothing is registered under it (or it was closed).
std::shared_ptr<Connection> connection_for(Device device);
void unregister_connection(Device device);

}  // namespace kiln::client
