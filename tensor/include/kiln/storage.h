// kiln/storage.h: the refcounted buffer that a tensor and all of its views share.
//
//   auto s = kiln::Storage::create(64, kiln::kCPU);       // 64 bytes from the CPU allocator
//   auto m = kiln::Storage::create_dataless(64, kiln::kMeta);   // no memory; size only
//   s->version();  s->bump_version();                    // Note [Version counters]
//
// Note [Version counters]: the counter lives in the Storage, so every view of a storage (and
// every detached alias of it) sees one counter. In-place ops bump it; autograd compares the
// version it saved with the current one to detect an in-place change to a saved tensor.
#pragma once

#include <atomic>
#include <cstdint>

#include "kiln/allocator.h"
#include "kiln/intrusive_ptr.h"
#include "kiln/object_pool.h"

namespace kiln {

class Storage;

namespace detail {
// Note [Storage access hook]: every read or write of a storage's memory outside an op's kernel
// (an op's kernel too, but it runs where the hook ignores it) goes through data() or resize():
// data_ptr() and raw_data() (item(), numpy, a checkpoint's CRC), FSDP's gathers into and frees
// of its unsharded parameters. A process group touches each tensor's data() on the caller's
// thread before its transport reads or writes the memory on another. A recorder that defers
// ops (Note [Graph break segments] in compiler/src/segments.cpp) sets this thread-local hook to
// run them before such an access of a storage they make or read. Null almost always.
using StorageHook = void (*)(const Storage&);
extern thread_local StorageHook t_storage_hook;
}  // namespace detail

class Storage final : public RefCounted, public PooledObject<Storage> {
 public:
  static intrusive_ptr<Storage> create(size_t nbytes, Device device);
  static intrusive_ptr<Storage> create_dataless(size_t nbytes, Device device);
  // Wraps memory owned by someone else (e.g. numpy); `data` stays owned by `ptr`'s deleter.
  static intrusive_ptr<Storage> wrap(DataPtr ptr, size_t nbytes);

  void* data() const {
    if (detail::t_storage_hook != nullptr) [[unlikely]]
      detail::t_storage_hook(*this);  // Note [Storage access hook]
    return data_.get();
  }
  bool has_data() const { return device_.has_data(); }
  size_t nbytes() const { return nbytes_; }
  Device device() const { return device_; }
  uint32_t version() const { return version_.load(std::memory_order_relaxed); }
  void bump_version() { version_.fetch_add(1, std::memory_order_relaxed); }

  // Reallocates to `nbytes` (out= resizing); keeps the first min(old, new) bytes.
  void resize(size_t nbytes);
  // Exchanges the memory of two storages of the same size and device, so a result computed
  // elsewhere lands in the tensors that share this storage without a copy.
  void swap_data(Storage& other);

 private:
  Storage(DataPtr data, size_t nbytes, Device device)
      : data_(std::move(data)), nbytes_(nbytes), device_(device) {}
  DataPtr data_;
  size_t nbytes_;
  Device device_;
  std::atomic<uint32_t> version_{0};
};

}  // namespace kiln
