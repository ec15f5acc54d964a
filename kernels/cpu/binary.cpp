// Binary pointwise kernels on the CPU (tensor/ops/pointwise.toml): x, y broadcastable to out's
// shape -> out. `out` has the result dtype the meta function chose (bool for comparisons and
// logical ops); inputs are cast to the compute dtype first (cast_inputs). Integer arithmetic
// goes through kiln/scalar_math.h: it wraps and never traps (See Note [Integer edge values]);
// the floating formulas CUDA shares are kiln/pointwise_math.h's (See Note [One home per formula]).
#include <atomic>
#include <cmath>
#include <type_traits>

#include "kiln/generated/ops/pointwise.h"
#include "kiln/pointwise_math.h"
#include "kiln/scalar_math.h"
#include "loops.h"
#include "strided.h"

namespace kiln::kernels {
namespace {

template <typename T>
constexpr bool kReduced = std::is_same_v<T, Half> || std::is_same_v<T, BFloat16>;

// out = f(x, y) in T; float16/bfloat16 compute in float. f is generic.
template <typename T, typename F>
void binary_op(const Tensor& out, const Tensor& x, const Tensor& y, const F& f) {
  if constexpr (kReduced<T>) {
    binary_kernel<T>(out, x, y, [&](T a, T b) { return T(f(float(a), float(b))); });
  } else {
    binary_kernel<T>(out, x, y, [&](T a, T b) { return static_cast<T>(f(a, b)); });
  }
}

// Integer division by zero raises ZeroDivisionError like PyTorch. Kernels run inside OpenMP
// regions, which an exception must not leave: the lambda records the event, the caller throws.
struct ZeroFlag {
  mutable std::atomic<bool> hit{false};
  void set() const { hit.store(true, std::memory_order_relaxed); }
  void check(const char* op) const {
    KILN_CHECK(!hit.load(), Runtime, op, ": ZeroDivisionError (integer division by zero)");
  }
};

// x: broadcastable to out, y: broadcastable to out -> out = x + alpha * y
void add_cpu(const Tensor& out, const Tensor& self, const Tensor& other, const Scalar& alpha) {
  auto in = cast_inputs(out.dtype(), self, other);
  KILN_DISPATCH_ALL_TYPES(out.dtype(), "add", [&] {
    using T = scalar_t;
    if constexpr (std::is_same_v<T, bool>) {
      binary_kernel<T>(out, in[0], in[1], [](T a, T b) { return a || b; });
    } else if constexpr (kReduced<T>) {
      float al = alpha.to<float>();
      binary_kernel<T>(out, in[0], in[1], [al](T a, T b) { return T(float(a) + al * float(b)); });
    } else {
      T al = alpha.to<T>();
      if (al == T(1)) {
        binary_kernel<T>(out, in[0], in[1], [](T a, T b) { return wrapping_add(a, b); });
      } else {
        binary_kernel<T>(out, in[0], in[1],
                         [al](T a, T b) { return wrapping_add(a, wrapping_mul(al, b)); });
      }
    }
  });
}

// out = x - alpha * y (no bool: the meta function rejects it)
void sub_cpu(const Tensor& out, const Tensor& self, const Tensor& other, const Scalar& alpha) {
  auto in = cast_inputs(out.dtype(), self, other);
  KILN_DISPATCH_NUMERIC_TYPES(out.dtype(), "sub", [&] {
    using T = scalar_t;
    using C = std::conditional_t<kReduced<T>, float, T>;
    C al = alpha.to<C>();
    if (al == C(1)) binary_op<T>(out, in[0], in[1], [](C a, C b) { return wrapping_sub(a, b); });
    else binary_op<T>(out, in[0], in[1], [al](C a, C b) { return wrapping_sub(a, wrapping_mul(al, b)); });
  });
}

void mul_cpu(const Tensor& out, const Tensor& self, const Tensor& other) {
  auto in = cast_inputs(out.dtype(), self, other);
  KILN_DISPATCH_ALL_TYPES(out.dtype(), "mul", [&] {
    using T = scalar_t;
    if constexpr (std::is_same_v<T, bool>) binary_kernel<T>(out, in[0], in[1], [](T a, T b) { return a && b; });
    else binary_op<T>(out, in[0], in[1], [](auto a, auto b) { return wrapping_mul(a, b); });
  });
}

template <typename T>
void div_rounding(const Tensor& out, const CastInputs<2>& in, bool trunc, const ZeroFlag& zero) {
  if constexpr (std::is_integral_v<T>) {
    binary_kernel<T>(out, in[0], in[1], [&zero, trunc](T a, T b) -> T {
      if (b == 0) {
        zero.set();
        return 0;
      }
      return trunc ? int_div_trunc(a, b) : int_div_floor(a, b);
    });
  } else if (trunc) {
    binary_op<T>(out, in[0], in[1], [](auto a, auto b) { return std::trunc(a / b); });
  } else {
    binary_op<T>(out, in[0], in[1], [](auto a, auto b) { return math::div_floor(a, b); });
  }
}

// out = x / y; rounding_mode None (true division, float out), 'trunc' or 'floor'.
void div_cpu(const Tensor& out, const Tensor& self, const Tensor& other,
             std::optional<std::string_view> rounding_mode) {
  auto in = cast_inputs(out.dtype(), self, other);
  if (!rounding_mode) {
    KILN_DISPATCH_FLOAT_TYPES(out.dtype(), "div", [&] {
      binary_op<scalar_t>(out, in[0], in[1], [](auto a, auto b) { return a / b; });
    });
    return;
  }
  bool trunc = *rounding_mode == "trunc";
  ZeroFlag zero;
  KILN_DISPATCH_NUMERIC_TYPES(out.dtype(), "div", [&] { div_rounding<scalar_t>(out, in, trunc, zero); });
  zero.check("div");
}

// maximum/minimum propagate nan.
void maximum_cpu(const Tensor& out, const Tensor& self, const Tensor& other) {
  auto in = cast_inputs(out.dtype(), self, other);
  KILN_DISPATCH_ALL_TYPES(out.dtype(), "maximum", [&] {
    binary_op<scalar_t>(out, in[0], in[1], [](auto a, auto b) { return math::maximum(a, b); });
  });
}
void minimum_cpu(const Tensor& out, const Tensor& self, const Tensor& other) {
  auto in = cast_inputs(out.dtype(), self, other);
  KILN_DISPATCH_ALL_TYPES(out.dtype(), "minimum", [&] {
    binary_op<scalar_t>(out, in[0], in[1], [](auto a, auto b) { return math::minimum(a, b); });
  });
}

template <typename T>
void pow_typed(const Tensor& out, const CastInputs<2>& in) {
  if constexpr (std::is_integral_v<T>) binary_kernel<T>(out, in[0], in[1], [](T a, T b) { return int_pow(a, b); });
  else binary_op<T>(out, in[0], in[1], [](auto a, auto b) { return std::pow(a, b); });
}

void pow_cpu(const Tensor& out, const Tensor& self, const Tensor& exponent) {
  auto in = cast_inputs(out.dtype(), self, exponent);
  KILN_DISPATCH_NUMERIC_TYPES(out.dtype(), "pow", [&] { pow_typed<scalar_t>(out, in); });
}

// fmod: the remainder has the sign of x (C fmod); remainder: the sign of y (Python %).
template <bool kPython, typename T>
void mod_typed(const Tensor& out, const CastInputs<2>& in, const ZeroFlag& zero) {
  if constexpr (std::is_integral_v<T>) {
    binary_kernel<T>(out, in[0], in[1], [&zero](T a, T b) -> T {
      if (b == 0) {
        zero.set();
        return 0;
      }
      return kPython ? int_mod_floor(a, b) : int_mod_trunc(a, b);
    });
  } else {
    binary_op<T>(out, in[0], in[1], [](auto a, auto b) {
      return kPython ? math::python_mod(a, b) : math::fmod(a, b);
    });
  }
}

template <bool kPython>
void mod_cpu(const char* name, const Tensor& out, const Tensor& self, const Tensor& other) {
  auto in = cast_inputs(out.dtype(), self, other);
  ZeroFlag zero;
  KILN_DISPATCH_NUMERIC_TYPES(out.dtype(), name, [&] { mod_typed<kPython, scalar_t>(out, in, zero); });
  zero.check(name);
}
void fmod_cpu(const Tensor& out, const Tensor& self, const Tensor& other) {
  mod_cpu<false>("fmod", out, self, other);
}
void remainder_cpu(const Tensor& out, const Tensor& self, const Tensor& other) {
  mod_cpu<true>("remainder", out, self, other);
}

// Comparisons: compare in result_type(x, y) -> bool out.
template <typename Cmp>
void compare_cpu(const char* name, const Tensor& out, const Tensor& self, const Tensor& other, Cmp cmp) {
  ScalarType ct = result_type({self, other});
  auto in = cast_inputs(ct, self, other);
  KILN_DISPATCH_ALL_TYPES(ct, name, [&] {
    using T = scalar_t;
    using C = std::conditional_t<kReduced<T>, float, T>;
    auto f = [&](T a, T b) -> bool { return cmp(static_cast<C>(a), static_cast<C>(b)); };
    binary_kernel<T, decltype(f), bool>(out, in[0], in[1], f);
  });
}

#define KILN_COMPARE(NAME, OP)                                                          \
  void NAME##_cpu(const Tensor& out, const Tensor& self, const Tensor& other) {        \
    compare_cpu(#NAME, out, self, other, [](auto a, auto b) { return a OP b; });        \
  }
KILN_COMPARE(eq, ==)
KILN_COMPARE(ne, !=)
KILN_COMPARE(lt, <)
KILN_COMPARE(le, <=)
KILN_COMPARE(gt, >)
KILN_COMPARE(ge, >=)
#undef KILN_COMPARE

// Logical ops: inputs as bool (nonzero, nan included, is true) -> bool out.
template <typename F>
void logical_cpu(const Tensor& out, const Tensor& self, const Tensor& other, F f) {
  auto in = cast_inputs(kBool, self, other);
  binary_kernel<bool>(out, in[0], in[1], f);
}
void logical_and_cpu(const Tensor& out, const Tensor& self, const Tensor& other) {
  logical_cpu(out, self, other, [](bool a, bool b) { return a && b; });
}
void logical_or_cpu(const Tensor& out, const Tensor& self, const Tensor& other) {
  logical_cpu(out, self, other, [](bool a, bool b) { return a || b; });
}
void logical_xor_cpu(const Tensor& out, const Tensor& self, const Tensor& other) {
  logical_cpu(out, self, other, [](bool a, bool b) { return a != b; });
}

// condition: bool, x, y: all broadcastable to out -> out = condition ? x : y
void where_cpu(const Tensor& out, const Tensor& condition, const Tensor& self, const Tensor& other) {
  if (out.numel() == 0) return;
  auto in = cast_inputs(out.dtype(), self, other);
  const int64_t total = out.numel();
  if (out.is_contiguous() && condition.is_contiguous() && condition.numel() == total &&
      in[0].is_contiguous() && in[0].numel() == total && in[1].is_contiguous() &&
      in[1].numel() == total) {
    // The common case (relu's backward): a select of bit patterns under a mask made from the
    // condition, which the compiler vectorizes (a branch on `c[i]` it does not, and random
    // conditions mispredict).
    dispatch_word(out.element_size(), [&](auto word) {
      using U = decltype(word);
      U* const o0 = static_cast<U*>(out.impl()->raw_data());
      const uint8_t* const c0 = static_cast<const uint8_t*>(condition.impl()->raw_data());
      const U* const x0 = static_cast<const U*>(in[0].impl()->raw_data());
      const U* const y0 = static_cast<const U*>(in[1].impl()->raw_data());
      parallel_for(total, kGrainSize, [&](int64_t b, int64_t e) {
        U* __restrict o = o0;
        const uint8_t* __restrict c = c0;
        const U* __restrict x = x0;
        const U* __restrict y = y0;
        for (int64_t i = b; i < e; ++i) {
          const U m = U(0) - U(c[i] != 0);
          o[i] = (x[i] & m) | (y[i] & ~m);
        }
      });
    });
    return;
  }
  KILN_DISPATCH_ALL_TYPES(out.dtype(), "where", [&] {
    using T = scalar_t;
    StridedIter<4> it({&out, &condition, &in[0], &in[1]});
    it.run([](const std::array<char*, 4>& p, const std::array<int64_t, 4>& s, int64_t n) {
      for (int64_t i = 0; i < n; ++i) {
        bool c = *reinterpret_cast<const bool*>(p[1] + i * s[1]);
        *reinterpret_cast<T*>(p[0] + i * s[0]) =
            *reinterpret_cast<const T*>(c ? p[2] + i * s[2] : p[3] + i * s[3]);
      }
    });
  });
}

KILN_LIBRARY(CPU, m) {
  m.structured<ops::add>(add_cpu);
  m.structured<ops::sub>(sub_cpu);
  m.structured<ops::mul>(mul_cpu);
  m.structured<ops::div>(div_cpu);
  m.structured<ops::maximum>(maximum_cpu);
  m.structured<ops::minimum>(minimum_cpu);
  m.structured<ops::pow>(pow_cpu);
  m.structured<ops::fmod>(fmod_cpu);
  m.structured<ops::remainder>(remainder_cpu);
  m.structured<ops::eq>(eq_cpu);
  m.structured<ops::ne>(ne_cpu);
  m.structured<ops::lt>(lt_cpu);
  m.structured<ops::le>(le_cpu);
  m.structured<ops::gt>(gt_cpu);
  m.structured<ops::ge>(ge_cpu);
  m.structured<ops::logical_and>(logical_and_cpu);
  m.structured<ops::logical_or>(logical_or_cpu);
  m.structured<ops::logical_xor>(logical_xor_cpu);
  m.structured<ops::where>(where_cpu);
}

}  // namespace
}  // namespace kiln::kernels
