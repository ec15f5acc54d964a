// sort and topk on the CPU (tensor/ops/sort.toml). Rows along `dim` are copied out (dim moved
// last, contiguous), each row is sorted as (value, index) pairs and written back.
// Note [Sort order]: sorting is always stable (equal values keep their order; topk breaks ties
// by the lower index), and NaN counts as larger than every number, as in PyTorch: last in an
// ascending sort, first in a descending one and in topk(largest=true).
#include <algorithm>
#include <cmath>
#include <tuple>
#include <utility>
#include <vector>

#include "kiln/generated/meta/sort.h"
#include "kiln/generated/ops/sort.h"
#include "kiln/meta.h"
#include "loops.h"

namespace kiln::kernels {
namespace {

// The type values are compared in: float for the reduced-precision floats, int64 for bool.
template <typename T>
using sort_key_t = std::conditional_t<std::is_same_v<T, Half> || std::is_same_v<T, BFloat16>, float,
                                 std::conditional_t<std::is_same_v<T, bool>, int64_t, T>>;

template <typename K>
bool is_nan(K v) {
  if constexpr (std::is_floating_point_v<K>) return std::isnan(v);
  return false;
}

// Strict weak orders with NaN largest (Note [Sort order]).
template <typename K>
bool less_nan_last(K a, K b) {
  return a < b || (is_nan(b) && !is_nan(a));
}
template <typename K>
bool greater_nan_first(K a, K b) {
  return a > b || (is_nan(a) && !is_nan(b));
}

// `t` with `d` moved last (a 0-dim t as one element), and whether writing there needs a copy.
Tensor dim_last(const Tensor& t, int64_t d) { return t.dim() == 0 ? t.reshape({1}) : t.transpose(d, -1); }

// Runs row_fn(in_row, n, vals_row, idx_row) for every row of self along d; the outputs hold
// `k` elements per row and are written through views of `values` and `indices`.
template <typename T, typename F>
void for_rows(const Tensor& self, int64_t d, int64_t k, const Tensor& values, const Tensor& indices,
              const F& row_fn) {
  Tensor x = dim_last(self, d).contiguous();
  Tensor vo = dim_last(values, d), io = dim_last(indices, d);
  Tensor vb = vo.is_contiguous() ? vo : empty_on(vo.sizes(), vo.dtype(), vo.device());
  Tensor ib = io.is_contiguous() ? io : empty_on(io.sizes(), io.dtype(), io.device());
  const int64_t n = x.size(-1), rows = n == 0 ? 0 : x.numel() / n;
  const T* xp = static_cast<const T*>(x.impl()->raw_data());
  T* vp = static_cast<T*>(vb.impl()->raw_data());
  int64_t* ip = static_cast<int64_t*>(ib.impl()->raw_data());
  if (k > 0)
    parallel_for(rows, std::max<int64_t>(1, kGrainSize / std::max<int64_t>(n, 1)),
                 [&](int64_t r0, int64_t r1) {
                   for (int64_t r = r0; r < r1; ++r) row_fn(xp + r * n, n, vp + r * k, ip + r * k);
                 });
  if (!vb.is_same(vo)) vo.copy_(vb);
  if (!ib.is_same(io)) io.copy_(ib);
}

std::tuple<Tensor, Tensor> sort_cpu(const Tensor& self, int64_t dim, bool descending, bool stable) {
  std::vector<TensorSpec> specs = meta::sort(self, dim, descending, stable);
  Tensor values = empty_on(specs[0].sizes, specs[0].dtype, specs[0].device);
  Tensor indices = empty_on(specs[1].sizes, kInt64, specs[1].device);
  const int64_t d = meta::wrap_dim("sort", dim, self.dim());
  KILN_DISPATCH_ALL_TYPES(self.dtype(), "sort", [&] {
    using T = scalar_t;
    using K = sort_key_t<T>;
    const int64_t n = self.dim() == 0 ? 1 : self.size(d);
    for_rows<T>(self, d, n, values, indices, [&](const T* x, int64_t len, T* v, int64_t* idx) {
      std::vector<std::pair<K, int64_t>> row(len);
      for (int64_t i = 0; i < len; ++i) row[i] = {static_cast<K>(x[i]), i};
      auto by = [descending](const std::pair<K, int64_t>& a, const std::pair<K, int64_t>& b) {
        return descending ? greater_nan_first(a.first, b.first) : less_nan_last(a.first, b.first);
      };
      std::stable_sort(row.begin(), row.end(), by);
      for (int64_t i = 0; i < len; ++i) {
        idx[i] = row[i].second;
        v[i] = x[row[i].second];
      }
    });
  });
  return {values, indices};
}

std::tuple<Tensor, Tensor> topk_cpu(const Tensor& self, int64_t k, int64_t dim, bool largest,
                                    bool sorted) {
  std::vector<TensorSpec> specs = meta::topk(self, k, dim, largest, sorted);
  Tensor values = empty_on(specs[0].sizes, specs[0].dtype, specs[0].device);
  Tensor indices = empty_on(specs[1].sizes, kInt64, specs[1].device);
  const int64_t d = meta::wrap_dim("topk", dim, self.dim());
  KILN_DISPATCH_NUMERIC_TYPES(self.dtype(), "topk", [&] {
    using T = scalar_t;
    using K = sort_key_t<T>;
    for_rows<T>(self, d, k, values, indices, [&](const T* x, int64_t len, T* v, int64_t* idx) {
      std::vector<std::pair<K, int64_t>> row(len);
      for (int64_t i = 0; i < len; ++i) row[i] = {static_cast<K>(x[i]), i};
      auto by = [largest](const std::pair<K, int64_t>& a, const std::pair<K, int64_t>& b) {
        const bool before = largest ? greater_nan_first(a.first, b.first)
                                    : less_nan_last(a.first, b.first);
        const bool after = largest ? greater_nan_first(b.first, a.first)
                                   : less_nan_last(b.first, a.first);
        return before || (!after && a.second < b.second);
      };
      std::partial_sort(row.begin(), row.begin() + k, row.end(), by);
      for (int64_t i = 0; i < k; ++i) {
        idx[i] = row[i].second;
        v[i] = x[row[i].second];
      }
    });
  });
  return {values, indices};
}

KILN_LIBRARY(CPU, m) {
  m.impl<ops::sort>(sort_cpu);
  m.impl<ops::topk>(topk_cpu);
}

}  // namespace
}  // namespace kiln::kernels
