// Decompositions of the norm, dropout, embedding and loss rows (tensor/ops/nn.toml, loss.toml)
// and of the softmax and gelu backward rows (reduction.toml, unary.toml). Two kinds:
//  - the composite rows users call (layer_norm, cross_entropy, ...), which fill in defaults and
//    call the fused kernel rows (Note [Fused norm rows] in nn.toml);
//  - the decompositions of the fused backward rows (derivative "decompose"): the same math
//    written with table ops, which is what double backward and forward AD differentiate
//    (Note [Differentiating by decomposition]). The CPU kernels must agree with them
//    (tests/kernels/norm_test.cpp checks that).
#include <cmath>
#include <limits>
#include <tuple>

#include "kiln/generated/composite/copy.h"
#include "kiln/generated/composite/creation.h"
#include "kiln/generated/composite/loss.h"
#include "kiln/generated/composite/nn.h"
#include "kiln/generated/composite/reduction.h"
#include "kiln/generated/composite/shape.h"
#include "kiln/generated/composite/unary.h"
#include "kiln/generated/composite/views.h"
#include "kiln/generated/meta/loss.h"
#include "kiln/generated/meta/nn.h"
#include "kiln/generated/meta/unary.h"
#include "kiln/meta.h"
#include "kiln/operators.h"
#include "kiln/pointwise_math.h"

