// `kiln submit`: queue a job, wait for its gang, then run COMMAND here as the job's driver with
// the session in its environment, streaming its output to the coordinator (ReportJob) and to
// the terminal, and exit with its status. Ctrl-C or SIGTERM cancels the job and stops COMMAND;
// a job cancelled elsewhere stops COMMAND too (the WatchJob stream tells us).
//
// Note [Driver threads]: the main thread relays COMMAND's output; a watcher thread follows the
// job's state; a signal thread turns SIGINT/SIGTERM (caught through a self-pipe, the one
// async-signal-safe route) into CancelJob and a stop of COMMAND's process group.
//
// Note [Driver re-attach]: the coordinator counts a job's driver as alive while one of its
// ReportJob streams is open, and fails the job after --driver-grace-s without one. When the
// stream breaks (a network break, a coordinator restart), the Reporter keeps COMMAND's lines
// (up to kMaxPendingLines) and opens a new stream at the next line or second, so a coordinator
// that comes back within the grace loses neither the job nor its log. A driver that prints
// nothing sends an empty report every second: a broken stream shows only on a write. Lines are
// not acknowledged one by one: those in flight when a coordinator dies are lost.
#include <absl/strings/numbers.h>
#include <absl/strings/str_split.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <deque>
#include <fstream>
#include <mutex>
#include <sstream>
#include <thread>

#include "jobs.h"
#include "kiln/proto/service.h"
#include "run.h"

extern char** environ;

namespace kiln::client {

namespace {

constexpr auto kGrace = std::chrono::seconds(5);  // SIGTERM, then SIGKILL this much later
// A preempted driver's time to checkpoint (the coordinator's --preempt-grace-s default).
constexpr auto kPreemptGrace = std::chrono::seconds(30);
constexpr size_t kMaxPartialLine = 64 << 10;
constexpr size_t kMaxPendingLines = 10000;        // kept while the coordinator is unreachable
constexpr auto kRetry = std::chrono::seconds(1);  // between re-attach attempts
constexpr auto kFinalPatience = std::chrono::seconds(30);  // for the exit code to get through
int g_signal_pipe[2] = {-1, -1};

void on_signal(int sig) {
  const char b = static_cast<char>(sig);
  [[maybe_unused]] auto n = write(g_signal_pipe[1], &b, 1);
}

// Log lines travel as proto3 strings, which must be UTF-8: each byte that does not start a
// well-formed sequence becomes '?', so a binary-spewing driver cannot break its report stream.
std::string utf8_line(const std::string& in) {
  std::string out;
  out.reserve(in.size());
  for (size_t i = 0; i < in.size();) {
    const auto c = static_cast<unsigned char>(in[i]);
    const size_t len = c < 0x80           ? 1
                       : (c >> 5) == 0x6  ? 2
                       : (c >> 4) == 0xe  ? 3
                       : (c >> 3) == 0x1e ? 4
                                          : 0;
    bool ok = len > 0 && i + len <= in.size();
    for (size_t k = 1; ok && k < len; ++k) ok = (static_cast<unsigned char>(in[i + k]) >> 6) == 0x2;
    if (ok && len > 1) {  // no overlong forms, surrogates or code points past U+10FFFF
      uint32_t cp = c & (0xff >> (len + 1));
      for (size_t k = 1; k < len; ++k) cp = (cp << 6) | (in[i + k] & 0x3f);
      ok = cp >= (len == 2   ? 0x80u
                  : len == 3 ? 0x800u
                             : 0x10000u) &&
           cp <= 0x10ffff && !(cp >= 0xd800 && cp <= 0xdfff);
    }
    if (ok) {
      out.append(in, i, len);
      i += len;
    } else {
      out += '?';
      ++i;
    }
  }
  return out;
}

bool terminal(const std::string& state) {
  return state == "succeeded" || state == "failed" || state == "cancelled";
}

// The driver's ReportJob stream, re-attached when it breaks (Note [Driver re-attach]).
class Reporter {
 public:
  // Attaches at once: a driver that prints nothing still counts as alive.
  Reporter(const CoordClient& c, std::string job_id) : c_(c), job_id_(std::move(job_id)) {
    flush(false);
  }

