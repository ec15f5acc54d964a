// embedding and its dense backward on the CPU (tensor/ops/nn.toml).
// The backward buckets the positions by weight row (a counting sort that keeps index order), then
// sums each row's gradients in that order: deterministic, and parallel over rows without atomics.
#include <vector>

#include "kiln/generated/meta/nn.h"
#include "kiln/generated/ops/nn.h"
#include "loops.h"

namespace kiln::kernels {
namespace {

// The indices as int64 (n,), each checked against [0, num_weights).
std::vector<int64_t> checked_indices(const char* op, const Tensor& indices, int64_t num_weights) {
  Tensor idx = indices.to(kInt64).contiguous();
  const int64_t* p = static_cast<const int64_t*>(idx.impl()->raw_data());
  std::vector<int64_t> out(p, p + idx.numel());
  for (int64_t v : out)
    KILN_CHECK(v >= 0 && v < num_weights, Index, op, ": index ", v,
               " is out of range for a weight with ", num_weights, " rows");
  return out;
}

// weight: (V, D), indices: (*) -> (*, D)
Tensor embedding_cpu(const Tensor& weight, const Tensor& indices, int64_t padding_idx,
                     bool scale_grad_by_freq, bool sparse) {
  TensorSpec spec = meta::embedding(weight, indices, padding_idx, scale_grad_by_freq, sparse);
  Tensor out = empty_strided_on(spec.sizes, spec.strides, spec.dtype, spec.device);
  const std::vector<int64_t> idx = checked_indices("embedding", indices, weight.size(0));
  const int64_t n = static_cast<int64_t>(idx.size()), D = weight.size(1);
  if (out.numel() == 0) return out;
  Tensor w = weight.contiguous();
  const size_t row_bytes = D * w.element_size();
  const char* wp = static_cast<const char*>(w.impl()->raw_data());
  char* op = static_cast<char*>(out.impl()->raw_data());
  parallel_for(n, std::max<int64_t>(1, kGrainSize / D), [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) std::memcpy(op + i * row_bytes, wp + idx[i] * row_bytes, row_bytes);
  });
  return out;
}

// grad: (*, D), indices: (*) -> (num_weights, D)
Tensor embedding_dense_backward_cpu(const Tensor& grad, const Tensor& indices, int64_t num_weights,
                                    int64_t padding_idx, bool scale_grad_by_freq) {
  TensorSpec spec =
      meta::embedding_dense_backward(grad, indices, num_weights, padding_idx, scale_grad_by_freq);
  Tensor out = empty_strided_on(spec.sizes, spec.strides, spec.dtype, spec.device);
  const std::vector<int64_t> idx = checked_indices("embedding_dense_backward", indices, num_weights);
  const int64_t n = static_cast<int64_t>(idx.size()), D = out.size(1);
  if (out.numel() == 0) return out;
  // start[v] .. start[v + 1]: the positions of row v, in index order
  std::vector<int64_t> start(num_weights + 1, 0), pos(n);
  for (int64_t v : idx) ++start[v + 1];
  for (int64_t v = 0; v < num_weights; ++v) start[v + 1] += start[v];
  std::vector<int64_t> fill(start.begin(), start.end() - 1);
  for (int64_t i = 0; i < n; ++i) pos[fill[idx[i]]++] = i;
  Tensor g = grad.contiguous();
  KILN_DISPATCH_FLOAT_TYPES(spec.dtype, "embedding_dense_backward", [&] {
    using T = scalar_t;
    using A = acc_t<T>;
    const T* gp = static_cast<const T*>(g.impl()->raw_data());
    T* op = static_cast<T*>(out.impl()->raw_data());
    const int64_t grain = std::max<int64_t>(1, kGrainSize / std::max<int64_t>(D, 1));
    parallel_for(num_weights, grain, [&](int64_t v0, int64_t v1) {
      std::vector<A> acc(D);
      for (int64_t v = v0; v < v1; ++v) {
        std::fill(acc.begin(), acc.end(), A(0));
        const int64_t count = start[v + 1] - start[v];
        if (v != padding_idx) {
          for (int64_t k = start[v]; k < start[v + 1]; ++k) {
            const T* row = gp + pos[k] * D;
            for (int64_t j = 0; j < D; ++j) acc[j] += static_cast<A>(row[j]);
          }
          if (scale_grad_by_freq && count > 0)
            for (A& a : acc) a /= static_cast<A>(count);
        }
        for (int64_t j = 0; j < D; ++j) op[v * D + j] = static_cast<T>(acc[j]);
      }
    });
  });
  return out;
}

KILN_LIBRARY(CPU, m) {
  m.impl<ops::embedding>(embedding_cpu);
  m.impl<ops::embedding_dense_backward>(embedding_dense_backward_cpu);
}

}  // namespace
}  // namespace kiln::kernels
