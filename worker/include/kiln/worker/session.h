// kiln/worker/session.h: one client's session on a worker: a value table and the executor that
// runs the client's instructions through the dispatcher, below autograd (DESIGN.md "Execution").
// The gRPC service (server.h) drives one Session per stream; the client's in-process transport
// drives one directly.
//
//   kiln::worker::Session s({.worker_id = "w0"});
//   kiln::proto::Batch b = ...;          // Create, Instruction, Fetch, Sync, Free commands
//   absl::Status st = s.run(b, [&](kiln::proto::WorkerMessage&& m) { replies.push_back(m); });
//
// Note [Poisoned values]: an instruction that raises poisons its output ids with the error
// (code, kind, message, seq, op). An instruction that reads a poisoned value does not run; its
// outputs are poisoned with the same original error. A Fetch of a poisoned value answers that
// error; a Sync answers the first failure since the previous Sync. Poisoning is per value, so
// independent work goes on.
//
// What ends the stream instead (run() returns INVALID_ARGUMENT, the session stays usable for
// nothing else): a command with no kind, a Create whose pieces are inconsistent, an output id
// that is not > 0, repeated, or already in use. An output id may name one of the instruction's
// own inputs only for an in-place or out= op (OpInfo is_inplace / is_out), which rebinds it;
// views get fresh ids. An unknown op name, a wrong argument or output count, an unknown input
// id or a kernel's error is the instruction's own failure (poisoning, code INVALID_ARGUMENT for
// bad input), since the client may go on. A Fetch of an unknown id answers an error; Free
// ignores unknown ids. An id whose Create pieces have not all come yet reads as incomplete (with
// the bytes received so far), not as unknown.
//
// Memory limit: the bytes of the distinct storages the table holds (a view costs nothing). An
// instruction or Create that would pass the limit (checked from the op's meta function before
// running, and from the real storages after) is dropped and its outputs poisoned with
// RESOURCE_EXHAUSTED "worker memory limit N bytes exceeded: ...".
//
// Devices: Create puts a value on its `device`, or options.device when empty; a Device argument
// "remote:N" means options.device. Random instructions replay the client's draw from a fresh
// Generator at their (seed, offset) (Note [Random ops in the IR] in kiln/ir.h).
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include <absl/status/status.h>

#include "kiln/device.h"
#include "kiln/proto/worker.pb.h"

namespace kiln::worker {

struct SessionOptions {
  std::string worker_id = "worker";
  Device device = kCPU;             // where Create puts values without a device
  uint64_t memory_limit_bytes = 0;  // 0: no limit; else RESOURCE_EXHAUSTED beyond it
  int rank = 0;
  int world_size = 1;
  // The coordinator's session ("" for a worker serving clients directly): step marks are
  // reported under it (See Note [Step telemetry] in worker/src/reports.h).
  std::string session_id;
};

class Session {
 public:
  explicit Session(SessionOptions options);
  ~Session();
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;

  // Runs the batch's commands in order, sending FetchReply pieces and SyncReplies to `reply`.
  absl::Status run(const proto::Batch& batch,
                   const std::function<void(proto::WorkerMessage&&)>& reply);

  const SessionOptions& options() const { return options_; }
  int64_t num_values() const;          // live entries of the value table
  uint64_t memory_in_use_bytes() const;
  uint64_t instructions_run() const;
  // What the executor is doing now and for how long ("running instruction #12 'all_reduce' for
  // 30.1 s", or idle), for a hang report.
  std::string activity() const;
  // Segments run by the compiled-graph cache (Note [Compiled batches]).
  uint64_t compiled_runs() const;

  struct State;  // the value table and executor state (session.cpp)

 private:
  SessionOptions options_;
  State* state_;
};

}  // namespace kiln::worker
