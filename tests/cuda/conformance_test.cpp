// The conformance driver's CUDA column (tests/conformance/driver.h) in kiln_gpu_tests: every
// op, sample and dtype a row claims for CUDA, run on the GPU and compared with eager CPU
// (values within two units in the last place, integers exact, random ops bit for bit). Without
// a device only the claims are checked: each must have a registered CUDA kernel.
#include <iostream>

#include "conformance/driver.h"
#include "cuda/harness.h"

using namespace kiln;
using namespace kiln::conformance;

GPU_TEST(Conformance, CudaColumn) {
  Matrix m = run({.paths = {"CUDA"}});
  for (const Matrix::Problem& p : m.problems())
    if (p.path == "CUDA")
      ::kiln::gputest::add_failure(
          __FILE__, __LINE__,
          p.op + " " + scalar_type_name(p.dtype) + ": " + status_name(p.status) + ": " + p.detail);
  print_summary(std::cout, m);
  if (gputest::gpu_available()) {
    EXPECT_TRUE(m.count(1, Status::Ok) > 0);
  }
}
