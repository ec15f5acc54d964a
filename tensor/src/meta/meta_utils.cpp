#include "kiln/meta.h"

namespace kiln::meta {

int64_t wrap_dim(const char* op, int64_t dim, int64_t ndim) {
  int64_t n = ndim == 0 ? 1 : ndim;
  KILN_CHECK(dim >= -n && dim < n, Index, op, ": dimension out of range (expected to be in range of [",
             -n, ", ", n - 1, "], but got ", dim, ")");
  return dim < 0 ? dim + n : dim;
}

std::vector<bool> dim_mask(const char* op, OptionalIntArrayRef dims, int64_t ndim) {
  std::vector<bool> mask(ndim, !dims.has_value() || dims->empty());
  if (!dims.has_value()) return mask;
  for (int64_t d : *dims) {
    int64_t w = wrap_dim(op, d, ndim);
    if (ndim == 0) continue;
    KILN_CHECK(!mask[w] || dims->empty(), Value, op, ": dim ", w, " appears multiple times in the list of dims");
    mask[w] = true;
  }
  return mask;
}

DimVector broadcast_shapes(const char* op, IntArrayRef a, IntArrayRef b) {
  if (a == b) return DimVector(a);
  size_t n = std::max(a.size(), b.size());
  DimVector out(n);
  for (size_t i = 0; i < n; ++i) {
    int64_t da = i < n - a.size() ? 1 : a[i - (n - a.size())];
    int64_t db = i < n - b.size() ? 1 : b[i - (n - b.size())];
    KILN_CHECK(da == db || da == 1 || db == 1, Value, op, ": shapes ", a, " and ", b,
               " are not broadcastable (size ", da, " vs ", db, " at dimension ", i, ")");
    out[i] = da == 1 ? db : da;
  }
  return out;
}

Device common_device(const char* op, TensorList tensors) {
  std::vector<const Tensor*> ptrs;
  for (const Tensor& t : tensors) ptrs.push_back(&t);
  return common_device(op, ptrs.data(), ptrs.size());
}

Device common_device(const char* op, const Tensor* const* tensors, size_t n) {
  if (n > 0 && tensors[0]->defined()) {
    Device d0 = tensors[0]->device();
    bool same = true;
    for (size_t i = 0; i < n; ++i) same = same && tensors[i]->defined() && tensors[i]->device() == d0;
    if (same) return d0;
  }
  std::optional<Device> dev;
  bool from_scalar = false;
  for (size_t i = 0; i < n; ++i) {
    const Tensor& t = *tensors[i];
    if (!t.defined()) continue;
    bool cpu_scalar = t.dim() == 0 && t.device().is_cpu();
    if (!dev || (from_scalar && !cpu_scalar)) {
      dev = t.device();
      from_scalar = cpu_scalar;
      continue;
    }
    if (cpu_scalar || t.device() == *dev) continue;
    KILN_FAIL(Value, op, ": expected all tensors to be on the same device, but found at least two devices, ",
              *dev, " and ", t.device());
  }
  return dev.value_or(kCPU);
}

TensorSpec contiguous_spec(IntArrayRef sizes, ScalarType dtype, Device device) {
  TensorSpec s;
  s.sizes = sizes;
  s.strides = contiguous_strides(sizes);
  s.dtype = dtype;
  s.device = device;
  return s;
}

TensorSpec view_spec(const Tensor& self, IntArrayRef sizes, IntArrayRef strides, int64_t offset) {
  TensorSpec s;
  s.sizes = sizes;
  s.strides = strides;
  s.offset = offset;
  s.dtype = self.dtype();
  s.device = self.device();
  s.alias_of = 0;
  return s;
}

DimVector reduced_shape(IntArrayRef sizes, const std::vector<bool>& mask, bool keepdim) {
  DimVector out;
  for (size_t i = 0; i < sizes.size(); ++i) {
    if (!mask[i]) out.push_back(sizes[i]);
    else if (keepdim) out.push_back(1);
  }
  return out;
}

DimVector infer_size(const char* op, IntArrayRef shape, int64_t numel) {
  DimVector out(shape);
  int64_t known = 1, infer = -1;
  for (size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] == -1) {
      KILN_CHECK(infer < 0, Value, op, ": only one dimension can be inferred in shape ", shape);
      infer = static_cast<int64_t>(i);
    } else {
      KILN_CHECK(shape[i] >= 0, Value, op, ": invalid shape dimension ", shape[i], " in ", shape);
      known *= shape[i];
    }
  }
  if (infer >= 0) {
    KILN_CHECK(known != 0 && numel % known == 0, Value, op, ": shape ", shape,
               " is invalid for input of size ", numel);
    out[infer] = numel / known;
  } else {
    KILN_CHECK(known == numel, Value, op, ": shape ", shape, " is invalid for input of size ", numel);
  }
  return out;
}

// Splits the old shape into contiguous chunks and maps each onto dims of the new shape.
std::optional<DimVector> compute_view_strides(IntArrayRef sizes, IntArrayRef strides,
                                              IntArrayRef shape) {
  int64_t numel = numel_of(sizes);
  DimVector out(shape.size());
  if (numel == 0 || sizes.empty()) return contiguous_strides(shape);
  int64_t view_d = static_cast<int64_t>(shape.size()) - 1;
  int64_t chunk_base_stride = strides.empty() ? 1 : strides.back();
  int64_t tensor_numel = 1, view_numel = 1;
  for (int64_t d = static_cast<int64_t>(sizes.size()) - 1; d >= 0; --d) {
    tensor_numel *= sizes[d];
    if (d == 0 || (sizes[d - 1] != 1 && strides[d - 1] != tensor_numel * chunk_base_stride)) {
      while (view_d >= 0 && (view_numel < tensor_numel || shape[view_d] == 1)) {
        out[view_d] = view_numel * chunk_base_stride;
        view_numel *= shape[view_d];
        --view_d;
      }
      if (view_numel != tensor_numel) return std::nullopt;
      if (d > 0) {
        chunk_base_stride = strides[d - 1];
        tensor_numel = 1;
        view_numel = 1;
      }
    }
  }
  if (view_d != -1) return std::nullopt;
  return out;
}

ScalarType default_float(ScalarType t) { return is_floating(t) ? t : kFloat32; }

}  // namespace kiln::meta
