// tests/samples/op_samples.h: sample inputs for every op of the manifest (the kiln_op_samples
// library, without GoogleTest: kiln_tests, kiln_gpu_tests, kiln_remote_tests and
// kiln_ops_matrix link it).
//
//   KILN_OP_SAMPLES("add", add_samples) {
//     return {{testing::random({2, 3}), testing::random({3}), Scalar(2)}};
//   }
//
// The conformance driver (tests/conformance/driver.h) runs each op on each sample, in every
// dtype the row claims, on every execution path (Meta, CUDA, Remote, Batched) and compares with
// eager CPU. An op of the table without samples fails Manifest.EveryOpHasSamples, so every new
// row must come with samples. Write samples in float32 (or the dtype the op needs): the driver
// derives the other dtypes (See Note [Sample dtypes] in tests/samples/manifest.h).
#pragma once

#include <map>
#include <string>
#include <vector>

#include "kiln/ivalue.h"
#include "samples/util.h"

namespace kiln::testing {

using SampleFn = std::vector<Stack> (*)();
std::map<std::string, SampleFn>& op_sample_registry();
inline int register_op_samples(const char* op, SampleFn fn) {
  op_sample_registry()[op] = fn;
  return 0;
}

// The shorthands the sample files share (`using namespace sample_args;` in a sample file):
// a sample's None, int, string, int64 index and bool mask arguments.
namespace sample_args {
inline const IValue kNone;
inline IValue i64(int64_t v) { return v; }
inline IValue str(const char* s) { return std::string(s); }
inline Tensor idx(const std::vector<int64_t>& v, IntArrayRef sizes) {
  return from_vector<int64_t>(v, sizes);
}
inline Tensor mask(const std::vector<bool>& v, IntArrayRef sizes) {
  return from_vector<bool>(v, sizes);
}
}  // namespace sample_args

}  // namespace kiln::testing

#define KILN_OP_SAMPLES(OP_NAME, ID)                                                  \
  static std::vector<::kiln::Stack> ID();                                             \
  static const int ID##_registered = ::kiln::testing::register_op_samples(OP_NAME, &ID); \
  static std::vector<::kiln::Stack> ID()
