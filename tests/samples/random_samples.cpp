// Manifest samples for the random ops (tensor/ops/random.toml).
#include "samples/op_samples.h"
#include "samples/util.h"

namespace kiln::testing {
namespace {

using namespace sample_args;

using S = std::vector<Stack>;
using Sizes = std::vector<int64_t>;

KILN_OP_SAMPLES("rand", rand_s) {
  return S{{Sizes{2, 3}, kNone, kNone, kNone}, {Sizes{0, 4}, Generator(7), kFloat64, kNone}};
}
KILN_OP_SAMPLES("randn", randn_s) {
  return S{{Sizes{5}, kNone, kNone, kNone}, {Sizes{2, 2}, Generator(7), kBFloat16, kNone}};
}
KILN_OP_SAMPLES("randint", randint_s) {
  return S{{int64_t{0}, int64_t{10}, Sizes{3, 2}, kNone, kNone, kNone},
           {int64_t{-5}, int64_t{5}, Sizes{4}, Generator(1), kInt8, kNone}};
}
KILN_OP_SAMPLES("normal_", normal_s) {
  return S{{random({2, 3}), 1.0, 2.0, kNone},
           {non_contiguous(random({3, 2}, kFloat64)), 0.0, 1.0, Generator(3)}};
}
KILN_OP_SAMPLES("uniform_", uniform_s) {
  return S{{random({4}), -1.0, 1.0, kNone},
           {non_contiguous(random({2, 2}, kFloat16)), 0.0, 1.0, Generator(3)}};
}
// (6, 4): the DTensor rule's pieces line up with counter blocks on 2 and 3 ranks (Note [Random
// sharding]).
KILN_OP_SAMPLES("bernoulli", bernoulli_s) {
  return S{{random({2, 3}, kFloat32, 0, 1), kNone},
           {non_contiguous(random({3, 2}, kFloat64, 0, 1)), Generator(5)},
           {random({6, 4}, kFloat32, 0, 1), Generator(9)}};
}
KILN_OP_SAMPLES("randperm", randperm_s) {
  return S{{int64_t{6}, kNone, kNone, kNone}, {int64_t{0}, Generator(2), kInt32, kNone}};
}

}  // namespace
}  // namespace kiln::testing
