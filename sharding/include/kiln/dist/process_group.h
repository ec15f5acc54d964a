// kiln/dist/process_group.h: process groups and collectives between processes (PyTorch's
// torch.distributed names), over UCX on the CPU.
//
//   auto pg = kiln::dist::init_process_group();   // env://: RANK, WORLD_SIZE, MASTER_ADDR/PORT
//   Tensor t = kiln::ones({4});
//   pg->all_reduce(t, kiln::dist::ReduceOp::Sum)->wait();   // in place: t == world size
//   Tensor s = kiln::all_reduce(t, "sum", pg->name());      // functional (tensor/ops/comm.toml)
//   kiln::dist::destroy_process_group();
//
// Every collective returns a Work at once and runs on the process's communication thread, in
// the order this process issued them (Note [Comm thread] in sharding/comm/process_group.cpp).
// Tensors must be contiguous CPU tensors and stay alive and untouched until the Work completes.
// A collective that cannot finish within the group's timeout (a dead, stuck or desynchronised
// peer) fails with kiln::Error (Runtime) on every rank waiting for it, naming the collective,
// its sequence number and the rank to blame (Note [Collective timeouts]).
#pragma once

#include <chrono>
#include <condition_variable>
#include <exception>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "kiln/dist/store.h"
#include "kiln/tensor.h"

namespace kiln::dist {

enum class ReduceOp { Sum, Avg, Max, Min, Product };
// "sum", "avg", "max", "min", "product" (ValueError otherwise).
ReduceOp parse_reduce_op(std::string_view name);
const char* reduce_op_name(ReduceOp op);

// The completion of one collective.
class Work {
 public:
  bool is_completed();
  // Waits until the collective finishes and rethrows its error; kiln::Error (Runtime) when
  // `timeout` passes first. Without one the wait is still bounded: the collective itself fails
  // within the group's timeout of starting.
  void wait(std::optional<Milliseconds> timeout = std::nullopt);
  // When the collective finished (steady clock); meaningful once is_completed().
  std::chrono::steady_clock::time_point finish_time();

  // For the comm thread.
  explicit Work(std::string what) : what_(std::move(what)) {}
  void finish(std::exception_ptr error = nullptr);

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
  std::chrono::steady_clock::time_point finished_at_;
  std::exception_ptr error_;
  std::string what_;
};
using WorkPtr = std::shared_ptr<Work>;

class ProcessGroupImpl;

class ProcessGroup {
 public:
  int rank() const;
  int size() const;
  const std::string& name() const;
  bool fake() const;  // backend "fake" (Note [Fake process group])
  Milliseconds timeout() const;
  // The world ranks of the members, in group-rank order.
  const std::vector<int>& ranks() const;

  // In place on `tensor` (every rank passes the same shape and dtype).
  WorkPtr all_reduce(Tensor& tensor, ReduceOp op = ReduceOp::Sum);
  WorkPtr broadcast(Tensor& tensor, int src);
  // output: (size * N, ...), input: (N, ...).
  WorkPtr all_gather_into_tensor(Tensor& output, const Tensor& input);
  // output: (N, ...), input: (size * N, ...).
  WorkPtr reduce_scatter_tensor(Tensor& output, const Tensor& input, ReduceOp op = ReduceOp::Sum);
  // Splits along dim 0 (empty: equal splits).
  WorkPtr all_to_all_single(Tensor& output, const Tensor& input,
                            std::vector<int64_t> output_split_sizes = {},
                            std::vector<int64_t> input_split_sizes = {});
  WorkPtr send(const Tensor& tensor, int dst, int tag = 0);
  WorkPtr recv(Tensor& tensor, int src, int tag = 0);
  WorkPtr barrier();

  // The last collectives of this group, oldest first, one line each (the flight recorder).
  std::string dump_recent() const;
  // See Note [Aborting process groups].
  void abort(const std::string& why);

  explicit ProcessGroup(std::shared_ptr<ProcessGroupImpl> impl) : impl_(std::move(impl)) {}
  ~ProcessGroup();

