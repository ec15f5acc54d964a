#include "kiln/autograd/engine_helpers.h"

#include "kiln/generated/ops.h"
#include "kiln/operators.h"

namespace kiln::autograd {

// t: (..., broadcast dims) -> sizes. Leading extra dims are summed away; dims where sizes has 1
// and t does not are summed with keepdim.
Tensor sum_to(const Tensor& t, IntArrayRef sizes) {
  if (t.sizes() == sizes) return t;
  int64_t lead = t.dim() - static_cast<int64_t>(sizes.size());
  KILN_CHECK(lead >= 0, Value, "sum_to: cannot reduce a tensor of shape ", t.sizes(),
             " to the larger shape ", sizes);
  std::vector<int64_t> dims;
  for (int64_t d = 0; d < lead; ++d) dims.push_back(d);
  for (size_t i = 0; i < sizes.size(); ++i) {
    int64_t have = t.size(lead + static_cast<int64_t>(i));
    if (sizes[i] == 1 && have != 1) {
      dims.push_back(lead + static_cast<int64_t>(i));
    } else {
      KILN_CHECK(sizes[i] == have, Value, "sum_to: shape ", t.sizes(),
                 " does not broadcast from ", sizes);
    }
  }
  if (dims.empty()) return t;
  Tensor r = kiln::sum(t, IntArrayRef(dims), /*keepdim=*/true);
  return lead > 0 ? r.reshape(sizes) : r;
}

}  // namespace kiln::autograd

namespace kiln::autograd {

Tensor cast_back(const Tensor& grad, const Tensor& like) {
  if (!grad.defined() || grad.dtype() == like.dtype()) return grad;
  return grad.to(like.dtype());
}

// grad: the reduced shape -> sizes (the reduced dims restored, then broadcast).
Tensor sum_backward(const Tensor& grad, IntArrayRef sizes, OptionalIntArrayRef dim, bool keepdim) {
  int64_t n = static_cast<int64_t>(sizes.size());
  Tensor g = grad;
  if (!keepdim && n > 0) {
    if (!dim.has_value() || dim->empty()) {
      g = g.reshape(std::vector<int64_t>(n, 1));
    } else {
      std::vector<bool> reduced(n, false);
      for (int64_t d : *dim) reduced[d < 0 ? d + n : d] = true;
      for (int64_t d = 0; d < n; ++d)
        if (reduced[d]) g = g.unsqueeze(d);
    }
  }
  return g.expand(sizes);
}

Tensor mean_backward(const Tensor& grad, IntArrayRef sizes, OptionalIntArrayRef dim, int64_t numel,
                     bool keepdim) {
  int64_t out = grad.numel();
  double count = out > 0 ? static_cast<double>(numel) / static_cast<double>(out) : 1.0;
  return sum_backward(grad, sizes, dim, keepdim) / count;
}

}  // namespace kiln::autograd
