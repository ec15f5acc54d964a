// constant_pad_nd on the CPU (tensor/ops/shape.toml): out is filled with the value, then the
// part of self that survives (a negative pad crops) is copied into its place. Reflect, replicate
// and circular padding decompose into index_select (src/composite_index.cpp).
#include <algorithm>

#include "kiln/generated/ops/shape.h"
#include "kiln/meta.h"
#include "loops.h"

namespace kiln::kernels {
namespace {

// self: (..., n_k) -> out: (..., n_k + pad[2k] + pad[2k+1]) for the last pad.size()/2 dims
void constant_pad_cpu(const Tensor& out, const Tensor& self, IntArrayRef pad, const Scalar& value) {
  if (out.numel() == 0) return;
  out.fill_(value);
  Tensor src = self, dst = out;
  for (size_t k = 0; k < pad.size() / 2; ++k) {
    const int64_t d = self.dim() - 1 - static_cast<int64_t>(k);
    const int64_t left = pad[2 * k], right = pad[2 * k + 1];
    const int64_t keep = self.size(d) + std::min<int64_t>(left, 0) + std::min<int64_t>(right, 0);
    if (keep <= 0) return;  // everything of self is cropped away along d
    src = src.narrow(d, std::max<int64_t>(-left, 0), keep);
    dst = dst.narrow(d, std::max<int64_t>(left, 0), keep);
  }
  dst.copy_(src);
}

KILN_LIBRARY(CPU, m) { m.structured<ops::constant_pad_nd>(constant_pad_cpu); }

}  // namespace
}  // namespace kiln::kernels
