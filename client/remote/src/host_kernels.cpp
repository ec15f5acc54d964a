// The thin client's host kernels, built only with KILN_CLIENT_ONLY (which has no kernels/cpu):
// what a client needs on its own CPU to hold values it fetches or uploads. Allocation (empty,
// empty_strided) and copy_ between CPU tensors of one dtype and shape (a fetched value into its
// destination, item(), .contiguous() before an upload). Every other op on a CPU tensor fails,
// naming the op and the way out: make the tensors on the worker.
#include <cstring>

#include "kiln/dispatcher.h"
#include "kiln/generated/meta/copy.h"
#include "kiln/generated/meta/creation.h"
#include "kiln/generated/ops/copy.h"
#include "kiln/generated/ops/creation.h"

namespace kiln::client {
namespace {

Tensor host_empty(IntArrayRef size, std::optional<ScalarType> dtype, std::optional<Device> device) {
  const TensorSpec s = meta::empty(size, dtype, device);
  return empty_strided_on(s.sizes, s.strides, s.dtype, s.device);
}

Tensor host_empty_strided(IntArrayRef size, IntArrayRef stride, std::optional<ScalarType> dtype,
                          std::optional<Device> device) {
  const TensorSpec s = meta::empty_strided(size, stride, dtype, device);
  return empty_strided_on(s.sizes, s.strides, s.dtype, s.device);
}

Tensor host_copy(const Tensor& self, const Tensor& src, bool) {
  meta::copy_(self, src, false);
  KILN_CHECK(self.dtype() == src.dtype() && self.sizes() == src.sizes(), NotImplemented,
             "copy_: a client-only build (KILN_CLIENT_ONLY) copies on its CPU only between "
             "tensors of one dtype and shape, got ",
             src.dtype(), src.sizes(), " into ", self.dtype(), self.sizes(),
             ": convert or broadcast on the worker first");
  if (self.numel() == 0 || self.is_same(src)) return self;
  const int64_t es = static_cast<int64_t>(self.element_size()), nd = self.dim();
  char* d = static_cast<char*>(self.impl()->raw_data());
  const char* s = static_cast<const char*>(src.impl()->raw_data());
  if (self.is_contiguous() && src.is_contiguous()) {
    std::memmove(d, s, static_cast<size_t>(self.numel() * es));
    return self;
  }
  std::vector<int64_t> idx(static_cast<size_t>(nd), 0);
  for (int64_t n = 0; n < self.numel(); ++n) {
    int64_t od = 0, os = 0;
    for (int64_t k = 0; k < nd; ++k) od += idx[k] * self.stride(k), os += idx[k] * src.stride(k);
    std::memcpy(d + od * es, s + os * es, static_cast<size_t>(es));
    for (int64_t k = nd - 1; k >= 0 && ++idx[k] == self.size(k); --k) idx[k] = 0;
  }
  return self;
}

// Any other op on a CPU tensor.
void no_host_op(const OperatorHandle& op, DispatchKeySet, Stack&) {
  KILN_FAIL(NotImplemented, op.name(),
            ": a client-only build (KILN_CLIENT_ONLY) runs no ops on its own CPU; make the "
            "tensors on a worker (kiln::set_default_device(session.device()) before creating "
            "them, or .to(session.device())), or use the full build");
}

KILN_LIBRARY(CPU, m) {
  m.fallback(&no_host_op);
  m.impl<ops::empty>(host_empty);
  m.impl<ops::empty_strided>(host_empty_strided);
  m.impl<ops::copy_>(host_copy);
}

}  // namespace
}  // namespace kiln::client
