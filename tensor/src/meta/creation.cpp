// Meta functions for creation and copy ops (tensor/ops/creation.toml, copy.toml).
#include "kiln/generated/meta/creation.h"

#include <cmath>

#include "kiln/default_device.h"
#include "kiln/generated/meta/copy.h"
#include "kiln/generated/meta/unary.h"
#include "kiln/meta.h"

namespace kiln::meta {

static Device dev_or_cpu(std::optional<Device> d) { return d ? *d : default_device(); }

TensorSpec empty(IntArrayRef size, std::optional<ScalarType> dtype, std::optional<Device> device) {
  for (int64_t s : size) KILN_CHECK(s >= 0, Value, "empty: negative dimension ", s, " in size ", size);
  return contiguous_spec(size, dtype.value_or(kFloat32), dev_or_cpu(device));
}

TensorSpec empty_strided(IntArrayRef size, IntArrayRef stride, std::optional<ScalarType> dtype,
                         std::optional<Device> device) {
  KILN_CHECK(size.size() == stride.size(), Value, "empty_strided: size ", size, " and stride ",
             stride, " differ in length");
  TensorSpec s = empty(size, dtype, device);
  for (int64_t st : stride) KILN_CHECK(st >= 0, Value, "empty_strided: negative stride in ", stride);
  s.strides = stride;
  return s;
}

TensorSpec full(IntArrayRef size, const Scalar& fill_value, std::optional<ScalarType> dtype,
                std::optional<Device> device) {
  ScalarType inferred = fill_value.is_floating() ? kFloat32 : fill_value.dtype();
  return empty(size, dtype.value_or(inferred), device);
}

TensorSpec like(const Tensor& self, std::optional<ScalarType> dtype, std::optional<Device> device) {
  return contiguous_spec(self.sizes(), dtype.value_or(self.dtype()), device.value_or(self.device()));
}

TensorSpec full_like(const Tensor& self, const Scalar&, std::optional<ScalarType> dtype,
                     std::optional<Device> device) {
  return like(self, dtype, device);
}

TensorSpec like_contiguous(const Tensor& self) {
  return contiguous_spec(self.sizes(), self.dtype(), self.device());
}

TensorSpec same_inplace(const Tensor& self) {
  TensorSpec s = view_spec(self, self.sizes(), self.strides(), self.storage_offset());
  return s;
}

TensorSpec same_inplace(const Tensor& self, const Scalar&) { return same_inplace(self); }

TensorSpec copy_(const Tensor& self, const Tensor& src, bool) {
  DimVector b = broadcast_shapes("copy_", self.sizes(), src.sizes());
  KILN_CHECK(b.ref() == self.sizes(), Value, "copy_: source of shape ", src.sizes(),
             " cannot be broadcast to the destination shape ", self.sizes());
  return same_inplace(self);
}

TensorSpec to(const Tensor& self, std::optional<ScalarType> dtype, std::optional<Device> device, bool copy) {
  bool same = !copy && (!dtype || *dtype == self.dtype()) && (!device || *device == self.device());
  if (same) return same_inplace(self);
  return like(self, dtype, device);
}

TensorSpec arange(const Scalar& start, const Scalar& end, const Scalar& step,
                  std::optional<ScalarType> dtype, std::optional<Device> device) {
  double a = start.to_double(), b = end.to_double(), st = step.to_double();
  KILN_CHECK(st != 0, Value, "arange: step must be nonzero");
  KILN_CHECK(std::isfinite(a) && std::isfinite(b), Value, "arange: unsupported range ", a, " -> ", b);
  KILN_CHECK((st > 0 && b >= a) || (st < 0 && b <= a), Value,
             "arange: upper bound and larger bound inconsistent with step sign (start=", a,
             ", end=", b, ", step=", st, ")");
  int64_t n = static_cast<int64_t>(std::ceil((b - a) / st));
  bool all_int = !start.is_floating() && !end.is_floating() && !step.is_floating();
  return empty({n}, dtype.value_or(all_int ? kInt64 : kFloat32), device);
}

TensorSpec linspace(const Scalar&, const Scalar&, int64_t steps, std::optional<ScalarType> dtype,
                    std::optional<Device> device) {
  KILN_CHECK(steps >= 0, Value, "linspace: number of steps must be non-negative, got ", steps);
  return empty({steps}, dtype, device);
}

TensorSpec eye(int64_t n, std::optional<int64_t> m, std::optional<ScalarType> dtype,
               std::optional<Device> device) {
  KILN_CHECK(n >= 0 && m.value_or(n) >= 0, Value, "eye: n and m must be non-negative, got n=", n,
             ", m=", m.value_or(n));
  return empty({n, m.value_or(n)}, dtype, device);
}

}  // namespace kiln::meta
