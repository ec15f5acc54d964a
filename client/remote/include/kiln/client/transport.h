// kiln/client/transport.h: how a Connection reaches one worker. A transport sends Batches and
// hands back the worker's replies in order; it never interprets them (connection.h does).
//
//   auto t = kiln::client::make_in_process_transport({.worker_id = "embedded"});  // tests
//   auto g = kiln::client::make_grpc_transport("127.0.0.1:5000", {.token = "s3cret"});
//   t->send(batch);  kiln::proto::WorkerMessage m = t->receive();
//
// Failures (a dead worker, a refused Hello, a stream the worker ended) raise kiln::Error whose
// message starts with the gRPC code name ("UNAVAILABLE: ..."), never hang: the gRPC transport
// sets keepalive pings so a vanished peer ends a blocked read within seconds.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <absl/status/status.h>

#include "kiln/proto/worker.pb.h"
#include "kiln/worker/session.h"

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
};

// The embedded path: runs batches on a kiln::worker::Session in this process.
class InProcessTransport final : public Transport {
 public:
  explicit InProcessTransport(worker::SessionOptions options);
  void send(proto::Batch&& batch) override;
  proto::WorkerMessage receive() override;
  const std::string& worker_device() const override { return device_; }
  const std::string& name() const override { return name_; }
  void close() override {}
  worker::Session& session() { return session_; }

 private:
  worker::Session session_;
  std::string device_;
  std::string name_;
  std::vector<proto::WorkerMessage> replies_;  // not yet received, oldest first
  size_t next_ = 0;
};

// Note [Gangs]: a session of N workers is one device; every recorded op runs on every worker
// (one SPMD program, DESIGN.md "Execution", distributed) with the same value ids. The gang
// transport sends each Batch to every rank, except that a Fetch goes to rank 0 only (a
// replicated value is the same everywhere; a sharded one reads rank 0's shard) while the other
// ranks get a Sync in its place, so every read also learns of a failed or dead rank. A Sync's
// reply merges the ranks' replies: the first error of any rank, named by its rank. Per-rank
// data (scatter) goes through send_to.
class GangTransport final : public Transport {
 public:
  explicit GangTransport(std::vector<std::unique_ptr<Transport>> ranks);
  void send(proto::Batch&& batch) override;
  proto::WorkerMessage receive() override;
  void send_to(int rank, proto::Batch&& batch) { ranks_.at(rank)->send(std::move(batch)); }
  int world_size() const override { return static_cast<int>(ranks_.size()); }
  const std::string& worker_device() const override { return ranks_[0]->worker_device(); }
  const std::string& name() const override { return name_; }
  void close() override;

 private:
  // Reads the other ranks' replies to Sync `request`; the first error, named by its rank.
  std::optional<proto::Error> check_ranks(uint64_t request);
  std::vector<std::unique_ptr<Transport>> ranks_;
  std::string name_;
  std::optional<uint64_t> checked_fetch_;  // the Fetch whose Sync replies were read
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
