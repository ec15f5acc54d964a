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
    // Each running job's ranks' latest step (See Note [Step telemetry] in worker/src/reports.h).
    prometheus::MetricFamily step{"kiln_job_step",
                                  "The latest step of each rank of a running job",
                                  prometheus::MetricType::Gauge,
                                  {}};
    prometheus::MetricFamily seconds{"kiln_job_step_seconds",
                                     "That step's time on that rank",
                                     prometheus::MetricType::Gauge,
                                     {}};
    prometheus::MetricFamily busy{"kiln_job_step_busy_seconds",
                                  "That step's time on that rank outside collective waits",
                                  prometheus::MetricType::Gauge,
                                  {}};
    prometheus::MetricFamily loss{
        "kiln_job_loss", "That rank's loss at that step", prometheus::MetricType::Gauge, {}};
    prometheus::MetricFamily tokens{"kiln_job_tokens_per_second",
                                    "Tokens per second of the whole gang at that step",
                                    prometheus::MetricType::Gauge,
                                    {}};
    for (const auto& [job, r] : core.running_steps()) {
      auto put = [&, job = job](prometheus::MetricFamily& f, double v) {
        prometheus::ClientMetric m;
        m.label = {{"job", job}, {"rank", std::to_string(r.rank())}};
        m.gauge.value = v;
        f.metric.push_back(m);
      };
      put(step, static_cast<double>(r.step()));
      put(seconds, r.seconds());
      put(busy, r.busy_seconds());
      if (r.has_loss()) put(loss, r.loss());
      if (r.tokens() > 0 && r.seconds() > 0) put(tokens, r.tokens() / r.seconds());
    }
    for (auto* f : {&step, &seconds, &busy, &loss, &tokens}) out.push_back(std::move(*f));
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
