// Unary pointwise kernels on the CPU (tensor/ops/unary.toml). Every kernel maps x: (*) -> (*)
// elementwise; `out` already has the result dtype (the meta function chose it) and the input is
// cast to it first, so exp(int32) computes in float32. The backward rows of relu and gelu
// (threshold_backward, gelu_backward) are here too: (grad_output, self) broadcast -> out.
//
// float32 transcendental functions use kiln::vec (See Note [Vectorizable math] in vec_math.h);
// float16/bfloat16 compute in float through the same functions; float64 uses std:: and the
// formulas of kiln/pointwise_math.h, which CUDA shares (See Note [One home per formula]).
#include <cmath>
#include <type_traits>

#include "kiln/generated/ops/unary.h"
#include "kiln/pointwise_math.h"
#include "kiln/scalar_math.h"
#include "loops.h"
#include "vec_math.h"

// The float lambdas are KILN_VEC_INLINE_LAMBDA: they must inline into the loops of loops.h or
// the loops stay scalar (Note [Vectorizable math]).

namespace kiln::kernels {
namespace {

template <typename T>
constexpr bool kReduced = std::is_same_v<T, Half> || std::is_same_v<T, BFloat16>;

template <typename T, typename FV, typename FD>
void float_typed(const Tensor& out, const Tensor& x, const FV& fv, const FD& fd) {
  if constexpr (std::is_same_v<T, double>) unary_kernel<T>(out, x, fd);
  else if constexpr (std::is_same_v<T, float>) unary_kernel<T>(out, x, fv);
  else unary_kernel<T>(out, x, [&](T a) { return T(fv(float(a))); });
}

// out = f(self) for a floating out dtype: fv on float (float32, float16, bfloat16), fd on double.
template <typename FV, typename FD>
void float_op(const char* name, const Tensor& out, const Tensor& self, const FV& fv, const FD& fd) {
  Tensor x = cast_inputs(out.dtype(), self)[0];
  KILN_DISPATCH_FLOAT_TYPES(out.dtype(), name, [&] { float_typed<scalar_t>(out, x, fv, fd); });
}

// out = f(self) keeping the dtype; f is generic (float16/bfloat16 get float).
template <typename T, typename F>
void numeric_typed(const Tensor& out, const Tensor& x, const F& f) {
  if constexpr (kReduced<T>) unary_kernel<T>(out, x, [&](T a) { return T(f(float(a))); });
  else unary_kernel<T>(out, x, [&](T a) { return static_cast<T>(f(a)); });
}
template <typename F>
void numeric_op(const char* name, const Tensor& out, const Tensor& self, const F& f) {
  Tensor x = cast_inputs(out.dtype(), self)[0];
  KILN_DISPATCH_NUMERIC_TYPES(out.dtype(), name, [&] { numeric_typed<scalar_t>(out, x, f); });
}

#define KILN_FLOAT_UNARY(NAME, FLOAT_EXPR, DOUBLE_EXPR)                                   \
  void NAME##_cpu(const Tensor& out, const Tensor& self) {                              \
    float_op(#NAME, out, self, [](float a) KILN_VEC_INLINE_LAMBDA -> float { return FLOAT_EXPR; }, \
             [](double a) -> double { return DOUBLE_EXPR; });                           \
  }

KILN_FLOAT_UNARY(exp, vec::exp(a), std::exp(a))
KILN_FLOAT_UNARY(log, vec::log(a), std::log(a))
KILN_FLOAT_UNARY(log1p, std::log1p(a), std::log1p(a))
KILN_FLOAT_UNARY(expm1, std::expm1(a), std::expm1(a))
KILN_FLOAT_UNARY(sqrt, std::sqrt(a), std::sqrt(a))
KILN_FLOAT_UNARY(rsqrt, 1.0f / std::sqrt(a), 1.0 / std::sqrt(a))
KILN_FLOAT_UNARY(sin, std::sin(a), std::sin(a))
KILN_FLOAT_UNARY(cos, std::cos(a), std::cos(a))
KILN_FLOAT_UNARY(tanh, vec::tanh(a), std::tanh(a))
KILN_FLOAT_UNARY(sigmoid, vec::sigmoid(a), math::sigmoid(a))
KILN_FLOAT_UNARY(erf, vec::erf(a), std::erf(a))
KILN_FLOAT_UNARY(reciprocal, 1.0f / a, 1.0 / a)
KILN_FLOAT_UNARY(silu, vec::silu(a), math::silu(a))
#undef KILN_FLOAT_UNARY

// x: (*) -> (*), erf form x/2 (1 + erf(x / sqrt 2)) or the tanh approximation.
void gelu_cpu(const Tensor& out, const Tensor& self, std::string_view approximate) {
  if (approximate == "tanh") {
    float_op("gelu", out, self, [](float a) KILN_VEC_INLINE_LAMBDA { return vec::gelu_tanh(a); },
             [](double a) { return math::gelu_tanh(a); });
    return;
  }
  float_op("gelu", out, self, [](float a) KILN_VEC_INLINE_LAMBDA { return vec::gelu_erf(a); },
           [](double a) { return math::gelu_erf(a); });
}

// out = f(a, b) for a floating out dtype, a and b broadcast to it: fv on float (float32, float16,
// bfloat16), fd on double.
template <typename FV, typename FD>
void float_binary_op(const char* name, const Tensor& out, const Tensor& a, const Tensor& b,
                     const FV& fv, const FD& fd) {
  auto in = cast_inputs(out.dtype(), a, b);
  KILN_DISPATCH_FLOAT_TYPES(out.dtype(), name, [&] {
    using T = scalar_t;
    if constexpr (std::is_same_v<T, double>) binary_kernel<T>(out, in[0], in[1], fd);
    else if constexpr (std::is_same_v<T, float>) binary_kernel<T>(out, in[0], in[1], fv);
    else binary_kernel<T>(out, in[0], in[1], [&](T g, T x) { return T(fv(float(g), float(x))); });
  });
}

// grad_output, self: broadcast to out -> out; the derivative of gelu at self times grad_output.
void gelu_backward_cpu(const Tensor& out, const Tensor& grad_output, const Tensor& self,
                       std::string_view approximate) {
  if (approximate == "tanh") {
    float_binary_op("gelu_backward", out, grad_output, self,
                    [](float g, float x) KILN_VEC_INLINE_LAMBDA { return g * vec::gelu_tanh_backward(x); },
                    [](double g, double x) { return g * math::gelu_tanh_backward(x); });
    return;
  }
  float_binary_op("gelu_backward", out, grad_output, self,
                  [](float g, float x) KILN_VEC_INLINE_LAMBDA { return g * vec::gelu_erf_backward(x); },
                  [](double g, double x) { return g * math::gelu_erf_backward(x); });
}

template <typename A>
constexpr bool kIntegral = std::is_integral_v<A>;

void neg_cpu(const Tensor& out, const Tensor& self) {
  numeric_op("neg", out, self, [](auto a) { return wrapping_neg(a); });  // See Note [Integer edge values]
}
void abs_cpu(const Tensor& out, const Tensor& self) {
  numeric_op("abs", out, self, [](auto a) { return wrapping_abs(a); });
}
// relu keeps nan (nan < 0 is false).
void relu_cpu(const Tensor& out, const Tensor& self) {
  numeric_op("relu", out, self, [](auto a) { return a < 0 ? decltype(a)(0) : a; });
}
// grad_output, self: broadcast to out -> out = self <= threshold ? 0 : grad_output (relu's
// backward; a nan self passes grad_output, as in PyTorch).
void threshold_backward_cpu(const Tensor& out, const Tensor& grad_output, const Tensor& self,
                            const Scalar& threshold) {
  auto in = cast_inputs(out.dtype(), grad_output, self);
  KILN_DISPATCH_NUMERIC_TYPES(out.dtype(), "threshold_backward", [&] {
    using T = scalar_t;
    using C = std::conditional_t<kReduced<T>, float, T>;
    const C th = threshold.to<C>();
    binary_kernel<T>(out, in[0], in[1],
                     [th](T g, T x) { return static_cast<C>(x) <= th ? T(C(0)) : g; });
  });
}
void floor_cpu(const Tensor& out, const Tensor& self) {
  numeric_op("floor", out, self, [](auto a) {
    if constexpr (kIntegral<decltype(a)>) return a;
    else return std::floor(a);
  });
}
void ceil_cpu(const Tensor& out, const Tensor& self) {
  numeric_op("ceil", out, self, [](auto a) {
    if constexpr (kIntegral<decltype(a)>) return a;
    else return std::ceil(a);
  });
}
// Half to even, like torch.round.
void round_cpu(const Tensor& out, const Tensor& self) {
  numeric_op("round", out, self, [](auto a) {
    if constexpr (kIntegral<decltype(a)>) return a;
    else return std::nearbyint(a);
  });
}
// Toward zero, like torch.trunc (and torch.fix).
void trunc_cpu(const Tensor& out, const Tensor& self) {
  numeric_op("trunc", out, self, [](auto a) {
    if constexpr (kIntegral<decltype(a)>) return a;
    else return std::trunc(a);
  });
}

void sign_cpu(const Tensor& out, const Tensor& self) {
  if (out.dtype() == kBool) {
    unary_kernel<bool>(out, cast_inputs(kBool, self)[0], [](bool a) { return a; });
    return;
  }
  numeric_op("sign", out, self, [](auto a) {
    using A = decltype(a);
    return static_cast<A>((A(0) < a) - (a < A(0)));
  });
}

// x: (*) any dtype -> (*) bool
void logical_not_cpu(const Tensor& out, const Tensor& self) {
  unary_kernel<bool>(out, cast_inputs(kBool, self)[0], [](bool a) { return !a; });
}

// out = min(max(self, min), max); nan stays nan; min > max gives max (as PyTorch).
void clamp_cpu(const Tensor& out, const Tensor& self, const std::optional<Scalar>& min,
               const std::optional<Scalar>& max) {
  Tensor x = cast_inputs(out.dtype(), self)[0];
  KILN_DISPATCH_NUMERIC_TYPES(out.dtype(), "clamp", [&] {
    using T = scalar_t;
    using C = std::conditional_t<kReduced<T>, float, T>;
    C lo = min ? min->to<C>() : std::numeric_limits<C>::lowest();
    C hi = max ? max->to<C>() : std::numeric_limits<C>::max();
    if constexpr (std::is_floating_point_v<C>) {
      if (!min) lo = -std::numeric_limits<C>::infinity();
      if (!max) hi = std::numeric_limits<C>::infinity();
    }
    unary_kernel<T>(out, x, [lo, hi](T v) { return T(math::clamp(static_cast<C>(v), lo, hi)); });
  });
}

KILN_LIBRARY(CPU, m) {
  m.structured<ops::neg>(neg_cpu);
  m.structured<ops::abs>(abs_cpu);
  m.structured<ops::exp>(exp_cpu);
  m.structured<ops::log>(log_cpu);
  m.structured<ops::log1p>(log1p_cpu);
  m.structured<ops::expm1>(expm1_cpu);
  m.structured<ops::sqrt>(sqrt_cpu);
  m.structured<ops::rsqrt>(rsqrt_cpu);
  m.structured<ops::sin>(sin_cpu);
  m.structured<ops::cos>(cos_cpu);
  m.structured<ops::tanh>(tanh_cpu);
  m.structured<ops::sigmoid>(sigmoid_cpu);
  m.structured<ops::relu>(relu_cpu);
  m.structured<ops::threshold_backward>(threshold_backward_cpu);
  m.structured<ops::gelu>(gelu_cpu);
  m.structured<ops::gelu_backward>(gelu_backward_cpu);
  m.structured<ops::silu>(silu_cpu);
  m.structured<ops::erf>(erf_cpu);
  m.structured<ops::floor>(floor_cpu);
  m.structured<ops::ceil>(ceil_cpu);
  m.structured<ops::round>(round_cpu);
  m.structured<ops::trunc>(trunc_cpu);
  m.structured<ops::sign>(sign_cpu);
  m.structured<ops::reciprocal>(reciprocal_cpu);
  m.structured<ops::logical_not>(logical_not_cpu);
  m.structured<ops::clamp>(clamp_cpu);
}

}  // namespace
}  // namespace kiln::kernels
