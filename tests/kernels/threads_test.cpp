// set_num_threads / get_num_threads (kiln/parallel.h): the setting also sizes the OpenMP pool
// that oneDNN's GEMMs and Kiln's own loops share (kernels/cpu/threads.cpp), and bad counts are
// refused.
#include <gtest/gtest.h>
#include <omp.h>

#include "test_util.h"

namespace kiln::testing {
namespace {

TEST(Threads, SetNumThreadsSizesTheSharedOpenMPPool) {
  const int saved = get_num_threads();
  for (int n : {1, 2, 3}) {
    set_num_threads(n);
    EXPECT_EQ(get_num_threads(), n);
    EXPECT_EQ(omp_get_max_threads(), n);  // oneDNN sizes its parallel regions from this
    Tensor a = random({96, 80}), b = random({80, 64});
    EXPECT_EQ(mm(a, b).sizes(), IntArrayRef({96, 64}));  // oneDNN runs in that pool
    EXPECT_EQ(omp_get_max_threads(), n);
  }
  set_num_threads(saved);
  EXPECT_EQ(omp_get_max_threads(), saved);
}

TEST(Threads, RejectsNonPositiveCounts) {
  expect_error(ErrorKind::Value, "expected a positive number of threads, got 0",
               [] { set_num_threads(0); });
}

}  // namespace
}  // namespace kiln::testing
