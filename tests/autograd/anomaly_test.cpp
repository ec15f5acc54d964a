// Anomaly mode (Note [Anomaly mode] in anomaly.h): creation stacks, NaN detection naming the node.
#include <gtest/gtest.h>

#include "autograd/gradcheck.h"
#include "test_util.h"

namespace kiln {
namespace {

using autograd::AutogradContext;
using autograd::variable_list;
using testing::random;

// A function whose backward produces NaN.
struct NanBackward : autograd::Function<NanBackward> {
  static Tensor forward(AutogradContext*, const Tensor& x) { return x * 1; }
  static variable_list backward(AutogradContext*, variable_list g) {
    return {g[0] * std::numeric_limits<double>::quiet_NaN()};
  }
};

// The stack names library frames (kiln_tensor's exported ops); frames of the test executable
// itself show as addresses unless it is linked with -rdynamic.
Tensor make_sqrt_of(const Tensor& x) { return sqrt(x); }

TEST(AutogradAnomaly, GuardIsScoped) {
  EXPECT_FALSE(autograd::AnomalyMode::is_enabled());
  {
    autograd::DetectAnomalyGuard g;
    EXPECT_TRUE(autograd::AnomalyMode::is_enabled());
    {
      autograd::DetectAnomalyGuard off(false);
      EXPECT_FALSE(autograd::AnomalyMode::is_enabled());
    }
    EXPECT_TRUE(autograd::AnomalyMode::is_enabled());
  }
  EXPECT_FALSE(autograd::AnomalyMode::is_enabled());
}

TEST(AutogradAnomaly, NodesRecordCreationStackOnlyWhenEnabled) {
  Tensor x = random({3}, kFloat64, 0.5, 1, 1).requires_grad_();
  EXPECT_TRUE(make_sqrt_of(x).grad_fn()->creation_stack().empty());
  autograd::DetectAnomalyGuard g;
  Tensor y = make_sqrt_of(x);
  const std::string& st = y.grad_fn()->creation_stack();
  EXPECT_NE(st.find("sqrt"), std::string::npos) << st;
}

TEST(AutogradAnomaly, NanInBackwardNamesTheNodeAndItsCreation) {
  // sqrt at 0 with a zero incoming gradient: 0 / (2 sqrt(0)) is NaN in SqrtBackward0.
  Tensor x = testing::from_vector<double>({0.0, 1.0}, {2}).requires_grad_();
  {
    // Without anomaly mode the NaN goes through silently.
    Tensor y = make_sqrt_of(x) * 0;
    y.sum().backward();
    EXPECT_TRUE(std::isnan(testing::to_doubles(x.grad())[0]));
  }
  autograd::DetectAnomalyGuard g;
  Tensor y = make_sqrt_of(x);
  Tensor z = y * 0;
  try {
    z.sum().backward();
    FAIL() << "expected an anomaly error";
  } catch (const Error& e) {
    std::string msg = e.what();
    EXPECT_EQ(e.kind(), ErrorKind::Runtime);
    EXPECT_NE(msg.find("Function 'SqrtBackward0' returned nan values in its 0th output"),
              std::string::npos) << msg;
    EXPECT_NE(msg.find("Traceback of forward call"), std::string::npos) << msg;
    EXPECT_NE(msg.find("sqrt"), std::string::npos) << msg;
  }
}

TEST(AutogradAnomaly, CustomFunctionAndErrorsInsideBackward) {
  autograd::DetectAnomalyGuard g;
  Tensor x = random({2}, kFloat64, -1, 1, 2).requires_grad_();
  testing::expect_error(ErrorKind::Runtime, "'NanBackwardBackward' returned nan values",
                        [&] { NanBackward::apply(x).sum().backward(); });
  // An error raised inside a node's backward gets the node and its creation stack appended.
  Tensor a = x * 1;
  Tensor y = a * a;
  y.sum().backward();
  testing::expect_error(ErrorKind::Runtime, "raised in the backward of MulBackward0",
                        [&] { y.sum().backward(); });
}

}  // namespace
}  // namespace kiln
