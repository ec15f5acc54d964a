// tests/op_samples.h: sample inputs for every op of the manifest.
//
//   KILN_OP_SAMPLES("add", add_samples) {
//     return {{testing::random({2, 3}), testing::random({3}), Scalar(2)}};
//   }
//
// The manifest test (tests/tensor/manifest_test.cpp) runs each op on each sample on CPU and on
// Meta and checks that sizes, strides, dtype and aliasing agree. An op of the table without
// samples fails that test, so every new row must come with samples.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "kiln/ivalue.h"

namespace kiln::testing {

using SampleFn = std::vector<Stack> (*)();
std::map<std::string, SampleFn>& op_sample_registry();
inline int register_op_samples(const char* op, SampleFn fn) {
  op_sample_registry()[op] = fn;
  return 0;
}

}  // namespace kiln::testing

#define KILN_OP_SAMPLES(OP_NAME, ID)                                                  \
  static std::vector<::kiln::Stack> ID();                                             \
  static const int ID##_registered = ::kiln::testing::register_op_samples(OP_NAME, &ID); \
  static std::vector<::kiln::Stack> ID()
