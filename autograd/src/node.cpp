#include "kiln/autograd/node.h"

#include <algorithm>
#include <atomic>
#include <sstream>

#include "copy_slices.h"
#include "kiln/autograd/anomaly.h"
#include "kiln/autograd/grad_mode.h"
#include "forward_support.h"
#include "kiln/generated/ops.h"
#include "kiln/operators.h"

namespace kiln::autograd {
namespace {
thread_local uint64_t tls_sequence_nr = 0;

std::string describe(const Tensor& t) {
  std::ostringstream os;
  os << "[" << scalar_type_name(t.dtype()) << " " << t.sizes() << "]";
  return os.str();
}
}  // namespace

Node::Node() : sequence_nr_(tls_sequence_nr++) {
  if (AnomalyMode::is_enabled()) creation_stack_ = std::make_shared<const std::string>(current_backtrace());
}

const std::string& Node::creation_stack() const {
  static const std::string kEmpty;
  return creation_stack_ ? *creation_stack_ : kEmpty;
}

void HookTable::remove(uint64_t id) {
  auto drop = [id](auto& v) {
    v.erase(std::remove_if(v.begin(), v.end(), [id](const auto& e) {
              if constexpr (requires { e.id; }) return e.id == id;
              else return e.first == id;
            }),
            v.end());
  };
  drop(tensor_pre);
  drop(pre);
  drop(post);
  drop(post_acc);
}

uint64_t HookTable::next_id() {
  static std::atomic<uint64_t> next{1};
  return next.fetch_add(1, std::memory_order_relaxed);
}

void RemovableHandle::remove() {
  if (auto t = table_.lock()) t->remove(id_);
  table_.reset();
}

HookTable& Node::hook_table() {
  if (!hooks_) hooks_ = std::make_shared<HookTable>();
  return *hooks_;
}

RemovableHandle Node::register_prehook(NodePreHook fn) {
  uint64_t id = HookTable::next_id();
  hook_table().pre.emplace_back(id, std::move(fn));
  return RemovableHandle(hooks_, id);
}

RemovableHandle Node::register_hook(NodePostHook fn) {
  uint64_t id = HookTable::next_id();
  hook_table().post.emplace_back(id, std::move(fn));
  return RemovableHandle(hooks_, id);
}

RemovableHandle Node::add_tensor_pre_hook(uint32_t input_nr, TensorHook fn) {
  uint64_t id = HookTable::next_id();
  hook_table().tensor_pre.push_back(HookTable::TensorPre{id, input_nr, std::move(fn)});
  return RemovableHandle(hooks_, id);
}

HookTable* AccumulateGrad::leaf_hooks() const {
  AutogradMeta* m = meta_of(variable_);
  return m != nullptr ? m->leaf_hooks_.get() : nullptr;
}

namespace {
HookTable& leaf_table(AutogradMeta& m) {
  if (!m.leaf_hooks_) m.leaf_hooks_ = std::make_shared<HookTable>();
  return *m.leaf_hooks_;
}
}  // namespace

RemovableHandle register_hook(const Tensor& t, TensorHook fn) {
  t.check_defined("register_hook()");
  KILN_CHECK(t.requires_grad(), Runtime,
             "cannot register a hook on a tensor that doesn't require gradient");
  AutogradMeta& m = materialize_meta(t);
  refresh_grad_fn(t, m);
  if (m.grad_fn_) return m.grad_fn_->add_tensor_pre_hook(m.output_nr_, std::move(fn));
  uint64_t id = HookTable::next_id();
  leaf_table(m).tensor_pre.push_back(HookTable::TensorPre{id, 0, std::move(fn)});
  return RemovableHandle(m.leaf_hooks_, id);
}

RemovableHandle register_post_accumulate_grad_hook(const Tensor& t, PostAccumulateGradHook fn) {
  t.check_defined("register_post_accumulate_grad_hook()");
  KILN_CHECK(t.requires_grad(), Runtime,
             "cannot register a hook on a tensor that doesn't require gradient");
  AutogradMeta& m = materialize_meta(t);
  KILN_CHECK(m.grad_fn_ == nullptr, Runtime,
             "post accumulate grad hooks cannot be registered on non-leaf tensors");
  uint64_t id = HookTable::next_id();
  leaf_table(m).post_acc.emplace_back(id, std::move(fn));
  return RemovableHandle(m.leaf_hooks_, id);
}

Node::~Node() {
  std::vector<std::shared_ptr<Node>> stack;
  for (Edge& e : next_edges_)
    if (e.fn) stack.push_back(std::move(e.fn));
  while (!stack.empty()) {
    std::shared_ptr<Node> n = std::move(stack.back());
    stack.pop_back();
    if (n.use_count() == 1) {  // we hold the last reference: take its edges before it dies
      for (Edge& e : n->next_edges_)
        if (e.fn) stack.push_back(std::move(e.fn));
    }
  }
}

uint32_t Node::add_input_metadata(const Tensor& t) {
  const BackendHandle* h = t.impl()->backend_handle();
  input_metadata_.push_back(InputMetadata{DimVector(t.sizes()), t.dtype(), t.device(),
                                          h ? h->zeros_maker() : nullptr});
  return static_cast<uint32_t>(input_metadata_.size() - 1);
}

AccumulateGrad::AccumulateGrad(Tensor variable) : variable_(std::move(variable)) {
  add_input_metadata(variable_);
}

variable_list AccumulateGrad::apply(variable_list&& grads) {
  Tensor g = std::move(grads[0]);
  if (!g.defined()) return {};
  AutogradMeta& m = materialize_meta(variable_);
  if (GradMode::is_enabled()) {  // create_graph: .grad keeps its history
    m.grad_ = m.grad_.defined() ? m.grad_ + g : g;
  } else if (!m.grad_.defined()) {
    // Keep g itself when nothing else can see it (PyTorch steals it the same way); otherwise a
    // copy, so .grad never aliases a gradient another leaf or the caller also holds.
    bool sole = g.impl_ptr().use_count() == 1 && owns_storage(g) && g.is_contiguous() &&
                meta_of(g) == nullptr;
    m.grad_ = sole ? std::move(g) : g.detach().clone();
  } else if (m.grad_.requires_grad()) {
    m.grad_ = m.grad_.detach() + g;
  } else {
    m.grad_.add_(g);
  }
  if (m.leaf_hooks_ && !m.leaf_hooks_->post_acc.empty()) {
    auto hooks = m.leaf_hooks_->post_acc;  // a hook may remove itself
    for (auto& [id, fn] : hooks) fn(variable_);
  }
  return {};
}

variable_list NotImplementedBackward::apply(variable_list&&) {
  KILN_FAIL(NotImplemented, "derivative of ", op_, " is not implemented yet (", name_, ")");
}

AutogradMeta::~AutogradMeta() {
  if (fw_grad_.defined()) forward::detail::forget_tangent(this);
  if (retains_grad_ && grad_fn_) {
    auto& v = grad_fn_->retained_grads();
    v.erase(std::remove_if(v.begin(), v.end(), [this](const auto& p) { return p.second == this; }),
            v.end());
  }
}

AutogradMeta& materialize_meta(const Tensor& t) {
  TensorImpl* impl = t.impl();
  if (impl->autograd_meta() == nullptr) impl->set_autograd_meta(std::make_unique<AutogradMeta>());
  return *static_cast<AutogradMeta*>(impl->autograd_meta());
}

Edge gradient_edge(const Tensor& t) {
  AutogradMeta* m = t.defined() ? meta_of(t) : nullptr;
  if (m == nullptr) return {};
  if (m->grad_fn_) {
    refresh_grad_fn(t, *m);
    return Edge{m->grad_fn_, m->output_nr_};
  }
  if (!m->requires_grad_) return {};
  std::shared_ptr<Node> acc = m->grad_accumulator_.lock();
  if (!acc) {
    acc = std::make_shared<AccumulateGrad>(t);
    m->grad_accumulator_ = acc;
  }
  return Edge{acc, 0};
}

void set_history(const Tensor& t, const std::shared_ptr<Node>& fn) {
  AutogradMeta& m = materialize_meta(t);
  if (m.retains_grad_ && m.grad_fn_) {  // an in-place op rebases t: move its retain_grad entry
    auto& v = m.grad_fn_->retained_grads();
    v.erase(std::remove_if(v.begin(), v.end(), [&m](const auto& p) { return p.second == &m; }),
            v.end());
  }
  m.grad_fn_ = fn;
  m.output_nr_ = fn->add_input_metadata(t);
  if (m.retains_grad_) fn->retained_grads().emplace_back(m.output_nr_, &m);
  t.impl()->add_keys(DispatchKey::Autograd);
}

void set_view_base(const Tensor& view, const Tensor& self) {
  // A backend whose view kernel left the base unrecorded (Note [View bases]): autograd needs it.
  if (!view.impl()->view_base() && view.is_alias_of(self))
    view.impl()->set_view_of(self.impl_ptr());
  materialize_meta(view).attr_version_ = view.version();
}

void collect_edge(Node& fn, const Tensor& t) { fn.mutable_next_edges().push_back(gradient_edge(t)); }
void collect_edge(Node& fn, const std::optional<Tensor>& t) {
  fn.mutable_next_edges().push_back(t ? gradient_edge(*t) : Edge{});
}
void collect_edge(Node& fn, TensorList ts) {
  for (const Tensor& t : ts) fn.mutable_next_edges().push_back(gradient_edge(t));
}

SavedVariable::SavedVariable(const Tensor& t, bool is_output, uint32_t version_offset) {
  if (!t.defined()) return;
  KILN_CHECK(!t.is_inference(), Runtime,
             "Inference tensors cannot be saved for backward. To work around it, make a clone to "
             "get a normal tensor and use it in autograd (the tensor ", describe(t),
             " was created under InferenceModeGuard)");
  was_defined_ = true;
  is_output_ = is_output;
  version_ = t.version() + version_offset;
  if (is_output) {
    data_ = t.detach();  // Note [Graph ownership]: no reference back to the node saving it
    forward::detail::copy_tangent(t, data_);  // forward-over-reverse needs the output's tangent
    AutogradMeta* m = meta_of(t);
    output_requires_grad_ = m != nullptr && m->grad_fn_ != nullptr;
    output_nr_ = m != nullptr ? m->output_nr_ : 0;
    if (output_requires_grad_ && t.impl()->view_base()) [[unlikely]] {
      if (std::shared_ptr<Node> cs = copy_slices_writing(t))
        view_ = std::make_unique<ViewHistory>(ViewHistory{nullptr, cs});
    }
  } else if (const TensorImpl* base = t.impl()->view_base().get()) [[unlikely]] {
    AutogradMeta* m = meta_of(t);
    const auto* bm = static_cast<const AutogradMeta*>(base->autograd_meta());
    if (m == nullptr || m->grad_fn_ == nullptr || bm == nullptr || bm->grad_fn_ == nullptr) {
      data_ = t;  // not recorded, or a view of a leaf: its base cannot be rebased
      return;
    }
    refresh_grad_fn(t, *m);
    data_ = t.detach();
    forward::detail::copy_tangent(t, data_);
    view_ = std::make_unique<ViewHistory>(ViewHistory{m->grad_fn_, {}});
    output_nr_ = m->output_nr_;
  } else {
    data_ = t;
  }
}

SavedVariable SavedVariable::before_inplace(const Tensor& clone) {
  SavedVariable sv(clone, false);
  sv.before_inplace_ = true;
  return sv;
}

Tensor SavedVariable::unpack(Node& owner, const char* arg) const {
  if (!was_defined_) return Tensor();
  KILN_CHECK(!released_, Runtime,
             "Trying to backward through the graph a second time (or directly access saved tensors "
             "after they have already been freed). Saved intermediate values of the graph are freed "
             "when you call .backward() or autograd.grad(). Specify retain_graph=True if you need to "
             "backward through the graph a second time or if you need to access saved tensors after "
             "calling backward. (", owner.name(), " needed '", arg, "')");
  KILN_CHECK(data_.version() == version_, Runtime,
             "one of the variables needed for gradient computation has been modified by an inplace "
             "operation: ", describe(data_), ", which is '", arg, "' saved by ", owner.name(),
             ", is at version ", data_.version(), "; expected version ", version_, " instead.");
  if (!GradMode::is_enabled()) return data_;
  if (view_ && view_->grad_fn) {  // create_graph: a saved view again has its history
    Tensor r = data_.detach();
    AutogradMeta& m = materialize_meta(r);
    m.grad_fn_ = view_->grad_fn;
    m.output_nr_ = output_nr_;
    r.impl()->add_keys(DispatchKey::Autograd);
    forward::detail::copy_tangent(data_, r);
    return r;
  }
  if (before_inplace_) {  // create_graph: the value before the op, with its history then
    if (owner.num_outputs() == 0 || !owner.next_edge(0).valid()) return data_;
    Tensor r = data_.detach();
    AutogradMeta& m = materialize_meta(r);
    m.grad_fn_ = owner.next_edge(0).fn;
    m.output_nr_ = owner.next_edge(0).input_nr;
    r.impl()->add_keys(DispatchKey::Autograd);
    forward::detail::copy_tangent(data_, r);
    return r;
  }
  if (!is_output_ || !output_requires_grad_) return data_;
  // create_graph: the saved output is again the output of its node (for grad of grad); written
  // through a view, the output of a view of its base's CopySlices (Note [CopySlices]).
  Tensor r = data_.detach();
  AutogradMeta& m = materialize_meta(r);
  if (view_) {
    std::shared_ptr<Node> cs = view_->copy_slices.lock();  // alive while it runs its fn, owner
    KILN_CHECK(cs != nullptr, Runtime, "'", arg, "' saved by ", owner.name(),
               " was written through a view whose base's history is gone; it can only be "
               "unpacked in a backward pass through that base");
    m.grad_fn_ = view_of_copy_slices(cs, r);
    m.output_nr_ = 0;
  } else {
    m.grad_fn_ = owner.shared_from_this();
    m.output_nr_ = output_nr_;
  }
  r.impl()->add_keys(DispatchKey::Autograd);
  forward::detail::copy_tangent(data_, r);
  return r;
}

void SavedVariable::reset() {
  if (!was_defined_) return;
  data_ = Tensor();
  view_.reset();
  released_ = true;
}

}  // namespace kiln::autograd
