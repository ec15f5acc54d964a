#include "kiln/parallel.h"

#include <atomic>
#include <cstdlib>
#include <thread>

#include "kiln/error.h"

namespace kiln {
namespace {
int default_threads() {
  if (const char* env = std::getenv("OMP_NUM_THREADS")) {
    int n = std::atoi(env);
    if (n > 0) return n;
  }
  unsigned n = std::thread::hardware_concurrency();
  return n ? static_cast<int>(n) : 1;
}
std::atomic<int> g_threads{default_threads()};
std::atomic<void (*)(int)> g_hook{nullptr};
}  // namespace

void set_num_threads(int n) {
  KILN_CHECK(n >= 1, Value, "set_num_threads: expected a positive number of threads, got ", n);
  g_threads.store(n, std::memory_order_relaxed);
  if (auto hook = g_hook.load()) hook(n);
}

void set_num_threads_hook(void (*hook)(int)) {
  g_hook.store(hook);
  if (hook) hook(get_num_threads());
}

int get_num_threads() { return g_threads.load(std::memory_order_relaxed); }

}  // namespace kiln
