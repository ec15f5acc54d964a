// tests/coordinator/harness.h: real kiln-coordinator processes on loopback for the tests, fake
// workers as plain gRPC stub clients, and a runner for the `kiln` CLI. Every wait has a
// deadline, so a broken daemon fails a test instead of hanging it.
//
//   Daemon d(dir, {"--heartbeat-ms", "100"});
//   FakeWorker w(d, "w0");                 // registers and beats until destroyed or stop()
//   proto::Job job;  EXPECT_TRUE(d.call(&Stub::SubmitJob, req, &job).ok());
#pragma once

#include <absl/status/statusor.h>
#include <fcntl.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "kiln/proto/coordinator.grpc.pb.h"
#include "kiln/proto/service.h"

extern char** environ;

namespace kiln::test {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;
using Stub = proto::Coordinator::Stub;

inline std::string slurp(const fs::path& p) {
  std::ifstream f(p);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

// Starts `argv` with stdout and stderr in files and `extra_env` added; returns the pid.
inline pid_t spawn(const std::vector<std::string>& argv, const fs::path& out, const fs::path& err,
                   const std::vector<std::string>& extra_env = {}) {
  std::vector<std::string> env;
  for (char** e = environ; *e; ++e) env.push_back(*e);
  env.insert(env.end(), extra_env.begin(), extra_env.end());
  std::vector<char*> a, e;
  for (auto& s : const_cast<std::vector<std::string>&>(argv)) a.push_back(s.data());
  a.push_back(nullptr);
  for (auto& s : env) e.push_back(s.data());
  e.push_back(nullptr);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 1, out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_addopen(&fa, 2, err.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  pid_t pid = -1;
  const int rc = posix_spawn(&pid, a[0], &fa, nullptr, a.data(), e.data());
  posix_spawn_file_actions_destroy(&fa);
  return rc == 0 ? pid : -1;
}

// The exit status (128 + signal for a signal), or -1 when `pid` is still running at the deadline.
inline int wait_for(pid_t pid, std::chrono::milliseconds timeout) {
  const auto until = Clock::now() + timeout;
  while (true) {
    int status = 0;
    if (waitpid(pid, &status, WNOHANG) == pid) {
      return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    }
    if (Clock::now() >= until) return -1;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

class TempDir {
 public:
  TempDir() {
    std::string tmpl = (fs::temp_directory_path() / "kiln_coord_XXXXXX").string();
    if (mkdtemp(tmpl.data())) path_ = tmpl;
  }
  ~TempDir() { fs::remove_all(path_); }
  const fs::path& path() const { return path_; }

 private:
  fs::path path_;
};

class Daemon {
 public:
  // Starts kiln-coordinator with its state in `dir`; `token` goes on every call() made.
  // With `ca_pem`, the stub talks TLS trusting that certificate.
  Daemon(const fs::path& dir, std::vector<std::string> flags = {}, std::string token = "",
         std::string ca_pem = "")
      : dir_(dir), flags_(std::move(flags)), token_(std::move(token)), ca_pem_(std::move(ca_pem)) {
    start();
  }
  ~Daemon() {
    if (pid_ > 0) {
      kill(pid_, SIGKILL);
      wait_for(pid_, std::chrono::seconds(5));
    }
  }

  // Starts the daemon: on a free port the first time, on the same port again after crash().
  void start() {
    fs::remove(dir_ / "port");
    std::vector<std::string> argv = {KILN_COORDINATOR_BIN,
                                     "--listen",
                                     "127.0.0.1:" + std::to_string(port_),
                                     "--port-file",
                                     (dir_ / "port").string(),
                                     "--state",
                                     (dir_ / "state.db").string()};
    argv.insert(argv.end(), flags_.begin(), flags_.end());
    pid_ = spawn(argv, dir_ / "coord.out", dir_ / "coord.err");
    ASSERT_GT(pid_, 0);
    const auto until = Clock::now() + std::chrono::seconds(10);
    while (!fs::exists(dir_ / "port")) {
      ASSERT_LT(Clock::now(), until) << "no port file; stderr: " << slurp(dir_ / "coord.err");
      ASSERT_EQ(wait_for(pid_, std::chrono::milliseconds(10)), -1)
          << "kiln-coordinator exited: " << slurp(dir_ / "coord.err");
    }
    port_ = std::stoi(slurp(dir_ / "port"));
    std::shared_ptr<grpc::ChannelCredentials> creds = grpc::InsecureChannelCredentials();
    if (!ca_pem_.empty()) creds = grpc::SslCredentials({.pem_root_certs = ca_pem_});
    std::shared_ptr<Stub> stub = proto::Coordinator::NewStub(grpc::CreateChannel(address(), creds));
    std::lock_guard<std::mutex> lock(stub_mu_);  // a FakeWorker's thread may be in call()
    stub_ = std::move(stub);
  }
  // SIGKILL, as a crash would.
  void crash() {
    kill(pid_, SIGKILL);
    wait_for(pid_, std::chrono::seconds(5));
    pid_ = -1;
  }
  // SIGTERM; the exit status (or -1 if it had not exited after `timeout`).
  int terminate(std::chrono::milliseconds timeout = std::chrono::seconds(5)) {
    kill(pid_, SIGTERM);
    const int rc = wait_for(pid_, timeout);
    if (rc != -1) pid_ = -1;
    return rc;
  }

  std::string address() const { return "127.0.0.1:" + std::to_string(port_); }
  Stub& stub() {
    std::lock_guard<std::mutex> lock(stub_mu_);
    return *stub_;
  }
  std::string stderr_text() const { return slurp(dir_ / "coord.err"); }

  // One unary call with a 10 s deadline and `token` (default: the daemon's).
  template <typename Req, typename Reply>
  absl::Status call(grpc::Status (Stub::*method)(grpc::ClientContext*, const Req&, Reply*),
                    const Req& req, Reply* reply, const std::string* token = nullptr) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    proto::add_token(ctx, token ? *token : token_);
    std::shared_ptr<Stub> stub;  // kept alive through the call: start() may replace stub_
    {
      std::lock_guard<std::mutex> lock(stub_mu_);
      stub = stub_;
    }
    return proto::from_grpc((stub.get()->*method)(&ctx, req, reply));
  }

 private:
  fs::path dir_;
  std::vector<std::string> flags_;
  std::string token_, ca_pem_;
  pid_t pid_ = -1;
  std::atomic<int> port_{0};
  std::mutex stub_mu_;
  std::shared_ptr<Stub> stub_;
};

// A worker as the coordinator sees it: it registers, then beats every `interval` on a thread
// (re-registering after NOT_FOUND, as kiln-worker does) until stop().
class FakeWorker {
 public:
  FakeWorker(Daemon& d, std::string id,
             std::chrono::milliseconds interval = std::chrono::milliseconds(100),
             std::string token = "", std::string address = "")
      : d_(d),
        id_(std::move(id)),
        address_(address.empty() ? id_ + ".test:7000" : std::move(address)),
        interval_(interval),
        token_(std::move(token)) {
    EXPECT_TRUE(register_now().ok());
    thread_ = std::thread([this] { beat(); });
  }
  ~FakeWorker() { stop(); }
  void stop() {
    stopped_ = true;
    if (thread_.joinable()) thread_.join();
  }
  absl::Status register_now() {
    proto::RegisterWorkerRequest req;
    req.set_protocol_version(proto::kProtocolVersion);
    req.set_worker_id(id_);
    req.set_address(address_);
    proto::RegisterWorkerReply reply;
    absl::Status st = d_.call(&Stub::RegisterWorker, req, &reply, &token_);
    if (st.ok()) epoch_ = reply.epoch();
    return st;
  }
  uint64_t epoch() const { return epoch_; }
  const std::string& id() const { return id_; }
  // The session a client streams to, listed in the next beats ("" : none), as a real worker does.
  void serve(const std::string& session_id) {
    std::lock_guard lock(mu_);
    serving_ = session_id;
  }

  // One heartbeat as this worker (its id and epoch set here), carrying what `req` holds
  // (collective records, steps, batch results), as kiln-worker's beats do; the reply in `reply`.
  absl::Status beat_once(proto::HeartbeatRequest req, proto::HeartbeatReply* reply = nullptr) const {
    req.set_worker_id(id_);
    req.set_epoch(epoch_);
    proto::HeartbeatReply ignored;
    return d_.call(&Stub::Heartbeat, req, reply ? reply : &ignored, &token_);
  }

 private:
  void beat() {
    while (!stopped_) {
      proto::HeartbeatRequest req;
      {
        std::lock_guard lock(mu_);
        if (!serving_.empty()) req.add_sessions(serving_);
      }
      absl::Status st = beat_once(std::move(req));
      if (absl::IsNotFound(st)) (void)register_now();
      std::this_thread::sleep_for(interval_);
    }
  }

  std::mutex mu_;
  std::string serving_;
  Daemon& d_;
  std::string id_, address_;
  std::chrono::milliseconds interval_;
  std::string token_;
  std::atomic<uint64_t> epoch_{0};
  std::atomic<bool> stopped_{false};
  std::thread thread_;
};

// Polls `cond` until true or `timeout`; returns its last value.
template <typename F>
bool eventually(F cond, std::chrono::milliseconds timeout = std::chrono::seconds(5)) {
  const auto until = Clock::now() + timeout;
  while (!cond()) {
    if (Clock::now() >= until) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return true;
}

// Submits a job (SubmitJob must succeed) and returns it.
inline proto::Job submit(Daemon& d, int workers, int priority = 0,
                         std::vector<std::string> cmd = {"true"}) {
  proto::SubmitJobRequest req;
  req.set_protocol_version(proto::kProtocolVersion);
  req.set_workers(workers);
  req.set_priority(priority);
  for (auto& c : cmd) req.add_command(c);
  proto::Job job;
  EXPECT_TRUE(d.call(&Stub::SubmitJob, req, &job).ok());
  return job;
}

// A job that the coordinator started on a gang of fake workers (submit(), then running).
struct RunningJob {
  proto::Job job;
  std::vector<std::string> ranks;  // worker ids, rank order
};

inline RunningJob start_job(Daemon& d, int workers) {
  RunningJob r;
  const proto::Job submitted = submit(d, workers);
  proto::GetJobRequest get;
  get.set_job_id(submitted.job_id());
  EXPECT_TRUE(eventually(
      [&] { return d.call(&Stub::GetJob, get, &r.job).ok() && r.job.state() == "running"; }));
  proto::LookupSessionRequest look;
  look.set_session_id(r.job.session_id());
  proto::SessionInfo info;
  EXPECT_TRUE(d.call(&Stub::LookupSession, look, &info).ok());
  r.ranks.assign(info.worker_ids().begin(), info.worker_ids().end());
  return r;
}

// The driver's last report: `lines` of log, then its exit code.
inline absl::Status finish_job(Daemon& d, const std::string& job_id, int exit_code,
                               std::vector<std::string> lines = {}) {
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  proto::Job reply;
  auto w = d.stub().ReportJob(&ctx, &reply);
  proto::JobReport r;
  r.set_job_id(job_id);
  for (auto& l : lines) r.add_log_lines(l);
  r.set_finished(true);
  r.set_exit_code(exit_code);
  w->Write(r);
  w->WritesDone();
  return proto::from_grpc(w->Finish());
}

// SubmitJob of `req` must be refused as INVALID_ARGUMENT with a message containing `says`.
inline void expect_refused(Daemon& d, const proto::SubmitJobRequest& req, const std::string& says) {
  proto::Job job;
  const absl::Status st = d.call(&Stub::SubmitJob, req, &job);
  EXPECT_TRUE(absl::IsInvalidArgument(st)) << st;
  EXPECT_NE(st.message().find(says), std::string::npos) << st;
}

inline proto::Job get_job(Daemon& d, const std::string& id) {
  proto::GetJobRequest get;
  get.set_job_id(id);
  proto::Job job;
  EXPECT_TRUE(d.call(&Stub::GetJob, get, &job).ok());
  return job;
}

inline std::vector<std::string> logs(Daemon& d, const std::string& id) {
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  proto::WatchJobRequest req;
  req.set_job_id(id);
  auto reader = d.stub().WatchJob(&ctx, req);
  std::vector<std::string> lines;
  for (proto::JobEvent e; reader->Read(&e);)
    if (!e.has_job()) lines.push_back(e.log_line());
  return lines;
}

// The `kiln` CLI run against `d` (KILN_COORDINATOR set), its output files in `dir`.
struct Cli {
  int status = -1;
  std::string out, err;
};

inline Cli run_kiln(const fs::path& dir, const Daemon& d, std::vector<std::string> args,
                    std::chrono::seconds timeout = std::chrono::seconds(20)) {
  args.insert(args.begin(), KILN_CLI);
  const pid_t pid =
      spawn(args, dir / "cli.out", dir / "cli.err", {"KILN_COORDINATOR=" + d.address()});
  Cli r;
  r.status = wait_for(pid, timeout);
  if (r.status == -1) {
    kill(pid, SIGKILL);
    wait_for(pid, std::chrono::seconds(5));
  }
  r.out = slurp(dir / "cli.out");
  r.err = slurp(dir / "cli.err");
  return r;
}

}  // namespace kiln::test
