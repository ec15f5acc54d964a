// kiln/coord/service.h: the Coordinator gRPC service (coordinator.proto) around a Coordinator:
// bearer-token auth per tenant, the RPC counter for /metrics, and the boundary where exceptions
// become INTERNAL (DESIGN.md "Errors": none crosses a handler).
//
//   kiln::coord::Auth auth = *kiln::coord::load_tokens("tokens.txt");  // "tenant token" lines
//   auth.worker_token = "w-secret";
//   kiln::coord::Service service(*coordinator, auth, &metrics);
//   builder.RegisterService(&service);
#pragma once

#include <absl/status/statusor.h>

#include <map>
#include <string>

#include "kiln/coord/coordinator.h"
#include "kiln/coord/metrics.h"
#include "kiln/proto/coordinator.grpc.pb.h"

namespace kiln::coord {

// Who may call: workers carry the worker token, clients a tenant's token. With no token at all
// configured, auth is off and every caller sees every tenant's jobs.
struct Auth {
  std::map<std::string, std::string> tenant_of_token;
  std::string worker_token;
  bool enabled() const { return !tenant_of_token.empty() || !worker_token.empty(); }
};

// Reads `tenant token` lines ('#' comments and blank lines skipped); INVALID_ARGUMENT naming
// the line for anything else, for a token that check_token_text refuses, and for a token that
// an earlier line gave (to any tenant: each tenant needs its own).
absl::StatusOr<Auth> load_tokens(const std::string& path);
// INVALID_ARGUMENT when the worker token is not a valid token or is also a tenant's (a tenant
// would then pass for a worker).
absl::Status check_auth(const Auth& auth);

class Service final : public proto::Coordinator::Service {
 public:
  Service(Coordinator& core, Auth auth, Metrics* metrics)
      : core_(core), auth_(std::move(auth)), metrics_(metrics) {}

  grpc::Status RegisterWorker(grpc::ServerContext*, const proto::RegisterWorkerRequest*,
                              proto::RegisterWorkerReply*) override;
  grpc::Status Heartbeat(grpc::ServerContext*, const proto::HeartbeatRequest*,
                         proto::HeartbeatReply*) override;
  grpc::Status ListWorkers(grpc::ServerContext*, const proto::ListWorkersRequest*,
                           proto::ListWorkersReply*) override;
  grpc::Status LookupSession(grpc::ServerContext*, const proto::LookupSessionRequest*,
                             proto::SessionInfo*) override;
  grpc::Status OpenSession(grpc::ServerContext*, const proto::OpenSessionRequest*,
                           proto::SessionInfo*) override;
  grpc::Status CloseSession(grpc::ServerContext*, const proto::CloseSessionRequest*,
                            proto::CloseSessionReply*) override;
  grpc::Status SubmitJob(grpc::ServerContext*, const proto::SubmitJobRequest*,
                         proto::Job*) override;
  grpc::Status GetJob(grpc::ServerContext*, const proto::GetJobRequest*, proto::Job*) override;
  grpc::Status ListJobs(grpc::ServerContext*, const proto::ListJobsRequest*,
                        proto::ListJobsReply*) override;
  grpc::Status CancelJob(grpc::ServerContext*, const proto::CancelJobRequest*,
                         proto::Job*) override;
  grpc::Status WatchJob(grpc::ServerContext*, const proto::WatchJobRequest*,
                        grpc::ServerWriter<proto::JobEvent>*) override;
  grpc::Status ProfileJob(grpc::ServerContext*, const proto::ProfileJobRequest*,
                          grpc::ServerWriter<proto::ProfileChunk>*) override;
  grpc::Status ReportJob(grpc::ServerContext*, grpc::ServerReader<proto::JobReport>*,
                         proto::Job*) override;
  grpc::Status Store(grpc::ServerContext*, const proto::StoreRequest*, proto::StoreReply*) override;
  grpc::Status JobSteps(grpc::ServerContext*, const proto::JobStepsRequest*,
                        proto::JobStepsReply*) override;

  enum class Role { kWorker, kClient, kAny };

 private:
  // Who calls (a worker, a tenant, or anyone when auth is off), or UNAUTHENTICATED.
  absl::StatusOr<Caller> authenticate(const grpc::ServerContext& ctx, Role role) const;
  template <typename F>
  grpc::Status handle(const char* method, grpc::ServerContext* ctx, Role role, F&& body);

  Coordinator& core_;
  Auth auth_;
  Metrics* metrics_;
};

}  // namespace kiln::coord
