// The dashboard's HTTP side (dashboard.h), and Coordinator::log_tail, which only it uses.
#include "dashboard.h"

#include <absl/strings/str_cat.h>
#include <civetweb.h>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cstdio>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <vector>

#include "kiln/proto/json.h"
#include "kiln/proto/service.h"
#include "state.h"

namespace kiln::coord {

// Note [Dashboard auth]: the page's files hold no data and are served to anyone; every /api/
// request is authenticated as a gRPC call from a client is (service.cpp): with auth on, an
// `Authorization: Bearer TOKEN` header with a tenant's token, else 401 (the worker token is no
// tenant and gets 401 too). The tenant then sees what it sees through gRPC: its own jobs only
// (another tenant's job is an unknown job, 404), and every worker, naming only its own sessions.
// The page reads the token from the URL's fragment (`#token=...`, which no browser sends to a
// server or in a Referer), keeps it in sessionStorage and drops the fragment from the address
// bar. With auth off the dashboard listens on loopback only and every caller sees everything,
// as over gRPC; there it also refuses a Host that is not loopback, so that a web site whose name
// an attacker re-points at 127.0.0.1 (DNS rebinding) cannot read it from a local browser. The API
// only reads, and a cross-site page can neither set the Authorization header without a CORS
// preflight (none is answered) nor read an answer. The page's Content-Security-Policy allows no
// inline script, and the page puts every string it shows (commands, log lines) in as text.

absl::StatusOr<std::vector<std::string>> Coordinator::log_tail(const std::string& job_id,
                                                               const std::string& tenant,
                                                               int64_t lines) {
  if (lines < 1 || lines > kMaxLogTail) {
    return absl::InvalidArgumentError(
        absl::StrCat("tail must be in [1, ", kMaxLogTail, "], got ", lines));
  }
  std::lock_guard lock(mu_);
  auto j = find_job_locked(job_id, tenant);
  if (!j.ok()) return j.status();
  const int64_t count = state_->log_count(job_id);
  return state_->logs(job_id, std::max<int64_t>(0, count - lines), lines);
}

namespace {

using nlohmann::json;

constexpr int64_t kDefaultLogTail = 200;
constexpr const char* kContentSecurityPolicy =
    "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; "
    "base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

using proto::to_json;  // the fields of `kiln ... --json`

HttpReply json_reply(int status, const json& body) {
  // Replace, not throw, on invalid UTF-8: a driver's log line may hold any bytes.
  return {status, "application/json", body.dump(-1, ' ', false, json::error_handler_t::replace)};
}

HttpReply error_reply(int status, std::string_view message) {
  return json_reply(status, {{"error", message}});
}

HttpReply status_reply(const absl::Status& st) {
  int code = 500;
  switch (st.code()) {
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kOutOfRange:
      code = 400;
      break;
    case absl::StatusCode::kUnauthenticated:
      code = 401;
      break;
    case absl::StatusCode::kPermissionDenied:
      code = 403;
      break;
    case absl::StatusCode::kNotFound:
      code = 404;
      break;
    case absl::StatusCode::kFailedPrecondition:
      code = 409;
      break;
    case absl::StatusCode::kUnavailable:
      code = 503;
      break;
    default:
      break;
  }
  return error_reply(code, std::string(st.message()));
}

std::vector<std::string_view> split(std::string_view s, char sep) {
  std::vector<std::string_view> out;
  size_t at = 0;
  for (size_t end; (end = s.find(sep, at)) != std::string_view::npos; at = end + 1)
    out.push_back(s.substr(at, end - at));
  out.push_back(s.substr(at));
  return out;
}

// The (undecoded) value of `name` in a query string ("from=3&tail=10").
std::optional<std::string_view> param(std::string_view query, std::string_view name) {
  for (std::string_view pair : split(query, '&')) {
    if (pair.starts_with(name) && pair.substr(name.size(), 1) == "=")
      return pair.substr(name.size() + 1);
  }
  return std::nullopt;
}

// The integer `name` of a query string, `fallback` when it is absent; INVALID_ARGUMENT naming it
// when it is not an integer in [lo, hi].
absl::StatusOr<int64_t> int_param(std::string_view query, std::string_view name, int64_t fallback,
                                  int64_t lo, int64_t hi) {
  const std::optional<std::string_view> text = param(query, name);
  if (!text) return fallback;
  int64_t v = 0;
  const char* end = text->data() + text->size();
  auto [ptr, ec] = std::from_chars(text->data(), end, v);
  if (text->empty() || ec != std::errc() || ptr != end || v < lo || v > hi) {
    const std::string range =
        hi == INT64_MAX ? absl::StrCat(">= ", lo) : absl::StrCat("in [", lo, ", ", hi, "]");
    return absl::InvalidArgumentError(absl::StrCat(std::string(name), " must be an integer ", range,
                                                   ", got '", std::string(text->substr(0, 32)),
                                                   "'"));
  }
  return v;
}

// See Note [Dashboard auth].
absl::StatusOr<Caller> authenticate(const Auth& auth, std::string_view authorization) {
  if (!auth.enabled()) return Caller{};
  constexpr std::string_view kBearer = "Bearer ";
  if (authorization.substr(0, kBearer.size()) != kBearer) {
    return absl::UnauthenticatedError(
        "the dashboard needs an 'Authorization: Bearer TOKEN' header");
  }
  const std::string_view token = authorization.substr(kBearer.size());
  for (const auto& [t, tenant] : auth.tenant_of_token) {
    if (proto::secrets_equal(token, t)) return Caller{Caller::Kind::kTenant, tenant};
  }
  return absl::UnauthenticatedError("invalid token: the dashboard takes a tenant's token");
}

// See Note [Dashboard auth]: "127.0.0.1", "localhost" or "[::1]", with or without a port.
bool loopback_host(std::string_view host) {
  std::string_view name = host;
  if (host.substr(0, 1) == "[") {
    name = host.substr(0, host.find(']') + 1);
  } else if (size_t colon = host.find(':'); colon != std::string_view::npos) {
    name = host.substr(0, colon);
  }
  std::string lower(name);
  for (char& c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return lower == "127.0.0.1" || lower == "localhost" || lower == "[::1]";
}

HttpReply api(Coordinator& core, const Caller& caller, std::string_view path,
              std::string_view query) {
  const std::string tenant = caller.kind == Caller::Kind::kTenant ? caller.tenant : "";
  const std::vector<std::string_view> parts = split(path, '/');
  if (parts.size() == 1 && parts[0] == "workers") {
    const proto::ListWorkersReply reply = core.list_workers(caller);
    json workers = json::array();
    for (const proto::WorkerInfo& w : reply.workers()) workers.push_back(to_json(w));
    return json_reply(200, {{"workers", workers}});
  }
  if (parts.empty() || parts[0] != "jobs" || parts.size() > 4) {
    return error_reply(404, "no such endpoint: /api/" + std::string(path));
  }
  if (parts.size() == 1) {
    proto::ListJobsRequest req;
    req.set_state(std::string(param(query, "state").value_or("")));
    auto reply = core.list_jobs(req, tenant);
    if (!reply.ok()) return status_reply(reply.status());
    json jobs = json::array();
    for (const proto::Job& j : reply->jobs()) jobs.push_back(to_json(j));
    return json_reply(200, {{"jobs", jobs}});
  }
  const std::string id(parts[1]);
  if (parts.size() == 2) {
    proto::GetJobRequest req;
    req.set_job_id(id);
    auto job = core.get_job(req, tenant);
    return job.ok() ? json_reply(200, to_json(*job)) : status_reply(job.status());
  }
  if (parts.size() == 3 && parts[2] == "steps") {
    auto from = int_param(query, "from", 0, 0, INT64_MAX);
    if (!from.ok()) return status_reply(from.status());
    auto limit = int_param(query, "limit", 10000, 1, kMaxJobStepsReply);
    if (!limit.ok()) return status_reply(limit.status());
    proto::JobStepsRequest req;
    req.set_job_id(id);
    req.set_from_step(*from);
    req.set_limit(static_cast<int32_t>(*limit));
    auto reply = core.job_steps(req, tenant);
    if (!reply.ok()) return status_reply(reply.status());
    json steps = json::array();
    for (const proto::StepRecord& r : reply->steps()) steps.push_back(to_json(r));
    return json_reply(200, {{"steps", steps}});
  }
  if (parts.size() == 3 && parts[2] == "logs") {
    auto tail = int_param(query, "tail", kDefaultLogTail, 1, kMaxLogTail);
    if (!tail.ok()) return status_reply(tail.status());
    auto lines = core.log_tail(id, tenant, *tail);
    return lines.ok() ? json_reply(200, {{"lines", *lines}}) : status_reply(lines.status());
  }
  if (parts[2] == "profiles" && parts.size() == 4) {  // See Note [Remote profiling]
    int64_t pid = 0;
    const std::string_view text = parts[3];
    auto [ptr, ec] = std::from_chars(text.data(), text.data() + text.size(), pid);
    if (text.empty() || ec != std::errc() || ptr != text.data() + text.size())
      return error_reply(404, "no such profile: " + std::string(text.substr(0, 32)));
    auto trace = core.read_profile(id, tenant, pid);
    if (!trace.ok()) return status_reply(trace.status());
    return {200, "application/json", std::move(*trace)};
  }
  return error_reply(404, "no such endpoint: /api/" + std::string(path));
}

std::string_view content_type(std::string_view name) {
  if (name.ends_with(".html")) return "text/html; charset=utf-8";
  if (name.ends_with(".js")) return "text/javascript; charset=utf-8";
  if (name.ends_with(".css")) return "text/css; charset=utf-8";
  return "application/octet-stream";
}

void send(mg_connection* conn, const HttpReply& r) {
  const char* reason = mg_get_response_code_text(conn, r.status);
  std::string head = absl::StrCat(
      "HTTP/1.1 ", r.status, " ", reason ? reason : "", "\r\nContent-Type: ", r.content_type,
      "\r\nContent-Length: ", r.body.size(), "\r\nCache-Control: no-store\r\n",
      "Content-Security-Policy: ", kContentSecurityPolicy,
      "\r\nX-Content-Type-Options: nosniff\r\nReferrer-Policy: no-referrer\r\n");
  if (r.status == 401) head += "WWW-Authenticate: Bearer realm=\"kiln\"\r\n";
  if (r.status == 405) head += "Allow: GET\r\n";
  head += "Connection: close\r\n\r\n";
  mg_write(conn, head.data(), head.size());
  mg_write(conn, r.body.data(), r.body.size());
}

// civetweb takes "127.0.0.1:N" and "[::1]:N", not host names.
std::string civet_address(const std::string& listen) {
  constexpr std::string_view kLocalhost = "localhost:";
  if (listen.starts_with(kLocalhost)) return "127.0.0.1:" + listen.substr(kLocalhost.size());
  return listen;
}

}  // namespace

HttpReply dashboard_get(Coordinator& core, const Auth& auth, std::string_view path,
                        std::string_view query, std::string_view authorization,
                        std::string_view host) {
  try {
    if (!auth.enabled() && !host.empty() && !loopback_host(host)) {
      return error_reply(403, "without tokens the dashboard answers loopback names only");
    }
    constexpr std::string_view kApi = "/api/";
    if (path.starts_with(kApi)) {
      absl::StatusOr<Caller> caller = authenticate(auth, authorization);
      if (!caller.ok()) return status_reply(caller.status());
      return api(core, *caller, path.substr(kApi.size()), query);
    }
    const std::string_view name = path == "/" ? "index.html" : path.substr(1);
    for (const WebFile& f : web_files()) {
      if (f.name == name) return {200, std::string(content_type(name)), std::string(f.bytes)};
    }
    return error_reply(404, "not found: " + std::string(path));
  } catch (const std::exception& e) {  // a broken state file: DESIGN.md "Errors"
    return error_reply(500, absl::StrCat("coordinator: ", e.what()));
  }
}

absl::StatusOr<std::unique_ptr<Dashboard>> Dashboard::start(Coordinator& core, Auth auth,
                                                            const std::string& listen) {
  std::unique_ptr<Dashboard> d(new Dashboard(core, std::move(auth)));
  const std::string ports = civet_address(listen);
  const char* options[] = {"listening_ports",    ports.c_str(), "num_threads", "8",
                           "request_timeout_ms", "10000",       nullptr};
  mg_callbacks callbacks{};
  callbacks.log_message = [](const mg_connection*, const char* message) {
    std::fprintf(stderr, "kiln-coordinator: dashboard: %s\n", message);
    return 1;
  };
  unsigned code = 0;
  char text[256] = "";
  mg_error_data error{&code, text, sizeof text};
  mg_init_data init{&callbacks, nullptr, options};
  d->ctx_ = mg_start2(&init, &error);
  if (!d->ctx_) {
    return absl::UnavailableError(
        absl::StrCat("cannot serve the dashboard on ", listen, ": ", text));
  }
  mg_set_request_handler(d->ctx_, "/", &Dashboard::serve, d.get());
  mg_server_port port{};
  if (mg_get_server_ports(d->ctx_, 1, &port) < 1) {
    return absl::UnavailableError(absl::StrCat("the dashboard has no port on ", listen));
  }
  d->port_ = port.port;
  return d;
}

Dashboard::~Dashboard() {
  if (ctx_) mg_stop(ctx_);
}

int Dashboard::serve(mg_connection* conn, void* self) {
  const Dashboard& d = *static_cast<const Dashboard*>(self);
  const mg_request_info* req = mg_get_request_info(conn);
  auto header = [&](const char* name) {
    const char* v = mg_get_header(conn, name);
    return std::string_view(v ? v : "");
  };
  HttpReply r = std::string_view(req->request_method) == "GET"
                    ? dashboard_get(d.core_, d.auth_, req->local_uri ? req->local_uri : "",
                                    req->query_string ? req->query_string : "",
                                    header("Authorization"), header("Host"))
                    : error_reply(405, "the dashboard answers GET only");
  send(conn, r);
  return r.status;
}

}  // namespace kiln::coord
