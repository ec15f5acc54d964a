// tests/cuda/pointwise_util.h: host references and comparisons for the CUDA pointwise op tests
// (unary_ops_test.cpp, binary_ops_test.cpp). References are plain C++ over doubles (the GPU
// machine has no CPU kernels), stored as the result dtype would store them.
//
//   double want = store(kInt8, 200);                 // -56: integers wrap like the kernels
//   expect_close(got_cuda, want_values, tol(kFloat16), "exp float16 contiguous");
#pragma once

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "cuda/gpu_util.h"
#include "cuda/harness.h"

namespace kiln::gputest {

// The device under test. Building these tests with -DKILN_POINTWISE_TEST_DEVICE='"cpu"' (and a
// runner whose gpu_available() is true) checks the references against the CPU kernels.
#ifndef KILN_POINTWISE_TEST_DEVICE
#define KILN_POINTWISE_TEST_DEVICE "cuda"
#endif
inline const Device kCudaDev(KILN_POINTWISE_TEST_DEVICE);

inline std::vector<ScalarType> float_dtypes() { return {kFloat16, kBFloat16, kFloat32, kFloat64}; }
inline std::vector<ScalarType> numeric_dtypes() {
  return {kUInt8, kInt8, kInt16, kInt32, kInt64, kFloat16, kBFloat16, kFloat32, kFloat64};
}

// Relative tolerance of a result computed in float (float16/bfloat16/float32) or double against
// a double reference: about two units in the last place of the stored type, integers exact.
inline double tol(ScalarType t) {
  switch (t) {
    case kFloat16: return 4e-3;
    case kBFloat16: return 2e-2;
    case kFloat32: return 2e-6;
    case kFloat64: return 1e-13;
    default: return 0;
  }
}

// An integer as integer dtype `t` stores it (two's complement wrap-around).
inline double wrap_int(ScalarType t, int64_t v) {
  switch (t) {
    case kUInt8: return static_cast<uint8_t>(v);
    case kInt8: return static_cast<int8_t>(v);
    case kInt16: return static_cast<int16_t>(v);
    case kInt32: return static_cast<int32_t>(v);
    case kBool: return v != 0;
    default: return static_cast<double>(v);
  }
}

// A reference value as dtype `t` stores it: floats rounded (nan/inf kept), integers wrapped.
inline double store(ScalarType t, double v) {
  if (is_floating(t)) return round_to(t, v);
  if (t == kBool) return v != 0;
  return wrap_int(t, static_cast<int64_t>(v));
}

inline bool close(double got, double want, double rel) {
  if (std::isnan(want)) return std::isnan(got);
  if (std::isinf(want)) return got == want;
  return std::fabs(got - want) <= rel * (1 + std::fabs(want));
}

// Checks `got` (any device/layout) against row-major `want`; reports the first few mismatches.
inline void expect_close(const Tensor& got, const std::vector<double>& want, double rel, const std::string& what) {
  std::vector<double> g = values(got);
  if (g.size() != want.size()) {
    add_failure(__FILE__, __LINE__, what + ": " + std::to_string(g.size()) + " values, want " + std::to_string(want.size()));
    return;
  }
  int reported = 0;
  for (size_t i = 0; i < g.size(); ++i) {
    if (close(g[i], want[i], rel)) continue;
    if (reported++ < 3) {
      add_failure(__FILE__, __LINE__, what + ": element " + std::to_string(i) + " is " + std::to_string(g[i]) +
                                          ", want " + std::to_string(want[i]));
    }
  }
}


// A 0-dim CPU tensor of dtype t holding v (converted as write_values does).
inline Tensor host_scalar(ScalarType t, double v) {
  Tensor s = empty_on(IntArrayRef(), t, kCPU);
  write_values(s, {v});
  return s;
}

// `h` (CPU) copied to a fresh contiguous tensor on the device under test.
inline Tensor to_cuda(const Tensor& h) { return h.to(std::nullopt, kCudaDev, /*copy=*/true); }

}  // namespace kiln::gputest
