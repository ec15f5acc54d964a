// client/cli/run.h: `kiln run`, the torchrun analog for one machine. It starts N ranks of a
// program with PyTorch's env:// launch contract, prefixes their output with the rank, and stops
// them all on the first failure.
//
//   kiln run --nproc 2 build/bin/digits --epochs 3
//   kiln run --nproc 4 --master-port 29500 python3 train.py
//   // each rank sees RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT;
//   // rank 0 hosts the rendezvous store at MASTER_PORT, so the launcher runs none.
//   // exit status: 0, or the first failed rank's code (128 + signal for a signal).
#pragma once

#include <optional>
#include <string>
#include <vector>

namespace kiln::client {

struct RunOptions {
  int nproc = 1;
  std::optional<int> master_port;    // default: a free loopback port
  std::optional<double> timeout_s;   // the whole job's wall-clock limit
  double grace_s = 5;                // SIGTERM, then SIGKILL this much later
  std::vector<std::string> command;  // PROGRAM ARGS...
};

// Exit statuses that are not a rank's own.
inline constexpr int kExitUsage = 2;      // bad flags (after printing the error)
inline constexpr int kExitTimeout = 124;  // --timeout ran out (timeout(1)'s code)
inline constexpr int kExitCannotRun = 126;
inline constexpr int kExitNotFound = 127;  // the shell's codes for a program it cannot start

extern const char* const kRunHelp;

// `args` are the words after "run". Returns the options, or prints the error (and the help for
// --help) and returns the exit status to use.
struct ParsedRun {
  std::optional<RunOptions> options;
  int exit_status = 0;
};
ParsedRun parse_run_args(const std::vector<std::string>& args);

// Starts the ranks, relays their output, and returns the launcher's exit status.
int launch(const RunOptions& options);

}  // namespace kiln::client
