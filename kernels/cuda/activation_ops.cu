// tanh, sigmoid, erf, gelu (both forms) and silu on CUDA (tensor/ops/unary.toml), and the backward
// rows gelu_backward and threshold_backward (relu's). x: (*) -> (*)
// in a floating out dtype (tanh/sigmoid/erf promote integer and bool inputs to float32; gelu and
// silu take floating inputs only). float16/bfloat16 compute in float. The formulas are those of
// kernels/cpu/unary.cpp: for float, sigmoid is e^x / (1 + e^x) for x < 0 so that tiny results
// keep their bits; double uses 1 / (1 + e^-x) as the CPU does.
#include <string_view>

#include "kiln/dispatcher.h"
#include "kiln/generated/ops/unary.h"
#include "loops.cuh"
#include "math.cuh"

namespace kiln::cuda {
namespace {

template <typename C>
KILN_HD inline C sigmoid_of(C a) {
  if constexpr (std::is_same_v<C, float>) {
    float e = dm::exp(a < 0.0f ? a : -a);  // e^-|a|, in (0, 1]
    float d = 1.0f + e;
    return a < 0.0f ? e / d : 1.0f / d;
  } else {
    return C(1) / (C(1) + dm::exp(-a));
  }
}

struct TanhOp {
  template <typename C>
  KILN_HD C operator()(C a) const { return dm::tanh(a); }
};
struct SigmoidOp {
  template <typename C>
  KILN_HD C operator()(C a) const { return sigmoid_of(a); }
};
struct ErfOp {
  template <typename C>
  KILN_HD C operator()(C a) const { return dm::erf(a); }
};
// float: x sigmoid(x); double: x / (1 + e^-x) (as the CPU).
struct SiluOp {
  template <typename C>
  KILN_HD C operator()(C a) const {
    if constexpr (std::is_same_v<C, float>) return a * sigmoid_of(a);
    else return a / (C(1) + dm::exp(-a));
  }
};
// x/2 (1 + erf(x / sqrt 2))
struct GeluErfOp {
  template <typename C>
  KILN_HD C operator()(C a) const { return C(0.5) * a * (C(1) + dm::erf(a * C(0.70710678118654752440))); }
};
// x/2 (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
struct GeluTanhOp {
  template <typename C>
  KILN_HD C operator()(C a) const {
    C inner = C(0.79788456080286535588) * (a + C(0.044715) * a * a * a);
    return C(0.5) * a * (C(1) + dm::tanh(inner));
  }
};

// g * d/dx gelu(x): Phi(x) + x phi(x), or the tanh form's derivative (kernels/cpu/vec_math.h).
struct GeluBackwardOp {
  bool tanh_form;
  template <typename C>
  KILN_HD C operator()(C g, C x) const {
    if (tanh_form) {
      const C k = C(0.79788456080286535588), t = dm::tanh(k * (x + C(0.044715) * x * x * x));
      return g * (C(0.5) * (C(1) + t) + C(0.5) * x * (C(1) - t * t) * k * (C(1) + C(0.134145) * x * x));
    }
    const C cdf = C(0.5) * (C(1) + dm::erf(x * C(0.70710678118654752440)));
    return g * (cdf + x * dm::exp(C(-0.5) * x * x) * C(0.39894228040143267794));
  }
};
// relu's backward: 0 where x <= threshold, else g (a nan x passes g), as on the CPU.
struct ThresholdBackwardOp {
  double threshold;
  template <typename C>
  KILN_HD C operator()(C g, C x) const { return x <= static_cast<C>(threshold) ? C(0) : g; }
};

void tanh_cuda(const Tensor& out, const Tensor& self) { unary_op<TypeSet::Float>("tanh", out, self, TanhOp{}); }
void sigmoid_cuda(const Tensor& out, const Tensor& self) {
  unary_op<TypeSet::Float>("sigmoid", out, self, SigmoidOp{});
}
void erf_cuda(const Tensor& out, const Tensor& self) { unary_op<TypeSet::Float>("erf", out, self, ErfOp{}); }
void silu_cuda(const Tensor& out, const Tensor& self) { unary_op<TypeSet::Float>("silu", out, self, SiluOp{}); }

// x: (*) -> (*); approximate is 'none' or 'tanh' (checked by the meta function).
void gelu_cuda(const Tensor& out, const Tensor& self, std::string_view approximate) {
  if (approximate == "tanh") unary_op<TypeSet::Float>("gelu", out, self, GeluTanhOp{});
  else unary_op<TypeSet::Float>("gelu", out, self, GeluErfOp{});
}

// grad_output, self: broadcast to out -> out (gelu's and relu's backward rows).
void gelu_backward_cuda(const Tensor& out, const Tensor& grad_output, const Tensor& self,
                        std::string_view approximate) {
  binary_op<TypeSet::Float>("gelu_backward", out, grad_output, self, GeluBackwardOp{approximate == "tanh"});
}
void threshold_backward_cuda(const Tensor& out, const Tensor& grad_output, const Tensor& self,
                             const Scalar& threshold) {
  binary_op<TypeSet::Numeric>("threshold_backward", out, grad_output, self,
                              ThresholdBackwardOp{threshold.to<double>()});
}

KILN_LIBRARY(CUDA, m) {
  m.structured<ops::tanh>(tanh_cuda);
  m.structured<ops::sigmoid>(sigmoid_cuda);
  m.structured<ops::erf>(erf_cuda);
  m.structured<ops::gelu>(gelu_cuda);
  m.structured<ops::gelu_backward>(gelu_backward_cuda);
  m.structured<ops::threshold_backward>(threshold_backward_cuda);
  m.structured<ops::silu>(silu_cuda);
}

}  // namespace
}  // namespace kiln::cuda
