// The multi-process harness (tests/sharding/harness.h).
#include "harness.h"

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <thread>

#include "kiln/dist/process_group.h"

extern char** environ;

namespace kiln::testing {
namespace {

std::map<std::string, ScenarioFn>& scenarios() {
  static std::map<std::string, ScenarioFn> s;
  return s;
}

int env_int(const char* name) {
  const char* v = std::getenv(name);
  return v ? std::atoi(v) : -1;
}

std::string read_file(const std::string& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

}  // namespace

int register_scenario(const char* name, ScenarioFn fn) {
  scenarios()[name] = fn;
  return 0;
}

int rank() { return env_int("RANK"); }
int world() { return env_int("WORLD_SIZE"); }

std::vector<RankResult> run_ranks(const std::string& scenario, int world_size,
                                  std::chrono::seconds timeout,
                                  const std::map<std::string, std::string>& extra_env) {
  dist::TCPStore store("127.0.0.1", 0, /*is_server=*/true);
  std::vector<pid_t> pids(world_size, -1);
  std::vector<std::string> logs(world_size);
  std::vector<RankResult> results(world_size);
  for (int r = 0; r < world_size; ++r) {
    std::map<std::string, std::string> env;
    for (char** e = environ; *e; ++e) {
      std::string kv = *e;
      auto eq = kv.find('=');
      if (eq != std::string::npos) env[kv.substr(0, eq)] = kv.substr(eq + 1);
    }
    env["RANK"] = env["LOCAL_RANK"] = std::to_string(r);
    env["WORLD_SIZE"] = env["LOCAL_WORLD_SIZE"] = std::to_string(world_size);
    env["MASTER_ADDR"] = "127.0.0.1";
    env["MASTER_PORT"] = std::to_string(store.port());
    env["KILN_AGENT_STORE"] = "1";
    env["OMP_NUM_THREADS"] = "1";
    env["KILN_DIST_SCENARIO"] = scenario;
    for (auto& [k, v] : extra_env) env[k] = v;
    std::vector<std::string> kvs;
    for (auto& [k, v] : env) kvs.push_back(k + "=" + v);
    std::vector<char*> envp;
    for (auto& s : kvs) envp.push_back(s.data());
    envp.push_back(nullptr);
    std::string a0 = "/proc/self/exe", a1 = "--gtest_filter=DistRank.DISABLED_Entry",
                a2 = "--gtest_also_run_disabled_tests", a3 = "--gtest_brief=1";
    char* argv[] = {a0.data(), a1.data(), a2.data(), a3.data(), nullptr};
    char tmpl[] = "/tmp/kiln_rank_XXXXXX";
    int fd = mkstemp(tmpl);
    logs[r] = tmpl;
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, fd, 1);
    posix_spawn_file_actions_adddup2(&fa, fd, 2);
    int rc = posix_spawn(&pids[r], "/proc/self/exe", &fa, nullptr, argv, envp.data());
    posix_spawn_file_actions_destroy(&fa);
    ::close(fd);
    if (rc != 0) ADD_FAILURE() << "posix_spawn failed for rank " << r << ": " << rc;
  }
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  int running = world_size;
  for (int r = 0; r < world_size; ++r)
    if (pids[r] < 0) --running;
  while (running > 0) {
    for (int r = 0; r < world_size; ++r) {
      if (pids[r] < 0) continue;
      int status = 0;
      if (waitpid(pids[r], &status, WNOHANG) != pids[r]) continue;
      results[r].exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
      results[r].signal = WIFSIGNALED(status) ? WTERMSIG(status) : 0;
      pids[r] = -1;
      --running;
    }
    if (running > 0 && std::chrono::steady_clock::now() > deadline) {
      for (int r = 0; r < world_size; ++r) {
        if (pids[r] < 0) continue;
        kill(pids[r], SIGKILL);
        waitpid(pids[r], nullptr, 0);
        results[r].timed_out = true;
        pids[r] = -1;
      }
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  for (int r = 0; r < world_size; ++r) {
    results[r].output = read_file(logs[r]);
    std::remove(logs[r].c_str());
  }
  return results;
}

void expect_all_pass(const std::vector<RankResult>& results) {
  for (size_t r = 0; r < results.size(); ++r) {
    const RankResult& res = results[r];
    EXPECT_TRUE(res.exit_code == 0 && !res.timed_out)
        << "rank " << r << (res.timed_out ? " timed out" : "") << " exit " << res.exit_code
        << " signal " << res.signal << "; its output:\n"
        << res.output;
  }
}

// The entry point of a rank process (run_ranks passes the filter that selects it).
TEST(DistRank, DISABLED_Entry) {
  const char* name = std::getenv("KILN_DIST_SCENARIO");
  ASSERT_TRUE(name) << "DistRank.DISABLED_Entry runs only inside run_ranks";
  auto it = scenarios().find(name);
  ASSERT_TRUE(it != scenarios().end()) << "unknown scenario " << name;
  dist::init_process_group();
  it->second();
  dist::destroy_process_group();
}

}  // namespace kiln::testing
