// softmax and log_softmax, and their fused backward rows, on the CPU (tensor/ops/reduction.toml).
// Stable: every row is shifted by its max before exp. Each row (or column block) is computed by one
// task in a fixed order, so results do not depend on the thread count (Note [Deterministic
// reductions] in reduce.h).
#include "kiln/generated/meta/reduction.h"
#include "kiln/generated/ops/reduction.h"
#include "kiln/meta.h"
#include "reduce.h"
#include "vec_math.h"

namespace kiln::kernels {
namespace {

constexpr int64_t kSoftmaxCols = 64;  // inner columns per task when dim is not the last

// Note [Softmax rows]: a row of float32 (or a 16-bit type, computed in float32) takes three
// vectorized passes: the max (NaNs skipped), e^(x - max) summed (and stored, for float32), then
// the scale (log_softmax: (x - max) - log(sum)). vec::exp_nonpositive keeps NaN, so a NaN in the
// row, or an infinite max (x - max is then NaN somewhere), makes the sum and the whole row NaN,
// as in PyTorch. The simd reductions combine their lanes in an order fixed at compile time, so
// results do not depend on the thread count.
template <typename T>
KILN_VEC_INLINE float to_f(T v) {
  return static_cast<float>(v);
}

// x, y: (D,) contiguous, one row, float32 accumulation (Note [Softmax rows]).
template <typename T, bool kLog>
void softmax_row_f32(const T* x, T* y, int64_t D) {
  float m = -vec::kInf;
#pragma omp simd reduction(max : m)
  for (int64_t i = 0; i < D; ++i) m = to_f(x[i]) > m ? to_f(x[i]) : m;
  // Note [Softmax prefetch]: the max pass waits on memory when x is not in the cache. Asking for
  // the next row now (the next task of this thread, or past its chunk: a prefetch never faults)
  // overlaps that wait with this row's other passes, which run from L1: about 12% faster on a
  // 4096x1024 float32 softmax here.
  const char* next = reinterpret_cast<const char*>(x + D);
  for (int64_t b = 0; b < D * static_cast<int64_t>(sizeof(T)); b += 64)
    __builtin_prefetch(next + b, 0, 3);
  float s = 0;
  if constexpr (!kLog && std::is_same_v<T, float>) {  // store e^(x - m), then scale in place
#pragma omp simd reduction(+ : s)
    for (int64_t i = 0; i < D; ++i) {
      const float e = vec::exp_nonpositive(x[i] - m);
      y[i] = e;
      s += e;
    }
    const float inv = 1.0f / s;
#pragma omp simd
    for (int64_t i = 0; i < D; ++i) y[i] *= inv;
    return;
  }
#pragma omp simd reduction(+ : s)
  for (int64_t i = 0; i < D; ++i) s += vec::exp_nonpositive(to_f(x[i]) - m);
  if constexpr (kLog) {
    const float ls = std::log(s);  // (x - m) - log(s): m + log(s) would round away the small part
#pragma omp simd
    for (int64_t i = 0; i < D; ++i) y[i] = static_cast<T>((to_f(x[i]) - m) - ls);
  } else {
    const float inv = 1.0f / s;
#pragma omp simd
    for (int64_t i = 0; i < D; ++i)
      y[i] = static_cast<T>(vec::exp_nonpositive(to_f(x[i]) - m) * inv);
  }
}

// x, y: (D,) contiguous, one row.
template <typename T, bool kLog>
void softmax_row(const T* x, T* y, int64_t D) {
  using A = acc_t<T>;
  if constexpr (std::is_same_v<A, float>) {
    softmax_row_f32<T, kLog>(x, y, D);
  } else {
    A m = reduce_contiguous(x, D, MinMaxReducer<T, A, true, CastMap<A>>{}, 0);
    auto ex = [m](T v, int64_t) { return std::exp(static_cast<A>(v) - m); };
    A s = reduce_contiguous(x, D, SumReducer<T, A, decltype(ex)>{ex}, 0);
    if constexpr (kLog) {
      A ls = std::log(s);
      for (int64_t i = 0; i < D; ++i) y[i] = (x[i] - m) - ls;
    } else {
      for (int64_t i = 0; i < D; ++i) y[i] = std::exp(x[i] - m) / s;
    }
  }
}

// x, y: (D, inner) contiguous; columns [c0, c0 + n) of one outer index.
template <typename T, bool kLog>
void softmax_cols(const T* x, T* y, int64_t D, int64_t inner, int64_t c0, int64_t n) {
  using A = acc_t<T>;
  A m[kSoftmaxCols], s[kSoftmaxCols];
  for (int64_t j = 0; j < n; ++j) {
    m[j] = -std::numeric_limits<A>::infinity();
    s[j] = 0;
  }
  for (int64_t k = 0; k < D; ++k) {
    const T* row = x + k * inner + c0;
    for (int64_t j = 0; j < n; ++j)
      MinMaxReducer<T, A, true, CastMap<A>>::pick(m[j], static_cast<A>(row[j]));
  }
  for (int64_t k = 0; k < D; ++k) {
    const T* row = x + k * inner + c0;
#pragma omp simd
    for (int64_t j = 0; j < n; ++j) s[j] += vec::exp_acc<A>(static_cast<A>(row[j]) - m[j]);
  }
  for (int64_t j = 0; j < n; ++j) s[j] = kLog ? std::log(s[j]) : A(1) / s[j];
  for (int64_t k = 0; k < D; ++k) {
    const T* row = x + k * inner + c0;
    T* out = y + k * inner + c0;
    for (int64_t j = 0; j < n; ++j) {
      A v = static_cast<A>(row[j]);
      out[j] = static_cast<T>(kLog ? (v - m[j]) - s[j] : vec::exp_acc<A>(v - m[j]) * s[j]);
    }
  }
}

// A shape as (outer, D, inner) around dim d (a 0-dim tensor is (1, 1, 1)).
struct AroundDim {
  int64_t outer = 1, D = 1, inner = 1;
};
AroundDim around_dim(IntArrayRef sizes, int64_t d) {
  AroundDim r;
  for (int64_t i = 0; i < static_cast<int64_t>(sizes.size()); ++i) {
    if (i < d)
      r.outer *= sizes[i];
    else if (i == d)
      r.D = sizes[i];
    else
      r.inner *= sizes[i];
  }
  return r;
}

// self: (outer, D, inner) around `dim` -> same shape, in dtype (or self's dtype).
template <bool kLog>
Tensor softmax_cpu(const Tensor& self, int64_t dim, std::optional<ScalarType> dtype) {
  const char* name = kLog ? "log_softmax" : "softmax";
  TensorSpec spec = kLog ? meta::log_softmax(self, dim, dtype) : meta::softmax(self, dim, dtype);
  Tensor out = empty_strided_on(spec.sizes, spec.strides, spec.dtype, spec.device);
  if (out.numel() == 0) return out;
  Tensor x = (self.dtype() == spec.dtype ? self : self.to(spec.dtype)).contiguous();
  const auto [outer, D, inner] = around_dim(self.sizes(), meta::wrap_dim(name, dim, self.dim()));
  KILN_DISPATCH_FLOAT_TYPES(spec.dtype, name, [&] {
    using T = scalar_t;
    const T* xp = static_cast<const T*>(x.impl()->raw_data());
    T* yp = static_cast<T*>(out.impl()->raw_data());
    if (inner == 1) {  // fast path: softmax over the last (contiguous) dim
      parallel_for(outer, std::max<int64_t>(1, kGrainSize / D), [&](int64_t b, int64_t e) {
        for (int64_t r = b; r < e; ++r) softmax_row<T, kLog>(xp + r * D, yp + r * D, D);
      });
      return;
    }
    int64_t nb = (inner + kSoftmaxCols - 1) / kSoftmaxCols;
    int64_t grain = std::max<int64_t>(1, kGrainSize / (D * std::min(inner, kSoftmaxCols)));
    parallel_for(outer * nb, grain, [&](int64_t b, int64_t e) {
      for (int64_t t = b; t < e; ++t) {
        int64_t o = t / nb, c0 = (t % nb) * kSoftmaxCols;
        softmax_cols<T, kLog>(xp + o * D * inner, yp + o * D * inner, D, inner, c0,
                              std::min(kSoftmaxCols, inner - c0));
      }
    });
  });
  return out;
}

// ---- backward: softmax dx = y * (g - sum(g * y)), log_softmax dx = g - exp(y) * sum(g) ----------

// g, y, dx: (D,) contiguous, one row.
template <typename T, bool kLog>
void softmax_backward_row(const T* g, const T* y, T* dx, int64_t D) {
  using A = acc_t<T>;
  A s = 0;
#pragma omp simd reduction(+ : s)
  for (int64_t i = 0; i < D; ++i)
    s += kLog ? static_cast<A>(g[i]) : static_cast<A>(g[i]) * static_cast<A>(y[i]);
#pragma omp simd
  for (int64_t i = 0; i < D; ++i) {
    const A gi = static_cast<A>(g[i]), yi = static_cast<A>(y[i]);
    dx[i] = static_cast<T>(kLog ? gi - vec::exp_acc<A>(yi) * s : yi * (gi - s));
  }
}

// g, y, dx: (D, inner) contiguous; columns [c0, c0 + n) of one outer index.
template <typename T, bool kLog>
void softmax_backward_cols(const T* g, const T* y, T* dx, int64_t D, int64_t inner, int64_t c0,
                           int64_t n) {
  using A = acc_t<T>;
  A s[kSoftmaxCols] = {};
  for (int64_t k = 0; k < D; ++k) {
    const T *gr = g + k * inner + c0, *yr = y + k * inner + c0;
    for (int64_t j = 0; j < n; ++j)
      s[j] += kLog ? static_cast<A>(gr[j]) : static_cast<A>(gr[j]) * static_cast<A>(yr[j]);
  }
  for (int64_t k = 0; k < D; ++k) {
    const T *gr = g + k * inner + c0, *yr = y + k * inner + c0;
    T* out = dx + k * inner + c0;
    for (int64_t j = 0; j < n; ++j) {
      const A gj = static_cast<A>(gr[j]), yj = static_cast<A>(yr[j]);
      out[j] = static_cast<T>(kLog ? gj - vec::exp_acc<A>(yj) * s[j] : yj * (gj - s[j]));
    }
  }
}

// grad, output: (outer, D, inner) around `dim` -> same shape.
template <bool kLog>
Tensor softmax_backward_cpu(const Tensor& grad, const Tensor& output, int64_t dim) {
  const char* name = kLog ? "log_softmax_backward_data" : "softmax_backward_data";
  TensorSpec spec = kLog ? meta::log_softmax_backward_data(grad, output, dim)
                         : meta::softmax_backward_data(grad, output, dim);
  Tensor out = empty_strided_on(spec.sizes, spec.strides, spec.dtype, spec.device);
  if (out.numel() == 0) return out;
  Tensor g = grad.contiguous(), y = output.contiguous();
  const auto [outer, D, inner] =
      around_dim(output.sizes(), meta::wrap_dim(name, dim, output.dim()));
  KILN_DISPATCH_FLOAT_TYPES(spec.dtype, name, [&] {
    using T = scalar_t;
    const T* gp = static_cast<const T*>(g.impl()->raw_data());
    const T* yp = static_cast<const T*>(y.impl()->raw_data());
    T* dp = static_cast<T*>(out.impl()->raw_data());
    if (inner == 1) {
      parallel_for(outer, std::max<int64_t>(1, kGrainSize / D), [&](int64_t b, int64_t e) {
        for (int64_t r = b; r < e; ++r)
          softmax_backward_row<T, kLog>(gp + r * D, yp + r * D, dp + r * D, D);
      });
      return;
    }
    int64_t nb = (inner + kSoftmaxCols - 1) / kSoftmaxCols;
    int64_t grain = std::max<int64_t>(1, kGrainSize / (D * std::min(inner, kSoftmaxCols)));
    parallel_for(outer * nb, grain, [&](int64_t b, int64_t e) {
      for (int64_t t = b; t < e; ++t) {
        int64_t o = t / nb, c0 = (t % nb) * kSoftmaxCols;
        softmax_backward_cols<T, kLog>(gp + o * D * inner, yp + o * D * inner, dp + o * D * inner,
                                       D, inner, c0, std::min(kSoftmaxCols, inner - c0));
      }
    });
  });
  return out;
}

KILN_LIBRARY(CPU, m) {
  m.impl<ops::softmax>(softmax_cpu<false>);
  m.impl<ops::log_softmax>(softmax_cpu<true>);
  m.impl<ops::softmax_backward_data>(softmax_backward_cpu<false>);
  m.impl<ops::log_softmax_backward_data>(softmax_backward_cpu<true>);
}

}  // namespace
}  // namespace kiln::kernels
