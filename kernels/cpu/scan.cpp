// cumsum and cumprod on the CPU (tensor/ops/sort.toml). self is cast to the output dtype and
// viewed as (outer, n, inner) along dim; the running sum/product is kept in the accumulation
// type (float for float16/bfloat16, int64 for integers) and rounded once per output element.
#include <algorithm>
#include <vector>

#include "kiln/generated/ops/sort.h"
#include "kiln/meta.h"
#include "kiln/scalar_math.h"
#include "loops.h"

namespace kiln::kernels {
namespace {

// x, out: (outer, n, inner) contiguous, of type T; the running value is kept in A.
template <bool kProd, typename T, typename A>
void scan_loop(const T* x, T* out, int64_t outer, int64_t n, int64_t inner) {
  parallel_for(outer, std::max<int64_t>(1, kGrainSize / (n * inner)), [&](int64_t o0, int64_t o1) {
    std::vector<A> acc(inner);
    for (int64_t o = o0; o < o1; ++o) {
      const T* src = x + o * n * inner;
      T* dst = out + o * n * inner;
      std::fill(acc.begin(), acc.end(), A(kProd ? 1 : 0));
      for (int64_t i = 0; i < n; ++i) {
#pragma omp simd
        for (int64_t j = 0; j < inner; ++j) {
          if constexpr (kProd)  // integers wrap (See Note [Integer edge values])
            acc[j] = wrapping_mul(acc[j], static_cast<A>(src[i * inner + j]));
          else
            acc[j] = wrapping_add(acc[j], static_cast<A>(src[i * inner + j]));
          dst[i * inner + j] = static_cast<T>(acc[j]);
        }
      }
    }
  });
}

template <bool kProd>
void scan_cpu(const Tensor& out, const Tensor& self, int64_t dim, std::optional<ScalarType>) {
  if (out.numel() == 0) return;
  const char* op = kProd ? "cumprod" : "cumsum";
  const int64_t d = meta::wrap_dim(op, dim, self.dim());
  KILN_ASSERT(out.is_contiguous(), op, ": expected a contiguous output");
  Tensor x = self.to(out.dtype()).contiguous();
  int64_t outer = 1, inner = 1;
  const int64_t n = self.dim() == 0 ? 1 : self.size(d);
  for (int64_t k = 0; k < d; ++k) outer *= self.size(k);
  for (int64_t k = d + 1; k < self.dim(); ++k) inner *= self.size(k);
  KILN_DISPATCH_ALL_TYPES(out.dtype(), op, [&] {
    using T = scalar_t;
    scan_loop<kProd, T, acc_t<T>>(static_cast<const T*>(x.impl()->raw_data()),
                                  static_cast<T*>(out.impl()->raw_data()), outer, n, inner);
  });
}

KILN_LIBRARY(CPU, m) {
  m.structured<ops::cumsum>(scan_cpu<false>);
  m.structured<ops::cumprod>(scan_cpu<true>);
}

}  // namespace
}  // namespace kiln::kernels
