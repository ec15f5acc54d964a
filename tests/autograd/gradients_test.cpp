// Generated Autograd kernels against finite differences (float64), and the coverage list.
#include <gtest/gtest.h>

#include "autograd/gradcheck.h"
#include "test_util.h"

namespace kiln {
namespace {

using testing::expect_close;
using testing::gradcheck;
using testing::random;
using V = std::vector<Tensor>;

TEST(AutogradGradcheck, Unary) {
  Tensor x = random({2, 3}, kFloat64, -2, 2, 1);
  Tensor pos = random({2, 3}, kFloat64, 0.5, 2, 2);
  EXPECT_TRUE(gradcheck([](const V& v) { return neg(v[0]); }, {x}));
  EXPECT_TRUE(gradcheck([](const V& v) { return exp(v[0]); }, {x}));
  EXPECT_TRUE(gradcheck([](const V& v) { return log(v[0]); }, {pos}));
  EXPECT_TRUE(gradcheck([](const V& v) { return sqrt(v[0]); }, {pos}));
  EXPECT_TRUE(gradcheck([](const V& v) { return tanh(v[0]); }, {x}));
  EXPECT_TRUE(gradcheck([](const V& v) { return sigmoid(v[0]); }, {x}));
  EXPECT_TRUE(gradcheck([](const V& v) { return sin(v[0]); }, {x}));
  EXPECT_TRUE(gradcheck([](const V& v) { return cos(v[0]); }, {x}));
  EXPECT_TRUE(gradcheck([](const V& v) { return silu(v[0]); }, {x}));
  EXPECT_TRUE(gradcheck([](const V& v) { return erf(v[0]); }, {x}));
  EXPECT_TRUE(gradcheck([](const V& v) { return reciprocal(v[0]); }, {pos}));
  EXPECT_TRUE(gradcheck([](const V& v) { return relu(v[0]); }, {x}));  // no element near 0
}

TEST(AutogradGradcheck, Binary) {
  Tensor a = random({2, 3}, kFloat64, -2, 2, 3);
  Tensor b = random({2, 3}, kFloat64, 0.5, 2, 4);
  EXPECT_TRUE(gradcheck([](const V& v) { return mul(v[0], v[1]); }, {a, b}));
  EXPECT_TRUE(gradcheck([](const V& v) { return div(v[0], v[1]); }, {a, b}));
  EXPECT_TRUE(gradcheck([](const V& v) { return add(v[0], v[1], 2.5); }, {a, b}));
  EXPECT_TRUE(gradcheck([](const V& v) { return sub(v[0], v[1], 0.5); }, {a, b}));
  // Broadcasting: (2, 3) * (3) and (2, 1) + (2, 3).
  Tensor row = random({3}, kFloat64, -1, 1, 5);
  Tensor col = random({2, 1}, kFloat64, -1, 1, 6);
  EXPECT_TRUE(gradcheck([](const V& v) { return mul(v[0], v[1]); }, {a, row}));
  EXPECT_TRUE(gradcheck([](const V& v) { return add(v[0], v[1]); }, {col, a}));
  Tensor cond = random({2, 3}, kFloat64, -1, 1, 7) > 0;
  EXPECT_TRUE(gradcheck([cond](const V& v) { return where(cond, v[0], v[1]); }, {a, b}));
}

TEST(AutogradGradcheck, MatmulAndViews) {
  Tensor a = random({2, 3}, kFloat64, -1, 1, 8);
  Tensor b = random({3, 4}, kFloat64, -1, 1, 9);
  Tensor c = random({2, 4}, kFloat64, -1, 1, 10);
  EXPECT_TRUE(gradcheck([](const V& v) { return mm(v[0], v[1]); }, {a, b}));
  EXPECT_TRUE(gradcheck([](const V& v) { return addmm(v[2], v[0], v[1], 0.5, 2.0); }, {a, b, c}));
  Tensor ba = random({2, 2, 3}, kFloat64, -1, 1, 11);
  Tensor bb = random({2, 3, 2}, kFloat64, -1, 1, 12);
  EXPECT_TRUE(gradcheck([](const V& v) { return bmm(v[0], v[1]); }, {ba, bb}));
  EXPECT_TRUE(gradcheck([](const V& v) { return v[0].t(); }, {a}));
  EXPECT_TRUE(gradcheck([](const V& v) { return v[0].transpose(0, 2); }, {ba}));
  EXPECT_TRUE(gradcheck([](const V& v) { return v[0].view({3, 2}); }, {a}));
  EXPECT_TRUE(gradcheck([](const V& v) { return v[0].unsqueeze(1); }, {a}));
  EXPECT_TRUE(gradcheck([](const V& v) { return v[0].unsqueeze(0).squeeze({0}); }, {a}));
  EXPECT_TRUE(gradcheck([](const V& v) { return v[0].unsqueeze(0).expand({4, 2, 3}); }, {a}));
}

TEST(AutogradGradcheck, Reductions) {
  Tensor a = random({2, 3}, kFloat64, -1, 1, 13);
  EXPECT_TRUE(gradcheck([](const V& v) { return v[0].sum(); }, {a}));
  EXPECT_TRUE(gradcheck([](const V& v) { return v[0].sum({1}); }, {a}));
  EXPECT_TRUE(gradcheck([](const V& v) { return v[0].sum({0}, true); }, {a}));
  EXPECT_TRUE(gradcheck([](const V& v) { return v[0].mean(); }, {a}));
  EXPECT_TRUE(gradcheck([](const V& v) { return v[0].mean({-1}); }, {a}));
}

TEST(AutogradGradcheck, Composites) {
  // Composite rows record their constituents (no Autograd kernel of their own).
  Tensor a = random({2, 3}, kFloat64, -1, 1, 14);
  EXPECT_TRUE(gradcheck([](const V& v) { return v[0].reshape({3, 2}); }, {a}));
  EXPECT_TRUE(gradcheck([](const V& v) { return v[0].t().contiguous(); }, {a}));
  EXPECT_TRUE(gradcheck([](const V& v) { return v[0].clone(); }, {a}));
}

TEST(AutogradGradcheck, InplaceVariants) {
  // The in-place variants record the same node on the modified tensor; formulas that use the
  // result see it after the op, formulas that use self see a copy taken before.
  Tensor a = random({2, 3}, kFloat64, -1, 1, 16);
  Tensor b = random({2, 3}, kFloat64, 0.5, 2, 17);
  EXPECT_TRUE(gradcheck([](const V& v) { return (v[0] * 1).exp_(); }, {a}));
  EXPECT_TRUE(gradcheck([](const V& v) { return (v[0] * 1).tanh_(); }, {a}));
  EXPECT_TRUE(gradcheck([](const V& v) { return (v[0] * 1).sin_(); }, {a}));
  EXPECT_TRUE(gradcheck([](const V& v) { return (v[0] * 1).mul_(v[1]); }, {a, b}));
  EXPECT_TRUE(gradcheck([](const V& v) { return (v[0] * 1).div_(v[1]); }, {a, b}));
  EXPECT_TRUE(gradcheck([](const V& v) { return (v[0] * 1).add_(v[1], 3.0); }, {a, b}));
}

TEST(AutogradGradcheck, DtypeConversionFlowsBack) {
  // to() is composite (empty + copy_): CopyBackward0 casts the gradient back.
  Tensor x = random({3}, kFloat64, -1, 1, 18).requires_grad_();
  Tensor y = x.to(kFloat32);
  EXPECT_STREQ(y.grad_fn()->name(), "CopyBackward0");
  (y * 2).sum().backward();
  EXPECT_EQ(x.grad().dtype(), kFloat64);
  testing::expect_close(x.grad(), full_like(x.detach(), 2), 0, 0);
}

TEST(AutogradCoverage, MultiOutputOpsRecordFloatingOutputsOnly) {
  Tensor x = random({2, 3}, kFloat64, -1, 1, 19).requires_grad_();
  auto [values, indices] = max(x, 1);
  EXPECT_TRUE(values.requires_grad());
  EXPECT_STREQ(values.grad_fn()->name(), "MaxBackward1");
  EXPECT_FALSE(indices.requires_grad());
}

TEST(AutogradCoverage, NoPendingDerivatives) {
  // Every differentiable op records a real backward node (none waits for helpers any more).
  const auto& pending = autograd::pending_derivatives();
  std::ostringstream os;
  for (const auto& p : pending) os << "  " << p.op << ": waits for " << p.missing << "\n";
  EXPECT_TRUE(pending.empty()) << pending.size()
                               << " differentiable ops record a NotImplemented backward:\n"
                               << os.str();
  Tensor a = random({2, 3}, kFloat64, -1, 1, 15).requires_grad_();
  EXPECT_STREQ(cat({a, a}, 0).grad_fn()->name(), "CatBackward0");
  EXPECT_STREQ(std::get<0>(min(a, 1)).grad_fn()->name(), "MinBackward1");
}

TEST(AutogradGradcheck, MultiOutputReductions) {
  // max.dim/min.dim: the gradient of `values` goes to the selected elements; `indices` has none.
  Tensor x = random({3, 4}, kFloat64, -1, 1, 41);
  EXPECT_TRUE(gradcheck([](const V& v) { return std::get<0>(max(v[0], 1)); }, {x}));
  EXPECT_TRUE(gradcheck([](const V& v) { return std::get<0>(max(v[0], 0, true)); }, {x}));
  EXPECT_TRUE(gradcheck([](const V& v) { return std::get<0>(min(v[0], -1)); }, {x}));
  EXPECT_TRUE(gradcheck([](const V& v) { return std::get<0>(min(v[0], 0, true)) * 3; }, {x}));
  // Non-contiguous input.
  Tensor nc = random({4, 3}, kFloat64, -1, 1, 42);
  EXPECT_TRUE(gradcheck([](const V& v) { return std::get<0>(max(v[0].t(), 1)); }, {nc}));
  // Exactly the selected positions receive the gradient.
  Tensor y = testing::from_vector<double>({1, 5, 2, 7, 0, 3}, {2, 3}).requires_grad_();
  auto [values, indices] = max(y, 1);
  EXPECT_FALSE(indices.requires_grad());
  values.backward(testing::from_vector<double>({10, 20}, {2}));
  expect_close(y.grad(), testing::from_vector<double>({0, 10, 0, 20, 0, 0}, {2, 3}), 0, 0);
  // Double backward through the recorded formula.
  Tensor z = random({2, 3}, kFloat64, -1, 1, 43).requires_grad_();
  Tensor m = std::get<0>(max(z * z, 1)).sum();
  auto g = autograd::grad({m}, {z}, {}, std::nullopt, /*create_graph=*/true);
  ASSERT_TRUE(g[0].requires_grad());
  EXPECT_TRUE(gradcheck([](const V& v) {
    autograd::EnableGradGuard on;  // gradcheck's finite differences run under no_grad
    Tensor s = std::get<0>(max(v[0] * v[0], 1)).sum();
    return autograd::grad({s}, {v[0]}, {}, std::nullopt, true)[0];
  }, {z}));
}

TEST(AutogradGradcheck, ListOps) {
  Tensor a = random({2, 3}, kFloat64, -1, 1, 44);
  Tensor b = random({1, 3}, kFloat64, -1, 1, 45);
  Tensor c = random({2, 2}, kFloat64, -1, 1, 46);
  EXPECT_TRUE(gradcheck([](const V& v) { return cat({v[0], v[1]}, 0); }, {a, b}));
  EXPECT_TRUE(gradcheck([](const V& v) { return cat({v[0], v[1], v[0]}, -2) * 2; }, {a, b}));
  EXPECT_TRUE(gradcheck([](const V& v) { return cat({v[0], v[1]}, 1); }, {a, c}));
  EXPECT_TRUE(gradcheck([](const V& v) { return cat({v[0].t(), v[1].t()}, 1); }, {a, b}));
  // An input that does not require grad gets no gradient; the others do.
  Tensor fixed = random({2, 3}, kFloat64, -1, 1, 47);
  EXPECT_TRUE(gradcheck([fixed](const V& v) { return cat({fixed, v[0]}, 0); }, {a}));
  // Empty 1-D inputs are skipped by cat; they still get a (zero-size) gradient slot.
  Tensor e = kiln::zeros({0}, kFloat64);
  EXPECT_TRUE(gradcheck([](const V& v) { return cat({v[0], v[1]}, 0); }, {a, e}));
  // stack/split/chunk are composites over cat/unsqueeze/slice.
  Tensor d = random({2, 3}, kFloat64, -1, 1, 48);
  EXPECT_TRUE(gradcheck([](const V& v) { return stack({v[0], v[1]}, 0); }, {a, d}));
  EXPECT_TRUE(gradcheck([](const V& v) { return stack({v[0], v[1]}, 2); }, {a, d}));
  Tensor s = random({5, 2}, kFloat64, -1, 1, 49);
  EXPECT_TRUE(gradcheck([](const V& v) {
    auto parts = split(v[0], 2, 0);
    return parts[0] * 2 + parts[1] * 3;
  }, {s}));
  EXPECT_TRUE(gradcheck([](const V& v) { return split(v[0], 2, 0)[2] * 4; }, {s}));
  EXPECT_TRUE(gradcheck([](const V& v) {
    auto parts = chunk(v[0], 2, 1);
    return parts[0] * parts[1];
  }, {s}));
  // The node keeps the inputs' geometry, not the inputs: changing one in place is fine.
  Tensor x = random({2, 2}, kFloat64, -1, 1, 50).requires_grad_();
  Tensor w = x * 1;
  Tensor y = cat({w, x}, 0);
  {
    autograd::NoGradGuard ng;
    w *= 2;
  }
  y.sum().backward();
  expect_close(x.grad(), full_like(x.detach(), 2), 0, 0);
}

// The ops whose derivatives call the formula helpers of autograd/src/formulas_*.cpp.
TEST(Gradcheck, OpsThroughFormulaHelpers) {
  using V = std::vector<Tensor>;
  Tensor x = random({3, 4}, kFloat64, -1, 1, 31);
  Tensor pos = random({3, 4}, kFloat64, 0.5, 2, 32);
  Tensor sq = random({4, 4}, kFloat64, -1, 1, 33);
  Tensor idx = testing::from_vector<int64_t>({2, 0, 2}, {3});
  EXPECT_TRUE(gradcheck([](const V& v) { return softmax(v[0], 1); }, {x}));
  EXPECT_TRUE(gradcheck([](const V& v) { return log_softmax(v[0], 0); }, {x}));
  EXPECT_TRUE(gradcheck([](const V& v) { return gelu(v[0]); }, {x}));
  EXPECT_TRUE(gradcheck([](const V& v) { return gelu(v[0], "tanh"); }, {x}));
  EXPECT_TRUE(gradcheck([](const V& v) { return pow(v[0], v[1]); }, {pos, x}));
  EXPECT_TRUE(gradcheck([](const V& v) { return v[0].prod({1}); }, {x}));
  EXPECT_TRUE(gradcheck([](const V& v) { return v[0].var({1}); }, {x}));
  EXPECT_TRUE(gradcheck([](const V& v) { return v[0].std({0}); }, {x}));
  EXPECT_TRUE(gradcheck([](const V& v) { return v[0].norm(2, {1}); }, {x}));
  EXPECT_TRUE(gradcheck([](const V& v) { return logsumexp(v[0], {1}); }, {x}));
  EXPECT_TRUE(gradcheck([](const V& v) { return clamp(v[0], -0.5, 0.5); }, {x}));
  EXPECT_TRUE(gradcheck([](const V& v) { return v[0].permute({1, 0}) * 2; }, {x}));
  EXPECT_TRUE(gradcheck([](const V& v) { return v[0].select(1, 2) * 2; }, {x}));
  EXPECT_TRUE(gradcheck([](const V& v) { return v[0].slice(1, 1, 4, 2) * 2; }, {x}));
  EXPECT_TRUE(gradcheck([](const V& v) { return v[0].diagonal(1) * 2; }, {sq}));
  EXPECT_TRUE(gradcheck([](const V& v) { return v[0].as_strided({2, 2}, {1, 4}, 1) * 2; }, {sq}));
  EXPECT_TRUE(gradcheck([&](const V& v) { return index_select(v[0], 1, idx); }, {x}));
  EXPECT_TRUE(gradcheck([](const V& v) { return v[0].max(); }, {x}));
  EXPECT_TRUE(gradcheck([](const V& v) { return v[0].min(); }, {x}));
}

TEST(AutogradCoverage, CompositeRowsHaveNoGeneratedAutogradKernel) {
  for (const OperatorHandle* op : Dispatcher::get().ops()) {
    const OpInfo& info = op->info();
    if (info.kind != OpKind::Composite) continue;
    if (info.sharding == ShardingRule::Creation && info.num_args > 0 &&
        info.args[0].arg_type == ArgType::Tensor) {
      // The *_like rows are not differentiable; the DTensor library gives them an Autograd
      // kernel that redispatches below it (See Note [DTensor dispatch]).
      EXPECT_EQ(op->kernel(DispatchKey::Autograd).unboxed, nullptr) << op->name();
      continue;
    }
    // Other composite rows register their decomposition at every key, Autograd included.
    EXPECT_EQ(op->kernel(DispatchKey::Autograd).unboxed, op->kernel(DispatchKey::CPU).unboxed)
        << op->name();
  }
}

}  // namespace
}  // namespace kiln

namespace kiln {
namespace {

// In-place rows that are not generated `_` variants (fill_, copy_, zero_) refuse a leaf that
// requires grad, like every other in-place op.
TEST(AutogradInPlace, KernelRowsRefuseLeaves) {
  Tensor leaf = ones({3}, kFloat64).requires_grad_();
  for (auto fn : std::vector<std::function<void()>>{[&] { leaf.fill_(2); },
                                                    [&] { leaf.copy_(zeros({3}, kFloat64)); },
                                                    [&] { leaf.zero_(); }}) {
    testing::expect_error(ErrorKind::Runtime, "leaf", fn);
    EXPECT_TRUE(leaf.is_leaf());
    EXPECT_EQ(leaf.grad_fn(), nullptr);
  }
  Tensor as_int = leaf.to(kInt64);  // copy_ into an integer tensor records nothing
  EXPECT_FALSE(as_int.requires_grad());
  Tensor x = ones({3}, kFloat64).requires_grad_();
  Tensor y = x * 2;
  y.fill_(5);  // a non-leaf: its history is replaced
  y.sum().backward();
  testing::expect_close(x.grad(), zeros({3}, kFloat64), 0, 0);
}

}  // namespace
}  // namespace kiln
