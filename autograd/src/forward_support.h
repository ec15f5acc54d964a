// Private forward-AD helpers (Note [Forward AD] in kiln/autograd/forward_ad.h) for the generated
// Autograd kernels, SavedVariable and the func transforms.
#pragma once

#include <vector>

#include "kiln/autograd/forward_ad.h"
#include "kiln/autograd/grad_mode.h"
#include "kiln/autograd/node.h"

namespace kiln::autograd::forward::detail {

// The tangent of `t` at the active level; undefined when it has none (or t is undefined).
inline Tensor tangent_of(const Tensor& t) {
  if (!t.defined()) return Tensor();
  AutogradMeta* m = meta_of(t);
  if (m == nullptr || !m->fw_grad_.defined()) return Tensor();
  if (m->fw_level_ != autograd::detail::autograd_tls().fw_level) return Tensor();
  return m->fw_grad_;
}
inline bool has_tangent(const Tensor& t) { return tangent_of(t).defined(); }
inline bool has_tangent(const std::optional<Tensor>& t) { return t && has_tangent(*t); }
inline bool has_tangent(TensorList ts) {
  for (const Tensor& t : ts)
    if (has_tangent(t)) return true;
  return false;
}

// Gives `t` the tangent `tangent` at the active level (replacing any), and the Autograd key.
void set_tangent(const Tensor& t, const Tensor& tangent);
// dst gets src's tangent, if src has one (a saved output, an unpacked saved output).
inline void copy_tangent(const Tensor& src, const Tensor& dst) {
  AutogradMeta* m = meta_of(src);
  if (m == nullptr || !m->fw_grad_.defined()) return;
  if (Tensor t = tangent_of(src); t.defined()) set_tangent(dst, t);
}
// AutogradMeta's destructor: the meta leaves the level's list of tangents.
void forget_tangent(AutogradMeta* m);

// Forward AD off for its lifetime (tangent formulas run under it: no tangents of tangents).
class ForwardADDisabledGuard {
 public:
  ForwardADDisabledGuard() {
    auto& s = autograd::detail::autograd_tls();
    ++s.fw_disabled;
    s.refresh();
  }
  ~ForwardADDisabledGuard() {
    auto& s = autograd::detail::autograd_tls();
    --s.fw_disabled;
    s.refresh();
  }
  ForwardADDisabledGuard(const ForwardADDisabledGuard&) = delete;
  ForwardADDisabledGuard& operator=(const ForwardADDisabledGuard&) = delete;
};

}  // namespace kiln::autograd::forward::detail
