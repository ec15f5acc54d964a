// Binary pointwise kernels on the CPU (tensor/ops/pointwise.toml).
#include "kiln/generated/op_handles.h"
#include "loops.h"

namespace kiln::kernels {
namespace {

// x: broadcastable to out, y: broadcastable to out -> out = x + alpha * y
void add_cpu(const Tensor& out, const Tensor& self, const Tensor& other, const Scalar& alpha) {
  auto in = cast_inputs(out.dtype(), {self, other});
  KILN_DISPATCH_ALL_TYPES(out.dtype(), "add", [&] {
    using T = scalar_t;
    if constexpr (std::is_same_v<T, bool>) {
      binary_kernel<T>(out, in[0], in[1], [](T a, T b) { return a || b; });
    } else if constexpr (std::is_same_v<T, Half> || std::is_same_v<T, BFloat16>) {
      float al = alpha.to<float>();
      binary_kernel<T>(out, in[0], in[1], [al](T a, T b) { return T(float(a) + al * float(b)); });
    } else {
      T al = alpha.to<T>();
      if (al == T(1)) {
        binary_kernel<T>(out, in[0], in[1], [](T a, T b) { return a + b; });
      } else {
        binary_kernel<T>(out, in[0], in[1], [al](T a, T b) { return a + al * b; });
      }
    }
  });
}

KILN_LIBRARY(CPU, m) { m.structured<ops::add>(add_cpu); }

}  // namespace
}  // namespace kiln::kernels
