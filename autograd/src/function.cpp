// Note [Custom functions] in function.h.
#include "kiln/autograd/function.h"

#include <cxxabi.h>

#include <cstdlib>
#include <unordered_map>

#include "autograd_support.h"
#include "forward_support.h"

namespace kiln::autograd {

void AutogradContext::save_for_backward(variable_list to_save) { to_save_ = std::move(to_save); }

variable_list AutogradContext::get_saved_variables() const {
  std::shared_ptr<Node> node = node_.lock();
  if (!node) return to_save_;  // not recorded (grad mode off or no input requires grad)
  variable_list out;
  out.reserve(saved_.size());
  for (const SavedVariable& sv : saved_) out.push_back(sv.unpack(*node, "saved tensor"));
  return out;
}

void AutogradContext::mark_non_differentiable(const variable_list& outputs) {
  for (const Tensor& t : outputs)
    if (t.defined()) non_differentiable_.insert(t.impl());
}

void AutogradContext::mark_dirty(const variable_list& inputs) {
  for (const Tensor& t : inputs)
    if (t.defined()) dirty_.insert(t.impl());
}

bool AutogradContext::needs_input_grad(size_t i) const {
  std::shared_ptr<Node> node = node_.lock();
  return node && i < node->num_outputs() && node->next_edge(i).valid();
}

void CustomFunctionNode::collect_inputs(const variable_list& inputs, bool is_executable) {
  num_forward_inputs_ = inputs.size();
  if (!is_executable) return;
  ctx_.node_ = weak_from_this();
  for (const Tensor& t : inputs) collect_edge(*this, t);
}

variable_list CustomFunctionNode::wrap_outputs(const variable_list& inputs, variable_list outputs,
                                               bool is_executable) {
  std::unordered_map<const TensorImpl*, size_t> raw;  // forward's output -> its index
  for (size_t i = 0; i < outputs.size(); ++i)
    if (outputs[i].defined()) raw.emplace(outputs[i].impl(), i);
  for (const TensorImpl* d : ctx_.dirty_) {
    bool is_input = false;
    for (const Tensor& in : inputs) is_input = is_input || (in.defined() && in.impl() == d);
    KILN_CHECK(is_input, Value, name(), ": mark_dirty() was given a tensor that is not an input of "
               "forward");
    KILN_CHECK(raw.count(d) != 0, Value, name(), ": an input marked dirty with mark_dirty() was not "
               "returned by forward; a function must return the tensors it modifies in place");
  }
  if (!is_executable) {
    ctx_.non_differentiable_.clear();
    ctx_.dirty_.clear();
    return outputs;
  }
  std::shared_ptr<Node> self = shared_from_this();
  const variable_list raw_outputs = outputs;
  for (size_t i = 0; i < outputs.size(); ++i) {
    Tensor& o = outputs[i];
    KILN_CHECK(o.defined(), Runtime, name(), ": forward returned an undefined tensor at index ", i);
    size_t input_nr = inputs.size();  // which input o is, if any
    for (size_t k = 0; k < inputs.size() && input_nr == inputs.size(); ++k)
      if (inputs[k].defined() && inputs[k].impl() == o.impl()) input_nr = k;
    const bool dirty = ctx_.dirty_.count(o.impl()) != 0;
    if (dirty) {
      check_inplace(o, name());  // rebased in place, like an in-place op's self
      KILN_CHECK(!o.impl()->view_base() || outputs.size() == 1, Runtime, name(),
                 ": Functions which modify views in-place must return a single Variable (it "
                 "returned ", outputs.size(), ")");
    } else if (input_nr < inputs.size()) {  // the input keeps its own history; the alias gets ours
      Tensor alias = o.detach();
      forward::detail::copy_tangent(o, alias);
      o = std::move(alias);
    }
    if (ctx_.non_differentiable_.count(raw_outputs[i].impl()) || !is_floating(o.dtype())) {
      add_input_metadata(o);
    } else if (dirty) {
      rebase_history(o, self, input_nr);  // a view's base gets the history (Note [CopySlices])
    } else {
      set_history(o, self);
    }
  }
  for (const Tensor& t : ctx_.to_save_) {
    if (!t.defined()) {
      ctx_.saved_.emplace_back();
      continue;
    }
    auto it = raw.find(t.impl());
    bool is_input = false;
    for (const Tensor& in : inputs) is_input = is_input || (in.defined() && in.impl() == t.impl());
    if (it != raw.end() && (!is_input || ctx_.dirty_.count(t.impl())))
      ctx_.saved_.emplace_back(outputs[it->second], true);  // an output: saved without a cycle
    else ctx_.saved_.emplace_back(t, false);
  }
  ctx_.to_save_.clear();
  ctx_.non_differentiable_.clear();
  ctx_.dirty_.clear();
  return outputs;
}

variable_list CustomFunctionNode::apply(variable_list&& grads) {
  variable_list out = backward_(&ctx_, std::move(grads));
  KILN_CHECK(out.size() >= num_forward_inputs_, Runtime, "function ", name_,
             " returned an incorrect number of gradients (expected ", num_forward_inputs_, ", got ",
             out.size(), ")");
  for (size_t i = num_forward_inputs_; i < out.size(); ++i)
    KILN_CHECK(!out[i].defined(), Runtime, "function ", name_,
               " returned an incorrect number of gradients (expected ", num_forward_inputs_,
               ", got ", out.size(), "): the extra ones must be undefined");
  out.resize(num_forward_inputs_);
  for (size_t i = 0; i < out.size(); ++i)
    if (!should_compute_output(i)) out[i] = Tensor();
  return out;
}

void CustomFunctionNode::release_variables() {
  for (SavedVariable& sv : ctx_.saved_) sv.reset();
}

namespace detail {
std::string demangled_type_name(const char* mangled) {
  int status = 0;
  char* d = abi::__cxa_demangle(mangled, nullptr, nullptr, &status);
  std::string s = (status == 0 && d != nullptr) ? d : mangled;
  std::free(d);
  size_t colon = s.rfind("::");  // "(anonymous namespace)::MulConst" -> "MulConst"
  return colon == std::string::npos ? s : s.substr(colon + 2);
}

bool any_requires_grad(const variable_list& ts) {
  for (const Tensor& t : ts)
    if (t.defined() && t.requires_grad()) return true;
  return false;
}
}  // namespace detail

}  // namespace kiln::autograd
