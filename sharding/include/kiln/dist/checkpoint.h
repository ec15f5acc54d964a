// kiln/dist/checkpoint.h: distributed checkpoints (PyTorch's torch.distributed.checkpoint): every
// rank writes its own shards, and a checkpoint loads into any mesh and any placements.
//
//   kiln::TensorMap state = model.state_dict_map();          // DTensors and plain tensors
//   kiln::dist::checkpoint::save(state, "ckpt/step100", R"({"step": 100})");   // every rank
//   auto r = kiln::dist::checkpoint::load(state, "ckpt/step100");  // fills state in place
//   r.extra;                                                  // {"step": 100}
//
// Note [Distributed checkpoint format]: a checkpoint is a directory.
//  - Rank 0 picks the generation (past the committed one and past every shard file's name, a
//    dead save's included) and a random nonce, and broadcasts them.
//  - Each rank writes "__<rank>.<generation>.safetensors" holding its chunk of each tensor it
//    owns a piece of, under the tensor's name: a DTensor's local shard (a Partial one reduced
//    first) when this rank is at index 0 of every mesh dim the tensor is replicated over, and is
//    the lowest rank with that shard (a DTensor on a sub-mesh, mesh["tp"], has a copy in every
//    block of the dims it does not span), so each element is written once; a plain tensor by the
//    lowest rank that holds it (ranks may hold
//    different ones: a pipeline's stages each save their own; a name that two ranks hold must
//    agree on its shape, dtype and placements). It fsyncs the file and the directory, then
//    writes "__<rank>.<gen>.json": each chunk's global offsets and sizes and the CRC-32 of its
//    bytes, its `extra`, and the nonce.
//  - Once every rank's list is there (the ranks agree that each stage succeeded by an
//    all-reduce, so one rank's failure raises on all; an async save polls for the lists with its
//    nonce, so a dead save's are never taken, and a failed rank leaves "__<rank>.<gen>.error",
//    which the others' waits raise), rank 0 merges them into ".metadata" (JSON: per
//    tensor its global shape, dtype and chunks, each with its file, offsets, sizes and CRC-32;
//    rank 0's `extra` JSON and every rank's), written to ".metadata.tmp", fsynced and renamed:
//    that rename is the commit point (as Note [Atomic checkpoints] in kiln/nn/checkpoint.h).
//    Shard files of older generations, and this one's lists, are then removed (never a later
//    generation's: the next save may be writing), and no rank returns before the commit.
//  - Until the rename the previous ".metadata" names the previous generation's files, which the
//    save leaves alone, so a crash at any moment leaves the old checkpoint or the new one.
//  - Load reads ".metadata", and for each tensor of `state` the region this rank holds (its
//    DTensor shard's global offsets and sizes under its own mesh and placements, or the whole
//    of a plain tensor) is copied out of every saved chunk that overlaps it, whatever mesh saved
//    them: resharding is the intersection of boxes. Each chunk is read alone and checked against
//    its CRC-32 (a mismatch names the file and the tensor), and the chunks must cover the region
//    exactly once.
// The directory must be one every rank sees (a shared file system); one save at a time.
#pragma once

#include <future>
#include <string>
#include <vector>

#include "kiln/safetensors.h"

namespace kiln::dist::checkpoint {

// Writes `state` (DTensors and plain tensors; the same names on every rank) into `dir`, created
// if missing; `extra` is a JSON document stored beside it. Collective over the default process
// group when there is one (every rank calls it), else a one-process save.
void save(const TensorMap& state, const std::string& dir, const std::string& extra = "{}");

// An async save in flight: wait() returns once it is committed (or raises its error); done()
// asks without waiting. A later save, async_save, load or conversion of this process waits for
// it first.
class SaveFuture {
 public:
  SaveFuture() = default;
  explicit SaveFuture(std::shared_future<void> f) : f_(std::move(f)) {}
  void wait() const;
  bool done() const;

 private:
  std::shared_future<void> f_;
};

// save(), with the writing in the background: the call takes this rank's chunks (a Partial
// value reduced, collectively, as save() does) and copies them to host memory; a thread writes
// them and commits. The background work synchronizes the ranks through the files, not through
// collectives, so training may go on with its own. See Note [Distributed checkpoint format].
SaveFuture async_save(const TensorMap& state, const std::string& dir,
                      const std::string& extra = "{}");

struct LoadResult {
  std::vector<std::string> missing_keys;  // in `state`, not in the checkpoint (left as they were)
  std::vector<std::string> unexpected_keys;  // in the checkpoint, not in `state`
  // What save() was given: by this rank when as many ranks saved the checkpoint, else by rank 0.
  std::string extra = "{}";
};

// Fills every tensor of `state` in place (a DTensor: its local shard) from the checkpoint in
// `dir`, resharding as needed (See Note [Distributed checkpoint format]). strict: a missing or
// unexpected key is a ValueError naming them all; otherwise they are reported. ValueError for a
// tensor whose global shape or dtype differs from the saved one, a checkpoint that does not cover
// a tensor, or a chunk whose CRC-32 does not match.
LoadResult load(const TensorMap& state, const std::string& dir, bool strict = true);

// Conversion, one tensor in memory at a time (never the whole model): the checkpoint in `dir` as
// one safetensors `file` (written atomically; each chunk's CRC-32 checked), and a safetensors
// `file` as a checkpoint in `dir` whose tensors are split by rows into `shards` files (as
// `shards` ranks would save them), which load() reshards as any other.
void to_safetensors(const std::string& dir, const std::string& file);
void from_safetensors(const std::string& file, const std::string& dir, int shards = 1);

}  // namespace kiln::dist::checkpoint
