// tanh, sigmoid, erf, gelu (both forms) and silu on CUDA (tensor/ops/unary.toml), and the backward
// rows gelu_backward and threshold_backward (relu's). x: (*) -> (*)
// in a floating out dtype (tanh/sigmoid/erf promote integer and bool inputs to float32; gelu and
// silu take floating inputs only). float16/bfloat16 compute in float. The formulas are
// kiln/pointwise_math.h's, shared with kernels/cpu/unary.cpp (See Note [One home per formula]).
#include <string_view>

#include "kiln/dispatcher.h"
#include "kiln/generated/ops/unary.h"
#include "loops.cuh"
#include "math.cuh"

namespace kiln::cuda {
namespace {

struct TanhOp {
  template <typename C>
  KILN_HD C operator()(C a) const { return dm::tanh(a); }
};
struct SigmoidOp {
  template <typename C>
  KILN_HD C operator()(C a) const { return dm::sigmoid(a); }
};
struct ErfOp {
  template <typename C>
  KILN_HD C operator()(C a) const { return dm::erf(a); }
};
struct SiluOp {
  template <typename C>
  KILN_HD C operator()(C a) const { return dm::silu(a); }
};
struct GeluErfOp {
  template <typename C>
  KILN_HD C operator()(C a) const { return dm::gelu_erf(a); }
};
struct GeluTanhOp {
  template <typename C>
  KILN_HD C operator()(C a) const { return dm::gelu_tanh(a); }
};
// g * d/dx gelu(x)
struct GeluBackwardOp {
  bool tanh_form;
  template <typename C>
  KILN_HD C operator()(C g, C x) const {
    return g * (tanh_form ? dm::gelu_tanh_backward(x) : dm::gelu_erf_backward(x));
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
