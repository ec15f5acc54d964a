#include "coordinator_link.h"

#include <absl/strings/str_cat.h>
#include <grpcpp/grpcpp.h>

#include "kiln/proto/service.h"
#include "remote_profile.h"
#include "reports.h"

namespace kiln::worker {

namespace {

// Every RPC to the coordinator has a deadline (a hung coordinator must not hang the worker).
constexpr auto kRpcDeadline = std::chrono::seconds(5);

void prepare(grpc::ClientContext& ctx, const std::string& token) {
  ctx.set_deadline(std::chrono::system_clock::now() + kRpcDeadline);
  proto::add_token(ctx, token);
}

}  // namespace

absl::StatusOr<std::unique_ptr<CoordinatorLink>> CoordinatorLink::start(
    const std::string& address, const std::string& token, proto::RegisterWorkerRequest request,
    LoadFn load, CloseFn close, DumpFn dump, RunFn run, DrainFn drain) {
  std::unique_ptr<CoordinatorLink> link(new CoordinatorLink());
  link->token_ = token;
  link->request_ = std::move(request);
  link->request_.set_protocol_version(proto::kProtocolVersion);
  link->load_ = std::move(load);
  link->close_ = std::move(close);
  link->dump_ = std::move(dump);
  link->run_ = std::move(run);
  link->drain_ = std::move(drain);
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(proto::kMaxMessageBytes);
  link->stub_ = proto::Coordinator::NewStub(
      grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(), args));
  if (auto st = link->register_worker(); !st.ok())
    return absl::Status(st.code(), absl::StrCat("registering with the coordinator at ", address,
                                                ": ", std::string(st.message())));
  link->thread_ = std::thread([l = link.get()] { l->heartbeat_loop(); });
  return link;
}

CoordinatorLink::~CoordinatorLink() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

absl::Status CoordinatorLink::register_worker() {
  grpc::ClientContext ctx;
  prepare(ctx, token_);
  proto::RegisterWorkerReply reply;
  absl::Status st = proto::from_grpc(stub_->RegisterWorker(&ctx, request_, &reply));
  if (!st.ok()) return st;
  std::lock_guard<std::mutex> lock(mu_);
  epoch_ = reply.epoch();
  interval_ms_ = reply.heartbeat_interval_ms() ? reply.heartbeat_interval_ms() : 1000;
  return absl::OkStatus();
}

