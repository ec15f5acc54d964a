// kiln/autograd/autograd.h: everything kiln_autograd offers (graph, engine, grad modes, hooks,
// custom functions, anomaly mode, checkpointing).
#pragma once

#include "kiln/autograd/anomaly.h"
#include "kiln/autograd/checkpoint.h"
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
