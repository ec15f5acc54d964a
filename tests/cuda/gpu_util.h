// tests/cuda/gpu_util.h: host-side helpers for kiln_gpu_tests that read and write CPU tensors
// element by element, without going through CPU kernels.
//
//   Tensor h = host_tensor(kFloat16, {3, 4}, 7);         // deterministic values, CPU
//   Tensor v = host_strided_view(h);                      // same values, non-contiguous CPU view
//   std::vector<double> got = values(cuda_tensor);        // any device, dtype and layout
//   double want = round_to(kFloat16, 0.1);                // a double as the dtype stores it
#pragma once

#include <cstring>
#include <random>
#include <vector>

#include "kiln/kiln.h"

namespace kiln::gputest {

inline std::vector<ScalarType> all_dtypes() {
  return {kBool, kUInt8, kInt8, kInt16, kInt32, kInt64, kFloat16, kBFloat16, kFloat32, kFloat64};
}

// Reads element at `off` (in elements) of a CPU tensor's storage as double.
inline double read_at(const Tensor& t, int64_t off) {
  double v = 0;
  KILN_DISPATCH_ALL_TYPES(t.dtype(), "read_at", [&] {
    scalar_t x;
    std::memcpy(&x, static_cast<const char*>(t.impl()->raw_data()) + off * sizeof(scalar_t), sizeof x);
    if constexpr (std::is_same_v<scalar_t, Half> || std::is_same_v<scalar_t, BFloat16>) {
      v = static_cast<float>(x);
    } else {
      v = static_cast<double>(x);
    }
  });
  return v;
}

// A double stored as dtype `t` and read back (the CPU conversion rules).
inline double round_to(ScalarType t, double v) {
  double r = 0;
  KILN_DISPATCH_ALL_TYPES(t, "round_to", [&] {
    if constexpr (std::is_same_v<scalar_t, bool>) {
      r = v != 0;
    } else if constexpr (std::is_same_v<scalar_t, Half> || std::is_same_v<scalar_t, BFloat16>) {
      r = static_cast<float>(scalar_t(static_cast<float>(v)));
    } else {
      r = static_cast<double>(static_cast<scalar_t>(v));
    }
  });
  return r;
}

// Row-major element offsets (in elements) of every element of `t`.
inline std::vector<int64_t> offsets(const Tensor& t) {
  std::vector<int64_t> out;
  out.reserve(t.numel());
  std::vector<int64_t> idx(t.dim(), 0);
  for (int64_t i = 0; i < t.numel(); ++i) {
    int64_t off = 0;
    for (int64_t d = 0; d < t.dim(); ++d) off += idx[d] * t.stride(d);
    out.push_back(off);
    for (int64_t d = t.dim() - 1; d >= 0; --d) {
      if (++idx[d] < t.size(d)) break;
      idx[d] = 0;
    }
  }
  return out;
}

// Values of `t` in row-major order as double; CUDA tensors are copied to the CPU first.
inline std::vector<double> values(const Tensor& t) {
  Tensor c = t.device().is_cuda() ? t.to(std::nullopt, Device(kCPU)) : t;
  std::vector<double> out;
  for (int64_t off : offsets(c)) out.push_back(read_at(c, off));
  return out;
}

// Writes `v` (row-major) into CPU tensor `t` of any layout, converting to its dtype.
inline void write_values(const Tensor& t, const std::vector<double>& v) {
  std::vector<int64_t> offs = offsets(t);
  KILN_DISPATCH_ALL_TYPES(t.dtype(), "write_values", [&] {
    auto* p = static_cast<scalar_t*>(t.impl()->raw_data());
    for (size_t i = 0; i < offs.size(); ++i) {
      if constexpr (std::is_same_v<scalar_t, bool>) {
        p[offs[i]] = v[i] != 0;
      } else if constexpr (std::is_same_v<scalar_t, Half> || std::is_same_v<scalar_t, BFloat16>) {
        p[offs[i]] = scalar_t(static_cast<float>(v[i]));
      } else {
        p[offs[i]] = static_cast<scalar_t>(v[i]);
      }
    }
  });
}

// Deterministic values valid for every dtype: small integers (and halves for floats).
inline std::vector<double> sample_values(ScalarType t, int64_t n, uint32_t seed) {
  std::mt19937 gen(seed);
  std::vector<double> v(n);
  for (auto& x : v) {
    int r = static_cast<int>(gen() % 41) - 20;  // -20..20
    if (t == kBool) x = r > 0;
    else if (t == kUInt8) x = r + 20;
    else if (is_floating(t)) x = r * 0.5;
    else x = r;
  }
  return v;
}

inline Tensor host_tensor(ScalarType t, IntArrayRef sizes, uint32_t seed) {
  Tensor h = empty_on(sizes, t, kCPU);
  write_values(h, sample_values(t, h.numel(), seed));
  return h;
}

// A non-contiguous view of a fresh buffer on `device` holding `src`'s values (every other
// element of a last dim twice as wide). CPU views are written on the host; CUDA ones through
// copy_ (which exercises the strided H2D path).
inline Tensor strided_copy_of(const Tensor& src, Device device) {
  DimVector big(src.sizes());
  big.back() *= 2;
  Tensor wide = kiln::empty(big, src.dtype(), device);
  Tensor v = wide.slice(-1, 0, std::nullopt, 2);
  if (device.is_cpu()) {
    write_values(v, values(src));
  } else {
    v.copy_(src);
  }
  return v;
}

// Row-major index of `i` (over out_sizes) into a tensor of `sizes` broadcast to it.
inline int64_t broadcast_index(int64_t i, IntArrayRef out_sizes, IntArrayRef sizes) {
  int64_t idx = 0, stride = 1;
  int64_t off = static_cast<int64_t>(out_sizes.size()) - static_cast<int64_t>(sizes.size());
  for (int64_t d = static_cast<int64_t>(out_sizes.size()) - 1; d >= 0; --d) {
    int64_t c = i % out_sizes[d];
    i /= out_sizes[d];
    if (d - off >= 0) {
      int64_t sd = sizes[d - off];
      idx += (sd == 1 ? 0 : c) * stride;
      stride *= sd;
    }
  }
  return idx;
}

}  // namespace kiln::gputest
