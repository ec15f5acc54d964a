// Atomic training checkpoints (kiln/nn/checkpoint.h, Note [Atomic checkpoints]).
#include "kiln/nn/checkpoint.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>

#include "kiln/error.h"

namespace kiln::nn {

namespace fs = std::filesystem;

[[noreturn]] void sys_fail(const std::string& what, const fs::path& p) {
  KILN_FAIL(Runtime, "checkpoint: ", what, " '", p.string(), "' failed: ", std::strerror(errno));
}

void fsync_path(const fs::path& p, bool directory) {
  int fd = ::open(p.c_str(), O_RDONLY | O_CLOEXEC | (directory ? O_DIRECTORY : 0));
  if (fd < 0) sys_fail("opening", p);
  int rc = ::fsync(fd);
  int err = errno;
  ::close(fd);
  errno = err;
  if (rc != 0) sys_fail("fsync of", p);
}

void commit_file(const fs::path& tmp, const fs::path& final_path) {
  fsync_path(tmp, false);
  if (::rename(tmp.c_str(), final_path.c_str()) != 0) sys_fail("renaming to", final_path);
}

namespace {

using json = nlohmann::json;

constexpr const char* kManifest = "manifest.json";
constexpr const char* kFormat = "kiln.checkpoint";
constexpr int kVersion = 1;
constexpr const char* kSuffix = ".safetensors";

void check_group_name(const std::string& name) {
  bool ok = !name.empty() && name.size() <= 128;
  for (char c : name)
    ok = ok && (std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-');
  KILN_CHECK(ok, Value, "save_checkpoint: group name '", name,
             "' must be 1 to 128 characters of [A-Za-z0-9_-]");
}

std::string group_file(const std::string& group, uint64_t generation) {
  char gen[24];
  std::snprintf(gen, sizeof gen, "%08llu", static_cast<unsigned long long>(generation));
  return group + "." + gen + kSuffix;
}

// The generation of a group file name "<group>.<digits>.safetensors", if it is one.
std::optional<uint64_t> generation_of(const std::string& name) {
  if (name.size() <= std::strlen(kSuffix) || !name.ends_with(kSuffix)) return std::nullopt;
  std::string stem = name.substr(0, name.size() - std::strlen(kSuffix));
  size_t dot = stem.rfind('.');
  if (dot == std::string::npos || dot == 0 || dot + 1 == stem.size()) return std::nullopt;
  uint64_t g = 0;
  for (size_t i = dot + 1; i < stem.size(); ++i) {
    if (!std::isdigit(static_cast<unsigned char>(stem[i])) || g > UINT64_MAX / 10 - 1)
      return std::nullopt;
    g = g * 10 + (stem[i] - '0');
  }
  return g;
}

// Whether `name` is a file this writer created (so cleanup may remove it).
bool is_ours(const std::string& name) {
  if (name == std::string(kManifest) + ".tmp") return true;
  if (name.ends_with(".tmp")) return generation_of(name.substr(0, name.size() - 4)).has_value();
  return generation_of(name).has_value();
}

std::string read_text(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  KILN_CHECK(f.is_open(), Runtime, "load_checkpoint: cannot open '", p.string(),
             "': ", std::strerror(errno));
  std::ostringstream s;
  s << f.rdbuf();
  return s.str();
}

}  // namespace

bool has_checkpoint(const std::string& dir) {
  std::error_code ec;
  return fs::is_regular_file(fs::path(dir) / kManifest, ec);
}

void save_checkpoint(const std::string& dir_name, const Checkpoint& ckpt) {
  const fs::path dir(dir_name);
  json metadata;
  try {
    metadata = json::parse(ckpt.metadata);
  } catch (const json::exception& e) {
    KILN_FAIL(Value, "save_checkpoint: metadata is not valid JSON: ", e.what());
  }
  for (const auto& [name, _] : ckpt.groups) check_group_name(name);

  std::error_code ec;
  fs::create_directories(dir, ec);
  KILN_CHECK(!ec, Runtime, "save_checkpoint: cannot create '", dir.string(), "': ", ec.message());
  // A generation above every file present, so nothing the current manifest names is overwritten.
  uint64_t generation = 1;
  for (const fs::directory_entry& e : fs::directory_iterator(dir))
    if (auto g = generation_of(e.path().filename().string()))
      generation = std::max(generation, *g + 1);

  json groups = json::object();
  for (const auto& [name, tensors] : ckpt.groups) {
    const std::string file = group_file(name, generation);
    const fs::path tmp = dir / (file + ".tmp");
    save_safetensors(tmp.string(), tensors,
                     {{"kiln.group", name}, {"kiln.generation", std::to_string(generation)}});
    commit_file(tmp, dir / file);
    groups[name] = {{"file", file}, {"bytes", fs::file_size(dir / file)}};
  }
  fsync_path(dir, true);  // the group files' names are durable before the manifest names them

  const json manifest = {{"format", kFormat},
                         {"version", kVersion},
                         {"generation", generation},
                         {"groups", groups},
                         {"metadata", metadata}};
  const fs::path tmp = dir / (std::string(kManifest) + ".tmp");
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    f << manifest.dump(1) << "\n";
    f.close();
    KILN_CHECK(!f.fail(), Runtime, "save_checkpoint: writing '", tmp.string(),
               "' failed: ", std::strerror(errno));
  }
  commit_file(tmp, dir / kManifest);  // the commit point
  fsync_path(dir, true);

