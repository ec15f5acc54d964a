// tests/remote/worker_process.h: a kiln-worker child process on a free loopback port
// (--listen 127.0.0.1:0 --port-file F), SIGKILLed when the test is done with it.
#pragma once

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <thread>
#include <vector>

namespace kiln::testing {

// A kiln-worker child process listening on a free loopback port.
class WorkerProcess {
 public:
  explicit WorkerProcess(std::vector<std::string> extra = {}) {
    dir_ = std::filesystem::temp_directory_path() / ("kiln_remote_test_" + std::to_string(getpid()) + "_" +
                                        std::to_string(counter_++));
    std::filesystem::create_directories(dir_);
    std::string port_file = (dir_ / "port").string();
    std::vector<std::string> args = {KILN_WORKER_BIN, "--listen", "127.0.0.1:0", "--port-file",
                                     port_file};
    args.insert(args.end(), extra.begin(), extra.end());
    pid_ = fork();
    if (pid_ == 0) {
      std::vector<char*> argv;
      for (auto& a : args) argv.push_back(a.data());
      argv.push_back(nullptr);
      execv(argv[0], argv.data());
      _exit(127);
    }
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while (std::chrono::steady_clock::now() < deadline) {
      std::ifstream f(port_file);
      int port = 0;
      if (f >> port && port > 0) {
        address_ = "127.0.0.1:" + std::to_string(port);
        return;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    ADD_FAILURE() << "kiln-worker did not write its port file within 20 s";
  }
  ~WorkerProcess() {
    kill(SIGKILL);
    std::filesystem::remove_all(dir_);
  }
  const std::string& address() const { return address_; }
  void kill(int sig) {
    if (pid_ <= 0) return;
    ::kill(pid_, sig);
    int status = 0;
    waitpid(pid_, &status, 0);
    pid_ = -1;
  }
  // SIGSTOP, returning once every thread of the worker has stopped (the signal reaches them
  // one by one); SIGCONT undoes it.
  void freeze() {
    ::kill(pid_, SIGSTOP);
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    while (std::chrono::steady_clock::now() < deadline && !all_stopped())
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  void thaw() { ::kill(pid_, SIGCONT); }

 private:
  bool all_stopped() const {
    const std::filesystem::path tasks = "/proc/" + std::to_string(pid_) + "/task";
    for (const auto& t : std::filesystem::directory_iterator(tasks)) {
      std::ifstream f(t.path() / "stat");
      std::string stat((std::istreambuf_iterator<char>(f)), {});
      const size_t paren = stat.rfind(')');
      if (paren == std::string::npos || paren + 2 >= stat.size()) return false;
      const char state = stat[paren + 2];
      if (state != 'T' && state != 't') return false;
    }
    return true;
  }

  static inline int counter_ = 0;
  std::filesystem::path dir_;
  pid_t pid_ = -1;
  std::string address_;
};

}  // namespace kiln::testing
