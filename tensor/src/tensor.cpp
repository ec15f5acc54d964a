#include "kiln/tensor.h"

#include <cmath>
#include <cstdio>
#include <functional>
#include <sstream>

#include "kiln/generated/ops.h"

namespace kiln {

void Tensor::undefined_error() {
  KILN_FAIL(Value, "this tensor is undefined (a default-constructed Tensor holds no data)");
}

const Tensor& Tensor::check_defined(const char* what) const {
  KILN_CHECK(defined(), Value, what, " is an undefined tensor");
  return *this;
}

template <typename T>
T* Tensor::data_ptr() const {
  KILN_CHECK(CppTypeToScalarType<T>::value == dtype(), Type, "data_ptr<",
             scalar_type_name(CppTypeToScalarType<T>::value), ">() called on a tensor of dtype ",
             dtype());
  return static_cast<T*>(impl_->data_ptr());
}
#define KILN_INSTANTIATE(T) template T* Tensor::data_ptr<T>() const;
KILN_INSTANTIATE(bool)
KILN_INSTANTIATE(uint8_t)
KILN_INSTANTIATE(int8_t)
KILN_INSTANTIATE(int16_t)
KILN_INSTANTIATE(int32_t)
KILN_INSTANTIATE(int64_t)
KILN_INSTANTIATE(Half)
KILN_INSTANTIATE(BFloat16)
KILN_INSTANTIATE(float)
KILN_INSTANTIATE(double)
#undef KILN_INSTANTIATE

Scalar Tensor::item() const {
  check_defined("item()");
  KILN_CHECK(numel() == 1, Value, "a Tensor with ", numel(),
             " elements cannot be converted to Scalar");
  Tensor t = device().is_cpu() ? *this : to(std::nullopt, Device(kCPU));
  return KILN_DISPATCH_ALL_TYPES(dtype(), "item", [&]() -> Scalar {
    return Scalar(*static_cast<const scalar_t*>(t.impl()->data_ptr()));
  });
}

template <typename T>
T Tensor::item() const {
  return item().to<T>();
}
template bool Tensor::item<bool>() const;
template int64_t Tensor::item<int64_t>() const;
template int32_t Tensor::item<int32_t>() const;
template float Tensor::item<float>() const;
template double Tensor::item<double>() const;

// Bytes spanned by a geometry, or a ValueError naming the sizes when that overflows.
static size_t checked_nbytes(IntArrayRef sizes, IntArrayRef strides, ScalarType dtype) {
  KILN_CHECK(strides.size() == sizes.size(), Value, "sizes ", sizes, " and strides ", strides,
             " differ in length");
  int64_t hi = 0;
  for (size_t i = 0; i < sizes.size(); ++i) {
    KILN_CHECK(sizes[i] >= 0, Value, "negative dimension in size ", sizes);
    KILN_CHECK(strides[i] >= 0, Value, "negative stride in ", strides);
    if (sizes[i] == 0) return 0;
    int64_t span;
    bool overflow = __builtin_mul_overflow(sizes[i] - 1, strides[i], &span) ||
                    __builtin_add_overflow(hi, span, &hi);
    KILN_CHECK(!overflow, Value, "a tensor of size ", sizes, " is too large to allocate");
  }
  int64_t n;
  KILN_CHECK(!__builtin_mul_overflow(hi + 1, static_cast<int64_t>(element_size(dtype)), &n), Value,
             "a tensor of size ", sizes, " is too large to allocate");
  return static_cast<size_t>(n);
}

Tensor empty_strided_on(IntArrayRef sizes, IntArrayRef strides, ScalarType dtype, Device device) {
  size_t nbytes = checked_nbytes(sizes, strides, dtype);
  return Tensor(TensorImpl::make_trusted(Storage::create(nbytes, device), dtype, sizes, strides));
}

Tensor empty_on(IntArrayRef sizes, ScalarType dtype, Device device) {
  DimVector strides = contiguous_strides(sizes);
  size_t nbytes = checked_nbytes(sizes, strides, dtype);
  return Tensor(TensorImpl::make_trusted(Storage::create(nbytes, device), dtype, sizes, strides));
}

Tensor scalar_tensor_of(const Scalar& s, ScalarType dtype, Device device) {
  Tensor t = empty_on({}, dtype, kCPU);
  KILN_DISPATCH_ALL_TYPES(dtype, "scalar_tensor", [&] { *t.impl()->data<scalar_t>() = s.to<scalar_t>(); });
  return device.is_cpu() ? t : t.to(std::nullopt, device);
}

Tensor scalar_to_tensor(const Scalar& s) {
  Tensor t = scalar_tensor_of(s, s.dtype());
  t.impl()->set_wrapped_number(true);
  return t;
}

// Three priority levels, combined by category (See Note [Type promotion] in scalar_type.h).
ScalarType result_type(TensorList tensors) {
  std::vector<const Tensor*> ptrs;
  for (const Tensor& t : tensors) ptrs.push_back(&t);
  return result_type(ptrs.data(), ptrs.size());
}

ScalarType result_type(const Tensor* const* tensors, size_t n) {
  // Fast path: plain tensors of one dtype (the common case) need no category logic.
  if (n > 0 && tensors[0]->defined()) {
    ScalarType t0 = tensors[0]->dtype();
    bool plain = true;
    for (size_t i = 0; i < n; ++i) {
      const Tensor& t = *tensors[i];
      plain = plain && t.defined() && t.dtype() == t0 && t.dim() > 0 && !t.impl()->is_wrapped_number();
    }
    if (plain) return t0;
  }
  std::optional<ScalarType> dim_r, zero_r, wrapped_r;
  auto upd = [](std::optional<ScalarType>& r, ScalarType t) { r = r ? promote_types(*r, t) : t; };
  for (size_t i = 0; i < n; ++i) {
    const Tensor& t = *tensors[i];
    if (!t.defined()) continue;
    if (t.impl()->is_wrapped_number()) {
      upd(wrapped_r, is_floating(t.dtype()) ? kFloat32 : t.dtype());
    } else if (t.dim() == 0) {
      upd(zero_r, t.dtype());
    } else {
      upd(dim_r, t.dtype());
    }
  }
  auto combine = [](std::optional<ScalarType> higher, std::optional<ScalarType> lower) {
    if (!higher) return lower;
    if (!lower) return higher;
    if (is_floating(*higher)) return higher;
    if (*higher == kBool || is_floating(*lower)) return std::optional(promote_types(*higher, *lower));
    return higher;
  };
  auto r = combine(dim_r, combine(zero_r, wrapped_r));
  KILN_CHECK(r.has_value(), Value, "result_type: no tensors given");
  return *r;
}

// ---- printing (PyTorch-style)

namespace {

struct Formatter {
  bool floating = false, all_int = true, sci = false;
  int width = 1;
  void scan(const std::vector<double>& vals, bool is_float) {
    floating = is_float;
    double amax = 0, amin = INFINITY;
    for (double v : vals) {
      if (!std::isfinite(v)) continue;
      if (v != std::floor(v)) all_int = false;
      amax = std::max(amax, std::fabs(v));
      if (v != 0) amin = std::min(amin, std::fabs(v));
    }
    if (floating && !all_int && (amax >= 1e8 || (amin < 1e-4 && amin > 0))) sci = true;
    if (floating && all_int && amax >= 1e8) sci = true;
    for (double v : vals) width = std::max<int>(width, static_cast<int>(fmt(v).size()));
  }
  std::string fmt(double v) const {
    char buf[64];
    if (!floating) {
      std::snprintf(buf, sizeof buf, "%lld", static_cast<long long>(v));
    } else if (std::isnan(v)) {
      return "nan";
    } else if (std::isinf(v)) {
      return v > 0 ? "inf" : "-inf";
    } else if (sci) {
      std::snprintf(buf, sizeof buf, "%.4e", v);
    } else if (all_int) {
      std::snprintf(buf, sizeof buf, "%.0f.", v);
    } else {
      std::snprintf(buf, sizeof buf, "%.4f", v);
    }
    return buf;
  }
};

void print_rec(std::ostringstream& os, const std::vector<double>& vals, const Formatter& f,
               IntArrayRef sizes, size_t dim, int64_t& pos, int indent, bool is_bool, bool summarize) {
  if (dim == sizes.size()) {
    std::string s = is_bool ? (vals[pos] != 0 ? "True" : "False") : f.fmt(vals[pos]);
    os << std::string(f.width > static_cast<int>(s.size()) && !is_bool ? f.width - s.size() : 0, ' ')
       << s;
    ++pos;
    return;
  }
  os << "[";
  int64_t n = sizes[dim];
  int64_t inner = 1;
  for (size_t d = dim + 1; d < sizes.size(); ++d) inner *= std::min<int64_t>(sizes[d], summarize ? 6 : sizes[d]);
  for (int64_t i = 0; i < n; ++i) {
    if (summarize && n > 6 && i == 3) {
      os << (dim + 1 == sizes.size() ? "..., " : "...,\n" + std::string(indent + 1, ' '));
      i = n - 3;
    }
    if (i > 0 && !(summarize && n > 6 && i == n - 3)) {
      if (dim + 1 == sizes.size()) os << ", ";
      else os << "," << std::string(sizes.size() - dim - 1, '\n') << std::string(indent + 1, ' ');
    }
    print_rec(os, vals, f, sizes, dim + 1, pos, indent + 1, is_bool, summarize);
  }
  os << "]";
}

}  // namespace

std::string Tensor::repr() const {
  if (!defined()) return "tensor(undefined)";
  std::ostringstream os;
  bool meta = device().type() == DeviceType::Meta;  // Remote tensors print their fetched data
  bool default_dtype = dtype() == kFloat32 || dtype() == kInt64 || dtype() == kBool;
  if (meta || numel() == 0) {
    os << "tensor(" << (meta ? "..." : "[]") << ", ";
    if (meta) os << "device='" << device() << "', ";
    os << "size=(";
    for (int64_t i = 0; i < dim(); ++i) os << (i ? ", " : "") << size(i);
    os << (dim() == 1 ? ",)" : ")");
    if (!default_dtype || meta) os << ", dtype=kiln." << dtype();
    os << ")";
    return os.str();
  }
  bool summarize = numel() > 1000;
  // Gather the printed elements (all, or the corners when summarizing) as double.
  Tensor t = device().is_cpu() ? *this : to(std::nullopt, Device(kCPU));
  DimVector shown(t.sizes());
  std::vector<double> vals;
  std::vector<int64_t> idx(dim(), 0);
  KILN_DISPATCH_ALL_TYPES(dtype(), "repr", [&] {
    const auto* base = static_cast<const scalar_t*>(t.impl()->data_ptr());
    std::function<void(int64_t, int64_t)> walk = [&](int64_t d, int64_t off) {
      if (d == t.dim()) {
        vals.push_back(static_cast<double>(static_cast<float>(base[off])));
        if constexpr (std::is_same_v<scalar_t, double> || std::is_integral_v<scalar_t>)
          vals.back() = static_cast<double>(base[off]);
        return;
      }
      int64_t n = t.size(d);
      for (int64_t i = 0; i < n; ++i) {
        if (summarize && n > 6 && i == 3) i = n - 3;
        walk(d + 1, off + i * t.stride(d));
      }
    };
    walk(0, 0);
  });
  Formatter f;
  f.scan(vals, is_floating(dtype()));
  os << "tensor(";
  int64_t pos = 0;
  print_rec(os, vals, f, sizes(), 0, pos, 7, dtype() == kBool, summarize);
  if (!device().is_cpu()) os << ", device='" << device() << "'";
  if (!default_dtype) os << ", dtype=kiln." << dtype();
  os << ")";
  return os.str();
}

std::ostream& operator<<(std::ostream& os, const Tensor& t) { return os << t.repr(); }

}  // namespace kiln
