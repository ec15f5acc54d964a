// The coordinator subcommands other than submit (submit.cpp): workers, jobs, status, cancel,
// logs; and what they share: flags, the channel, deadlines, tables, JSON and colour.
#include "jobs.h"

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "kiln/proto/json.h"
#include "kiln/proto/service.h"
#include "run.h"

namespace kiln::client {

namespace {

constexpr auto kDeadline = std::chrono::seconds(10);

constexpr const char* kJobsHelp =
    R"(usage: kiln <workers|jobs|submit|status|cancel|logs|steps|profile> [options]

  kiln workers                          the registered workers
  kiln jobs [--state S]                 jobs (queued, running, preempted, restarting, succeeded,
                                        failed, cancelled)
  kiln submit --workers N [--mesh dp=2,tp=2] [--priority P] -- COMMAND...
                                        queue a job; once its gang is free run COMMAND here as
                                        the driver and exit with its status
      [--max-restarts R]                  run COMMAND again (up to R times) when it fails or a
                                          worker dies; it resumes from its checkpoint
      [--checkpoint-dir D --checkpoint-every K]
                                          given to COMMAND as KILN_CHECKPOINT_DIR, _EVERY
      [--min-workers M --max-workers N]   a restart may run on as few as M workers; it grows
                                          back when workers are free again
  kiln submit --batch SPEC [--workers N] [--detach] [--max-restarts R --checkpoint-dir D ...]
                                        queue a batch job (kiln.batch.save_job): its workers run
                                        it with no client; follow its log until it ends (takes
                                        --min-workers too: fewer workers, a smaller batch)
  kiln status JOB                       one job
  kiln cancel JOB                       cancel a queued or running job
  kiln logs JOB [-f]                    the driver's output (-f: follow until the job ends)
  kiln steps JOB [--from N]             its steps per rank: loss, step time, busy time, tokens/s
  kiln profile JOB --steps N [-o FILE] [--timeout S]
                                        profile its next N steps on every rank; write the merged
                                        Chrome trace to FILE (default JOB-profile.json)

options for all:
  --coordinator HOST:PORT   the coordinator (default: $KILN_COORDINATOR)
  --token T                 bearer token (default: $KILN_TOKEN)
  --tls-ca FILE             talk TLS, trusting this CA certificate (default: $KILN_TLS_CA)
  --json                    machine-readable output (one JSON object per line)
)";

bool colour_on() {
  const char* no = std::getenv("NO_COLOR");
  return isatty(STDOUT_FILENO) && !(no && *no);
}

std::string paint(const std::string& state, const std::string& text) {
  if (!colour_on()) return text;
  const char* code = state == "succeeded" ? "32"
                     : state == "failed"  ? "31"
                     : state == "running" ? "36"
                     : state == "queued"  ? "33"
                     : state == "idle"    ? "32"
                     : state == "busy"    ? "36"
                     : state == "dead"    ? "31"
                                          : "90";
  return std::string("\033[") + code + "m" + text + "\033[0m";
}

std::string env_or(const char* name, const std::string& fallback) {
  const char* v = std::getenv(name);
  return v && *v ? v : fallback;
}

std::string time_string(int64_t unix_ms) {
  if (unix_ms == 0) return "-";
  std::time_t t = unix_ms / 1000;
  std::tm tm{};
  localtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%d %H:%M:%S", &tm);
  return buf;
}

std::string join(const auto& words, const std::string& sep) {
  std::string out;
  for (const auto& w : words) out += (out.empty() ? "" : sep) + std::string(w);
  return out;
}

// "step 12: loss 2.31, 0.520 s (busy 0.500 s), 12345 tokens/s" (See Note [Step telemetry] in
// worker/src/reports.h).
std::string step_line(const proto::StepRecord& r) {
  std::string out = "step " + std::to_string(r.step()) + ":";
  char buf[96];
  if (r.has_loss()) {
    std::snprintf(buf, sizeof buf, " loss %.4g,", r.loss());
    out += buf;
  }
  std::snprintf(buf, sizeof buf, " %.3f s (busy %.3f s)", r.seconds(), r.busy_seconds());
  out += buf;
  if (r.tokens() > 0 && r.seconds() > 0) {
    std::snprintf(buf, sizeof buf, ", %.0f tokens/s", r.tokens() / r.seconds());
    out += buf;
  }
  return out;
}

using proto::to_json;  // kiln/proto/json.h

// Prints rows as left-aligned columns; `state_col` (if >= 0) is coloured by its own value.
void print_table(const std::vector<std::vector<std::string>>& rows, int state_col) {
  std::vector<size_t> width;
  for (const auto& r : rows) {
    width.resize(std::max(width.size(), r.size()));
    for (size_t i = 0; i < r.size(); ++i) width[i] = std::max(width[i], r[i].size());
  }
  for (size_t n = 0; n < rows.size(); ++n) {
    std::string line;
    for (size_t i = 0; i < rows[n].size(); ++i) {
      std::string cell = rows[n][i];
      const bool last = i + 1 == rows[n].size();
      std::string pad = last ? "" : std::string(width[i] - cell.size() + 2, ' ');
      line += (n > 0 && static_cast<int>(i) == state_col ? paint(cell, cell) : cell) + pad;
    }
    std::printf("%s\n", line.c_str());
  }
}

int usage(const std::string& msg) {
  std::fprintf(stderr, "kiln: %s (see kiln jobs --help)\n", msg.c_str());
  return kExitUsage;
}

int workers_main(const CoordClient& c) {
  grpc::ClientContext ctx;
  c.prepare(ctx);
  proto::ListWorkersReply reply;
  if (auto st = c.stub->ListWorkers(&ctx, {}, &reply); !st.ok()) return report_rpc_error(c, st);
  if (c.json) {
    for (const auto& w : reply.workers()) std::printf("%s\n", to_json(w).dump().c_str());
    return 0;
  }
  std::vector<std::vector<std::string>> rows = {
      {"WORKER", "ADDRESS", "DEVICE", "STATE", "SESSION", "LAST HEARTBEAT"}};
  for (const auto& w : reply.workers()) {
    rows.push_back({w.worker_id(), w.address(), w.device(), w.state(),
                    w.session_id().empty() ? "-" : w.session_id(),
                    time_string(w.last_heartbeat_unix_ms())});
  }
  print_table(rows, 3);
  return 0;
}

int jobs_main(const CoordClient& c, const std::vector<std::string>& args) {
  proto::ListJobsRequest req;
  for (size_t i = 0; i < args.size(); ++i) {
    if (args[i] == "--state" && i + 1 < args.size()) {
      req.set_state(args[++i]);
    } else {
      return usage("unexpected argument '" + args[i] + "' for kiln jobs");
    }
  }
  grpc::ClientContext ctx;
  c.prepare(ctx);
  proto::ListJobsReply reply;
  if (auto st = c.stub->ListJobs(&ctx, req, &reply); !st.ok()) return report_rpc_error(c, st);
  if (c.json) {
    for (const auto& j : reply.jobs()) std::printf("%s\n", to_json(j).dump().c_str());
    return 0;
  }
  std::vector<std::vector<std::string>> rows = {
      {"JOB", "STATE", "PRIORITY", "WORKERS", "TENANT", "SUBMITTED", "COMMAND"}};
  for (const auto& j : reply.jobs()) {
    rows.push_back({j.job_id(), j.state(), std::to_string(j.priority()),
                    std::to_string(j.workers()), j.tenant().empty() ? "-" : j.tenant(),
                    time_string(j.submitted_unix_ms()), join(j.command(), " ")});
  }
  print_table(rows, 1);
  return 0;
}

// "dp=2 x tp=2", or "-" (See Note [Placement] in coordinator/src/jobs.cpp).
std::string mesh_text(const proto::Job& j) {
  std::string out;
  for (const auto& d : j.mesh())
    out += (out.empty() ? "" : " x ") + d.name() + "=" + std::to_string(d.size());
  return out.empty() ? "-" : out;
}

void print_job(const CoordClient& c, const proto::Job& j) {
  if (c.json) {
    std::printf("%s\n", to_json(j).dump().c_str());
    return;
  }
  std::vector<std::vector<std::string>> rows = {
      {"job:", j.job_id()},
      {"state:", paint(j.state(), j.state())},
      {"workers:", std::to_string(j.workers())},
      {"mesh:", mesh_text(j)},
      {"priority:", std::to_string(j.priority())},
      {"command:", join(j.command(), " ")},
      {"tenant:", j.tenant().empty() ? "-" : j.tenant()},
      {"session:", j.session_id().empty() ? "-" : j.session_id()},
      {"gang:", j.worker_addresses().empty() ? "-" : join(j.worker_addresses(), ",")},
      {"submitted:", time_string(j.submitted_unix_ms())},
      {"started:", time_string(j.started_unix_ms())},
      {"finished:", time_string(j.finished_unix_ms())}};
  if (j.state() == "succeeded" || j.state() == "failed") {
    rows.push_back({"exit code:", std::to_string(j.exit_code())});
  }
  if (!j.message().empty()) rows.push_back({"message:", j.message()});
  if (j.max_restarts() > 0) {  // See Note [Restarts] in coordinator/src/jobs.cpp
    rows.push_back({"restarts:", std::to_string(j.restarts()) + " of " +
                                     std::to_string(j.max_restarts()) + " (workers " +
                                     std::to_string(j.min_workers()) + ".." +
                                     std::to_string(j.max_workers()) + ")"});
    if (!j.checkpoint_dir().empty())
      rows.push_back({"checkpoint:", j.checkpoint_dir() + ", every " +
                                         std::to_string(j.checkpoint_every()) + " steps"});
  }
  for (const proto::StepRecord& r : j.last_steps())
    rows.push_back({"rank " + std::to_string(r.rank()) + ":", step_line(r)});
  // See Note [Desync detection] and Note [Stragglers] (coordinator/src).
  for (const proto::Finding& f : j.findings())
    rows.push_back({f.kind() + ":", time_string(f.unix_ms()) + "  " + f.text()});
  // See Note [Remote profiling] (coordinator/src/profiles.h): the merged traces it keeps.
  for (const proto::ProfileInfo& p : j.profiles()) {
    std::string line = time_string(p.unix_ms()) + "  " + std::to_string(p.steps()) + " steps, " +
                       std::to_string(p.ranks_size()) + " ranks, " + std::to_string(p.bytes()) +
                       " bytes: /api/jobs/" + j.job_id() + "/profiles/" +
                       std::to_string(p.profile_id());
    if (p.missing_size() > 0) line += " (missing: " + join(p.missing(), "; ") + ")";
    rows.push_back({"profile:", line});
  }
  for (const auto& r : rows) std::printf("%-11s%s\n", r[0].c_str(), r[1].c_str());
}

int status_main(const CoordClient& c, const std::vector<std::string>& args, bool cancel) {
  const char* name = cancel ? "cancel" : "status";
  if (args.size() != 1) return usage(std::string("kiln ") + name + " takes one JOB id");
  grpc::ClientContext ctx;
  c.prepare(ctx);
  proto::Job job;
  grpc::Status st;
  if (cancel) {
    proto::CancelJobRequest req;
    req.set_job_id(args[0]);
    st = c.stub->CancelJob(&ctx, req, &job);
  } else {
    proto::GetJobRequest req;
    req.set_job_id(args[0]);
    st = c.stub->GetJob(&ctx, req, &job);
  }
  if (!st.ok()) return report_rpc_error(c, st);
  print_job(c, job);
  return 0;
}

int steps_main(const CoordClient& c, const std::vector<std::string>& args) {
  proto::JobStepsRequest req;
  for (size_t i = 0; i < args.size(); ++i) {
    if (args[i] == "--from" && i + 1 < args.size()) {
      try {
        req.set_from_step(std::stoll(args[++i]));
      } catch (const std::exception&) {
        return usage("--from takes a step number, got '" + args[i] + "'");
      }
    } else if (req.job_id().empty() && !args[i].empty() && args[i][0] != '-') {
      req.set_job_id(args[i]);
    } else {
      return usage("unexpected argument '" + args[i] + "' for kiln steps");
    }
  }
  if (req.job_id().empty()) return usage("kiln steps takes a JOB id");
  grpc::ClientContext ctx;
  c.prepare(ctx);
  proto::JobStepsReply reply;
  if (auto st = c.stub->JobSteps(&ctx, req, &reply); !st.ok()) return report_rpc_error(c, st);
  if (c.json) {
    for (const auto& r : reply.steps()) std::printf("%s\n", to_json(r).dump().c_str());
    return 0;
  }
  for (const auto& r : reply.steps()) std::printf("rank %d %s\n", r.rank(), step_line(r).c_str());
  return 0;
}

int logs_main(const CoordClient& c, const std::vector<std::string>& args) {
  proto::WatchJobRequest req;
  for (const auto& a : args) {
    if (a == "-f" || a == "--follow") {
      req.set_follow(true);
    } else if (req.job_id().empty() && !a.empty() && a[0] != '-') {
      req.set_job_id(a);
    } else {
      return usage("unexpected argument '" + a + "' for kiln logs");
    }
  }
  if (req.job_id().empty()) return usage("kiln logs takes a JOB id");
  grpc::ClientContext ctx;
  c.prepare(ctx, req.follow());
  auto reader = c.stub->WatchJob(&ctx, req);
  for (proto::JobEvent e; reader->Read(&e);) {
    if (c.json) {
      nlohmann::json out = e.has_job() ? nlohmann::json{{"job", to_json(e.job())}}
                                       : nlohmann::json{{"log", e.log_line()}};
      std::printf("%s\n", out.dump().c_str());
    } else if (!e.has_job()) {
      std::printf("%s\n", e.log_line().c_str());
    }
    std::fflush(stdout);
  }
  if (auto st = reader->Finish(); !st.ok()) return report_rpc_error(c, st);
  return 0;
}

std::shared_ptr<grpc::ChannelCredentials> credentials(const std::string& ca_file) {
  if (ca_file.empty()) return grpc::InsecureChannelCredentials();
  std::ifstream in(ca_file);
  std::stringstream pem;
  pem << in.rdbuf();
  grpc::SslCredentialsOptions ssl;
  ssl.pem_root_certs = pem.str();
  return grpc::SslCredentials(ssl);
}

}  // namespace

