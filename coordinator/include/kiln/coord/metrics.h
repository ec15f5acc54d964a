// kiln/coord/metrics.h: the coordinator's Prometheus metrics, served by prometheus-cpp's
// Exposer at /metrics: `kiln_coordinator_jobs{state}` and `kiln_coordinator_workers{state}`
// (gauges read from the Coordinator at scrape time), `kiln_coordinator_findings_total{kind}`
// (desyncs and stragglers noticed: Note [Desync detection], Note [Stragglers]),
// `kiln_coordinator_rpcs_total{method, code}`, and per running job and rank the latest step's
// `kiln_job_step`, `kiln_job_step_seconds`, `kiln_job_step_busy_seconds`, `kiln_job_loss` and
// `kiln_job_tokens_per_second` (Note [Step telemetry] in worker/src/reports.h).
//
//   Metrics metrics(coordinator);
//   metrics.count_rpc("SubmitJob", absl::StatusCode::kOk);
//   prometheus::Exposer exposer("127.0.0.1:9100");
//   exposer.RegisterCollectable(metrics.collectable());
#pragma once

#include <absl/status/status.h>

#include <memory>
#include <string>

namespace prometheus {
class Collectable;
}

namespace kiln::coord {

class Coordinator;

class Metrics {
 public:
  explicit Metrics(Coordinator& core);
  ~Metrics();
  void count_rpc(const std::string& method, absl::StatusCode code);
  std::shared_ptr<prometheus::Collectable> collectable() const { return collectable_; }

 private:
  struct Impl;
  std::shared_ptr<Impl> impl_;
  std::shared_ptr<prometheus::Collectable> collectable_;
};

}  // namespace kiln::coord