namespace kiln::composite {
namespace {

// The trailing dims -k .. -1 of a norm over normalized_shape.
std::vector<int64_t> trailing_dims(IntArrayRef normalized_shape) {
  std::vector<int64_t> dims;
  for (int64_t i = -static_cast<int64_t>(normalized_shape.size()); i < 0; ++i) dims.push_back(i);
  return dims;
}

// Sums `t` over its leading dims (all but the last k); t itself when there are none.
Tensor sum_leading(const Tensor& t, int64_t k) {
  std::vector<int64_t> dims;
  for (int64_t d = 0; d < t.dim() - k; ++d) dims.push_back(d);
  return dims.empty() ? t : t.sum(dims);
}

// Sums (N, C, *) over every dim but the channel dim 1.
Tensor channel_sum(const Tensor& t) {
  std::vector<int64_t> dims;
  for (int64_t d = 0; d < t.dim(); ++d)
    if (d != 1) dims.push_back(d);
  return t.sum(dims);
}

// (1, C, 1, ...) for a per-channel parameter of an (N, C, *) input.
Tensor per_channel(const Tensor& p, const Tensor& input) {
  std::vector<int64_t> shape(input.dim(), 1);
  shape[1] = input.size(1);
  return p.reshape(shape);
}

std::vector<int64_t> all_but_channel(const Tensor& input) {
  std::vector<int64_t> dims;
  for (int64_t d = 0; d < input.dim(); ++d)
    if (d != 1) dims.push_back(d);
  return dims;
}

// xhat = (x - mean) * rsqrt(var + eps) over `dims`; r = rsqrt(var + eps) (keepdim).
struct Normalized {
  Tensor xhat, r;
};
Normalized normalize(const Tensor& x, const std::vector<int64_t>& dims, double eps) {
  Tensor mu = x.mean(dims, true);
  Tensor r = rsqrt(x.var(dims, 0.0, true) + eps);
  return {(x - mu) * r, r};
}

// dL/dx of xhat * w + b over `dims`, given gw = dL/dy * w: r * (gw - mean(gw) - xhat *
// mean(gw * xhat)).
Tensor normalized_grad(const Tensor& gw, const Normalized& n, const std::vector<int64_t>& dims) {
  return n.r * (gw - gw.mean(dims, true) - n.xhat * (gw * n.xhat).mean(dims, true));
}

// Group norm works on the (N, G, C / G * prod(spatial)) view.
Tensor grouped(const Tensor& t, int64_t num_groups) {
  const int64_t N = t.size(0);
  return t.reshape({N, num_groups, N == 0 ? 0 : t.numel() / (N * num_groups)});
}

Tensor reduce_loss(const Tensor& loss, std::string_view reduction) {
  if (reduction == "sum") return loss.sum();
  if (reduction == "mean") return loss.mean();
  return loss;
}

Tensor scalar_like(double v, const Tensor& like) {
  return kiln::full({}, v, like.dtype(), like.device());
}

}  // namespace

// ---- norms ------------------------------------------------------------------------------------

Tensor layer_norm(const Tensor& input, IntArrayRef normalized_shape,
                  const std::optional<Tensor>& weight, const std::optional<Tensor>& bias,
                  double eps) {
  meta::layer_norm(input, normalized_shape, weight, bias, eps);
  Tensor w = weight ? *weight : kiln::ones(normalized_shape, input.dtype(), input.device());
  Tensor b = bias ? *bias : kiln::zeros(normalized_shape, input.dtype(), input.device());
  return kiln::_layer_norm(input, normalized_shape, w, b, eps);
}

// (grad_input, grad_weight, grad_bias) of y = xhat * w + b over the trailing dims.
std::tuple<Tensor, Tensor, Tensor> layer_norm_backward(const Tensor& grad, const Tensor& input,
                                                       const Tensor& weight,
                                                       IntArrayRef normalized_shape, double eps) {
  std::vector<int64_t> dims = trailing_dims(normalized_shape);
  const int64_t k = static_cast<int64_t>(normalized_shape.size());
  Normalized n = normalize(input, dims, eps);
  return {normalized_grad(grad * weight, n, dims), sum_leading(grad * n.xhat, k),
          sum_leading(grad, k)};
}

Tensor rms_norm(const Tensor& input, IntArrayRef normalized_shape,
                const std::optional<Tensor>& weight, std::optional<double> eps) {
  meta::rms_norm(input, normalized_shape, weight, eps);
  Tensor w = weight ? *weight : kiln::ones(normalized_shape, input.dtype(), input.device());
  // As PyTorch: eps defaults to the machine epsilon of the input's dtype.
  double e = 0;
  switch (input.dtype()) {
    case kFloat16: e = 0.0009765625; break;
    case kBFloat16: e = 0.0078125; break;
    case kFloat64: e = std::numeric_limits<double>::epsilon(); break;
    default: e = std::numeric_limits<float>::epsilon(); break;
  }
  return kiln::_rms_norm(input, normalized_shape, w, eps.value_or(e));
}

// y = x * r * w with r = rsqrt(mean(x^2) + eps): dx = r * (gw - x * r^2 * mean(gw * x)),
// dw = sum over the leading dims of grad * x * r.
std::tuple<Tensor, Tensor> rms_norm_backward(const Tensor& grad, const Tensor& input,
                                             const Tensor& weight, IntArrayRef normalized_shape,
                                             double eps) {
  std::vector<int64_t> dims = trailing_dims(normalized_shape);
  Tensor r = rsqrt((input * input).mean(dims, true) + eps);
  Tensor gw = grad * weight;
  return {r * (gw - input * (r * r) * (gw * input).mean(dims, true)),
          sum_leading(grad * input * r, static_cast<int64_t>(normalized_shape.size()))};
}

Tensor group_norm(const Tensor& input, int64_t num_groups, const std::optional<Tensor>& weight,
                  const std::optional<Tensor>& bias, double eps) {
  meta::group_norm(input, num_groups, weight, bias, eps);
  const int64_t C = input.size(1);
  Tensor w = weight ? *weight : kiln::ones({C}, input.dtype(), input.device());
  Tensor b = bias ? *bias : kiln::zeros({C}, input.dtype(), input.device());
  return kiln::_group_norm(input, num_groups, w, b, eps);
}

// (grad_input, grad_weight, grad_bias) of y = xhat * w + b, xhat over (C / G, *) per group.
std::tuple<Tensor, Tensor, Tensor> group_norm_backward(const Tensor& grad, const Tensor& input,
                                                       const Tensor& weight, int64_t num_groups,
                                                       double eps) {
  Normalized n = normalize(grouped(input, num_groups), {2}, eps);
  Tensor gw = grouped(grad * per_channel(weight, input), num_groups);
  return {normalized_grad(gw, n, {2}).reshape(input.sizes()),
          channel_sum(grad * n.xhat.reshape(input.sizes())), channel_sum(grad)};
}

Tensor batch_norm(const Tensor& input, const std::optional<Tensor>& weight,
                  const std::optional<Tensor>& bias, const std::optional<Tensor>& running_mean,
                  const std::optional<Tensor>& running_var, bool training, double momentum,
                  double eps) {
  meta::batch_norm(input, weight, bias, running_mean, running_var, training, momentum, eps);
  const int64_t C = input.size(1);
  if (!training) {  // the running statistics, with table ops (a per-channel affine map)
    Tensor out = (input - per_channel(*running_mean, input)) *
                 per_channel(rsqrt(*running_var + eps), input);
    if (weight) out = out * per_channel(*weight, input);
    if (bias) out = out + per_channel(*bias, input);
    return out;
  }
  if (running_mean && input.numel() > 0) {  // no gradient flows into the running statistics
    Tensor x = input.detach();
    std::vector<int64_t> dims = all_but_channel(x);
    Tensor rm = running_mean->detach(), rv = running_var->detach();
    rm.copy_(rm * (1 - momentum) + x.mean(dims) * momentum);
    rv.copy_(rv * (1 - momentum) + x.var(dims, 1.0, false) * momentum);
  }
  Tensor w = weight ? *weight : kiln::ones({C}, input.dtype(), input.device());
  Tensor b = bias ? *bias : kiln::zeros({C}, input.dtype(), input.device());
  return kiln::_batch_norm(input, w, b, eps);
}

Tensor batch_norm_backward(const Tensor& grad, const Tensor& input, const Tensor& weight,
                           double eps) {
  std::vector<int64_t> dims = all_but_channel(input);
  return normalized_grad(grad * per_channel(weight, input), normalize(input, dims, eps), dims);
}

Tensor batch_norm_backward_weight(const Tensor& grad, const Tensor& input, double eps) {
  return channel_sum(grad * normalize(input, all_but_channel(input), eps).xhat);
}

// ---- dropout, embedding -----------------------------------------------------------------------

Tensor dropout(const Tensor& input, double p, bool train, std::optional<Generator> generator) {
  meta::dropout(input, p, train, generator);
  if (!train || p == 0) return input.alias();
  Generator& g = generator ? *generator : default_generator();
  auto [seed, offset] = g.reserve(random_counters(RandomWidth::k32, input.numel()));
  return kiln::dropout_seeded(input, p, static_cast<int64_t>(seed), static_cast<int64_t>(offset));
}

// The rows of grad (one per index) summed into their weight rows.
Tensor embedding_dense_backward(const Tensor& grad, const Tensor& indices, int64_t num_weights,
                                int64_t padding_idx, bool scale_grad_by_freq) {
  meta::embedding_dense_backward(grad, indices, num_weights, padding_idx, scale_grad_by_freq);
  const int64_t n = indices.numel(), D = grad.size(grad.dim() - 1);
  Tensor idx = indices.reshape({n}).to(kInt64);
  Tensor g = grad.reshape({n, D});
  if (padding_idx >= 0) g = g * (idx != Scalar(padding_idx)).to(g.dtype()).unsqueeze(1);
  if (scale_grad_by_freq) {
    Tensor counts = kiln::zeros({num_weights}, g.dtype(), g.device())
                        .scatter_add(0, idx, kiln::ones({n}, g.dtype(), g.device()));
    g = g / counts.index_select(0, idx).unsqueeze(1);
  }
  return kiln::zeros({num_weights, D}, g.dtype(), g.device())
      .scatter_add(0, idx.unsqueeze(1).expand({n, D}), g);
}

// ---- softmax backward -------------------------------------------------------------------------

Tensor softmax_backward_data(const Tensor& grad, const Tensor& output, int64_t dim) {
  return output * (grad - (grad * output).sum(std::vector<int64_t>{dim}, true));
}

Tensor log_softmax_backward_data(const Tensor& grad, const Tensor& output, int64_t dim) {
  return grad - exp(output) * grad.sum(std::vector<int64_t>{dim}, true);
}

// ---- gelu backward ----------------------------------------------------------------------------

// gelu(x) = x * Phi(x) (approximate="none") or 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
// The tensor form of math::gelu_erf_backward and math::gelu_tanh_backward, with their constants
// (See Note [One home per formula]), so that its own derivative exists.
Tensor gelu_backward(const Tensor& grad, const Tensor& self, std::string_view approximate) {
  meta::gelu_backward(grad, self, approximate);
  if (approximate == "none") {
    // d/dx x Phi(x) = Phi(x) + x phi(x), phi(x) = exp(-x^2/2) / sqrt(2 pi)
    Tensor cdf = (erf(self * math::kSqrt1_2) + 1) * 0.5;
    Tensor pdf = exp(self * self * -0.5) * math::kInvSqrt2Pi;
    return grad * (cdf + self * pdf);
  }
  constexpr double kBeta = math::kSqrt2OverPi, kKappa = math::kGeluTanhCoeff;
  Tensor x_sq = self * self;
  Tensor inner = (self + x_sq * self * kKappa) * kBeta;
  Tensor t = tanh(inner);
  Tensor left = self * 0.5;
  Tensor right = t + 1;
  Tensor left_derivative = right * 0.5;
  Tensor right_derivative = (1 - t * t) * ((x_sq * (3 * kKappa) + 1) * kBeta);
  return grad * (left_derivative + left * right_derivative);
}

// ---- losses -----------------------------------------------------------------------------------

// Class indices go through the fused cross_entropy_indices on an (M, C) view (class dim last);
// probabilities through log_softmax.
Tensor cross_entropy(const Tensor& input, const Tensor& target, const std::optional<Tensor>& weight,
                     std::string_view reduction, int64_t ignore_index, double label_smoothing) {
  meta::cross_entropy(input, target, weight, reduction, ignore_index, label_smoothing);
  const int64_t cdim = input.dim() == 1 ? 0 : 1, C = input.size(cdim);
  if (is_floating(target.dtype())) {
    Tensor t = label_smoothing > 0 ? target * (1 - label_smoothing) + label_smoothing / C : target;
    Tensor prod = log_softmax(input, cdim) * t;
    if (weight) {
      std::vector<int64_t> shape(input.dim(), 1);
      shape[cdim] = C;
      prod = prod * weight->reshape(shape);
    }
    return reduce_loss(-prod.sum(std::vector<int64_t>{cdim}), reduction);
  }
  Tensor x = input;
  if (input.dim() == 1) {
    x = input.unsqueeze(0);
  } else if (input.dim() > 2) {
    std::vector<int64_t> perm{0};
    for (int64_t d = 2; d < input.dim(); ++d) perm.push_back(d);
    perm.push_back(1);
    x = input.permute(perm).reshape({target.numel(), C});
  }
  Tensor t = target.reshape({target.numel()});
  Tensor keep = t != Scalar(ignore_index);
  Tensor per;
  // Class weights that need a gradient (or carry a tangent) take the written-out path: the fused
  // row treats them as constants.
  if (weight && weight->key_set().has(DispatchKey::Autograd)) {
    Tensor logp = log_softmax(x, 1);
    Tensor y = where(keep, t, kiln::zeros({}, kInt64, t.device()));
    Tensor nll = -logp.gather(1, y.unsqueeze(1)).squeeze(std::vector<int64_t>{1});
    Tensor smooth = -(logp * weight->unsqueeze(0)).sum(std::vector<int64_t>{1});
    per = (nll * weight->index_select(0, y) * (1 - label_smoothing) +
           smooth * (label_smoothing / C)) * keep.to(input.dtype());
  } else {
    per = cross_entropy_indices(x, t, weight, ignore_index, label_smoothing);
  }
  if (reduction == "none") return per.reshape(target.sizes());
  if (reduction == "sum") return per.sum();
  // mean: divided by the total weight of the samples that are not ignored
  Tensor valid = keep.to(input.dtype());
  if (!weight) return per.sum() / valid.sum();
  Tensor safe = where(keep, t, kiln::zeros({}, kInt64, t.device()));
  return per.sum() / (weight->index_select(0, safe) * valid).sum();
}

// dL_i/dx = g_i * [((1 - e) w_y + e/C * sum(w)) * softmax(x) - (1 - e) w_y onehot(y) - e/C * w]
// for the samples that are not ignored (e = label_smoothing, w = ones without a weight).
Tensor cross_entropy_indices_backward(const Tensor& grad, const Tensor& input, const Tensor& target,
                                      const std::optional<Tensor>& weight, int64_t ignore_index,
                                      double label_smoothing) {
  meta::cross_entropy_indices_backward(grad, input, target, weight, ignore_index, label_smoothing);
  const int64_t C = input.size(1);
  const double e = label_smoothing;
  Tensor keep = target != Scalar(ignore_index);
  Tensor y = where(keep, target, kiln::zeros({}, kInt64, target.device()));
  Tensor w = weight ? *weight : kiln::ones({C}, input.dtype(), input.device());
  Tensor wy = w.index_select(0, y);
  Tensor coef = wy * (1 - e) + w.sum() * (e / C);
  Tensor d = coef.unsqueeze(1) * softmax(input, 1) -
             (wy * (1 - e)).unsqueeze(1) * one_hot(y, C).to(input.dtype()) -
             w.unsqueeze(0) * (e / C);
  return d * (grad * keep.to(input.dtype())).unsqueeze(1);
}

Tensor nll_loss(const Tensor& input, const Tensor& target, const std::optional<Tensor>& weight,
                std::string_view reduction, int64_t ignore_index) {
  meta::nll_loss(input, target, weight, reduction, ignore_index);
  const int64_t cdim = input.dim() == 1 ? 0 : 1;
  Tensor keep = target != Scalar(ignore_index);
  Tensor y = where(keep, target, kiln::zeros({}, kInt64, target.device()));
  Tensor picked = input.gather(cdim, y.unsqueeze(cdim)).squeeze(std::vector<int64_t>{cdim});
  Tensor wy = keep.to(input.dtype());
  if (weight) wy = wy * weight->index_select(0, y.reshape({y.numel()})).reshape(y.sizes());
  Tensor loss = -picked * wy;
  if (reduction == "mean") return loss.sum() / wy.sum();
  return reduce_loss(loss, reduction);
}

Tensor mse_loss(const Tensor& input, const Tensor& target, std::string_view reduction) {
  meta::mse_loss(input, target, reduction);
  Tensor d = input - target;
  return reduce_loss(d * d, reduction);
}

Tensor l1_loss(const Tensor& input, const Tensor& target, std::string_view reduction) {
  meta::l1_loss(input, target, reduction);
  return reduce_loss(abs(input - target), reduction);
}

// |d| < beta: 0.5 d^2 / beta, else |d| - 0.5 beta (beta = 0 is the L1 loss).
Tensor smooth_l1_loss(const Tensor& input, const Tensor& target, std::string_view reduction,
                      double beta) {
  meta::smooth_l1_loss(input, target, reduction, beta);
  Tensor d = abs(input - target);
  if (beta == 0) return reduce_loss(d, reduction);
  return reduce_loss(where(d < Scalar(beta), d * d * (0.5 / beta), d - 0.5 * beta), reduction);
}

// -(t log x + (1 - t) log(1 - x)) * weight, the logs clamped at -100 (_binary_cross_entropy,
// whose gradient stays finite where x is 0 or 1, as PyTorch's).
Tensor binary_cross_entropy(const Tensor& input, const Tensor& target,
                            const std::optional<Tensor>& weight, std::string_view reduction) {
  meta::binary_cross_entropy(input, target, weight, reduction);
  Tensor loss = kiln::_binary_cross_entropy(input, target);
  if (weight) loss = loss * *weight;
  return reduce_loss(loss, reduction);
}

// (1 - t) x + (1 + (pos_weight - 1) t) softplus(-x), with softplus(-x) = logsumexp(0, -x): stable
// for any logit and smooth at 0 (so zero logits get the exact gradient sigmoid(0) - t).
Tensor binary_cross_entropy_with_logits(const Tensor& input, const Tensor& target,
                                        const std::optional<Tensor>& weight,
                                        const std::optional<Tensor>& pos_weight,
                                        std::string_view reduction) {
  meta::binary_cross_entropy_with_logits(input, target, weight, pos_weight, reduction);
  Tensor softplus_neg = stack({kiln::zeros_like(input), -input}, 0).logsumexp({0});
  Tensor lw = pos_weight ? (*pos_weight - 1) * target + 1 : scalar_like(1, input);
  Tensor loss = (1 - target) * input + lw * softplus_neg;
  if (weight) loss = loss * *weight;
  return reduce_loss(loss, reduction);
}

// target * (log(target) - input) (0 where target is 0), or with log_target
// exp(target) * (target - input); 'batchmean' divides the sum by the batch size.
Tensor kl_div(const Tensor& input, const Tensor& target, std::string_view reduction,
              bool log_target) {
  meta::kl_div(input, target, reduction, log_target);
  Tensor loss;
  if (log_target) {
    loss = exp(target) * (target - input);
  } else {
    Tensor safe = where(target > Scalar(0.0), target, kiln::ones_like(target));
    loss = target * (log(safe) - input);
  }
  if (reduction == "batchmean") {
    Tensor s = loss.sum();
    return input.dim() == 0 ? s : s / static_cast<double>(input.size(0));
  }
  return reduce_loss(loss, reduction);
}

}  // namespace kiln::composite
