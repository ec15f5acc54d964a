// See Note [Split backward]: backward_input() + backward_weight() against backward(), for a
// two-layer network, a parameter used twice, a stage with no input to differentiate, and misuse.
#include <gtest/gtest.h>

#include "kiln/autograd/engine.h"
#include "kiln/autograd_hooks.h"
#include "test_util.h"

namespace kiln {
namespace {

using testing::expect_close;
using testing::expect_error;
using testing::random;

struct Net {
  Tensor w1 = random({5, 4}, kFloat64, -1, 1, 11).requires_grad_();
  Tensor b1 = random({5}, kFloat64, -1, 1, 12).requires_grad_();
  Tensor w2 = random({3, 5}, kFloat64, -1, 1, 13).requires_grad_();
  // The parameter w2 is used twice (two paths into its AccumulateGrad).
  Tensor forward(const Tensor& x) const {
    Tensor h = tanh(linear(x, w1, b1));
    return mm(linear(h, w2), w2) + h;  // [n, 5]
  }
  std::vector<Tensor> params() const { return {w1, b1, w2}; }
};

void expect_same(const Tensor& a, const Tensor& b) {
  ASSERT_TRUE(a.defined() && b.defined());
  expect_close(a, b, 1e-12, 1e-12);
}

TEST(SplitBackward, InputThenWeightEqualsBackward) {
  Net net;
  Tensor x0 = random({6, 4}, kFloat64, -1, 1, 14);
  Tensor g = random({6, 5}, kFloat64, -1, 1, 15);
  // Reference: one backward.
  Tensor xr = x0.clone().requires_grad_();
  autograd::backward({net.forward(xr)}, {g});
  std::vector<Tensor> ref;
  for (auto& p : net.params()) ref.push_back(p.grad().clone()), p.set_grad(Tensor());
  // Split.
  Tensor x = x0.clone().requires_grad_();
  Tensor y = net.forward(x);
  autograd::DeferredWeightGrad deferred;
  auto gx = autograd::backward_input({y}, {x}, {g}, deferred);
  expect_same(gx[0], xr.grad());
  EXPECT_FALSE(x.grad().defined());  // returned, not accumulated
  for (auto& p : net.params()) EXPECT_FALSE(p.grad().defined()) << "weight work done early";
  EXPECT_FALSE(deferred.empty());
  autograd::backward_weight(deferred);
  EXPECT_TRUE(deferred.empty());
  auto ps = net.params();
  for (size_t i = 0; i < ps.size(); ++i) expect_same(ps[i].grad(), ref[i]);
}

TEST(SplitBackward, InputPartSkipsWeightGradients) {
  // The matmul's node computes only the input's gradient in the first half.
  Tensor w = random({3, 4}, kFloat64, -1, 1, 21).requires_grad_();
  Tensor x = random({2, 4}, kFloat64, -1, 1, 22).requires_grad_();
  Tensor y = mm(x, w.t());
  std::vector<bool> weight_defined;
  y.grad_fn()->register_hook(
      [&](const autograd::variable_list& out, const autograd::variable_list&) {
        weight_defined.push_back(out.size() > 1 && out[1].defined());
        return autograd::variable_list{};
      });
  autograd::DeferredWeightGrad deferred;
  autograd::backward_input({y.sum()}, {x}, {}, deferred);
  ASSERT_EQ(weight_defined.size(), 1u);
  EXPECT_FALSE(weight_defined[0]);
  autograd::backward_weight(deferred);
  expect_same(w.grad(), x.sum(std::vector<int64_t>{0}, true).expand({3, 4}));
}

TEST(SplitBackward, NoInputsDefersEverything) {
  // A first pipeline stage: its input needs no gradient, so all of its backward is weight work.
  Net net;
  Tensor x = random({6, 4}, kFloat64, -1, 1, 31);
  autograd::backward({net.forward(x).sum()});
  std::vector<Tensor> ref;
  for (auto& p : net.params()) ref.push_back(p.grad().clone()), p.set_grad(Tensor());
  autograd::DeferredWeightGrad deferred;
  auto gx = autograd::backward_input({net.forward(x).sum()}, {}, {}, deferred);
  EXPECT_TRUE(gx.empty());
  for (auto& p : net.params()) EXPECT_FALSE(p.grad().defined());
  autograd::backward_weight(deferred);
  auto ps = net.params();
  for (size_t i = 0; i < ps.size(); ++i) expect_same(ps[i].grad(), ref[i]);
}

TEST(SplitBackward, Errors) {
  Tensor w = random({3}, kFloat64, -1, 1, 41).requires_grad_();
  Tensor x = random({3}, kFloat64, -1, 1, 42).requires_grad_();
  autograd::DeferredWeightGrad deferred;
  autograd::backward_input({(x * w).sum()}, {x}, {}, deferred);
  expect_error(ErrorKind::Value, "run backward_weight() on it first",
               [&] { autograd::backward_input({(x * w).sum()}, {x}, {}, deferred); });
  autograd::backward_weight(deferred);
  Tensor plain = random({3}, kFloat64, -1, 1, 43);
  expect_error(ErrorKind::Runtime, "(input 0) does not require grad",
               [&] { autograd::backward_input({(x * w).sum()}, {plain}, {}, deferred); });
  autograd::backward_weight(deferred);  // empty: nothing to do
}

}  // namespace
}  // namespace kiln
