// Private to worker/src: a session's state and the helpers that session.cpp (the executor) and
// session_gang.cpp (a gang's meshes, redistributions and transfers) share.
#pragma once

#include <absl/container/flat_hash_map.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "kiln/compiler/graph.h"
#include "kiln/dispatcher.h"
#include "kiln/dist/device_mesh.h"
#include "kiln/dist/process_group.h"
#include "kiln/error.h"
#include "kiln/ir.h"
#include "kiln/proto/codec.h"
#include "kiln/worker/session.h"

namespace kiln::worker {
namespace session_detail {

using ErrorPtr = std::shared_ptr<const proto::Error>;

// Thrown inside the executor for a failure that ends the stream rather than poisoning.
struct StreamError {
  std::string message;
};

struct OpEntry {
  const OperatorHandle* op = nullptr;
  int generator_arg = -1;         // index of the `Generator?` argument, or -1
  int written_arg = -1;           // the argument an in-place (self) or out= (out) op returns, or -1
  std::vector<int> mutated_args;  // every argument the schema marks written (Tensor(a!), ...)
  std::pair<int, int> seed_offset_args{-1, -1};  // a seeded op's (ir::seed_offset_args)
};

struct StorageUse {
  int64_t refs = 0;    // table entries holding this storage
  uint64_t bytes = 0;  // its size when it entered the table
};

// A value id whose Create pieces are still arriving. A Create over the memory limit is not
// assembled: its pieces are only followed (offsets) so the id is poisoned once they all came.
struct PendingCreate {
  proto::TensorAssembler assembler;
  ErrorPtr rejected;
  uint64_t received = 0;  // bytes of the pieces so far
  uint64_t total = 0;
};

ErrorPtr make_error(std::string code, std::string kind, std::string message, uint64_t seq,
                    std::string op);
const char* kind_name(ErrorKind k);
const char* code_of(const Error& e);

}  // namespace session_detail

using session_detail::ErrorPtr;
using session_detail::OpEntry;
using session_detail::PendingCreate;
using session_detail::StorageUse;

struct Session::State {
  struct Value {
    Tensor t;
    ErrorPtr error;
  };
  absl::flat_hash_map<int64_t, Value> values;
  absl::flat_hash_map<const Storage*, StorageUse> storages;
  absl::flat_hash_map<std::string, OpEntry> ops;
  absl::flat_hash_map<int64_t, PendingCreate> pending;
  std::atomic<uint64_t> in_use{0};
  std::atomic<uint64_t> instructions{0};
  // Device meshes by the client's root id (MeshCreate; a failed one keeps its error), and the
  // meshes instructions named, by their serialized MeshRef (Note [Remote DTensor]).
  absl::flat_hash_map<int64_t, dist::DeviceMesh> roots;
  absl::flat_hash_map<int64_t, ErrorPtr> failed_roots;
  absl::flat_hash_map<std::string, dist::DeviceMesh> meshes;
  // Storages a Release emptied, with the bytes to give back (Note [FSDP on a gang]).
  absl::flat_hash_map<const Storage*, uint64_t> released;
  ErrorPtr first_failure;  // since the last Sync
  // Transfers this worker sent and the peer has not taken yet: the tensors stay alive until then.
  std::vector<std::pair<dist::WorkPtr, Tensor>> sends;
  Stack stack;  // reused by every instruction
  std::vector<Tensor> results;
  // The compiled-graph cache, by segment key (Note [Compiled batches] in session_compiled.cpp).
  struct CompiledEntry {
    int seen = 0;
    bool failed = false;
    std::shared_ptr<compiler::CompiledGraph> graph;
  };
  absl::flat_hash_map<std::string, CompiledEntry> compiled;
  std::atomic<uint64_t> compiled_runs{0};
  // The previous step mark (the session's start before the first): when, and the process's
  // collective waits then; the time spent running batches since, and when the running batch
  // began (See Note [Step telemetry] in reports.h).
  std::chrono::steady_clock::time_point last_mark = std::chrono::steady_clock::now();
  double waited_at_mark = dist::collective_wait_seconds();
  std::chrono::steady_clock::duration ran_since_mark{0};
  std::chrono::steady_clock::time_point batch_began;
  // What the executor is doing, for a hang report (Session::activity()), set per instruction:
  // no formatting here, only when a report asks.
  struct Activity {
    std::mutex mu;
    std::string_view op;  // the running instruction's op (its proto outlives the Doing)
    uint64_t seq = 0;     // its sequence number, or a compiled segment's first
    size_t segment = 0;   // a compiled segment's instructions (0: not one)
    std::chrono::steady_clock::time_point since = std::chrono::steady_clock::now();
  } activity;
};

namespace session_detail {
// Sets the session's activity for a scope (an instruction, or a compiled segment); idle again at
// its end.
class Doing {
 public:
  Doing(Session::State& s, std::string_view op, uint64_t seq) : a_(s.activity) {
    set(op, seq, 0);
  }
  Doing(Session::State& s, uint64_t first_seq, size_t segment) : a_(s.activity) {
    set({}, first_seq, segment);
  }
  ~Doing() { set({}, 0, 0); }

 private:
  void set(std::string_view op, uint64_t seq, size_t segment) {
    std::lock_guard<std::mutex> lock(a_.mu);
    a_.op = op;
    a_.seq = seq;
    a_.segment = segment;
    a_.since = std::chrono::steady_clock::now();
  }
  Session::State::Activity& a_;
};
}  // namespace session_detail

namespace session_detail {

using State = Session::State;

void add_ref(State& s, const Tensor& t);
void drop_ref(State& s, const Tensor& t);
// An instruction's attribute as the worker runs it: the client names the worker's device
// remote:N, which becomes the session's device.
IValue decode_instruction_attribute(const proto::Attribute& a, const SessionOptions& opt);
// The op's entry (cached per session), or nullptr for an op the table lacks.
const OpEntry* lookup(State& s, const std::string& name);
void bind(State& s, int64_t id, Tensor t, ErrorPtr error);
void forget(State& s, int64_t id);
void fail(State& s, const ErrorPtr& e);
// Why `id` has no entry in the table: its Create is incomplete, or it is unknown.
std::string missing_value(const State& s, int64_t id);
void check_resident(const State& s, const std::string& what, int64_t id, const Tensor& t);
std::string memory_message(uint64_t limit, const std::string& what, uint64_t need, uint64_t used);
// Runs the segment of the batch starting at command `i` through the compiled-graph cache: the
// index of the command after it, or -1 when it must run instruction by instruction, up to
// *plain_until (the caller does not ask again before then).
int run_compiled_segment(State& s, const SessionOptions& opt, const proto::Batch& batch, int i,
                         int* plain_until);
dist::DTensorSpec decode_spec(State& s, const proto::DTensorSpec& p, const Tensor& local);
dist::Placements decode_placements(
    const google::protobuf::RepeatedPtrField<proto::PlacementSpec>& ps);

// A gang's commands (session_gang.cpp).
void run_mesh(State& s, const SessionOptions& opt, const proto::MeshCreate& m);
void run_release(State& s, const proto::Release& r);
void run_redistribute(State& s, const SessionOptions& opt, const proto::Redistribute& r);
void run_transfer(State& s, const SessionOptions& opt, const proto::Transfer& t);
void run_checkpoint(State& s, const proto::Checkpoint& c);

}  // namespace session_detail
}  // namespace kiln::worker
