// Gradient clipping (kiln/optim/clip_grad.h), with PyTorch's formulas, under no_grad.
#include "kiln/optim/clip_grad.h"

#include <cmath>

#include "kiln/autograd/grad_mode.h"
#include "kiln/kiln.h"

namespace kiln::optim {
namespace {

std::vector<Tensor> grads_of(const std::vector<Tensor>& params) {
  std::vector<Tensor> out;
  for (const Tensor& p : params) {
    Tensor g = p.grad();
    if (g.defined()) out.push_back(g);
  }
  return out;
}

}  // namespace

Tensor clip_grad_norm_(const std::vector<Tensor>& params, double max_norm, double norm_type,
                       bool error_if_nonfinite) {
  autograd::NoGradGuard no_grad;
  std::vector<Tensor> grads = grads_of(params);
  if (grads.empty()) return zeros({});
  std::vector<Tensor> norms;
  // A DTensor gradient's norm counts whole, as a plain value: gradients on several meshes (2-D
  // FSDP's (tp, dp) and dp parameters) then stack, and every rank gets the same total.
  for (const Tensor& g : grads) {
    Tensor n = norm(g, norm_type);
    const BackendHandle* h = n.impl()->backend_handle();
    intrusive_ptr<TensorImpl> whole = h ? h->whole_value() : nullptr;
    norms.push_back(whole ? Tensor(std::move(whole)) : std::move(n));
  }
  const ScalarType dt = result_type(norms);
  for (Tensor& n : norms) n = n.to(dt);
  Tensor total = norm(stack(norms), norm_type);
  if (error_if_nonfinite) {
    const double t = total.item<double>();
    KILN_CHECK(std::isfinite(t), Runtime, "clip_grad_norm_: the total norm of order ", norm_type,
               " of the gradients is ", t,
               ", so they cannot be clipped (set error_if_nonfinite = false to scale them anyway)");
  }
  Tensor coef = clamp(max_norm / (total + 1e-6), std::nullopt, 1.0);
  for (const Tensor& g : grads) g.mul_(coef.to(g.dtype(), g.device()));
  return total;
}

void clip_grad_value_(const std::vector<Tensor>& params, double clip_value) {
  autograd::NoGradGuard no_grad;
  for (const Tensor& g : grads_of(params)) g.clamp_(-clip_value, clip_value);
}

}  // namespace kiln::optim
