// empty / empty_strided for every backend with memory: they only need the device's allocator.
#include "kiln/generated/meta_decls.h"
#include "kiln/generated/op_handles.h"

namespace kiln {
namespace {

Tensor empty_any(IntArrayRef size, std::optional<ScalarType> dtype, std::optional<Device> device) {
  TensorSpec s = meta::empty(size, dtype, device);
  return empty_on(s.sizes, s.dtype, s.device);
}

Tensor empty_strided_any(IntArrayRef size, IntArrayRef stride, std::optional<ScalarType> dtype,
                         std::optional<Device> device) {
  TensorSpec s = meta::empty_strided(size, stride, dtype, device);
  return empty_strided_on(s.sizes, s.strides, s.dtype, s.device);
}

KILN_LIBRARY(CPU, m) {
  m.impl<ops::empty>(empty_any);
  m.impl<ops::empty_strided>(empty_strided_any);
}
KILN_LIBRARY(CUDA, m) {
  m.impl<ops::empty>(empty_any);
  m.impl<ops::empty_strided>(empty_strided_any);
}

}  // namespace
}  // namespace kiln
