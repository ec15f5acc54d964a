// See Note [Collective reports] and Note [Step telemetry] in reports.h.
#include "reports.h"

#include <deque>
#include <iterator>
#include <mutex>

#include "kiln/dist/process_group.h"
#include "remote_profile.h"

namespace kiln::worker {
namespace {

std::mutex g_mu;
std::string g_gang_session;  // "" outside a gang: no collective is recorded
std::deque<proto::CollectiveRecord> g_collectives;
std::deque<proto::StepRecord> g_steps;
std::deque<proto::BatchResult> g_batch_results;

template <typename T>
void push_bounded(std::deque<T>& q, T&& v) {
  q.push_back(std::move(v));
  if (q.size() > kMaxPendingReports) q.pop_front();
}

template <typename T>
std::vector<T> take(std::deque<T>& q) {
  std::lock_guard<std::mutex> lock(g_mu);
  std::vector<T> out(std::make_move_iterator(q.begin()), std::make_move_iterator(q.end()));
  q.clear();
  return out;
}

void on_collective(const dist::CollectiveEvent& e) {
  std::lock_guard<std::mutex> lock(g_mu);
  if (g_gang_session.empty()) return;
  proto::CollectiveRecord r;
  r.set_session_id(g_gang_session);
  r.set_group(std::string(e.group));
  for (int m : e.members) r.add_members(m);
  r.set_seq(e.seq);
  r.set_op(std::string(e.op));
  r.set_shape(std::string(e.shape));
  push_bounded(g_collectives, std::move(r));
}

}  // namespace

void report_collectives_of(const std::string& session_id) {
  std::lock_guard<std::mutex> lock(g_mu);
  g_gang_session = session_id;
  g_collectives.clear();
  dist::set_collective_observer(session_id.empty() ? nullptr : &on_collective);
}

std::vector<proto::CollectiveRecord> take_collectives() { return take(g_collectives); }

void report_step(proto::StepRecord record) {
  profile_step(record.session_id(),
               record.step());  // See Note [Remote profiling] in coordinator/src/profiles.h
  std::lock_guard<std::mutex> lock(g_mu);
  push_bounded(g_steps, std::move(record));
}

std::vector<proto::StepRecord> take_steps() { return take(g_steps); }

void report_batch_result(proto::BatchResult result) {
  std::lock_guard<std::mutex> lock(g_mu);
  push_bounded(g_batch_results, std::move(result));
}

std::vector<proto::BatchResult> take_batch_results() { return take(g_batch_results); }

}  // namespace kiln::worker
