// kiln/tensor_impl.h: the object behind a Tensor handle: geometry, dtype, device, storage.
//
//   auto impl = kiln::TensorImpl::make(storage, kiln::kFloat32, {2, 3});   // contiguous
//   impl->sizes();  impl->strides();  impl->storage_offset();  impl->numel();
//   impl->set_geometry({3, 2}, {1, 3}, 0);    // bounds-checked against the storage
//
// Note [Data-less tensors]: Meta tensors, and later Remote and fake tensors, use this same
// TensorImpl with a Storage that has a size but no memory. Views of them share that Storage
// (so aliasing and version counters behave as on CPU); reading their data is an error. The
// `remote_handle` slot lets the Remote backend attach its value id without a subclass.
#pragma once

#include <functional>
#include <memory>

#include "kiln/array_ref.h"
#include "kiln/dispatch_key.h"
#include "kiln/object_pool.h"
#include "kiln/scalar_type.h"
#include "kiln/storage.h"

namespace kiln {

// Note [Dimension cap]: a tensor has at most kMaxDims (64) dimensions, the most NumPy (and so
// PyTorch's NumPy interop) supports. Shapes are checked where they enter: every TensorImpl's
// geometry (creation, views, meta and remote tensors), safetensors headers and the wire codec,
// which refuse a longer shape before sizing anything from it. check_dims() says so in one place.
constexpr int64_t kMaxDims = 64;
// ValueError naming the shape's length and the cap when `ndim` exceeds kMaxDims.
void check_dims(int64_t ndim, const char* what = "a tensor");

// Autograd's per-tensor state. tensor/ only holds the slot; autograd/ defines the contents.
struct AutogradMetaInterface {
  virtual ~AutogradMetaInterface() = default;
  virtual bool requires_grad() const = 0;
};

class TensorImpl;

namespace detail {
// Note [Data-read hook]: user code reads a tensor's data through data_ptr() (item(), printing,
// numpy); kernels use raw_data(). A capture (Note [Capture] in kiln/compiler/compile.h) sets
// this thread-local hook to learn that the function's control flow may depend on a value it
// records, which the recorded program could not reproduce. Null almost always.
using DataReadHook = void (*)(const TensorImpl&);
extern thread_local DataReadHook t_data_read_hook;
// Called by Tensor::set_grad before it replaces a tensor's .grad, so that a capture learns
// that a function replaced a .grad it had not read (zero_grad(set_to_none) runs no op).
extern thread_local DataReadHook t_grad_set_hook;
}  // namespace detail

// Opaque per-backend state (e.g. a remote value id, or the value a vmap wrapper batches).
// tensor/ never looks inside; the one thing it asks is how to detach a tensor carrying it.
struct BackendHandle {
  virtual ~BackendHandle() = default;
  // Tensor::detach() of a tensor carrying this handle, when the handle's owner must build it
  // (a storage-less wrapper such as autograd's BatchedTensor detaches its value); nullptr: the
  // default (a new impl over the same storage, sharing this handle).
  virtual intrusive_ptr<TensorImpl> detached(const TensorImpl& self) const;
  // Tensor::requires_grad() of a tensor without autograd state of its own (a wrapper answers
  // for the value autograd records instead of it).
  virtual bool requires_grad() const { return false; }
  // Makes the zero gradient autograd gives an output of a multi-output node that nothing used,
  // for an output carrying this handle (a DTensor's must be a DTensor); nullptr: plain zeros of
  // the output's sizes, dtype and device. Called when the node is recorded, so it must not keep
  // the tensor's values alive.
  virtual std::function<intrusive_ptr<TensorImpl>()> zeros_maker() const { return nullptr; }
  // The whole value as a plain tensor, for code below the wrapper's layer that must combine
  // values of several wrappers (a DTensor's full tensor, gathered over its mesh: a collective,
  // so every rank of the mesh calls it); nullptr: no such value.
  virtual intrusive_ptr<TensorImpl> whole_value() const { return nullptr; }
};

class TensorImpl final : public RefCounted, public PooledObject<TensorImpl> {
 public:
  // A tensor with `sizes` over `storage`; contiguous strides unless `strides` is given.
  static intrusive_ptr<TensorImpl> make(intrusive_ptr<Storage> storage, ScalarType dtype,
                                        IntArrayRef sizes, IntArrayRef strides = {},
                                        int64_t offset = 0);

