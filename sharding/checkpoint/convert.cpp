// A checkpoint to and from one safetensors file, a tensor at a time (kiln/dist/checkpoint.h), and
// the streaming safetensors reader and writer that load also reads shards with.
#include <nlohmann/json.hpp>

#include "internal.h"
#include "kiln/dist/checkpoint.h"
#include "kiln/dist/dtensor.h"
#include "kiln/kiln.h"
#include "kiln/nn/checkpoint.h"
#include "kiln/safetensors.h"

namespace kiln::dist::checkpoint {
namespace internal {

std::unique_ptr<StFile> open_safetensors(const fs::path& p) {
  auto f = std::make_unique<StFile>();
  f->path = p;
  f->in.open(p, std::ios::binary);
  KILN_CHECK(f->in.good(), Value, "checkpoint: cannot read '", p.string(), "'");
  const uint64_t size = fs::file_size(p);
  unsigned char len_bytes[8] = {};
  f->in.read(reinterpret_cast<char*>(len_bytes), 8);
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = n << 8 | len_bytes[i];
  KILN_CHECK(f->in.good() && n <= kSafetensorsMaxHeaderBytes && n <= size - 8, Value, "'",
             p.string(), "' is not a safetensors file (header length ", n, " in a file of ", size,
             " bytes)");
  std::string header(n, '\0');
  f->in.read(header.data(), static_cast<std::streamsize>(n));
  f->data_start = 8 + n;
  json h;
  try {
    h = json::parse(header);
  } catch (const json::exception& e) {
    KILN_FAIL(Value, "'", p.string(), "': its safetensors header is not valid JSON: ", e.what());
  }
  KILN_CHECK(h.is_object(), Value, "'", p.string(), "': its safetensors header is not an object");
  for (const auto& [name, e] : h.items()) {
    if (name == "__metadata__") continue;
    try {
      StEntry t{name, safetensors_dtype_from_name(e.at("dtype").get<std::string>()),
                e.at("shape").get<std::vector<int64_t>>(),
                e.at("data_offsets").at(0).get<uint64_t>(),
                e.at("data_offsets").at(1).get<uint64_t>()};
      uint64_t bytes = element_size(t.dtype);
      for (int64_t d : t.shape)
        KILN_CHECK(d >= 0 && !__builtin_mul_overflow(bytes, static_cast<uint64_t>(d), &bytes),
                   Value, "'", p.string(), "': tensor '", name, "' has a bad shape");
      KILN_CHECK(t.begin <= t.end && t.end - t.begin == bytes && t.end <= size - f->data_start,
                 Value, "'", p.string(), "': tensor '", name, "' has data offsets [", t.begin, ", ",
                 t.end, ") for ", bytes, " bytes of ", size - f->data_start);
      f->entries.emplace(name, std::move(t));
    } catch (const json::exception& x) {
      KILN_FAIL(Value, "'", p.string(), "': tensor '", name, "' has a malformed entry: ", x.what());
    }
  }
  return f;
}

Tensor read_entry(StFile& f, const std::string& name) {
  auto it = f.entries.find(name);
  KILN_CHECK(it != f.entries.end(), Value, "'", f.path.string(), "' holds no tensor '", name, "'");
  const StEntry& e = it->second;
  Tensor t = empty(IntArrayRef(e.shape), e.dtype, kCPU);
  f.in.clear();
  f.in.seekg(static_cast<std::streamoff>(f.data_start + e.begin));
  f.in.read(static_cast<char*>(t.impl()->raw_data()),
            static_cast<std::streamsize>(e.end - e.begin));
  KILN_CHECK(f.in.good(), Value, "'", f.path.string(), "': reading tensor '", name, "' failed");
  return t;
}

void write_header(std::ofstream& out, std::vector<StEntry>& entries) {
  json h = json::object();
  uint64_t at = 0;
  for (StEntry& e : entries) {
    uint64_t bytes = element_size(e.dtype);
    for (int64_t d : e.shape) bytes *= static_cast<uint64_t>(d);
    e.begin = at;
    e.end = at + bytes;
    at = e.end;
    h[e.name] = {{"dtype", safetensors_dtype_name(e.dtype)},
                 {"shape", e.shape},
                 {"data_offsets", {e.begin, e.end}}};
  }
  std::string text = h.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  unsigned char len[8];
  for (int i = 0; i < 8; ++i) len[i] = static_cast<unsigned char>(text.size() >> (8 * i));
  out.write(reinterpret_cast<const char*>(len), 8);
  out.write(text.data(), static_cast<std::streamsize>(text.size()));
}

void write_data(std::ofstream& out, const Tensor& t) {
  Tensor c = t.contiguous();
  out.write(static_cast<const char*>(c.impl()->raw_data()),
            static_cast<std::streamsize>(c.nbytes()));
}

}  // namespace internal

using namespace internal;

void to_safetensors(const std::string& dir, const std::string& file) {
  wait_inflight();
  const fs::path root(dir), mpath = root / kMetadata;
  KILN_CHECK(fs::exists(mpath), Value, "checkpoint.to_safetensors: no checkpoint in '", dir, "'");
  const json meta = read_json(mpath);
  std::vector<StEntry> entries;
  std::map<std::string, std::unique_ptr<StFile>> files;
  const fs::path out_path(file), tmp = out_path.string() + ".tmp";
  try {
    for (const auto& [name, e] : meta.at("tensors").items())
      entries.push_back({name, safetensors_dtype_from_name(e.at("dtype").get<std::string>()),
                         e.at("shape").get<std::vector<int64_t>>(), 0, 0});
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    KILN_CHECK(out.good(), Value, "checkpoint.to_safetensors: cannot write '", tmp.string(), "'");
    write_header(out, entries);
    for (const StEntry& e : entries) {  // one whole tensor in memory at a time
      Tensor t = empty(IntArrayRef(e.shape), e.dtype, kCPU);
      fill_region(e.name, meta.at("tensors").at(e.name), e.shape, e.dtype, t,
                  whole(IntArrayRef(e.shape)), root, dir, files);
      write_data(out, t);
    }
    out.flush();
    if (!out.good()) nn::sys_fail("writing", tmp);
  } catch (const json::exception& e) {
    KILN_FAIL(Value, "checkpoint.to_safetensors: '", mpath.string(), "' is malformed: ", e.what());
  }
  nn::commit_file(tmp, out_path);
}

void from_safetensors(const std::string& file, const std::string& dir, int shards) {
  wait_inflight();
  KILN_CHECK(shards >= 1, Value, "checkpoint.from_safetensors: shards must be >= 1, got ", shards);
  std::unique_ptr<StFile> src = open_safetensors(file);
  const fs::path root(dir);
  std::error_code ec;
  fs::create_directories(root, ec);
  KILN_CHECK(!ec && fs::is_directory(root), Value,
             "checkpoint.from_safetensors: cannot create directory '", dir, "': ", ec.message());
  const uint64_t gen = committed_generation(root) + 1;
  // Shard k holds rows chunk_of(rows, shards, k) of every tensor (0-d ones: shard 0).
  std::vector<std::vector<StEntry>> layout(shards);
  json meta{{"format", kFormat},    {"version", kVersion},     {"generation", gen},
            {"world_size", shards}, {"extra", json::object()}, {"tensors", json::object()}};
  for (const auto& [name, e] : src->entries) {
    meta["tensors"][name] = {
        {"shape", e.shape}, {"dtype", safetensors_dtype_name(e.dtype)}, {"chunks", json::array()}};
    for (int k = 0; k < shards; ++k) {
      if (e.shape.empty() && k > 0) continue;
      StEntry piece = e;
      if (!e.shape.empty()) {
        auto [off, len] = chunk_of(e.shape[0], shards, k);
        if (len == 0 && k > 0) continue;
        piece.shape[0] = len;
      }
      layout[k].push_back(piece);
    }
  }
  std::vector<std::ofstream> outs(shards);
  for (int k = 0; k < shards; ++k) {
    outs[k].open(root / (rank_file(k, gen, ".safetensors") + ".tmp"),
                 std::ios::binary | std::ios::trunc);
    KILN_CHECK(outs[k].good(), Value, "checkpoint.from_safetensors: cannot write into '", dir, "'");
    write_header(outs[k], layout[k]);
  }
  for (const auto& [name, e] : src->entries) {  // one whole tensor in memory at a time
    Tensor t = read_entry(*src, name);
    for (int k = 0; k < shards; ++k) {
      if (e.shape.empty() && k > 0) continue;
      std::vector<int64_t> off(e.shape.size(), 0);
      Tensor piece = t;
      if (!e.shape.empty()) {
        auto [o, len] = chunk_of(e.shape[0], shards, k);
        if (len == 0 && k > 0) continue;
        off[0] = o;
        piece = t.narrow(0, o, len);
      }
      piece = piece.contiguous();
      write_data(outs[k], piece);
      meta["tensors"][name]["chunks"].push_back(
          {{"file", rank_file(k, gen, ".safetensors")},
           {"offsets", off},
           {"sizes", std::vector<int64_t>(piece.sizes().begin(), piece.sizes().end())},
           {"crc32", crc_of(piece)}});
    }
  }
  for (int k = 0; k < shards; ++k) {
    outs[k].flush();
    const fs::path tmp = root / (rank_file(k, gen, ".safetensors") + ".tmp");
    if (!outs[k].good()) nn::sys_fail("writing", tmp);
    outs[k].close();
    nn::commit_file(tmp, root / rank_file(k, gen, ".safetensors"));
  }
  write_json(root / kMetadata, meta);  // the commit point
  nn::fsync_path(root, true);
  remove_other_generations(root, gen);
}

}  // namespace kiln::dist::checkpoint
