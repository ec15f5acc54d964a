// Every derivative formula of the op table, evaluated on the manifest's sample inputs (converted to
// float64) and compared with central finite differences of the op itself: the vector-Jacobian
// product for a random cotangent of the first output, for each floating Tensor input.
// (No autograd engine is needed: autograd/check_formulas.py generates one evaluator per row.)
#include <iostream>
#include <set>

#include "autograd/formula_eval.h"
#include "autograd/formula_util.h"
#include "samples/manifest.h"
#include "samples/op_samples.h"

namespace kiln::autograd {
namespace {

using formula_check::formula_evals;

using testing::clone_stack;  // a deep copy (in-place ops mutate their inputs)
using testing::outputs_of;

// The k-th tensor of a stack (lists flattened), by reference into the stack.
Tensor* tensor_at(Stack& s, size_t k) {
  size_t n = 0;
  for (IValue& v : s) {
    if (v.is_tensor()) {
      if (n++ == k) return const_cast<Tensor*>(&v.to_tensor());
    } else if (v.is_tensor_list()) {
      for (const Tensor& t : v.to_tensor_list())
        if (n++ == k) return const_cast<Tensor*>(&t);
    }
  }
  return nullptr;
}

std::vector<Tensor> call(OperatorHandle& op, const Stack& in) {
  Stack s = clone_stack(in);
  op.call_boxed(s);
  return outputs_of(s);
}

// The samples a row's formulas are checked on: its own, those of its in-place and .out variants
// (same arguments; .out's trailing `out` dropped) and extra floating ones for rows whose manifest
// samples are all integral.
std::vector<Stack> samples_for(const std::string& name) {
  std::vector<Stack> out;
  const auto& reg = testing::op_sample_registry();
  for (const std::string& variant : {name, name + "_", name + ".out"}) {
    auto it = reg.find(variant);
    if (it == reg.end()) continue;
    for (Stack s : it->second()) {
      if (variant == name + ".out") s.pop_back();
      out.push_back(std::move(s));
    }
  }
  if (name == "min.dim" || name == "max.dim")
    out.push_back({testing::random({3, 4}), int64_t{-1}, false});
  return out;
}

// Rows whose derivative is by definition not that of the op: the straight-through estimators of
// fake quantization (Note [Straight-through gradients] in manifest_gradcheck_test.cpp).
const std::set<std::string> kNotFiniteDifferences = {"fake_quantize_per_tensor_affine",
                                                     "fake_quantize_per_channel_affine"};

TEST(FormulasTable, EveryFormulaMatchesFiniteDifferences) {
  int checked = 0;
  std::set<std::string> ops_checked;
  for (const auto& [name, eval] : formula_evals()) {
    if (kNotFiniteDifferences.count(name)) continue;
    OperatorHandle& op = Dispatcher::get().find_or_throw(name);
    int n = 0;
    for (const Stack& sample : samples_for(name)) {
      SCOPED_TRACE(name + " sample " + std::to_string(n++));
      Stack in = testing::to_float64(sample);
      std::vector<Tensor> outs = call(op, in);
      if (outs.empty() || !is_floating(outs[0].dtype())) continue;
      Tensor v = testing::cotangent(outs[0]);
      std::vector<Tensor> grads = eval(clone_stack(in), outs, v);
      for (size_t k = 0; k < grads.size(); ++k) {
        Tensor* x = tensor_at(in, k);
        if (x == nullptr && !grads[k].defined()) continue;  // a trailing Tensor? given None
        ASSERT_NE(x, nullptr);
        if (!grads[k].defined() || !is_floating(x->dtype())) continue;
        SCOPED_TRACE("input " + std::to_string(k));
        if (grads[k].sizes() != x->sizes()) {
          ADD_FAILURE() << "the gradient has shape " << grads[k].sizes() << ", the input "
                        << x->sizes();
          continue;
        }
        EXPECT_EQ(grads[k].dtype(), x->dtype());
        std::vector<double> got = testing::to_doubles(grads[k]);
        const Tensor base = x->contiguous();
        for (int64_t i = 0; i < base.numel(); ++i) {
          auto loss = [&](double h) {
            Stack p = clone_stack(in);
            Tensor xp = base.clone();
            xp.data_ptr<double>()[i] += h;
            *tensor_at(p, k) = xp;
            return (call(op, p)[0] * v).sum().item<double>();
          };
          const double h = 1e-6, want = (loss(h) - loss(-h)) / (2 * h);
          if (std::isnan(want)) continue;  // outside the op's domain (pow of a negative base)
          EXPECT_NEAR(got[i], want, 1e-5 * (1 + std::fabs(want))) << "element " << i;
        }
        ++checked;
        ops_checked.insert(name);
      }
    }
  }
  // Every row with formulas has at least one floating input checked on some sample.
  for (const auto& [name, eval] : formula_evals())
    EXPECT_TRUE(ops_checked.count(name) || kNotFiniteDifferences.count(name))
        << name << ": no floating input of any sample was checked";
  EXPECT_GT(checked, 0);
  std::cout << "[          ] " << checked << " gradients of " << ops_checked.size()
            << " op rows checked against finite differences\n";
}

// The jvp formulas against the central difference (f(x + h t) - f(x - h t)) / 2h, every floating
// input moved along its tangent at once.
TEST(FormulasTable, EveryJvpMatchesFiniteDifferences) {
  std::set<std::string> ops_checked;
  for (const auto& [name, jvp] : formula_check::jvp_evals()) {
    OperatorHandle& op = Dispatcher::get().find_or_throw(name);
    int n = 0;
    for (const Stack& sample : samples_for(name)) {
      SCOPED_TRACE(name + " sample " + std::to_string(n++));
      Stack in = testing::to_float64(sample);
      std::vector<Tensor> outs = call(op, in);
      if (outs.empty() || !is_floating(outs[0].dtype())) continue;
      std::vector<Tensor> tangents;
      for (size_t k = 0; Tensor* x = tensor_at(in, k); ++k)
        tangents.push_back(is_floating(x->dtype())
                               ? testing::random(x->sizes(), kFloat64, -1, 1, 100 + static_cast<uint32_t>(k))
                               : zeros_like(*x));
      Tensor got = jvp(clone_stack(in), outs, tangents);
      ASSERT_EQ(got.sizes(), outs[0].sizes());
      auto moved = [&](double h) {
        Stack p = clone_stack(in);
        for (size_t k = 0; k < tangents.size(); ++k) {
          Tensor* x = tensor_at(p, k);
          if (is_floating(x->dtype())) *x = *x + tangents[k] * h;
        }
        return call(op, p)[0];
      };
      const double h = 1e-6;
      std::vector<double> want = testing::to_doubles((moved(h) - moved(-h)) / (2 * h));
      std::vector<double> g = testing::to_doubles(got);
      for (size_t i = 0; i < want.size(); ++i) {
        if (std::isnan(want[i])) continue;
        EXPECT_NEAR(g[i], want[i], 1e-5 * (1 + std::fabs(want[i]))) << "element " << i;
      }
      ops_checked.insert(name);
    }
  }
  for (const auto& [name, jvp] : formula_check::jvp_evals())
    EXPECT_TRUE(ops_checked.count(name)) << name << ": no sample with a floating output";
  std::cout << "[          ] jvp formulas of " << ops_checked.size()
            << " op rows checked against finite differences\n";
}

}  // namespace
}  // namespace kiln::autograd
