// kiln/worker/server.h: the Worker gRPC service (proto/kiln/proto/worker.proto) around Session,
// as `kiln-worker` runs it: one Session per stream, health and reflection, Prometheus metrics,
// optional registration with a coordinator, and a graceful drain.
//
//   auto server = kiln::worker::Server::start({.listen = "127.0.0.1:0"});
//   if (!server.ok()) ...;                     // bad address, port taken, coordinator refused
//   int port = (*server)->port();
//   (*server)->shutdown(std::chrono::seconds(3));   // stop accepting, drain, cancel the rest
//
// A stream opens with Hello (else INVALID_ARGUMENT, as for any message that does not parse),
// whose protocol version must match (FAILED_PRECONDITION). Who may open one, and the rule of one
// stream at a time, are Note [One stream per worker] (kiln/worker/stream_gate.h): a direct
// worker wants its token (UNAUTHENTICATED); a worker registered with a coordinator serves only
// the coordinator's sessions, checking each Hello's session id and secret with LookupSession
// (PERMISSION_DENIED); a second stream is refused (ALREADY_EXISTS, RESOURCE_EXHAUSTED). A batch
// that run() rejects ends the stream with run()'s status; the worker serves on.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include <absl/status/statusor.h>

#include "kiln/device.h"

namespace kiln::worker {

struct ServerOptions {
  std::string listen = "127.0.0.1:0";
  std::string token;                // "" : no auth (loopback only)
  uint64_t memory_limit_bytes = 0;  // the worker's (one session at a time); 0: none
  Device device = kCPU;
  std::string worker_id;            // "" : hostname-pid
  std::string metrics_listen;       // "" : no /metrics endpoint
  std::string coordinator;          // "" : serve directly; else register at host:port
  std::string advertise;            // address given to the coordinator ("" : from listen)
};

class Server {
 public:
  static absl::StatusOr<std::unique_ptr<Server>> start(ServerOptions options);
  ~Server();
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  int port() const;
  int metrics_port() const;  // 0 without a metrics endpoint
  const std::string& worker_id() const;
  // Stops accepting streams, lets open ones run until `deadline` passes, then cancels them.
  void shutdown(std::chrono::milliseconds deadline);

  struct Impl;

 private:
  explicit Server(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace kiln::worker
