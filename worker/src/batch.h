// worker/src/batch.h: a worker's part of a batch job, which runs with no client.
//
// Note [Batch jobs]: a batch job (DESIGN.md "Batch job") is a BatchJob spec (program.proto),
// written by kiln.batch.save_job: a captured training step, where each of its inputs comes from
// (a state tensor by name, or a data tensor), the initial checkpoint, the data file, the batch
// size and the step count. `kiln submit --batch SPEC` queues it; the coordinator gang-schedules
// it like any job and hands each worker of the gang a BatchRun with its heartbeat reply. Each
// worker then, on a thread of its own, holding its one stream slot as a client's session would:
//  - joins the gang's process group "world" (the step's collectives run over it);
//  - builds the state tensors from the step's input specs and loads them from the job's
//    checkpoint directory when it holds a checkpoint (a restart), else from the initial one;
//    the step count to resume after is the checkpoint's "step" value;
//  - for each step: binds this rank's rows of global batch k (rows [k*B, (k+1)*B) of each data
//    tensor, wrapping around its first dim; rank r takes B/W of them, in order), runs the step
//    graph (compiler::CompiledGraph; its in-place writes update the state tensors, which stay
//    bound from step to step), records the step's telemetry (Note [Step telemetry] in
//    reports.h) with its own loss, and every checkpoint_every steps saves the state and the step
//    (kiln::dist::checkpoint::save, collectively) into the checkpoint directory;
//  - reports how it ended (BatchResult) with its next heartbeat.
// The coordinator ends the job when rank 0 reports success, and treats a failure as a driver's
// (Note [Restarts] in coordinator/src/jobs.cpp): it restarts the job, which resumes from the last
// checkpoint, or fails it. A session the coordinator closes (a dead worker, a cancel) stops the
// run at its next step and aborts its collectives (Note [Aborting process groups]). A worker runs
// a session's batch once: a BatchRun repeated by later heartbeats is ignored.
//
// Note [Random batch steps]: the captured step drew its random numbers (dropout's masks, randn,
// ...) from one block of the default generator's counters, BatchJob's [rng_offset, rng_offset +
// rng_count) of seed rng_seed (Note [Random ops in a program]). Run k of the step (k = 1, 2, ...)
// on data-parallel rank r of W (the gang's rank, or on a mesh the rank's index along its first
// dim, so the ranks of a tensor-parallel group draw alike, as in eager) draws from the block of
// seed BatchJob.seed at offset ((k - 1) * W + r) * rng_count: every random node, and every
// seeded op (dropout_seeded, _fused_attention) whose (seed, offset) fell in the captured block,
// keeps its place in the block, so each step and rank draws fresh numbers, exactly what an eager
// run of the step would draw with the default generator at that (seed, offset), and a restart
// draws what the uninterrupted run drew. A seeded op given constants of its own (dropout_seeded
// called directly) keeps them.
//
// Note [Batch jobs on a mesh]: a step may be captured on a device mesh (kiln.batch.save_job's
// `mesh`: tensor parallel within data parallel). Every rank of a real process group of the
// mesh's size captures it and saves its shards of the state into the initial checkpoint, and
// rank 0 writes the spec with every rank's step: one when all ranks captured the same bytes,
// else each distinct step (BatchJob.programs) and which rank runs which (a row-wise parallel
// layer adds its replicated bias on one rank of its group, zeros on the others; uneven shards
// give other shapes). In the spec:
//  - BatchJob.mesh_names / mesh_shape name the mesh; the coordinator checks that the gang (and
//    any --mesh) matches it, and gives the job that mesh (Note [Placement]);
//  - a collective's group is "@DIM": rank r's group along mesh dim DIM differs from rank 0's
//    (each block of ranks has its own group), so the writer names it by dim and each worker
//    binds it to its own group, after building the mesh over the gang's group
//    (init_device_mesh);
//  - a DTensor state input carries its sub-mesh (dim names), placements and global shape: the
//    worker makes an empty DTensor of its shard and the checkpoint loads (and saves) it as one,
//    so a checkpoint reshards as any distributed checkpoint does.
// The first mesh dim is the data-parallel one: it splits the batch (rank r of it takes rows as
// rank r of a data-parallel gang does); the ranks along the other dims read the same rows.
//
// Note [Elastic batch jobs]: a step runs on the rows of one data-parallel rank, so it runs
// unchanged on fewer of them: a job submitted with --min-workers (its spec recording the world
// size it was captured for, BatchJob.world_size) restarts after a lost worker on what is left
// down to M, as any elastic job (Note [Restarts] in coordinator/src/jobs.cpp). Its first mesh dim
// (or the gang, without a mesh) shrinks; every data-parallel rank keeps batch_size / (captured
// first dim) rows, so the global batch shrinks with it, as torchrun's elastic jobs do; global
// batch k is then that many rows from k * (its size), and random ops draw by the new ranks (Note
// [Random batch steps]). A rank takes the step of the captured rank at its place along the other
// dims, so a job whose steps differ along the first dim is not elastic (the coordinator refuses
// --min-workers). The checkpoint reshards on load. Bit-for-bit agreement with an uninterrupted
// run holds only while the world size is unchanged.
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "kiln/device.h"
#include "kiln/proto/coordinator.pb.h"

namespace kiln::worker {

class CoordinatorLink;
class Gang;
class StreamGate;

class BatchRunner {
 public:
  BatchRunner(StreamGate& gate, Gang& gang, std::string host, Device device)
      : gate_(gate), gang_(gang), host_(std::move(host)), device_(device) {}
  ~BatchRunner();  // stops the runs in progress and waits for them
  // Starts `run` on a thread unless this worker has run (or runs) its session already. Never
  // waits for an earlier run: one whose session was closed ends beside the new one, which waits
  // for the worker's stream slot (start is called from the heartbeat thread).
  void start(CoordinatorLink& link, const proto::BatchRun& run);
  // The sessions of the runs in progress.
  std::vector<std::string> running() const;
  // Asks the run of `session_id`, if any, to checkpoint and stop (Note [Draining batch jobs]).
  void drain(const std::string& session_id);

 private:
  struct Run {
    std::string session_id;
    std::thread thread;
    std::shared_ptr<std::atomic<bool>> stop, done, drain;
  };
  void main(CoordinatorLink& link, const proto::BatchRun& run, std::atomic<bool>& stop,
            const std::atomic<bool>& drain);

  StreamGate& gate_;
  Gang& gang_;
  std::string host_;
  Device device_;
  mutable std::mutex mu_;
  std::set<std::string> seen_;     // sessions started here
  std::set<std::string> running_;  // sessions whose run has not ended
  std::vector<Run> runs_;          // not joined yet
};

// Runs one worker's part of a batch job (See Note [Batch jobs]) in this thread, after the gang's
// group exists; returns how it ended. `stop` is checked before every step; `drain` asks for a
// checkpoint and a stop (Note [Draining batch jobs]).
proto::BatchResult run_batch(const proto::BatchRun& run, Device device,
                             const std::atomic<bool>& stop, const std::atomic<bool>& drain);

}  // namespace kiln::worker
