// Makes kiln::set_num_threads govern the OpenMP runtime as well, so oneDNN's parallel regions
// (which size themselves from omp_get_max_threads) use the same number of threads as Kiln's.
#include <omp.h>

#include "kiln/parallel.h"

namespace kiln::kernels {
namespace {

const int kRegistered = [] {
  set_num_threads_hook([](int n) { omp_set_num_threads(n); });
  return 0;
}();

}  // namespace
}  // namespace kiln::kernels
