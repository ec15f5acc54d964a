// The conformance driver (tests/conformance/driver.h) under GoogleTest: per path, every op
// whose claims do not hold is its own failure (op, dtype, why). The CPU column is eager CPU's
// claims; CUDA's is checked against the registered kernels here (and run by kiln_gpu_tests on
// a GPU); Remote's runs in kiln_remote_tests.
#include <gtest/gtest.h>

#include "conformance/driver.h"
#include "samples/util.h"

namespace kiln::conformance {
namespace {

// Runs `path` (the CPU column alone for "CPU") and fails once per problem cell of that column.
void expect_conformant(const std::string& path, int min_ok) {
  Matrix m = run(
      {.paths = path == "CPU" ? std::vector<std::string>{"Meta"} : std::vector<std::string>{path}});
  const size_t col = path == "CPU" ? 0 : 1;
  for (const Matrix::Problem& p : m.problems())
    if (p.path == path)
      ADD_FAILURE() << p.op << " " << scalar_type_name(p.dtype) << " on " << p.path << ": "
                    << status_name(p.status) << ": " << p.detail;
  EXPECT_GE(m.count(col, Status::Ok), min_ok) << path;
}

TEST(Conformance, EagerCpuHoldsItsClaims) { expect_conformant("CPU", 1000); }
TEST(Conformance, MetaAgreesWithCpu) { expect_conformant("Meta", 1000); }
TEST(Conformance, BatchedAgreesWithTheLoop) { expect_conformant("Batched", 1000); }
TEST(Conformance, CompiledAgreesWithEager) { expect_conformant("Compiled", 1000); }

bool has_path(const std::string& name) {
  for (const auto& p : paths())
    if (p->name() == name) return true;
  return false;
}

// Without a GPU only the claims are checked (a kernel is registered for every claim); with one,
// kiln_gpu_tests compares the values.
TEST(Conformance, CudaClaimsHaveKernels) {
  if (!has_path("CUDA")) GTEST_SKIP() << "built without kernels/cuda";
  Matrix m = run({.paths = {"CUDA"}});
  for (const Matrix::Problem& p : m.problems())
    if (p.path == "CUDA")
      ADD_FAILURE() << p.op << " " << scalar_type_name(p.dtype)
                    << " on CUDA: " << status_name(p.status) << ": " << p.detail;
}

// The driver itself: a path whose results are off by one fails every dtype it ran, and a path
// whose key has no kernels (Metal) is missing for a primitive row and for a composite one
// (whose decomposition calls primitives).
class OffByOnePath : public Path {
 public:
  std::string name() const override { return "OffByOne"; }
  testing::Backend claims() const override { return testing::Backend::CPU; }
  DispatchKey key() const override { return DispatchKey::CPU; }
  std::string unavailable() const override { return ""; }
  Outcome run(const Case& c) const override {
    Stack s = testing::clone_stack(c.sample);
    c.op().call_boxed(s);
    std::vector<Tensor> got;
    for (const Tensor& t : testing::outputs_of(s)) got.push_back(t + 1);
    return Outcome::failed_unless(compare_values(got, testing::outputs_of(c.cpu_out), false));
  }
};
KILN_CONFORMANCE_PATH(OffByOnePath);

class NoKernelsPath : public OffByOnePath {
 public:
  std::string name() const override { return "NoKernels"; }
  DispatchKey key() const override { return DispatchKey::Metal; }
};
KILN_CONFORMANCE_PATH(NoKernelsPath);

TEST(Conformance, DriverSeesDisagreementsAndMissingKernels) {
  Matrix wrong = run({.paths = {"OffByOne"}, .op = "exp"});
  ASSERT_EQ(wrong.rows.size(), 1u);
  EXPECT_EQ(wrong.rows[0].cells[1][8].status, Status::Failed);  // float32
  EXPECT_EQ(wrong.count(1, Status::Ok), 0);
  for (const char* op : {"exp", "linear"}) {
    Matrix none = run({.paths = {"NoKernels"}, .op = op});
    EXPECT_EQ(none.rows[0].cells[1][8].status, Status::Missing) << op;
    EXPECT_EQ(none.count(1, Status::Missing),
              static_cast<int>(testing::manifest_row(op)->claimed(testing::Backend::CPU).size()))
        << op;
  }
}

// A path that runs nothing, for a reason that is a gap or one of Note [Untested cells].
class SkipsPath : public OffByOnePath {
 public:
  std::string name() const override { return "Skips"; }
  Outcome run(const Case&) const override { return Outcome::skipped("never runs"); }
};
KILN_CONFORMANCE_PATH(SkipsPath);

class NothingToComparePath : public OffByOnePath {
 public:
  std::string name() const override { return "NothingToCompare"; }
  Outcome run(const Case&) const override { return Outcome::nothing_to_compare("data-dependent"); }
};
KILN_CONFORMANCE_PATH(NothingToComparePath);

// See Note [Untested cells]: an untested cell is a problem unless its reason is documented.
TEST(Conformance, UntestedCellsAreGapsUnlessDocumented) {
  Matrix gap = run({.paths = {"Skips"}, .op = "exp"});
  EXPECT_EQ(gap.rows[0].cells[1][8].status, Status::Untested);
  EXPECT_FALSE(gap.problems().empty());
  Matrix documented = run({.paths = {"NothingToCompare"}, .op = "exp"});
  EXPECT_EQ(documented.rows[0].cells[1][8].status, Status::Untested);
  EXPECT_TRUE(documented.problems().empty());
  EXPECT_EQ(documented.count_documented(1), documented.count(1, Status::Untested));
}

// See Note [Variant dtypes]: exp_ cannot hold its float result in int64 (not claimed), eq_ can
// hold its bool one in float32, and exp.out writes an int32 input's float result.
TEST(Conformance, VariantsFollowTheirFunctionalOp) {
  auto cpu_cell = [](const char* op, int dtype) {
    return run({.paths = {"Meta"}, .op = op}).rows.at(0).cells[0][dtype].status;
  };
  EXPECT_EQ(cpu_cell("exp_", 5), Status::NotClaimed);  // int64
  EXPECT_EQ(cpu_cell("exp_", 8), Status::Ok);          // float32
  EXPECT_EQ(cpu_cell("eq_", 8), Status::Ok);
  EXPECT_EQ(cpu_cell("exp.out", 4), Status::Ok);  // int32
  const OpInfo& info = Dispatcher::get().find_or_throw("exp.out").info();
  std::optional<Stack> s =
      testing::sample_in_dtype({testing::random({3}), testing::random({0})}, kInt32, info);
  ASSERT_TRUE(s.has_value());
  EXPECT_EQ((*s)[0].to_tensor().dtype(), kInt32);
  EXPECT_EQ((*s)[1].to_tensor().dtype(), kFloat32);
}

}  // namespace
}  // namespace kiln::conformance
