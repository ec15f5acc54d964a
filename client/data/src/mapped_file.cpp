// client/data's file mappings (Note [Mapped tensors] in mapped_file.h).
#include "mapped_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "kiln/storage.h"

namespace kiln::data::detail {

std::shared_ptr<const MappedFile> MappedFile::open(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  KILN_CHECK(fd >= 0, Runtime, "cannot open '", path, "': ", std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    int err = errno;
    ::close(fd);
    KILN_FAIL(Runtime, "cannot stat '", path, "': ", std::strerror(err));
  }
  std::shared_ptr<MappedFile> m(new MappedFile());
  m->path_ = path;
  m->size_ = static_cast<uint64_t>(st.st_size);
  if (m->size_ > 0) {
    void* p = ::mmap(nullptr, m->size_, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd, 0);
    int err = errno;
    ::close(fd);
    KILN_CHECK(p != MAP_FAILED, Runtime, "cannot map '", path, "': ", std::strerror(err));
    m->data_ = static_cast<uint8_t*>(p);
  } else {
    ::close(fd);
  }
  return m;
}

MappedFile::~MappedFile() {
  if (data_) ::munmap(data_, size_);
}

Tensor tensor_over(const std::shared_ptr<const MappedFile>& file, uint64_t offset, ScalarType dtype,
                   IntArrayRef sizes) {
  const size_t nbytes = static_cast<size_t>(numel_of(sizes)) * element_size(dtype);
  KILN_ASSERT(offset <= file->size() && nbytes <= file->size() - offset);
  uint8_t* p = const_cast<uint8_t*>(file->data()) + offset;
  if (reinterpret_cast<uintptr_t>(p) % element_size(dtype) != 0) {
    Tensor t = empty_on(sizes, dtype, kCPU);
    if (nbytes) std::memcpy(t.data_ptr(), p, nbytes);
    return t;
  }
  auto* owner = new std::shared_ptr<const MappedFile>(file);
  DataPtr ptr(
      p, owner,
      [](void* ctx, void*) { delete static_cast<std::shared_ptr<const MappedFile>*>(ctx); },
      Device(kCPU));
  return Tensor(TensorImpl::make(Storage::wrap(std::move(ptr), nbytes), dtype, sizes));
}

}  // namespace kiln::data::detail
