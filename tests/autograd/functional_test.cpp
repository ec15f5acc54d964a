// kiln::func transforms (functional.h): grad, grad_and_value, vjp, jvp, jacrev, jacfwd, hessian
// against analytical results in float64, against each other, composed, and on bad input.
#include "kiln/autograd/functional.h"

#include <gtest/gtest.h>

#include <cmath>

#include "kiln/autograd/autograd.h"
#include "kiln/kiln.h"
#include "test_util.h"

namespace kiln {
namespace {

using testing::expect_close;
using testing::expect_error;
using testing::from_vector;
using testing::random;
using testing::to_doubles;

constexpr double kTol = 1e-10;

void expect_near(const Tensor& got, const Tensor& want, double tol = kTol) {
  expect_close(got, want, tol, tol);
}

// A tensor of `shape` whose element i is fn(x[i]) (x read in row-major order).
Tensor map(const Tensor& x, double (*fn)(double)) {
  std::vector<double> v = to_doubles(x);
  for (double& e : v) e = fn(e);
  return from_vector(v, x.sizes());
}

Tensor diag(const Tensor& d) {
  std::vector<double> v = to_doubles(d);
  const int64_t n = static_cast<int64_t>(v.size());
  std::vector<double> out(n * n, 0.0);
  for (int64_t i = 0; i < n; ++i) out[i * n + i] = v[i];
  return from_vector(out, {n, n});
}

// f(x) = sum(sin(x) * x^2): f' = x^2 cos x + 2 x sin x, f'' = -x^2 sin x + 4 x cos x + 2 sin x.
Tensor sin_x2(const Tensor& x) { return (sin(x) * x * x).sum(); }
double sin_x2_d1(double x) { return x * x * std::cos(x) + 2 * x * std::sin(x); }
double sin_x2_d2(double x) { return -x * x * std::sin(x) + 4 * x * std::cos(x) + 2 * std::sin(x); }

void expect_plain(const Tensor& t) {
  EXPECT_FALSE(t.requires_grad());
  EXPECT_TRUE(t.grad_fn() == nullptr);
}

TEST(Functional, GradMatchesAnalytic) {
  Tensor x = random({2, 3}, kFloat64, -2, 2, 1);
  Tensor g = func::grad(func::UnaryFn(sin_x2))(x);
  expect_near(g, map(x, sin_x2_d1));
  expect_plain(g);
  EXPECT_FALSE(x.requires_grad());  // Note [Transform inputs]
  EXPECT_EQ(func::transform_depth(), 0);

  auto [g2, value] = func::grad_and_value(func::UnaryFn(sin_x2))(x);
  expect_near(g2, g);
  double want = 0;
  for (double e : to_doubles(x)) want += std::sin(e) * e * e;
  EXPECT_NEAR(value.item<double>(), want, kTol);
  expect_plain(value);
}

TEST(Functional, GradWithTwoArgnums) {
  // f(x, w) = sum(tanh(x @ w)): df/dx = (1 - y^2) @ w^T, df/dw = x^T @ (1 - y^2), y = tanh(x @ w).
  Tensor x = random({2, 3}, kFloat64, -1, 1, 2), w = random({3, 4}, kFloat64, -1, 1, 3);
  func::Fn f = [](const std::vector<Tensor>& a) { return tanh(matmul(a[0], a[1])).sum(); };
  Tensor y = tanh(matmul(x, w));
  Tensor dy = 1.0 - y * y;
  std::vector<Tensor> gs = func::grad(f, std::vector<int64_t>{0, 1})({x, w});
  ASSERT_EQ(gs.size(), 2u);
  expect_near(gs[0], matmul(dy, w.t()));
  expect_near(gs[1], matmul(x.t(), dy));
  expect_near(func::grad(f, 1)({x, w}), gs[1]);
  expect_near(func::grad(f, -2)({x, w}), gs[0]);  // negative argnums count from the end
  std::vector<Tensor> rev = func::grad(f, std::vector<int64_t>{1, 0})({x, w});
  expect_near(rev[0], gs[1]);
  expect_near(rev[1], gs[0]);
  auto [both, value] = func::grad_and_value(f, std::vector<int64_t>{0, 1})({x, w});
  expect_near(both[1], gs[1]);
  EXPECT_NEAR(value.item<double>(), y.sum().item<double>(), kTol);
}

TEST(Functional, GradOfUnusedInputIsZero) {
  Tensor x = random({3}, kFloat64, -1, 1, 4), c = random({2}, kFloat64, -1, 1, 5);
  func::Fn f = [](const std::vector<Tensor>& a) { return (a[0] * a[0]).sum(); };
  expect_near(func::grad(f, 1)({x, c}), kiln::zeros({2}, kFloat64));
  func::UnaryFn constant = [](const Tensor&) { return kiln::ones({}, kFloat64); };
  expect_near(func::grad(constant)(x), kiln::zeros({3}, kFloat64));
  func::UnaryFn outer = [](const Tensor& v) {
    return kiln::ones({2, 2}, kFloat64) + 0.0 * v.sum();
  };
  expect_near(func::jacrev(constant)(x), kiln::zeros({3}, kFloat64));
  expect_near(func::jacfwd(constant)(x), kiln::zeros({3}, kFloat64));
  expect_near(func::jacfwd(outer)(x), kiln::zeros({2, 2, 3}, kFloat64));
}

TEST(Functional, VjpMatchesAnalytic) {
  // f(W, x) = tanh(W @ x): W^T-side cotangent (1 - y^2) * v.
  Tensor W = random({4, 3}, kFloat64, -1, 1, 6), x = random({3}, kFloat64, -1, 1, 7);
  Tensor v = random({4}, kFloat64, -1, 1, 8);
  func::Fn f = [](const std::vector<Tensor>& a) { return tanh(matmul(a[0], a[1])); };
  auto [out, vjp_fn] = func::vjp(f, {W, x});
  Tensor y = tanh(matmul(W, x));
  expect_near(out, y);
  expect_plain(out);
  Tensor r = (1.0 - y * y) * v;
  for (int rep = 0; rep < 2; ++rep) {  // the vjp function can be called again
    std::vector<Tensor> cts = vjp_fn(v);
    ASSERT_EQ(cts.size(), 2u);
    expect_near(cts[0], matmul(r.unsqueeze(1), x.unsqueeze(0)));  // outer(r, x)
    expect_near(cts[1], matmul(W.t(), r));
    expect_plain(cts[0]);
  }
  expect_error(ErrorKind::Value, "cotangent of shape", [&] { vjp_fn(kiln::ones({3}, kFloat64)); });

  auto [o1, unary_fn] = func::vjp(func::UnaryFn([](const Tensor& a) { return sin(a); }), x);
  expect_near(unary_fn(x), map(x, [](double e) { return std::cos(e) * e; }));
}

TEST(Functional, JacrevMatchesAnalytic) {
  Tensor W = random({4, 3}, kFloat64, -1, 1, 9), x = random({3}, kFloat64, -1, 1, 10);
  // tanh(W @ x): diag(1 - y^2) W.
  func::UnaryFn f = [W](const Tensor& a) { return tanh(matmul(W, a)); };
  Tensor y = tanh(matmul(W, x));
  Tensor J = func::jacrev(f)(x);
  expect_near(J, matmul(diag(1.0 - y * y), W));
  expect_plain(J);
  // softmax(x): diag(s) - s s^T.
  Tensor z = random({5}, kFloat64, -2, 2, 11);
  Tensor s = softmax(z, 0);
  Tensor Js = func::jacrev(func::UnaryFn([](const Tensor& a) { return softmax(a, 0); }))(z);
  expect_near(Js, diag(s) - matmul(s.unsqueeze(1), s.unsqueeze(0)));
  // Elementwise on a matrix: a (2, 3, 2, 3) Jacobian, diagonal in (i, j).
  Tensor m = random({2, 3}, kFloat64, -2, 2, 12);
  Tensor Jm = func::jacrev(func::UnaryFn([](const Tensor& a) { return sin(a) * a * a; }))(m);
  EXPECT_EQ(Jm.sizes(), IntArrayRef({2, 3, 2, 3}));
  expect_near(Jm.reshape({6, 6}), diag(map(m, sin_x2_d1).reshape({6})));
}

TEST(Functional, JacobiansOfTwoInputs) {
  // f(A, B) = A @ B with A (2, 3), B (3, 2): dF_ij/dA_kl = d_ik B_lj, dF_ij/dB_kl = A_ik d_lj.
  Tensor A = random({2, 3}, kFloat64, -1, 1, 13), B = random({3, 2}, kFloat64, -1, 1, 14);
  func::Fn f = [](const std::vector<Tensor>& a) { return matmul(a[0], a[1]); };
  std::vector<Tensor> rev = func::jacrev(f, std::vector<int64_t>{0, 1})({A, B});
  std::vector<Tensor> fwd = func::jacfwd(f, std::vector<int64_t>{0, 1})({A, B});
  std::vector<double> a = to_doubles(A), b = to_doubles(B);
  std::vector<double> ja(2 * 2 * 2 * 3, 0.0), jb(2 * 2 * 3 * 2, 0.0);
  for (int i = 0; i < 2; ++i)
    for (int j = 0; j < 2; ++j)
      for (int l = 0; l < 3; ++l) {
        ja[((i * 2 + j) * 2 + i) * 3 + l] = b[l * 2 + j];
        jb[((i * 2 + j) * 3 + l) * 2 + j] = a[i * 3 + l];
      }
  expect_near(rev[0], from_vector(ja, {2, 2, 2, 3}));
  expect_near(rev[1], from_vector(jb, {2, 2, 3, 2}));
  expect_near(fwd[0], rev[0]);
  expect_near(fwd[1], rev[1]);
}

TEST(Functional, JvpMatchesAnalyticAndJacobianTimesTangent) {
  Tensor x = random({4}, kFloat64, -2, 2, 15), v = random({4}, kFloat64, -1, 1, 16);
  func::UnaryFn elementwise = [](const Tensor& a) { return sin(a) * a * a; };
  auto [out, jv] = func::jvp(elementwise, x, v);
  expect_near(out, map(x, [](double e) { return std::sin(e) * e * e; }));
  expect_near(jv, map(x, sin_x2_d1) * v);
  expect_plain(out);
  expect_plain(jv);

  Tensor W = random({3, 4}, kFloat64, -1, 1, 17);
  std::vector<func::UnaryFn> fns = {
      [W](const Tensor& a) { return tanh(matmul(W, a)); },
      [](const Tensor& a) { return softmax(a * a, 0); },
      [W](const Tensor& a) { return matmul(W, tanh(a)).sum(); },
  };
  for (const auto& f : fns) {
    Tensor J = func::jacrev(f)(x);
    Tensor Jv = J.dim() == 1 ? (J * v).sum() : matmul(J, v);
    expect_near(func::jvp(f, x, v).second, Jv);
  }
  // Two primals: J_x v_x + J_w v_w.
  func::Fn f2 = [](const std::vector<Tensor>& a) { return tanh(matmul(a[1], a[0])); };
  Tensor vw = random({3, 4}, kFloat64, -1, 1, 18);
  auto [o2, t2] = func::jvp(f2, {x, W}, {v, vw});
  Tensor y = tanh(matmul(W, x));
  expect_near(t2, (1.0 - y * y) * (matmul(W, v) + matmul(vw, x)));
}

TEST(Functional, JacfwdEqualsJacrev) {
  Tensor W = random({3, 4}, kFloat64, -1, 1, 19);
  std::vector<func::UnaryFn> fns = {
      [W](const Tensor& a) { return tanh(matmul(W, a)); },
      [](const Tensor& a) { return softmax(tanh(a), 0); },
      [](const Tensor& a) { return sin(a) * a * a; },
      [W](const Tensor& a) { return softmax(matmul(W, a * a), 0).sum(); },
      [W](const Tensor& a) { return matmul(W.t(), tanh(matmul(W, a))); },
  };
  Tensor x = random({4}, kFloat64, -1, 1, 20);
  for (const auto& f : fns) expect_near(func::jacfwd(f)(x), func::jacrev(f)(x));
  Tensor m = random({2, 3}, kFloat64, -1, 1, 21);
  func::UnaryFn rows = [](const Tensor& a) { return softmax(matmul(a, a.t()), 1); };
  Tensor Jf = func::jacfwd(rows)(m);
  EXPECT_EQ(Jf.sizes(), IntArrayRef({2, 2, 2, 3}));
  expect_near(Jf, func::jacrev(rows)(m));
}

TEST(Functional, HessianOfQuadraticForm) {
  // x^T A x has Hessian A + A^T.
  Tensor A = random({4, 4}, kFloat64, -1, 1, 22), x = random({4}, kFloat64, -1, 1, 23);
  func::UnaryFn q = [A](const Tensor& a) { return matmul(a, matmul(A, a)); };
  Tensor H = func::hessian(q)(x);
  expect_near(H, A + A.t());
  expect_plain(H);
  expect_near(func::jacrev(func::jacrev(q))(x), A + A.t());
  expect_near(func::jacfwd(func::jacfwd(q))(x), A + A.t());
  // With argnum: q(x, A) = x^T A x is quadratic in x and linear in A (a zero Hessian).
  func::Fn qa = [](const std::vector<Tensor>& a) { return matmul(a[0], matmul(a[1], a[0])); };
  expect_near(func::hessian(qa, 0)({x, A}), A + A.t());
  expect_near(func::hessian(qa, 1)({x, A}), kiln::zeros({4, 4, 4, 4}, kFloat64));
}

TEST(Functional, HessianOfSinIsDiagonalAndSymmetric) {
  Tensor x = random({5}, kFloat64, -2, 2, 24);
  Tensor H = func::hessian(func::UnaryFn(sin_x2))(x);
  expect_near(H, diag(map(x, sin_x2_d2)));
  expect_near(H, H.t());
  expect_near(func::jacrev(func::jacrev(func::UnaryFn(sin_x2)))(x), H);
  // A non-diagonal one: f(x) = sum(softmax(x)^2) has a symmetric, dense Hessian.
  func::UnaryFn g = [](const Tensor& a) {
    Tensor s = softmax(a, 0);
    return (s * s).sum();
  };
  Tensor Hg = func::hessian(g)(x);
  expect_near(Hg, Hg.t());
  expect_near(Hg, func::jacrev(func::jacrev(g))(x));
}

TEST(Functional, HessianThroughInplaceOps) {
  // (x^2 * roll(x))^2 summed, the product taken in place: hessian (forward over reverse) and
  // jacrev(jacrev) need self's value before the op with its tangent and its history (both were
  // lost once); the same product written through a view (Note [CopySlices]).
  Tensor x = random({4}, kFloat64, -1, 1, 60);
  Tensor next = from_vector<int64_t>({1, 2, 3, 0}, {4});
  func::UnaryFn plain = [next](const Tensor& a) {
    Tensor y = a * a;
    y.mul_(a.index_select(0, next));
    return (y * y).sum();
  };
  func::UnaryFn through_view = [](const Tensor& a) {
    Tensor y = a * a;
    y.slice(0, 0, 2).mul_(a.slice(0, 1, 3));
    return (y * y).sum();
  };
  for (const func::UnaryFn& f : {plain, through_view}) {
    Tensor H = kiln::zeros({4, 4}, kFloat64);  // central differences of the gradient
    for (int64_t k = 0; k < 4; ++k) {
      Tensor e = kiln::zeros({4}, kFloat64);
      e.select(0, k).fill_(1e-6);
      H.select(1, k).copy_((func::grad(f)(x + e) - func::grad(f)(x - e)) / 2e-6);
    }
    expect_near(func::hessian(f)(x), H, 1e-6);
    expect_near(func::jacrev(func::jacrev(f))(x), H, 1e-6);
  }
}

TEST(Functional, GradOfGrad) {
  func::UnaryFn f = [](const Tensor& a) { return sin(a) * a * a; };  // 0-dim in, 0-dim out
  for (double v : {-1.3, 0.4, 2.1}) {
    Tensor x = kiln::full({}, v, kFloat64);
    EXPECT_NEAR(func::grad(f)(x).item<double>(), sin_x2_d1(v), kTol);
    EXPECT_NEAR(func::grad(func::grad(f))(x).item<double>(), sin_x2_d2(v), kTol);
    // f''' = -x^2 cos x - 6 x sin x + 6 cos x.
    double d3 = -v * v * std::cos(v) - 6 * v * std::sin(v) + 6 * std::cos(v);
    EXPECT_NEAR(func::grad(func::grad(func::grad(f)))(x).item<double>(), d3, 1e-9);
    auto [t, d] = func::jvp(func::grad(f), x, kiln::full({}, 2.0, kFloat64));
    EXPECT_NEAR(d.item<double>(), 2 * sin_x2_d2(v), kTol);
  }
}

TEST(Functional, MixedCompositions) {
  Tensor x = random({4}, kFloat64, -2, 2, 29), v = random({4}, kFloat64, -1, 1, 30);
  func::UnaryFn f(sin_x2);
  Tensor H = diag(map(x, sin_x2_d2));
  expect_near(func::jacfwd(func::grad(f))(x), H);
  expect_near(func::jacrev(func::grad(f))(x), H);
  expect_near(func::jvp(func::grad(f), x, v).second, matmul(H, v));  // a Hessian-vector product
  // grad through a vjp taken inside: h(x) = sum((1 - tanh(x)^2) * v), h' = -2 tanh (1 - tanh^2) v.
  func::UnaryFn h = [v](const Tensor& a) {
    auto [out, vjp_fn] = func::vjp(func::UnaryFn([](const Tensor& b) { return tanh(b); }), a);
    return vjp_fn(v).sum();
  };
  Tensor th = map(x, [](double e) { return std::tanh(e); });
  expect_near(func::grad(h)(x), -2.0 * th * (1.0 - th * th) * v);
  // Non-contiguous primals give the same results.
  Tensor nc = testing::non_contiguous(x);
  expect_near(func::hessian(f)(nc), H);
  expect_near(func::jvp(func::grad(f), nc, testing::non_contiguous(v)).second, matmul(H, v));
}

TEST(Functional, NestedTransformSeesOuterVariables) {
  // d/dx [grad_y sum(x * y^2)](y0) = d/dx (2 x y0) = diag(2 y0): the inner transform's result
  // must stay differentiable in the outer transform's input that f captures.
  Tensor x = random({3}, kFloat64, -1, 1, 25), y0 = random({3}, kFloat64, -1, 1, 26);
  func::UnaryFn outer = [y0](const Tensor& xi) {
    func::UnaryFn inner = [xi](const Tensor& y) { return (xi * y * y).sum(); };
    return func::grad(inner)(y0);
  };
  expect_near(func::jacrev(outer)(x), diag(2.0 * y0));
  expect_near(func::jacfwd(outer)(x), diag(2.0 * y0));
}

TEST(Functional, ComposesWithCallerAutograd) {
  // A primal that requires grad: grad(f)(x) stays differentiable in x (Note [Transform levels]).
  Tensor x = random({4}, kFloat64, -2, 2, 27);
  x.requires_grad_();
  Tensor g = func::grad(func::UnaryFn(sin_x2))(x);
  EXPECT_TRUE(g.requires_grad());
  EXPECT_FALSE(x.grad().defined());  // transforms accumulate nothing into .grad
  EXPECT_TRUE(x.is_leaf());
  g.sum().backward();
  expect_near(x.grad(), map(x.detach(), sin_x2_d2));
  // Under no_grad the results are plain again.
  autograd::NoGradGuard ng;
  expect_plain(func::grad(func::UnaryFn(sin_x2))(x));
}

TEST(Functional, BadInput) {
  Tensor x = random({3}, kFloat64, -1, 1, 28);
  func::UnaryFn vec = [](const Tensor& a) { return sin(a); };
  expect_error(ErrorKind::Value, "0-dim (scalar) tensor", [&] { func::grad(vec)(x); });
  expect_error(ErrorKind::Value, "shape [3]", [&] { func::grad(vec)(x); });
  expect_error(ErrorKind::Value, "0-dim", [&] { func::grad_and_value(vec)(x); });
  func::Fn f = [](const std::vector<Tensor>& a) { return (a[0] * a[1]).sum(); };
  expect_error(ErrorKind::Index, "argnums=2", [&] { func::grad(f, 2)({x, x}); });
  expect_error(ErrorKind::Index, "argnums=-3", [&] { func::jacrev(f, -3)({x, x}); });
  expect_error(ErrorKind::Value, "unique", [&] {
    func::grad(f, std::vector<int64_t>{1, -1})({x, x});
  });
  expect_error(ErrorKind::Value, "at least one", [&] {
    func::jacfwd(f, std::vector<int64_t>{})({x, x});
  });
  expect_error(ErrorKind::Value, "floating point", [&] {
    func::grad(f, 0)({kiln::ones({3}, kInt64), x});
  });
  expect_error(ErrorKind::Value, "undefined", [&] { func::jacrev(vec)(Tensor()); });
  expect_error(ErrorKind::Value, "one tangent per primal", [&] { func::jvp(f, {x, x}, {x}); });
  expect_error(ErrorKind::Value, "tangent 0 has shape [2]",
               [&] { func::jvp(vec, x, kiln::ones({2}, kFloat64)); });
  expect_error(ErrorKind::Value, "dtype", [&] { func::jvp(vec, x, kiln::ones({3}, kFloat32)); });
  expect_error(ErrorKind::Value, "undefined tensor",
               [&] { func::jacrev(func::UnaryFn([](const Tensor&) { return Tensor(); }))(x); });
  EXPECT_EQ(func::transform_depth(), 0);  // errors unwind the depth
}

TEST(Functional, ZeroSizeInputs) {
  Tensor e = kiln::zeros({0}, kFloat64);
  func::UnaryFn f = [](const Tensor& a) { return sin(a); };
  EXPECT_EQ(func::jacrev(f)(e).sizes(), IntArrayRef({0, 0}));
  EXPECT_EQ(func::jacfwd(f)(e).sizes(), IntArrayRef({0, 0}));
  expect_near(func::grad(func::UnaryFn([](const Tensor& a) { return a.sum(); }))(e), e);
}

}  // namespace
}  // namespace kiln
