// Decompositions of the composite pointwise rows (pointwise.toml, unary.toml, reduction.toml):
// floor_divide, max/min(self, other), round.decimals, clamp.Tensor and softplus. Each validates
// through its meta function first, so errors name the op the user called; their gradients are
// those of the ops they call.
#include <cmath>

#include "kiln/generated/composite/copy.h"
#include "kiln/generated/composite/pointwise.h"
#include "kiln/generated/composite/reduction.h"
#include "kiln/generated/composite/unary.h"
#include "kiln/generated/meta/pointwise.h"
#include "kiln/generated/meta/unary.h"
#include "kiln/meta.h"
#include "kiln/operators.h"

namespace kiln::composite {

Tensor floor_divide(const Tensor& self, const Tensor& other) {
  meta::floor_divide(self, other);
  return kiln::div(self, other, "floor");
}

Tensor floor_divide_(const Tensor& self, const Tensor& other) {
  meta::floor_divide_(self, other);
  return self.div_(other, "floor");
}

Tensor max_other(const Tensor& self, const Tensor& other) { return kiln::maximum(self, other); }

Tensor min_other(const Tensor& self, const Tensor& other) { return kiln::minimum(self, other); }

// PyTorch's round_decimals kernel: nearbyint(x * 10^d) / 10^d, or nearbyint(x / 10^-d) * 10^-d
// for d < 0, in x's dtype (float32 for float16/bfloat16), 10^d rounded to that dtype.
Tensor round_decimals(const Tensor& self, int64_t decimals) {
  meta::round_decimals(self, decimals);
  if (decimals == 0) return kiln::round(self);
  const bool reduced = self.dtype() == kFloat16 || self.dtype() == kBFloat16;
  const Tensor x = reduced ? self.to(kFloat32) : self;
  const Scalar ten_pow(std::pow(10.0, std::fabs(static_cast<double>(decimals))));
  Tensor r = decimals > 0 ? kiln::round(x * ten_pow) / ten_pow : kiln::round(x / ten_pow) * ten_pow;
  return reduced ? r.to(self.dtype()) : r;
}

// In place, step by step (each in-place op saves what its backward needs before it writes).
// float16/bfloat16 compute in float32 and copy back, as round_decimals; that copy's source reads
// self through a copy_ that saves it, so differentiating through it raises after this write.
Tensor round_decimals_(const Tensor& self, int64_t decimals) {
  meta::round_decimals_(self, decimals);
  if (decimals == 0) return self.round_();
  if (self.dtype() == kFloat16 || self.dtype() == kBFloat16)
    return self.copy_(round_decimals(self, decimals));
  const Scalar ten_pow(std::pow(10.0, std::fabs(static_cast<double>(decimals))));
  if (decimals > 0)
    return self.mul_(scalar_to_tensor(ten_pow)).round_().div_(scalar_to_tensor(ten_pow));
  return self.div_(scalar_to_tensor(ten_pow)).round_().mul_(scalar_to_tensor(ten_pow));
}

// Note [clamp with tensor bounds]: PyTorch's values (min(max(x, lo), hi); a nan self or bound
// gives nan) and PyTorch's gradients: the bound that is the result gets it (max when min > max),
// self strictly inside; at a tie with one bound, self and that bound share it evenly (maximum and
// minimum do that); when min == max, the bound that is the result or self when it equals both.
// A nan self or bound gives it to self (PyTorch's formulas disagree among themselves there: with
// one bound, self and the bound both get it). min == max and nan are where()s over the maximum and
// minimum. Checked against PyTorch 2.15 on every tie and nan case of three values.
Tensor clamp_tensor(const Tensor& self, const std::optional<Tensor>& min,
                    const std::optional<Tensor>& max) {
  meta::clamp_tensor(self, min, max);
  const bool has_min = min && min->defined(), has_max = max && max->defined();
  Tensor r = self;
  if (has_min) r = maximum(r, *min);
  if (has_max) r = minimum(r, *max);
  if (has_min && has_max) {
    Tensor pinned = where(self < *min, *min, where(self > *max, *max, self));
    r = where(*min == *max, pinned, r);
  }
  if (!is_floating(r.dtype())) return r;
  Tensor nan = self != self, through = self;  // through: self's value (nan), self's gradient
  for (const std::optional<Tensor>* b : {&min, &max}) {
    if (!*b || !(*b)->defined()) continue;
    nan = logical_or(nan, **b != **b);
    through = through + **b * 0;
  }
  return where(nan, through, r);
}

// In place, where(self < min, min, self) then where(r > max, max, r), which save no operand
// (copy_ then overwrites self): ties give self the gradient, unlike clamp.Tensor's even share.
Tensor clamp_tensor_(const Tensor& self, const std::optional<Tensor>& min,
                     const std::optional<Tensor>& max) {
  meta::clamp_tensor_(self, min, max);
  auto past = [](const Tensor& beyond, const Tensor& bound) {
    return is_floating(bound.dtype()) ? logical_or(beyond, bound != bound) : beyond;
  };
  Tensor r = self;
  if (min && min->defined()) r = where(past(r < *min, *min), *min, r);
  if (max && max->defined()) r = where(past(r > *max, *max), *max, r);
  return self.copy_(r);
}

// where(beta x > threshold, x, log1p(exp(min(beta x, threshold))) / beta): the clamp keeps exp
// finite in the branch where() drops (see the softplus row).
Tensor softplus(const Tensor& self, const Scalar& beta, const Scalar& threshold) {
  meta::softplus(self, beta, threshold);
  const bool unit = beta.to_double() == 1.0;
  const Tensor bx = unit ? self : self * beta;
  Tensor soft = log1p(exp(bx.clamp(std::nullopt, threshold)));
  if (!unit) soft = soft / beta;
  return where(bx > threshold, self, soft);
}

}  // namespace kiln::composite
