// `kiln run`'s supervisor (client/cli/run.h): spawns the ranks, relays their output line by line
// with a rank prefix, and stops them all on the first failure or a signal.
//
// Note [Launcher processes]: ranks are started with posix_spawnp (never fork + more C++ in the
// child), each as the leader of its own process group, so that a signal sent to -pid reaches
// the whole tree a rank started (a shell script's children too), and a Ctrl-C at the terminal
// reaches only the launcher, which forwards it. The launcher waits on one poll() over the
// ranks' stdout/stderr pipes and a self-pipe that its signal handlers (SIGCHLD, SIGINT, SIGTERM,
// SIGHUP) write to. A rank's pipes are drained and closed when the rank is reaped, so an
// orphaned grandchild holding them open cannot keep the launcher alive (such orphans of a rank
// that exited are left alone, as torchrun leaves them).
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <optional>
#include <string>
#include <string_view>
#include <thread>

#include "run.h"

extern char** environ;

namespace kiln::client {
namespace {

using Clock = std::chrono::steady_clock;

Clock::duration seconds(double s) {
  return std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(s));
}

constexpr size_t kMaxLine = 64 * 1024;  // a longer line is relayed in pieces of this size

int g_signal_pipe_write = -1;

void on_signal(int sig) {
  const int saved = errno;
  const unsigned char byte = static_cast<unsigned char>(sig);
  [[maybe_unused]] ssize_t n = write(g_signal_pipe_write, &byte, 1);
  errno = saved;
}

std::string signal_name(int sig) {
  const char* abbrev = sigabbrev_np(sig);
  return abbrev ? "SIG" + std::string(abbrev) : "signal " + std::to_string(sig);
}

void write_all(int fd, std::string_view s) {
  while (!s.empty()) {
    const ssize_t n = write(fd, s.data(), s.size());
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;  // e.g. EPIPE: our reader went away; the ranks keep running
    s.remove_prefix(static_cast<size_t>(n));
  }
}

void say(const std::string& message) { write_all(2, "kiln run: " + message + "\n"); }

// One of a rank's output pipes, relayed to the launcher's `out_fd` a line at a time.
struct Stream {
  int fd = -1;
  int out_fd = 1;
  std::string prefix;
  std::string pending;  // a partial line
  bool ready = false;   // poll() saw it readable (or hung up)

