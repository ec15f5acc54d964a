#include "kiln/coord/metrics.h"

#include <prometheus/collectable.h>
#include <prometheus/counter.h>
#include <prometheus/family.h>
#include <prometheus/metric_family.h>
#include <prometheus/registry.h>

#include "kiln/coord/coordinator.h"

namespace kiln::coord {

// The counters live in a Registry; the gauges are read from the Coordinator on every scrape, so
// they can never drift from the real state.
struct Metrics::Impl : prometheus::Collectable {
  explicit Impl(Coordinator& c)
      : core(c),
        rpcs(prometheus::BuildCounter()
                 .Name("kiln_coordinator_rpcs_total")
                 .Help("Coordinator RPCs handled, by method and status code")
                 .Register(registry)) {}

  std::vector<prometheus::MetricFamily> Collect() const override {
    std::vector<prometheus::MetricFamily> out = registry.Collect();
    out.push_back(gauge("kiln_coordinator_jobs", "Jobs by state", core.job_counts()));
    out.push_back(
        gauge("kiln_coordinator_workers", "Registered workers by state", core.worker_counts()));
    out.push_back(gauge("kiln_coordinator_findings_total",
                        "Findings about running jobs since the coordinator started, by kind",
                        core.finding_counts(), "kind", prometheus::MetricType::Counter));
    return out;
  }

  static prometheus::MetricFamily gauge(
      const std::string& name, const std::string& help, const std::map<std::string, int>& by_label,
      const std::string& label = "state",
      prometheus::MetricType type = prometheus::MetricType::Gauge) {
    prometheus::MetricFamily f{name, help, type, {}};
    for (const auto& [value, n] : by_label) {
      prometheus::ClientMetric m;
      m.label.push_back({label, value});
      if (type == prometheus::MetricType::Counter)
        m.counter.value = n;
      else
        m.gauge.value = n;
      f.metric.push_back(m);
    }
    return f;
  }

  Coordinator& core;
  prometheus::Registry registry;
  prometheus::Family<prometheus::Counter>& rpcs;
};

Metrics::Metrics(Coordinator& core) : impl_(std::make_shared<Impl>(core)), collectable_(impl_) {}

Metrics::~Metrics() = default;

void Metrics::count_rpc(const std::string& method, absl::StatusCode code) {
  impl_->rpcs.Add({{"method", method}, {"code", absl::StatusCodeToString(code)}}).Increment();
}

}  // namespace kiln::coord
