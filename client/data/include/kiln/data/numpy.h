// kiln/data/numpy.h: memory-mapped readers for NumPy's .npy and (uncompressed) .npz files.
//
//   kiln::Tensor x = kiln::data::load_npy("digits_x.npy");   // views the file, no copy
//   auto arrays = kiln::data::load_npz("digits.npz");        // {"x": ..., "y": ...}
//   kiln::Tensor y = arrays.at("y");
//   x.add_(1);    // allowed: the write stays in memory (Note [Mapped tensors])
//
// Reads dtypes b1, u1, i1, i2, i4, i8, f2, f4, f8 in little-endian C order, from format versions
// 1.0, 2.0 and 3.0. Everything else (big-endian, fortran_order, uint16+, object and structured
// dtypes, savez_compressed archives) and every malformed file (wrong magic, truncated data, a
// shape that disagrees with the data size) raises a ValueError naming the file and the problem.
#pragma once

#include <map>
#include <string>

#include "kiln/tensor.h"

namespace kiln::data {

Tensor load_npy(const std::string& path);
// The arrays of an np.savez archive, by name (the member name without ".npy").
std::map<std::string, Tensor> load_npz(const std::string& path);

}  // namespace kiln::data
