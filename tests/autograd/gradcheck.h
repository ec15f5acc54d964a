// tests/autograd/gradcheck.h: reverse-mode gradients against central finite differences.
//
//   EXPECT_TRUE(gradcheck([](const std::vector<Tensor>& x) { return kiln::exp(x[0]); },
//                         {testing::random({3, 4}, kFloat64)}));
//
// Every output element j gives one vector-Jacobian product (grad with a one-hot grad_output),
// compared with (f(x + eps e_k) - f(x - eps e_k)) / 2 eps for every input element k. Inputs
// must be float64; they are made contiguous leaves that require grad.
#pragma once

#include <gtest/gtest.h>

#include <functional>
#include <sstream>
#include <vector>

#include "kiln/autograd/autograd.h"
#include "kiln/kiln.h"

namespace kiln::testing {

using GradFn = std::function<Tensor(const std::vector<Tensor>&)>;

inline ::testing::AssertionResult gradcheck(const GradFn& fn, std::vector<Tensor> inputs,
                                            double eps = 1e-6, double atol = 1e-6,
                                            double rtol = 1e-4) {
  for (Tensor& x : inputs) {
    if (x.dtype() != kFloat64) return ::testing::AssertionFailure() << "gradcheck needs float64 inputs";
    x = x.detach().contiguous();
    x.requires_grad_();
  }
  Tensor out = fn(inputs);
  if (!out.requires_grad()) return ::testing::AssertionFailure() << "the output does not require grad";
  Tensor base;
  {
    autograd::NoGradGuard ng;
    base = out.detach().contiguous();
  }
  const int64_t m = out.numel();
  // analytical[i][j][k] = d out_j / d input_i[k]
  std::vector<std::vector<std::vector<double>>> analytical(inputs.size());
  for (int64_t j = 0; j < m; ++j) {
    Tensor go = kiln::zeros(out.sizes(), kFloat64);
    go.data_ptr<double>()[j] = 1.0;
    auto gs = autograd::grad({out}, inputs, {go}, /*retain_graph=*/true, false, /*allow_unused=*/true);
    for (size_t i = 0; i < inputs.size(); ++i) {
      std::vector<double> row(inputs[i].numel(), 0.0);
      if (gs[i].defined()) {
        Tensor g = gs[i].contiguous();
        for (int64_t k = 0; k < g.numel(); ++k) row[k] = g.data_ptr<double>()[k];
      }
      analytical[i].push_back(std::move(row));
    }
  }
  autograd::NoGradGuard ng;
  for (size_t i = 0; i < inputs.size(); ++i) {
    double* p = inputs[i].data_ptr<double>();
    for (int64_t k = 0; k < inputs[i].numel(); ++k) {
      double orig = p[k];
      p[k] = orig + eps;
      Tensor plus = fn(inputs).clone();  // views alias the inputs
      p[k] = orig - eps;
      Tensor minus = fn(inputs).clone();
      p[k] = orig;
      for (int64_t j = 0; j < m; ++j) {
        double num = (plus.data_ptr<double>()[j] - minus.data_ptr<double>()[j]) / (2 * eps);
        double ana = analytical[i][j][k];
        if (std::abs(num - ana) > atol + rtol * std::abs(num)) {
          return ::testing::AssertionFailure()
                 << "input " << i << " element " << k << ", output element " << j
                 << ": analytical " << ana << " vs numerical " << num;
        }
      }
    }
  }
  return ::testing::AssertionSuccess();
}

}  // namespace kiln::testing
