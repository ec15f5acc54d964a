// tests/golden/golden_writer.h: what the libtorch generators in this folder share (CI never
// builds them): the sine-filled inputs the tests rebuild identically, recording an output and the
// gradients of sum(y * gy), and the file format golden_file.h reads (little endian):
// "KILNGLD1", uint32 count, then per tensor: uint32 name length, name bytes, uint32 ndim,
// int64 sizes[ndim], float64 values (row-major).
#pragma once

#include <torch/torch.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <string>
#include <utility>
#include <vector>

namespace golden {

// Float64, requires grad: at flat row-major index i, sin(i * a + b) * scale.
inline torch::Tensor fill(std::vector<int64_t> shape, double a, double b, double scale = 1.0) {
  auto t = torch::empty(shape, torch::kFloat64);
  double* p = t.data_ptr<double>();
  for (int64_t i = 0; i < t.numel(); ++i) p[i] = std::sin(i * a + b) * scale;
  return t.requires_grad_(true);
}

class Writer {
 public:
  // "<name>.y" and the gradients "<name>.<input>.grad" of sum(y * gy), gy = fill(.53, .2).
  void record(const std::string& name, const torch::Tensor& y,
              std::vector<std::pair<std::string, torch::Tensor>> inputs) {
    auto gy = fill(y.sizes().vec(), 0.53, 0.2).detach();
    (y * gy).sum().backward();
    add(name + ".y", y);
    for (auto& [n, t] : inputs) add(name + "." + n + ".grad", t.grad());
  }
  void add(const std::string& name, const torch::Tensor& t) { out_.emplace_back(name, t.detach()); }

  int save(const char* path) const {
    std::FILE* f = std::fopen(path, "wb");
    if (!f) return 1;
    std::fwrite("KILNGLD1", 1, 8, f);
    uint32_t count = out_.size();
    std::fwrite(&count, 4, 1, f);
    for (auto& [name, t0] : out_) {
      torch::Tensor t = t0.contiguous().to(torch::kFloat64);
      uint32_t n = name.size(), nd = t.dim();
      std::fwrite(&n, 4, 1, f);
      std::fwrite(name.data(), 1, n, f);
      std::fwrite(&nd, 4, 1, f);
      for (int64_t d = 0; d < t.dim(); ++d) {
        int64_t s = t.size(d);
        std::fwrite(&s, 8, 1, f);
      }
      std::fwrite(t.data_ptr<double>(), 8, t.numel(), f);
    }
    std::fclose(f);
    std::printf("wrote %u tensors to %s\n", count, path);
    return 0;
  }

 private:
  std::vector<std::pair<std::string, torch::Tensor>> out_;
};

}  // namespace golden
