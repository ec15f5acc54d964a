// cat, tril, triu, flip, roll and repeat on the CPU (tensor/ops/shape.toml).
#include <cstring>

#include "kiln/generated/ops/shape.h"
#include "kiln/meta.h"
#include "loops.h"
#include "strided.h"

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

// self -> out (contiguous, self's shape) with the listed dims reversed: self read with those
// dims' strides negated, starting from their last element.
void flip_cpu(const Tensor& out, const Tensor& self, IntArrayRef dims) {
  if (out.numel() == 0) return;
  DimVector st(self.strides());
  int64_t base = 0;
  for (int64_t dim : dims) {
    const int64_t d = meta::wrap_dim("flip", dim, self.dim());
    if (self.dim() == 0) continue;
    base += (self.size(d) - 1) * st[d];
    st[d] = -st[d];
  }
  dispatch_word(out.element_size(), [&](auto word) {
    using U = decltype(word);
    gather_strided<U>(static_cast<U*>(out.impl()->raw_data()),
                      static_cast<const U*>(self.impl()->raw_data()) + base, self.sizes(), st);
  });
}

// dst = src rolled by `shift` along d: dst[(i + shift) mod n] = src[i], as two slab copies.
void roll_one(const Tensor& dst, const Tensor& src, int64_t d, int64_t shift) {
  const int64_t n = src.size(d);
  const int64_t s = n == 0 ? 0 : ((shift % n) + n) % n;
  if (s == 0) {
    dst.copy_(src);
    return;
  }
  dst.narrow(d, s, n - s).copy_(src.narrow(d, 0, n - s));
  dst.narrow(d, 0, s).copy_(src.narrow(d, n - s, s));
}

// Without dims the flattened tensor is rolled; otherwise one dim after the other.
void roll_cpu(const Tensor& out, const Tensor& self, IntArrayRef shifts, IntArrayRef dims) {
  if (out.numel() == 0) return;
  if (dims.empty()) {
    roll_one(out.reshape({-1}), self.reshape({-1}), 0, shifts[0]);
    return;
  }
  Tensor src = self;
  for (size_t i = 0; i < dims.size(); ++i) {
    const int64_t d = meta::wrap_dim("roll", dims[i], self.dim());
    Tensor dst = i + 1 == dims.size() ? out : empty_on(self.sizes(), self.dtype(), self.device());
    roll_one(dst, src, d, shifts[i]);
    src = dst;
  }
}

// self: (s_0, .., s_m) padded with leading 1s to len(repeats) -> out: (r_0 s_0, .., r_m s_m);
// out viewed as (r_0, s_0, r_1, s_1, ...) is self broadcast along the r_k.
void repeat_cpu(const Tensor& out, const Tensor& self, IntArrayRef repeats) {
  if (out.numel() == 0) return;
  const size_t lead = repeats.size() - self.dim();
  DimVector split, src;
  for (size_t k = 0; k < repeats.size(); ++k) {
    const int64_t s = k < lead ? 1 : self.size(k - lead);
    split.push_back(repeats[k]);
    split.push_back(s);
    src.push_back(1);
    src.push_back(s);
  }
  out.view(split).copy_(self.reshape(src));
}

KILN_LIBRARY(CPU, m) {
  m.structured<ops::cat>(cat_cpu);
  m.structured<ops::tril>(triangular_cpu<true>);
  m.structured<ops::triu>(triangular_cpu<false>);
  m.structured<ops::flip>(flip_cpu);
  m.structured<ops::roll>(roll_cpu);
  m.structured<ops::repeat>(repeat_cpu);
}

}  // namespace
}  // namespace kiln::kernels
