// tests/samples/comm/comm_samples.h: the one-rank process group the collectives' samples
// (comm_samples.cpp) run on, shared with their own suite (tests/sharding/functional_test.cpp).
// The samples live apart from tests/samples/*.cpp because they need kiln_sharding, which the
// GPU-only build (kiln_gpu_tests) does not link: the object library kiln_op_samples_comm.
#pragma once

#include <string>

namespace kiln::testing {

// The name of a one-rank in-process group, "local", created on first use.
std::string local_group();

}  // namespace kiln::testing
