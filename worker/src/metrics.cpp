#include "metrics.h"

#include <absl/strings/str_cat.h>
#include <prometheus/counter.h>
#include <prometheus/exposer.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>

#include "kiln/proto/service.h"

namespace kiln::worker {

Metrics::Metrics() : registry_(std::make_shared<prometheus::Registry>()) {
  instructions_ = &prometheus::BuildCounter()
                       .Name("kiln_worker_instructions_total")
                       .Help("Instructions executed (failed ones included)")
                       .Register(*registry_)
                       .Add({});
  memory_ = &prometheus::BuildGauge()
                 .Name("kiln_worker_memory_in_use_bytes")
                 .Help("Bytes of the distinct storages held by all sessions' value tables")
                 .Register(*registry_)
                 .Add({});
  // From a tiny step (1 ms) to a long one (about a minute).
  step_ = &prometheus::BuildHistogram()
               .Name("kiln_worker_step_seconds")
               .Help("Time between two Syncs of a session (one training step)")
               .Register(*registry_)
               .Add({}, prometheus::Histogram::BucketBoundaries{0.001, 0.0025, 0.005, 0.01, 0.025,
                                                                0.05, 0.1, 0.25, 0.5, 1, 2.5, 5,
                                                                10, 30, 60});
}

Metrics::~Metrics() = default;

absl::StatusOr<std::unique_ptr<Metrics>> Metrics::create(const std::string& listen,
                                                         const std::string& token) {
  std::unique_ptr<Metrics> m(new Metrics());
  if (listen.empty()) return m;
  if (auto st = proto::check_listen_address(listen, !token.empty()); !st.ok()) return st;
  try {
    m->exposer_ = std::make_unique<prometheus::Exposer>(listen, 1);
  } catch (const std::exception& e) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot serve metrics on '", listen, "': ", e.what()));
  }
  if (!token.empty())
    m->exposer_->RegisterAuth(
        [token](const std::string&, const std::string& password) { return password == token; },
        "kiln-worker");
  m->exposer_->RegisterCollectable(m->registry_);
  return m;
}

void Metrics::add_instructions(uint64_t n) { instructions_->Increment(static_cast<double>(n)); }
void Metrics::add_memory(int64_t delta) { memory_->Increment(static_cast<double>(delta)); }
void Metrics::observe_step(double seconds) { step_->Observe(seconds); }
int Metrics::port() const {
  if (!exposer_) return 0;
  auto ports = exposer_->GetListeningPorts();
  return ports.empty() ? 0 : ports[0];
}

}  // namespace kiln::worker
