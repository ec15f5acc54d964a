// Tensor's autograd methods (requires_grad_, grad, backward, ...): kiln_autograd's side of
// kiln/autograd_hooks.h, registered when the library loads.
#include "kiln/autograd_hooks.h"
#include "kiln/autograd/batched.h"
#include "kiln/autograd/engine.h"
#include "kiln/autograd/grad_mode.h"

namespace kiln::autograd {
namespace {

// t's meta with a current grad_fn (Note [CopySlices] in copy_slices.h).
AutogradMeta& fresh_meta(const Tensor& t) {
  AutogradMeta& m = materialize_meta(t);
  refresh_grad_fn(t, m);
  return m;
}

class Hooks final : public AutogradHooks {
 public:
  void set_requires_grad(const Tensor& t, bool requires_grad) const override {
    if (is_batched(t)) {  // autograd records the plain value (Note [vmap and autograd])
      to_physical(t).base.requires_grad_(requires_grad);
      return;
    }
    KILN_CHECK(!requires_grad || !t.is_inference() || InferenceModeGuard::is_enabled(), Runtime,
               "Setting requires_grad=True on inference tensor outside InferenceMode is not allowed.");
    KILN_CHECK(!requires_grad || is_floating(t.dtype()), Runtime,
               "only Tensors of floating point dtype can require gradients (got ",
               scalar_type_name(t.dtype()), ")");
    AutogradMeta& m = materialize_meta(t);
    if (m.grad_fn_) {
      KILN_CHECK(requires_grad, Runtime,
                 "you can only change requires_grad flags of leaf variables. If you want to use a "
                 "computed variable in a subgraph that doesn't require differentiation use "
                 "var_no_grad = var.detach().");
      return;
    }
    m.requires_grad_ = requires_grad;
    if (requires_grad) t.impl()->add_keys(DispatchKey::Autograd);
    else if (!m.fw_grad_.defined()) t.impl()->remove_keys(DispatchKey::Autograd);  // duals keep it
  }
  Tensor grad(const Tensor& t) const override { return meta_of(t)->grad_; }
  void set_grad(const Tensor& t, const Tensor& g) const override {
    if (g.defined()) {
      KILN_CHECK(g.sizes() == t.sizes(), Runtime, "assigned grad has data of a different size (",
                 g.sizes(), " vs the tensor's ", t.sizes(), ")");
    }
    materialize_meta(t).grad_ = g;
  }
  std::shared_ptr<Node> grad_fn(const Tensor& t) const override { return fresh_meta(t).grad_fn_; }
  bool is_leaf(const Tensor& t) const override { return meta_of(t)->grad_fn_ == nullptr; }
  int64_t output_nr(const Tensor& t) const override { return fresh_meta(t).output_nr_; }
  void backward(const Tensor& t, const Tensor& gradient, std::optional<bool> retain_graph,
                bool create_graph) const override {
    autograd::backward({t}, gradient.defined() ? variable_list{gradient} : variable_list{},
                       retain_graph, create_graph);
  }
  void retain_grad(const Tensor& t) const override {
    KILN_CHECK(t.requires_grad(), Runtime, "can't retain_grad on Tensor that has requires_grad=False");
    AutogradMeta& m = fresh_meta(t);
    if (!m.grad_fn_ || m.retains_grad_) return;  // leaves keep .grad anyway
    m.retains_grad_ = true;
    m.grad_fn_->retained_grads().emplace_back(m.output_nr_, &m);
  }
  bool retains_grad(const Tensor& t) const override { return meta_of(t)->retains_grad_; }
};

const Hooks kHooks;
const int kRegistered = [] {
  set_autograd_hooks(&kHooks);
  return 0;
}();

}  // namespace
}  // namespace kiln::autograd
