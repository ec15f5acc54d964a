// See Note [Thread stacks] in stacks.h.
#include "stacks.h"

#include <cxxabi.h>
#include <dirent.h>
#include <execinfo.h>
#include <signal.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

namespace kiln::worker {
namespace {

constexpr int kMaxFrames = 32;
constexpr int kMaxThreads = 64;

const int kSignal = SIGRTMIN + 5;
void* g_frames[kMaxFrames];
std::atomic<int> g_depth{-1};  // -1: not answered yet

void on_signal(int) {
  const int saved = errno;
  g_depth.store(backtrace(g_frames, kMaxFrames), std::memory_order_release);
  errno = saved;
}

void install() {
  static std::once_flag once;
  std::call_once(once, [] {
    void* warm[1];
    backtrace(warm, 1);  // loads the unwinder now, outside any handler
    struct sigaction sa {};
    sa.sa_handler = &on_signal;
    sa.sa_flags = SA_RESTART;
    sigemptyset(&sa.sa_mask);
    sigaction(kSignal, &sa, nullptr);
  });
}

std::string thread_name(pid_t tid) {
  std::ifstream f("/proc/self/task/" + std::to_string(tid) + "/comm");
  std::string name;
  std::getline(f, name);
  return name;
}

// "func+0x12" of a backtrace_symbols line "lib.so(func+0x12) [0x...]", demangled.
std::string frame_text(const char* line) {
  std::string s(line);
  const size_t open = s.find('('), plus = s.find('+', open), close = s.find(')', open);
  if (open == std::string::npos || close == std::string::npos) return s;
  const std::string lib = s.substr(0, open);
  std::string name =
      s.substr(open + 1, (plus == std::string::npos || plus > close ? close : plus) - open - 1);
  if (!name.empty()) {
    int status = 0;
    std::unique_ptr<char, decltype(&std::free)> d(
        abi::__cxa_demangle(name.c_str(), nullptr, nullptr, &status), &std::free);
    if (status == 0 && d) name = d.get();
    if (name.size() > 200) name = name.substr(0, 200) + "...";
    return name + "  (" + lib.substr(lib.rfind('/') + 1) + ")";
  }
  return s;
}

}  // namespace

std::string thread_stacks() {
  static std::mutex mu;  // one dump at a time: the handler writes one global slot
  std::lock_guard<std::mutex> lock(mu);
  install();
  const pid_t self = static_cast<pid_t>(syscall(SYS_gettid));
  std::vector<pid_t> tids;
  if (DIR* d = opendir("/proc/self/task")) {
    while (dirent* e = readdir(d))
      if (e->d_name[0] != '.') tids.push_back(static_cast<pid_t>(std::atoi(e->d_name)));
    closedir(d);
  }
  std::string out;
  int shown = 0;
  for (pid_t tid : tids) {
    if (tid == self) continue;
    if (++shown > kMaxThreads) {
      out += "... " + std::to_string(tids.size() - kMaxThreads) + " more threads\n";
      break;
    }
    out += "thread " + std::to_string(tid) + " (" + thread_name(tid) + "):\n";
    g_depth.store(-1);
    if (syscall(SYS_tgkill, getpid(), tid, kSignal) != 0) {
      out += "  (gone)\n";
      continue;
    }
    const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(200);
    while (g_depth.load(std::memory_order_acquire) < 0 && std::chrono::steady_clock::now() < until)
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    const int depth = g_depth.load(std::memory_order_acquire);
    if (depth < 0) {
      out += "  (no answer)\n";
      continue;
    }
    std::unique_ptr<char*, decltype(&std::free)> names(backtrace_symbols(g_frames, depth),
                                                       &std::free);
    // Frame 0 is the handler and 1 the signal trampoline.
    for (int i = 2; i < depth; ++i) out += "  " + (names ? frame_text(names.get()[i]) : "?") + "\n";
  }
  return out;
}

}  // namespace kiln::worker
