// empty, empty_strided, arange, linspace and eye on CUDA (tensor/ops/creation.toml).
#include <cstring>

#include "cuda_utils.h"
#include "kiln/dispatcher.h"
#include "kiln/generated/meta/creation.h"
#include "kiln/generated/ops/creation.h"
#include "loops.cuh"

namespace kiln::cuda {
namespace {

// Replaces tensor/src/empty_kernels.cpp's generic CUDA registration so that memory comes from the
// requested device, not whichever device is current.
Tensor empty_cuda_op(IntArrayRef size, std::optional<ScalarType> dtype, std::optional<Device> device) {
  TensorSpec s = meta::empty(size, dtype, device);
  return empty_cuda(s.sizes, s.dtype, s.device);
}

Tensor empty_strided_cuda_op(IntArrayRef size, IntArrayRef stride, std::optional<ScalarType> dtype,
                             std::optional<Device> device) {
  TensorSpec s = meta::empty_strided(size, stride, dtype, device);
  return empty_strided_cuda(s.sizes, s.strides, s.dtype, s.device);
}

// out[i] = start + step * i, computed in int64 (integral T) or double, as on the CPU.
template <typename T, typename A>
struct ArangeFn {
  A start, step;
  KILN_HD T operator()(int64_t i) const { return cast<T>(start + step * static_cast<A>(i)); }
};

// Like PyTorch: the first half counts up from start, the second half down from end.
template <typename T>
struct LinspaceFn {
  double start, end, step;
  int64_t steps;
  KILN_HD T operator()(int64_t i) const {
    int64_t half = steps / 2;
    double v = i < half ? start + step * static_cast<double>(i)
                        : end - step * static_cast<double>(steps - 1 - i);
    return cast<T>(v);
  }
};

// p[i * stride] = value for i < n (the diagonal of eye).
template <typename E>
__global__ void strided_set_kernel(int64_t n, E* p, int64_t stride, E value) {
  int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) p[i * stride] = value;
}

Tensor arange_cuda(const Scalar& start, const Scalar& end, const Scalar& step,
                   std::optional<ScalarType> dtype, std::optional<Device> device) {
  TensorSpec s = meta::arange(start, end, step, dtype, device);
  Tensor out = empty_cuda(s.sizes, s.dtype, s.device);
  dispatch<TypeSet::Numeric>(s.dtype, "arange", [&]<typename T>() {
    using A = std::conditional_t<std::is_integral_v<T>, int64_t, double>;
    launch_index<T>(out, ArangeFn<T, A>{start.to<A>(), step.to<A>()});
  });
  return out;
}

Tensor linspace_cuda(const Scalar& start, const Scalar& end, int64_t steps,
                     std::optional<ScalarType> dtype, std::optional<Device> device) {
  TensorSpec s = meta::linspace(start, end, steps, dtype, device);
  Tensor out = empty_cuda(s.sizes, s.dtype, s.device);
  double a = start.to_double(), b = end.to_double();
  double step = steps > 1 ? (b - a) / static_cast<double>(steps - 1) : 0.0;
  dispatch<TypeSet::Numeric>(s.dtype, "linspace", [&]<typename T>() {
    launch_index<T>(out, LinspaceFn<T>{a, b, step, steps});
  });
  return out;
}

// -> (n, m): ones on the diagonal, zeros elsewhere.
Tensor eye_cuda(int64_t n, std::optional<int64_t> m, std::optional<ScalarType> dtype,
                std::optional<Device> device) {
  TensorSpec s = meta::eye(n, m, dtype, device);
  Tensor out = empty_cuda(s.sizes, s.dtype, s.device);
  out.fill_(0);
  int64_t cols = s.sizes[1], diag = std::min(s.sizes[0], cols);
  if (diag == 0) return out;
  uint64_t one = 0;
  KILN_DISPATCH_ALL_TYPES(s.dtype, "eye", [&] {
    scalar_t v = cast<scalar_t>(1);
    std::memcpy(&one, &v, sizeof v);
  });
  int dev = out.device().index();
  DeviceGuard g(dev);
  cudaStream_t stream = getCurrentStream(dev).stream();
  unsigned blocks = static_cast<unsigned>((diag + kBlockSize - 1) / kBlockSize);
  void* p = out.impl()->raw_data();
  switch (out.element_size()) {
    case 1: strided_set_kernel<<<blocks, kBlockSize, 0, stream>>>(diag, static_cast<uint8_t*>(p), cols + 1, uint8_t(one)); break;
    case 2: strided_set_kernel<<<blocks, kBlockSize, 0, stream>>>(diag, static_cast<uint16_t*>(p), cols + 1, uint16_t(one)); break;
    case 4: strided_set_kernel<<<blocks, kBlockSize, 0, stream>>>(diag, static_cast<uint32_t*>(p), cols + 1, uint32_t(one)); break;
    default: strided_set_kernel<<<blocks, kBlockSize, 0, stream>>>(diag, static_cast<uint64_t*>(p), cols + 1, one); break;
  }
  KILN_CUDA_CHECK_LAUNCH();
  return out;
}

KILN_LIBRARY(CUDA, m) {
  m.impl<ops::empty>(empty_cuda_op);
  m.impl<ops::empty_strided>(empty_strided_cuda_op);
  m.impl<ops::arange>(arange_cuda);
  m.impl<ops::linspace>(linspace_cuda);
  m.impl<ops::eye>(eye_cuda);
}

}  // namespace
}  // namespace kiln::cuda
