#include "kiln/coord/service.h"

#include <absl/strings/str_cat.h>
#include <absl/strings/str_split.h>

#include <chrono>
#include <fstream>

#include "kiln/proto/service.h"

namespace kiln::coord {

absl::StatusOr<Auth> load_tokens(const std::string& path) {
  std::ifstream in(path);
  if (!in)
    return absl::InvalidArgumentError(absl::StrCat("cannot read --tokens file '", path, "'"));
  Auth auth;
  std::map<std::string, int> line_of_token;
  int n = 0;
  for (std::string line; std::getline(in, line);) {
    ++n;
    std::vector<std::string> words =
        absl::StrSplit(line, absl::ByAnyChar(" \t\r"), absl::SkipWhitespace());
    if (words.empty() || words[0][0] == '#') continue;
    const std::string where = absl::StrCat(path, ":", n);
    if (words.size() != 2) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": expected 'TENANT TOKEN', got ", words.size(), " words"));
    }
    if (auto st = proto::check_token_text(words[1], where); !st.ok()) return st;
    auto [seen, fresh] = line_of_token.try_emplace(words[1], n);
    if (!fresh) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, ": tenant ", words[0], " has the token of line ", seen->second, " (tenant ",
          auth.tenant_of_token[words[1]], "); every tenant needs a token of its own"));
    }
    auth.tenant_of_token[words[1]] = words[0];
  }
  return auth;
}

absl::Status check_auth(const Auth& auth) {
  if (auth.worker_token.empty()) return absl::OkStatus();
  if (auto st = proto::check_token_text(auth.worker_token, "--worker-token"); !st.ok()) return st;
  auto t = auth.tenant_of_token.find(auth.worker_token);
  if (t != auth.tenant_of_token.end()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--worker-token is also the token of tenant ", t->second, "; give workers their own"));
  }
  return absl::OkStatus();
}

namespace {

template <typename T>
absl::Status assign(absl::StatusOr<T> r, T* out) {
  if (!r.ok()) return r.status();
  *out = std::move(*r);
  return absl::OkStatus();
}

Cancelled cancelled_of(grpc::ServerContext* ctx) {
  return [ctx] { return ctx->IsCancelled() || ctx->deadline() < std::chrono::system_clock::now(); };
}

}  // namespace

absl::StatusOr<Caller> Service::authenticate(const grpc::ServerContext& ctx, Role role) const {
  if (!auth_.enabled()) return Caller{};
  const auto& md = ctx.client_metadata();
  auto it = md.find("authorization");
  constexpr std::string_view kBearer = "Bearer ";
  if (it == md.end()) {
    return absl::UnauthenticatedError("missing 'authorization: Bearer TOKEN' metadata");
  }
  std::string_view got(it->second.data(), it->second.size());
  if (got.substr(0, kBearer.size()) != kBearer) {
    return absl::UnauthenticatedError("the authorization metadata must be 'Bearer TOKEN'");
  }
  const std::string token(got.substr(kBearer.size()));
  if (role != Role::kClient && !auth_.worker_token.empty() &&
      proto::secrets_equal(token, auth_.worker_token)) {
    return Caller{Caller::Kind::kWorker, ""};
  }
  if (role != Role::kWorker) {
    auto t = auth_.tenant_of_token.find(token);
    if (t != auth_.tenant_of_token.end()) return Caller{Caller::Kind::kTenant, t->second};
  }
  return absl::UnauthenticatedError(role == Role::kWorker ? "invalid worker token"
                                                          : "invalid bearer token");
}

template <typename F>
grpc::Status Service::handle(const char* method, grpc::ServerContext* ctx, Role role, F&& body) {
  absl::Status st;
  try {
    absl::StatusOr<Caller> caller = authenticate(*ctx, role);
    st = caller.ok() ? body(*caller) : caller.status();
  } catch (const std::exception& e) {
    st = absl::InternalError(absl::StrCat("coordinator: ", e.what()));
  }
  if (metrics_) metrics_->count_rpc(method, st.code());
  return proto::to_grpc(st);
}

grpc::Status Service::RegisterWorker(grpc::ServerContext* ctx,
                                     const proto::RegisterWorkerRequest* req,
                                     proto::RegisterWorkerReply* reply) {
  return handle("RegisterWorker", ctx, Role::kWorker,
                [&](const Caller&) { return assign(core_.register_worker(*req), reply); });
}

grpc::Status Service::Heartbeat(grpc::ServerContext* ctx, const proto::HeartbeatRequest* req,
                                proto::HeartbeatReply* reply) {
  return handle("Heartbeat", ctx, Role::kWorker,
                [&](const Caller&) { return assign(core_.heartbeat(*req), reply); });
}

grpc::Status Service::ListWorkers(grpc::ServerContext* ctx, const proto::ListWorkersRequest*,
                                  proto::ListWorkersReply* reply) {
  return handle("ListWorkers", ctx, Role::kAny, [&](const Caller& caller) {
    *reply = core_.list_workers(caller);
    return absl::OkStatus();
  });
}

grpc::Status Service::LookupSession(grpc::ServerContext* ctx,
                                    const proto::LookupSessionRequest* req,
                                    proto::SessionInfo* reply) {
  return handle("LookupSession", ctx, Role::kAny, [&](const Caller& caller) {
    return assign(core_.lookup_session(*req, caller), reply);
  });
}

