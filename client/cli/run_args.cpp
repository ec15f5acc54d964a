// `kiln run`'s flags (client/cli/run.h).
#include <charconv>
#include <cmath>
#include <cstdio>
#include <string_view>

#include "run.h"

namespace kiln::client {

const char* const kRunHelp =
    R"(usage: kiln run [--nproc N] [--master-port P] [--timeout S] [--grace-period S]
                PROGRAM [ARGS...]

Starts N ranks of PROGRAM on this machine, the way torchrun does, and waits for them.

options:
  --nproc N          ranks to start (default 1, at most 256)
  --master-port P    the port of rank 0's rendezvous store (default: a free loopback port)
  --timeout S        stop every rank and exit 124 when the job runs longer than S seconds
  --grace-period S   seconds between SIGTERM and SIGKILL when stopping ranks (default 5)
  -h, --help         show this help
  --                 ends the options (for a PROGRAM whose name starts with '-')

Each rank runs with RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_ADDR=127.0.0.1 and
MASTER_PORT set (PyTorch's env:// contract: rank 0 hosts the store at MASTER_PORT), and with
OMP_NUM_THREADS=max(1, cores/N) unless OMP_NUM_THREADS is already set; with OMP_PROC_BIND set
(and no OMP_PLACES), each rank gets OMP_PLACES naming CPUs of its own. Ranks read stdin from
/dev/null. Every line a rank writes goes to the same stream (stdout or stderr), prefixed with
"[rank R] ".

When a rank fails (a non-zero exit or a signal), the other ranks get SIGTERM, then SIGKILL after
the grace period, and kiln run exits with the failed rank's code (128+N for signal N). SIGINT,
SIGTERM and SIGHUP sent to kiln run are forwarded to every rank (a second one sends SIGKILL) and
kiln run exits with 128+N. A PROGRAM that cannot be started exits 127 (not found) or 126.
)";

namespace {

ParsedRun usage_error(const std::string& message) {
  std::fprintf(stderr, "kiln run: %s (see kiln run --help)\n", message.c_str());
  return {std::nullopt, kExitUsage};
}

// A whole-string integer in [lo, hi].
std::optional<int> parse_int(std::string_view s, int lo, int hi) {
  int v = 0;
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || end != s.data() + s.size() || v < lo || v > hi) return std::nullopt;
  return v;
}

// A whole-string finite number of seconds, > 0 (or >= 0 with allow_zero).
std::optional<double> parse_seconds(std::string_view s, bool allow_zero) {
  double v = 0;
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || end != s.data() + s.size() || !std::isfinite(v)) return std::nullopt;
  if (v < 0 || (v == 0 && !allow_zero)) return std::nullopt;
  return v;
}

}  // namespace

ParsedRun parse_run_args(const std::vector<std::string>& args) {
  RunOptions o;
  size_t i = 0;
  for (; i < args.size(); ++i) {
    const std::string& arg = args[i];
    if (arg == "--") {
      ++i;
      break;
    }
    if (arg.size() < 2 || arg[0] != '-') break;  // PROGRAM
    if (arg == "-h" || arg == "--help") {
      std::fputs(kRunHelp, stdout);
      return {std::nullopt, 0};
    }
    // --name VALUE or --name=VALUE
    const size_t eq = arg.find('=');
    const std::string name = arg.substr(0, eq);
    if (name != "--nproc" && name != "--master-port" && name != "--timeout" &&
        name != "--grace-period")
      return usage_error("unknown option '" + arg + "'");
    std::string value;
    if (eq != std::string::npos) {
      value = arg.substr(eq + 1);
    } else if (i + 1 < args.size()) {
      value = args[++i];
    } else {
      return usage_error(name + " expects a value");
    }

    if (name == "--nproc") {
      auto v = parse_int(value, 1, 256);
      if (!v) return usage_error("--nproc expects an integer in [1, 256], got '" + value + "'");
      o.nproc = *v;
    } else if (name == "--master-port") {
      auto v = parse_int(value, 1, 65535);
      if (!v) return usage_error("--master-port expects a port in [1, 65535], got '" + value + "'");
      o.master_port = v;
    } else if (name == "--timeout") {
      auto v = parse_seconds(value, /*allow_zero=*/false);
      if (!v) return usage_error("--timeout expects seconds > 0, got '" + value + "'");
      o.timeout_s = v;
    } else {
      auto v = parse_seconds(value, /*allow_zero=*/true);
      if (!v) return usage_error("--grace-period expects seconds >= 0, got '" + value + "'");
      o.grace_s = *v;
    }
  }
  if (i == args.size()) return usage_error("missing PROGRAM");
  o.command.assign(args.begin() + static_cast<std::ptrdiff_t>(i), args.end());
  return {std::move(o), 0};
}

}  // namespace kiln::client
