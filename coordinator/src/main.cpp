// kiln-coordinator: the control-plane daemon (DESIGN.md "Jobs"). See kHelp.
#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>
#include <prometheus/exposer.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "dashboard.h"
#include "kiln/coord/coordinator.h"
#include "kiln/coord/metrics.h"
#include "kiln/coord/service.h"
#include "kiln/proto/service.h"

namespace {

constexpr const char* kHelp = R"(usage: kiln-coordinator [options]

The Kiln coordinator: worker registry, gang sessions, the job queue (state in SQLite).

options:
  --listen ADDR         gRPC address (default 127.0.0.1:7070; 127.0.0.1:0 picks a free port)
  --port-file F         write the bound port to F (atomically) once listening
  --state PATH          SQLite state file (default ./kiln-coordinator.db)
  --tokens FILE         client tokens, one 'TENANT TOKEN' per line
  --worker-token T      the token workers present (or KILN_WORKER_TOKEN)
  --tls-cert F --tls-key F   serve TLS with this certificate chain and key (PEM)
  --heartbeat-ms N      the interval workers beat at (default 1000)
  --dead-after N        missed beats before a worker is dead (default 3)
  --session-idle-s N    close an interactive session whose workers report no client stream
                        for N seconds (default 30): its client died or never came
  --session-retention-s N   forget an ended session N seconds after it ended (default 3600)
  --worker-retention-s N    forget a dead worker N seconds after it died (default 3600)
  --driver-grace-s N    fail a running job whose driver (kiln submit) has had no report stream
                        for N seconds (default 30); a driver re-attaches within it
  --hang-after-s N      a running job that marks steps (log_step) and has marked none for N
                        seconds, or for 10x its usual step time if longer, is hung: every
                        worker is asked what it is doing (default 60)
  --preempt-grace-s N   a preempted job's driver has N seconds to checkpoint and exit
                        (default 30); then its workers are taken anyway
  --grow-after-s N      an elastic job (--min-workers) that a restart left below its size grows
                        back once enough workers have been idle for N seconds (default 30)
  --quota TENANT=N      tenant TENANT may hold at most N workers at once, in sessions and
                        running jobs together (repeatable); its jobs beyond wait in the queue
  --metrics-listen ADDR serve Prometheus /metrics there
  --dashboard-listen ADDR   serve the web dashboard there (open http://ADDR/#token=TOKEN);
                        plain HTTP, so beyond loopback only with tokens (TLS alone is not enough)
  --dashboard-port-file F   write the dashboard's bound port to F once listening
Without a token or TLS every listener must be on loopback.
)";

constexpr int kExitUsage = 2;

struct Flags {
  std::string listen = "127.0.0.1:7070", port_file, state = "kiln-coordinator.db";
  std::string tokens, worker_token, tls_cert, tls_key, metrics_listen, dashboard_listen,
      dashboard_port_file;
  int heartbeat_ms = 1000, dead_after = 3, session_idle_s = 30, session_retention_s = 3600,
      worker_retention_s = 3600, driver_grace_s = 30, hang_after_s = 60, preempt_grace_s = 30,
      grow_after_s = 30;
  std::map<std::string, int> quotas;
};

int usage_error(const std::string& msg) {
  std::fprintf(stderr, "kiln-coordinator: %s (see --help)\n", msg.c_str());
  return kExitUsage;
}

// Returns the exit status to use when parsing ends the program.
std::optional<int> parse(int argc, char** argv, Flags& f) {
  if (const char* t = std::getenv("KILN_WORKER_TOKEN")) f.worker_token = t;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "-h" || a == "--help") {
      std::fputs(kHelp, stdout);
      return 0;
    }
    if (i + 1 >= argc) return usage_error("unknown flag or missing value: " + a);
    const std::string v = argv[++i];
    auto int_flag = [&](const std::string& name) -> int* {
      const std::pair<const char*, int*> flags[] = {
          {"--heartbeat-ms", &f.heartbeat_ms},
          {"--dead-after", &f.dead_after},
          {"--session-idle-s", &f.session_idle_s},
          {"--driver-grace-s", &f.driver_grace_s},
          {"--session-retention-s", &f.session_retention_s},
          {"--worker-retention-s", &f.worker_retention_s},
          {"--hang-after-s", &f.hang_after_s},
          {"--preempt-grace-s", &f.preempt_grace_s},
          {"--grow-after-s", &f.grow_after_s}};
      for (const auto& [flag, value] : flags)
        if (name == flag) return value;
      return nullptr;
    };
    auto to_int = [&](int& out) -> bool {
      try {
        size_t used = 0;
        out = std::stoi(v, &used);
        return used == v.size() && out > 0;
      } catch (const std::exception&) {
        return false;
      }
    };
    if (a == "--listen")
      f.listen = v;
    else if (a == "--port-file")
      f.port_file = v;
    else if (a == "--state")
      f.state = v;
    else if (a == "--tokens")
      f.tokens = v;
    else if (a == "--worker-token")
      f.worker_token = v;
    else if (a == "--tls-cert")
      f.tls_cert = v;
    else if (a == "--tls-key")
      f.tls_key = v;
    else if (a == "--metrics-listen")
      f.metrics_listen = v;
    else if (a == "--quota") {
      const size_t eq = v.find('=');
      int n = 0;
      try {
        size_t used = 0;
        n = eq == std::string::npos ? 0 : std::stoi(v.substr(eq + 1), &used);
        if (eq != std::string::npos && used != v.size() - eq - 1) n = 0;
      } catch (const std::exception&) {
        n = 0;
      }
      if (eq == std::string::npos || eq == 0 || n < 1)
        return usage_error("--quota takes TENANT=N with N >= 1, got '" + v + "'");
      f.quotas[v.substr(0, eq)] = n;
    } else if (a == "--dashboard-listen")
      f.dashboard_listen = v;
    else if (a == "--dashboard-port-file")
      f.dashboard_port_file = v;
    else if (int* n = int_flag(a)) {
      if (!to_int(*n)) return usage_error(a + " needs a positive integer");
    } else {
      return usage_error("unknown flag " + a);
    }
  }
  if (f.tls_cert.empty() != f.tls_key.empty()) {
    return usage_error("--tls-cert and --tls-key go together");
  }
  return std::nullopt;
}

