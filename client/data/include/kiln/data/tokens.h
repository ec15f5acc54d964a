// kiln/data/tokens.h: flat token files (a headerless .bin of little-endian uint16 or uint32
// ids, as nanoGPT-style preprocessing writes them), memory-mapped, and next-token examples
// over them.
//
//   auto tokens = std::make_shared<kiln::data::TokenFile>("train.bin", kiln::data::TokenWidth::k16,
//                                                         /*vocab_size=*/65);
//   kiln::Tensor ids = tokens->slice(100, 8);             // int64, shape (8,)
//   auto ds = std::make_shared<kiln::data::TokenDataset>(tokens, /*block_size=*/256);
//   kiln::data::Example e = ds->get(0);                   // {x: tokens[0:256], y: tokens[1:257]}
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "kiln/data/dataset.h"

namespace kiln::data {

namespace detail {
class MappedFile;
}

enum class TokenWidth { k16 = 2, k32 = 4 };

class TokenFile {
 public:
  // ValueError when the file size is not a multiple of the width (a truncated file, or one of
  // the other width) and, with vocab_size > 0, when a token is >= vocab_size (checked once
  // here: the usual sign of a uint32 file read as uint16 or the reverse).
  TokenFile(const std::string& path, TokenWidth width, int64_t vocab_size = 0);
  int64_t size() const { return size_; }
  int64_t at(int64_t i) const;  // IndexError outside [0, size)
  // Tokens [start, start + n) as a new int64 tensor of shape (n,). IndexError outside the file.
  Tensor slice(int64_t start, int64_t n) const;

 private:
  std::shared_ptr<const detail::MappedFile> file_;
  TokenWidth width_;
  int64_t size_;
};

// Example i: x = tokens[i * stride, + block_size), y = the same window shifted by one token.
// Both int64 of shape (block_size,); stride 0 means block_size (windows side by side).
// size() = the windows that fit (a y needs one token past its x).
class TokenDataset : public Dataset {
 public:
  // ValueError for block_size or stride < 1, or a file shorter than block_size + 1 tokens.
  TokenDataset(std::shared_ptr<const TokenFile> tokens, int64_t block_size, int64_t stride = 0);
  int64_t size() const override { return size_; }
  Example get(int64_t index) const override;  // IndexError out of [0, size)

 private:
  std::shared_ptr<const TokenFile> tokens_;
  int64_t block_, stride_, size_;
};

}  // namespace kiln::data
