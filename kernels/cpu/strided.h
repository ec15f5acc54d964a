// kernels/cpu/strided.h: moving elements by their bit pattern, for kernels that only rearrange
// (index, flip, pad, gather/scatter): one instantiation per element size, not per dtype.
//
//   dispatch_word(out.element_size(), [&](auto word) {
//     using U = decltype(word);  // uint8_t, uint16_t, uint32_t or uint64_t
//     gather_strided<U>(out_ptr, self_ptr, self.sizes(), self.strides());
//   });
#pragma once

#include <cstring>

#include "loops.h"

namespace kiln::kernels {

template <typename F>
void dispatch_word(size_t element_size, const F& f) {
  switch (element_size) {
    case 1:
      return f(uint8_t{});
    case 2:
      return f(uint16_t{});
    case 4:
      return f(uint32_t{});
    case 8:
      return f(uint64_t{});
    default:
      KILN_ASSERT(false, "unexpected element size ", element_size);
  }
}

// dst (contiguous, `shape`): dst[i] = src[sum_d i_d * st[d]] for every multi-index i; strides may
// be negative (src then points at the element that index 0 reads). Rows of the last dim run in
// parallel.
template <typename U>
void gather_strided(U* dst, const U* src, IntArrayRef shape, IntArrayRef st) {
  const int64_t nd = static_cast<int64_t>(shape.size()), n = numel_of(shape);
  if (n == 0) return;
  if (nd == 0) {
    dst[0] = src[0];
    return;
  }
  const int64_t len = shape[nd - 1], step = st[nd - 1], rows = n / len;
  parallel_for(rows, std::max<int64_t>(1, kGrainSize / len), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      int64_t off = 0;
      for (int64_t d = nd - 2, rem = r; d >= 0; --d) {
        off += (rem % shape[d]) * st[d];
        rem /= shape[d];
      }
      U* o = dst + r * len;
      const U* s = src + off;
      if (step == 1) {
        std::memcpy(o, s, len * sizeof(U));
      } else {
        for (int64_t j = 0; j < len; ++j) o[j] = s[j * step];
      }
    }
  });
}

}  // namespace kiln::kernels
