// kiln/client/transport.h: how a Connection reaches one worker. A transport sends Batches and
// hands back the worker's replies in order; it never interprets them (connection.h does).
//
//   auto g = kiln::client::make_grpc_transport("127.0.0.1:5000", {.token = "s3cret"});
//   t->send(batch);  kiln::proto::WorkerMessage m = t->receive();
//
// Failures (a dead worker, a refused Hello, a stream the worker ended) raise kiln::Error whose
// message starts with the gRPC code name ("UNAVAILABLE: ..."), never hang: the gRPC transport
// sets keepalive pings so a vanished peer ends a blocked read within seconds.
#pragma once

#include <absl/status/status.h>

#include <condition_variable>
#include <deque>
#include <exception>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "kiln/proto/worker.pb.h"

namespace kiln::worker {
struct SessionOptions;
}  // namespace kiln::worker

namespace kiln::client {

class Transport {
 public:
  virtual ~Transport() = default;
  virtual void send(proto::Batch&& batch) = 0;
  // The next reply (FetchReply piece or SyncReply). Raises when the stream failed.
  virtual proto::WorkerMessage receive() = 0;
  // The device the worker creates values on ("cpu", "cuda:0"): Device attributes naming the
  // remote device are sent as this.
  virtual const std::string& worker_device() const = 0;
  // A name for messages ("127.0.0.1:5000", "in-process worker 'w0'").
  virtual const std::string& name() const = 0;
  virtual void close() = 0;
  // The number of workers that run each batch (a gang's size).
  virtual int world_size() const { return 1; }
  // For a gang's writer threads (Note [Gang writers]): whether send() may run on another thread
  // than receive(); send_concurrently() is that send, which on a broken stream raises without
  // closing it (the reading thread does), and cancel() unblocks a send stuck on a hung worker.
  virtual bool can_send_concurrently() const { return false; }
  virtual void send_concurrently(proto::Batch&& batch) { send(std::move(batch)); }
  virtual void cancel() {}
};

// The embedded worker's transport (InProcessTransport, kiln/client/embedded.h). It lives in
// kiln_embedded, the one client library that links the worker, which registers its factory when
// it is loaded; this client library itself links no worker code. nullptr: not linked.
using InProcessFactory = std::unique_ptr<Transport> (*)(const worker::SessionOptions& options);
void set_in_process_factory(InProcessFactory factory);
InProcessFactory in_process_factory();

// Note [Gangs]: a session of N workers is one device; every recorded op runs on every worker
// (one SPMD program, DESIGN.md "Execution", distributed) with the same value ids. The gang
// transport sends each Batch to every rank, except that a Fetch goes to one rank only (rank 0,
// or the first that holds the value: Note [Gang stages]; a replicated value is the same
// everywhere, a sharded one reads that rank's shard) while the other ranks get a Sync in its
// place, so every read also learns of a failed or dead rank. A Sync's reply merges the ranks'
// replies: the first error of any rank, named by its rank. Per-rank data (scatter) goes through
// send_to.
//
// Note [Gang stages]: a pipeline over a gang records one subprogram per stage, each run by the
// stage's workers alone (MPMD; kiln.distributed.pipelining places stage s on worker s % N). The
// transport routes each command by the workers that hold its values: a command that names
// `ranks` (recorded inside a StageScope: a stage's parameters, its uploads) goes to those; an
// instruction goes to the workers holding its inputs (the union of their holders; inputs held
// by every worker do not narrow it), and its outputs are then held there (a list op, such as a
// fused optimizer step over every stage's parameters, is split: each worker gets the elements it
// holds); a Fetch goes to the
// first holder of its value, a Free to each value's holders, a Transfer (which moves a value
// from one stage's workers to the next's, proto Transfer) to its senders and receivers. Values
// with no entry are held by every worker, so a program without stages runs as before.
// Note [Gang writers]: a worker reads its next Batch only when it has run the last, so a write
// to a busy worker blocks once the stream's window is full. Were one thread to write to every
// rank in turn, a worker waiting for another's transfer would hold up the batch that other
// worker needs to send it: the stages of a pipeline would run one after the other (or, with
// large batches, wait for the collective timeout). Each gRPC rank therefore gets a writer thread
// that writes its batches in order; reads stay on the caller's thread, and a writer's failure
// is raised by the next call that concerns its rank.
class GangTransport final : public Transport {
 public:
  explicit GangTransport(std::vector<std::unique_ptr<Transport>> ranks);
  ~GangTransport() override;
  void send(proto::Batch&& batch) override;
  proto::WorkerMessage receive() override;
  void send_to(int rank, proto::Batch&& batch);
  int world_size() const override { return static_cast<int>(ranks_.size()); }
  const std::string& worker_device() const override { return ranks_[0]->worker_device(); }
  const std::string& name() const override { return name_; }
  void close() override;

 private:
  // Reads the replies of every rank but `skip` to Sync `request`; the first error, named by its
  // rank.
  std::optional<proto::Error> check_ranks(uint64_t request, int skip);
  // The ranks that run `c` (sorted; all of them when no value narrows it); records where its
  // outputs are held (Note [Gang stages]).
  std::vector<int> route(const proto::Command& c);
  const std::vector<int>* holders(int64_t id) const;
  // A list op whose elements belong to different stages, split per worker into `out`; false
  // when `c` is not one.
  bool split_lists(const proto::Command& c, std::vector<proto::Batch>& out);

  // Note [Gang writers].
  struct Lane {
    std::mutex mu;
    std::condition_variable cv;
    std::deque<proto::Batch> queue;
    bool stop = false, busy = false;
    std::exception_ptr error;
    std::thread thread;
  };
  void write(int rank, proto::Batch&& batch);
  void rethrow(int rank);  // a writer's failure
  void stop_lanes();

  std::vector<std::unique_ptr<Transport>> ranks_;
  std::vector<std::unique_ptr<Lane>> lanes_;  // null for ranks that send in the caller's thread
  std::string name_;
  std::optional<uint64_t> checked_fetch_;  // the Fetch whose Sync replies were read
  int reply_rank_ = 0;                     // who answers the request in flight
  std::unordered_map<int64_t, std::vector<int>> held_;  // values not on every rank
};

// Inside a StageScope, on this thread, recorded commands carry `ranks` (Note [Gang stages]).
class StageScope {
 public:
  explicit StageScope(std::vector<int> ranks);
  ~StageScope();
  StageScope(const StageScope&) = delete;
  StageScope& operator=(const StageScope&) = delete;
  static const std::vector<int>* current();  // null outside any scope

 private:
  std::vector<int> ranks_;
  const std::vector<int>* outer_;
};

struct GrpcOptions {
  std::string token;        // bearer token ("" when the worker has none)
  std::string session_id;   // the coordinator's session ("" for a direct connection)
  std::string session_secret;  // with session_id: the secret OpenSession handed out
  int rank = 0;
  int world_size = 1;
  int connect_timeout_ms = 5000;
  uint32_t protocol_version = 0;  // 0: kiln::proto::kProtocolVersion (tests override it)
};

// One bidirectional Session stream to the worker at `address`; Hello is exchanged here.
std::unique_ptr<Transport> make_grpc_transport(const std::string& address, GrpcOptions options);

// A kiln::Error for a failed RPC: "CODE: <context>: message", kind Value for INVALID_ARGUMENT,
// NotImplemented for UNIMPLEMENTED, Runtime otherwise.
[[noreturn]] void raise_status(const absl::Status& st, const std::string& context);

}  // namespace kiln::client