 private:
  void check_p2p(const char* op, const char* peer_name, const Tensor& tensor, int peer,
                 int tag) const;
  std::shared_ptr<ProcessGroupImpl> impl_;
};
using ProcessGroupPtr = std::shared_ptr<ProcessGroup>;

struct InitOptions {
  // "ucx" (CPU tensors), "nccl" (CUDA tensors, builds with CUDA; Note [NCCL backend] in
  // sharding/comm/nccl.h) or "fake" (one process plays `rank` of `world_size`: collectives only
  // count bytes; init_method "", no store; Note [Fake process group] in comm/process_group.cpp).
  std::string backend = "ucx";
  // "env://" reads RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT (Note [Launch environment]);
  // otherwise rank, world_size and store below are used.
  std::string init_method = "env://";
  int rank = -1;
  int world_size = -1;
  std::shared_ptr<TCPStore> store;
  // Default: KILN_COMM_TIMEOUT_S, else 60 s.
  std::optional<Milliseconds> timeout;
  std::string group_name = "world";
};

// Creates the default group (the world). ValueError when one exists or the environment is
// incomplete.
ProcessGroupPtr init_process_group(const InitOptions& options = {});
bool is_initialized();
ProcessGroupPtr default_group();  // ValueError when none exists
// A subgroup of the world (every world rank must call it, in the same order, as in PyTorch);
// nullptr on ranks that are not members.
ProcessGroupPtr new_group(const std::vector<int>& ranks, std::optional<Milliseconds> timeout = {},
                          std::string name = "");
// The group registered under `name` (ValueError naming the known groups otherwise).
ProcessGroupPtr find_group(std::string_view name);
// Destroys every group and the transport (a later init_process_group starts afresh).
void destroy_process_group();
// Every group's flight recorder (its last collectives and their states), for a hang report.
std::string dump_all_groups();
// Note [Aborting process groups]: makes every collective of every group, in flight or later,
// fail at once with a RuntimeError naming `why`, instead of waiting out its timeout for a peer
// that is gone: a worker whose session ended (the coordinator closed it, or gave the worker to
// another session) aborts the session's groups, so its executor, stuck in a collective with a
// dead rank, is free within milliseconds. UCX groups only (an NCCL group still times out).
// destroy_process_group() must follow before the next init_process_group.
void abort_process_groups(const std::string& why);

// A one-rank group that needs no transport and no store (tests, single-process runs).
ProcessGroupPtr new_local_group(std::string name);

// What the fake backend's collectives were asked for, per collective name: calls, and the bytes
// this rank would send (See Note [Fake process group] in comm/process_group.cpp).
struct CommStats {
  int64_t calls = 0;
  int64_t bytes = 0;
};
std::map<std::string, CommStats, std::less<>> fake_comm_stats();
void reset_fake_comm_stats();

// Rank-local launch facts (LOCAL_RANK / LOCAL_WORLD_SIZE; 0 and 1 when unset).
int local_rank();
int local_world_size();

// Note [Collective observer]: a process-wide callback told of every collective this process
// issues (point-to-point sends and receives aside, whose sequences differ by rank), in issue
// order within each group, with the group's sequence number and the collective's dtype and
// sizes: a worker passes them to its coordinator, which compares the ranks' sequences (Note
// [Desync detection] in coordinator/src/desync.h). It runs on the issuing thread, under the
// group's lock, so it must only copy and return.
struct CollectiveEvent {
  std::string_view group;
  int rank = 0, size = 0;        // this process's rank in the group, and the group's size
  uint64_t seq = 0;              // 1 for the group's first collective
  std::string_view op;           // "all_reduce"
  std::string_view shape;        // "float32[4, 3]"
  std::span<const int> members;  // the group's members' world ranks (empty where unknown)
};
using CollectiveObserver = void (*)(const CollectiveEvent&);
// Seconds this process's threads have spent in Work::wait for unfinished collectives, in all
// (a worker's step telemetry subtracts it: See Note [Step telemetry] in worker/src/reports.h).
double collective_wait_seconds();
void set_collective_observer(CollectiveObserver observer);  // nullptr: none
namespace detail {
void observe_collective(const CollectiveEvent& e);
}  // namespace detail

}  // namespace kiln::dist
