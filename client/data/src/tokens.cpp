// kiln::data token files and next-token datasets.
#include "kiln/data/tokens.h"

#include "mapped_file.h"

namespace kiln::data {

namespace {
int64_t token(const uint8_t* base, TokenWidth w, int64_t i) {
  const uint8_t* p = base + i * static_cast<int64_t>(w);
  return w == TokenWidth::k16
             ? int64_t{p[0]} | int64_t{p[1]} << 8
             : int64_t{p[0]} | int64_t{p[1]} << 8 | int64_t{p[2]} << 16 | int64_t{p[3]} << 24;
}
}  // namespace

TokenFile::TokenFile(const std::string& path, TokenWidth width, int64_t vocab_size)
    : file_(detail::MappedFile::open(path)), width_(width) {
  const auto w = static_cast<uint64_t>(width);
  KILN_CHECK(file_->size() % w == 0, Value, path, ": ", file_->size(),
             " bytes is not a whole number of uint", 8 * w,
             " tokens (a truncated file, or one of another token width)");
  size_ = static_cast<int64_t>(file_->size() / w);
  if (vocab_size <= 0) return;
  for (int64_t i = 0; i < size_; ++i) {
    const int64_t t = token(file_->data(), width_, i);
    KILN_CHECK(t < vocab_size, Value, path, ": token ", t, " at position ", i, " is >= vocab_size ",
               vocab_size, " (is the file uint", width == TokenWidth::k16 ? 32 : 16,
               " rather than uint", 8 * w, "?)");
  }
}

int64_t TokenFile::at(int64_t i) const {
  KILN_CHECK(i >= 0 && i < size_, Index, "TokenFile: position ", i, " is outside the file's ",
             size_, " tokens");
  return token(file_->data(), width_, i);
}

Tensor TokenFile::slice(int64_t start, int64_t n) const {
  KILN_CHECK(start >= 0 && n >= 0 && start <= size_ && n <= size_ - start, Index,
             "TokenFile: tokens [", start, ", ", start, " + ", n, ") are outside the file's ",
             size_, " tokens");
  Tensor out = empty_on({n}, kInt64, kCPU);
  int64_t* o = out.data_ptr<int64_t>();
  for (int64_t i = 0; i < n; ++i) o[i] = token(file_->data(), width_, start + i);
  return out;
}

TokenDataset::TokenDataset(std::shared_ptr<const TokenFile> tokens, int64_t block_size,
                           int64_t stride)
    : tokens_(std::move(tokens)), block_(block_size), stride_(stride ? stride : block_size) {
  KILN_CHECK(tokens_ != nullptr, Value, "TokenDataset: the token file is null");
  KILN_CHECK(block_ >= 1 && stride_ >= 1, Value,
             "TokenDataset: block_size and stride must be >= 1, got ", block_, " and ", stride_);
  KILN_CHECK(tokens_->size() >= block_ + 1, Value, "TokenDataset: a file of ", tokens_->size(),
             " tokens is too short for one block of ", block_, " plus its next token");
  size_ = (tokens_->size() - block_ - 1) / stride_ + 1;
}

Example TokenDataset::get(int64_t index) const {
  KILN_CHECK(index >= 0 && index < size_, Index, "TokenDataset: index ", index,
             " is out of range for a dataset of size ", size_);
  Tensor both = tokens_->slice(index * stride_, block_ + 1);
  return {both.narrow(0, 0, block_), both.narrow(0, 1, block_)};
}

}  // namespace kiln::data
