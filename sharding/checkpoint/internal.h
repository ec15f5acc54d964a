// sharding/checkpoint/internal.h: what dcp.cpp (save and load) and convert.cpp (one safetensors
// file to and from a checkpoint, and the streaming safetensors reader and writer that both use)
// share. See Note [Distributed checkpoint format] in kiln/dist/checkpoint.h.
#pragma once

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "kiln/tensor.h"

namespace kiln::dist::checkpoint::internal {

namespace fs = std::filesystem;
using json = nlohmann::json;

inline constexpr const char* kMetadata = ".metadata";
inline constexpr const char* kFormat = "kiln.dcp";
inline constexpr int kVersion = 1;

// A region of a tensor: global offsets and sizes per dim.
struct Box {
  std::vector<int64_t> off, size;
  int64_t numel() const {
    int64_t n = 1;
    for (int64_t s : size) n *= s;
    return n;
  }
};
Box whole(IntArrayRef shape);

uint32_t crc_of(const Tensor& contiguous_cpu);
// "__<rank>.<generation><ext>", a shard file's name.
std::string rank_file(int r, uint64_t generation, const char* ext);
json read_json(const fs::path& p);
// Written to "<p>.tmp", then renamed into place.
void write_json(const fs::path& p, const json& j);
// The generation ".metadata" names (0: none, or unreadable).
uint64_t committed_generation(const fs::path& dir);
// After the commit of generation `gen`: the files of other generations, the merged chunk lists
// and leftover temporary files.
void remove_other_generations(const fs::path& root, uint64_t gen);
// Waits for this process's async save, if one is running.
void wait_inflight();

// ---- Streaming safetensors (convert.cpp): a file's header, then one tensor at a time -------

// One tensor of a safetensors file, located by its header (Note [safetensors format]).
struct StEntry {
  std::string name;
  ScalarType dtype = kFloat32;
  std::vector<int64_t> shape;
  uint64_t begin = 0, end = 0;  // into the data
};

struct StFile {
  fs::path path;
  std::ifstream in;
  uint64_t data_start = 0;
  std::map<std::string, StEntry> entries;
};

// Reads and checks a safetensors header only, so that tensors can be read one at a time.
std::unique_ptr<StFile> open_safetensors(const fs::path& p);
Tensor read_entry(StFile& f, const std::string& name);
// Writes a safetensors header for `entries` (their data laid out in order) to `out`.
void write_header(std::ofstream& out, std::vector<StEntry>& entries);
void write_data(std::ofstream& out, const Tensor& t);

// Copies into `dst`, the region `box` of tensor `name` (described by `entry`: its `shape`, `dtype`
// and chunks), every saved chunk that overlaps it, each read alone from its file (kept open in
// `files`) and checked against its CRC-32; the chunks must cover the region exactly once
// (dcp.cpp).
void fill_region(const std::string& name, const json& entry, const std::vector<int64_t>& shape,
                 ScalarType dtype, const Tensor& dst, const Box& box, const fs::path& root,
                 const std::string& dir, std::map<std::string, std::unique_ptr<StFile>>& files);

}  // namespace kiln::dist::checkpoint::internal
