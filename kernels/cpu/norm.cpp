// layer_norm, rms_norm, group_norm and batch_norm on the CPU, forward and fused backward
// (tensor/ops/nn.toml, Note [Fused norm rows]). Every kernel normalizes "sets" of elements:
//  - layer_norm/rms_norm: a row of the trailing D = prod(normalized_shape) elements;
//  - group_norm: the (C / G) * S contiguous elements of one (sample, group) of (N, C, S);
//  - batch_norm: the N runs of S elements of one channel of (N, C, S).
// Statistics are computed in float (double for float64) by two passes over the set (mean, then
// squared deviations), and recomputed by the backward kernels rather than saved. Each set, or
// each fixed chunk of sets, is one task with a fixed order of operations, so results do not
// depend on the thread count (Note [Deterministic reductions]).
//
// Backward of y = xhat * w + b over a set of n elements, gw = dy * w:
//   dx = r * (gw - mean(gw) - xhat * mean(gw * xhat))      (rms_norm: no mean(gw) term, xhat = x r)
//   dw = sum over the other dims of dy * xhat, db = sum over the other dims of dy
#include <algorithm>
#include <cmath>
#include <tuple>
#include <vector>

#include "kiln/generated/meta/nn.h"
#include "kiln/generated/ops/nn.h"
#include "kiln/meta.h"
#include "loops.h"

#define KILN_NORM_INLINE inline __attribute__((always_inline))

