// Forward-mode AD (kiln/autograd/forward_ad.h): dual tensors and levels, tangents through
// no_grad, in-place ops, views and multi-output ops, forward over reverse, and every
// differentiable op of the manifest: its forward-mode J t (float64, random tangent) against the
// reverse-mode Jacobian built from vjps with basis cotangents. Then func::jvp of a small MLP
// against finite differences, and the Hessian (jacfwd over jacrev).
#include "kiln/autograd/forward_ad.h"

#include <gtest/gtest.h>

#include <cmath>
#include <iostream>
#include <map>
#include <set>

#include "kiln/autograd/autograd.h"
#include "kiln/kiln.h"
#include "samples/manifest.h"
#include "test_util.h"

namespace kiln {
namespace {

namespace fwd = autograd::forward;
using testing::expect_close;
using testing::expect_error;
using testing::random;
using testing::to_doubles;

void expect_near(const Tensor& got, const Tensor& want, double tol = 1e-10) {
  expect_close(got, want, tol, tol);
}

TEST(ForwardAD, MakeDualAndUnpackDual) {
  Tensor x = random({2, 3}, kFloat64, -1, 1, 1), t = random({2, 3}, kFloat64, -1, 1, 2);
  EXPECT_EQ(fwd::current_level(), 0u);
  fwd::DualLevel level;
  EXPECT_EQ(fwd::current_level(), level.id());
  Tensor d = fwd::make_dual(x, t);
  EXPECT_TRUE(d.is_alias_of(x));
  EXPECT_FALSE(d.requires_grad());
  auto [p, tan] = fwd::unpack_dual(d);
  EXPECT_TRUE(tan.is_same(t));  // stored as is, as in PyTorch
  expect_near(p, x);
  EXPECT_FALSE(fwd::unpack_dual(p).tangent.defined());  // the primal view has no tangent
  EXPECT_FALSE(fwd::unpack_dual(x).tangent.defined());  // nor does the caller's tensor
  // A tensor that requires grad: the dual keeps its history.
  Tensor w = random({3}, kFloat64, -1, 1, 3).requires_grad_();
  Tensor dw = fwd::make_dual(w, kiln::ones({3}, kFloat64));
  EXPECT_TRUE(dw.requires_grad());
  dw.sum().backward();
  expect_near(w.grad(), kiln::ones({3}, kFloat64));
}

TEST(ForwardAD, BadInput) {
  Tensor x = random({2, 3}, kFloat64, -1, 1, 4);
  expect_error(ErrorKind::Runtime, "no forward AD level is active", [&] {
    fwd::make_dual(x, kiln::ones({2, 3}, kFloat64));
  });
  fwd::DualLevel level;
  expect_error(ErrorKind::Value, "shape [3, 2] but the primal has shape [2, 3]", [&] {
    fwd::make_dual(x, kiln::ones({3, 2}, kFloat64));
  });
  expect_error(ErrorKind::Value, "dtype float32 but the primal has dtype float64", [&] {
    fwd::make_dual(x, kiln::ones({2, 3}, kFloat32));
  });
  expect_error(ErrorKind::Value, "floating point tangent", [&] {
    fwd::make_dual(x, kiln::ones({2, 3}, kInt64));
  });
  expect_error(ErrorKind::Value, "undefined", [&] { fwd::make_dual(Tensor(), x); });
  expect_error(ErrorKind::NotImplemented, "nested forward AD levels",
               [&] { fwd::DualLevel inner; });
  EXPECT_EQ(fwd::current_level(), level.id());  // the failed level left the active one alone
  Tensor t = fwd::make_dual(kiln::ones({2, 3}, kFloat64), kiln::ones({2, 3}, kFloat64));
  expect_error(ErrorKind::NotImplemented, "tangents of tangents", [&] { fwd::make_dual(x, t); });
  // out= variants do not propagate tangents: refused, as reverse mode refuses them.
  Tensor d = fwd::make_dual(x, kiln::ones({2, 3}, kFloat64));
  Tensor out = kiln::empty({2, 3}, kFloat64);
  expect_error(ErrorKind::Runtime, "out=", [&] { kiln::exp_out(out, d); });
}

TEST(ForwardAD, TangentsFlowUnderNoGradAndIgnoreRequiresGradFlags) {
  Tensor x = random({4}, kFloat64, -1, 1, 5), t = random({4}, kFloat64, -1, 1, 6);
  fwd::DualLevel level;
  Tensor d = fwd::make_dual(x, t);
  autograd::NoGradGuard ng;
  Tensor y = kiln::sin(d) * d;
  expect_near(fwd::unpack_dual(y).tangent, (kiln::cos(x) * x + kiln::sin(x)) * t);
  EXPECT_FALSE(y.requires_grad());
  d.requires_grad_(false);  // does not drop the tangent (or the dispatch key that carries it)
  expect_near(fwd::unpack_dual(kiln::exp(d)).tangent, kiln::exp(x) * t);
}

TEST(ForwardAD, LeavingTheLevelClearsTangents) {
  Tensor x = random({3}, kFloat64, -1, 1, 7), t = random({3}, kFloat64, -1, 1, 8);
  Tensor d, y;
  {
    fwd::DualLevel level;
    d = fwd::make_dual(x, t);
    y = kiln::tanh(d);
    EXPECT_TRUE(fwd::unpack_dual(y).tangent.defined());
  }
  EXPECT_FALSE(fwd::unpack_dual(y).tangent.defined());
  EXPECT_FALSE(y.key_set().has(DispatchKey::Autograd));  // back on the plain fast path
  EXPECT_FALSE(d.key_set().has(DispatchKey::Autograd));
  fwd::DualLevel next;  // a new level does not see the old tangents
  EXPECT_FALSE(fwd::unpack_dual(y).tangent.defined());
  EXPECT_FALSE(fwd::unpack_dual(kiln::exp(d)).tangent.defined());
}

TEST(ForwardAD, InPlaceOps) {
  Tensor x = random({2, 3}, kFloat64, 0.5, 1.5, 9), t = random({2, 3}, kFloat64, -1, 1, 10);
  fwd::DualLevel level;
  Tensor y = fwd::make_dual(x, t).clone();
  Tensor yt = fwd::unpack_dual(y).tangent;
  y.mul_(kiln::scalar_to_tensor(3.0));
  expect_near(fwd::unpack_dual(y).tangent, 3.0 * t);
  EXPECT_TRUE(fwd::unpack_dual(y).tangent.is_same(yt));  // written into the existing tangent
  y.exp_();  // from the values before the op: d exp(3x) = exp(3x) * 3t
  expect_near(fwd::unpack_dual(y).tangent, kiln::exp(3.0 * x) * 3.0 * t);
  // A tensor without a tangent gets one from an in-place op with a dual argument.
  Tensor z = kiln::zeros({2, 3}, kFloat64);
  z.add_(fwd::make_dual(x, t), 2.0);
  expect_near(fwd::unpack_dual(z).tangent, 2.0 * t);
  Tensor c = kiln::zeros({2, 3}, kFloat64);
  c.copy_(fwd::make_dual(x, t));
  expect_near(fwd::unpack_dual(c).tangent, t);
  c.fill_(1.0);
  expect_near(fwd::unpack_dual(c).tangent, kiln::zeros({2, 3}, kFloat64));
}

TEST(ForwardAD, ViewsShareTheirBaseTangent) {
  Tensor x = random({2, 3}, kFloat64, -1, 1, 11), t = random({2, 3}, kFloat64, -1, 1, 12);
  fwd::DualLevel level;
  Tensor d = fwd::make_dual(x, t).clone();
  Tensor dt = fwd::unpack_dual(d).tangent;
  Tensor v = d.transpose(0, 1);
  Tensor vt = fwd::unpack_dual(v).tangent;
  expect_near(vt, t.transpose(0, 1));
  EXPECT_TRUE(vt.is_alias_of(dt));
  expect_near(fwd::unpack_dual(d.view({6})).tangent, t.reshape({6}));
  expect_near(fwd::unpack_dual(d.select(0, 1)).tangent, t.select(0, 1));
  expect_near(fwd::unpack_dual(d.unsqueeze(0).expand({4, 2, 3})).tangent,
              t.unsqueeze(0).expand({4, 2, 3}));
  // An in-place op on a view updates the base's tangent through the aliasing.
  Tensor row = d.select(0, 1);
  row.mul_(kiln::scalar_to_tensor(2.0));
  Tensor want = t.clone();
  want.select(0, 1).mul_(kiln::scalar_to_tensor(2.0));
  expect_near(fwd::unpack_dual(d).tangent, want);
  // A non-contiguous primal (view() of its tangent would fail where reshape works).
  Tensor nc = fwd::make_dual(testing::non_contiguous(x), t);
  expect_near(fwd::unpack_dual(nc.t().reshape({6})).tangent, t.t().reshape({6}));
}

TEST(ForwardAD, MultiOutputOps) {
  Tensor x = random({3, 4}, kFloat64, -1, 1, 13), t = random({3, 4}, kFloat64, -1, 1, 14);
  fwd::DualLevel level;
  auto [values, indices] = kiln::max(fwd::make_dual(x, t), 1);
  expect_near(fwd::unpack_dual(values).tangent, t.gather(1, indices.unsqueeze(1)).squeeze({1}));
  EXPECT_FALSE(fwd::unpack_dual(indices).tangent.defined());  // integer outputs get none
  auto [mn, mi] = kiln::min(fwd::make_dual(x, t), 0, true);
  expect_near(fwd::unpack_dual(mn).tangent, t.gather(0, mi));
}

TEST(ForwardAD, ForwardOverReverse) {
  // Tangent computations are recorded: d/dx <tangent of sin(x), 1> = -sin(x) t.
  Tensor x = random({4}, kFloat64, -1, 1, 15), t = random({4}, kFloat64, -1, 1, 16);
  Tensor xr = x.clone().requires_grad_();
  fwd::DualLevel level;
  Tensor y = kiln::sin(fwd::make_dual(xr, t));
  Tensor yt = fwd::unpack_dual(y).tangent;
  expect_near(yt, kiln::cos(x) * t);
  ASSERT_TRUE(yt.requires_grad());
  Tensor g = autograd::grad({yt.sum()}, {xr})[0];
  expect_near(g, -kiln::sin(x) * t);
  // The backward pass's ops carry tangents: the gradient of sum(x^3) is 3x^2, its tangent 6 x t.
  Tensor xl = x.clone().requires_grad_();
  Tensor d = fwd::make_dual(xl, t);
  Tensor gx = autograd::grad({(d * d * d).sum()}, {d}, {}, std::nullopt, /*create_graph=*/true)[0];
  expect_near(gx, 3.0 * x * x);
  expect_near(fwd::unpack_dual(gx).tangent, 6.0 * x * t);
}

struct Cube : autograd::Function<Cube> {
  static Tensor forward(autograd::AutogradContext* ctx, Tensor x) {
    ctx->save_for_backward({x});
    return x * x * x;
  }
  static autograd::variable_list backward(autograd::AutogradContext* ctx,
                                          autograd::variable_list grads) {
    Tensor x = ctx->get_saved_variables()[0];
    return {grads[0] * 3.0 * x * x};
  }
};
struct Identity : autograd::Function<Identity> {
  static Tensor forward(autograd::AutogradContext*, Tensor x) { return x; }
  static autograd::variable_list backward(autograd::AutogradContext*, autograd::variable_list g) {
    return g;
  }
};

TEST(ForwardAD, CustomFunctionsPropagateThroughTheirForward) {
  Tensor x = random({3}, kFloat64, -1, 1, 17), t = random({3}, kFloat64, -1, 1, 18);
  fwd::DualLevel level;
  expect_near(fwd::unpack_dual(Cube::apply(fwd::make_dual(x, t))).tangent, 3.0 * x * x * t);
  Tensor xr = x.clone().requires_grad_();
  Tensor y = Identity::apply(fwd::make_dual(xr, t));  // an input returned as is: a new alias
  EXPECT_TRUE(y.requires_grad());
  expect_near(fwd::unpack_dual(y).tangent, t);
  // Checkpointed regions too (their forward runs the ops, under no_grad).
  autograd::variable_list outs = autograd::checkpoint(
      [](const autograd::variable_list& v) {
        return autograd::variable_list{kiln::sin(v[0]), v[0]};
      },
      {fwd::make_dual(xr, t)});
  expect_near(fwd::unpack_dual(outs[0]).tangent, kiln::cos(x) * t);
  expect_near(fwd::unpack_dual(outs[1]).tangent, t);
}

// ---- Every differentiable op of the manifest -------------------------------------------------

// Differentiable ops whose forward mode cannot be compared with reverse mode. Empty: random ops
// (bernoulli, normal_, uniform_) have zero Jacobians both ways, so they are checked too.
const std::map<std::string, std::string> kSkipped = {};

using testing::differentiable;
using testing::floating_tensors;

// Forward mode: the tangent of every output (zeros where an output got none).
std::vector<Tensor> forward_jt(OperatorHandle& op, const Stack& sample,
                               const std::vector<Tensor>& xs, const std::vector<Tensor>& ts) {
  fwd::DualLevel level;
  std::vector<Tensor> duals;
  for (size_t i = 0; i < xs.size(); ++i) duals.push_back(fwd::make_dual(xs[i], ts[i]));
  std::vector<Tensor> outs = testing::run_on(op, sample, duals);
  std::vector<Tensor> jts;
  for (const Tensor& o : outs) {
    Tensor jt = fwd::unpack_dual(o).tangent;
    if (jt.defined()) {
      EXPECT_EQ(jt.sizes(), o.sizes());
      EXPECT_EQ(jt.dtype(), o.dtype());
      EXPECT_TRUE(is_floating(o.dtype()));
    }
    jts.push_back(jt.defined() ? jt.clone() : Tensor());
  }
  return jts;
}

// Reverse mode: (J t)[o][j] = sum_i <vjp(e_j of output o)_i, t_i>, one vjp per output element.
std::vector<std::vector<double>> reverse_jt(OperatorHandle& op, const Stack& sample,
                                            const std::vector<Tensor>& xs,
                                            const std::vector<Tensor>& ts) {
  std::vector<Tensor> leaves;
  for (const Tensor& x : xs) leaves.push_back(x.detach().requires_grad_());
  std::vector<Tensor> outs = testing::run_on(op, sample, leaves);
  std::vector<std::vector<double>> r;
  for (const Tensor& o : outs) {
    std::vector<double> jt(o.numel(), 0.0);
    if (o.requires_grad() && is_floating(o.dtype())) {
      for (int64_t j = 0; j < o.numel(); ++j) {
        Tensor e = kiln::zeros({o.numel()}, o.dtype());
        e.data_ptr<double>()[j] = 1.0;
        auto gs = autograd::grad({o}, leaves, {e.reshape(o.sizes())}, /*retain_graph=*/true, false,
                                 /*allow_unused=*/true);
        for (size_t i = 0; i < gs.size(); ++i)
          if (gs[i].defined()) jt[j] += (gs[i] * ts[i]).sum().item<double>();
      }
    }
    r.push_back(std::move(jt));
  }
  return r;
}

TEST(ForwardAD, EveryDifferentiableOpMatchesReverseModeJacobian) {
  std::set<std::string> differentiable_ops, checked;
  int compared = 0;
  for (const std::string& name : testing::manifest_names()) {
    OperatorHandle& op = Dispatcher::get().find_or_throw(name);
    if (!differentiable(op.info())) continue;
    differentiable_ops.insert(name);
    const std::string jvp = op.info().jvp;
    // A row with derivative formulas must say how its tangents are computed.
    if (op.info().kind != OpKind::Composite) {
      EXPECT_NE(jvp, "non_differentiable") << name << " has derivatives but no jvp";
    }
    if (kSkipped.count(name)) continue;
    int n = 0;
    for (const Stack& raw : testing::differentiable_samples(name)) {
      Stack sample = testing::to_float64(raw);
      const int idx = n++;
      std::vector<Tensor> xs = floating_tensors(sample);
      if (xs.empty()) continue;
      for (int layout = 0; layout < 2; ++layout) {
        std::vector<Tensor> in;
        bool any_nc = false;
        for (const Tensor& x : xs) {
          in.push_back(layout == 1 && x.numel() > 1 ? testing::non_contiguous(x) : x);
          any_nc = any_nc || !in.back().is_contiguous();
        }
        if (layout == 1 && !any_nc) continue;
        SCOPED_TRACE(name + " sample " + std::to_string(idx) + (layout ? " (non-contiguous)" : ""));
        std::vector<Tensor> ts;
        for (size_t i = 0; i < in.size(); ++i)
          ts.push_back(random(in[i].sizes(), kFloat64, -1, 1, 500 + static_cast<uint32_t>(i)));
        std::vector<Tensor> got;
        std::vector<std::vector<double>> want;
        try {
          got = forward_jt(op, sample, in, ts);
          want = reverse_jt(op, sample, in, ts);
        } catch (const Error& e) {
          ADD_FAILURE() << "threw: " << e.what();
          continue;
        }
        ASSERT_EQ(got.size(), want.size());
        bool ok = true;
        for (size_t o = 0; o < got.size(); ++o) {
          std::vector<double> g =
              got[o].defined() ? to_doubles(got[o]) : std::vector<double>(want[o].size(), 0.0);
          ASSERT_EQ(g.size(), want[o].size());
          for (size_t j = 0; j < g.size(); ++j) {
            if (std::isnan(want[o][j]) && std::isnan(g[j])) continue;
            if (std::fabs(g[j] - want[o][j]) > 1e-7 * (1 + std::fabs(want[o][j]))) {
              ok = false;
              ADD_FAILURE() << "output " << o << " element " << j << ": forward " << g[j]
                            << " vs reverse " << want[o][j];
              break;
            }
          }
        }
        if (ok) {
          checked.insert(name);
          ++compared;
        }
      }
    }
  }
  std::string missing;
  for (const std::string& name : differentiable_ops)
    if (!checked.count(name) && !kSkipped.count(name)) missing += name + " ";
  EXPECT_TRUE(missing.empty()) << "differentiable ops without a forward-mode check: " << missing;
  for (const auto& [name, why] : kSkipped)
    EXPECT_TRUE(differentiable_ops.count(name)) << name << " is skipped but not differentiable";
  std::cout << "[          ] forward mode checked against reverse mode for " << checked.size()
            << " of " << differentiable_ops.size() << " differentiable ops (" << compared
            << " sample variants)\n";
}

// ---- Transforms ------------------------------------------------------------------------------

TEST(ForwardAD, JvpOfMlpMatchesFiniteDifferences) {
  Tensor x = random({5, 4}, kFloat64, -1, 1, 20);
  std::vector<Tensor> params = {
      random({4, 8}, kFloat64, -1, 1, 21), random({8}, kFloat64, -1, 1, 22),
      random({8, 3}, kFloat64, -1, 1, 23), random({3}, kFloat64, -1, 1, 24)};
  func::Fn mlp = [x](const std::vector<Tensor>& p) {
    Tensor h = kiln::gelu(kiln::matmul(x, p[0]) + p[1]);
    return kiln::log_softmax(kiln::tanh(kiln::matmul(h, p[2]) + p[3]), 1);
  };
  std::vector<Tensor> ts;
  for (size_t i = 0; i < params.size(); ++i)
    ts.push_back(random(params[i].sizes(), kFloat64, -1, 1, 30 + static_cast<uint32_t>(i)));
  auto [out, jv] = func::jvp(mlp, params, ts);
  expect_near(out, mlp(params));
  EXPECT_FALSE(jv.requires_grad());
  auto moved = [&](double h) {
    std::vector<Tensor> p;
    for (size_t i = 0; i < params.size(); ++i) p.push_back(params[i] + h * ts[i]);
    return mlp(p);
  };
  const double h = 1e-6;
  expect_close(jv, (moved(h) - moved(-h)) / (2 * h), 1e-6, 1e-7);
  // jacfwd agrees with jacrev on the same network (one argnum at a time).
  for (int64_t a = 0; a < 4; ++a)
    expect_near(func::jacfwd(mlp, a)(params), func::jacrev(mlp, a)(params));
}

TEST(ForwardAD, HessianIsJacfwdOfJacrev) {
  Tensor W = random({3, 4}, kFloat64, -1, 1, 40), x = random({4}, kFloat64, -1, 1, 41);
  func::UnaryFn f = [W](const Tensor& a) {
    return (kiln::tanh(kiln::matmul(W, a)) * kiln::exp(a.sum())).sum() + (a * a * a).sum();
  };
  Tensor H = func::hessian(f)(x);
  EXPECT_EQ(H.sizes(), IntArrayRef({4, 4}));
  expect_near(H, func::jacrev(func::jacrev(f))(x), 1e-9);
  expect_near(H, H.t(), 1e-9);
  EXPECT_FALSE(H.requires_grad());
}

TEST(ForwardAD, JvpStaysDifferentiableInPrimalsAndTangents) {
  // g(x) = sin(x) * x elementwise: J v = g'(x) v.
  Tensor x0 = random({4}, kFloat64, -1, 1, 60), v0 = random({4}, kFloat64, -1, 1, 61);
  func::UnaryFn g = [](const Tensor& a) { return kiln::sin(a) * a; };
  Tensor x = x0.clone().requires_grad_(), v = v0.clone().requires_grad_();
  auto [out, jv] = func::jvp(g, x, v);
  ASSERT_TRUE(jv.requires_grad());
  jv.sum().backward();
  // d/dx sum(g'(x) v) = g''(x) v, d/dv sum(g'(x) v) = g'(x).
  expect_near(x.grad(), (2.0 * kiln::cos(x0) - x0 * kiln::sin(x0)) * v0);
  expect_near(v.grad(), kiln::cos(x0) * x0 + kiln::sin(x0));
  EXPECT_TRUE(out.requires_grad());
}

TEST(ForwardAD, TransformsInsideAnActiveLevel) {
  // jvp inside a level falls back to the double-vjp transform; the level's tangents ride along.
  Tensor x = random({3}, kFloat64, -1, 1, 50), v = random({3}, kFloat64, -1, 1, 51);
  func::UnaryFn f = [](const Tensor& a) { return kiln::sin(a) * a; };
  Tensor want = (kiln::cos(x) * x + kiln::sin(x)) * v;
  fwd::DualLevel level;
  expect_near(func::jvp(f, x, v).second, want);
  expect_near(func::jacfwd(f)(x), func::jacrev(f)(x));
  // grad of a dual: the gradient carries the tangent H v (forward over reverse).
  Tensor d = fwd::make_dual(x, v);
  func::UnaryFn s = [](const Tensor& a) { return (kiln::sin(a) * a).sum(); };
  Tensor g = func::grad(s)(d);
  expect_near(fwd::unpack_dual(g).tangent, (2.0 * kiln::cos(x) - x * kiln::sin(x)) * v);
}

}  // namespace
}  // namespace kiln
