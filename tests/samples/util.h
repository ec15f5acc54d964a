// tests/samples/util.h: the GoogleTest-free helpers of the tests (the op samples, the
// conformance driver, kiln_gpu_tests and the GoogleTest suites through tests/test_util.h).
//
//   Tensor a = testing::random({3, 4}, kFloat64);          // deterministic, from std::mt19937
//   Tensor b = testing::from_vector<float>({1, 2, 3, 4}, {2, 2});
//   Tensor nc = testing::non_contiguous(a);                 // same values, transposed storage
//   std::vector<double> v = testing::to_doubles(t);        // any dtype, any layout
#pragma once

#include <cmath>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "kiln/ivalue.h"
#include "kiln/kiln.h"

namespace kiln::testing {

// Values of `t` in row-major order, as double (reads any dtype, layout and offset).
inline std::vector<double> to_doubles(const Tensor& t) {
  Tensor c = t.to(std::nullopt, Device(kCPU)).contiguous();
  std::vector<double> out(c.numel());
  KILN_DISPATCH_ALL_TYPES(c.dtype(), "to_doubles", [&] {
    const auto* p = static_cast<const scalar_t*>(c.data_ptr());
    for (int64_t i = 0; i < c.numel(); ++i) out[i] = static_cast<double>(static_cast<float>(p[i]));
    if constexpr (std::is_same_v<scalar_t, double> || std::is_same_v<scalar_t, int64_t>)
      for (int64_t i = 0; i < c.numel(); ++i) out[i] = static_cast<double>(p[i]);
  });
  return out;
}

template <typename T>
Tensor from_vector(const std::vector<T>& v, IntArrayRef sizes) {
  Tensor t = empty_on(sizes, CppTypeToScalarType<T>::value, kCPU);
  KILN_ASSERT(static_cast<int64_t>(v.size()) == t.numel());
  std::copy(v.begin(), v.end(), static_cast<T*>(t.data_ptr()));
  return t;
}

// Uniform values in [lo, hi) (integers: lo..hi-1), deterministic for a given seed.
inline Tensor random(IntArrayRef sizes, ScalarType dtype = kFloat32, double lo = -2, double hi = 2,
                     uint32_t seed = 1234) {
  std::mt19937 gen(seed);
  Tensor t = empty_on(sizes, dtype, kCPU);
  KILN_DISPATCH_ALL_TYPES(dtype, "random", [&] {
    auto* p = static_cast<scalar_t*>(t.data_ptr());
    for (int64_t i = 0; i < t.numel(); ++i) {
      if constexpr (std::is_same_v<scalar_t, bool>) {
        p[i] = gen() & 1;
      } else if constexpr (std::is_integral_v<scalar_t>) {
        std::uniform_int_distribution<int64_t> d(static_cast<int64_t>(lo), static_cast<int64_t>(hi) - 1);
        p[i] = static_cast<scalar_t>(d(gen));
      } else {
        std::uniform_real_distribution<double> d(lo, hi);
        p[i] = static_cast<scalar_t>(static_cast<float>(d(gen)));
        if constexpr (std::is_same_v<scalar_t, double>) p[i] = d(gen);
      }
    }
  });
  return t;
}

// A tensor equal to `t` whose layout is not contiguous (a transposed copy viewed back).
inline Tensor non_contiguous(const Tensor& t) {
  if (t.dim() == 0) return t;
  DimVector big(t.sizes());
  big.back() *= 2;
  Tensor wide = empty_on(big, t.dtype(), t.device());
  Tensor v = wide.slice(-1, 0, std::nullopt, 2);
  v.copy_(t);
  KILN_ASSERT(t.numel() <= 1 || !v.is_contiguous());
  return v;
}

// Tolerances suited to a dtype (float16/bfloat16 are coarse).
inline double rtol_for(ScalarType t) {
  switch (t) {
    case kFloat16: return 2e-3;
    case kBFloat16: return 1.6e-2;
    case kFloat32: return 1e-5;
    default: return 1e-9;
  }
}

// The dtypes of a dtype set of tensor/ops/rules.toml ("all", "floating", ...).
std::vector<ScalarType> dtypes_of_set(const std::string& set_name);

// Calls f(index) for every multi-index of `shape`, row-major (reference implementations).
inline void for_each_index(IntArrayRef shape, const std::function<void(const std::vector<int64_t>&)>& f) {
  std::vector<int64_t> idx(shape.size(), 0);
  if (numel_of(shape) == 0) return;
  while (true) {
    f(idx);
    int64_t d = static_cast<int64_t>(shape.size()) - 1;
    for (; d >= 0; --d) {
      if (++idx[d] < shape[d]) break;
      idx[d] = 0;
    }
    if (d < 0) return;
  }
}

// A boxed sample with floating tensors (and floating dtype arguments) in float64; others stay.
inline Stack to_float64(const Stack& s) {
  auto as_f64 = [](const Tensor& t) { return is_floating(t.dtype()) ? t.to(kFloat64) : t; };
  Stack out;
  for (const IValue& v : s) {
    if (v.is_tensor()) {
      out.emplace_back(as_f64(v.to_tensor()));
    } else if (v.is_tensor_list()) {
      std::vector<Tensor> ts;
      for (const Tensor& t : v.to_tensor_list()) ts.push_back(as_f64(t));
      out.emplace_back(std::move(ts));
    } else if (v.is<ScalarType>() && is_floating(v.get<ScalarType>())) {
      out.emplace_back(kFloat64);
    } else {
      out.push_back(v);
    }
  }
  return out;
}

// The tensors a boxed call left on its stack, flattened (lists expanded).
inline std::vector<Tensor> outputs_of(const Stack& s) {
  std::vector<Tensor> out;
  for (const IValue& v : s) {
    if (v.is_tensor()) out.push_back(v.to_tensor());
    if (v.is_tensor_list())
      for (const Tensor& t : v.to_tensor_list()) out.push_back(t);
  }
  return out;
}

// Row-major flat position of `idx` in a tensor of `sizes`.
inline int64_t flat(IntArrayRef sizes, const std::vector<int64_t>& idx) {
  int64_t f = 0;
  for (size_t d = 0; d < sizes.size(); ++d) f = f * sizes[d] + idx[d];
  return f;
}

}  // namespace kiln::testing
