// kiln/nn/checkpoint.h: training checkpoints (model, optimizer, scheduler, RNG state, data-loader
// position) saved atomically into a directory, so that a crash mid-save leaves the previous
// checkpoint loadable.
//
//   kiln::nn::Checkpoint c;
//   c.groups["model"] = {{"fc.weight", w}, {"fc.bias", b}};
//   c.groups["optimizer"] = {{"0.exp_avg", m}, {"0.exp_avg_sq", v}};
//   c.metadata = R"({"step": 100, "loader": {"epoch": 2, "index": 17}})";
//   kiln::nn::save_checkpoint("runs/ckpt", c);
//   kiln::nn::Checkpoint back = kiln::nn::load_checkpoint("runs/ckpt");
//
// Note [Atomic checkpoints]: a save of generation g writes each group to "<group>.<g>.safetensors"
// (through a ".tmp" file that is fsynced, then renamed), fsyncs the directory, then writes
// "manifest.json.tmp", fsyncs it and renames it over "manifest.json": that rename is the commit
// point. The manifest names each group's file and byte size and holds the metadata; every file
// also records its group and generation, which the loader checks. Until the rename, the old
// manifest and the files of generation g-1 are untouched, so a crash (or SIGKILL) at any moment
// leaves either the old or the new checkpoint complete. After the commit, files of other
// generations and leftover ".tmp" files are removed. The directory belongs to the checkpoint, and
// one process saves into it at a time.
#pragma once

#include <filesystem>
#include <map>
#include <string>

#include "kiln/safetensors.h"

namespace kiln::nn {

struct Checkpoint {
  // Named groups of tensors ("model", "optimizer", ...). Group names use [A-Za-z0-9_-].
  std::map<std::string, TensorMap> groups;
  // A JSON document (scheduler, RNG state, loader position, ...). load_checkpoint returns it
  // re-serialized: equal as JSON, not necessarily byte for byte.
  std::string metadata = "{}";
};

// Saves `ckpt` into `dir` (created if missing), atomically (Note [Atomic checkpoints]).
void save_checkpoint(const std::string& dir, const Checkpoint& ckpt);

// Loads the last committed checkpoint of `dir`. Throws ValueError naming the file if the manifest
// or a group file is missing, truncated or does not match the manifest.
Checkpoint load_checkpoint(const std::string& dir);

// Whether `dir` holds a committed checkpoint (a manifest).
bool has_checkpoint(const std::string& dir);

// The durable-file steps of Note [Atomic checkpoints], for other checkpoint formats
// (kiln/dist/checkpoint.h). RuntimeError naming the path and the system's error on failure.
[[noreturn]] void sys_fail(const std::string& what, const std::filesystem::path& p);
// Flushes a file's (or a directory's entries') data to the disk.
void fsync_path(const std::filesystem::path& p, bool directory);
// Makes a fully written temporary file durable, then gives it its final name.
void commit_file(const std::filesystem::path& tmp, const std::filesystem::path& final_path);

}  // namespace kiln::nn