namespace kiln::kernels {
namespace {

// Note [Lane sums]: sum over i in [0, n) of f(i) in kLanes independent accumulators (lane =
// i mod kLanes, folded pairwise at the end): a fixed order, and a loop the compiler vectorizes
// without reassociating a single float accumulator (omp simd reductions are not vectorized
// inside the parallel regions' outlined functions). sums2 and sums3 do two or three sums in one
// pass.
constexpr int kLanes = 16;

template <typename A, typename F>
KILN_NORM_INLINE A lane_sum(int64_t n, const F& f) {
  A lanes[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (int l = 0; l < kLanes; ++l) lanes[l] += f(i + l);
  for (int l = 0; i < n; ++i, ++l) lanes[l] += f(i);
  for (int w = kLanes / 2; w > 0; w /= 2)
    for (int l = 0; l < w; ++l) lanes[l] += lanes[l + w];
  return lanes[0];
}

template <typename A, typename F>
KILN_NORM_INLINE std::pair<A, A> lane_sums2(int64_t n, const F& f) {
  A a[kLanes] = {}, b[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (int l = 0; l < kLanes; ++l) f(i + l, a[l], b[l]);
  for (int l = 0; i < n; ++i, ++l) f(i, a[l], b[l]);
  for (int w = kLanes / 2; w > 0; w /= 2)
    for (int l = 0; l < w; ++l) a[l] += a[l + w], b[l] += b[l + w];
  return {a[0], b[0]};
}

template <typename A, typename F>
KILN_NORM_INLINE std::tuple<A, A, A> lane_sums3(int64_t n, const F& f) {
  A a[kLanes] = {}, b[kLanes] = {}, c[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (int l = 0; l < kLanes; ++l) f(i + l, a[l], b[l], c[l]);
  for (int l = 0; i < n; ++i, ++l) f(i, a[l], b[l], c[l]);
  for (int w = kLanes / 2; w > 0; w /= 2)
    for (int l = 0; l < w; ++l) a[l] += a[l + w], b[l] += b[l + w], c[l] += c[l + w];
  return {a[0], b[0], c[0]};
}

// `count` runs of `len` contiguous elements, the k-th at base + k * stride.
struct Runs {
  int64_t base, count, stride, len;
  int64_t numel() const { return count * len; }
};

// (mean, rstd) of a set; rms: (0, 1 / sqrt(mean(x^2) + eps)).
template <bool kRms, typename T, typename A = acc_t<T>>
std::pair<A, A> stats(const T* x, const Runs& s, double eps) {
  const A n = static_cast<A>(s.numel());
  A m = 0;
  if (!kRms) {
    for (int64_t k = 0; k < s.count; ++k) {
      const T* p = x + s.base + k * s.stride;
      m += lane_sum<A>(s.len, [p](int64_t i) { return static_cast<A>(p[i]); });
    }
    m /= n;
  }
  A v = 0;
  for (int64_t k = 0; k < s.count; ++k) {
    const T* p = x + s.base + k * s.stride;
    v += lane_sum<A>(s.len, [p, m](int64_t i) {
      A d = static_cast<A>(p[i]) - m;
      return d * d;
    });
  }
  return {m, A(1) / std::sqrt(v / n + static_cast<A>(eps))};
}

template <typename T>
const T* data_of(const Tensor& t) {
  return static_cast<const T*>(t.impl()->raw_data());
}
template <typename T>
T* mutable_data_of(const Tensor& t) {
  return static_cast<T*>(t.impl()->raw_data());
}

Tensor alloc(const TensorSpec& spec) {
  return empty_strided_on(spec.sizes, spec.strides, spec.dtype, spec.device);
}

// Sets per task so a task touches about kGrainSize elements.
int64_t grain_for(int64_t set_numel) { return std::max<int64_t>(1, kGrainSize / std::max<int64_t>(set_numel, 1)); }

// ---- layer_norm / rms_norm: rows of D ---------------------------------------------------------

int64_t trailing_numel(IntArrayRef normalized_shape) {
  int64_t D = 1;
  for (int64_t s : normalized_shape) D *= s;
  return D;
}

// x: (M, D), w, b: (D,) -> y: (M, D). rms: b is unused.
template <bool kRms>
Tensor row_norm_forward(const char* name, const TensorSpec& spec, const Tensor& input,
                        IntArrayRef normalized_shape, const Tensor& weight, const Tensor* bias,
                        double eps) {
  Tensor out = alloc(spec);
  if (out.numel() == 0) return out;
  const int64_t D = trailing_numel(normalized_shape), M = input.numel() / D;
  Tensor x = input.contiguous(), w = weight.contiguous();
  Tensor b = bias ? bias->contiguous() : Tensor();
  KILN_DISPATCH_FLOAT_TYPES(input.dtype(), name, [&] {
    using T = scalar_t;
    using A = acc_t<T>;
    const T *xp = data_of<T>(x), *wp = data_of<T>(w), *bp = kRms ? nullptr : data_of<T>(b);
    T* yp = mutable_data_of<T>(out);
    parallel_for(M, grain_for(D), [&](int64_t r0, int64_t r1) {
      for (int64_t i = r0; i < r1; ++i) {
        auto [m, r] = stats<kRms>(xp, Runs{i * D, 1, 0, D}, eps);
        const T* xr = xp + i * D;
        T* yr = yp + i * D;
        for (int64_t j = 0; j < D; ++j) {
          A v = (static_cast<A>(xr[j]) - m) * r * static_cast<A>(wp[j]);
          if constexpr (!kRms) v += static_cast<A>(bp[j]);
          yr[j] = static_cast<T>(v);
        }
      }
    });
  });
  return out;
}

// One row of the row norms' backward: dx = r * (g * w - c1 - xhat * c2), and the row's terms of
// dw (g * xhat) and db (g) added to pw and pb. The restrict parameters let the loop vectorize.
template <bool kRms, typename T, typename A>
void row_grads(const T* __restrict g, const T* __restrict x, const T* __restrict w,
               T* __restrict dx, A* __restrict pw, A* __restrict pb, int64_t D, A m, A r, A c1,
               A c2) {
  for (int64_t j = 0; j < D; ++j) {
    const A gj = static_cast<A>(g[j]), xh = (static_cast<A>(x[j]) - m) * r;
    dx[j] = static_cast<T>(r * (gj * static_cast<A>(w[j]) - c1 - xh * c2));
    pw[j] += gj * xh;
    if constexpr (!kRms) pb[j] += gj;
  }
}

// At most this many chunks of rows for the weight and bias sums of the row norms' backward (their
// partial sums are kMaxChunks * D floats at most).
constexpr int64_t kMaxChunks = 64;

// grad, x: (M, D), w: (D,) -> dx: (M, D), dw: (D,), db: (D,) (rms: no db), in one pass over the
// rows. The rows are cut into chunks fixed by M and D alone; each chunk sums dw = grad * xhat and
// db = grad over its rows into its own partial sums, which are then added in chunk order
// (Note [Deterministic reductions]).
template <bool kRms>
std::vector<Tensor> row_norm_backward(const char* name, const std::vector<TensorSpec>& specs,
                                      const Tensor& grad, const Tensor& input,
                                      const Tensor& weight, IntArrayRef normalized_shape,
                                      double eps) {
  std::vector<Tensor> outs;
  for (const TensorSpec& spec : specs) outs.push_back(alloc(spec));
  const int64_t D = trailing_numel(normalized_shape), M = D == 0 ? 0 : input.numel() / D;
  if (D == 0) return outs;
  Tensor g = grad.contiguous(), x = input.contiguous(), w = weight.contiguous();
  KILN_DISPATCH_FLOAT_TYPES(input.dtype(), name, [&] {
    using T = scalar_t;
    using A = acc_t<T>;
    constexpr int kSums = kRms ? 1 : 2;  // dw, db
    const T *gp = data_of<T>(g), *xp = data_of<T>(x), *wp = data_of<T>(w);
    T* dp = mutable_data_of<T>(outs[0]);
    const int64_t rows = std::max(grain_for(D), (M + kMaxChunks - 1) / kMaxChunks);
    const int64_t chunks = (M + rows - 1) / rows;
    std::vector<A> part(chunks * kSums * D);
    const A n = static_cast<A>(D), inv_d = A(1) / n;
    parallel_for(chunks, 1, [&](int64_t c0, int64_t c1) {
      for (int64_t c = c0; c < c1; ++c) {
        A* pw = part.data() + c * kSums * D;
        A* pb = pw + (kSums - 1) * D;  // rms: unused
        std::fill(pw, pw + kSums * D, A(0));
        for (int64_t i = c * rows; i < std::min(M, (c + 1) * rows); ++i) {
          // the mean, then the squared deviations with both gradient sums in one more pass
          const T *gr = gp + i * D, *xr = xp + i * D;
          const A m =
              kRms ? A(0) : lane_sum<A>(D, [xr](int64_t j) { return static_cast<A>(xr[j]); }) / n;
          auto [v, s1, s2] = lane_sums3<A>(D, [&](int64_t j, A& a, A& b, A& e) {
            const A d = static_cast<A>(xr[j]) - m;
            const A gw = static_cast<A>(gr[j]) * static_cast<A>(wp[j]);
            a += d * d;
            b += gw;
            e += gw * d;
          });
          const A r = A(1) / std::sqrt(v / n + static_cast<A>(eps));  // as stats()
          const A c1 = kRms ? A(0) : s1 * inv_d, c2 = s2 * r * inv_d;
          row_grads<kRms>(gr, xr, wp, dp + i * D, pw, pb, D, m, r, c1, c2);
        }
      }
    });
    // column j of every partial sum, added in chunk order (zeros when M is 0)
    parallel_for(D, grain_for(chunks * kSums), [&](int64_t j0, int64_t j1) {
      for (int k = 0; k < kSums; ++k) {
        T* op = mutable_data_of<T>(outs[1 + k]);
        for (int64_t j = j0; j < j1; ++j) {
          A acc = 0;
          for (int64_t c = 0; c < chunks; ++c) acc += part[(c * kSums + k) * D + j];
          op[j] = static_cast<T>(acc);
        }
      }
    });
  });
  return outs;
}

Tensor layer_norm_cpu(const Tensor& input, IntArrayRef normalized_shape, const Tensor& weight,
                      const Tensor& bias, double eps) {
  TensorSpec spec = meta::layer_norm(input, normalized_shape, weight, bias, eps);
  return row_norm_forward<false>("layer_norm", spec, input, normalized_shape, weight, &bias, eps);
}

std::tuple<Tensor, Tensor, Tensor> layer_norm_backward_cpu(const Tensor& grad,
                                                           const Tensor& input,
                                                           const Tensor& weight,
                                                           IntArrayRef normalized_shape,
                                                           double eps) {
  std::vector<TensorSpec> specs =
      meta::layer_norm_backward(grad, input, weight, normalized_shape, eps);
  std::vector<Tensor> o = row_norm_backward<false>("_layer_norm_backward", specs, grad, input,
                                                   weight, normalized_shape, eps);
  return {o[0], o[1], o[2]};
}

Tensor rms_norm_cpu(const Tensor& input, IntArrayRef normalized_shape, const Tensor& weight,
                    double eps) {
  TensorSpec spec = meta::rms_norm(input, normalized_shape, weight, eps);
  return row_norm_forward<true>("rms_norm", spec, input, normalized_shape, weight, nullptr, eps);
}

std::tuple<Tensor, Tensor> rms_norm_backward_cpu(const Tensor& grad, const Tensor& input,
                                                 const Tensor& weight,
                                                 IntArrayRef normalized_shape, double eps) {
  std::vector<TensorSpec> specs =
      meta::rms_norm_backward(grad, input, weight, normalized_shape, eps);
  std::vector<Tensor> o = row_norm_backward<true>("_rms_norm_backward", specs, grad, input, weight,
                                                  normalized_shape, eps);
  return {o[0], o[1]};
}

// ---- group_norm and batch_norm: (N, C, S) -----------------------------------------------------

struct NCS {
  int64_t N, C, S;
};
NCS ncs_of(const Tensor& input) {
  const int64_t N = input.size(0), C = input.size(1);
  return {N, C, N * C == 0 ? 0 : input.numel() / (N * C)};
}

// The set of (sample n, group g) of group norm, and of channel c of batch norm.
Runs group_set(const NCS& d, int64_t G, int64_t n, int64_t g) {
  const int64_t L = d.C / G * d.S;
  return {(n * G + g) * L, 1, 0, L};
}
Runs channel_set(const NCS& d, int64_t c) { return {c * d.S, d.N, d.C * d.S, d.S}; }

// y = x * scale + shift over one run.
template <typename T, typename A>
void affine_run(const T* x, T* y, int64_t n, A scale, A shift) {
  for (int64_t i = 0; i < n; ++i) y[i] = static_cast<T>(static_cast<A>(x[i]) * scale + shift);
}

// sum(g) and sum(g * (x - m) * r) over one run.
template <typename T, typename A>
void grad_sums_run(const T* g, const T* x, int64_t n, A m, A r, A& s1, A& s2) {
  auto [a, b] = lane_sums2<A>(n, [=](int64_t i, A& sa, A& sb) {
    A gi = static_cast<A>(g[i]);
    sa += gi;
    sb += gi * (static_cast<A>(x[i]) - m) * r;
  });
  s1 += a;
  s2 += b;
}

// dx = k * (g - c1 - (x - m) * r * c2) over one run.
template <typename T, typename A>
void grad_input_run(const T* g, const T* x, T* dx, int64_t n, A m, A r, A k, A c1, A c2) {
  for (int64_t i = 0; i < n; ++i)
    dx[i] = static_cast<T>(k * (static_cast<A>(g[i]) - c1 - (static_cast<A>(x[i]) - m) * r * c2));
}

Tensor group_norm_cpu(const Tensor& input, int64_t G, const Tensor& weight, const Tensor& bias,
                      double eps) {
  Tensor out = alloc(meta::group_norm(input, G, weight, bias, eps));
  if (out.numel() == 0) return out;
  const NCS d = ncs_of(input);
  const int64_t Cg = d.C / G;
  Tensor x = input.contiguous(), w = weight.contiguous(), b = bias.contiguous();
  KILN_DISPATCH_FLOAT_TYPES(input.dtype(), "group_norm", [&] {
    using T = scalar_t;
    using A = acc_t<T>;
    const T *xp = data_of<T>(x), *wp = data_of<T>(w), *bp = data_of<T>(b);
    T* yp = mutable_data_of<T>(out);
    parallel_for(d.N * G, grain_for(Cg * d.S), [&](int64_t q0, int64_t q1) {
      for (int64_t q = q0; q < q1; ++q) {
        const Runs s = group_set(d, G, q / G, q % G);
        auto [m, r] = stats<false>(xp, s, eps);
        for (int64_t k = 0; k < Cg; ++k) {
          const int64_t c = (q % G) * Cg + k, off = s.base + k * d.S;
          const A scale = r * static_cast<A>(wp[c]);
          affine_run<T, A>(xp + off, yp + off, d.S, scale, static_cast<A>(bp[c]) - m * scale);
        }
      }
    });
  });
  return out;
}

// grad, x: (N, C, S), w: (C,) -> dx: (N, C, S), dw, db: (C,). Each (sample, group) task keeps its
// channels' sums of g and g * xhat, which give dx and, added over the samples in order, db and dw.
std::tuple<Tensor, Tensor, Tensor> group_norm_backward_cpu(const Tensor& grad, const Tensor& input,
                                                           const Tensor& weight, int64_t G,
                                                           double eps) {
  std::vector<TensorSpec> specs = meta::group_norm_backward(grad, input, weight, G, eps);
  Tensor dx = alloc(specs[0]), dw = alloc(specs[1]), db = alloc(specs[2]);
  const NCS d = ncs_of(input);
  const int64_t Cg = d.C / G;
  Tensor g = grad.contiguous(), x = input.contiguous(), w = weight.contiguous();
  KILN_DISPATCH_FLOAT_TYPES(input.dtype(), "_group_norm_backward", [&] {
    using T = scalar_t;
    using A = acc_t<T>;
    const T *gp = data_of<T>(g), *xp = data_of<T>(x), *wp = data_of<T>(w);
    T* dp = mutable_data_of<T>(dx);
    std::vector<A> sum_g(d.N * d.C), sum_gx(d.N * d.C);  // per (sample, channel)
    const A inv_n = A(1) / static_cast<A>(std::max<int64_t>(Cg * d.S, 1));
    parallel_for(d.N * G, grain_for(Cg * d.S), [&](int64_t q0, int64_t q1) {
      for (int64_t q = q0; q < q1; ++q) {
        const Runs s = group_set(d, G, q / G, q % G);
        auto [m, r] = stats<false>(xp, s, eps);
        A s1 = 0, s2 = 0;  // sums of gw and gw * xhat, gw = g * w[c]
        for (int64_t k = 0; k < Cg; ++k) {
          const int64_t c = (q % G) * Cg + k, off = s.base + k * d.S, nc = (q / G) * d.C + c;
          grad_sums_run<T, A>(gp + off, xp + off, d.S, m, r, sum_g[nc], sum_gx[nc]);
          s1 += static_cast<A>(wp[c]) * sum_g[nc];
          s2 += static_cast<A>(wp[c]) * sum_gx[nc];
        }
        for (int64_t k = 0; k < Cg; ++k) {
          const int64_t off = s.base + k * d.S;
          const A wc = static_cast<A>(wp[(q % G) * Cg + k]);
          for (int64_t i = 0; i < d.S; ++i) {
            A xh = (static_cast<A>(xp[off + i]) - m) * r;
            dp[off + i] = static_cast<T>(r * (static_cast<A>(gp[off + i]) * wc - s1 * inv_n -
                                              xh * s2 * inv_n));
          }
        }
      }
    });
    T *wo = mutable_data_of<T>(dw), *bo = mutable_data_of<T>(db);
    for (int64_t c = 0; c < d.C; ++c) {
      A a = 0, b = 0;
      for (int64_t n = 0; n < d.N; ++n) a += sum_gx[n * d.C + c], b += sum_g[n * d.C + c];
      wo[c] = static_cast<T>(a);
      bo[c] = static_cast<T>(b);
    }
  });
  return {dx, dw, db};
}

Tensor batch_norm_cpu(const Tensor& input, const Tensor& weight, const Tensor& bias, double eps) {
  Tensor out = alloc(meta::batch_norm(input, weight, bias, eps));
  if (out.numel() == 0) return out;
  const NCS d = ncs_of(input);
  Tensor x = input.contiguous(), w = weight.contiguous(), b = bias.contiguous();
  KILN_DISPATCH_FLOAT_TYPES(input.dtype(), "batch_norm", [&] {
    using T = scalar_t;
    using A = acc_t<T>;
    const T *xp = data_of<T>(x), *wp = data_of<T>(w), *bp = data_of<T>(b);
    T* yp = mutable_data_of<T>(out);
    parallel_for(d.C, grain_for(d.N * d.S), [&](int64_t c0, int64_t c1) {
      for (int64_t c = c0; c < c1; ++c) {
        const Runs s = channel_set(d, c);
        auto [m, r] = stats<false>(xp, s, eps);
        const A scale = r * static_cast<A>(wp[c]), shift = static_cast<A>(bp[c]) - m * scale;
        for (int64_t n = 0; n < d.N; ++n) {
          const int64_t off = s.base + n * s.stride;
          affine_run<T, A>(xp + off, yp + off, d.S, scale, shift);
        }
      }
    });
  });
  return out;
}

// dx = r w * (g - mean(g) - xhat * mean(g * xhat)) per channel (dw = sum(g * xhat) is the other
// row; they share the channel sums' code).
template <bool kWeight>
Tensor batch_norm_backward_impl(const TensorSpec& spec, const Tensor& grad, const Tensor& input,
                                const Tensor* weight, double eps) {
  Tensor out = alloc(spec);
  if (out.numel() == 0) return out;
  const NCS d = ncs_of(input);
  Tensor g = grad.contiguous(), x = input.contiguous();
  Tensor w = weight ? weight->contiguous() : Tensor();
  KILN_DISPATCH_FLOAT_TYPES(input.dtype(), "batch_norm_backward", [&] {
    using T = scalar_t;
    using A = acc_t<T>;
    const T *gp = data_of<T>(g), *xp = data_of<T>(x);
    const T* wp = kWeight ? nullptr : data_of<T>(w);
    T* dp = mutable_data_of<T>(out);
    const A inv_n = A(1) / static_cast<A>(d.N * d.S);
    parallel_for(d.C, grain_for(d.N * d.S), [&](int64_t c0, int64_t c1) {
      for (int64_t c = c0; c < c1; ++c) {
        const Runs s = channel_set(d, c);
        auto [m, r] = stats<false>(xp, s, eps);
        A s1 = 0, s2 = 0;
        for (int64_t n = 0; n < d.N; ++n) {
          const int64_t off = s.base + n * s.stride;
          grad_sums_run<T, A>(gp + off, xp + off, d.S, m, r, s1, s2);
        }
        if constexpr (kWeight) {
          dp[c] = static_cast<T>(s2);
          continue;
        } else {
          const A k = r * static_cast<A>(wp[c]);
          for (int64_t n = 0; n < d.N; ++n) {
            const int64_t off = s.base + n * s.stride;
            grad_input_run<T, A>(gp + off, xp + off, dp + off, d.S, m, r, k, s1 * inv_n, s2 * inv_n);
          }
        }
      }
    });
  });
  return out;
}

Tensor batch_norm_backward_cpu(const Tensor& grad, const Tensor& input, const Tensor& weight,
                               double eps) {
  TensorSpec spec = meta::batch_norm_backward(grad, input, weight, eps);
  return batch_norm_backward_impl<false>(spec, grad, input, &weight, eps);
}

Tensor batch_norm_backward_weight_cpu(const Tensor& grad, const Tensor& input, double eps) {
  TensorSpec spec = meta::batch_norm_backward_weight(grad, input, eps);
  return batch_norm_backward_impl<true>(spec, grad, input, nullptr, eps);
}

KILN_LIBRARY(CPU, m) {
  m.impl<ops::_layer_norm>(layer_norm_cpu);
  m.impl<ops::_layer_norm_backward>(layer_norm_backward_cpu);
  m.impl<ops::_rms_norm>(rms_norm_cpu);
  m.impl<ops::_rms_norm_backward>(rms_norm_backward_cpu);
  m.impl<ops::_group_norm>(group_norm_cpu);
  m.impl<ops::_group_norm_backward>(group_norm_backward_cpu);
  m.impl<ops::_batch_norm>(batch_norm_cpu);
  m.impl<ops::batch_norm_backward>(batch_norm_backward_cpu);
  m.impl<ops::batch_norm_backward_weight>(batch_norm_backward_weight_cpu);
}

}  // namespace
}  // namespace kiln::kernels
