// kiln/autograd/anomaly.h: anomaly detection (PyTorch's torch.autograd.detect_anomaly).
//
//   { kiln::autograd::DetectAnomalyGuard g; loss = model(x); loss.backward(); }
//   // a node whose backward returns NaN raises RuntimeError: "Function 'DivBackward0' returned nan
//   // values in its 0th output. ... Traceback of forward call that caused the error: ..."
//
// Note [Anomaly mode]: while enabled, every node records where it was created (a C++ backtrace of
// the forward call, demangled, from <execinfo.h>); the engine checks every gradient a node returns
// for NaN and names the node and that stack, and an error raised inside a node's backward gets the
// stack appended. Recording a backtrace per op is slow: a debugging aid, off by default.
#pragma once

#include <string>

namespace kiln::autograd {

struct AnomalyMode {
  static bool is_enabled();
  static void set_enabled(bool enabled);
};

class DetectAnomalyGuard {
 public:
  explicit DetectAnomalyGuard(bool enabled = true) : prev_(AnomalyMode::is_enabled()) {
    AnomalyMode::set_enabled(enabled);
  }
  ~DetectAnomalyGuard() { AnomalyMode::set_enabled(prev_); }
  DetectAnomalyGuard(const DetectAnomalyGuard&) = delete;
  DetectAnomalyGuard& operator=(const DetectAnomalyGuard&) = delete;

 private:
  bool prev_;
};

// The calling thread's backtrace, one demangled frame per line (frames inside kiln_autograd's
// node construction skipped).
std::string current_backtrace();

}  // namespace kiln::autograd
