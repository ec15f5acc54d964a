// kiln/autograd/autograd.h: everything kiln_autograd offers: the graph, the engine, grad modes,
// hooks, custom Functions, anomaly mode, checkpointing, forward-mode AD (dual tensors,
// forward_ad.h) and the kiln::func transforms.
//
//   kiln::Tensor w = kiln::randn({3, 2}).requires_grad_();
//   kiln::Tensor loss = kiln::matmul(x, w).sum();
//   loss.backward();                                       // fills w.grad()
//   { kiln::autograd::NoGradGuard ng; w.sub_(w.grad() * 0.1); }
//   auto hess = kiln::func::hessian(f)(x);                  // transforms compose
#pragma once

#include "kiln/autograd/anomaly.h"
#include "kiln/autograd/checkpoint.h"
#include "kiln/autograd/forward_ad.h"
#include "kiln/autograd/engine.h"
#include "kiln/autograd/function.h"
#include "kiln/autograd/formulas.h"
#include "kiln/autograd/functional.h"
#include "kiln/autograd/grad_mode.h"
#include "kiln/autograd/node.h"

namespace kiln::autograd {
// Names of the differentiable ops whose backward is still a NotImplementedBackward node, each
// with the formula helpers it waits for ("sum_backward, cast_back"). Generated.
struct PendingDerivative {
  const char* op;
  const char* missing;
};
const std::vector<PendingDerivative>& pending_derivatives();
}  // namespace kiln::autograd
