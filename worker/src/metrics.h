// worker/src/metrics.h: the worker's Prometheus metrics (DESIGN.md "Dependencies": prometheus-cpp),
// counted always and served on /metrics when an address is given.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include <absl/status/statusor.h>

namespace prometheus {
class Counter;
class Exposer;
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
  void add_memory(int64_t delta_bytes);
  void observe_step(double seconds);  // time between two Syncs of a session
  int port() const;                   // 0 when not serving

 private:
  Metrics();
  std::shared_ptr<prometheus::Registry> registry_;
  prometheus::Counter* instructions_;
  prometheus::Gauge* memory_;
  prometheus::Histogram* step_;
  std::unique_ptr<prometheus::Exposer> exposer_;
};

}  // namespace kiln::worker
