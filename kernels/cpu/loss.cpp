// cross_entropy_indices and its backward on the CPU (tensor/ops/loss.toml). One task per block of
// rows; a row of logits is read once for its max, once for sum(exp) (and the weighted sum of the
// logits when smoothing), and once more by the backward, which writes the gradient directly:
// no log_softmax tensor is ever stored.
//
// With lse = logsumexp(x), e = label_smoothing, w = class weights (ones when absent), W = sum(w):
//   loss    = (1 - e) w_y (lse - x_y) + e/C (W lse - sum_c w_c x_c)       (0 for ignored rows)
//   dx_j    = g [((1 - e) w_y + e W / C) softmax(x)_j - (1 - e) w_y [j == y] - e/C w_j]
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "kiln/generated/meta_decls.h"
#include "kiln/generated/op_handles.h"
#include "loops.h"
#include "vec_math.h"

namespace kiln::kernels {
namespace {

template <typename A>
KILN_VEC_INLINE A exp_acc(A x) {
  if constexpr (std::is_same_v<A, float>) return vec::exp(x);
  else return std::exp(x);
}

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

// logsumexp of one row (max-shifted).
template <typename T, typename A>
A row_lse(const T* x, int64_t C) {
  A m = -std::numeric_limits<A>::infinity();
  for (int64_t c = 0; c < C; ++c) m = std::max(m, static_cast<A>(x[c]));
  if (std::isinf(m)) return m;
  // independent lanes, so the loop vectorizes (Note [Lane sums] in norm.cpp)
  constexpr int L = 16;
  A lanes[L] = {};
  int64_t c = 0;
  for (; c + L <= C; c += L)
    for (int l = 0; l < L; ++l) lanes[l] += exp_acc<A>(static_cast<A>(x[c + l]) - m);
  for (int l = 0; c < C; ++c, ++l) lanes[l] += exp_acc<A>(static_cast<A>(x[c]) - m);
  for (int w = L / 2; w > 0; w /= 2)
    for (int l = 0; l < w; ++l) lanes[l] += lanes[l + w];
  return m + std::log(lanes[0]);
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
        const A lse = row_lse<T, A>(xr, C), gi = static_cast<A>(gp[i]);
        const A wy = (1 - e) * cw.at(y[i]);
        const A coef = gi * (wy + eC * cw.total);
        if (cw.w.empty()) {
          const A shift = gi * eC;
          for (int64_t c = 0; c < C; ++c)
            dr[c] = static_cast<T>(coef * exp_acc<A>(static_cast<A>(xr[c]) - lse) - shift);
        } else {
          const A* w = cw.w.data();
          for (int64_t c = 0; c < C; ++c)
            dr[c] = static_cast<T>(coef * exp_acc<A>(static_cast<A>(xr[c]) - lse) - gi * eC * w[c]);
        }
        const A py = exp_acc<A>(static_cast<A>(xr[y[i]]) - lse);  // the target's entry, unrounded
        dr[y[i]] = static_cast<T>(coef * py - gi * eC * cw.at(y[i]) - gi * wy);
      }
    });
  });
  return out;
}

KILN_LIBRARY(CPU, m) {
  m.impl<ops::cross_entropy_indices>(cross_entropy_indices_cpu);
  m.impl<ops::cross_entropy_indices_backward>(cross_entropy_indices_backward_cpu);
}

}  // namespace
}  // namespace kiln::kernels
