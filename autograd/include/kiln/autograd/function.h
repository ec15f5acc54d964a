// kiln/autograd/function.h: custom differentiable functions (PyTorch's torch::autograd::Function).
//
//   struct MulConst : kiln::autograd::Function<MulConst> {
//     static Tensor forward(AutogradContext* ctx, Tensor x, double c) {
//       ctx->saved_data["c"] = c;
//       ctx->save_for_backward({x});
//       return x * c;
//     }
//     static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
//       return {grad_outputs[0] * std::any_cast<double>(ctx->saved_data["c"]), Tensor()};
//     }
//   };
//   Tensor y = MulConst::apply(x, 2.0);        // y.grad_fn()->name() == "MulConstBackward"
//
// Note [Custom functions]: apply() runs forward with grad mode off, then (when grad mode is on and
// a Tensor argument requires grad) records a CppNode<T> whose edges are the Tensor arguments in
// order (a std::vector<Tensor> argument contributes one edge per element). backward() gets one
// gradient per forward output (zeros for outputs that got none) and returns one per Tensor
// argument in edge order (further entries must be undefined, e.g. for trailing non-Tensor
// arguments); entries for inputs that need no gradient are dropped.
// Outputs that are inputs returned unchanged are returned as new aliases carrying the history.
// An input that forward changed in place is marked with ctx->mark_dirty({x}) and returned: like
// an in-place op, it then is that output (same tensor, version bumped) and its history is
// rebased onto this node; the usual in-place checks apply (a leaf that requires grad is refused),
// and forward must return every tensor it marks dirty.
// The Python binding builds on the same CustomFunctionNode with a PyObject forward/backward.
#pragma once

#include <any>
#include <string>
#include <type_traits>
#include <unordered_map>
#include <unordered_set>

#include "kiln/autograd/grad_mode.h"
#include "kiln/autograd/node.h"

namespace kiln::autograd {

class AutogradContext {
 public:
  // Tensors backward needs; checked for in-place changes, freed after backward (unless retained).
  void save_for_backward(variable_list to_save);
  variable_list get_saved_variables() const;
  // Outputs that are not differentiable (an index tensor): they never require grad.
  void mark_non_differentiable(const variable_list& outputs);
  // Inputs that forward modified in place (and returns): their history moves onto this function
  // (Note [Custom functions]).
  void mark_dirty(const variable_list& inputs);
  // Whether the i-th Tensor argument (in edge order) needs a gradient.
  bool needs_input_grad(size_t i) const;
  // Anything else backward needs (non-tensor values).
  std::unordered_map<std::string, std::any> saved_data;

 private:
  friend class CustomFunctionNode;
  variable_list to_save_;
  std::vector<SavedVariable> saved_;
  std::unordered_set<const TensorImpl*> non_differentiable_;
  std::unordered_set<const TensorImpl*> dirty_;
  std::weak_ptr<Node> node_;
};

// The node of a custom function: holds the context and calls a backward callable.
class CustomFunctionNode : public Node {
 public:
  using Backward = std::function<variable_list(AutogradContext*, variable_list)>;
  CustomFunctionNode(std::string name, Backward backward)
      : name_(std::move(name)), backward_(std::move(backward)) {}
  const char* name() const override { return name_.c_str(); }
  variable_list apply(variable_list&& grads) override;
  void release_variables() override;
  AutogradContext& ctx() { return ctx_; }

  // apply()'s steps: edges from the inputs, then history on the outputs (returned, aliased
  // where an output is an input), then the saved tensors.
  void collect_inputs(const variable_list& inputs, bool is_executable);
  variable_list wrap_outputs(const variable_list& inputs, variable_list outputs, bool is_executable);

 private:
  std::string name_;
  Backward backward_;
  AutogradContext ctx_;
  size_t num_forward_inputs_ = 0;
};

namespace detail {
inline void flatten_tensors(variable_list&) {}
template <class A, class... Rest>
void flatten_tensors(variable_list& out, const A& a, const Rest&... rest) {
  using D = std::decay_t<A>;
  if constexpr (std::is_same_v<D, Tensor>) out.push_back(a);
  else if constexpr (std::is_same_v<D, variable_list>) out.insert(out.end(), a.begin(), a.end());
  flatten_tensors(out, rest...);
}
std::string demangled_type_name(const char* mangled);
bool any_requires_grad(const variable_list& ts);
}  // namespace detail

template <class T>
struct Function {
  template <class... Args>
  static auto apply(Args&&... args) {
    variable_list inputs;
    detail::flatten_tensors(inputs, args...);
    const bool is_executable = GradMode::is_enabled() && detail::any_requires_grad(inputs);
    auto node = std::make_shared<CustomFunctionNode>(
        detail::demangled_type_name(typeid(T).name()) + "Backward",
        [](AutogradContext* ctx, variable_list grads) { return T::backward(ctx, std::move(grads)); });
    node->collect_inputs(inputs, is_executable);
    using R = decltype(T::forward(&node->ctx(), std::forward<Args>(args)...));
    static_assert(std::is_same_v<R, Tensor> || std::is_same_v<R, variable_list>,
                  "forward must return a Tensor or a variable_list");
    R raw;
    {
      AutoGradMode no_grad(false);
      raw = T::forward(&node->ctx(), std::forward<Args>(args)...);
    }
    if constexpr (std::is_same_v<R, Tensor>) {
      return node->wrap_outputs(inputs, {raw}, is_executable)[0];
    } else {
      return node->wrap_outputs(inputs, std::move(raw), is_executable);
    }
  }
};

}  // namespace kiln::autograd
