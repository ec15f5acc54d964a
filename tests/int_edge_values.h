// tests/int_edge_values.h: the integer edge values every integer kernel is checked on (See Note
// [Integer edge values]), shared by the CPU suite (tests/kernels/int_edge_test.cpp) and the GPU
// one (tests/cuda/int_edge_test.cpp). Needs no GoogleTest.
//
//   for (int32_t a : kiln::testing::int_edges<int32_t>()) ...   // MIN, MIN+1, -2, -1, 0, 1, ...
#pragma once

#include <limits>
#include <type_traits>
#include <vector>

namespace kiln::testing {

// {MIN, MIN+1, -2, -1, 0, 1, 2, MAX-1, MAX}; unsigned: {0, 1, 2, MAX-1, MAX}.
template <typename T>
std::vector<T> int_edges() {
  constexpr T lo = std::numeric_limits<T>::lowest(), hi = std::numeric_limits<T>::max();
  if constexpr (std::is_unsigned_v<T>) return {0, 1, 2, T(hi - 1), hi};
  else return {lo, T(lo + 1), -2, -1, 0, 1, 2, T(hi - 1), hi};
}

}  // namespace kiln::testing
