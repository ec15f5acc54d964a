// Fused optimizer steps (tensor/ops/optim.toml) against PyTorch's single-tensor update rules
// written with table ops in float64, one parameter at a time, over several steps: every option,
// a parameter larger than one chunk, float64, bfloat16 (state rounded each step), strided
// parameters, version counters, empty lists and bad input.
#include <gtest/gtest.h>

#include <cmath>

#include "kiln/operators.h"
#include "test_util.h"

namespace kiln::testing {
namespace {

using List = std::vector<Tensor>;
using Sizes = std::vector<int64_t>;

const std::vector<Sizes> kShapes = {{3, 5}, {7}, {2, 3, 4}, {70001}};  // the last: three chunks

List randoms(ScalarType dt, uint32_t seed, double lo = -1, double hi = 1) {
  List out;
  for (const Sizes& s : kShapes) out.push_back(random(s, dt, lo, hi, seed++));
  return out;
}
List clones(const List& l, ScalarType dt) {
  List out;
  for (const Tensor& t : l) out.push_back(t.to(dt, std::nullopt, true));
  return out;
}
// Rounds a float64 reference to the dtype the fused op stores (a no-op for float64).
Tensor stored(const Tensor& t, ScalarType dt) { return t.to(dt).to(kFloat64); }
void expect_lists_close(const List& got, const List& want, double rtol, double atol) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    SCOPED_TRACE("tensor " + std::to_string(i));
    expect_close(got[i], want[i], rtol, atol);
  }
}

struct SgdCfg {
  double wd, momentum, lr, dampening;
  bool nesterov, maximize;
};

void check_sgd(const SgdCfg& c, ScalarType dt, double rtol, double atol) {
  List p = randoms(dt, 1), buf = clones(p, dt);
  List rp = clones(p, kFloat64), rbuf;
  for (int step = 0; step < 4; ++step) {
    List g = randoms(dt, 100 + 10 * step);
    _fused_sgd_(p, g, c.momentum != 0 ? buf : List{}, c.wd, c.momentum, c.lr, c.dampening,
                c.nesterov, c.maximize, step == 0);
    for (size_t i = 0; i < rp.size(); ++i) {  // torch.optim.SGD, single tensor
      Tensor gi = g[i].to(kFloat64);
      if (c.maximize) gi = -gi;
      if (c.wd != 0) gi = gi + rp[i] * c.wd;
      if (c.momentum != 0) {
        Tensor b = step == 0 ? gi : rbuf[i] * c.momentum + gi * (1 - c.dampening);
        if (step == 0)
          rbuf.push_back(stored(b, dt));
        else
          rbuf[i] = stored(b, dt);
        gi = c.nesterov ? gi + b * c.momentum : b;
      }
      rp[i] = stored(rp[i] - gi * c.lr, dt);
    }
  }
  expect_lists_close(p, rp, rtol, atol);
  if (c.momentum != 0) expect_lists_close(buf, rbuf, rtol, atol);
}

TEST(FusedSgd, MatchesTheSingleTensorLoop) {
  for (const SgdCfg& c :
       {SgdCfg{0, 0, 0.1, 0, false, false}, SgdCfg{0.01, 0.9, 0.05, 0, false, false},
        SgdCfg{0.01, 0.9, 0.05, 0.3, false, true}, SgdCfg{0, 0.8, 0.1, 0, true, false}}) {
    SCOPED_TRACE("wd " + std::to_string(c.wd) + " momentum " + std::to_string(c.momentum) +
                 " dampening " + std::to_string(c.dampening) + (c.nesterov ? " nesterov" : "") +
                 (c.maximize ? " maximize" : ""));
    check_sgd(c, kFloat32, 1e-5, 1e-6);
    check_sgd(c, kFloat64, 1e-12, 1e-13);
    check_sgd(c, kBFloat16, 2e-2, 1e-2);
  }
}

struct AdamCfg {
  double lr, beta1, beta2, wd, eps;
  bool amsgrad, maximize, decoupled;
};

void check_adam(const AdamCfg& c, ScalarType dt, double rtol, double atol) {
  List p = randoms(dt, 1), m = randoms(dt, 20), v = randoms(dt, 40, 0, 1), vmax = clones(v, dt);
  List steps;
  for (size_t i = 0; i < p.size(); ++i) steps.push_back(full({}, static_cast<double>(i)));
  List rp = clones(p, kFloat64), rm = clones(m, kFloat64), rv = clones(v, kFloat64),
       rvmax = clones(v, kFloat64);
  for (int step = 0; step < 5; ++step) {
    List g = randoms(dt, 100 + 10 * step);
    auto fused = c.decoupled ? _fused_adamw_ : _fused_adam_;
    fused(p, g, m, v, c.amsgrad ? vmax : List{}, steps, c.lr, c.beta1, c.beta2, c.wd, c.eps,
          c.amsgrad, c.maximize);
    for (size_t i = 0; i < rp.size(); ++i) {  // torch.optim.Adam(W), single tensor
      const double t = static_cast<double>(i + step + 1);
      Tensor gi = g[i].to(kFloat64);
      if (c.maximize) gi = -gi;
      if (c.decoupled)
        rp[i] = rp[i] * (1 - c.lr * c.wd);
      else if (c.wd != 0)
        gi = gi + rp[i] * c.wd;
      Tensor mi = rm[i] + (gi - rm[i]) * (1 - c.beta1);
      Tensor vi = rv[i] * c.beta2 + gi * gi * (1 - c.beta2);
      Tensor denom_of = vi;
      if (c.amsgrad) {
        denom_of = maximum(rvmax[i], vi);
        rvmax[i] = stored(denom_of, dt);
      }
      const double bc1 = 1 - std::pow(c.beta1, t), bc2 = 1 - std::pow(c.beta2, t);
      Tensor denom = sqrt(denom_of) / std::sqrt(bc2) + c.eps;
      rp[i] = stored(rp[i] - mi / denom * (c.lr / bc1), dt);
      rm[i] = stored(mi, dt);
      rv[i] = stored(vi, dt);
    }
  }
  expect_lists_close(p, rp, rtol, atol);
  expect_lists_close(m, rm, rtol, atol);
  expect_lists_close(v, rv, rtol, atol);
  if (c.amsgrad) expect_lists_close(vmax, rvmax, rtol, atol);
  for (size_t i = 0; i < steps.size(); ++i) EXPECT_EQ(steps[i].item<float>(), i + 5.0f);
}

