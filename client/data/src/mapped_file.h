// Private to client/data: a read-only file mapping shared by the tensors that view it.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "kiln/tensor.h"

namespace kiln::data::detail {

// Note [Mapped tensors]: files are mapped MAP_PRIVATE with PROT_READ | PROT_WRITE, so a tensor
// that views one can be written like any other: the write copies the page and never reaches
// the file. Every tensor over a mapping holds a reference to it; the last one unmaps it.
class MappedFile {
 public:
  // RuntimeError naming the path and the system's reason when it cannot be opened or mapped.
  static std::shared_ptr<const MappedFile> open(const std::string& path);
  ~MappedFile();
  const uint8_t* data() const { return data_; }
  uint64_t size() const { return size_; }
  const std::string& path() const { return path_; }

 private:
  MappedFile() = default;
  uint8_t* data_ = nullptr;
  uint64_t size_ = 0;
  std::string path_;
};

// A CPU tensor of `sizes` and `dtype` over bytes [offset, offset + nbytes) of `file`; copies
// them into a fresh tensor when they are not aligned to the dtype's size.
Tensor tensor_over(const std::shared_ptr<const MappedFile>& file, uint64_t offset, ScalarType dtype,
                   IntArrayRef sizes);

}  // namespace kiln::data::detail
