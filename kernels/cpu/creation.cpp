// empty, empty_strided, arange, linspace, eye on the CPU.
#include "kiln/generated/meta/creation.h"
#include "kiln/generated/ops/creation.h"
#include "loops.h"

namespace kiln::kernels {
namespace {

Tensor empty_cpu(IntArrayRef size, std::optional<ScalarType> dtype, std::optional<Device> device) {
  TensorSpec s = meta::empty(size, dtype, device);
  return empty_on(s.sizes, s.dtype, s.device);
}

Tensor empty_strided_cpu(IntArrayRef size, IntArrayRef stride, std::optional<ScalarType> dtype,
                         std::optional<Device> device) {
  TensorSpec s = meta::empty_strided(size, stride, dtype, device);
  return empty_strided_on(s.sizes, s.strides, s.dtype, s.device);
}

Tensor arange_cpu(const Scalar& start, const Scalar& end, const Scalar& step,
                  std::optional<ScalarType> dtype, std::optional<Device> device) {
  TensorSpec s = meta::arange(start, end, step, dtype, device);
  Tensor out = empty_on(s.sizes, s.dtype, s.device);
  KILN_DISPATCH_NUMERIC_TYPES(s.dtype, "arange", [&] {
    auto* p = static_cast<scalar_t*>(out.impl()->raw_data());
    using A = std::conditional_t<std::is_integral_v<scalar_t>, int64_t, double>;
    A a = start.to<A>(), st = step.to<A>();
    for (int64_t i = 0; i < out.numel(); ++i) p[i] = static_cast<scalar_t>(a + st * static_cast<A>(i));
  });
  return out;
}

Tensor linspace_cpu(const Scalar& start, const Scalar& end, int64_t steps,
                    std::optional<ScalarType> dtype, std::optional<Device> device) {
  TensorSpec s = meta::linspace(start, end, steps, dtype, device);
  Tensor out = empty_on(s.sizes, s.dtype, s.device);
  double a = start.to_double(), b = end.to_double();
  double step = steps > 1 ? (b - a) / static_cast<double>(steps - 1) : 0.0;
  KILN_DISPATCH_NUMERIC_TYPES(s.dtype, "linspace", [&] {
    auto* p = static_cast<scalar_t*>(out.impl()->raw_data());
    // Like PyTorch: the first half counts up from start, the second half down from end.
    int64_t half = steps / 2;
    for (int64_t i = 0; i < steps; ++i) {
      double v = i < half ? a + step * static_cast<double>(i) : b - step * static_cast<double>(steps - 1 - i);
      p[i] = static_cast<scalar_t>(v);
    }
  });
  return out;
}

Tensor eye_cpu(int64_t n, std::optional<int64_t> m, std::optional<ScalarType> dtype,
               std::optional<Device> device) {
  TensorSpec s = meta::eye(n, m, dtype, device);
  Tensor out = zeros(s.sizes, s.dtype, s.device);
  int64_t cols = s.sizes[1];
  KILN_DISPATCH_ALL_TYPES(s.dtype, "eye", [&] {
    auto* p = static_cast<scalar_t*>(out.impl()->raw_data());
    for (int64_t i = 0; i < std::min(n, cols); ++i) p[i * cols + i] = static_cast<scalar_t>(1);
  });
  return out;
}

KILN_LIBRARY(CPU, m) {
  m.impl<ops::empty>(empty_cpu);
  m.impl<ops::empty_strided>(empty_strided_cpu);
  m.impl<ops::arange>(arange_cpu);
  m.impl<ops::linspace>(linspace_cpu);
  m.impl<ops::eye>(eye_cpu);
}

}  // namespace
}  // namespace kiln::kernels
