// tests/worker/daemon.h: a kiln-worker process for the tests, started with --port-file and
// always reaped (SIGKILL at the end if it still runs). Every wait has a deadline.
#pragma once

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

extern char** environ;

namespace kiln::testing {

class Daemon {
 public:
  // Starts `binary args...` with --port-file; the port is read by wait_ready().
  Daemon(const std::string& binary, std::vector<std::string> args) {
    static int counter = 0;
    dir_ = std::filesystem::temp_directory_path() /
           ("kiln_worker_test_" + std::to_string(getpid()) + "_" + std::to_string(counter++));
    std::filesystem::create_directories(dir_);
    port_file_ = (dir_ / "port").string();
    std::vector<std::string> argv_s{binary};
    for (auto& a : args) argv_s.push_back(a);
    argv_s.push_back("--port-file");
    argv_s.push_back(port_file_);
    std::vector<char*> argv;
    for (auto& a : argv_s) argv.push_back(a.data());
    argv.push_back(nullptr);
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    std::string err = stderr_path();
    posix_spawn_file_actions_addopen(&fa, 2, err.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    EXPECT_EQ(posix_spawn(&pid_, argv[0], &fa, nullptr, argv.data(), environ), 0);
    posix_spawn_file_actions_destroy(&fa);
  }
  ~Daemon() {
    if (pid_ > 0 && !exited_) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }
  Daemon(const Daemon&) = delete;
  Daemon& operator=(const Daemon&) = delete;

  // Waits (at most `timeout`) for the port file; false if the process exited or time ran out.
  bool wait_ready(std::chrono::milliseconds timeout = std::chrono::seconds(20)) {
    auto end = std::chrono::steady_clock::now() + timeout;
    while (std::chrono::steady_clock::now() < end) {
      std::ifstream f(port_file_);
      if (f >> port_) return true;
      if (poll_exit()) return false;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return false;
  }
  int port() const { return port_; }
  std::string address() const { return "127.0.0.1:" + std::to_string(port_); }
  pid_t pid() const { return pid_; }

  // The exit code once the process ended within `timeout`, else -1 (128+N for a signal).
  int wait_exit(std::chrono::milliseconds timeout) {
    auto end = std::chrono::steady_clock::now() + timeout;
    while (std::chrono::steady_clock::now() < end) {
      if (poll_exit()) return code_;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return -1;
  }
  std::string stderr_text() const {
    std::ifstream f(stderr_path());
    std::stringstream ss;
    ss << f.rdbuf();
    return ss.str();
  }

 private:
  std::string stderr_path() const { return (dir_ / "stderr").string(); }
  bool poll_exit() {
    if (exited_) return true;
    int status = 0;
    if (waitpid(pid_, &status, WNOHANG) != pid_) return false;
    exited_ = true;
    code_ = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    return true;
  }

  std::filesystem::path dir_;
  std::string port_file_;
  pid_t pid_ = -1;
  int port_ = 0;
  bool exited_ = false;
  int code_ = -1;
};

}  // namespace kiln::testing
