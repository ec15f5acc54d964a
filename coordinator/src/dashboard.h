// coordinator/src/dashboard.h: the coordinator's web dashboard (issue 24). A static page
// (coordinator/web, embedded into the binary at build time) and the read-only JSON API it polls,
// served by civetweb on --dashboard-listen: the caller's jobs, the workers, and for one job its
// loss curve, each rank's step times, its findings and the tail of its log. The API takes the
// same tenant tokens as the gRPC service (See Note [Dashboard auth] in dashboard.cpp).
//
//   auto d = kiln::coord::Dashboard::start(*core, auth, "127.0.0.1:0");
//   if (!d.ok()) return fail(d.status());
//   std::printf("dashboard on port %d\n", (*d)->port());
//   kiln::coord::HttpReply r = kiln::coord::dashboard_get(*core, auth, "/api/jobs", "", "", "");
#pragma once

#include <absl/status/statusor.h>

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>

#include "kiln/coord/coordinator.h"
#include "kiln/coord/service.h"

struct mg_context;
struct mg_connection;

namespace kiln::coord {

inline constexpr int64_t kMaxLogTail = 1000;  // the largest ?tail= of /api/jobs/ID/logs

struct HttpReply {
  int status = 200;
  std::string content_type;
  std::string body;
};

// Answers one GET of the dashboard without any server around it. `path` is URL-decoded,
// `query` is not; `authorization` and `host` are the request's headers ("" when absent).
//   /, /index.html, /dashboard.js, /dashboard.css   the page
//   /api/jobs                     {"jobs": [job...]} (the caller's)
//   /api/workers                  {"workers": [worker...]}
//   /api/jobs/ID                  job, with its findings and each rank's last step
//   /api/jobs/ID/steps?from=N&limit=M   {"steps": [step...]} by step, then rank
//   /api/jobs/ID/logs?tail=N      {"lines": [...]}, the last N (default 200, at most kMaxLogTail)
//   /api/jobs/ID/profiles/P       the job's merged profile P, a Chrome trace (Job.profiles; Note
//                                 [Remote profiling] in profiles.h)
// JSON objects name their fields as `kiln ... --json` does. Errors are {"error": "..."} with a
// 4xx status (5xx only for the coordinator's own failures).
HttpReply dashboard_get(Coordinator& core, const Auth& auth, std::string_view path,
                        std::string_view query, std::string_view authorization,
                        std::string_view host);

// One file of the page: its name ("index.html") and its bytes.
struct WebFile {
  std::string_view name, bytes;
};
// The files of coordinator/web, generated into the build by coordinator/web/embed.cmake.
std::span<const WebFile> web_files();

// dashboard_get served over HTTP (GET only) until destroyed.
class Dashboard {
 public:
  // UNAVAILABLE naming the address when it cannot listen there.
  static absl::StatusOr<std::unique_ptr<Dashboard>> start(Coordinator& core, Auth auth,
                                                          const std::string& listen);
  ~Dashboard();  // stops listening and waits for the requests in flight
  int port() const { return port_; }

 private:
  Dashboard(Coordinator& core, Auth auth) : core_(core), auth_(std::move(auth)) {}
  static int serve(mg_connection* conn, void* self);

  Coordinator& core_;
  Auth auth_;
  mg_context* ctx_ = nullptr;
  int port_ = 0;
};

}  // namespace kiln::coord
