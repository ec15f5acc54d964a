// cat, tril and triu on the CPU (tensor/ops/shape.toml).
#include <cstring>

#include "kiln/generated/meta_decls.h"
#include "kiln/generated/op_handles.h"
#include "kiln/meta.h"
#include "loops.h"

namespace kiln::kernels {
namespace {

// tensors[i]: (..., n_i, ...) -> out: (..., sum n_i, ...), out contiguous with out's dtype.
// Same-dtype contiguous inputs are copied as one memcpy per outer index; any other input goes
// through copy_ into its slice of out (casting and following strides).
void cat_cpu(const Tensor& out, TensorList tensors, int64_t dim) {
  if (out.numel() == 0) return;
  int64_t d = meta::wrap_dim("cat", dim, out.dim());
  int64_t outer = 1, inner = 1;
  for (int64_t k = 0; k < d; ++k) outer *= out.size(k);
  for (int64_t k = d + 1; k < out.dim(); ++k) inner *= out.size(k);
  const int64_t es = static_cast<int64_t>(out.element_size());
  const int64_t out_row = out.size(d) * inner * es;  // bytes of out per outer index
  char* o = static_cast<char*>(out.impl()->raw_data());
  int64_t offset = 0;
  for (const Tensor& t : tensors) {
    if (t.numel() == 0) continue;  // adds nothing (Note [Legacy empty cat inputs])
    int64_t len = t.size(d);
    if (out.is_contiguous() && t.is_contiguous() && t.dtype() == out.dtype()) {
      const int64_t chunk = len * inner * es;
      const char* src = static_cast<const char*>(t.impl()->raw_data());
      char* dst = o + offset * inner * es;
      parallel_for(outer, std::max<int64_t>(1, (int64_t{1} << 18) / chunk),
                   [&](int64_t b, int64_t e) {
                     for (int64_t i = b; i < e; ++i)
                       std::memcpy(dst + i * out_row, src + i * chunk, chunk);
                   });
    } else {
      out.narrow(d, offset, len).copy_(t);
    }
    offset += len;
  }
}

// self: (..., R, C) -> out: (..., R, C) keeping element (i, j) when j - i <= k (tril) or
// j - i >= k (triu), zero elsewhere. Any layouts (out may be self for tril_/triu_). Elements are
// moved as unsigned words of the dtype's size: zero bits are zero in every dtype.
template <typename U, bool kLower>
void triangular(const Tensor& out, const Tensor& self, int64_t k) {
  int64_t nd = self.dim(), R = self.size(-2), C = self.size(-1);
  if (out.numel() == 0) return;
  int64_t batch = out.numel() / (R * C);
  const U* s = static_cast<const U*>(self.impl()->raw_data());
  U* o = static_cast<U*>(out.impl()->raw_data());
  int64_t ssr = self.stride(-2), ssc = self.stride(-1), osr = out.stride(-2), osc = out.stride(-1);
  parallel_for(batch, std::max<int64_t>(1, kGrainSize / (R * C)), [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) {
      int64_t so = 0, oo = 0, rem = b;
      for (int64_t dd = nd - 3; dd >= 0; --dd) {
        int64_t idx = rem % self.size(dd);
        rem /= self.size(dd);
        so += idx * self.stride(dd);
        oo += idx * out.stride(dd);
      }
      for (int64_t i = 0; i < R; ++i) {
        for (int64_t j = 0; j < C; ++j) {
          bool keep = kLower ? (j - i <= k) : (j - i >= k);
          o[oo + i * osr + j * osc] = keep ? s[so + i * ssr + j * ssc] : U(0);
        }
      }
    }
  });
}

template <bool kLower>
void triangular_cpu(const Tensor& out, const Tensor& self, int64_t diagonal) {
  switch (out.element_size()) {
    case 1:
      return triangular<uint8_t, kLower>(out, self, diagonal);
    case 2:
      return triangular<uint16_t, kLower>(out, self, diagonal);
    case 4:
      return triangular<uint32_t, kLower>(out, self, diagonal);
    case 8:
      return triangular<uint64_t, kLower>(out, self, diagonal);
    default:
      KILN_ASSERT(false, "unexpected element size ", out.element_size());
  }
}

KILN_LIBRARY(CPU, m) {
  m.structured<ops::cat>(cat_cpu);
  m.structured<ops::tril>(triangular_cpu<true>);
  m.structured<ops::triu>(triangular_cpu<false>);
}

}  // namespace
}  // namespace kiln::kernels
