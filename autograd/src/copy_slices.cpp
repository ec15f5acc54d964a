// Note [CopySlices] in copy_slices.h.
#include "copy_slices.h"

#include <algorithm>
#include <utility>
#include <vector>

#include "kiln/autograd/batched.h"
#include "kiln/autograd/formulas.h"
#include "kiln/autograd/forward_ad.h"
#include "kiln/autograd/grad_mode.h"
#include "kiln/generated/ops.h"
#include "kiln/operators.h"

namespace kiln::autograd {
namespace {

// One past the last storage element g reaches (its offset when it has no elements).
int64_t end_of(const StridedGeometry& g) {
  int64_t end = g.offset + 1;
  for (size_t i = 0; i < g.sizes.size(); ++i) {
    if (g.sizes[i] == 0) return g.offset;
    end += (g.sizes[i] - 1) * g.strides[i];
  }
  return end;
}

// The storage elements [lo, lo + n) that both geometries lie in.
struct Span {
  int64_t lo;
  int64_t n;
};
Span span_of(const StridedGeometry& a, const StridedGeometry& b) {
  const int64_t lo = std::min(a.offset, b.offset);
  return {lo, std::max(end_of(a), end_of(b)) - lo};
}

// g's elements in `buf`, a flat buffer standing for storage elements [lo, lo + buf.numel()).
Tensor in_buffer(const Tensor& buf, const StridedGeometry& g, int64_t lo) {
  return buf.as_strided(g.sizes, g.strides, g.offset - lo);
}

// Whether two elements of g share a storage element.
bool overlaps(const StridedGeometry& g) {
  std::vector<std::pair<int64_t, int64_t>> dims;  // (stride, size) of the dims of size > 1
  for (size_t i = 0; i < g.sizes.size(); ++i) {
    if (g.sizes[i] == 0) return false;
    if (g.sizes[i] > 1) dims.emplace_back(g.strides[i], g.sizes[i]);
  }
  std::sort(dims.begin(), dims.end());
  int64_t reach = 0;  // the largest offset the inner dims reach
  for (const auto& [stride, size] : dims) {
    if (stride <= reach) return true;
    reach += (size - 1) * stride;
  }
  return false;
}

bool is_dense(const StridedGeometry& g, const Span& s) {
  int64_t n = 1;
  for (int64_t size : g.sizes) n *= size;
  return g.offset == s.lo && n == s.n && !overlaps(g);
}

// Whether strided copies into a fresh buffer compute this backward: not when it is recorded
// (create_graph), batched (jacrev's vmap over cotangents: the buffer would hold one example) or
// carries tangents (forward-over-reverse: as_strided's tangent is not a view of its input's).
bool strided_copies_suffice(const Tensor& grad) {
  return !GradMode::is_enabled() && !is_batched(grad) && forward::current_level() == 0;
}

// Storage positions (relative to s.lo) of g's elements, flattened.
Tensor positions(const StridedGeometry& g, const Span& s, Device device) {
  return in_buffer(arange(0, s.n, 1, kInt64, device), g, s.lo).reshape({-1});
}

}  // namespace

StridedGeometry strided_geometry(const Tensor& t) {
  return {DimVector(t.sizes()), DimVector(t.strides()), t.storage_offset()};
}

CopySlices::CopySlices(const Tensor& base, const Tensor& view, std::shared_ptr<Node> fn,
                       size_t self_edge)
    : base_(strided_geometry(base)), view_(strided_geometry(view)), fn_(std::move(fn)),
      self_edge_(self_edge) {
  KILN_ASSERT(self_edge_ < fn_->num_outputs(), "CopySlices: fn has no edge ", self_edge_);
  mutable_next_edges() = fn_->next_edges();
  mutable_next_edges()[self_edge_] = gradient_edge(base);
}

variable_list CopySlices::apply(variable_list&& grads) {
  KILN_ASSERT(fn_->num_inputs() == 1, "CopySlices: ", fn_->name(), " has ", fn_->num_inputs(),
              " inputs");
  const Tensor& grad = grads[0];  // base_'s shape
  const Span s = span_of(base_, view_);
  const bool want_self = should_compute_output(self_edge_);
  variable_list res, out(num_outputs());
  if (strided_copies_suffice(grad)) {
    Tensor buf = is_dense(base_, s) ? empty({s.n}, grad.dtype(), grad.device())
                                    : zeros({s.n}, grad.dtype(), grad.device());
    Tensor result = in_buffer(buf, base_, s.lo);
    result.copy_(grad);
    Tensor slice = in_buffer(buf, view_, s.lo);
    res = fn_->apply({slice.clone()});  // fn may save its input: slice is written below
    if (want_self) {
      if (res[self_edge_].defined())
        slice.copy_(res[self_edge_]);
      else
        slice.zero_();
      out[self_edge_] = std::move(result);
    }
  } else {  // the same steps out of place
    const Tensor base_pos = positions(base_, s, grad.device());
    const Tensor view_pos = positions(view_, s, grad.device());
    Tensor flat =
        zeros({s.n}, grad.dtype(), grad.device()).scatter(0, base_pos, grad.reshape({-1}));
    res = fn_->apply({flat.gather(0, view_pos).reshape(view_.sizes)});
    if (want_self) {
      Tensor piece = res[self_edge_].defined()
                         ? res[self_edge_].reshape({-1})
                         : zeros({view_pos.numel()}, grad.dtype(), grad.device());
      out[self_edge_] = flat.scatter(0, view_pos, piece).gather(0, base_pos).reshape(base_.sizes);
    }
  }
  for (size_t i = 0; i < out.size() && i < res.size(); ++i)
    if (i != self_edge_ && should_compute_output(i)) out[i] = std::move(res[i]);
  return out;
}

variable_list AsStridedViewBackward::apply(variable_list&& grads) {
  const Tensor& grad = grads[0];  // view_'s shape
  variable_list out(1);
  if (!should_compute_output(0)) return out;
  if (!strided_copies_suffice(grad) || overlaps(view_) || overlaps(base_)) {
    out[0] = as_strided_backward_geometry(grad, base_.sizes, base_.strides, base_.offset,
                                          view_.sizes, view_.strides, view_.offset);
    return out;
  }
  const Span s = span_of(base_, view_);
  Tensor buf = zeros({s.n}, grad.dtype(), grad.device());
  in_buffer(buf, view_, s.lo).copy_(grad);
  out[0] = in_buffer(buf, base_, s.lo);
  return out;
}

std::shared_ptr<Node> copy_slices_writing(const Tensor& view) {
  const AutogradMeta* m = meta_of(view);
  const auto* bm = static_cast<const AutogradMeta*>(view.impl()->view_base()->autograd_meta());
  if (m == nullptr || bm == nullptr) return nullptr;
  const auto* cs = dynamic_cast<const CopySlices*>(bm->grad_fn_.get());
  if (cs == nullptr || cs->fn() != m->grad_fn_) return nullptr;
  return bm->grad_fn_;
}

std::shared_ptr<Node> view_of_copy_slices(const std::shared_ptr<Node>& copy_slices,
                                          const Tensor& view) {
  const auto& cs = static_cast<const CopySlices&>(*copy_slices);
  auto node = std::make_shared<AsStridedViewBackward>(cs.base_geometry(), strided_geometry(view));
  node->mutable_next_edges().push_back(Edge{copy_slices, 0});
  node->add_input_metadata(view);
  return node;
}

void regenerate_view_grad_fn(const Tensor& view, AutogradMeta& m) {
  Tensor base(view.impl()->view_base());
  m.attr_version_ = view.version();
  // A view recorded from a leaf that is itself a view of a tensor without history (a parameter
  // carved out of a plain buffer) keeps the history it was recorded with: the base's is empty.
  if (!base.requires_grad()) return;
  auto node = std::make_shared<AsStridedViewBackward>(strided_geometry(base),
                                                      strided_geometry(view));
  node->mutable_next_edges().push_back(gradient_edge(base));
  set_history(view, node);
}

void rebase_view_history(const Tensor& self, const std::shared_ptr<Node>& fn, size_t self_edge) {
  Tensor base(self.impl()->view_base());
  set_history(base, std::make_shared<CopySlices>(base, self, fn, self_edge));
  // self is fn's output until its next use: the op's saved result (SavedVariable, forward AD)
  // sees it; a version the counter has passed makes the next refresh_grad_fn() regenerate it.
  set_history(self, fn);
  materialize_meta(self).attr_version_ = self.version() - 1;
}

void check_inplace_view(const Tensor& self, const char* op) {
  const AutogradMeta* m = meta_of(self);
  const TensorImpl* base = self.impl()->view_base().get();
  const auto* bm = static_cast<const AutogradMeta*>(base->autograd_meta());
  constexpr const char* kLeafView =
      "a view of a leaf Variable that requires grad is being used in an in-place operation (";
  KILN_CHECK(m == nullptr || m->grad_fn_ != nullptr || !m->requires_grad_, Runtime,
             "a leaf Variable that requires grad is being used in an in-place operation (", op,
             ")");
  for (int64_t st : self.strides())
    KILN_CHECK(st >= 0, NotImplemented, op, ": an in-place operation through a view with "
               "negative strides ", self.strides(), " is not differentiable");
  if (bm != nullptr && bm->requires_grad()) {
    KILN_CHECK(bm->grad_fn_ != nullptr, Runtime, kLeafView, op, ")");
    KILN_CHECK(m != nullptr && m->grad_fn_ != nullptr, Runtime,
               "A view was created in no_grad mode and is being modified inplace with grad mode "
               "enabled (", op, "). Given that this use case is ambiguous and error-prone, it is "
               "forbidden. You can clarify your code by moving both the view and the inplace "
               "either both inside the no_grad block (if you don't want the inplace to be "
               "tracked) or both outside (if you want the inplace to be tracked).");
    return;
  }
  // Recorded, but from a view of the base that was made a leaf: a view of a leaf.
  KILN_CHECK(m == nullptr || m->grad_fn_ == nullptr, Runtime, kLeafView, op, ")");
  // The base gains a history: no other view of it may be left without one (Note [CopySlices]).
  const int sharing = self.impl()->storage().use_count() - 2;
  KILN_CHECK(sharing <= 0, NotImplemented, op,
             ": an in-place operation that makes the base of a view require grad (a view of shape ",
             self.sizes(), " of a tensor of shape ", base->sizes(),
             ") is not supported while other tensors share their storage (", sharing,
             " more: other views, or a detached alias), because those would not see the base's "
             "new history; make the write before taking other views, or clone the base");
}

}  // namespace kiln::autograd