TEST(FusedAdam, MatchesTheSingleTensorLoop) {
  for (const AdamCfg& c : {AdamCfg{1e-2, 0.9, 0.999, 0, 1e-8, false, false, false},
                           AdamCfg{1e-2, 0.8, 0.99, 0.1, 1e-6, true, false, false},
                           AdamCfg{1e-3, 0.9, 0.999, 0.05, 1e-8, false, true, true},
                           AdamCfg{1e-2, 0.9, 0.95, 0.01, 1e-8, true, false, true}}) {
    SCOPED_TRACE(std::string(c.decoupled ? "adamw" : "adam") + " wd " + std::to_string(c.wd) +
                 (c.amsgrad ? " amsgrad" : "") + (c.maximize ? " maximize" : ""));
    check_adam(c, kFloat32, 1e-4, 1e-6);
    check_adam(c, kFloat64, 1e-11, 1e-13);
    check_adam(c, kBFloat16, 3e-2, 1e-2);
  }
}

TEST(FusedOptim, StridedParametersAndVersionCounters) {
  Tensor base = random({6, 4}, kFloat32, -1, 1, 1);
  Tensor p = base.t();  // strided: updated through a contiguous copy written back
  Tensor g = random({4, 6}, kFloat32, -1, 1, 2), buf = zeros({4, 6});
  Tensor want = p - g * 0.5;
  const uint32_t before = p.impl()->version(), buf_before = buf.impl()->version();
  _fused_sgd_({p}, {g}, {buf}, 0.0, 0.9, 0.5, 0.0, false, false, true);
  expect_close(p, want);
  expect_close(base.t(), want);
  EXPECT_GT(p.impl()->version(), before);
  EXPECT_GT(buf.impl()->version(), buf_before);
  // Boxed calls bump them too.
  const uint32_t mid = p.impl()->version();
  Stack s = {List{p}, List{g}, List{buf}, 0.0, 0.9, 0.5, 0.0, false, false, false};
  Dispatcher::get().find_or_throw("_fused_sgd_").call_boxed(s);
  EXPECT_GT(p.impl()->version(), mid);
  // Empty lists are a no-op.
  _fused_adam_({}, {}, {}, {}, {}, {}, 1e-3, 0.9, 0.999, 0.0, 1e-8, false, false);
}

TEST(FusedOptim, BadInput) {
  List p = {random({2, 3}), random({4})}, g = {random({2, 3}), random({4})};
  List steps = {full({}, 0.0), full({}, 0.0)};
  expect_error(ErrorKind::Value, "expected 2 grads (one per parameter), got 1",
               [&] { _fused_sgd_(p, {g[0]}, {}, 0.0, 0.0, 0.1, 0.0, false, false, false); });
  expect_error(ErrorKind::Value, "grads[1] has shape [5] but parameter 1 has shape [4]", [&] {
    _fused_sgd_(p, {g[0], random({5})}, {}, 0.0, 0.0, 0.1, 0.0, false, false, false);
  });
  expect_error(ErrorKind::Type, "exp_avgs[0] has dtype", [&] {
    _fused_adam_(p, g, {g[0].to(kFloat64), g[1]}, g, {}, steps, 1e-3, 0.9, 0.999, 0.0, 1e-8, false,
                 false);
  });
  expect_error(ErrorKind::Value, "expected 2 max_exp_avg_sqs", [&] {
    _fused_adamw_(p, g, g, g, {}, steps, 1e-3, 0.9, 0.999, 0.0, 1e-8, true, false);
  });
  expect_error(ErrorKind::Value, "state_steps[1] must hold one element, got shape [2]", [&] {
    _fused_adam_(p, g, g, g, {}, {steps[0], zeros({2})}, 1e-3, 0.9, 0.999, 0.0, 1e-8, false, false);
  });
  expect_error(ErrorKind::Value, "invalid betas (0.9, 1)", [&] {
    _fused_adam_(p, g, g, g, {}, steps, 1e-3, 0.9, 1.0, 0.0, 1e-8, false, false);
  });
  expect_error(ErrorKind::Value, "nesterov momentum requires a momentum",
               [&] { _fused_sgd_(p, g, {}, 0.0, 0.0, 0.1, 0.0, true, false, false); });
  expect_error(ErrorKind::Type, "parameter 0 must be floating-point", [&] {
    _fused_sgd_({zeros({2}, kInt64)}, {zeros({2}, kInt64)}, {}, 0.0, 0.0, 0.1, 0.0, false, false,
                false);
  });
}

}  // namespace
}  // namespace kiln::testing
