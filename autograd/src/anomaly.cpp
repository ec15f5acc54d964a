// Note [Anomaly mode] in anomaly.h.
#include "kiln/autograd/anomaly.h"

#include <cxxabi.h>
#include <execinfo.h>

#include <atomic>
#include <cstdlib>
#include <sstream>

namespace kiln::autograd {
namespace {
std::atomic<bool> g_anomaly{false};

// "lib.so(_ZN4kiln3expERKNS_6TensorE+0x1c) [0x7f...]" -> "lib.so: kiln::exp(kiln::Tensor const&)+0x1c"
std::string demangle_frame(const char* sym) {
  std::string s(sym);
  size_t open = s.find('('), plus = s.find('+', open), close = s.find(')', open);
  if (open == std::string::npos || close == std::string::npos) return s;
  if (plus == std::string::npos || plus > close) plus = close;
  std::string mangled = s.substr(open + 1, plus - open - 1);
  std::string name = mangled;
  if (!mangled.empty()) {
    int status = 0;
    char* d = abi::__cxa_demangle(mangled.c_str(), nullptr, nullptr, &status);
    if (status == 0 && d != nullptr) name = d;
    std::free(d);
  }
  return s.substr(0, open) + ": " + (name.empty() ? "??" : name) + s.substr(plus, close - plus);
}
}  // namespace

bool AnomalyMode::is_enabled() { return g_anomaly.load(std::memory_order_relaxed); }
void AnomalyMode::set_enabled(bool enabled) { g_anomaly.store(enabled, std::memory_order_relaxed); }

std::string current_backtrace() {
  void* frames[64];
  int n = backtrace(frames, 64);
  char** syms = backtrace_symbols(frames, n);
  std::ostringstream os;
  if (syms == nullptr) return "(no backtrace available)\n";
  // Frame 0 is this function, 1 the Node constructor, 2 the derived node's constructor.
  for (int i = 1; i < n; ++i) {
    std::string f = demangle_frame(syms[i]);
    if (f.find("current_backtrace") != std::string::npos || f.find("Node::Node") != std::string::npos)
      continue;
    os << "  #" << i << " " << f << "\n";
  }
  std::free(syms);
  return os.str();
}

}  // namespace kiln::autograd
