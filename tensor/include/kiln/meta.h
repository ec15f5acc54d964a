// kiln/meta.h: helpers for meta functions (output sizes, strides, dtype; no data).
//
//   TensorSpec my_meta(const Tensor& self, int64_t dim) {
//     int64_t d = kiln::meta::wrap_dim("my_op", dim, self.dim());
//     return kiln::meta::contiguous_spec(self.sizes(), self.dtype(), self.device());
//   }
//
// Note [Meta functions]: every op-table row names a function in kiln::meta with the op's
// signature. It validates the arguments (raising the errors users see: shapes, dims, dtypes)
// and returns the output specs. Structured kernels allocate from it, the Meta backend returns
// data-less tensors from it, and later the Remote backend records from it. Because every
// backend calls the same function, shape errors are identical on every device.
#pragma once

#include "kiln/dispatcher.h"

namespace kiln::meta {

// Wraps a possibly negative dim into [0, ndim); IndexError naming the op otherwise.
// A 0-d tensor accepts dims -1 and 0 (as PyTorch does).
int64_t wrap_dim(const char* op, int64_t dim, int64_t ndim);
// Marks the dims of an int[]? argument (all dims when absent); errors on repeats.
std::vector<bool> dim_mask(const char* op, OptionalIntArrayRef dims, int64_t ndim);
DimVector broadcast_shapes(const char* op, IntArrayRef a, IntArrayRef b);
// The device all tensor operands share (0-dim CPU tensors may join any device).
Device common_device(const char* op, const Tensor* const* tensors, size_t n);
Device common_device(const char* op, TensorList tensors);
template <typename... Ts>
Device common_device(const char* op, const Tensor& first, const Ts&... rest) {
  const Tensor* ptrs[] = {&first, &rest...};
  return common_device(op, ptrs, 1 + sizeof...(rest));
}
TensorSpec contiguous_spec(IntArrayRef sizes, ScalarType dtype, Device device);
// A view of argument 0 with the given geometry.
TensorSpec view_spec(const Tensor& self, IntArrayRef sizes, IntArrayRef strides, int64_t offset);
// Shapes with the dims of `mask` removed (or kept as 1 with keepdim).
DimVector reduced_shape(IntArrayRef sizes, const std::vector<bool>& mask, bool keepdim);
// Resolves one -1 in `shape` against numel; ValueError for an invalid shape.
DimVector infer_size(const char* op, IntArrayRef shape, int64_t numel);
// Strides for viewing `sizes`/`strides` as `shape` without a copy, if possible.
std::optional<DimVector> compute_view_strides(IntArrayRef sizes, IntArrayRef strides,
                                              IntArrayRef shape);
ScalarType default_float(ScalarType t);  // integral/bool -> float32, floats unchanged

}  // namespace kiln::meta