std::optional<std::string> slurp(const std::string& path) {
  std::ifstream in(path);
  if (!in) return std::nullopt;
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

bool write_atomically(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp);
    if (!(out << text)) return false;
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  return !ec;
}

int fail(const absl::Status& st) {
  std::fprintf(stderr, "kiln-coordinator: %s\n", std::string(st.message()).c_str());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  Flags f;
  if (auto exit = parse(argc, argv, f)) return *exit;

  kiln::coord::Auth auth;
  if (!f.tokens.empty()) {
    auto loaded = kiln::coord::load_tokens(f.tokens);
    if (!loaded.ok()) return fail(loaded.status());
    auth = *loaded;
  }
  auth.worker_token = f.worker_token;
  if (auto st = kiln::coord::check_auth(auth); !st.ok()) return fail(st);
  const bool tls = !f.tls_cert.empty();
  const bool secured = auth.enabled() || tls;
  for (const auto& addr : {f.listen, f.metrics_listen}) {
    if (addr.empty()) continue;
    if (auto st = kiln::proto::check_listen_address(addr, secured); !st.ok()) return fail(st);
  }
  // The dashboard has no TLS of its own, and without a token it has no auth: TLS alone does not
  // take it beyond loopback (See Note [Dashboard auth] in dashboard.cpp).
  if (!f.dashboard_listen.empty()) {
    auto st = kiln::proto::check_listen_address(f.dashboard_listen, auth.enabled());
    if (!st.ok()) return fail(st);
  }
  std::shared_ptr<grpc::ServerCredentials> creds = grpc::InsecureServerCredentials();
  if (tls) {
    auto cert = slurp(f.tls_cert), key = slurp(f.tls_key);
    if (!cert || !key) return fail(absl::InvalidArgumentError("cannot read --tls-cert/--tls-key"));
    grpc::SslServerCredentialsOptions ssl;
    ssl.pem_key_cert_pairs.push_back({*key, *cert});
    creds = grpc::SslServerCredentials(ssl);
  }

  // SIGTERM and SIGINT are taken by sigwait below, in the main thread only: block them before
  // any thread starts so that every thread inherits the mask.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGTERM);
  sigaddset(&stop_signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);

  auto core = kiln::coord::Coordinator::open(
      {.state_path = f.state,
       .heartbeat = std::chrono::milliseconds(f.heartbeat_ms),
       .dead_after = f.dead_after,
       .session_idle = std::chrono::seconds(f.session_idle_s),
       .session_retention = std::chrono::seconds(f.session_retention_s),
       .worker_retention = std::chrono::seconds(f.worker_retention_s),
       .driver_grace = std::chrono::seconds(f.driver_grace_s),
       .hang_after = std::chrono::seconds(f.hang_after_s),
       .quotas = f.quotas,
       .preempt_grace = std::chrono::seconds(f.preempt_grace_s),
       .grow_after = std::chrono::seconds(f.grow_after_s)});
  if (!core.ok()) return fail(core.status());
  kiln::coord::Metrics metrics(**core);
  std::unique_ptr<prometheus::Exposer> exposer;
  if (!f.metrics_listen.empty()) {
    try {
      exposer = std::make_unique<prometheus::Exposer>(f.metrics_listen);
    } catch (const std::exception& e) {
      return fail(
          absl::UnavailableError("cannot serve metrics on " + f.metrics_listen + ": " + e.what()));
    }
    exposer->RegisterCollectable(metrics.collectable());
  }
  std::unique_ptr<kiln::coord::Dashboard> dashboard;
  if (!f.dashboard_listen.empty()) {
    auto started = kiln::coord::Dashboard::start(**core, auth, f.dashboard_listen);
    if (!started.ok()) return fail(started.status());
    dashboard = std::move(*started);
    const std::string port = std::to_string(dashboard->port());
    if (!f.dashboard_port_file.empty() && !write_atomically(f.dashboard_port_file, port + "\n")) {
      return fail(
          absl::UnavailableError("cannot write --dashboard-port-file " + f.dashboard_port_file));
    }
    std::fprintf(stderr, "kiln-coordinator: dashboard on port %s\n", port.c_str());
  }

  kiln::coord::Service service(**core, auth, &metrics);
  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort(f.listen, creds, &port);
  builder.SetMaxReceiveMessageSize(kiln::proto::kMaxMessageBytes);
  builder.RegisterService(&service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (!server || port == 0) {
    return fail(absl::UnavailableError("cannot listen on " + f.listen));
  }
  if (!f.port_file.empty() && !write_atomically(f.port_file, std::to_string(port) + "\n")) {
    return fail(absl::UnavailableError("cannot write --port-file " + f.port_file));
  }
  std::fprintf(stderr, "kiln-coordinator: listening on port %d (state %s)\n", port,
               f.state.c_str());

  int sig = 0;
  sigwait(&stop_signals, &sig);
  std::fprintf(stderr, "kiln-coordinator: signal %d, shutting down\n", sig);
  // Waiting calls (WatchJob, OpenSession, Store) end first, so Shutdown's drain is short.
  (*core)->shutdown();
  dashboard.reset();
  server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(5));
  return 0;
}
