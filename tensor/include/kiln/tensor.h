// kiln/tensor.h: Tensor, the handle users hold. Copying a Tensor copies the handle, not data.
//
//   kiln::Tensor a = kiln::ones({2, 3});
//   kiln::Tensor b = a.transpose(0, 1).contiguous();      // methods come from the op table
//   kiln::Tensor c = a + 1.5;                             // scalars become wrapped numbers
//   float v = c.sum().item<float>();
//   std::cout << c;                                       // PyTorch-style repr
#pragma once

#include <optional>
#include <ostream>
#include <string>
#include <tuple>
#include <vector>

#include "kiln/error.h"
#include "kiln/generator.h"  // std::optional<Generator> arguments of generated methods
#include "kiln/scalar.h"
#include "kiln/tensor_impl.h"

namespace kiln {

namespace autograd {
class Node;  // kiln_autograd's graph node (tensor/ only passes pointers to it around)
}

class Tensor;
using TensorList = ArrayRef<Tensor>;

class Tensor {
 public:
  Tensor() = default;
  explicit Tensor(intrusive_ptr<TensorImpl> impl) : impl_(std::move(impl)) {}

  bool defined() const { return static_cast<bool>(impl_); }
  TensorImpl* impl() const { return impl_.get(); }
  const intrusive_ptr<TensorImpl>& impl_ptr() const { return impl_; }
  // Throws RuntimeError naming `what` for an undefined tensor.
  const Tensor& check_defined(const char* what) const;

  IntArrayRef sizes() const { return live()->sizes(); }
  IntArrayRef strides() const { return live()->strides(); }
  IntArrayRef shape() const { return live()->sizes(); }
  int64_t size(int64_t d) const { return live()->size(d); }
  int64_t stride(int64_t d) const { return live()->stride(d); }
  int64_t dim() const { return live()->dim(); }
  int64_t ndimension() const { return live()->dim(); }
  int64_t numel() const { return live()->numel(); }
  int64_t storage_offset() const { return live()->storage_offset(); }
  ScalarType dtype() const { return live()->dtype(); }
  ScalarType scalar_type() const { return live()->dtype(); }
  Device device() const { return live()->device(); }
  DispatchKeySet key_set() const { return live()->key_set(); }
  bool is_contiguous() const { return live()->is_contiguous(); }
  bool is_meta() const { return device().type() == DeviceType::Meta; }
  size_t element_size() const { return live()->itemsize(); }
  size_t nbytes() const { return numel() * element_size(); }
  void* data_ptr() const { return live()->data_ptr(); }
  template <typename T>
  T* data_ptr() const;  // checks that T matches dtype()
  uint32_t version() const { return live()->version(); }
  bool is_same(const Tensor& o) const { return impl_ == o.impl_; }
  // True when both tensors view the same Storage.
  bool is_alias_of(const Tensor& o) const { return live()->storage() == o.live()->storage(); }

  // The single element of a one-element tensor, converted to T (syncs a device tensor).
  template <typename T>
  T item() const;
  Scalar item() const;
  std::string repr() const;
  std::string to_string() const { return repr(); }

  // Autograd (PyTorch's names). kiln_autograd implements them through AutogradHooks
  // (kiln/autograd_hooks.h); without it, the ones that need it raise a RuntimeError.
  const Tensor& requires_grad_(bool requires_grad = true) const;
  bool requires_grad() const {
    const TensorImpl* impl = live();
    if (const AutogradMetaInterface* m = impl->autograd_meta()) return m->requires_grad();
    const BackendHandle* h = impl->backend_handle();
    return __builtin_expect(h != nullptr, 0) && h->requires_grad();
  }
  Tensor grad() const;                      // undefined when no gradient was accumulated
  void set_grad(const Tensor& grad) const;  // replaces .grad (undefined clears it)
  std::shared_ptr<autograd::Node> grad_fn() const;
  bool is_leaf() const;
  int64_t output_nr() const;
  void backward(const Tensor& gradient = Tensor(), std::optional<bool> retain_graph = std::nullopt,
                bool create_graph = false) const;
  void retain_grad() const;
  bool retains_grad() const;
  // A tensor sharing this one's storage (and version counter) that does not require grad.
  Tensor detach() const;
  bool is_inference() const { return live()->is_inference(); }

  // Methods generated from the op table (add, sum, view, ...).
#include "kiln/generated/tensor_methods.inc"

 private:
  // The impl, or a ValueError for an undefined tensor (never a null dereference).
  TensorImpl* live() const {
    if (__builtin_expect(impl_.get() == nullptr, 0)) undefined_error();
    return impl_.get();
  }
  [[noreturn]] static void undefined_error();
  intrusive_ptr<TensorImpl> impl_;
};

std::ostream& operator<<(std::ostream& os, const Tensor& t);

// A 0-dim CPU tensor marked as a wrapped number (Note [Type promotion] in scalar_type.h).
Tensor scalar_to_tensor(const Scalar& s);
// A 0-dim tensor with an explicit dtype on `device`.
Tensor scalar_tensor_of(const Scalar& s, ScalarType dtype, Device device = kCPU);

// Allocates without going through the dispatcher (for kernels and meta-driven allocation).
Tensor empty_on(IntArrayRef sizes, ScalarType dtype, Device device);
Tensor empty_strided_on(IntArrayRef sizes, IntArrayRef strides, ScalarType dtype, Device device);

// The result type of an op over these operands (torch.result_type). The variadic form takes
// references, so the hot path copies no handles.
ScalarType result_type(const Tensor* const* tensors, size_t n);
ScalarType result_type(TensorList tensors);
template <typename... Ts>
ScalarType result_type(const Tensor& first, const Ts&... rest) {
  const Tensor* ptrs[] = {&first, &rest...};
  return result_type(ptrs, 1 + sizeof...(rest));
}

}  // namespace kiln
