#include "kiln/tensor_impl.h"

#include "kiln/error.h"

namespace kiln {

void check_dims(int64_t ndim, const char* what) {
  KILN_CHECK(ndim <= kMaxDims, Value, what, " has ", ndim, " dimensions; Kiln supports at most ",
             kMaxDims, " (See Note [Dimension cap])");
}

// Strides past an overflow are never used to reach an element: such a shape holds no elements
// (a zero size follows) or is refused by numel_of / the allocation's byte count.
DimVector contiguous_strides(IntArrayRef sizes) {
  DimVector st(sizes.size());
  int64_t s = 1;
  for (int64_t i = static_cast<int64_t>(sizes.size()) - 1; i >= 0; --i) {
    st[i] = s;
    if (__builtin_mul_overflow(s, std::max<int64_t>(sizes[i], 1), &s)) s = 0;
  }
  return st;
}

int64_t numel_of(IntArrayRef sizes) {
  for (int64_t s : sizes)
    if (s == 0) return 0;
  int64_t n = 1;
  for (int64_t s : sizes)
    KILN_CHECK(!__builtin_mul_overflow(n, s, &n), Value, "a tensor of size ", sizes,
               " has more than 2^63 elements");
  return n;
}

std::ostream& operator<<(std::ostream& os, IntArrayRef a) {
  os << "[";
  for (size_t i = 0; i < a.size(); ++i) os << (i ? ", " : "") << a[i];
  return os << "]";
}

TensorImpl::TensorImpl(intrusive_ptr<Storage> storage, ScalarType dtype)
    : storage_(std::move(storage)), dtype_(dtype) {
  inference_ = tls_local_dispatch_key_set().inference_mode;
  key_set_ = DispatchKeySet(backend_key(storage_->device().type()));
}

intrusive_ptr<TensorImpl> TensorImpl::make(intrusive_ptr<Storage> storage, ScalarType dtype,
                                           IntArrayRef sizes, IntArrayRef strides, int64_t offset) {
  intrusive_ptr<TensorImpl> t(new TensorImpl(std::move(storage), dtype));
  if (strides.empty() && !sizes.empty()) {
    t->set_geometry(sizes, contiguous_strides(sizes), offset);
  } else {
    t->set_geometry(sizes, strides, offset);
  }
  return t;
}

intrusive_ptr<TensorImpl> TensorImpl::make_trusted(intrusive_ptr<Storage> storage, ScalarType dtype,
                                                   IntArrayRef sizes, IntArrayRef strides) {
  check_dims(static_cast<int64_t>(sizes.size()));
  intrusive_ptr<TensorImpl> t(new TensorImpl(std::move(storage), dtype));
  t->sizes_ = sizes;
  t->strides_ = strides;
  t->numel_ = numel_of(sizes);
  t->refresh_derived();
  return t;
}

int64_t TensorImpl::size(int64_t d) const {
  int64_t n = dim();
  KILN_CHECK(d >= -n && d < n, Index, "dimension ", d, " out of range for a ", n, "-d tensor");
  return sizes_[d < 0 ? d + n : d];
}

int64_t TensorImpl::stride(int64_t d) const {
  int64_t n = dim();
  KILN_CHECK(d >= -n && d < n, Index, "dimension ", d, " out of range for a ", n, "-d tensor");
  return strides_[d < 0 ? d + n : d];
}

intrusive_ptr<TensorImpl> BackendHandle::detached(const TensorImpl&) const { return {}; }

namespace detail {
thread_local DataReadHook t_data_read_hook = nullptr;
thread_local DataReadHook t_grad_set_hook = nullptr;
}  // namespace detail

void* TensorImpl::data_ptr() const {
  if (detail::t_data_read_hook != nullptr) [[unlikely]]
    detail::t_data_read_hook(*this);
  KILN_CHECK(!key_set_.has(DispatchKey::Batched), Runtime,
             "cannot access the data of a tensor batched by vmap (a BatchedTensor of shape ",
             sizes(), "): inside vmap only ops see its examples; return it from the vmapped "
             "function instead");
  KILN_CHECK(storage_->has_data(), Runtime, "cannot access the data of a tensor on device '",
             device().str(), "' (it has no local storage)");
  return raw_data();
}

void TensorImpl::set_geometry(IntArrayRef sizes, IntArrayRef strides, int64_t offset) {
  check_dims(static_cast<int64_t>(sizes.size()));
  KILN_CHECK(sizes.size() == strides.size(), Value, "sizes ", sizes, " and strides ", strides,
             " differ in length");
  KILN_CHECK(offset >= 0, Index, "negative storage offset ", offset);
  for (int64_t s : sizes) KILN_CHECK(s >= 0, Value, "negative size in ", sizes);
  const int64_t n = numel_of(sizes);
  int64_t lo = offset, hi = offset;
  for (size_t i = 0; i < sizes.size() && n > 0; ++i) {
    // An overflowing span would wrap to a small one and pass the bounds check below.
    int64_t span;
    bool overflow = __builtin_mul_overflow(sizes[i] - 1, strides[i], &span) ||
                    __builtin_add_overflow(span < 0 ? lo : hi, span, span < 0 ? &lo : &hi);
    KILN_CHECK(!overflow, Index, "geometry sizes=", sizes, " strides=", strides, " offset=",
               offset, " reaches beyond 2^63 elements");
  }
  if (n > 0) {
    int64_t cap = static_cast<int64_t>(storage_->nbytes() / itemsize());
    KILN_CHECK(lo >= 0 && hi < cap, Index, "geometry sizes=", sizes, " strides=", strides,
               " offset=", offset, " reaches elements [", lo, ", ", hi,
               "], outside a storage of ", cap, " elements");
  }
  sizes_ = sizes;
  strides_ = strides;
  offset_ = offset;
  numel_ = n;
  refresh_derived();
}

void TensorImpl::refresh_derived() {
  is_contiguous_ = true;
  int64_t expected = 1;
  for (int64_t i = dim() - 1; i >= 0; --i) {
    if (sizes_[i] == 1) continue;
    if (sizes_[i] == 0) {
      is_contiguous_ = true;
      return;
    }
    if (strides_[i] != expected) is_contiguous_ = false;
    expected *= sizes_[i];
  }
}

void TensorImpl::resize(IntArrayRef sizes) {
  int64_t n = numel_of(sizes);
  size_t need = static_cast<size_t>(offset_ + n) * itemsize();
  if (need > storage_->nbytes()) storage_->resize(need);
  set_geometry(sizes, contiguous_strides(sizes), offset_);
}

}  // namespace kiln
