// `kiln run` (client/cli/run.h), driven as a program: small shell ranks check the launch
// environment, the rank prefixes, the exit status of the first failure and the stopping of the
// other ranks, signal forwarding, and the errors for bad flags and missing programs.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sched.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

extern char** environ;

namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

struct Result {
  int status = -1;  // the exit code, or 128 + signal
  std::string out, err;
  double seconds = 0;
};

std::string read_file(const fs::path& p) {
  std::ifstream f(p);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

std::vector<std::string> lines_of(const std::string& s) {
  std::vector<std::string> out;
  std::istringstream in(s);
  for (std::string line; std::getline(in, line);) out.push_back(line);
  return out;
}

bool process_exists(pid_t pid) { return kill(pid, 0) == 0 || errno != ESRCH; }

class KilnRun : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = (fs::temp_directory_path() / "kiln_cli_XXXXXX").string();
    ASSERT_NE(mkdtemp(tmpl.data()), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override { fs::remove_all(dir_); }

  // Starts `kiln ARGS` with stdout and stderr in files; the launcher's environment is ours
  // without OMP_NUM_THREADS, plus `env`.
  pid_t start(const std::vector<std::string>& args, const std::vector<std::string>& env = {}) {
    std::vector<std::string> argv_s{KILN_CLI};
    argv_s.insert(argv_s.end(), args.begin(), args.end());
    std::vector<std::string> env_s;
    for (char** e = environ; *e; ++e)
      if (!std::string_view(*e).starts_with("OMP_NUM_THREADS=")) env_s.emplace_back(*e);
    env_s.insert(env_s.end(), env.begin(), env.end());
    auto c_strs = [](std::vector<std::string>& v) {
      std::vector<char*> out;
      for (auto& s : v) out.push_back(s.data());
      out.push_back(nullptr);
      return out;
    };
    std::vector<char*> argv = c_strs(argv_s), envp = c_strs(env_s);
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    const std::string out = (dir_ / "out").string(), err = (dir_ / "err").string();
    posix_spawn_file_actions_addopen(&fa, 1, out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    posix_spawn_file_actions_addopen(&fa, 2, err.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    pid_t pid = -1;
    EXPECT_EQ(posix_spawn(&pid, argv[0], &fa, nullptr, argv.data(), envp.data()), 0);
    posix_spawn_file_actions_destroy(&fa);
    started_ = Clock::now();
    return pid;
  }

  // Waits for the launcher (killing it after `limit_s`, which fails the test).
  Result finish(pid_t pid, double limit_s = 20) {
    Result r;
    int status = 0;
    while (waitpid(pid, &status, WNOHANG) == 0) {
      if (Clock::now() - started_ > std::chrono::duration<double>(limit_s)) {
        ADD_FAILURE() << "kiln run still running after " << limit_s << " s; killing it";
        kill(pid, SIGKILL);
        waitpid(pid, &status, 0);
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    r.seconds = std::chrono::duration<double>(Clock::now() - started_).count();
    r.status = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    r.out = read_file(dir_ / "out");
    r.err = read_file(dir_ / "err");
    return r;
  }

  Result kiln(const std::vector<std::string>& args, const std::vector<std::string>& env = {}) {
    return finish(start(args, env));
  }

  // Waits until the ranks have written their pids into dir/pid.<rank>.
  std::vector<pid_t> wait_for_pids(int n) {
    std::vector<pid_t> pids;
    for (int tries = 0; tries < 2000 && static_cast<int>(pids.size()) < n; ++tries) {
      pids.clear();
      for (int r = 0; r < n; ++r) {
        const std::string s = read_file(dir_ / ("pid." + std::to_string(r)));
        if (s.empty() || s.back() != '\n') break;
        pids.push_back(std::stoi(s));
      }
      if (static_cast<int>(pids.size()) < n)
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    EXPECT_EQ(static_cast<int>(pids.size()), n) << "the ranks did not start";
    return pids;
  }

  // A shell command for the ranks: `script` runs in dir_.
  std::vector<std::string> sh(const std::string& script) {
    return {"sh", "-c", "cd '" + dir_.string() + "' && " + script};
  }
  std::vector<std::string> run_args(std::vector<std::string> flags, const std::string& script) {
    flags.insert(flags.begin(), "run");
    for (auto& w : sh(script)) flags.push_back(w);
    return flags;
  }

  fs::path dir_;
  Clock::time_point started_;
};

TEST_F(KilnRun, Help) {
  Result r = kiln({"--help"});
  EXPECT_EQ(r.status, 0);
  EXPECT_NE(r.out.find("usage: kiln <command>"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("run "), std::string::npos) << r.out;

  r = kiln({"run", "--help"});
  EXPECT_EQ(r.status, 0);
  for (const char* flag : {"--nproc N", "--master-port P", "--timeout S", "--grace-period S"})
    EXPECT_NE(r.out.find(flag), std::string::npos) << flag << "\n" << r.out;

  r = kiln({});
  EXPECT_EQ(r.status, 2);
  EXPECT_NE(r.err.find("usage: kiln <command>"), std::string::npos) << r.err;

  r = kiln({"frob"});
  EXPECT_EQ(r.status, 2);
  EXPECT_NE(r.err.find("kiln: unknown command 'frob'"), std::string::npos) << r.err;
}

TEST_F(KilnRun, BadFlags) {
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{"--nproc", "0", "true"}, "--nproc expects an integer in [1, 256], got '0'"},
      {{"--nproc=abc", "true"}, "--nproc expects an integer in [1, 256], got 'abc'"},
      {{"--nproc", "2x", "true"}, "got '2x'"},
      {{"--master-port", "70000", "true"}, "--master-port expects a port in [1, 65535]"},
      {{"--timeout", "-1", "true"}, "--timeout expects seconds > 0, got '-1'"},
      {{"--timeout=0", "true"}, "--timeout expects seconds > 0, got '0'"},
      {{"--grace-period", "nan", "true"}, "--grace-period expects seconds >= 0"},
      {{"--bogus", "true"}, "unknown option '--bogus'"},
      {{"--nproc"}, "--nproc expects a value"},
      {{"--nproc", "2"}, "missing PROGRAM"},
      {{}, "missing PROGRAM"},
  };
  for (const auto& [flags, message] : cases) {
    std::vector<std::string> args{"run"};
    args.insert(args.end(), flags.begin(), flags.end());
    Result r = kiln(args);
    EXPECT_EQ(r.status, 2) << message;
    EXPECT_TRUE(r.err.starts_with("kiln run: ")) << r.err;
    EXPECT_NE(r.err.find(message), std::string::npos) << r.err;
    EXPECT_NE(r.err.find("(see kiln run --help)"), std::string::npos) << r.err;
    EXPECT_EQ(r.out, "");
  }
}

TEST_F(KilnRun, MissingProgram) {
  Result r = kiln({"run", "--nproc", "2", "/nonexistent/prog", "x"});
  EXPECT_EQ(r.status, 127);
  EXPECT_NE(r.err.find("kiln run: cannot start '/nonexistent/prog' for rank 0: No such file"),
            std::string::npos)
      << r.err;

  r = kiln({"run", "kiln-no-such-program-on-path"});
  EXPECT_EQ(r.status, 127);
  EXPECT_NE(r.err.find("cannot start 'kiln-no-such-program-on-path'"), std::string::npos) << r.err;

  const fs::path plain = dir_ / "not_executable";
  std::ofstream(plain) << "echo hi\n";
  r = kiln({"run", "--nproc", "2", plain.string()});
  EXPECT_EQ(r.status, 126);
  EXPECT_NE(r.err.find("Permission denied"), std::string::npos) << r.err;
}

int usable_cores() {
  cpu_set_t set;
  EXPECT_EQ(sched_getaffinity(0, sizeof set, &set), 0);
  return CPU_COUNT(&set);
}

TEST_F(KilnRun, EnvironmentPerRank) {
  // A RANK in the launcher's own environment must not leak into the ranks.
  Result r = kiln(run_args({"--nproc", "3"},
                           "echo \"$RANK $LOCAL_RANK $WORLD_SIZE $LOCAL_WORLD_SIZE $MASTER_ADDR "
                           "$MASTER_PORT $OMP_NUM_THREADS\""),
                  {"RANK=99", "WORLD_SIZE=99"});
  ASSERT_EQ(r.status, 0) << r.err;
  std::map<int, std::string> by_rank;
  int port = -1;
  for (const std::string& line : lines_of(r.out)) {
    int rank, rank2, local, world, local_world, p, omp;
    char addr[64];
    ASSERT_EQ(std::sscanf(line.c_str(), "[rank %d] %d %d %d %d %63s %d %d", &rank, &rank2, &local,
                          &world, &local_world, addr, &p, &omp),
              8)
        << line;
    EXPECT_EQ(rank2, rank);
    EXPECT_EQ(local, rank);
    EXPECT_EQ(world, 3);
    EXPECT_EQ(local_world, 3);
    EXPECT_STREQ(addr, "127.0.0.1");
    EXPECT_GT(p, 0);
    if (port < 0) port = p;
    EXPECT_EQ(p, port) << "every rank sees the same MASTER_PORT";
    EXPECT_EQ(omp, std::max(1, usable_cores() / 3));
    by_rank[rank] = line;
  }
  EXPECT_EQ(by_rank.size(), 3u) << r.out;
  EXPECT_EQ(r.err, "");
}

TEST_F(KilnRun, GivenPortAndThreadsAreKept) {
  Result r =
      kiln(run_args({"--nproc=2", "--master-port=29517"}, "echo $MASTER_PORT $OMP_NUM_THREADS"),
           {"OMP_NUM_THREADS=7"});
  ASSERT_EQ(r.status, 0) << r.err;
  auto lines = lines_of(r.out);
  std::sort(lines.begin(), lines.end());
  EXPECT_EQ(lines, (std::vector<std::string>{"[rank 0] 29517 7", "[rank 1] 29517 7"}));
}

// Under OMP_PROC_BIND each rank gets its own CPUs, not all the first one
// (See Note [Rank places] in client/cli/launch.cpp).
TEST_F(KilnRun, BoundRanksGetTheirOwnPlaces) {
  Result r = kiln(run_args({"--nproc=2"}, "echo \"$OMP_PLACES\""), {"OMP_PROC_BIND=close"});
  ASSERT_EQ(r.status, 0) << r.err;
  auto lines = lines_of(r.out);
  ASSERT_EQ(lines.size(), 2u) << r.out;
  std::sort(lines.begin(), lines.end());
  EXPECT_TRUE(lines[0].starts_with("[rank 0] {")) << lines[0];
  if (std::thread::hardware_concurrency() > 1) {
    EXPECT_NE(lines[0].substr(9), lines[1].substr(9)) << r.out;
  }
  Result unbound = kiln(run_args({"--nproc=2"}, "echo \"<$OMP_PLACES>\""));
  EXPECT_EQ(lines_of(unbound.out).front().substr(9), "<>") << unbound.out;
}

TEST_F(KilnRun, ArgumentsPassVerbatim) {
  Result r = kiln({"run", "--", "sh", "-c", "for a in \"$@\"; do echo \"<$a>\"; done", "sh", "a b",
                   "", "\"q\"", "--nproc"});
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(r.out, "[rank 0] <a b>\n[rank 0] <>\n[rank 0] <\"q\">\n[rank 0] <--nproc>\n");
}

TEST_F(KilnRun, PrefixesStdoutAndStderrLines) {
  Result r = kiln(run_args({"--nproc", "2"},
                           "printf 'one\\ntwo\\n'; printf 'e1\\n' >&2; printf 'tail'; "
                           "printf 'etail' >&2"));
  ASSERT_EQ(r.status, 0) << r.err;
  for (int rank = 0; rank < 2; ++rank) {
    const std::string p = "[rank " + std::to_string(rank) + "] ";
    for (const char* line : {"one", "two", "tail"})
      EXPECT_NE(r.out.find(p + line + "\n"), std::string::npos) << p << line << "\n" << r.out;
    EXPECT_NE(r.err.find(p + "e1\n"), std::string::npos) << r.err;
    EXPECT_NE(r.err.find(p + "etail\n"), std::string::npos) << r.err;
    EXPECT_LT(r.out.find(p + "one"), r.out.find(p + "two"));
  }
  EXPECT_EQ(r.out.find("e1"), std::string::npos);
  EXPECT_EQ(lines_of(r.out).size(), 6u) << r.out;
}

// Four ranks writing long lines at once: every line arrives whole, with its own rank's prefix,
// in the order its rank wrote them.
TEST_F(KilnRun, ConcurrentLinesStayWhole) {
  constexpr int kLines = 2000;
  Result r = kiln(run_args(
      {"--nproc", "4"}, "i=0; while [ $i -lt " + std::to_string(kLines) +
                            " ]; do echo \"$RANK $i "
                            "xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx"
                            "xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx\"; "
                            "i=$((i+1)); done"));
  ASSERT_EQ(r.status, 0) << r.err;
  std::vector<int> next(4, 0);
  for (const std::string& line : lines_of(r.out)) {
    int prefix_rank = -1, rank = -1, i = -1;
    char tail[256];
    ASSERT_EQ(std::sscanf(line.c_str(), "[rank %d] %d %d %255s", &prefix_rank, &rank, &i, tail), 4)
        << line;
    ASSERT_EQ(prefix_rank, rank) << line;
    ASSERT_EQ(i, next[rank]++) << line;
    ASSERT_EQ(std::string(tail).size(), 120u) << line;
  }
  EXPECT_EQ(next, std::vector<int>(4, kLines));
}

TEST_F(KilnRun, FirstFailureStopsTheOthers) {
  // Rank 1 fails once the others are up; the others would sleep 100 s.
  Result r = kiln(run_args({"--nproc", "3"},
                           "echo $$ > tmp.$RANK; mv tmp.$RANK pid.$RANK; if [ $RANK = 1 ]; then "
                           "while [ ! -f pid.0 ] || [ ! -f pid.2 ]; do sleep 0.01; done; exit 3; "
                           "fi; exec sleep 100"));
  EXPECT_EQ(r.status, 3) << r.err;
  EXPECT_LT(r.seconds, 5);
  EXPECT_NE(r.err.find("kiln run: rank 1 (pid "), std::string::npos) << r.err;
  EXPECT_NE(r.err.find(") exited with code 3; stopping the other ranks"), std::string::npos)
      << r.err;
  for (int rank : {0, 2}) {
    const pid_t pid = std::stoi(read_file(dir_ / ("pid." + std::to_string(rank))));
    EXPECT_FALSE(process_exists(pid)) << "rank " << rank;
  }
}

TEST_F(KilnRun, SignalExit) {
  Result r =
      kiln(run_args({"--nproc", "2"}, "if [ $RANK = 0 ]; then kill -KILL $$; fi; exec sleep 100"));
  EXPECT_EQ(r.status, 128 + SIGKILL) << r.err;
  EXPECT_LT(r.seconds, 5);
  EXPECT_NE(r.err.find("kiln run: rank 0 (pid "), std::string::npos) << r.err;
  EXPECT_NE(r.err.find(") was killed by SIGKILL"), std::string::npos) << r.err;
}

TEST_F(KilnRun, AllSucceed) {
  Result r = kiln(run_args({"--nproc", "3"}, "exit 0"));
  EXPECT_EQ(r.status, 0);
  EXPECT_EQ(r.out, "");
  EXPECT_EQ(r.err, "");
}

TEST_F(KilnRun, RankIgnoringSigtermGetsSigkill) {
  Result r = kiln(
      run_args({"--nproc", "2", "--grace-period", "0.5"},
               "trap '' TERM; echo $$ > tmp.$RANK; mv tmp.$RANK pid.$RANK; if [ $RANK = 0 ]; then "
               "while [ ! -f pid.1 ]; do sleep 0.01; done; exit 5; fi; sleep 100"));
  EXPECT_EQ(r.status, 5) << r.err;
  EXPECT_GE(r.seconds, 0.5);
  EXPECT_LT(r.seconds, 5);
  EXPECT_NE(r.err.find("rank(s) 1 still running after the grace period; sending SIGKILL"),
            std::string::npos)
      << r.err;
}

TEST_F(KilnRun, Timeout) {
  Result r = kiln(run_args({"--nproc", "2", "--timeout", "0.3"}, "exec sleep 100"));
  EXPECT_EQ(r.status, 124) << r.err;
  EXPECT_GE(r.seconds, 0.3);
  EXPECT_LT(r.seconds, 5);
  EXPECT_NE(r.err.find("kiln run: the job ran past --timeout 0.3 s; stopping the ranks"),
            std::string::npos)
      << r.err;
}

// A grandchild that keeps a rank's stdout open must not keep the launcher waiting.
TEST_F(KilnRun, OrphanHoldingThePipe) {
  Result r = kiln(run_args({}, "echo $$ > pid.0; (sleep 100 &); echo done"));
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(r.out, "[rank 0] done\n");
  EXPECT_LT(r.seconds, 5);
  kill(-std::stoi(read_file(dir_ / "pid.0")), SIGKILL);  // the orphan, in rank 0's group
}

class KilnRunSignal : public KilnRun, public ::testing::WithParamInterface<int> {};

// SIGINT/SIGTERM to the launcher reach every rank (they report it and exit 0), and the
// launcher exits with 128 + the signal.
TEST_P(KilnRunSignal, IsForwardedToTheRanks) {
  const int sig = GetParam();
  const std::string name = sig == SIGINT ? "INT" : "TERM";
  const pid_t launcher =
      start(run_args({"--nproc", "2"}, "trap 'echo got " + name + "; exit 0' " + name +
                                           "; echo $$ > pid.$RANK; while :; do sleep 0.05; done"));
  const std::vector<pid_t> ranks = wait_for_pids(2);
  kill(launcher, sig);
  Result r = finish(launcher);
  EXPECT_EQ(r.status, 128 + sig) << r.err;
  EXPECT_LT(r.seconds, 5);
  EXPECT_NE(r.err.find("kiln run: received SIG" + name + "; forwarding it to the ranks"),
            std::string::npos)
      << r.err;
  EXPECT_NE(r.out.find("[rank 0] got " + name), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("[rank 1] got " + name), std::string::npos) << r.out;
  for (pid_t pid : ranks) EXPECT_FALSE(process_exists(pid));
}

INSTANTIATE_TEST_SUITE_P(Signals, KilnRunSignal, ::testing::Values(SIGINT, SIGTERM),
                         [](const auto& info) {
                           return info.param == SIGINT ? "SIGINT" : "SIGTERM";
                         });

// A rank that ignores the forwarded signal is killed by a second one.
TEST_F(KilnRun, SecondSignalKills) {
  const pid_t launcher =
      start(run_args({"--nproc", "2", "--grace-period", "60"},
                     "trap '' INT; echo $$ > pid.$RANK; while :; do sleep 0.05; done"));
  const std::vector<pid_t> ranks = wait_for_pids(2);
  kill(launcher, SIGINT);
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  kill(launcher, SIGINT);
  Result r = finish(launcher);
  EXPECT_EQ(r.status, 128 + SIGINT) << r.err;
  EXPECT_LT(r.seconds, 5);
  EXPECT_NE(r.err.find("received SIGINT again; sending SIGKILL to the ranks"), std::string::npos)
      << r.err;
  for (pid_t pid : ranks) EXPECT_FALSE(process_exists(pid));
}

}  // namespace