void CoordinatorLink::heartbeat_loop() {
  std::unique_lock<std::mutex> lock(mu_);
  auto last = std::chrono::steady_clock::now();
  // Reports kept across a failed beat.
  std::vector<proto::CollectiveRecord> collectives;
  std::vector<proto::StepRecord> steps;
  std::vector<proto::StackDump> dumps;
  std::vector<proto::BatchResult> results;
  std::vector<proto::RankProfile> profiles;  // See Note [Remote profiling]
  while (!cv_.wait_for(lock, kReportPoll, [&] { return stop_; })) {
    const auto interval = std::chrono::milliseconds(interval_ms_);
    proto::HeartbeatRequest req;
    req.set_worker_id(request_.worker_id());
    req.set_epoch(epoch_);
    lock.unlock();
    for (proto::CollectiveRecord& r : take_collectives()) collectives.push_back(std::move(r));
    for (proto::StepRecord& r : take_steps()) steps.push_back(std::move(r));
    for (proto::BatchResult& r : take_batch_results()) results.push_back(std::move(r));
    for (proto::RankProfile& p : take_profiles()) profiles.push_back(std::move(p));
    const auto now = std::chrono::steady_clock::now();
    if (collectives.empty() && steps.empty() && dumps.empty() && results.empty() &&
        profiles.empty() && now - last < interval) {
      lock.lock();
      continue;
    }
    last = now;
    Load load = load_();
    end_profiles_except(load.sessions);
    for (proto::RankProfile& p : take_profiles()) profiles.push_back(std::move(p));
    for (std::string& s : load.sessions) req.add_sessions(std::move(s));
    req.set_memory_in_use_bytes(load.memory_in_use_bytes);
    for (const proto::CollectiveRecord& r : collectives) *req.add_collectives() = r;
    for (const proto::StepRecord& r : steps) *req.add_steps() = r;
    for (const proto::StackDump& d : dumps) *req.add_dumps() = d;
    for (const proto::BatchResult& r : results) *req.add_batch_results() = r;
    for (const proto::RankProfile& p : profiles) *req.add_profiles() = p;
    grpc::ClientContext ctx;
    prepare(ctx, token_);
    proto::HeartbeatReply reply;
    req.set_sent_unix_us(worker_unix_us());
    absl::Status st = proto::from_grpc(stub_->Heartbeat(&ctx, req, &reply));
    if (st.ok()) {
      note_clock(req.sent_unix_us(), reply.received_unix_us(), reply.replied_unix_us(),
                 worker_unix_us());
      for (const proto::ProfileRequest& r : reply.profile()) arm_profile(r);
      profiles.clear();
      collectives.clear();
      steps.clear();
      dumps.clear();
      results.clear();
      for (const std::string& s : reply.close_sessions()) close_(s);
      if (run_)
        for (const proto::BatchRun& r : reply.run_batches()) run_(r);
      if (drain_)
        for (const std::string& s : reply.drain_sessions()) drain_(s);
      // Sent with the next beat, at the next poll.
      for (const std::string& s : reply.dump_sessions()) {
        proto::StackDump& d = dumps.emplace_back();
        d.set_session_id(s);
        d.set_text(dump_ ? dump_(s) : "this worker cannot describe itself");
      }
    } else if (st.code() == absl::StatusCode::kAborted ||
               st.code() == absl::StatusCode::kNotFound) {
      (void)register_worker();  // a failure is retried at the next beat
    }
    // Other failures (the coordinator is down or slow): keep beating; it answers NOT_FOUND
    // once it is back without us. Reports wait for the next beat, the oldest dropped past the
    // bound (See Note [Collective reports] in reports.h).
    if (collectives.size() > kMaxPendingReports)
      collectives.erase(collectives.begin(), collectives.end() - kMaxPendingReports);
    if (steps.size() > kMaxPendingReports)
      steps.erase(steps.begin(), steps.end() - kMaxPendingReports);
    lock.lock();
  }
}

absl::StatusOr<proto::SessionInfo> CoordinatorLink::lookup(const std::string& session_id,
                                                           const std::string& secret) {
  grpc::ClientContext ctx;
  prepare(ctx, token_);
  proto::LookupSessionRequest req;
  req.set_session_id(session_id);
  req.set_worker_id(request_.worker_id());
  req.set_session_secret(secret);
  proto::SessionInfo info;
  absl::Status st = proto::from_grpc(stub_->LookupSession(&ctx, req, &info));
  if (st.code() == absl::StatusCode::kNotFound || st.code() == absl::StatusCode::kPermissionDenied)
    return absl::PermissionDeniedError(absl::StrCat("worker '", request_.worker_id(),
                                                    "' refuses session '", session_id,
                                                    "': ", std::string(st.message())));
  if (!st.ok()) return st;
  return info;
}

absl::StatusOr<proto::StoreReply> CoordinatorLink::store(proto::StoreRequest request) {
  request.set_worker_id(request_.worker_id());
  grpc::ClientContext ctx;
  prepare(ctx, token_);
  if (request.wait_ms())  // a waiting get may take its whole wait
    ctx.set_deadline(std::chrono::system_clock::now() + kRpcDeadline +
                     std::chrono::milliseconds(request.wait_ms()));
  proto::StoreReply reply;
  absl::Status st = proto::from_grpc(stub_->Store(&ctx, request, &reply));
  if (!st.ok()) return st;
  return reply;
}

}  // namespace kiln::worker
