// Manifest samples for shape.toml, indexing.toml, linalg.toml and comm.toml's wait_tensor (run
// on every path by the conformance driver, tests/conformance).
#include "samples/op_samples.h"
#include "samples/util.h"

namespace kiln::testing {
namespace {

using namespace sample_args;

using S = std::vector<Stack>;
using Ts = std::vector<Tensor>;
Tensor mask23() { return from_vector<bool>({true, false, true, false, false, true}, {2, 3}); }

// ---- shape.toml
KILN_OP_SAMPLES("cat", cat_s) {
  return S{{Ts{random({2, 3}), random({1, 3})}, i64(0)},
           {Ts{random({2, 3}, kInt32), non_contiguous(random({2, 2})), random({0})}, i64(-1)},
           {Ts{random({0}), random({0})}, i64(0)}};
}
KILN_OP_SAMPLES("stack", stack_s) {
  return S{{Ts{random({2, 3}), random({2, 3}, kFloat64)}, i64(1)}, {Ts{random({3})}, i64(-1)}};
}
KILN_OP_SAMPLES("split", split_s) {
  return S{{random({5, 4}), i64(2), i64(0)}, {random({3, 4}), i64(3), i64(1)}};
}
KILN_OP_SAMPLES("chunk", chunk_s) {
  return S{{random({5, 4}), i64(3), i64(0)}, {random({0, 2}), i64(2), i64(0)}};
}
KILN_OP_SAMPLES("tril", tril_s) {
  return S{{random({3, 4}), i64(0)}, {non_contiguous(random({2, 3, 3})), i64(-1)}};
}
KILN_OP_SAMPLES("tril_", tril_inplace_s) { return S{{random({3, 4}), i64(1)}}; }
KILN_OP_SAMPLES("tril.out", tril_out_s) { return S{{random({3, 4}), i64(0), random({0})}}; }
KILN_OP_SAMPLES("triu", triu_s) { return S{{random({4, 3}, kInt64), i64(1)}, {random({3, 4}), i64(-1)}}; }
KILN_OP_SAMPLES("triu_", triu_inplace_s) { return S{{non_contiguous(random({3, 3})), i64(0)}}; }
KILN_OP_SAMPLES("triu.out", triu_out_s) { return S{{random({2, 3}), i64(-1), random({2, 3})}}; }

// ---- comm.toml: wait_tensor needs no process group (an alias of its input in eager mode), so
// its sample lives here, where the GPU-only build's kiln_gpu_tests has it (it claims CUDA).
KILN_OP_SAMPLES("wait_tensor", wait_tensor_s) { return S{{random({2, 3})}}; }

// ---- indexing.toml
KILN_OP_SAMPLES("index_select", index_select_s) {
  return S{{random({4, 3}), i64(0), idx({3, 0, 3}, {3})},
           {random({2, 5}, kInt32), i64(-1), idx({}, {0})}};
}
KILN_OP_SAMPLES("gather", gather_s) {
  return S{{random({3, 4}), i64(1), idx({0, 3, 1, 1, 2, 0}, {3, 2})}};
}
KILN_OP_SAMPLES("scatter", scatter_s) {
  return S{{random({3, 4}), i64(1), idx({0, 3, 1, 2}, {2, 2}), random({2, 3})}};
}
KILN_OP_SAMPLES("scatter_", scatter_inplace_s) {
  return S{{random({3, 4}), i64(0), idx({2, 0, 1}, {1, 3}), random({1, 3})}};
}
KILN_OP_SAMPLES("scatter_add", scatter_add_s) {
  return S{{random({3, 4}, kInt32), i64(1), idx({0, 0, 1, 3}, {2, 2}), random({2, 2}, kInt32)},
           {random({3, 4}), i64(0), idx({2, 0, 1, 2}, {2, 2}), random({2, 3})}};
}
KILN_OP_SAMPLES("scatter_add_", scatter_add_inplace_s) {
  return S{{random({3, 2}), i64(0), idx({2, 2}, {1, 2}), random({1, 2})}};
}
KILN_OP_SAMPLES("masked_fill", masked_fill_s) {
  return S{{random({2, 3}), mask23(), Scalar(0.5)}, {random({3}), mask23(), Scalar(1)}};
}
KILN_OP_SAMPLES("masked_fill_", masked_fill_inplace_s) {
  return S{{random({2, 3}), mask23(), Scalar(1.0)}};  // 1 fits every claimed dtype
}
KILN_OP_SAMPLES("one_hot", one_hot_s) {
  return S{{idx({0, 2, 1}, {3}), i64(4)}, {idx({1, 0}, {2, 1}), i64(2)}};
}

// ---- linalg.toml
KILN_OP_SAMPLES("mm", mm_s) {
  return S{{random({2, 3}), random({3, 4})}, {random({3, 2}).t(), random({3, 0})}};
}
KILN_OP_SAMPLES("bmm", bmm_s) {
  return S{{random({2, 2, 3}, kFloat64), random({2, 3, 4}, kFloat64)}};
}
KILN_OP_SAMPLES("addmm", addmm_s) {
  return S{{random({4}), random({2, 3}), random({3, 4}), Scalar(0.5), Scalar(2)}};
}
KILN_OP_SAMPLES("matmul", matmul_s) {
  return S{{random({3}), random({3})},
           {random({2, 3}), random({3})},
           {random({3}), random({3, 4})},
           {random({2, 1, 2, 3}), random({5, 3, 4})},
           {random({2, 2, 3}), random({3, 4})}};
}
KILN_OP_SAMPLES("linear", linear_s) {
  return S{{random({2, 3}), random({4, 3}), random({4})},
           {random({2, 2, 3}), random({4, 3}), kNone},
           {random({3}), random({4, 3}), random({4})}};
}

}  // namespace
}  // namespace kiln::testing
