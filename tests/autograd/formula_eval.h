// tests/autograd/formula_eval.h: the op table's derivative formulas, evaluated on boxed inputs
// (generated into the build directory by autograd/check_formulas.py).
//
//   const FormulaEval& f = formula_evals().at("mul");
//   std::vector<Tensor> g = f(inputs, outputs, grad);   // one per Tensor input (lists flattened)
//   Tensor t = jvp_evals().at("mul")(inputs, outputs, tangents);
#pragma once

#include <map>
#include <string>
#include <vector>

#include "kiln/ivalue.h"

namespace kiln::autograd::formula_check {

// in: the op's arguments before the call; outs: its outputs; grad: the first output's gradient.
using FormulaEval = std::vector<Tensor> (*)(const Stack& in, const std::vector<Tensor>& outs,
                                            const Tensor& grad);
const std::map<std::string, FormulaEval>& formula_evals();

// The jvp formulas (rows with an explicit one): tangents holds one tangent per Tensor input.
using JvpEval = Tensor (*)(const Stack& in, const std::vector<Tensor>& outs,
                           const std::vector<Tensor>& tangents);
const std::map<std::string, JvpEval>& jvp_evals();

}  // namespace kiln::autograd::formula_check
