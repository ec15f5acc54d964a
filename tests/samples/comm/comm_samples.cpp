// tests/samples/comm/comm_samples.cpp: manifest samples of the collectives (tensor/ops/comm.toml)
// on a one-rank group, for the manifest, gradcheck, forward-AD and vmap suites and the
// conformance driver (kiln_tests, kiln_remote_tests and kiln_ops_matrix link kiln_op_samples_comm).
#include "samples/comm/comm_samples.h"

#include "kiln/dist/process_group.h"
#include "samples/op_samples.h"
#include "samples/util.h"

namespace kiln::testing {
namespace {

using namespace sample_args;

using S = std::vector<Stack>;
using Ints = std::vector<int64_t>;

}  // namespace

std::string local_group() {
  try {
    dist::find_group("local");
  } catch (const Error&) {
    dist::new_local_group("local");
  }
  return "local";
}

KILN_OP_SAMPLES("all_reduce", all_reduce_s) {
  return S{{random({2, 3}), str("sum"), local_group()},
           {non_contiguous(random({3, 2})), str("avg"), local_group()},
           {random({0}), str("sum"), local_group()}};
}
KILN_OP_SAMPLES("all_gather_into_tensor", all_gather_s) {
  return S{{random({2, 3}), i64(1), local_group()}, {random({}), i64(1), local_group()}};
}
KILN_OP_SAMPLES("reduce_scatter_tensor", reduce_scatter_s) {
  return S{{random({4, 2}), str("sum"), i64(1), local_group()},
           {random({3}), str("avg"), i64(1), local_group()}};
}
KILN_OP_SAMPLES("broadcast", broadcast_s) { return S{{random({3}), i64(0), local_group()}}; }
KILN_OP_SAMPLES("all_to_all_single", all_to_all_s) {
  return S{{random({4, 2}), IValue(Ints{}), IValue(Ints{}), local_group()},
           {random({3, 2}), IValue(Ints{3}), IValue(Ints{3}), local_group()}};
}

}  // namespace kiln::testing