void CoordClient::prepare(grpc::ClientContext& ctx, bool follow) const {
  kiln::proto::add_token(ctx, token);
  if (!follow) ctx.set_deadline(std::chrono::system_clock::now() + kDeadline);
}

int report_rpc_error(const CoordClient& c, const grpc::Status& st) {
  const absl::Status s = kiln::proto::from_grpc(st);
  if (s.code() == absl::StatusCode::kUnavailable ||
      s.code() == absl::StatusCode::kDeadlineExceeded) {
    std::fprintf(stderr, "kiln: coordinator %s: %s: %s\n", c.address.c_str(),
                 absl::StatusCodeToString(s.code()).c_str(), std::string(s.message()).c_str());
  } else {
    std::fprintf(stderr, "kiln: %s: %s\n", absl::StatusCodeToString(s.code()).c_str(),
                 std::string(s.message()).c_str());
  }
  return 1;
}

bool is_job_command(const std::string& name) {
  for (const char* n :
       {"workers", "jobs", "submit", "status", "cancel", "logs", "steps", "profile"}) {
    if (name == n) return true;
  }
  return false;
}

int run_job_command(const std::string& name, const std::vector<std::string>& all) {
  CoordClient c;
  c.address = env_or("KILN_COORDINATOR", "");
  c.token = env_or("KILN_TOKEN", "");
  std::string ca = env_or("KILN_TLS_CA", "");
  std::vector<std::string> rest;
  for (size_t i = 0; i < all.size(); ++i) {
    const std::string& a = all[i];
    if (a == "--") {  // submit's COMMAND: passed on untouched
      rest.insert(rest.end(), all.begin() + i, all.end());
      break;
    }
    if (a == "-h" || a == "--help") {
      std::fputs(kJobsHelp, stdout);
      return 0;
    }
    if (a == "--json") {
      c.json = true;
    } else if ((a == "--coordinator" || a == "--token" || a == "--tls-ca") && i + 1 < all.size()) {
      (a == "--coordinator" ? c.address : a == "--token" ? c.token : ca) = all[++i];
    } else {
      rest.push_back(a);
    }
  }
  if (c.address.empty()) {
    return usage("no coordinator: pass --coordinator HOST:PORT or set KILN_COORDINATOR");
  }
  grpc::ChannelArguments ch;
  ch.SetMaxReceiveMessageSize(kiln::proto::kMaxMessageBytes);
  // A restarted coordinator is found again within 2 s (gRPC's default backoff grows to 120 s),
  // well inside its --driver-grace-s for `kiln submit` (Note [Driver re-attach]).
  ch.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 500);
  ch.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 2000);
  c.stub = proto::Coordinator::NewStub(grpc::CreateCustomChannel(c.address, credentials(ca), ch));
  if (name == "workers")
    return rest.empty() ? workers_main(c) : usage("kiln workers takes no arguments");
  if (name == "jobs") return jobs_main(c, rest);
  if (name == "status") return status_main(c, rest, false);
  if (name == "cancel") return status_main(c, rest, true);
  if (name == "logs") return logs_main(c, rest);
  if (name == "steps") return steps_main(c, rest);
  if (name == "profile") return profile_main(c, rest);
  return submit_main(c, rest);
}

}  // namespace kiln::client