  // Sends `lines` now, or once a stream is up again.
  void lines(std::vector<std::string> lines) {
    for (auto& l : lines) pending_.push_back(std::move(l));
    while (pending_.size() > kMaxPendingLines) {
      pending_.pop_front();
      ++dropped_;
    }
    flush(false);
  }

  // Reports the exit code, retrying for kFinalPatience until the coordinator has answered; the
  // job as it answered (empty when it never did).
  proto::Job finish(int code) {
    const auto until = std::chrono::steady_clock::now() + kFinalPatience;
    while (!ended_) {
      if (flush(true, code) && writer_) {
        writer_->WritesDone();
        last_status_ = writer_->Finish();
        writer_.reset();
        if (last_status_.ok()) return job_;
        next_try_ = std::chrono::steady_clock::now() + kRetry;
      }
      if (ended_ || std::chrono::steady_clock::now() >= until) break;
      std::this_thread::sleep_for(kRetry);
    }
    if (!ended_) {
      std::fprintf(stderr, "kiln: could not report the exit of %s to the coordinator (%s)\n",
                   job_id_.c_str(), last_status_.error_message().c_str());
    }
    return job_;
  }

 private:
  void open() {
    ctx_ = std::make_unique<grpc::ClientContext>();
    c_.prepare(*ctx_, /*follow=*/true);  // no deadline: it lasts as long as COMMAND
    writer_ = c_.stub->ReportJob(ctx_.get(), &job_);
    fresh_ = true;
  }

  // Writes the pending lines (and, with `finished`, the exit code); false if the stream is down.
  bool flush(bool finished, int code = 0) {
    if (ended_) return true;
    if (!writer_) {
      if (std::chrono::steady_clock::now() < next_try_) return false;
      open();
    }
    proto::JobReport msg;
    msg.set_job_id(job_id_);
    if (dropped_ > 0) {
      msg.add_log_lines("[kiln: " + std::to_string(dropped_) +
                        " lines dropped while the coordinator was unreachable]");
    }
    for (const auto& l : pending_) msg.add_log_lines(l);
    msg.set_finished(finished);
    msg.set_exit_code(code);
    // A new stream writes at once, lines or not: its first message attaches it to the job. A
    // quiet one writes an empty message every kRetry, the only way to learn the stream broke.
    const auto now = std::chrono::steady_clock::now();
    if (msg.log_lines_size() == 0 && !finished && !fresh_ && now - last_write_ < kRetry)
      return true;
    if (writer_->Write(msg)) {
      fresh_ = false;
      last_write_ = now;
      pending_.clear();
      dropped_ = 0;
      return true;
    }
    last_status_ = writer_->Finish();  // broken: why, and whether the job ended meanwhile
    writer_.reset();
    ended_ = last_status_.ok() && job_.state() != "running" && !job_.state().empty();
    next_try_ = std::chrono::steady_clock::now() + kRetry;
    return ended_;
  }

  const CoordClient& c_;
  const std::string job_id_;
  std::unique_ptr<grpc::ClientContext> ctx_;
  std::unique_ptr<grpc::ClientWriter<proto::JobReport>> writer_;
  proto::Job job_;
  grpc::Status last_status_;
  std::deque<std::string> pending_;
  size_t dropped_ = 0;
  bool fresh_ = false;  // writer_ has not written yet
  bool ended_ = false;  // the coordinator answered with the job no longer running: stop
  std::chrono::steady_clock::time_point next_try_, last_write_;
};

class Driver {
 public:
  Driver(const CoordClient& c, proto::Job job) : c_(c), job_(std::move(job)) {}

  int run(const std::vector<std::string>& command);