  // As make(), for callers that sized the storage for this geometry themselves (fresh
  // allocations): skips the bounds check.
  static intrusive_ptr<TensorImpl> make_trusted(intrusive_ptr<Storage> storage, ScalarType dtype,
                                                IntArrayRef sizes, IntArrayRef strides);

  IntArrayRef sizes() const { return sizes_; }
  IntArrayRef strides() const { return strides_; }
  int64_t size(int64_t dim) const;   // wraps negative dims; IndexError if out of range
  int64_t stride(int64_t dim) const;
  int64_t dim() const { return static_cast<int64_t>(sizes_.size()); }
  int64_t numel() const { return numel_; }
  int64_t storage_offset() const { return offset_; }
  ScalarType dtype() const { return dtype_; }
  Device device() const { return storage_->device(); }
  DispatchKeySet key_set() const { return key_set_; }
  const intrusive_ptr<Storage>& storage() const { return storage_; }
  bool is_contiguous() const { return is_contiguous_; }
  size_t itemsize() const { return element_size(dtype_); }

  // Pointer to element 0 (storage data + offset). RuntimeError for data-less tensors. Calls
  // the thread's data-read hook first (Note [Data-read hook]).
  void* data_ptr() const;
  template <typename T>
  T* data() const { return static_cast<T*>(data_ptr()); }
  // As data_ptr(), without the data-less check: for kernels, which only see real tensors.
  void* raw_data() const {
    return static_cast<char*>(storage_->data()) + offset_ * static_cast<int64_t>(itemsize());
  }

  // Replaces sizes, strides and offset after checking that every reachable element lies
  // inside the storage (IndexError otherwise). The only way geometry changes.
  void set_geometry(IntArrayRef sizes, IntArrayRef strides, int64_t offset);
  // Resizes to `sizes` with contiguous strides, growing the storage if needed (out= outputs).
  void resize(IntArrayRef sizes);

  uint32_t version() const { return storage_->version(); }
  void bump_version() { storage_->bump_version(); }

  // Wrapped numbers: 0-dim tensors made from C++/Python scalars, lowest in type promotion.
  bool is_wrapped_number() const { return wrapped_number_; }
  void set_wrapped_number(bool v) { wrapped_number_ = v; }

  void add_keys(DispatchKeySet ks) { key_set_ = key_set_ | ks; }
  void remove_keys(DispatchKeySet ks) { key_set_ = key_set_ - ks; }

  // Created under inference mode: such tensors never enter autograd (Note [Inference tensors]).
  bool is_inference() const { return inference_; }

  // Note [View bases]: a tensor made by a view op (make_view) holds the tensor it views, as
  // PyTorch's `_base`: never itself a view (a view of a view holds the first one's base), null for
  // a tensor that is not a view (detach() makes none). autograd gives that base the history of an
  // in-place write through the view (Note [CopySlices] in autograd/src/copy_slices.h).
  const intrusive_ptr<TensorImpl>& view_base() const { return view_base_; }
  // Makes this tensor a view of `of` (a backend's view kernel calls it on its output).
  void set_view_of(const intrusive_ptr<TensorImpl>& of) {
    view_base_ = of->view_base_ ? of->view_base_ : of;
  }

  AutogradMetaInterface* autograd_meta() const { return autograd_meta_.get(); }
  void set_autograd_meta(std::unique_ptr<AutogradMetaInterface> m) { autograd_meta_ = std::move(m); }
  BackendHandle* backend_handle() const { return backend_handle_.get(); }
  const std::shared_ptr<BackendHandle>& backend_handle_ptr() const { return backend_handle_; }
  void set_backend_handle(std::shared_ptr<BackendHandle> h) { backend_handle_ = std::move(h); }

 private:
  TensorImpl(intrusive_ptr<Storage> storage, ScalarType dtype);
  void refresh_derived();

  intrusive_ptr<Storage> storage_;
  DimVector sizes_;
  DimVector strides_;
  int64_t offset_ = 0;
  int64_t numel_ = 1;
  ScalarType dtype_;
  bool is_contiguous_ = true;
  bool wrapped_number_ = false;
  bool inference_ = false;
  DispatchKeySet key_set_;
  std::unique_ptr<AutogradMetaInterface> autograd_meta_;
  std::shared_ptr<BackendHandle> backend_handle_;
  intrusive_ptr<TensorImpl> view_base_;
};

// Contiguous (row-major) strides for `sizes`.
DimVector contiguous_strides(IntArrayRef sizes);
// The product of `sizes` (0 when one is 0); ValueError when it does not fit in int64.
int64_t numel_of(IntArrayRef sizes);

}  // namespace kiln