  for (const fs::directory_entry& e : fs::directory_iterator(dir)) {
    const std::string name = e.path().filename().string();
    if (is_ours(name) && generation_of(name) != generation) fs::remove(e.path(), ec);
  }
}

Checkpoint load_checkpoint(const std::string& dir_name) {
  const fs::path dir(dir_name), manifest_path = dir / kManifest;
  KILN_CHECK(has_checkpoint(dir_name), Value, "load_checkpoint: no checkpoint in '", dir_name,
             "' (", manifest_path.string(), " is missing)");
  const std::string where = manifest_path.string();
  Checkpoint out;
  json m;
  try {
    m = json::parse(read_text(manifest_path));
  } catch (const json::exception& e) {
    KILN_FAIL(Value, "load_checkpoint: '", where, "' is not valid JSON: ", e.what());
  }
  KILN_CHECK(m.is_object() && m.value("format", "") == kFormat, Value, "load_checkpoint: '", where,
             "' is not a Kiln checkpoint manifest");
  KILN_CHECK(m.value("version", 0) == kVersion, Value, "load_checkpoint: '", where,
             "' has version ", m.value("version", json()).dump(), ", this build reads ", kVersion);
  KILN_CHECK(m.contains("generation") && m["generation"].is_number_unsigned() &&
                 m.contains("groups") && m["groups"].is_object() && m.contains("metadata"),
             Value, "load_checkpoint: '", where, "' lacks generation, groups or metadata");
  const uint64_t generation = m["generation"].get<uint64_t>();

  for (const auto& [name, g] : m["groups"].items()) {
    const std::string file = group_file(name, generation);
    KILN_CHECK(g.is_object() && g.value("file", "") == file && g.contains("bytes") &&
                   g["bytes"].is_number_unsigned(),
               Value, "load_checkpoint: '", where, "': group '", name, "' should name file '", file,
               "' and its byte size");
    const fs::path path = dir / file;
    std::error_code ec;
    const uint64_t size = fs::file_size(path, ec);
    KILN_CHECK(!ec, Value, "load_checkpoint: '", path.string(), "' (group '", name,
               "') is missing: ", ec.message());
    KILN_CHECK(size == g["bytes"].get<uint64_t>(), Value, "load_checkpoint: '", path.string(),
               "' has ", size, " bytes, the manifest says ", g["bytes"].get<uint64_t>());
    SafetensorsData d = load_safetensors(path.string());
    const StringMap want = {{"kiln.group", name}, {"kiln.generation", std::to_string(generation)}};
    KILN_CHECK(d.metadata == want, Value, "load_checkpoint: '", path.string(),
               "' does not belong to group '", name, "' of generation ", generation);
    out.groups[name] = std::move(d.tensors);
  }
  out.metadata = m["metadata"].dump();
  return out;
}

}  // namespace kiln::nn