 private:
  bool wait_until_running();
  void follow_job();
  void on_stop_signal(int sig);
  void stop_child(const std::string& why, std::chrono::seconds grace = kGrace);
  pid_t spawn(const std::vector<std::string>& command, int out_fd, int err_fd);
  int relay(int out_fd, int err_fd, Reporter& report);

  const CoordClient& c_;
  proto::Job job_;
  std::unique_ptr<grpc::ClientContext> watch_ctx_;  // a fresh one per run of COMMAND (mu_)
  int runs_ = 0;  // of COMMAND before this one (KILN_RESTARTS): See Note [Preemption]
  std::unique_ptr<grpc::ClientReader<proto::JobEvent>> watch_;
  std::mutex mu_;
  pid_t child_ = 0;  // its process group too; 0 before the spawn and after the reap
  std::atomic<int> stop_signal_{0};
  bool tty_ = isatty(STDERR_FILENO);
};

bool Driver::wait_until_running() {
  proto::WatchJobRequest req;
  req.set_job_id(job_.job_id());
  req.set_follow(true);
  grpc::ClientContext* ctx;
  {
    std::lock_guard lock(mu_);
    watch_ctx_ = std::make_unique<grpc::ClientContext>();
    ctx = watch_ctx_.get();
    if (stop_signal_) return false;
  }
  c_.prepare(*ctx, /*follow=*/true);
  watch_ = c_.stub->WatchJob(ctx, req);
  for (proto::JobEvent e; watch_->Read(&e);) {
    if (!e.has_job()) continue;
    job_ = e.job();
    if ((job_.state() == "queued" || job_.state() == "preempted" ||
         job_.state() == "restarting") &&
        tty_) {
      std::fprintf(stderr, "kiln: %s queued, waiting for %d free worker%s...\n",
                   job_.job_id().c_str(), job_.workers(), job_.workers() == 1 ? "" : "s");
    }
    if (job_.state() == "running" || terminal(job_.state())) return job_.state() == "running";
  }
  if (stop_signal_) return false;
  report_rpc_error(c_, watch_->Finish());
  return false;
}

// The watcher thread: a job that ends while COMMAND runs (cancelled, or its gang lost a worker)
// stops COMMAND.
void Driver::follow_job() {
  for (proto::JobEvent e; watch_->Read(&e);) {
    if (e.has_job() && e.job().preempting()) {  // See Note [Preemption] (coordinator/src/jobs.cpp)
      stop_child("job " + e.job().job_id() + " " + e.job().message() + "; it has " +
                     std::to_string(kPreemptGrace.count()) + " s to checkpoint",
                 kPreemptGrace);
      return;
    }
    if (!e.has_job() || !(terminal(e.job().state()) || e.job().state() == "restarting")) continue;
    const proto::Job& j = e.job();  // a restarting job's COMMAND runs again: Note [Restarts]
    stop_child("job " + j.job_id() + " " + j.state() + (j.message().empty() ? "" : ": ") +
               j.message());
    return;
  }
}

void Driver::stop_child(const std::string& why, std::chrono::seconds grace) {
  std::fprintf(stderr, "kiln: %s; stopping the driver\n", why.c_str());
  {
    std::lock_guard lock(mu_);
    if (child_ > 0) kill(-child_, SIGTERM);
  }
  const auto until = std::chrono::steady_clock::now() + grace;
  while (std::chrono::steady_clock::now() < until) {
    {
      std::lock_guard lock(mu_);
      if (child_ == 0) return;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  std::lock_guard lock(mu_);
  if (child_ > 0) kill(-child_, SIGKILL);
}

void Driver::on_stop_signal(int sig) {
  stop_signal_ = sig;
  grpc::ClientContext ctx;
  c_.prepare(ctx);
  proto::CancelJobRequest req;
  req.set_job_id(job_.job_id());
  proto::Job ignored;
  if (auto st = c_.stub->CancelJob(&ctx, req, &ignored); !st.ok()) report_rpc_error(c_, st);
  {
    std::lock_guard lock(mu_);
    if (child_ == 0) {
      if (watch_ctx_) watch_ctx_->TryCancel();  // still waiting for the gang
      return;
    }
  }
  stop_child(std::string("signal ") + strsignal(sig) + ", job " + job_.job_id() + " cancelled");
}

pid_t Driver::spawn(const std::vector<std::string>& command, int out_fd, int err_fd) {
  std::vector<std::string> env;
  for (char** e = environ; *e; ++e) {
    const std::string kv = *e;
    bool ours = false;
    for (const char* k : {"KILN_COORDINATOR=", "KILN_JOB_ID=", "KILN_SESSION=", "KILN_WORKERS=",
                          "KILN_TOKEN=", "KILN_MESH=", "KILN_RESTARTS=", "KILN_PREEMPT_GRACE_S=",
                          "KILN_CHECKPOINT_DIR=", "KILN_CHECKPOINT_EVERY="}) {
      ours = ours || kv.rfind(k, 0) == 0;
    }
    if (!ours) env.push_back(kv);
  }
  std::string workers;
  for (const auto& a : job_.worker_addresses()) workers += (workers.empty() ? "" : ",") + a;
  env.push_back("KILN_COORDINATOR=" + c_.address);
  env.push_back("KILN_JOB_ID=" + job_.job_id());
  env.push_back("KILN_SESSION=" + job_.session_id());
  env.push_back("KILN_WORKERS=" + workers);
  env.push_back("KILN_RESTARTS=" + std::to_string(runs_));
  env.push_back("KILN_PREEMPT_GRACE_S=" + std::to_string(kPreemptGrace.count()));
  if (!job_.checkpoint_dir().empty()) env.push_back("KILN_CHECKPOINT_DIR=" + job_.checkpoint_dir());
  if (job_.checkpoint_every() > 0)
    env.push_back("KILN_CHECKPOINT_EVERY=" + std::to_string(job_.checkpoint_every()));
  std::string mesh;
  for (const auto& d : job_.mesh())
    mesh += (mesh.empty() ? "" : ",") + d.name() + "=" + std::to_string(d.size());
  if (!mesh.empty()) env.push_back("KILN_MESH=" + mesh);
  if (!c_.token.empty()) env.push_back("KILN_TOKEN=" + c_.token);
  std::vector<char*> envp, argv;
  for (auto& s : env) envp.push_back(s.data());
  envp.push_back(nullptr);
  std::vector<std::string> args = command;
  for (auto& s : args) argv.push_back(s.data());
  argv.push_back(nullptr);

  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, out_fd, STDOUT_FILENO);
  posix_spawn_file_actions_adddup2(&fa, err_fd, STDERR_FILENO);
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  sigset_t none, defaults;
  sigemptyset(&none);
  sigemptyset(&defaults);
  sigaddset(&defaults, SIGINT);
  sigaddset(&defaults, SIGTERM);
  posix_spawnattr_setsigmask(&attr, &none);
  posix_spawnattr_setsigdefault(&attr, &defaults);
  posix_spawnattr_setpgroup(&attr, 0);  // its own group: stop_child reaches its children too
  posix_spawnattr_setflags(&attr,
                           POSIX_SPAWN_SETPGROUP | POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF);
  pid_t pid = 0;
  const int rc = posix_spawnp(&pid, argv[0], &fa, &attr, argv.data(), envp.data());
  posix_spawn_file_actions_destroy(&fa);
  posix_spawnattr_destroy(&attr);
  if (rc != 0) {
    errno = rc;
    return -1;
  }
  return pid;
}

// Copies COMMAND's output to ours and, line by line, to the coordinator, until both pipes close.
int Driver::relay(int out_fd, int err_fd, Reporter& report) {
  struct Stream {
    int fd;
    FILE* to;
    std::string partial;
  };
  Stream streams[2] = {{out_fd, stdout, ""}, {err_fd, stderr, ""}};
  int open = 2;
  while (open > 0) {
    pollfd fds[2];
    for (int i = 0; i < 2; ++i) fds[i] = {streams[i].fd, POLLIN, 0};
    // A second at most between re-attach attempts (Note [Driver re-attach]).
    if (poll(fds, 2, 1000) < 0) {
      if (errno == EINTR) continue;
      break;
    }
    std::vector<std::string> lines;
    for (int i = 0; i < 2; ++i) {
      Stream& s = streams[i];
      if (s.fd < 0 || !(fds[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
      char buf[65536];
      const ssize_t n = read(s.fd, buf, sizeof buf);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        if (!s.partial.empty()) lines.push_back(utf8_line(s.partial));
        s.partial.clear();
        close(s.fd);
        s.fd = -1;
        fds[i].fd = -1;
        --open;
        continue;
      }
      fwrite(buf, 1, n, s.to);
      fflush(s.to);
      s.partial.append(buf, n);
      size_t start = 0;
      for (size_t nl; (nl = s.partial.find('\n', start)) != std::string::npos; start = nl + 1) {
        lines.push_back(utf8_line(s.partial.substr(start, nl - start)));
      }
      s.partial.erase(0, start);
      if (s.partial.size() >= kMaxPartialLine) {  // no newline in sight: send what we have
        lines.push_back(utf8_line(s.partial));
        s.partial.clear();
      }
    }
    report.lines(std::move(lines));
  }
  int status = 0;
  while (waitpid(child_, &status, 0) < 0 && errno == EINTR) {
  }
  {
    std::lock_guard lock(mu_);
    child_ = 0;
  }
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

int Driver::run(const std::vector<std::string>& command) {
  if (pipe(g_signal_pipe) != 0) return 1;
  struct sigaction sa {};
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
  std::thread signals([this] {
    char b = 0;
    while (read(g_signal_pipe[0], &b, 1) < 0 && errno == EINTR) {
    }
    if (b != 0) on_stop_signal(b);
  });
  auto finish = [&](int code) {
    const char zero = 0;  // wakes the signal thread with "no signal"
    [[maybe_unused]] auto n = write(g_signal_pipe[1], &zero, 1);
    signals.join();
    return code;
  };

  for (;; ++runs_) {  // a preempted job runs COMMAND again (See Note [Preemption])
    if (!wait_until_running()) {
      if (stop_signal_) return finish(128 + stop_signal_);
      if (terminal(job_.state())) {
        std::fprintf(stderr, "kiln: job %s %s%s%s\n", job_.job_id().c_str(), job_.state().c_str(),
                     job_.message().empty() ? "" : ": ", job_.message().c_str());
      }
      return finish(1);
    }
    if (tty_) {
      std::fprintf(stderr, "kiln: %s running (session %s)\n", job_.job_id().c_str(),
                   job_.session_id().c_str());
    }
    Reporter report(c_, job_.job_id());
    int out[2], err[2];
    if (pipe2(out, O_CLOEXEC) != 0 || pipe2(err, O_CLOEXEC) != 0) return finish(1);
    int code = 0;
    pid_t pid = -1;
    int spawn_errno = 0;
    {
      std::lock_guard lock(mu_);  // a stop signal either sees the child or prevents it
      if (!stop_signal_) pid = spawn(command, out[1], err[1]);
      spawn_errno = errno;
      if (pid > 0) child_ = pid;
    }
    close(out[1]);
    close(err[1]);
    if (pid < 0) {
      code = stop_signal_ ? 128 + stop_signal_.load() : kExitNotFound;
      if (!stop_signal_) {
        const std::string msg =
            "kiln: cannot run '" + command[0] + "': " + std::strerror(spawn_errno);
        std::fprintf(stderr, "%s\n", msg.c_str());
        report.lines({msg});
      }
      close(out[0]);
      close(err[0]);
    } else {
      std::thread watcher([this] { follow_job(); });
      code = relay(out[0], err[0], report);
      {
        std::lock_guard lock(mu_);
        watch_ctx_->TryCancel();
      }
      watcher.join();
    }
    const proto::Job final_job = report.finish(code);
    if (final_job.state() == "preempted" && !stop_signal_) {
      std::fprintf(stderr, "kiln: %s preempted; COMMAND runs again when workers free up\n",
                   job_.job_id().c_str());
      continue;
    }
    // Restarting, or already running again on a new gang (a job that grows restarts at once:
    // Note [Growing back] in coordinator/src/jobs.cpp).
    const bool again =
        final_job.state() == "restarting" ||
        (final_job.state() == "running" && final_job.session_id() != job_.session_id());
    if (again && !stop_signal_) {  // See Note [Restarts]
      std::fprintf(stderr, "kiln: %s restarting (%s)\n", job_.job_id().c_str(),
                   final_job.message().c_str());
      continue;
    }
    if (tty_) {
      std::fprintf(stderr, "kiln: %s %s\n", job_.job_id().c_str(),
                   final_job.state().empty() ? "finished" : final_job.state().c_str());
    }
    return finish(code);
  }
}

// A batch job runs with no client (Note [Batch jobs] in worker/src/batch.h): `kiln submit` only
// follows it, printing its log, and exits 0 when it succeeded. Stopping it leaves the job running.
int follow_batch(const CoordClient& c, const proto::Job& submitted) {
  proto::WatchJobRequest req;
  req.set_job_id(submitted.job_id());
  req.set_follow(true);
  grpc::ClientContext ctx;
  c.prepare(ctx, /*follow=*/true);
  auto reader = c.stub->WatchJob(&ctx, req);
  proto::Job job = submitted;
  for (proto::JobEvent e; reader->Read(&e);) {
    if (e.has_job())
      job = e.job();
    else
      std::printf("%s\n", e.log_line().c_str());
    std::fflush(stdout);
  }
  if (auto st = reader->Finish(); !st.ok()) return report_rpc_error(c, st);
  std::fprintf(stderr, "kiln: %s %s%s%s\n", job.job_id().c_str(), job.state().c_str(),
               job.message().empty() ? "" : ": ", job.message().c_str());
  return job.state() == "succeeded" ? 0 : 1;
}

}  // namespace

int submit_main(const CoordClient& c, const std::vector<std::string>& args) {
  proto::SubmitJobRequest req;
  req.set_protocol_version(kiln::proto::kProtocolVersion);
  req.set_workers(1);
  std::vector<std::string> command;
  bool workers_given = false, detach = false;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a == "--") {
      command.assign(args.begin() + i + 1, args.end());
      break;
    }
    auto number = [&](auto set) -> bool {
      if (i + 1 >= args.size()) return false;
      try {
        size_t used = 0;
        const int v = std::stoi(args[i + 1], &used);
        if (used != args[i + 1].size()) return false;
        set(v);
        ++i;
        return true;
      } catch (const std::exception&) {
        return false;
      }
    };
    if (a == "--workers") {
      workers_given = true;
      if (!number([&](int v) { req.set_workers(v); })) {
        std::fprintf(stderr, "kiln: --workers needs an integer\n");
        return kExitUsage;
      }
    } else if (a == "--mesh") {
      // "dp=2,tp=2": outermost dim first; the workers are the product (Note [Placement] in
      // coordinator/src/jobs.cpp).
      if (i + 1 >= args.size()) {
        std::fprintf(stderr, "kiln: --mesh needs NAME=SIZE[,NAME=SIZE...]\n");
        return kExitUsage;
      }
      int64_t product = 1;
      for (const std::string& dim : std::vector<std::string>(absl::StrSplit(args[++i], ','))) {
        const size_t eq = dim.find('=');
        int size = 0;
        if (eq == std::string::npos || eq == 0 || !absl::SimpleAtoi(dim.substr(eq + 1), &size) ||
            size < 1) {
          std::fprintf(stderr, "kiln: --mesh takes NAME=SIZE[,NAME=SIZE...], got '%s'\n",
                       args[i].c_str());
          return kExitUsage;
        }
        proto::MeshDim& d = *req.add_mesh();
        d.set_name(dim.substr(0, eq));
        d.set_size(size);
        product = std::min<int64_t>(product * size, int64_t{1} << 20);  // the coordinator checks
      }
      if (!workers_given) req.set_workers(static_cast<int>(product));
    } else if (a == "--priority") {
      if (!number([&](int v) { req.set_priority(v); })) {
        std::fprintf(stderr, "kiln: --priority needs an integer\n");
        return kExitUsage;
      }
    } else if (a == "--max-workers") {  // the gang's size, as --workers
      workers_given = true;
      if (!number([&](int v) { req.set_workers(v); })) {
        std::fprintf(stderr, "kiln: --max-workers needs an integer\n");
        return kExitUsage;
      }
    } else if (a == "--min-workers" || a == "--max-restarts" || a == "--checkpoint-every") {
      // See Note [Restarts] (coordinator/src/jobs.cpp); the coordinator checks the ranges.
      const bool ok = number([&](int v) {
        if (a == "--min-workers") req.set_min_workers(v);
        if (a == "--max-restarts") req.set_max_restarts(v);
        if (a == "--checkpoint-every") req.set_checkpoint_every(v);
      });
      if (!ok) {
        std::fprintf(stderr, "kiln: %s needs an integer\n", a.c_str());
        return kExitUsage;
      }
    } else if (a == "--batch") {  // See Note [Batch jobs] in worker/src/batch.h
      std::ifstream in(i + 1 < args.size() ? args[i + 1] : "", std::ios::binary);
      std::stringstream bytes;
      bytes << in.rdbuf();
      if (!in || bytes.str().empty()) {
        std::fprintf(stderr, "kiln: --batch needs a batch job spec file (kiln.batch.save_job)%s%s\n",
                     i + 1 < args.size() ? ": cannot read " : "",
                     i + 1 < args.size() ? args[i + 1].c_str() : "");
        return kExitUsage;
      }
      req.set_batch(bytes.str());
      ++i;
    } else if (a == "--detach") {
      detach = true;
    } else if (a == "--checkpoint-dir") {
      if (i + 1 >= args.size() || args[i + 1].empty()) {
        std::fprintf(stderr, "kiln: --checkpoint-dir needs a directory\n");
        return kExitUsage;
      }
      req.set_checkpoint_dir(args[++i]);
    } else if (!a.empty() && a[0] != '-') {
      command.assign(args.begin() + i, args.end());
      break;
    } else {
      std::fprintf(stderr, "kiln: unknown flag '%s' for kiln submit\n", a.c_str());
      return kExitUsage;
    }
  }
  if (command.empty() == req.batch().empty()) {
    std::fprintf(stderr, "kiln: kiln submit needs a COMMAND (kiln submit --workers N -- CMD...) "
                         "or a batch job (--batch SPEC), not both\n");
    return kExitUsage;
  }
  for (const auto& w : command) req.add_command(w);
  grpc::ClientContext ctx;
  c.prepare(ctx);
  proto::Job job;
  if (auto st = c.stub->SubmitJob(&ctx, req, &job); !st.ok()) return report_rpc_error(c, st);
  if (c.json) {
    std::fprintf(stderr, "{\"job_id\":\"%s\",\"state\":\"%s\"}\n", job.job_id().c_str(),
                 job.state().c_str());
  } else {
    std::fprintf(stderr, "kiln: submitted %s\n", job.job_id().c_str());
  }
  if (!req.batch().empty()) return detach ? 0 : follow_batch(c, job);
  Driver driver(c, job);
  return driver.run(command);
}

}  // namespace kiln::client
