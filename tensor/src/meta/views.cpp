// Meta functions of the view ops (tensor/ops/views.toml). Each returns the view's geometry
// over `self`'s storage; the generated kernels apply it on every backend.
#include "kiln/generated/meta/creation.h"
#include "kiln/generated/meta/views.h"
#include "kiln/meta.h"

namespace kiln::meta {

TensorSpec view(const Tensor& self, IntArrayRef size) {
  DimVector shape = infer_size("view", size, self.numel());
  auto strides = compute_view_strides(self.sizes(), self.strides(), shape);
  KILN_CHECK(strides.has_value(), Value, "view: size ", size, " is not compatible with input of size ",
             self.sizes(), " and stride ", self.strides(),
             " (at least one dimension spans across two contiguous subspaces); use reshape instead");
  return view_spec(self, shape, *strides, self.storage_offset());
}

TensorSpec reshape(const Tensor& self, IntArrayRef shape) {
  DimVector s = infer_size("reshape", shape, self.numel());
  auto strides = compute_view_strides(self.sizes(), self.strides(), s);
  if (strides) return view_spec(self, s, *strides, self.storage_offset());
  return contiguous_spec(s, self.dtype(), self.device());
}

TensorSpec permute(const Tensor& self, IntArrayRef dims) {
  int64_t n = self.dim();
  KILN_CHECK(static_cast<int64_t>(dims.size()) == n, Value, "permute: number of dims ", dims,
             " doesn't match the tensor's ", n, " dims");
  DimVector sizes(n), strides(n);
  std::vector<bool> seen(n, false);
  for (int64_t i = 0; i < n; ++i) {
    int64_t d = wrap_dim("permute", dims[i], n);
    KILN_CHECK(!seen[d], Value, "permute: repeated dim ", d, " in ", dims);
    seen[d] = true;
    sizes[i] = self.size(d);
    strides[i] = self.stride(d);
  }
  return view_spec(self, sizes, strides, self.storage_offset());
}

TensorSpec transpose(const Tensor& self, int64_t dim0, int64_t dim1) {
  DimVector sizes(self.sizes()), strides(self.strides());
  if (self.dim() == 0) {
    wrap_dim("transpose", dim0, 0);
    wrap_dim("transpose", dim1, 0);
    return view_spec(self, sizes, strides, self.storage_offset());
  }
  int64_t a = wrap_dim("transpose", dim0, self.dim()), b = wrap_dim("transpose", dim1, self.dim());
  std::swap(sizes[a], sizes[b]);
  std::swap(strides[a], strides[b]);
  return view_spec(self, sizes, strides, self.storage_offset());
}

TensorSpec t(const Tensor& self) {
  KILN_CHECK(self.dim() <= 2, Value, "t: expects a tensor with <= 2 dimensions, but self is ",
             self.dim(), "D");
  return self.dim() < 2 ? view_spec(self, self.sizes(), self.strides(), self.storage_offset())
                        : transpose(self, 0, 1);
}

TensorSpec expand(const Tensor& self, IntArrayRef size) {
  int64_t n = static_cast<int64_t>(size.size()), nd = self.dim();
  KILN_CHECK(n >= nd, Value, "expand: the number of sizes provided (", n,
             ") must be greater or equal to the number of dimensions in the tensor (", nd, ")");
  DimVector sizes(n), strides(n);
  for (int64_t i = n - 1; i >= 0; --i) {
    int64_t j = i - (n - nd);
    int64_t want = size[i];
    if (j < 0) {
      KILN_CHECK(want >= 0, Value, "expand: -1 is not allowed in a leading, non-existing dimension");
      sizes[i] = want;
      strides[i] = 0;
      continue;
    }
    int64_t have = self.size(j);
    if (want == -1) want = have;
    KILN_CHECK(have == want || have == 1, Value, "expand: the expanded size of the tensor (", want,
               ") must match the existing size (", have, ") at non-singleton dimension ", i,
               ". Target sizes: ", size, ". Tensor sizes: ", self.sizes());
    sizes[i] = want;
    strides[i] = have == want ? self.stride(j) : 0;
  }
  return view_spec(self, sizes, strides, self.storage_offset());
}

TensorSpec squeeze(const Tensor& self, OptionalIntArrayRef dim) {
  std::vector<bool> mask = dim_mask("squeeze", dim, self.dim());
  DimVector sizes, strides;
  for (int64_t i = 0; i < self.dim(); ++i) {
    if (mask[i] && self.size(i) == 1) continue;
    sizes.push_back(self.size(i));
    strides.push_back(self.stride(i));
  }
  return view_spec(self, sizes, strides, self.storage_offset());
}

TensorSpec unsqueeze(const Tensor& self, int64_t dim) {
  int64_t d = wrap_dim("unsqueeze", dim, self.dim() + 1);
  DimVector sizes(self.sizes()), strides(self.strides());
  int64_t st = d < self.dim() ? self.size(d) * self.stride(d) : 1;
  sizes.insert(d, 1);
  strides.insert(d, st);
  return view_spec(self, sizes, strides, self.storage_offset());
}

TensorSpec flatten(const Tensor& self, int64_t start_dim, int64_t end_dim) {
  int64_t s = wrap_dim("flatten", start_dim, self.dim()), e = wrap_dim("flatten", end_dim, self.dim());
  KILN_CHECK(s <= e, Value, "flatten: start_dim (", start_dim, ") cannot come after end_dim (", end_dim, ")");
  if (self.dim() == 0) return reshape(self, {1});
  DimVector shape;
  for (int64_t i = 0; i < s; ++i) shape.push_back(self.size(i));
  int64_t m = 1;
  for (int64_t i = s; i <= e; ++i) m *= self.size(i);
  shape.push_back(m);
  for (int64_t i = e + 1; i < self.dim(); ++i) shape.push_back(self.size(i));
  return reshape(self, shape);
}

TensorSpec unflatten(const Tensor& self, int64_t dim, IntArrayRef sizes) {
  int64_t d = wrap_dim("unflatten", dim, self.dim());
  KILN_CHECK(!sizes.empty(), Value, "unflatten: sizes must be non-empty");
  DimVector inner = infer_size("unflatten", sizes, self.dim() ? self.size(d) : 1);
  DimVector shape;
  for (int64_t i = 0; i < d; ++i) shape.push_back(self.size(i));
  for (int64_t s : inner) shape.push_back(s);
  for (int64_t i = d + 1; i < self.dim(); ++i) shape.push_back(self.size(i));
  return view(self, shape);
}

TensorSpec select(const Tensor& self, int64_t dim, int64_t index) {
  KILN_CHECK(self.dim() > 0, Index, "select: cannot be applied to a 0-dim tensor");
  int64_t d = wrap_dim("select", dim, self.dim());
  int64_t n = self.size(d);
  KILN_CHECK(index >= -n && index < n, Index, "select: index ", index,
             " out of range for tensor of size ", self.sizes(), " at dimension ", d);
  if (index < 0) index += n;
  DimVector sizes(self.sizes()), strides(self.strides());
  sizes.erase(d);
  strides.erase(d);
  return view_spec(self, sizes, strides, self.storage_offset() + index * self.stride(d));
}

TensorSpec slice(const Tensor& self, int64_t dim, std::optional<int64_t> start,
                 std::optional<int64_t> end, int64_t step) {
  KILN_CHECK(self.dim() > 0, Index, "slice: cannot be applied to a 0-dim tensor");
  KILN_CHECK(step > 0, Value, "slice: step must be positive, got ", step);
  int64_t d = wrap_dim("slice", dim, self.dim());
  int64_t n = self.size(d);
  int64_t s = start.value_or(0), e = end.value_or(n);
  if (s < 0) s += n;
  if (e < 0) e += n;
  s = std::clamp<int64_t>(s, 0, n);
  e = std::clamp<int64_t>(e, s, n);
  DimVector sizes(self.sizes()), strides(self.strides());
  sizes[d] = (e - s + step - 1) / step;
  strides[d] *= step;
  return view_spec(self, sizes, strides, self.storage_offset() + s * self.stride(d));
}

TensorSpec narrow(const Tensor& self, int64_t dim, int64_t start, int64_t length) {
  KILN_CHECK(self.dim() > 0, Index, "narrow: cannot be applied to a 0-dim tensor");
  int64_t d = wrap_dim("narrow", dim, self.dim());
  int64_t n = self.size(d);
  KILN_CHECK(start >= -n && start <= n, Index, "narrow: start (", start, ") out of range for dimension of size ", n);
  if (start < 0) start += n;
  KILN_CHECK(length >= 0 && start + length <= n, Index, "narrow: start (", start, ") + length (",
             length, ") exceeds dimension size (", n, ")");
  return slice(self, d, start, start + length, 1);
}

TensorSpec as_strided(const Tensor& self, IntArrayRef size, IntArrayRef stride,
                      std::optional<int64_t> storage_offset) {
  KILN_CHECK(size.size() == stride.size(), Value, "as_strided: size ", size, " and stride ", stride,
             " differ in length");
  int64_t off = storage_offset.value_or(self.storage_offset());
  KILN_CHECK(off >= 0, Index, "as_strided: negative storage offset ", off);
  int64_t hi = off;
  bool empty = false;
  for (size_t i = 0; i < size.size(); ++i) {
    KILN_CHECK(size[i] >= 0, Value, "as_strided: negative size in ", size);
    KILN_CHECK(stride[i] >= 0, Value, "as_strided: negative stride in ", stride);
    if (size[i] == 0) empty = true;
    else hi += (size[i] - 1) * stride[i];
  }
  int64_t cap = static_cast<int64_t>(self.impl()->storage()->nbytes() / self.element_size());
  KILN_CHECK(empty || hi < cap, Index, "as_strided: size ", size, ", stride ", stride,
             " and offset ", off, " reach element ", hi, ", outside a storage of ", cap, " elements");
  return view_spec(self, size, stride, off);
}

TensorSpec diagonal(const Tensor& self, int64_t offset, int64_t dim1, int64_t dim2) {
  KILN_CHECK(self.dim() >= 2, Value, "diagonal: expects a tensor with at least 2 dims, got ", self.dim());
  int64_t a = wrap_dim("diagonal", dim1, self.dim()), b = wrap_dim("diagonal", dim2, self.dim());
  KILN_CHECK(a != b, Value, "diagonal: dimensions cannot be identical (", dim1, ", ", dim2, ")");
  int64_t off = self.storage_offset(), len;
  if (offset >= 0) {
    len = std::max<int64_t>(std::min(self.size(a), self.size(b) - offset), 0);
    if (len > 0) off += offset * self.stride(b);
  } else {
    len = std::max<int64_t>(std::min(self.size(a) + offset, self.size(b)), 0);
    if (len > 0) off -= offset * self.stride(a);
  }
  DimVector sizes, strides;
  for (int64_t i = 0; i < self.dim(); ++i) {
    if (i == a || i == b) continue;
    sizes.push_back(self.size(i));
    strides.push_back(self.stride(i));
  }
  sizes.push_back(len);
  strides.push_back(self.stride(a) + self.stride(b));
  return view_spec(self, sizes, strides, off);
}

TensorSpec alias(const Tensor& self) {
  return view_spec(self, self.sizes(), self.strides(), self.storage_offset());
}

}  // namespace kiln::meta
