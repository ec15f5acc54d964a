#include "kiln/storage.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "kiln/error.h"

namespace kiln {

thread_local detail::StorageHook detail::t_storage_hook = nullptr;

intrusive_ptr<Storage> Storage::create(size_t nbytes, Device device) {
  if (!device.has_data()) return create_dataless(nbytes, device);
  DataPtr p = nbytes ? get_allocator(device.type())->allocate(nbytes) : DataPtr();
  return intrusive_ptr<Storage>(new Storage(std::move(p), nbytes, device));
}

intrusive_ptr<Storage> Storage::create_dataless(size_t nbytes, Device device) {
  return intrusive_ptr<Storage>(new Storage(DataPtr(), nbytes, device));
}

intrusive_ptr<Storage> Storage::wrap(DataPtr ptr, size_t nbytes) {
  Device d = ptr.device();
  return intrusive_ptr<Storage>(new Storage(std::move(ptr), nbytes, d));
}

void Storage::resize(size_t nbytes) {
  if (nbytes == nbytes_) return;
  if (detail::t_storage_hook != nullptr) [[unlikely]]
    detail::t_storage_hook(*this);  // Note [Storage access hook]
  if (!has_data()) {
    nbytes_ = nbytes;
    return;
  }
  KILN_CHECK(device_.is_cpu() || nbytes <= nbytes_, NotImplemented,
             "resizing a ", device_.str(), " storage to a larger size");
  if (nbytes == 0) {  // releases the memory (FSDP frees gathered parameters this way)
    data_ = DataPtr();
    nbytes_ = 0;
    return;
  }
  if (nbytes <= nbytes_) {
    nbytes_ = nbytes;
    return;
  }
  DataPtr p = get_allocator(device_.type())->allocate(nbytes);
  if (nbytes_) std::memcpy(p.get(), data_.get(), nbytes_);
  data_ = std::move(p);
  nbytes_ = nbytes;
}

void Storage::swap_data(Storage& other) {
  KILN_CHECK(nbytes_ == other.nbytes_ && device_ == other.device_, Value,
             "swap_data: storages of ", nbytes_, " bytes on ", device_.str(), " and ",
             other.nbytes_, " bytes on ", other.device_.str());
  std::swap(data_, other.data_);
}

}  // namespace kiln