grpc::Status Service::OpenSession(grpc::ServerContext* ctx, const proto::OpenSessionRequest* req,
                                  proto::SessionInfo* reply) {
  return handle("OpenSession", ctx, Role::kClient, [&](const Caller& caller) {
    return assign(core_.open_session(*req, caller.tenant, cancelled_of(ctx)), reply);
  });
}

grpc::Status Service::CloseSession(grpc::ServerContext* ctx, const proto::CloseSessionRequest* req,
                                   proto::CloseSessionReply*) {
  return handle("CloseSession", ctx, Role::kClient,
                [&](const Caller& caller) { return core_.close_session(*req, caller.tenant); });
}

grpc::Status Service::SubmitJob(grpc::ServerContext* ctx, const proto::SubmitJobRequest* req,
                                proto::Job* reply) {
  return handle("SubmitJob", ctx, Role::kClient, [&](const Caller& caller) {
    return assign(core_.submit_job(*req, caller.tenant), reply);
  });
}

grpc::Status Service::GetJob(grpc::ServerContext* ctx, const proto::GetJobRequest* req,
                             proto::Job* reply) {
  return handle("GetJob", ctx, Role::kClient, [&](const Caller& caller) {
    return assign(core_.get_job(*req, caller.tenant), reply);
  });
}

grpc::Status Service::JobSteps(grpc::ServerContext* ctx, const proto::JobStepsRequest* req,
                               proto::JobStepsReply* reply) {
  return handle("JobSteps", ctx, Role::kClient, [&](const Caller& caller) {
    return assign(core_.job_steps(*req, caller.tenant), reply);
  });
}

grpc::Status Service::ListJobs(grpc::ServerContext* ctx, const proto::ListJobsRequest* req,
                               proto::ListJobsReply* reply) {
  return handle("ListJobs", ctx, Role::kClient, [&](const Caller& caller) {
    return assign(core_.list_jobs(*req, caller.tenant), reply);
  });
}

grpc::Status Service::CancelJob(grpc::ServerContext* ctx, const proto::CancelJobRequest* req,
                                proto::Job* reply) {
  return handle("CancelJob", ctx, Role::kClient, [&](const Caller& caller) {
    return assign(core_.cancel_job(*req, caller.tenant), reply);
  });
}

grpc::Status Service::WatchJob(grpc::ServerContext* ctx, const proto::WatchJobRequest* req,
                               grpc::ServerWriter<proto::JobEvent>* writer) {
  return handle("WatchJob", ctx, Role::kClient, [&](const Caller& caller) {
    return core_.watch_job(
        *req, caller.tenant, [&](const proto::JobEvent& e) { return writer->Write(e); },
        cancelled_of(ctx));
  });
}

grpc::Status Service::ProfileJob(grpc::ServerContext* ctx, const proto::ProfileJobRequest* req,
                                 grpc::ServerWriter<proto::ProfileChunk>* writer) {
  return handle("ProfileJob", ctx, Role::kClient, [&](const Caller& caller) {
    return core_.profile_job(
        *req, caller.tenant, [&](const proto::ProfileChunk& c) { return writer->Write(c); },
        cancelled_of(ctx));
  });
}

grpc::Status Service::ReportJob(grpc::ServerContext* ctx,
                                grpc::ServerReader<proto::JobReport>* reader, proto::Job* reply) {
  return handle("ReportJob", ctx, Role::kClient, [&](const Caller& caller) -> absl::Status {
    const std::string& tenant = caller.tenant;
    std::string job_id;
    struct Attached {  // this stream counts as the job's driver while it is open
      Coordinator& core;
      const std::string& tenant;
      std::string job_id;
      ~Attached() {
        if (!job_id.empty()) core.driver_attached(job_id, tenant, false);
      }
    } attached{core_, tenant, ""};
    for (proto::JobReport report; reader->Read(&report);) {
      if (job_id.empty()) {
        if (report.job_id().empty()) {
          return absl::InvalidArgumentError("job_id is required on the first JobReport");
        }
        job_id = report.job_id();
        core_.driver_attached(job_id, tenant, true);
        attached.job_id = job_id;
      } else if (!report.job_id().empty() && report.job_id() != job_id) {
        return absl::InvalidArgumentError(absl::StrCat(
            "job_id changed within one ReportJob stream: ", job_id, " then ", report.job_id()));
      }
      report.set_job_id(job_id);
      if (auto st = assign(core_.report_job(report, tenant), reply); !st.ok()) return st;
      if (reply->state() != "running") return absl::OkStatus();  // ended: the driver stops
    }
    if (job_id.empty()) return absl::InvalidArgumentError("an empty ReportJob stream");
    proto::GetJobRequest get;
    get.set_job_id(job_id);
    return assign(core_.get_job(get, tenant), reply);
  });
}

grpc::Status Service::Store(grpc::ServerContext* ctx, const proto::StoreRequest* req,
                            proto::StoreReply* reply) {
  return handle("Store", ctx, Role::kAny, [&](const Caller& caller) {
    return assign(core_.store(*req, caller, cancelled_of(ctx)), reply);
  });
}

}  // namespace kiln::coord
