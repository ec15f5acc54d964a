// client/cli/jobs.h: the `kiln` subcommands that talk to a coordinator: workers, jobs, submit,
// status, cancel, logs, steps and profile (DESIGN.md "Jobs"). The coordinator comes from
// --coordinator HOST:PORT or KILN_COORDINATOR, the token from --token or KILN_TOKEN; every RPC has
// a deadline except the streams that follow a running job.
//
//   kiln submit --workers 2 -- python3 train.py   // waits for the gang, runs the driver here
//   kiln jobs --json
//   kiln logs job-3 -f
#pragma once

#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>
#include <vector>

#include "kiln/proto/coordinator.grpc.pb.h"

namespace kiln::client {

// True when `name` is one of the job subcommands.
bool is_job_command(const std::string& name);
// Runs `kiln NAME ARGS...`; returns the exit status.
int run_job_command(const std::string& name, const std::vector<std::string>& args);

// What every job subcommand shares.
struct CoordClient {
  std::string address, token;
  bool json = false;
  std::unique_ptr<proto::Coordinator::Stub> stub;
  // Adds the token and, unless `follow`, the 10 s deadline.
  void prepare(grpc::ClientContext& ctx, bool follow = false) const;
};

// Prints "kiln: CODE: message" for a failed RPC (naming the coordinator when unreachable);
// returns 1.
int report_rpc_error(const CoordClient& c, const grpc::Status& st);

// `kiln submit` (submit.cpp); `args` are the words after "submit" minus the shared flags.
int submit_main(const CoordClient& c, const std::vector<std::string>& args);
// `kiln profile` (profile.cpp; Note [Remote profiling] in coordinator/src/profiles.h).
int profile_main(const CoordClient& c, const std::vector<std::string>& args);

}  // namespace kiln::client
