// The conformance driver's Remote column (tests/conformance/remote_path.cpp): every op, sample
// and dtype a row claims for CPU, run on an embedded worker and compared with eager CPU; every
// op whose claims do not hold there is its own failure.
#include <gtest/gtest.h>

#include "conformance/driver.h"

namespace kiln::conformance {
namespace {

TEST(RemoteOpsConformance, EveryManifestOpAgreesWithEagerCpu) {
  Matrix m = run({.paths = {"Remote"}});
  for (const Matrix::Problem& p : m.problems())
    if (p.path == "Remote")
      ADD_FAILURE() << p.op << " " << scalar_type_name(p.dtype) << ": " << status_name(p.status)
                    << ": " << p.detail;
  EXPECT_GT(m.count(1, Status::Ok), 0);
}

}  // namespace
}  // namespace kiln::conformance