  void emit(std::string_view line) {
    std::string out = prefix;
    out.append(line);
    out.push_back('\n');
    write_all(out_fd, out);  // one write per line keeps ranks' lines whole
  }
  // Relays what the pipe holds; returns the bytes read: 0 at end of file (the stream is then
  // closed), -1 when nothing is there yet.
  ssize_t read_some() {
    char buf[16384];
    const ssize_t n = read(fd, buf, sizeof buf);
    if (n < 0 && (errno == EAGAIN || errno == EINTR)) return -1;
    if (n <= 0) {
      close_stream();
      return 0;
    }
    pending.append(buf, static_cast<size_t>(n));
    size_t start = 0;
    for (size_t nl; (nl = pending.find('\n', start)) != std::string::npos; start = nl + 1)
      emit(std::string_view(pending).substr(start, nl - start));
    pending.erase(0, start);
    for (; pending.size() >= kMaxLine; pending.erase(0, kMaxLine))
      emit(std::string_view(pending).substr(0, kMaxLine));
    return n;
  }
  // Relays what the pipe holds, then closes it. At most 256 KiB, four times a pipe's default
  // capacity: enough for all that an exited rank wrote, and finite even when an orphan it left
  // behind keeps writing.
  void drain() {
    for (int i = 0; i < 16 && fd >= 0 && read_some() > 0; ++i) {
    }
    close_stream();
  }
  void close_stream() {
    if (!pending.empty()) emit(pending);  // the partial last line
    pending.clear();
    if (fd >= 0) close(fd);
    fd = -1;
  }
};

struct Rank {
  pid_t pid = -1;  // also its process group (Note [Launcher processes])
  bool running = false;
  Stream out, err;
};

// The CPUs this process may run on.
std::vector<int> usable_cpus() {
  cpu_set_t set;
  std::vector<int> cpus;
  if (sched_getaffinity(0, sizeof set, &set) == 0)
    for (int c = 0; c < CPU_SETSIZE; ++c)
      if (CPU_ISSET(c, &set)) cpus.push_back(c);
  if (cpus.empty())
    for (unsigned c = 0; c < std::max(1u, std::thread::hardware_concurrency()); ++c)
      cpus.push_back(static_cast<int>(c));
  return cpus;
}

int usable_cores() { return static_cast<int>(usable_cpus().size()); }

// Note [Rank places]: with OMP_PROC_BIND set (and no OMP_PLACES), OpenMP pins every rank's
// threads from the first CPU on, so all ranks would share the same cores. Each rank gets its own
// slice of the usable CPUs instead (wrapping when there are fewer CPUs than threads).
std::optional<std::string> rank_places(int rank, int nproc) {
  const char* bind = std::getenv("OMP_PROC_BIND");
  if (!bind || std::string_view(bind) == "false" || std::getenv("OMP_PLACES")) return std::nullopt;
  const std::vector<int> cpus = usable_cpus();
  const int per_rank = std::max(1, static_cast<int>(cpus.size()) / nproc);
  std::string places;
  for (int i = 0; i < per_rank; ++i) {
    if (i) places += ',';
    places += '{' + std::to_string(cpus[static_cast<size_t>(rank * per_rank + i) % cpus.size()]) + '}';
  }
  return places;
}

// Binds port 0 on loopback and returns the port the kernel chose (torchrun does the same; rank
// 0's store binds it moments later).
int pick_free_port() {
  const int s = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (s < 0) return -1;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof addr;
  int port = -1;
  if (bind(s, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0 &&
      getsockname(s, reinterpret_cast<sockaddr*>(&addr), &len) == 0)
    port = ntohs(addr.sin_port);
  close(s);
  return port;
}

// The launcher's environment, minus the launch contract's keys, plus OMP_NUM_THREADS.
std::vector<std::string> base_environment(int nproc) {
  static const char* const kContract[] = {
      "RANK=", "LOCAL_RANK=", "WORLD_SIZE=", "LOCAL_WORLD_SIZE=", "MASTER_ADDR=", "MASTER_PORT="};
  std::vector<std::string> env;
  for (char** e = environ; *e; ++e) {
    const std::string_view kv(*e);
    if (std::none_of(std::begin(kContract), std::end(kContract),
                     [&](const char* k) { return kv.starts_with(k); }))
      env.emplace_back(kv);
  }
  if (!std::getenv("OMP_NUM_THREADS"))
    env.push_back("OMP_NUM_THREADS=" + std::to_string(std::max(1, usable_cores() / nproc)));
  return env;
}

std::vector<char*> c_strings(std::vector<std::string>& v) {
  std::vector<char*> out;
  for (std::string& s : v) out.push_back(s.data());
  out.push_back(nullptr);
  return out;
}

class Job {
 public:
  // `signal_pipe` is the read end of the pipe that the signal handlers write to.
  Job(const RunOptions& o, int port, int signal_pipe)
      : o_(o), port_(port), signal_pipe_(signal_pipe), ranks_(static_cast<size_t>(o.nproc)) {}

  int run() {
    start_ = Clock::now();
    for (int r = 0; r < o_.nproc && !exit_status_; ++r) spawn(r);
    while (running() > 0) {
      wait_for_events();
      handle_signals();
      for (Rank& rank : ranks_)
        for (Stream* s : {&rank.out, &rank.err})
          if (s->fd >= 0 && s->ready) s->read_some();
      reap();
      check_deadlines();
    }
    return exit_status_.value_or(0);
  }

 private:
  void spawn(int r) {
    Rank& rank = ranks_[static_cast<size_t>(r)];
    int out[2], err[2];
    if (pipe2(out, O_CLOEXEC) != 0) {
      say("cannot create pipes for rank " + std::to_string(r) + ": " + std::strerror(errno));
      fail(1);
      return;
    }
    if (pipe2(err, O_CLOEXEC) != 0) {
      close(out[0]);
      close(out[1]);
      say("cannot create pipes for rank " + std::to_string(r) + ": " + std::strerror(errno));
      fail(1);
      return;
    }
    std::vector<std::string> env = base_environment(o_.nproc);
    for (const auto& [k, v] : {std::pair<const char*, std::string>{"RANK", std::to_string(r)},
                               {"LOCAL_RANK", std::to_string(r)},
                               {"WORLD_SIZE", std::to_string(o_.nproc)},
                               {"LOCAL_WORLD_SIZE", std::to_string(o_.nproc)},
                               {"MASTER_ADDR", "127.0.0.1"},
                               {"MASTER_PORT", std::to_string(port_)}})
      env.push_back(std::string(k) + "=" + v);
    if (auto places = rank_places(r, o_.nproc)) env.push_back("OMP_PLACES=" + *places);
    std::vector<std::string> argv_strings = o_.command;
    std::vector<char*> argv = c_strings(argv_strings), envp = c_strings(env);

    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0);
    posix_spawn_file_actions_adddup2(&actions, out[1], 1);
    posix_spawn_file_actions_adddup2(&actions, err[1], 2);
    posix_spawnattr_t attr;
    posix_spawnattr_init(&attr);
    posix_spawnattr_setpgroup(&attr, 0);
    sigset_t defaults, mask;
    sigemptyset(&defaults);
    for (int sig : {SIGCHLD, SIGINT, SIGTERM, SIGHUP, SIGPIPE}) sigaddset(&defaults, sig);
    sigemptyset(&mask);
    posix_spawnattr_setsigdefault(&attr, &defaults);
    posix_spawnattr_setsigmask(&attr, &mask);
    posix_spawnattr_setflags(
        &attr, POSIX_SPAWN_SETPGROUP | POSIX_SPAWN_SETSIGDEF | POSIX_SPAWN_SETSIGMASK);
    pid_t pid = -1;
    const int rc = posix_spawnp(&pid, argv[0], &actions, &attr, argv.data(), envp.data());
    posix_spawn_file_actions_destroy(&actions);
    posix_spawnattr_destroy(&attr);
    close(out[1]);
    close(err[1]);
    if (rc != 0) {
      close(out[0]);
      close(err[0]);
      say("cannot start '" + o_.command[0] + "' for rank " + std::to_string(r) + ": " +
          std::strerror(rc));
      fail(rc == ENOENT ? kExitNotFound : kExitCannotRun);
      return;
    }
    rank.pid = pid;
    rank.running = true;
    const std::string prefix = "[rank " + std::to_string(r) + "] ";
    rank.out = Stream{out[0], 1, prefix, {}};
    rank.err = Stream{err[0], 2, prefix, {}};
    fcntl(out[0], F_SETFL, O_NONBLOCK);
    fcntl(err[0], F_SETFL, O_NONBLOCK);
  }

  int running() const {
    return static_cast<int>(
        std::count_if(ranks_.begin(), ranks_.end(), [](const Rank& r) { return r.running; }));
  }

  // Records the job's exit status (the first one wins) and stops the ranks.
  void fail(int status) {
    if (!exit_status_) exit_status_ = status;
    stop(SIGTERM);
  }

  // Sends `sig` to the process group of every rank not yet reaped (a reaped rank's pid may name
  // someone else's group by now); the first stop also arms the SIGKILL deadline.
  void stop(int sig) {
    if (!kill_at_) kill_at_ = Clock::now() + seconds(o_.grace_s);
    for (const Rank& r : ranks_)
      if (r.running) kill(-r.pid, sig);
  }

  void wait_for_events() {
    std::vector<pollfd> fds{{signal_pipe_, POLLIN, 0}};
    std::vector<Stream*> streams;
    for (Rank& rank : ranks_)
      for (Stream* s : {&rank.out, &rank.err}) {
        s->ready = false;
        if (s->fd < 0) continue;
        fds.push_back({s->fd, POLLIN, 0});
        streams.push_back(s);
      }
    int timeout_ms = -1;
    auto until = [&](Clock::time_point t) {
      const auto ms = std::chrono::ceil<std::chrono::milliseconds>(t - Clock::now()).count();
      const int clamped = static_cast<int>(std::clamp<long long>(ms, 0, 60'000));
      timeout_ms = timeout_ms < 0 ? clamped : std::min(timeout_ms, clamped);
    };
    if (kill_at_ && !killed_) until(*kill_at_);
    if (o_.timeout_s && !kill_at_) until(start_ + seconds(*o_.timeout_s));
    if (poll(fds.data(), fds.size(), timeout_ms) <= 0) return;  // a timeout, or EINTR
    for (size_t i = 0; i < streams.size(); ++i) streams[i]->ready = fds[i + 1].revents != 0;
  }

  void handle_signals() {
    unsigned char sigs[64];
    ssize_t n;
    while ((n = read(signal_pipe_, sigs, sizeof sigs)) > 0) {
      for (ssize_t i = 0; i < n; ++i) {
        const int sig = sigs[i];
        if (sig == SIGCHLD) continue;  // reap() looks at every rank anyway
        if (received_signal_) {
          say("received " + signal_name(sig) + " again; sending SIGKILL to the ranks");
          stop(SIGKILL);
          killed_ = true;
          continue;
        }
        say("received " + signal_name(sig) + "; forwarding it to the ranks");
        received_signal_ = true;
        if (!exit_status_) exit_status_ = 128 + sig;
        stop(sig);
      }
    }
  }

  void reap() {
    for (size_t r = 0; r < ranks_.size(); ++r) {
      Rank& rank = ranks_[r];
      int status = 0;
      if (!rank.running || waitpid(rank.pid, &status, WNOHANG) != rank.pid) continue;
      rank.running = false;
      rank.out.drain();
      rank.err.drain();
      if (exit_status_) continue;  // stopping already: this exit is not the first failure
      const bool others = running() > 0;
      const std::string who =
          "rank " + std::to_string(r) + " (pid " + std::to_string(rank.pid) + ")";
      const std::string then = others ? "; stopping the other ranks" : "";
      if (WIFEXITED(status) && WEXITSTATUS(status) != 0) {
        say(who + " exited with code " + std::to_string(WEXITSTATUS(status)) + then);
        fail(WEXITSTATUS(status));
      } else if (WIFSIGNALED(status)) {
        say(who + " was killed by " + signal_name(WTERMSIG(status)) + then);
        fail(128 + WTERMSIG(status));
      }
    }
  }

  void check_deadlines() {
    const auto now = Clock::now();
    if (o_.timeout_s && !kill_at_ && now >= start_ + seconds(*o_.timeout_s)) {
      char buf[64];
      std::snprintf(buf, sizeof buf, "%g", *o_.timeout_s);
      say(std::string("the job ran past --timeout ") + buf + " s; stopping the ranks");
      fail(kExitTimeout);
    }
    if (kill_at_ && !killed_ && now >= *kill_at_ && running() > 0) {
      std::string left;
      for (size_t r = 0; r < ranks_.size(); ++r)
        if (ranks_[r].running) left += (left.empty() ? "" : ", ") + std::to_string(r);
      say("rank(s) " + left + " still running after the grace period; sending SIGKILL");
      stop(SIGKILL);
      killed_ = true;
    }
  }

  const RunOptions& o_;
  const int port_;
  const int signal_pipe_;
  std::vector<Rank> ranks_;
  Clock::time_point start_;
  std::optional<int> exit_status_;
  std::optional<Clock::time_point> kill_at_;  // set once the ranks are being stopped
  bool killed_ = false;                       // SIGKILL sent
  bool received_signal_ = false;
};

}  // namespace

int launch(const RunOptions& options) {
  const int port = options.master_port ? *options.master_port : pick_free_port();
  if (port <= 0) {
    say(std::string("cannot find a free loopback port: ") + std::strerror(errno));
    return 1;
  }
  int sig_pipe[2];
  if (pipe2(sig_pipe, O_CLOEXEC | O_NONBLOCK) != 0) {
    say(std::string("cannot create a pipe: ") + std::strerror(errno));
    return 1;
  }
  g_signal_pipe_write = sig_pipe[1];
  struct sigaction sa {};
  sa.sa_handler = on_signal;
  sa.sa_flags = SA_RESTART | SA_NOCLDSTOP;
  sigemptyset(&sa.sa_mask);
  for (int sig : {SIGCHLD, SIGINT, SIGTERM, SIGHUP}) sigaction(sig, &sa, nullptr);
  signal(SIGPIPE, SIG_IGN);  // a closed stdout must not kill the launcher before its ranks

  return Job(options, port, sig_pipe[0]).run();
}

}  // namespace kiln::client
