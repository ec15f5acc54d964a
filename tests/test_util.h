// tests/test_util.h: shared helpers for Kiln's GoogleTest suites: the GoogleTest-free ones of
// tests/samples/util.h (random, from_vector, non_contiguous, to_doubles, ...) and these.
//
//   testing::expect_close(got, want, 1e-6);                 // shape, dtype-aware values
//   testing::expect_error(ErrorKind::Value, "needle", [&] { ... });
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "samples/util.h"

namespace kiln::testing {

inline void expect_close(const Tensor& got, const Tensor& want, double rtol = 1e-5, double atol = 1e-6) {
  ASSERT_EQ(got.sizes(), want.sizes()) << "shapes differ";
  auto g = to_doubles(got), w = to_doubles(want);
  for (size_t i = 0; i < g.size(); ++i) {
    if (std::isnan(w[i])) {
      EXPECT_TRUE(std::isnan(g[i])) << "element " << i;
      continue;
    }
    if (std::isinf(w[i])) {
      EXPECT_EQ(g[i], w[i]) << "element " << i;
      continue;
    }
    EXPECT_NEAR(g[i], w[i], atol + rtol * std::fabs(w[i])) << "element " << i;
  }
}

// Runs `fn` and checks it throws kiln::Error of `kind` whose message contains `needle`.
template <typename F>
void expect_error(ErrorKind kind, const std::string& needle, F&& fn) {
  try {
    fn();
    ADD_FAILURE() << "expected " << error_kind_name(kind) << " containing '" << needle << "'";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), kind) << e.what();
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

}  // namespace kiln::testing
