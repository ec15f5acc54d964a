// What the generated Autograd kernels call to propagate tangents (Note [Forward AD] in
// kiln/autograd/forward_ad.h, Note [Derived jvp] in autograd_support.h).
#include "autograd_support.h"
#include "kiln/autograd/engine.h"

namespace kiln::autograd {
namespace {

// The node every forward_edge() points at: only its validity matters.
class ForwardSink final : public Node {
 public:
  const char* name() const override { return "ForwardSink"; }
  variable_list apply(variable_list&&) override {
    KILN_FAIL(Runtime, "internal: a jvp node's edge was followed by the engine");
  }
};

// True when `t` may share memory with a tensor other than the one it is about to become the
// tangent of (another tensor's tangent, an input's view).
bool maybe_aliased(const Tensor& t) {
  return t.impl_ptr().use_count() > 1 || t.impl()->storage().use_count() > 1;
}

// The tangent an in-place op on the view `self` (which has none) writes: the same view of its
// base's tangent, the base getting a zero one laid out like it when it has none (PyTorch's
// behaviour). Other views of a base without a tangent would not see it: refused, as for
// reverse mode (Note [CopySlices] in copy_slices.h).
Tensor view_of_base_tangent(const Tensor& self, const char* op) {
  Tensor base(self.impl()->view_base());
  Tensor bt = tangent_of(base);
  if (!bt.defined()) {
    KILN_CHECK(self.impl()->storage()->use_count() <= 2, NotImplemented, op,
               ": forward-mode AD: an in-place operation that gives a tangent to a view (shape ",
               self.sizes(), ") of a tensor without one (shape ", base.sizes(),
               ") is not supported while other tensors share their storage (other views, or a "
               "detached alias), because those would not see the base's tangent; make the base a "
               "dual tensor first");
    bt = empty_strided_on(base.sizes(), base.strides(), base.dtype(), base.device());
    bt.zero_();
    forward::detail::set_tangent(base, bt);
  }
  KILN_CHECK(bt.strides() == base.strides(), NotImplemented, op,
             ": forward-mode AD: an in-place operation on a view (shape ", self.sizes(),
             ") that has no tangent, of a tensor whose tangent is laid out unlike it (strides ",
             bt.strides(), " against ", base.strides(), "); take the view after making the dual");
  Tensor vt = bt.as_strided(self.sizes(), self.strides(),
                            bt.storage_offset() + self.storage_offset() - base.storage_offset());
  forward::detail::set_tangent(self, vt);
  return vt;
}

}  // namespace

Tensor clone_for_jvp(const Tensor& self) {
  ForwardADDisabledGuard off;
  return self.clone();
}

Tensor tangent_or_zeros(const Tensor& tangent, const Tensor& x) {
  if (tangent.defined()) return tangent;
  return kiln::zeros_like(x);
}

std::vector<Tensor> tangents_or_zeros(const std::vector<Tensor>& tangents, TensorList xs) {
  std::vector<Tensor> r;
  r.reserve(xs.size());
  for (size_t i = 0; i < xs.size(); ++i) r.push_back(tangent_or_zeros(tangents[i], xs[i]));
  return r;
}

void set_output_tangent(const Tensor& out, Tensor t, const char* op) {
  if (!out.defined() || !is_floating(out.dtype())) return;
  KILN_CHECK(t.defined(), Runtime, op, ": its jvp gave no tangent for an output of shape ",
             out.sizes());
  KILN_CHECK(t.sizes() == out.sizes(), Runtime, op, ": its jvp gave a tangent of shape ", t.sizes(),
             " for an output of shape ", out.sizes());
  if (t.dtype() != out.dtype())
    t = t.to(out.dtype());
  else if (maybe_aliased(t))
    t = t.clone();
  forward::detail::set_tangent(out, t);
}

void set_inplace_tangent(const Tensor& self, Tensor t, const char* op) {
  if (!is_floating(self.dtype())) return;
  KILN_CHECK(t.defined() && t.sizes() == self.sizes(), Runtime, op,
             ": its jvp gave a tangent of shape ", t.defined() ? t.sizes() : IntArrayRef{},
             " for self of shape ", self.sizes());
  Tensor old = tangent_of(self);
  if (self.impl()->view_base()) [[unlikely]] {
    // A view's tangent is the same view of its base's tangent: written in place, so the base's
    // tangent changes with it (recorded, through CopySlices, when either requires grad).
    if (!old.defined()) {
      old = view_of_base_tangent(self, op);
    } else {
      KILN_CHECK(old.impl()->view_base() || !has_tangent(Tensor(self.impl()->view_base())),
                 NotImplemented, op, ": forward-mode AD: an in-place operation through a view "
                 "(shape ", self.sizes(), ") whose tangent is not a view of its base's tangent "
                 "(an as_strided view) would not change the base's tangent");
    }
    if (old.impl()->view_base() || (!old.requires_grad() && !t.requires_grad())) {
      old.copy_(t);
      return;
    }
  }
  // A tangent that requires grad is not written in place (it may be a leaf): replaced instead.
  if (old.defined() && !old.requires_grad() && !t.requires_grad()) {
    NoGradGuard ng;
    old.copy_(t);
    return;
  }
  if (t.dtype() != self.dtype())
    t = t.to(self.dtype());
  else if (maybe_aliased(t))
    t = t.clone();
  forward::detail::set_tangent(self, t);
}

void fail_out_variant_tangent(const char* op) {
  KILN_FAIL(Runtime, op,
            "(): functions with out=... arguments don't support forward-mode "
            "automatic differentiation, but one of the arguments has a tangent");
}

Edge forward_edge(const Tensor& tangent) {
  static const std::shared_ptr<Node> sink = std::make_shared<ForwardSink>();
  if (!tangent.defined()) return Edge{};
  return Edge{sink, 0};
}

std::vector<Tensor> derived_jvp(Node& node, const std::vector<Tensor>& outputs,
                                const std::vector<Tensor>& tangents, bool record) {
  KILN_CHECK(tangents.size() == node.num_outputs(), Runtime, "internal: ", node.name(), " got ",
             tangents.size(), " tangents for ", node.num_outputs(), " inputs");
  const bool create = GradMode::is_enabled() && record;
  EnableGradGuard grad_on;  // g = J^T u must be recorded as a function of u
  variable_list us(outputs.size()), grads(outputs.size());
  std::vector<Tensor> wrt;
  for (size_t i = 0; i < outputs.size(); ++i) {
    const Tensor& o = outputs[i];
    if (!o.defined()) continue;
    if (!is_floating(o.dtype())) {  // as the engine does for an output that got no gradient
      grads[i] = kiln::zeros(o.sizes(), o.dtype(), o.device());
      continue;
    }
    us[i] = kiln::zeros(o.sizes(), o.dtype(), o.device());
    us[i].requires_grad_();
    grads[i] = us[i];
    wrt.push_back(us[i]);
  }
  variable_list gs = node.apply(std::move(grads));
  variable_list roots, root_grads;
  for (size_t k = 0; k < gs.size() && k < tangents.size(); ++k) {
    if (!gs[k].defined() || !tangents[k].defined() || !gs[k].requires_grad()) continue;
    roots.push_back(gs[k]);
    root_grads.push_back(tangents[k].dtype() == gs[k].dtype() ? tangents[k]
                                                              : tangents[k].to(gs[k].dtype()));
  }
  variable_list jv;
  if (!roots.empty() && !wrt.empty())
    jv = autograd::grad(roots, wrt, root_grads, /*retain_graph=*/false, create,
                        /*allow_unused=*/true);
  std::vector<Tensor> out(outputs.size());
  size_t w = 0;
  AutoGradMode mode(create);
  for (size_t i = 0; i < outputs.size(); ++i) {
    if (!us[i].defined()) continue;
    Tensor t = w < jv.size() ? jv[w] : Tensor();
    ++w;
    out[i] = t.defined() ? t : kiln::zeros_like(outputs[i]).detach();
  }
  return out;
}

}  // namespace kiln::autograd
