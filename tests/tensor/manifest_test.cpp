// The op table's manifest as a whole: every op has samples (tests/samples), and boxed calls
// with arguments of the wrong kind raise. Meta against CPU on every sample and dtype is the
// conformance driver's Meta path (tests/conformance/meta_path.cpp,
// Conformance.MetaAgreesWithCpu).
#include <gtest/gtest.h>

#include "samples/manifest.h"
#include "test_util.h"

namespace kiln::testing {
namespace {

// The manifest and the runtime's OpInfo carry the same typed claims (one generator, two views).
TEST(Manifest, AgreesWithOpInfo) {
  for (const ManifestRow& row : manifest()) {
    const OpInfo& info = row.op->info();
    EXPECT_EQ(info.kind == OpKind::Composite, row.composite) << row.name;
    EXPECT_EQ(info.dtypes.cpu.to_vector(), row.claimed(Backend::CPU)) << row.name;
    EXPECT_EQ(info.dtypes.cuda.to_vector(), row.claimed(Backend::CUDA)) << row.name;
    EXPECT_EQ(info.dtypes.meta.to_vector(), row.claimed(Backend::Meta)) << row.name;
    EXPECT_EQ(info.tags.has(OpTag::Random), info.is_random) << row.name;
  }
}

TEST(Manifest, EveryOpHasSamples) {
  std::string missing;
  for (const ManifestRow& row : manifest())
    if (!op_sample_registry().count(row.name)) missing += row.name + " ";
  EXPECT_TRUE(missing.empty()) << "ops without KILN_OP_SAMPLES: " << missing;
}

// Boxed calls with arguments of the wrong kind (what a malformed remote program would send)
// raise kiln::Error for every op; none crashes.
TEST(Manifest, WrongArgumentKindsRaise) {
  for (const ManifestRow& row : manifest()) {
    const OperatorHandle& op = *row.op;
    int n = op.info().num_args;
    Stack nones(n);
    EXPECT_THROW(op.call_boxed(nones), Error) << row.name;
    Stack strings(n, IValue(std::string("x")));
    EXPECT_THROW(op.call_boxed(strings), Error) << row.name;
    Stack too_few;
    if (n > 0) {
      EXPECT_THROW(op.call_boxed(too_few), Error) << row.name;
    }
  }
}

}  // namespace
}  // namespace kiln::testing
