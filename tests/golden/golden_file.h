// tests/golden/golden_file.h: reads the golden files that the libtorch generators in this folder
// write (little endian): "KILNGLD1", uint32 count, then per tensor: uint32 name length, name,
// uint32 ndim, int64 sizes[ndim], float64 values (row-major).
//
//   auto golden = kiln::testing::read_golden_file("norm_loss_golden.bin");
//   const kiln::testing::Golden& y = golden.at("layer_norm.y");
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

namespace kiln::testing {

struct Golden {
  std::vector<int64_t> sizes;
  std::vector<double> values;
};

// tests/golden/<name>, searched upward from this source file, the working directory and the
// test binary; empty when not found.
inline std::filesystem::path find_golden_file(const std::string& name) {
  namespace fs = std::filesystem;
  std::vector<fs::path> starts = {fs::path(__FILE__).parent_path(), fs::current_path()};
  char exe[4096];
  ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
  if (n > 0) starts.push_back(fs::path(std::string(exe, n)).parent_path());
  for (fs::path p : starts) {
    for (int up = 0; up < 6 && !p.empty(); ++up, p = p.parent_path()) {
      for (const fs::path& c : {p / name, p / "golden" / name, p / "tests" / "golden" / name})
        if (fs::exists(c)) return c;
      if (p == p.parent_path()) break;
    }
  }
  return {};
}

inline std::map<std::string, Golden> read_golden_file(const std::string& name) {
  std::map<std::string, Golden> out;
  std::filesystem::path path = find_golden_file(name);
  EXPECT_FALSE(path.empty()) << "tests/golden/" << name << " not found";
  if (path.empty()) return out;
  std::ifstream in(path, std::ios::binary);
  char magic[8];
  in.read(magic, 8);
  EXPECT_EQ(std::string(magic, 8), "KILNGLD1") << path;
  uint32_t count = 0;
  in.read(reinterpret_cast<char*>(&count), 4);
  for (uint32_t i = 0; i < count && in; ++i) {
    uint32_t len = 0, ndim = 0;
    in.read(reinterpret_cast<char*>(&len), 4);
    std::string key(len, '\0');
    in.read(key.data(), len);
    in.read(reinterpret_cast<char*>(&ndim), 4);
    Golden g;
    g.sizes.resize(ndim);
    in.read(reinterpret_cast<char*>(g.sizes.data()), 8 * ndim);
    int64_t numel = 1;
    for (int64_t s : g.sizes) numel *= s;
    g.values.resize(numel);
    in.read(reinterpret_cast<char*>(g.values.data()), 8 * numel);
    out[key] = std::move(g);
  }
  EXPECT_TRUE(in.good()) << "truncated golden file " << path;
  return out;
}

}  // namespace kiln::testing
