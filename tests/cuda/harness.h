// tests/cuda/harness.h: a tiny GoogleTest-free test harness for kiln_gpu_tests (the GPU machine
// has no GoogleTest).
//
//   GPU_TEST(Allocator, Reuse) {
//     REQUIRE_GPU();                       // skips when no CUDA device is present
//     EXPECT_EQ(a, b);  EXPECT_NEAR(x, y, 1e-6);  ASSERT_TRUE(p != nullptr);
//     EXPECT_ERROR(kiln::ErrorKind::Runtime, "out of memory", { kiln::empty(...); });
//   }
//
// main() (harness_main.cpp) runs every test, or those whose "Suite.Name" contains argv[1], prints
// one line per test and ends with exactly "N passed, N failed, N skipped". Its exit code is 0
// unless a test failed. An ASSERT_* failure or an unexpected exception ends the test as failed.
#pragma once

#include <cmath>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

#include "kiln/error.h"

namespace kiln::gputest {

struct TestCase {
  std::string name;
  void (*fn)();
};
std::vector<TestCase>& registry();
int register_test(const char* suite, const char* name, void (*fn)());

// Records a failed expectation of the running test.
void add_failure(const char* file, int line, const std::string& msg);
struct Skip {
  std::string reason;
};
struct AssertionAbort {};

bool gpu_available();

template <typename T>
void print_value(std::ostream& os, const T& v) {
  if constexpr (requires { os << v; }) {
    os << v;
  } else {
    os << "?";
  }
}

template <typename A, typename B>
std::string describe(const char* ea, const char* eb, const A& a, const B& b) {
  std::ostringstream os;
  os << ea << " (";
  print_value(os, a);
  os << ") vs " << eb << " (";
  print_value(os, b);
  os << ")";
  return os.str();
}

}  // namespace kiln::gputest

#define GPU_TEST(suite, name)                                                          \
  static void suite##_##name##_body();                                                 \
  static const int suite##_##name##_reg =                                              \
      ::kiln::gputest::register_test(#suite, #name, &suite##_##name##_body);           \
  static void suite##_##name##_body()

#define REQUIRE_GPU()                                                                  \
  do {                                                                                 \
    if (!::kiln::gputest::gpu_available()) throw ::kiln::gputest::Skip{"no CUDA device"}; \
  } while (0)

#define KILN_GT_CHECK_(cond, msg, abort)                                               \
  do {                                                                                 \
    if (!(cond)) {                                                                     \
      ::kiln::gputest::add_failure(__FILE__, __LINE__, msg);                           \
      if (abort) throw ::kiln::gputest::AssertionAbort{};                              \
    }                                                                                  \
  } while (0)

#define EXPECT_TRUE(c) KILN_GT_CHECK_((c), "expected true: " #c, false)
#define EXPECT_FALSE(c) KILN_GT_CHECK_(!(c), "expected false: " #c, false)
#define ASSERT_TRUE(c) KILN_GT_CHECK_((c), "expected true: " #c, true)
#define EXPECT_EQ(a, b) \
  KILN_GT_CHECK_((a) == (b), "expected equal: " + ::kiln::gputest::describe(#a, #b, (a), (b)), false)
#define EXPECT_NE(a, b) \
  KILN_GT_CHECK_((a) != (b), "expected different: " + ::kiln::gputest::describe(#a, #b, (a), (b)), false)
#define ASSERT_EQ(a, b) \
  KILN_GT_CHECK_((a) == (b), "expected equal: " + ::kiln::gputest::describe(#a, #b, (a), (b)), true)
#define EXPECT_LE(a, b) \
  KILN_GT_CHECK_((a) <= (b), "expected <=: " + ::kiln::gputest::describe(#a, #b, (a), (b)), false)
#define EXPECT_NEAR(a, b, tol)                                                          \
  KILN_GT_CHECK_(std::fabs(static_cast<double>(a) - static_cast<double>(b)) <= (tol),    \
                 "expected near (tol " #tol "): " + ::kiln::gputest::describe(#a, #b, (a), (b)), false)

// Runs `block` and checks it throws kiln::Error of `kind` whose message contains `needle`.
#define EXPECT_ERROR(error_kind, needle, block)                                              \
  do {                                                                                 \
    bool kiln_thrown_ = false;                                                         \
    try {                                                                              \
      block;                                                                           \
    } catch (const ::kiln::Error& e) {                                                 \
      kiln_thrown_ = true;                                                             \
      KILN_GT_CHECK_(e.kind() == (error_kind), std::string("wrong error kind: ") + e.what(), false); \
      KILN_GT_CHECK_(std::string(e.what()).find(needle) != std::string::npos,          \
                     std::string("message lacks '") + (needle) + "': " + e.what(), false); \
    }                                                                                  \
    KILN_GT_CHECK_(kiln_thrown_, std::string("expected a kiln::Error containing '") + (needle) + "'", false); \
  } while (0)
