// binary_cross_entropy's pointwise loss, cross_entropy_indices and its backward on the CPU
// (tensor/ops/loss.toml). Cross-entropy: one task per block of rows; a row of logits is read once
// for its max, once for sum(exp) (and the weighted sum of the logits when smoothing). The backward
// reads it for its max, then writes the gradient directly (Note [Cross-entropy backward rows]): no
// log_softmax tensor is ever stored.
//
// With lse = logsumexp(x), e = label_smoothing, w = class weights (ones when absent), W = sum(w):
//   loss    = (1 - e) w_y (lse - x_y) + e/C (W lse - sum_c w_c x_c)       (0 for ignored rows)
//   dx_j    = g [((1 - e) w_y + e W / C) softmax(x)_j - (1 - e) w_y [j == y] - e/C w_j]
#include <algorithm>
#include <atomic>
#include <cmath>
#include <limits>
#include <vector>

#include "kiln/generated/meta/loss.h"
#include "kiln/generated/ops/loss.h"
#include "kiln/pointwise_math.h"
#include "loops.h"
#include "vec_math.h"

namespace kiln::kernels {
namespace {

// The targets as int64, checked: ignore_index or a class in [0, C).
std::vector<int64_t> checked_targets(const char* op, const Tensor& target, int64_t C,
                                     int64_t ignore_index) {
  Tensor t = target.contiguous();
  const int64_t* p = static_cast<const int64_t*>(t.impl()->raw_data());
  std::vector<int64_t> out(p, p + t.numel());
  for (int64_t y : out)
    KILN_CHECK(y == ignore_index || (y >= 0 && y < C), Index, op, ": target ", y,
               " is out of bounds for ", C, " classes");
  return out;
}

// Everything a row's loss and gradient need from the class weights.
template <typename A>
struct ClassWeights {
  std::vector<A> w;  // empty: all ones
  A total = 0;
  A at(int64_t c) const { return w.empty() ? A(1) : w[c]; }
};

template <typename T, typename A>
ClassWeights<A> class_weights(const std::optional<Tensor>& weight, int64_t C) {
  ClassWeights<A> cw;
  cw.total = static_cast<A>(C);
  if (!weight) return cw;
  Tensor w = weight->contiguous();
  const T* p = static_cast<const T*>(w.impl()->raw_data());
  cw.total = 0;
  for (int64_t c = 0; c < C; ++c) {
    cw.w.push_back(static_cast<A>(p[c]));
    cw.total += cw.w.back();
  }
  return cw;
}

// Sum over c in [0, C) of f(c) in L independent lanes folded pairwise: a fixed order, and a loop
// the compiler vectorizes (Note [Lane sums] in norm.cpp).
template <typename A, typename F>
KILN_VEC_INLINE A lane_reduce(int64_t C, A init, const F& f) {
  constexpr int L = 16;
  A lanes[L];
  for (int l = 0; l < L; ++l) lanes[l] = init;
  int64_t c = 0;
  for (; c + L <= C; c += L)
    for (int l = 0; l < L; ++l) lanes[l] = f(lanes[l], c + l);
  for (int l = 0; c < C; ++c, ++l) lanes[l] = f(lanes[l], c);
  for (int w = L / 2; w > 0; w /= 2)
    for (int l = 0; l < w; ++l) lanes[l] = f.fold(lanes[l], lanes[l + w]);
  return lanes[0];
}

// max of one row, NaNs skipped (-inf for an empty row).
template <typename T, typename A>
A row_max(const T* x, int64_t C) {
  struct {
    const T* x;
    A operator()(A m, int64_t c) const { return std::max(m, static_cast<A>(x[c])); }
    A fold(A a, A b) const { return std::max(a, b); }
  } f{x};
  return lane_reduce<A>(C, -std::numeric_limits<A>::infinity(), f);
}

// sum of e^(x - m) over one row, m finite; x - m <= 0 (NaN stays NaN).
template <typename T, typename A>
A row_sum_exp(const T* x, int64_t C, A m) {
  struct {
    const T* x;
    A m;
    A operator()(A s, int64_t c) const {
      return s + vec::exp_nonpositive_acc<A>(static_cast<A>(x[c]) - m);
    }
    A fold(A a, A b) const { return a + b; }
  } f{x, m};
  return lane_reduce<A>(C, A(0), f);
}

// logsumexp of one row (max-shifted).
template <typename T, typename A>
A row_lse(const T* x, int64_t C) {
  const A m = row_max<T, A>(x, C);
  if (std::isinf(m)) return m;
  return m + std::log(row_sum_exp<T, A>(x, C, m));
}

// One gradient row: d_c = scale * u_c - ge w_c (w_c = 1 without class weights), where u_c is
// e^(src_c + shift) (kExp) or src_c; src may be d.
template <bool kExp, typename T, typename A>
void scale_row(T* d, const T* src, A shift, A scale, A ge, const ClassWeights<A>& cw, int64_t C) {
  auto u = [&](int64_t c) {
    if constexpr (kExp) return vec::exp_acc<A>(static_cast<A>(src[c]) + shift);
    else return static_cast<A>(src[c]);
  };
  if (cw.w.empty()) {
    for (int64_t c = 0; c < C; ++c) d[c] = static_cast<T>(scale * u(c) - ge);
  } else {
    const A* w = cw.w.data();
    for (int64_t c = 0; c < C; ++c) d[c] = static_cast<T>(scale * u(c) - ge * w[c]);
  }
}

// input: (N, C), target: (N,) -> (N,)
Tensor cross_entropy_indices_cpu(const Tensor& input, const Tensor& target,
                                 const std::optional<Tensor>& weight, int64_t ignore_index,
                                 double label_smoothing) {
  TensorSpec spec =
      meta::cross_entropy_indices(input, target, weight, ignore_index, label_smoothing);
  Tensor out = empty_strided_on(spec.sizes, spec.strides, spec.dtype, spec.device);
  const int64_t N = input.size(0), C = input.size(1);
  const std::vector<int64_t> y = checked_targets("cross_entropy", target, C, ignore_index);
  if (N == 0) return out;
  Tensor x = input.contiguous();
  KILN_DISPATCH_FLOAT_TYPES(spec.dtype, "cross_entropy", [&] {
    using T = scalar_t;
    using A = acc_t<T>;
    const ClassWeights<A> cw = class_weights<T, A>(weight, C);
    const A e = static_cast<A>(label_smoothing);
    const T* xp = static_cast<const T*>(x.impl()->raw_data());
    T* lp = static_cast<T*>(out.impl()->raw_data());
    parallel_for(N, std::max<int64_t>(1, kGrainSize / std::max<int64_t>(C, 1)), [&](int64_t b, int64_t end) {
      for (int64_t i = b; i < end; ++i) {
        if (y[i] == ignore_index) {
          lp[i] = T(0);
          continue;
        }
        const T* xr = xp + i * C;
        const A lse = row_lse<T, A>(xr, C);
        A loss = (1 - e) * cw.at(y[i]) * (lse - static_cast<A>(xr[y[i]]));
        if (e > 0) {
          A wx = 0;
          for (int64_t c = 0; c < C; ++c) wx += cw.at(c) * static_cast<A>(xr[c]);
          loss += e / static_cast<A>(C) * (cw.total * lse - wx);
        }
        lp[i] = static_cast<T>(loss);
      }
    });
  });
  return out;
}

// grad: (N,), input: (N, C), target: (N,) -> (N, C)
Tensor cross_entropy_indices_backward_cpu(const Tensor& grad, const Tensor& input,
                                          const Tensor& target,
                                          const std::optional<Tensor>& weight,
                                          int64_t ignore_index, double label_smoothing) {
  TensorSpec spec = meta::cross_entropy_indices_backward(grad, input, target, weight, ignore_index,
                                                         label_smoothing);
  Tensor out = empty_strided_on(spec.sizes, spec.strides, spec.dtype, spec.device);
  const int64_t N = input.size(0), C = input.size(1);
  const std::vector<int64_t> y = checked_targets("cross_entropy", target, C, ignore_index);
  if (out.numel() == 0) return out;
  Tensor x = input.contiguous(), g = grad.contiguous();
  KILN_DISPATCH_FLOAT_TYPES(spec.dtype, "cross_entropy_backward", [&] {
    using T = scalar_t;
    using A = acc_t<T>;
    const ClassWeights<A> cw = class_weights<T, A>(weight, C);
    const A e = static_cast<A>(label_smoothing), eC = e / static_cast<A>(C);
    const T *xp = static_cast<const T*>(x.impl()->raw_data()), *gp = static_cast<const T*>(g.impl()->raw_data());
    T* dp = static_cast<T*>(out.impl()->raw_data());
    parallel_for(N, std::max<int64_t>(1, kGrainSize / C), [&](int64_t b, int64_t end) {
      for (int64_t i = b; i < end; ++i) {
        T* dr = dp + i * C;
        if (y[i] == ignore_index) {
          std::fill(dr, dr + C, T(0));
          continue;
        }
        const T* xr = xp + i * C;
        const A gi = static_cast<A>(gp[i]);
        const A wy = (1 - e) * cw.at(y[i]);
        const A coef = gi * (wy + eC * cw.total);
        const A m = row_max<T, A>(xr, C);
        // dr = scale * u - the smoothing term, u = e^(x - m) (stored in dr first) or e^(x - lse)
        A scale = coef, py;
        if (std::is_same_v<T, A> && !std::isinf(m)) {
          // Note [Cross-entropy backward rows]: e^(x - m) is stored in dr while it is summed,
          // then scaled in place: one exp per element, as in the forward.
          struct {
            const T* x;
            T* d;
            A m;
            A operator()(A s, int64_t c) const {
              const A u = vec::exp_nonpositive_acc<A>(static_cast<A>(x[c]) - m);
              d[c] = static_cast<T>(u);
              return s + u;
            }
            A fold(A a, A b) const { return a + b; }
          } f{xr, dr, m};
          scale = coef / lane_reduce<A>(C, A(0), f);
          py = static_cast<A>(dr[y[i]]);
          scale_row<false>(dr, dr, A(0), scale, gi * eC, cw, C);
        } else {  // 16-bit types round once; an infinite max takes the plain formula
          const A lse = std::isinf(m) ? m : m + std::log(row_sum_exp<T, A>(xr, C, m));
          scale_row<true>(dr, xr, -lse, scale, gi * eC, cw, C);
          py = vec::exp_acc<A>(static_cast<A>(xr[y[i]]) - lse);  // the target's entry, unrounded
        }
        dr[y[i]] = static_cast<T>(scale * py - gi * eC * cw.at(y[i]) - gi * wy);
      }
    });
  });
  return out;
}

// _binary_cross_entropy: input, target (broadcast to out) -> out =
// (t - 1) max(log1p(-x), -100) - t max(log(x), -100), PyTorch's CPU kernel (same expression, so
// the same rounding; kiln/pointwise_math.h, shared with CUDA). An input outside [0, 1] (or nan)
// is a ValueError, as PyTorch's check.
void binary_cross_entropy_cpu(const Tensor& out, const Tensor& input, const Tensor& target) {
  auto in = cast_inputs(out.dtype(), input, target);
  std::atomic<bool> outside{false};  // set from the parallel loop, raised after it
  KILN_DISPATCH_FLOAT_TYPES(out.dtype(), "binary_cross_entropy", [&] {
    using T = scalar_t;
    using A = acc_t<T>;
    binary_kernel<T>(out, in[0], in[1], [&outside](T xv, T tv) {
      const A x = static_cast<A>(xv), t = static_cast<A>(tv);
      if (!(x >= A(0) && x <= A(1))) outside.store(true, std::memory_order_relaxed);
      return static_cast<T>(math::binary_cross_entropy(x, t));
    });
  });
  KILN_CHECK(!outside.load(), Value,
             "binary_cross_entropy: all elements of input should be between 0 and 1");
}

KILN_LIBRARY(CPU, m) {
  m.structured<ops::_binary_cross_entropy>(binary_cross_entropy_cpu);
  m.impl<ops::cross_entropy_indices>(cross_entropy_indices_cpu);
  m.impl<ops::cross_entropy_indices_backward>(cross_entropy_indices_backward_cpu);
}

}  // namespace
}  // namespace kiln::kernels
