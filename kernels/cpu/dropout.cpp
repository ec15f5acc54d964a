// dropout_seeded on the CPU (tensor/ops/nn.toml). Element i is kept, and scaled by 1 / (1 - p),
// when lane i % 4 of philox4x32(seed, offset + i / 4) is at least p * 2^32 (the k32 layout of
// Note [Counter-based RNG]); dropped elements are 0. The mask is a function of (seed, offset, i)
// only, so the gradient (dropout_seeded of grad with the same seed and offset) regenerates it.
#include <cmath>

#include "kiln/generated/meta/nn.h"
#include "kiln/generated/ops/nn.h"
#include "loops.h"

namespace kiln::kernels {
namespace {

// x, y: (n,) contiguous.
Tensor dropout_seeded_cpu(const Tensor& input, double p, int64_t seed, int64_t offset) {
  TensorSpec spec = meta::dropout_seeded(input, p, seed, offset);
  Tensor out = empty_strided_on(spec.sizes, spec.strides, spec.dtype, spec.device);
  const int64_t n = out.numel();
  if (n == 0) return out;
  Tensor x = input.contiguous();
  // p = 1 drops everything: the threshold 2^32 is above every 32-bit word.
  const uint64_t threshold = static_cast<uint64_t>(std::llround(p * 4294967296.0));
  const uint64_t s = static_cast<uint64_t>(seed), o = static_cast<uint64_t>(offset);
  KILN_DISPATCH_FLOAT_TYPES(spec.dtype, "dropout_seeded", [&] {
    using T = scalar_t;
    using A = acc_t<T>;
    const A scale = p < 1 ? static_cast<A>(1.0 / (1.0 - p)) : A(0);
    const T* xp = static_cast<const T*>(x.impl()->raw_data());
    T* yp = static_cast<T*>(out.impl()->raw_data());
    const int64_t blocks = (n + 3) / 4;
    parallel_for(blocks, kGrainSize / 4, [&](int64_t b0, int64_t b1) {
      for (int64_t blk = b0; blk < b1; ++blk) {
        const std::array<uint32_t, 4> r = philox4x32(s, o + static_cast<uint64_t>(blk));
        for (int64_t j = 0; j < 4 && blk * 4 + j < n; ++j) {
          const int64_t i = blk * 4 + j;
          yp[i] = r[j] >= threshold ? static_cast<T>(static_cast<A>(xp[i]) * scale) : T(0);
        }
      }
    });
  });
  return out;
}

KILN_LIBRARY(CPU, m) { m.impl<ops::dropout_seeded>(dropout_seeded_cpu); }

}  // namespace
}  // namespace kiln::kernels
