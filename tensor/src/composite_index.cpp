// Decompositions of the composite rows of sort.toml, shape.toml, indexing.toml and
// interpolate.toml: argsort, repeat_interleave, pad, scatter.value and interpolate. Each validates
// through its meta function first (except where that needs data), so errors name the op the user
// called.
#include <tuple>

#include "kiln/generated/composite/creation.h"
#include "kiln/generated/composite/indexing.h"
#include "kiln/generated/composite/interpolate.h"
#include "kiln/generated/composite/shape.h"
#include "kiln/generated/composite/sort.h"
#include "kiln/generated/composite/views.h"
#include "kiln/generated/meta/indexing.h"
#include "kiln/generated/meta/interpolate.h"
#include "kiln/generated/meta/shape.h"
#include "kiln/generated/meta/sort.h"
#include "kiln/meta.h"
#include "kiln/operators.h"

namespace kiln::composite {

Tensor argsort(const Tensor& self, int64_t dim, bool descending, bool stable) {
  meta::argsort(self, dim, descending, stable);
  return std::get<1>(kiln::sort(self, dim, descending, stable));
}

// self.index_select(dim, [0] * repeats[0] + [1] * repeats[1] + ...), flattened when dim is None.
Tensor repeat_interleave_tensor(const Tensor& self, const Tensor& repeats,
                                std::optional<int64_t> dim) {
  try {
    meta::repeat_interleave_tensor(self, repeats, dim);
  } catch (const Error& e) {
    if (e.kind() != ErrorKind::NotImplemented) throw;  // the shape needs the data: go on
  }
  Tensor x = dim ? (self.dim() == 0 ? self.reshape({1}) : self) : self.reshape({-1});
  const int64_t d = dim ? meta::wrap_dim("repeat_interleave", *dim, x.dim()) : 0;
  Tensor r = repeats.numel() == 1 ? repeats.reshape({1}).expand({x.size(d)}) : repeats.reshape({-1});
  return x.index_select(d, kiln::repeat_interleave(r));
}

// x: (..., n, ...) -> (..., n, r, ...) by expand -> (..., n * r, ...)
Tensor repeat_interleave_int(const Tensor& self, int64_t repeats, std::optional<int64_t> dim) {
  TensorSpec spec = meta::repeat_interleave_int(self, repeats, dim);
  Tensor x = dim ? (self.dim() == 0 ? self.reshape({1}) : self) : self.reshape({-1});
  const int64_t d = dim ? meta::wrap_dim("repeat_interleave", *dim, x.dim()) : 0;
  DimVector sizes(x.sizes());
  sizes.insert(d + 1, repeats);
  return x.unsqueeze(d + 1).expand(sizes).reshape(spec.sizes);
}

// Reflect, replicate and circular padding pick, along each padded dim, the source position of
// every output position (o - left, mapped back into [0, n)): one index_select per dim, so the
// gradient (index_select's scatter-add) and vmap come from index_select.
Tensor pad(const Tensor& self, IntArrayRef pad, std::string_view mode, std::optional<double> value) {
  meta::pad(self, pad, mode, value);
  if (mode == "constant") return kiln::constant_pad_nd(self, pad, value ? Scalar(*value) : Scalar(0));
  Tensor out = self;
  for (size_t k = 0; k < pad.size() / 2; ++k) {
    const int64_t d = self.dim() - 1 - static_cast<int64_t>(k), n = self.size(d);
    const int64_t left = pad[2 * k], right = pad[2 * k + 1];
    if (left == 0 && right == 0) continue;
    Tensor i = arange(-left, n + right, 1, kInt64, self.device());
    if (mode == "reflect") {
      i = (n - 1) - ((n - 1) - i.abs()).abs();
    } else if (mode == "replicate") {
      i = i.clamp(0, n - 1);
    } else {
      i = i.remainder(scalar_to_tensor(n));
    }
    out = out.index_select(d, i);
  }
  return out;
}

// scatter.value: `value` (cast to self's dtype) in index's shape, the source of a scatter. It is
// made by full_like(index) so that it follows index through the dispatcher: a DTensor index gives
// a DTensor source placed like it (a plain full() would mix a plain tensor into a DTensor call).
static Tensor value_source(const Tensor& self, const Tensor& index, const Scalar& value) {
  return kiln::full_like(index, value, self.dtype(), self.device());
}

Tensor scatter_value(const Tensor& self, int64_t dim, const Tensor& index, const Scalar& value) {
  meta::scatter_value(self, dim, index, value);
  return self.scatter(dim, index, value_source(self, index, value));
}

Tensor scatter_value_(const Tensor& self, int64_t dim, const Tensor& index, const Scalar& value) {
  meta::scatter_value(self, dim, index, value);
  return self.scatter_(dim, index, value_source(self, index, value));
}

Tensor interpolate(const Tensor& self, OptionalIntArrayRef size, std::optional<double> scale_factor,
                   std::string_view mode, bool align_corners) {
  TensorSpec spec = meta::interpolate(self, size, scale_factor, mode, align_corners);
  IntArrayRef out(spec.sizes.data() + 2, spec.sizes.size() - 2);
  if (mode == "nearest") return kiln::upsample_nearest(self, out, scale_factor);
  return kiln::upsample_bilinear(self, out, align_corners, scale_factor);
}

}  // namespace kiln::composite
