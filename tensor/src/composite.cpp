// Decompositions of the composite rows of the op table (creation.toml, copy.toml, views.toml).
// They call other ops through the dispatcher, so every layer sees the constituent ops.
#include "kiln/generated/composite/copy.h"
#include "kiln/generated/composite/creation.h"
#include "kiln/generated/composite/views.h"
#include "kiln/generated/meta/creation.h"
#include "kiln/generated/meta/views.h"
#include "kiln/meta.h"

namespace kiln::composite {

Tensor zero_(const Tensor& self) { return self.fill_(0); }

Tensor zeros(IntArrayRef size, std::optional<ScalarType> dtype, std::optional<Device> device) {
  return kiln::empty(size, dtype, device).fill_(0);
}

Tensor ones(IntArrayRef size, std::optional<ScalarType> dtype, std::optional<Device> device) {
  return kiln::empty(size, dtype, device).fill_(1);
}

Tensor full(IntArrayRef size, const Scalar& fill_value, std::optional<ScalarType> dtype,
            std::optional<Device> device) {
  TensorSpec s = meta::full(size, fill_value, dtype, device);
  return kiln::empty(size, s.dtype, device).fill_(fill_value);
}

Tensor empty_like(const Tensor& self, std::optional<ScalarType> dtype, std::optional<Device> device) {
  return kiln::empty(self.sizes(), dtype.value_or(self.dtype()), device.value_or(self.device()));
}

Tensor zeros_like(const Tensor& self, std::optional<ScalarType> dtype, std::optional<Device> device) {
  return kiln::empty_like(self, dtype, device).fill_(0);
}

Tensor ones_like(const Tensor& self, std::optional<ScalarType> dtype, std::optional<Device> device) {
  return kiln::empty_like(self, dtype, device).fill_(1);
}

Tensor full_like(const Tensor& self, const Scalar& fill_value, std::optional<ScalarType> dtype,
                 std::optional<Device> device) {
  return kiln::empty_like(self, dtype, device).fill_(fill_value);
}

Tensor to_copy(const Tensor& self, std::optional<ScalarType> dtype, std::optional<Device> device) {
  return kiln::empty_like(self, dtype, device).copy_(self);
}

Tensor to(const Tensor& self, std::optional<ScalarType> dtype, std::optional<Device> device, bool copy) {
  bool same = (!dtype || *dtype == self.dtype()) && (!device || *device == self.device());
  if (same && !copy) return self;
  return kiln::_to_copy(self, dtype, device);
}

Tensor clone(const Tensor& self) { return kiln::empty_like(self, std::nullopt, std::nullopt).copy_(self); }

Tensor contiguous(const Tensor& self) { return self.is_contiguous() ? self : kiln::clone(self); }

Tensor reshape(const Tensor& self, IntArrayRef shape) {
  DimVector s = meta::infer_size("reshape", shape, self.numel());
  if (meta::compute_view_strides(self.sizes(), self.strides(), s)) return self.view(s);
  return kiln::clone(self).view(s);
}

Tensor flatten(const Tensor& self, int64_t start_dim, int64_t end_dim) {
  return self.reshape(meta::flatten(self, start_dim, end_dim).sizes);
}

Tensor unflatten(const Tensor& self, int64_t dim, IntArrayRef sizes) {
  return self.view(meta::unflatten(self, dim, sizes).sizes);
}

Tensor narrow(const Tensor& self, int64_t dim, int64_t start, int64_t length) {
  meta::narrow(self, dim, start, length);  // validates
  int64_t n = self.size(dim);
  if (start < 0) start += n;
  return self.slice(dim, start, start + length, 1);
}

}  // namespace kiln::composite
