// tests/autograd/gradgradcheck.h: gradcheck for functions with several outputs and inputs of
// any layout, and gradgradcheck (second derivatives by finite differences of the first).
//
//   using VF = std::function<std::vector<Tensor>(const std::vector<Tensor>&)>;
//   EXPECT_TRUE(gradcheck_n(fn, {testing::non_contiguous(x)}));   // strides kept
//   EXPECT_TRUE(gradgradcheck(fn, {x, y}));                       // d/dx (v^T df/dx)
//
// gradcheck_n: every floating output that requires grad gets vector-Jacobian products for a
// set of cotangents (one-hot per element when the outputs are small, else a few random dense
// ones), compared with the same projections of central differences (f(x + eps e_k) -
// f(x - eps e_k)) / 2 eps for every element k of every input. Inputs must be float64; they
// become leaves that require grad with their layout unchanged.
//
// gradgradcheck: g(x, v) = grad(f(x), x, v, create_graph=true) is itself gradchecked, with
// respect to x and to the cotangent v (as PyTorch's gradgradcheck).
#pragma once

#include <gtest/gtest.h>

#include <functional>
#include <random>
#include <vector>

#include "kiln/autograd/autograd.h"
#include "kiln/kiln.h"
#include "test_util.h"

namespace kiln::testing {

using MultiFn = std::function<std::vector<Tensor>(const std::vector<Tensor>&)>;

struct GradcheckOptions {
  double eps = 1e-6, atol = 1e-6, rtol = 1e-4;
  int64_t max_one_hot = 96;   // outputs with more elements get random dense cotangents
  int random_cotangents = 3;
  bool numerical_in_grad_mode = false;  // gradgradcheck: g needs the graph to differentiate
};

namespace detail {

// Address of element k (row-major) of a float64 tensor of any layout.
inline double* element(const Tensor& t, int64_t k) {
  int64_t off = 0;
  for (int64_t d = t.dim() - 1; d >= 0; --d) {
    off += (k % t.size(d)) * t.stride(d);
    k /= t.size(d);
  }
  return t.data_ptr<double>() + off;
}

inline std::vector<Tensor> differentiable_outputs(const std::vector<Tensor>& outs) {
  std::vector<Tensor> r;
  for (const Tensor& o : outs)
    if (o.defined() && o.requires_grad() && is_floating(o.dtype())) r.push_back(o);
  return r;
}

}  // namespace detail

inline ::testing::AssertionResult gradcheck_n(const MultiFn& fn, std::vector<Tensor> inputs,
                                              const GradcheckOptions& opt = {}) {
  for (Tensor& x : inputs) {
    if (x.dtype() != kFloat64) return ::testing::AssertionFailure() << "gradcheck_n needs float64 inputs";
    x = x.detach();
    x.requires_grad_();
  }
  std::vector<Tensor> outs = detail::differentiable_outputs(fn(inputs));
  if (outs.empty()) return ::testing::AssertionFailure() << "no output requires grad";
  int64_t total = 0;
  for (const Tensor& o : outs) total += o.numel();

  // cotangents[c][o]: the c-th cotangent for output o (float64, the output's shape).
  std::vector<std::vector<Tensor>> cotangents;
  if (total <= opt.max_one_hot) {
    for (size_t o = 0; o < outs.size(); ++o)
      for (int64_t j = 0; j < outs[o].numel(); ++j) {
        std::vector<Tensor> c;
        for (size_t p = 0; p < outs.size(); ++p) c.push_back(zeros(outs[p].sizes(), kFloat64));
        c[o].data_ptr<double>()[j] = 1.0;
        cotangents.push_back(std::move(c));
      }
  } else {
    for (int r = 0; r < opt.random_cotangents; ++r) {
      std::vector<Tensor> c;
      for (size_t p = 0; p < outs.size(); ++p)
        c.push_back(random(outs[p].sizes(), kFloat64, -1, 1, 100 + 7 * r + static_cast<uint32_t>(p)));
      cotangents.push_back(std::move(c));
    }
  }

  // analytical[c][i]: the gradient of input i for cotangent c (row-major values).
  std::vector<std::vector<std::vector<double>>> analytical;
  for (const auto& c : cotangents) {
    auto gs = autograd::grad(outs, inputs, c, /*retain_graph=*/true, false, /*allow_unused=*/true);
    std::vector<std::vector<double>> per_input;
    for (size_t i = 0; i < inputs.size(); ++i) {
      if (gs[i].defined() && gs[i].sizes() != inputs[i].sizes())
        return ::testing::AssertionFailure() << "input " << i << ": gradient of shape "
                                             << gs[i].sizes() << " for an input of shape "
                                             << inputs[i].sizes();
      per_input.push_back(gs[i].defined() ? to_doubles(gs[i])
                                          : std::vector<double>(inputs[i].numel(), 0.0));
    }
    analytical.push_back(std::move(per_input));
  }
  std::vector<std::vector<double>> cot_values;  // cotangent c flattened over all outputs
  for (const auto& c : cotangents) {
    std::vector<double> flat;
    for (const Tensor& t : c)
      for (double d : to_doubles(t)) flat.push_back(d);
    cot_values.push_back(std::move(flat));
  }

  // The numerical side reads the outputs that require grad in grad mode (gradgradcheck), every
  // floating output under no-grad (where none requires grad).
  autograd::AutoGradMode mode(opt.numerical_in_grad_mode);
  auto run = [&]() {
    std::vector<double> flat;
    for (const Tensor& o : fn(inputs)) {
      if (!o.defined() || !is_floating(o.dtype())) continue;
      if (opt.numerical_in_grad_mode && !o.requires_grad()) continue;
      for (double d : to_doubles(o.detach())) flat.push_back(d);
    }
    return flat;
  };
  if (static_cast<int64_t>(run().size()) != total)
    return ::testing::AssertionFailure() << "the outputs that require grad are not the floating ones";
  for (size_t i = 0; i < inputs.size(); ++i) {
    for (int64_t k = 0; k < inputs[i].numel(); ++k) {
      double* p = detail::element(inputs[i], k);
      double orig = *p;
      std::vector<double> plus, minus;
      *p = orig + opt.eps;
      plus = run();
      *p = orig - opt.eps;
      minus = run();
      *p = orig;
      for (size_t c = 0; c < cotangents.size(); ++c) {
        double num = 0;
        for (size_t j = 0; j < plus.size() && j < cot_values[c].size(); ++j)
          if (cot_values[c][j] != 0) num += cot_values[c][j] * (plus[j] - minus[j]) / (2 * opt.eps);
        double ana = analytical[c][i][k];
        if (!(std::abs(num - ana) <= opt.atol + opt.rtol * std::abs(num)))
          return ::testing::AssertionFailure()
                 << "input " << i << " element " << k << ", cotangent " << c << ": analytical "
                 << ana << " vs numerical " << num;
      }
    }
  }
  return ::testing::AssertionSuccess();
}

// Second derivatives: gradcheck of (x, v) -> d(v . f(x))/dx computed with create_graph=true.
inline ::testing::AssertionResult gradgradcheck(const MultiFn& fn, std::vector<Tensor> inputs,
                                                GradcheckOptions opt = {}) {
  const size_t n = inputs.size();
  std::vector<Tensor> probe;
  {
    std::vector<Tensor> leaves;
    for (const Tensor& x : inputs) leaves.push_back(x.detach().requires_grad_());
    probe = detail::differentiable_outputs(fn(leaves));
  }
  if (probe.empty()) return ::testing::AssertionFailure() << "no output requires grad";
  std::vector<Tensor> all = inputs;
  for (size_t o = 0; o < probe.size(); ++o)
    all.push_back(random(probe[o].sizes(), kFloat64, -1, 1, 300 + static_cast<uint32_t>(o)));
  MultiFn first = [fn, n](const std::vector<Tensor>& xv) {
    std::vector<Tensor> x(xv.begin(), xv.begin() + n), v(xv.begin() + n, xv.end());
    std::vector<Tensor> outs = detail::differentiable_outputs(fn(x));
    std::vector<Tensor> gs = autograd::grad(outs, x, v, /*retain_graph=*/true,
                                            /*create_graph=*/true, /*allow_unused=*/true);
    std::vector<Tensor> r;
    for (const Tensor& g : gs)
      if (g.defined()) r.push_back(g);
    return r;
  };
  opt.numerical_in_grad_mode = true;
  return gradcheck_n(first, all, opt);
}

}  // namespace kiln::testing
