// See Note [Remote profiling] in coordinator/src/profiles.h.
#include "remote_profile.h"

#include <absl/strings/numbers.h>
#include <absl/strings/str_cat.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <sstream>
#include <utility>

#include "kiln/error.h"
#include "kiln/profiler.h"
#include "kiln/proto/service.h"

namespace kiln::worker {
namespace {

constexpr size_t kClockSamples = 16;  // the latest beats the offset estimate picks from

struct Armed {
  proto::ProfileRequest request;
  std::unique_ptr<profiler::Profile> prof;  // null until the first step mark
  int64_t origin_unix_us = 0;
  int marks = 0;  // step marks since it started
};

std::mutex g_mu;
std::optional<Armed> g_armed;
int64_t g_last_id = 0;  // the latest request armed: repeats of it are ignored
std::vector<proto::RankProfile> g_done;
struct Sample {
  int64_t offset_us, rtt_us;
};
std::deque<Sample> g_clock;

int64_t skew_us() {
  static const int64_t skew = [] {
    int64_t v = 0;
    const char* s = std::getenv("KILN_WORKER_CLOCK_SKEW_US");
    return s && absl::SimpleAtoi(s, &v) ? v : int64_t{0};
  }();
  return skew;
}

// The answer to the armed request, with this worker's clock estimate; g_mu held.
proto::RankProfile answer_locked(const Armed& a) {
  proto::RankProfile p;
  p.set_session_id(a.request.session_id());
  p.set_profile_id(a.request.profile_id());
  p.set_origin_unix_us(a.origin_unix_us);
  auto best =
      std::min_element(g_clock.begin(), g_clock.end(),
                       [](const Sample& x, const Sample& y) { return x.rtt_us < y.rtt_us; });
  if (best != g_clock.end()) {
    p.set_clock_offset_us(best->offset_us);
    p.set_clock_rtt_us(best->rtt_us);
  }
  return p;
}

void finish_locked(proto::RankProfile p) {
  g_done.push_back(std::move(p));
  g_armed.reset();
}

}  // namespace

int64_t worker_unix_us() {
  return std::chrono::duration_cast<std::chrono::microseconds>(
             std::chrono::system_clock::now().time_since_epoch())
             .count() +
         skew_us();
}

void note_clock(int64_t sent, int64_t received, int64_t replied, int64_t got) {
  if (received == 0 || replied == 0) return;  // a coordinator that does not say
  std::lock_guard<std::mutex> lock(g_mu);
  g_clock.push_back({((received - sent) + (replied - got)) / 2,
                     std::max<int64_t>(0, (got - sent) - (replied - received))});
  if (g_clock.size() > kClockSamples) g_clock.pop_front();
}

void arm_profile(const proto::ProfileRequest& request) {
  std::lock_guard<std::mutex> lock(g_mu);
  if (request.profile_id() <= g_last_id || request.steps() < 1) return;
  g_last_id = request.profile_id();
  if (g_armed) {  // a newer request replaces one the coordinator gave up on
    g_armed->prof.reset();
    g_armed.reset();
  }
  g_armed.emplace().request = request;
}

void profile_step(const std::string& session_id, int64_t step) {
  std::lock_guard<std::mutex> lock(g_mu);
  if (!g_armed || g_armed->request.session_id() != session_id) return;
  Armed& a = *g_armed;
  try {
    if (!a.prof) {  // the window opens at this mark
      if (step < a.request.first_step()) return;
      profiler::ProfilerOptions o;
      o.record_shapes = true;
      o.with_flops = true;
      o.schedule = profiler::Schedule(/*wait=*/0, /*warmup=*/0, a.request.steps(), /*repeat=*/1);
      a.prof = std::make_unique<profiler::Profile>(std::move(o));
      a.origin_unix_us = worker_unix_us();  // the trace's time 0 is start()'s clock reading
      a.prof->start();
      return;
    }
    a.prof->step();
    if (++a.marks < a.request.steps()) return;
    a.prof->stop();
    std::ostringstream out;
    a.prof->trace().write_chrome_trace(out);
    proto::RankProfile p = answer_locked(a);
    std::string trace = std::move(out).str();
    if (trace.size() > proto::kMaxRankTraceBytes)
      p.set_error(absl::StrCat("its trace of ", trace.size(), " bytes exceeds the limit of ",
                               proto::kMaxRankTraceBytes, "; profile fewer steps"));
    else
      p.set_trace(std::move(trace));
    finish_locked(std::move(p));
  } catch (const Error& e) {  // another profiler runs in this process
    proto::RankProfile p = answer_locked(a);
    p.set_error(e.what());
    finish_locked(std::move(p));
  }
}

void end_profiles_except(const std::vector<std::string>& served) {
  std::lock_guard<std::mutex> lock(g_mu);
  if (!g_armed || !g_armed->prof) return;  // not started: the session may not have begun yet
  const std::string& sid = g_armed->request.session_id();
  if (std::find(served.begin(), served.end(), sid) != served.end()) return;
  proto::RankProfile p = answer_locked(*g_armed);
  p.set_error(absl::StrCat("its session ended after ", g_armed->marks, " of ",
                           g_armed->request.steps(), " profiled steps"));
  finish_locked(std::move(p));
}

std::vector<proto::RankProfile> take_profiles() {
  std::lock_guard<std::mutex> lock(g_mu);
  return std::exchange(g_done, {});
}

}  // namespace kiln::worker
