// copy_ (every dtype pair, broadcasting src) and fill_ on the CPU. Values convert with
// kiln::convert (See Note [Float to integer casts]).
#include <cstring>

#include "kiln/dispatcher.h"
#include "kiln/generated/meta/copy.h"
#include "kiln/generated/ops/copy.h"
#include "kiln/generated/ops/creation.h"
#include "kiln/scalar_math.h"
#include "loops.h"
#include "strided.h"

namespace kiln::kernels {
namespace {

// Note [Transposing copies]: when the source's unit-stride dim is not the destination's innermost
// one (x.t().contiguous(), (B, H, T, D) -> (B, T, H, D)), the element loop reads the source with a
// large stride: a cache line per element. Such copies go by kTile x kTile tiles instead, so every
// line read and written is used whole. `it` is the coalesced (dst, src) iteration; false when the
// copy does not have that form.
template <typename U>
bool copy_transposed(const StridedIter<2>& it) {
  constexpr int64_t kTile = 32, es = sizeof(U);
  const int64_t nd = static_cast<int64_t>(it.shape.size()), last = nd - 1;
  if (nd < 2 || it.strides[0][last] != es || it.strides[1][last] == es) return false;
  int64_t a = last - 1;  // the source's unit-stride dim
  while (a >= 0 && it.strides[1][a] != es) --a;
  if (a < 0 || it.shape[a] < kTile / 2 || it.shape[last] < kTile / 2) return false;
  // rows (dim a): unit stride in src, d0 in dst; columns (the last dim): unit in dst, s1 in src.
  const int64_t n0 = it.shape[a], n1 = it.shape[last];
  const int64_t d0 = it.strides[0][a] / es, s1 = it.strides[1][last] / es;
  DimVector outer_shape;
  std::array<DimVector, 2> outer_st;
  for (int64_t d = 0; d < last; ++d) {
    if (d == a) continue;
    outer_shape.push_back(it.shape[d]);
    for (int k = 0; k < 2; ++k) outer_st[k].push_back(it.strides[k][d]);
  }
  const int64_t row_tiles = (n0 + kTile - 1) / kTile, outer = numel_of(outer_shape);
  parallel_for(outer * row_tiles, std::max<int64_t>(1, kGrainSize / (kTile * n1)),
               [&](int64_t t0, int64_t t1) {
                 for (int64_t t = t0; t < t1; ++t) {
                   std::array<char*, 2> p = it.base;
                   for (int64_t d = static_cast<int64_t>(outer_shape.size()) - 1, rem = t / row_tiles;
                        d >= 0; --d) {
                     for (int k = 0; k < 2; ++k) p[k] += (rem % outer_shape[d]) * outer_st[k][d];
                     rem /= outer_shape[d];
                   }
                   U* dst = reinterpret_cast<U*>(p[0]);
                   const U* src = reinterpret_cast<const U*>(p[1]);
                   const int64_t i0 = (t % row_tiles) * kTile, i1 = std::min(n0, i0 + kTile);
                   for (int64_t j0 = 0; j0 < n1; j0 += kTile) {
                     const int64_t j1 = std::min(n1, j0 + kTile);
                     for (int64_t i = i0; i < i1; ++i)
                       for (int64_t j = j0; j < j1; ++j) dst[i * d0 + j] = src[i + j * s1];
                   }
                 }
               });
  return true;
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
  if (self.dtype() == src.dtype()) {
    bool done = false;
    dispatch_word(self.element_size(), [&](auto word) { done = copy_transposed<decltype(word)>(it); });
    if (done) return self;
    // Same dtype: move bit patterns, a run at a time where both sides are dense.
    dispatch_word(self.element_size(), [&](auto word) {
      using U = decltype(word);
      it.run([](const std::array<char*, 2>& p, const std::array<int64_t, 2>& st, int64_t n) {
        if (st[0] == sizeof(U) && st[1] == sizeof(U)) return (void)std::memcpy(p[0], p[1], n * sizeof(U));
        for (int64_t i = 0; i < n; ++i)
          *reinterpret_cast<U*>(p[0] + i * st[0]) = *reinterpret_cast<const U*>(p[1] + i * st[1]);
      });
    });
    return self;
  }
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
