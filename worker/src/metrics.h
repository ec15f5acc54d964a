// worker/src/metrics.h: the worker's Prometheus metrics (DESIGN.md "Dependencies": prometheus-cpp),
// counted always and served on /metrics when an address is given.
//
// Note [Metrics endpoint]: prometheus-cpp's Exposer (civetweb) cannot start its worker threads in
// kiln-worker: Debian's civetweb creates them with a fixed 100 KiB stack, and the process's
// static TLS (cuBLASLt alone holds 94 KiB) does not fit, so pthread_create fails with EINVAL.
// The endpoint is therefore a small HTTP/1.0 responder of our own on one thread (GET /metrics,
// basic auth when a token is set); prometheus-cpp still does the metrics and their text format.
// That thread polls every connection at once, each with a short deadline (metrics.cpp).
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include <absl/status/statusor.h>

namespace prometheus {
class Counter;
class Gauge;
class Histogram;
class Registry;
}  // namespace prometheus

namespace kiln::worker {

class Metrics {
 public:
  // Serves /metrics on `listen` ("" : nowhere). With a token, scrapes need HTTP basic auth with
  // the token as password (the loopback rule: an open endpoint only on loopback).
  static absl::StatusOr<std::unique_ptr<Metrics>> create(const std::string& listen,
                                                        const std::string& token);
  ~Metrics();

  void add_instructions(uint64_t n);
  void add_compiled_runs(uint64_t n);  // segments the compiled-graph cache ran
  void add_memory(int64_t delta_bytes);
  void observe_step(double seconds);  // time between two Syncs of a session
  int port() const;                   // 0 when not serving

 private:
  Metrics();
  std::shared_ptr<prometheus::Registry> registry_;
  prometheus::Counter* instructions_;
  prometheus::Counter* compiled_;
  prometheus::Gauge* memory_;
  prometheus::Histogram* step_;
  class Endpoint;
  std::unique_ptr<Endpoint> endpoint_;
};

}  // namespace kiln::worker
