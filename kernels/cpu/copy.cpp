// copy_ (every dtype pair, broadcasting src) and fill_ on the CPU.
#include <cstring>

#include "kiln/dispatcher.h"
#include "kiln/generated/meta_decls.h"
#include "kiln/generated/op_handles.h"
#include "loops.h"

namespace kiln::kernels {
namespace {

template <typename D, typename S>
inline D convert(S v) {
  if constexpr (std::is_same_v<D, bool>) return static_cast<float>(v) != 0.0f || v != S(0);
  else if constexpr (std::is_same_v<D, Half> || std::is_same_v<D, BFloat16>) return D(static_cast<float>(v));
  else if constexpr (std::is_same_v<S, Half> || std::is_same_v<S, BFloat16>) return static_cast<D>(static_cast<float>(v));
  else return static_cast<D>(v);
}

Tensor copy_cpu(const Tensor& self, const Tensor& src, bool) {
  KILN_CHECK(self.device().is_cpu() && src.device().is_cpu(), Value, "copy_: CPU kernel got ",
             self.device(), " <- ", src.device());
  meta::copy_(self, src, false);
  if (self.numel() == 0 || self.is_same(src)) return self;
  if (self.dtype() == src.dtype() && self.is_contiguous() && src.is_contiguous() &&
      self.numel() == src.numel()) {
    char* d = static_cast<char*>(self.impl()->raw_data());
    const char* s = static_cast<const char*>(src.impl()->raw_data());
    int64_t nbytes = self.numel() * self.element_size();
    if (d != s)
      parallel_for(nbytes, 1 << 20, [&](int64_t b, int64_t e) { std::memmove(d + b, s + b, e - b); });
    return self;
  }
  StridedIter<2> it({&self, &src});
  KILN_DISPATCH_ALL_TYPES(self.dtype(), "copy_", [&] {
    using D = scalar_t;
    KILN_DISPATCH_ALL_TYPES(src.dtype(), "copy_", [&] {
      using S = scalar_t;
      it.run([](const std::array<char*, 2>& p, const std::array<int64_t, 2>& st, int64_t n) {
        for (int64_t i = 0; i < n; ++i)
          *reinterpret_cast<D*>(p[0] + i * st[0]) = convert<D>(*reinterpret_cast<const S*>(p[1] + i * st[1]));
      });
    });
  });
  return self;
}

Tensor fill_cpu(const Tensor& self, const Scalar& value) {
  KILN_DISPATCH_ALL_TYPES(self.dtype(), "fill_", [&] {
    scalar_t v = value.to<scalar_t>();
    if constexpr (std::is_same_v<scalar_t, bool>) v = value.to_bool();
    if (self.is_contiguous()) {
      auto* p = static_cast<scalar_t*>(self.impl()->raw_data());
      parallel_for(self.numel(), kGrainSize, [&](int64_t b, int64_t e) {
        for (int64_t i = b; i < e; ++i) p[i] = v;
      });
      return;
    }
    StridedIter<1> it({&self});
    it.run([&](const std::array<char*, 1>& p, const std::array<int64_t, 1>& st, int64_t n) {
      for (int64_t i = 0; i < n; ++i) *reinterpret_cast<scalar_t*>(p[0] + i * st[0]) = v;
    });
  });
  return self;
}

KILN_LIBRARY(CPU, m) {
  m.impl<ops::copy_>(copy_cpu);
  m.impl<ops::fill_>(fill_cpu);
}

}  // namespace
}  // namespace kiln::kernels
