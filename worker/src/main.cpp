// kiln-worker: serves the Worker service (kiln/worker/server.h) until SIGTERM or SIGINT, then
// drains gracefully and exits 0. Bad flags exit 2 with a message; a server that cannot start
// (address taken, coordinator unreachable) exits 1.
#include <signal.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <optional>
#include <string>

#include "kiln/error.h"
#include "kiln/tensor.h"
#include "kiln/worker/server.h"

namespace {

constexpr const char* kUsage = R"(usage: kiln-worker [options]

Executes Kiln programs that clients stream to it (a Worker gRPC service).

options:
  --listen ADDR          where to serve, host:port (default 127.0.0.1:0, a free port); a
                         non-loopback address needs --token
  --port-file F          write the bound port to F once listening
  --token T              require 'authorization: Bearer T' of direct clients, and present it
                         to the coordinator (default: $KILN_TOKEN)
  --memory-limit BYTES   the worker's limit (it serves one session at a time), with an
                         optional K, M or G suffix (powers of 1024)
  --device DEV           cpu (default) or cuda:N
  --metrics-listen ADDR  serve Prometheus /metrics on host:port
  --coordinator ADDR     register with the coordinator at host:port, and serve its sessions
                         only
  --advertise ADDR       the address the coordinator hands to clients (default: from --listen)
  --worker-id ID         the name to register under (default hostname-pid)
  --drain-seconds S      on SIGTERM, how long open streams may finish (default 3)
  --help                 this text
)";

[[noreturn]] void usage_error(const std::string& msg) {
  std::cerr << "kiln-worker: " << msg << "\n(see kiln-worker --help)\n";
  std::exit(2);
}

std::optional<uint64_t> parse_bytes(const std::string& s) {
  if (s.empty()) return std::nullopt;
  size_t end = 0;
  unsigned long long v = 0;
  try {
    if (s[0] == '-') return std::nullopt;
    v = std::stoull(s, &end);
  } catch (const std::exception&) {
    return std::nullopt;
  }
  std::string suffix = s.substr(end);
  int shift = suffix.empty() ? 0 : suffix == "K" ? 10 : suffix == "M" ? 20 : suffix == "G" ? 30 : -1;
  if (shift < 0 || v > (~0ull >> shift)) return std::nullopt;
  return static_cast<uint64_t>(v) << shift;
}

bool write_port_file(const std::string& path, int port) {
  std::string tmp = path + ".tmp";
  {
    std::ofstream f(tmp);
    f << port << "\n";
    if (!f.good()) return false;
  }
  return std::rename(tmp.c_str(), path.c_str()) == 0;
}

}  // namespace

int main(int argc, char** argv) {
  kiln::worker::ServerOptions opt;
  if (const char* t = std::getenv("KILN_TOKEN")) opt.token = t;
  std::string port_file;
  int drain_seconds = 3;
  for (int i = 1; i < argc; ++i) {
    std::string flag = argv[i], value;
    if (flag == "--help" || flag == "-h") {
      std::cout << kUsage;
      return 0;
    }
    if (auto eq = flag.find('='); eq != std::string::npos) {
      value = flag.substr(eq + 1);
      flag = flag.substr(0, eq);
    } else {
      static const char* const kFlags[] = {"--listen", "--port-file", "--token",
                                           "--memory-limit", "--device", "--metrics-listen",
                                           "--coordinator", "--advertise", "--worker-id",
                                           "--drain-seconds"};
      if (std::find(std::begin(kFlags), std::end(kFlags), flag) == std::end(kFlags))
        usage_error("unknown option '" + flag + "'");
      if (i + 1 >= argc) usage_error(flag + " needs a value");
      value = argv[++i];
    }
    if (flag == "--listen") opt.listen = value;
    else if (flag == "--port-file") port_file = value;
    else if (flag == "--token") opt.token = value;
    else if (flag == "--metrics-listen") opt.metrics_listen = value;
    else if (flag == "--coordinator") opt.coordinator = value;
    else if (flag == "--advertise") opt.advertise = value;
    else if (flag == "--worker-id") opt.worker_id = value;
    else if (flag == "--memory-limit") {
      auto b = parse_bytes(value);
      if (!b) usage_error("--memory-limit: '" + value + "' is not a byte count (e.g. 512M, 8G)");
      opt.memory_limit_bytes = *b;
    } else if (flag == "--drain-seconds") {
      auto s = parse_bytes(value);
      if (!s || *s > 3600) usage_error("--drain-seconds: '" + value + "' is not 0..3600");
      drain_seconds = static_cast<int>(*s);
    } else if (flag == "--device") {
      try {
        opt.device = kiln::Device(value);
      } catch (const kiln::Error& e) {
        usage_error(std::string("--device: ") + e.what());
      }
      if (!opt.device.is_cpu() && !opt.device.is_cuda())
        usage_error("--device: expected cpu or cuda:N, got '" + value + "'");
      try {  // a device this build or machine lacks fails now, not at the first instruction
        kiln::empty_on({1}, kiln::kFloat32, opt.device);
      } catch (const std::exception& e) {
        usage_error("--device " + value + ": " + e.what());
      }
    } else {
      usage_error("unknown option '" + flag + "'");
    }
  }

  // SIGTERM/SIGINT are taken by sigwait below: block them before gRPC starts its threads.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  auto server = kiln::worker::Server::start(opt);
  if (!server.ok()) {
    std::cerr << "kiln-worker: " << server.status().message() << "\n";
    return server.status().code() == absl::StatusCode::kInvalidArgument ? 2 : 1;
  }
  if (!port_file.empty() && !write_port_file(port_file, (*server)->port())) {
    std::cerr << "kiln-worker: cannot write the port file '" << port_file << "'\n";
    return 1;
  }
  std::cerr << "kiln-worker " << (*server)->worker_id() << ": serving on port "
            << (*server)->port() << " (device " << opt.device << ")";
  if ((*server)->metrics_port()) std::cerr << ", metrics on port " << (*server)->metrics_port();
  std::cerr << std::endl;

  int sig = 0;
  while (sigwait(&signals, &sig) != 0) {
  }
  std::cerr << "kiln-worker: signal " << sig << ", draining" << std::endl;
  (*server)->shutdown(std::chrono::seconds(drain_seconds));
  return 0;
}
