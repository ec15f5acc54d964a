// Custom autograd Functions (Note [Custom functions] in function.h), checked with gradcheck.
#include <gtest/gtest.h>

#include "autograd/gradcheck.h"
#include "test_util.h"

namespace kiln {
namespace {

using autograd::AutogradContext;
using autograd::variable_list;
using testing::expect_close;
using testing::expect_error;
using testing::gradcheck;
using testing::random;
using V = std::vector<Tensor>;

// y = x * c (c a double in saved_data), with x saved for nothing: checks saved_data.
struct ScaleBy : autograd::Function<ScaleBy> {
  static Tensor forward(AutogradContext* ctx, const Tensor& x, double c) {
    ctx->saved_data["c"] = c;
    return x * c;
  }
  static variable_list backward(AutogradContext* ctx, variable_list g) {
    return {g[0] * std::any_cast<double>(ctx->saved_data["c"]), Tensor()};
  }
};

// y = a * exp(b): saves an input and an output.
struct MulExp : autograd::Function<MulExp> {
  static Tensor forward(AutogradContext* ctx, const Tensor& a, const Tensor& b) {
    Tensor e = exp(b);
    Tensor y = a * e;
    ctx->save_for_backward({a, e, y});
    return y;
  }
  static variable_list backward(AutogradContext* ctx, variable_list g) {
    auto s = ctx->get_saved_variables();  // a, e, y
    Tensor ga = ctx->needs_input_grad(0) ? g[0] * s[1] : Tensor();
    Tensor gb = ctx->needs_input_grad(1) ? g[0] * s[2] : Tensor();
    return {ga, gb};
  }
};

// Two outputs (sorted-like max and its index, the index non-differentiable) and a list input.
struct MaxAndSum : autograd::Function<MaxAndSum> {
  static variable_list forward(AutogradContext* ctx, const variable_list& xs) {
    Tensor sum = xs[0] + xs[1];
    auto [v, i] = max(sum, 0);
    ctx->mark_non_differentiable({i});
    ctx->save_for_backward({i});
    ctx->saved_data["sizes"] = std::vector<int64_t>(sum.sizes().begin(), sum.sizes().end());
    return {v, i, sum};
  }
  static variable_list backward(AutogradContext* ctx, variable_list g) {
    Tensor idx = ctx->get_saved_variables()[0];
    auto sizes = std::any_cast<std::vector<int64_t>>(ctx->saved_data["sizes"]);
    Tensor gs = zeros(sizes, g[0].dtype()).scatter(0, idx.unsqueeze(0), g[0].unsqueeze(0)) + g[2];
    return {gs, gs};
  }
};

struct Identity : autograd::Function<Identity> {
  static Tensor forward(AutogradContext*, const Tensor& x) { return x; }
  static variable_list backward(AutogradContext*, variable_list g) { return {g[0] * 2}; }
};

struct WrongCount : autograd::Function<WrongCount> {
  static Tensor forward(AutogradContext*, const Tensor& x) { return x * 1; }
  static variable_list backward(AutogradContext*, variable_list g) { return {g[0], g[0]}; }
};

TEST(AutogradFunction, NameSavedDataAndGradcheck) {
  Tensor x = random({2, 3}, kFloat64, -1, 1, 1);
  EXPECT_TRUE(gradcheck([](const V& v) { return ScaleBy::apply(v[0], 2.5); }, {x}));
  Tensor xr = x.clone().requires_grad_();
  Tensor y = ScaleBy::apply(xr, 2.0);
  ASSERT_TRUE(y.requires_grad());
  EXPECT_STREQ(y.grad_fn()->name(), "ScaleByBackward");
  EXPECT_STREQ(y.grad_fn()->next_edges()[0].fn->name(), "AccumulateGrad");
}

TEST(AutogradFunction, SavedTensorsAndNeedsInputGrad) {
  Tensor a = random({2, 3}, kFloat64, -1, 1, 2);
  Tensor b = random({2, 3}, kFloat64, -1, 1, 3);
  EXPECT_TRUE(gradcheck([](const V& v) { return MulExp::apply(v[0], v[1]); }, {a, b}));
  // Only b requires grad: a's gradient is not computed.
  Tensor br = b.clone().requires_grad_();
  MulExp::apply(a, br).sum().backward();
  expect_close(br.grad(), a * exp(b), 1e-12, 1e-12);
  // Composes with built-in ops, and double backward works through backward's ops.
  EXPECT_TRUE(gradcheck([](const V& v) { return MulExp::apply(v[0].tanh(), v[1] * 2).sum({1}); },
                        {a, b}));
  EXPECT_TRUE(gradcheck([](const V& v) {
    autograd::EnableGradGuard on;  // gradcheck's finite differences run under no_grad
    Tensor s = MulExp::apply(v[0], v[1]).sum();
    return autograd::grad({s}, {v[1]}, {}, std::nullopt, true)[0];
  }, {a, b}));
}

TEST(AutogradFunction, SavedTensorsAreVersionCheckedAndFreed) {
  Tensor a = random({3}, kFloat64, -1, 1, 4).requires_grad_();
  Tensor b = random({3}, kFloat64, -1, 1, 5);
  Tensor y = MulExp::apply(a * 1, b);
  y.sum().backward();
  expect_error(ErrorKind::Runtime, "second time", [&] { y.sum().backward(); });
  Tensor a2 = a * 1;
  Tensor y2 = MulExp::apply(a2, b);
  {
    autograd::NoGradGuard ng;
    a2 += 1;
  }
  expect_error(ErrorKind::Runtime, "modified by an inplace operation", [&] { y2.sum().backward(); });
}

TEST(AutogradFunction, MultipleOutputsNonDifferentiableAndListInput) {
  Tensor a = random({3, 2}, kFloat64, -1, 1, 6);
  Tensor b = random({3, 2}, kFloat64, -1, 1, 7);
  EXPECT_TRUE(gradcheck([](const V& v) { return MaxAndSum::apply(variable_list{v[0], v[1]})[0]; },
                        {a, b}));
  EXPECT_TRUE(gradcheck([](const V& v) {
    auto r = MaxAndSum::apply(variable_list{v[0], v[1]});
    return r[0].sum() + r[2].sum() * 2;
  }, {a, b}));
  Tensor ar = a.clone().requires_grad_();
  auto r = MaxAndSum::apply(variable_list{ar, b});
  EXPECT_TRUE(r[0].requires_grad());
  EXPECT_FALSE(r[1].requires_grad());
  EXPECT_EQ(r[1].dtype(), kInt64);
  EXPECT_EQ(r[0].grad_fn(), r[2].grad_fn());
  EXPECT_EQ(r[2].output_nr(), 2);
}

TEST(AutogradFunction, GradModeOffRecordsNothing) {
  Tensor x = random({2}, kFloat64, -1, 1, 8).requires_grad_();
  {
    autograd::NoGradGuard ng;
    EXPECT_FALSE(ScaleBy::apply(x, 2.0).requires_grad());
  }
  EXPECT_FALSE(ScaleBy::apply(x.detach(), 2.0).requires_grad());
  // forward itself runs without grad: its ops record nothing.
  struct Probe : autograd::Function<Probe> {
    static Tensor forward(AutogradContext*, const Tensor& x) {
      EXPECT_FALSE(autograd::GradMode::is_enabled());
      Tensor y = x * 2;
      EXPECT_FALSE(y.requires_grad());
      return y;
    }
    static variable_list backward(AutogradContext*, variable_list g) { return {g[0] * 2}; }
  };
  EXPECT_TRUE(Probe::apply(x).requires_grad());
}

TEST(AutogradFunction, ReturnedInputIsAliasedAndErrors) {
  Tensor x = random({2}, kFloat64, -1, 1, 9).requires_grad_();
  Tensor y = Identity::apply(x);
  EXPECT_NE(y.impl(), x.impl());
  EXPECT_TRUE(x.is_leaf());  // the input keeps its own history
  EXPECT_STREQ(y.grad_fn()->name(), "IdentityBackward");
  y.sum().backward();
  expect_close(x.grad(), full({2}, 2.0, kFloat64), 0, 0);
  Tensor z = random({2}, kFloat64, -1, 1, 10).requires_grad_();
  expect_error(ErrorKind::Runtime, "incorrect number of gradients",
               [&] { WrongCount::apply(z).sum().backward(); });
}

// x.mul_(2) in place, marked dirty: x is returned and its history moves onto this function.
struct DoubleInPlace : autograd::Function<DoubleInPlace> {
  static Tensor forward(AutogradContext* ctx, Tensor x) {
    x.mul_(full({}, 2.0, x.dtype()));
    ctx->mark_dirty({x});
    ctx->save_for_backward({x});  // the modified x: saved as an output, version-checked
    return x;
  }
  static variable_list backward(AutogradContext* ctx, variable_list g) {
    EXPECT_EQ(ctx->get_saved_variables().size(), 1u);
    return {g[0] * 2};
  }
};

// Marks its input dirty but returns something else.
struct DirtyNotReturned : autograd::Function<DirtyNotReturned> {
  static Tensor forward(AutogradContext* ctx, Tensor x) {
    x.add_(ones_like(x));
    ctx->mark_dirty({x});
    return x * 1;
  }
  static variable_list backward(AutogradContext*, variable_list g) { return {g[0]}; }
};

TEST(AutogradFunction, MarkDirtyRebasesTheInput) {
  Tensor leaf = random({3}, kFloat64, -1, 1, 11).requires_grad_();
  Tensor h = leaf * 3;  // a non-leaf: may be modified in place
  const int64_t v0 = h.version();
  Tensor y = DoubleInPlace::apply(h);
  EXPECT_EQ(y.impl(), h.impl());  // the same tensor, not an alias
  EXPECT_GT(h.version(), v0);
  EXPECT_STREQ(h.grad_fn()->name(), "DoubleInPlaceBackward");
  (y * y).sum().backward();
  // y = 6 leaf, d/dleaf sum(y^2) = 2 y * 6.
  expect_close(leaf.grad(), 72 * leaf.detach(), 1e-12, 1e-12);
  EXPECT_TRUE(testing::gradcheck(
      [](const std::vector<Tensor>& v) { return DoubleInPlace::apply(v[0] * 1); },
      {random({4}, kFloat64, -1, 1, 12)}));
  // A leaf that requires grad can't be modified in place, and a dirty input must be returned.
  Tensor leaf2 = random({3}, kFloat64, -1, 1, 13).requires_grad_();
  expect_error(ErrorKind::Runtime, "leaf Variable that requires grad",
               [&] { DoubleInPlace::apply(leaf2); });
  expect_error(ErrorKind::Value, "was not returned",
               [&] { DirtyNotReturned::apply(leaf * 1); });
  // A saved dirty tensor changed again before backward is caught by the version check.
  Tensor h2 = leaf * 1;
  Tensor y2 = DoubleInPlace::apply(h2);
  y2.detach().add_(ones_like(y2.detach()));
  expect_error(ErrorKind::Runtime, "modified by an inplace operation",
               [&] { y2.sum().backward(); });
}

}  // namespace
}  // namespace kiln
