// kiln/autograd_hooks.h: how Tensor's autograd methods reach kiln_autograd without tensor/
// depending on it. kiln_autograd registers one AutogradHooks object at load time.
//
//   kiln::autograd_hooks();                  // nullptr when kiln_autograd is not loaded
//   kiln::set_autograd_hooks(&my_hooks);     // kiln_autograd's static initializer
#pragma once

#include <memory>
#include <optional>

#include "kiln/tensor.h"

namespace kiln {

struct AutogradHooks {
  virtual ~AutogradHooks() = default;
  virtual void set_requires_grad(const Tensor& t, bool requires_grad) const = 0;
  virtual Tensor grad(const Tensor& t) const = 0;
  virtual void set_grad(const Tensor& t, const Tensor& grad) const = 0;
  virtual std::shared_ptr<autograd::Node> grad_fn(const Tensor& t) const = 0;
  virtual bool is_leaf(const Tensor& t) const = 0;
  virtual int64_t output_nr(const Tensor& t) const = 0;
  virtual void backward(const Tensor& t, const Tensor& gradient, std::optional<bool> retain_graph,
                        bool create_graph) const = 0;
  virtual void retain_grad(const Tensor& t) const = 0;
  virtual bool retains_grad(const Tensor& t) const = 0;
};

void set_autograd_hooks(const AutogradHooks* hooks);
const AutogradHooks* autograd_hooks();

}  // namespace kiln
