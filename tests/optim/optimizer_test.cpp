// Optimizers (kiln/optim/optimizers.h) against PyTorch's single-tensor update rules written as a
// naive float64 loop over elements, for several steps: param groups with their own options,
// parameters without a gradient, state dicts (round trip, JSON, resume equals the uninterrupted
// run), zero_grad and bad input.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <memory>
#include <set>

#include "kiln/optim/optimizers.h"
#include "test_util.h"

namespace kiln::testing {
namespace {

using optim::Options;
using Vec = std::vector<double>;

// A parameter that requires grad, with values from `seed`.
Tensor param(std::vector<int64_t> sizes, uint32_t seed, ScalarType dt = kFloat32) {
  Tensor p = random(sizes, dt, -1, 1, seed);
  p.requires_grad_(true);
  return p;
}
void set_grads(const std::vector<Tensor>& ps, uint32_t seed) {
  for (const Tensor& p : ps) p.set_grad(random(p.sizes(), p.dtype(), -1, 1, seed++));
}

// One parameter's reference update: (param, grad, state vectors, step number, options).
using RefStep = std::function<void(Vec& p, const Vec& g, std::map<std::string, Vec>& s, int t,
                                   const Options& o)>;

// Runs `opt` and the reference side by side for `steps` steps over `params` (group i of the
// optimizer holds params[i]) and compares every parameter; the reference skips parameters
// without a gradient (those listed in `no_grad_at_step0`).
void check_against_reference(optim::Optimizer& opt, const RefStep& ref, int steps, double rtol,
                             double atol, std::set<size_t> no_grad_at_step0 = {}) {
  std::vector<Tensor> params;
  std::vector<const Options*> opts;
  for (const optim::ParamGroup& g : opt.param_groups())
    for (const Tensor& p : g.params) params.push_back(p), opts.push_back(&g.options);
  std::vector<Vec> rp;
  for (const Tensor& p : params) rp.push_back(to_doubles(p));
  std::vector<std::map<std::string, Vec>> rs(params.size());
  std::vector<int> rt(params.size(), 0);
  for (int step = 0; step < steps; ++step) {
    set_grads(params, 100 + 10 * step);
    if (step == 0)
      for (size_t i : no_grad_at_step0) params[i].set_grad(Tensor());
    for (size_t i = 0; i < params.size(); ++i) {
      if (!params[i].grad().defined()) continue;
      ref(rp[i], to_doubles(params[i].grad()), rs[i], ++rt[i], *opts[i]);
    }
    opt.step();
  }
  for (size_t i = 0; i < params.size(); ++i) {
    SCOPED_TRACE("parameter " + std::to_string(i));
    expect_close(params[i], from_vector<double>(rp[i], params[i].sizes()).to(params[i].dtype()),
                 rtol, atol);
  }
}

Vec& get(std::map<std::string, Vec>& s, const std::string& k, size_t n, double init = 0) {
  auto it = s.find(k);
  if (it == s.end()) it = s.emplace(k, Vec(n, init)).first;
  return it->second;
}

// torch.optim.SGD, one tensor.
void sgd_ref(Vec& p, const Vec& g, std::map<std::string, Vec>& s, int t, const Options& o) {
  const bool has_buf = s.count("buf") != 0;
  Vec& buf = get(s, "buf", p.size());
  for (size_t i = 0; i < p.size(); ++i) {
    double d = o.at("maximize") != 0 ? -g[i] : g[i];
    d += o.at("weight_decay") * p[i];
    if (o.at("momentum") != 0) {
      buf[i] = !has_buf ? d : o.at("momentum") * buf[i] + (1 - o.at("dampening")) * d;
      d = o.at("nesterov") != 0 ? d + o.at("momentum") * buf[i] : buf[i];
    }
    p[i] -= o.at("lr") * d;
  }
  (void)t;
}

// torch.optim.Adam / AdamW, one tensor.
void adam_ref(Vec& p, const Vec& g, std::map<std::string, Vec>& s, int t, const Options& o,
              bool decoupled) {
  Vec &m = get(s, "m", p.size()), &v = get(s, "v", p.size()), &vmax = get(s, "vmax", p.size());
  const double b1 = o.at("beta1"), b2 = o.at("beta2"), lr = o.at("lr"), wd = o.at("weight_decay");
  for (size_t i = 0; i < p.size(); ++i) {
    double d = o.at("maximize") != 0 ? -g[i] : g[i];
    if (decoupled)
      p[i] *= 1 - lr * wd;
    else
      d += wd * p[i];
    m[i] = b1 * m[i] + (1 - b1) * d;
    v[i] = b2 * v[i] + (1 - b2) * d * d;
    double vi = v[i];
    if (o.at("amsgrad") != 0) vi = vmax[i] = std::max(vmax[i], v[i]);
    const double bc1 = 1 - std::pow(b1, t), bc2 = 1 - std::pow(b2, t);
    p[i] -= lr / bc1 * m[i] / (std::sqrt(vi) / std::sqrt(bc2) + o.at("eps"));
  }
}

TEST(OptimSGD, MatchesTheReferenceWithParamGroups) {
  for (bool nesterov : {false, true}) {
    std::vector<Tensor> a = {param({3, 4}, 1), param({5}, 2)}, b = {param({2, 3, 2}, 3)},
                        c = {param({7}, 4)};
    optim::SGD opt({{a, {}},
                    {b, {{"lr", 0.05}, {"dampening", nesterov ? 0.0 : 0.3}, {"maximize", 1}}},
                    {c, {{"momentum", 0.0}, {"weight_decay", 0.0}, {"nesterov", 0}}}},
                   {.lr = 0.1, .momentum = 0.9, .weight_decay = 0.01, .nesterov = nesterov});
    SCOPED_TRACE(nesterov ? "nesterov" : "plain");
    check_against_reference(opt, sgd_ref, 5, 1e-5, 1e-6, {1});
    EXPECT_EQ(opt.state_of(c[0]).count("momentum_buffer"), 0u);
    EXPECT_EQ(opt.state_of(a[0]).count("momentum_buffer"), 1u);
  }
}

TEST(OptimAdam, MatchesTheReference) {
  for (bool decoupled : {false, true}) {
    SCOPED_TRACE(decoupled ? "AdamW" : "Adam");
    std::vector<Tensor> a = {param({3, 4}, 1), param({70001}, 2)}, b = {param({6}, 3)};
    std::vector<optim::ParamGroup> groups = {
        {a, {}}, {b, {{"amsgrad", 1}, {"beta1", 0.8}, {"lr", 3e-3}, {"maximize", 1}}}};
    std::unique_ptr<optim::Optimizer> opt;
    if (decoupled)
      opt = std::make_unique<optim::AdamW>(groups, optim::AdamWOptions{.lr = 1e-2});
    else
      opt = std::make_unique<optim::Adam>(groups,
                                          optim::AdamOptions{.lr = 1e-2, .weight_decay = 0.1});
    EXPECT_EQ(opt->param_groups()[0].options.at("weight_decay"), decoupled ? 1e-2 : 0.1);
    auto ref = [decoupled](Vec& p, const Vec& g, std::map<std::string, Vec>& s, int t,
                           const Options& o) { adam_ref(p, g, s, t, o, decoupled); };
    check_against_reference(*opt, ref, 6, 1e-4, 1e-6, {0});
    EXPECT_EQ(opt->state_of(a[0]).at("step").item<float>(), 5.0f);  // no grad at the first step
    EXPECT_EQ(opt->state_of(a[1]).at("step").item<float>(), 6.0f);
    EXPECT_EQ(opt->state_of(b[0]).count("max_exp_avg_sq"), 1u);
    EXPECT_EQ(opt->state_of(a[1]).count("max_exp_avg_sq"), 0u);
  }
}

TEST(OptimAdam, FirstStepMovesEachElementByLr) {
  // PyTorch's first Adam step: m̂ = g, v̂ = g², so p -= lr * g / (|g| + eps).
  Tensor p = from_vector<float>({1.0f, -2.0f, 0.5f}, {3});
  p.requires_grad_(true);
  optim::Adam opt({p}, {.lr = 0.1});
  p.set_grad(from_vector<float>({0.3f, -4.0f, 1e-3f}, {3}));
  opt.step();
  expect_close(p, from_vector<float>({0.9f, -1.9f, 0.4f}, {3}), 1e-5, 1e-5);
}

TEST(OptimSGD, Bfloat16AndFloat64Parameters) {
  std::vector<Tensor> ps = {param({4, 5}, 1, kBFloat16), param({9}, 2, kFloat64)};
  optim::SGD opt(ps, {.lr = 0.1, .momentum = 0.9});
  check_against_reference(opt, sgd_ref, 1, 1e-2, 1e-2);  // one step: bf16 rounding only at the end
}

// torch.optim.RMSprop, one tensor.
void rmsprop_ref(Vec& p, const Vec& g, std::map<std::string, Vec>& s, int, const Options& o) {
  Vec &sq = get(s, "sq", p.size()), &ga = get(s, "ga", p.size()), &buf = get(s, "buf", p.size());
  const double alpha = o.at("alpha"), mom = o.at("momentum");
  for (size_t i = 0; i < p.size(); ++i) {
    double d = o.at("maximize") != 0 ? -g[i] : g[i];
    d += o.at("weight_decay") * p[i];
    sq[i] = alpha * sq[i] + (1 - alpha) * d * d;
    double avg;
    if (o.at("centered") != 0) {
      ga[i] = alpha * ga[i] + (1 - alpha) * d;
      avg = std::sqrt(sq[i] - ga[i] * ga[i]) + o.at("eps");
    } else {
      avg = std::sqrt(sq[i]) + o.at("eps");
    }
    if (mom > 0) {
      buf[i] = mom * buf[i] + d / avg;
      p[i] -= o.at("lr") * buf[i];
    } else {
      p[i] -= o.at("lr") * d / avg;
    }
  }
}

// torch.optim.Adagrad, one tensor.
void adagrad_ref(Vec& p, const Vec& g, std::map<std::string, Vec>& s, int t, const Options& o) {
  Vec& sum = get(s, "sum", p.size(), o.at("initial_accumulator_value"));
  const double clr = o.at("lr") / (1 + (t - 1) * o.at("lr_decay"));
  for (size_t i = 0; i < p.size(); ++i) {
    double d = o.at("maximize") != 0 ? -g[i] : g[i];
    d += o.at("weight_decay") * p[i];
    sum[i] += d * d;
    p[i] -= clr * d / (std::sqrt(sum[i]) + o.at("eps"));
  }
}

TEST(OptimRMSprop, MatchesTheReference) {
  std::vector<Tensor> a = {param({3, 4}, 1), param({5}, 2)}, b = {param({6}, 3)},
                      c = {param({2, 2}, 4)};
  optim::RMSprop opt({{a, {}},
                      {b, {{"centered", 1}, {"momentum", 0.9}, {"maximize", 1}}},
                      {c, {{"centered", 1}, {"alpha", 0.9}}}},
                     {.lr = 1e-2, .weight_decay = 0.01});
  check_against_reference(opt, rmsprop_ref, 5, 1e-4, 1e-6, {1});
  EXPECT_EQ(opt.state_of(b[0]).count("grad_avg"), 1u);
  EXPECT_EQ(opt.state_of(b[0]).count("momentum_buffer"), 1u);
  EXPECT_EQ(opt.state_of(a[0]).count("grad_avg"), 0u);
  EXPECT_EQ(opt.state_of(a[0]).at("step").item<float>(), 5.0f);
}

TEST(OptimAdagrad, MatchesTheReference) {
  std::vector<Tensor> a = {param({3, 4}, 1), param({5}, 2)}, b = {param({6}, 3)};
  optim::Adagrad opt({{a, {}}, {b, {{"lr_decay", 0.1}, {"maximize", 1}, {"weight_decay", 0.1}}}},
                     {.lr = 0.1, .initial_accumulator_value = 0.5});
  EXPECT_EQ(to_doubles(opt.state_of(a[1]).at("sum")), Vec(5, 0.5));  // state from construction
  check_against_reference(opt, adagrad_ref, 5, 1e-5, 1e-6, {0});
}

TEST(OptimStateDict, ResumeEqualsTheUninterruptedRun) {
  auto make_params = [] { return std::vector<Tensor>{param({3, 4}, 1), param({5}, 2)}; };
  std::vector<std::function<std::unique_ptr<optim::Optimizer>(std::vector<Tensor>)>> makers = {
      [](std::vector<Tensor> p) {
        return std::make_unique<optim::SGD>(p, optim::SGDOptions{.lr = 0.1, .momentum = 0.9});
      },
      [](std::vector<Tensor> p) {
        return std::make_unique<optim::Adam>(p, optim::AdamOptions{.lr = 1e-2, .amsgrad = true});
      },
      [](std::vector<Tensor> p) { return std::make_unique<optim::AdamW>(p); },
      [](std::vector<Tensor> p) {
        return std::make_unique<optim::RMSprop>(
            p, optim::RMSpropOptions{.momentum = 0.5, .centered = true});
      },
      [](std::vector<Tensor> p) { return std::make_unique<optim::Adagrad>(p); },
  };
  for (const auto& make : makers) {
    std::vector<Tensor> full = make_params(), resumed = make_params();
    auto opt_full = make(full);
    auto opt_a = make(resumed);
    for (int step = 0; step < 3; ++step) {
      set_grads(full, 10 * step), set_grads(resumed, 10 * step);
      opt_full->step(), opt_a->step();
    }
    opt_a->param_groups()[0].options["lr"] *= 0.5;
    opt_full->param_groups()[0].options["lr"] *= 0.5;
    optim::StateDict sd = opt_a->state_dict();
    // Through JSON, as a checkpoint stores the options.
    sd.param_groups = optim::StateDict::groups_from_json(sd.groups_to_json());
    auto opt_b = make(resumed);
    opt_b->load_state_dict(sd);
    EXPECT_EQ(opt_b->param_groups()[0].options.at("lr"), opt_a->param_groups()[0].options.at("lr"));
    for (int step = 3; step < 6; ++step) {
      set_grads(full, 10 * step), set_grads(resumed, 10 * step);
      opt_full->step(), opt_b->step();
    }
    for (size_t i = 0; i < full.size(); ++i) expect_close(resumed[i], full[i], 0, 0);
  }
}

TEST(OptimStateDict, FlatKeysAndCopies) {
  std::vector<Tensor> a = {param({2}, 1)}, b = {param({3}, 2), param({4}, 3)};
  optim::Adam opt({{a, {}}, {b, {{"lr", 0.5}}}});
  set_grads({a[0], b[1]}, 7);
  opt.step();
  optim::StateDict sd = opt.state_dict();
  std::vector<std::string> keys;
  for (const auto& [k, t] : sd.state) keys.push_back(k);
  EXPECT_EQ(keys, (std::vector<std::string>{"0.exp_avg", "0.exp_avg_sq", "0.step", "2.exp_avg",
                                            "2.exp_avg_sq", "2.step"}));
  ASSERT_EQ(sd.param_groups.size(), 2u);
  EXPECT_EQ(sd.param_groups[1].params, (std::vector<int64_t>{1, 2}));
  EXPECT_EQ(sd.param_groups[1].options.at("lr"), 0.5);
  // The state dict holds copies: stepping again does not change it.
  const double before = to_doubles(sd.state.at("2.exp_avg"))[0];
  set_grads({a[0], b[1]}, 9);
  opt.step();
  EXPECT_EQ(to_doubles(sd.state.at("2.exp_avg"))[0], before);
  EXPECT_EQ(sd.groups_to_json().substr(0, 17), "{\"param_groups\":[");
}

TEST(OptimStateDict, BadStateDicts) {
  std::vector<Tensor> ps = {param({2}, 1), param({3}, 2)};
  optim::SGD opt(ps, {.lr = 0.1, .momentum = 0.9});
  optim::StateDict sd = opt.state_dict();
  optim::StateDict two_groups = sd;
  two_groups.param_groups.push_back(sd.param_groups[0]);
  expect_error(ErrorKind::Value, "loaded state dict has 2 param groups, but the optimizer has 1",
               [&] { opt.load_state_dict(two_groups); });
  optim::StateDict bad_shape = sd;
  bad_shape.state["1.momentum_buffer"] = zeros({4});
  expect_error(ErrorKind::Value,
               "state \"1.momentum_buffer\" has shape [4] but parameter 1 has shape [3]",
               [&] { opt.load_state_dict(bad_shape); });
  optim::StateDict bad_key = sd;
  bad_key.state["x.momentum_buffer"] = zeros({2});
  expect_error(ErrorKind::Value, "state key \"x.momentum_buffer\" names no parameter",
               [&] { opt.load_state_dict(bad_key); });
  bad_key.state.clear();
  bad_key.state["7.momentum_buffer"] = zeros({2});
  expect_error(ErrorKind::Value, "state key \"7.momentum_buffer\" names no parameter",
               [&] { opt.load_state_dict(bad_key); });
  expect_error(ErrorKind::Value, "expected a JSON object",
               [&] { optim::StateDict::groups_from_json("{not json"); });
  expect_error(ErrorKind::Value, "option \"lr\" must be a number",
               [&] { optim::StateDict::groups_from_json(R"({"param_groups":[{"lr":"x"}]})"); });
}

TEST(Optim, ZeroGradAndBadInput) {
  std::vector<Tensor> ps = {param({2}, 1), param({3}, 2)};
  optim::SGD opt(ps);
  set_grads(ps, 3);
  opt.zero_grad(false);
  EXPECT_EQ(to_doubles(ps[0].grad()), (Vec{0, 0}));
  opt.zero_grad();
  EXPECT_FALSE(ps[0].grad().defined());
  opt.step();  // no gradients: nothing happens
  expect_error(ErrorKind::Value, "SGD: unknown option \"betas\" in param group 1", [&] {
    optim::SGD({{{ps[0]}, {}}, {{ps[1]}, {{"betas", 1}}}});
  });
  expect_error(ErrorKind::Value, "appears in more than one group", [&] {
    optim::Adam({{{ps[0]}, {}}, {{ps[0]}, {}}});
  });
  expect_error(ErrorKind::Value, "Adam: invalid learning rate -1",
               [&] { optim::Adam(ps, {.lr = -1}); });
  expect_error(ErrorKind::Value, "empty parameter list",
               [&] { optim::SGD(std::vector<optim::ParamGroup>{}); });
  expect_error(ErrorKind::Type, "must be floating-point",
               [&] { optim::SGD(std::vector<Tensor>{zeros({2}, kInt64)}); });
  // Options the fused op checks are reported at the step.
  optim::SGD nesterov(ps, {.nesterov = true});
  set_grads(ps, 4);
  expect_error(ErrorKind::Value, "SGD: nesterov momentum requires a momentum and zero dampening",
               [&] { nesterov.step(); });
}

}  // namespace
}  // namespace kiln::testing
