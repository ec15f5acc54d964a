// kiln/profiler.h: records every op call (name, shapes, dtype, bytes, FLOPs, thread, device),
// user ranges and allocator events, and writes them as a Chrome trace or a key_averages table.
//
//   kiln::profiler::ProfilerOptions o;  o.record_shapes = true;  o.profile_memory = true;
//   o.schedule = kiln::profiler::Schedule(/*wait=*/1, /*warmup=*/1, /*active=*/2);
//   kiln::profiler::Profile prof(o);  prof.start();
//   for (int i = 0; i < 4; ++i) {
//     { kiln::profiler::RecordFunction r("train_step"); train_step(); }
//     prof.step();
//   }
//   prof.stop();  prof.export_chrome_trace("trace.json");
//   std::cout << prof.key_averages().table("cpu_time_total", 10);
//
// Note [Profiler hook]: every generated ops::X::call (and OperatorHandle::call_boxed) tests one
// relaxed atomic (detail::recording_ops()) after computing its key set; when it is set the call
// goes through an out-of-line, cold profiled_call (tensor/src/op_support.h) that times the call and
// records it. So with the profiler off an op pays one load and one predictable branch, and
// redispatches below the top call (Autograd -> CPU) are never events of their own: one event
// per call from user code, a composite's inner calls nested inside it, as PyTorch's
// RecordFunction in Dispatcher::call.
//
// Note [Profiler buffers]: each thread appends finished events to its own buffer (registered
// once, kept alive by the registry after the thread exits), under that buffer's own mutex,
// which only the collector ever contends for. An event is a fixed-size record: the OperatorHandle
// pointer (the name is looked up at export), times from steady_clock in ns, the byte count, and
// a range of the buffer's int64 arena for shapes. Nothing is formatted until collection. An
// event carries the recording cycle (epoch) it started in; one that ends in a later cycle (an
// op spanning a step boundary, warmup events) is dropped.
#pragma once

#include <cstdint>
#include <functional>
#include <iosfwd>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "kiln/array_ref.h"
#include "kiln/device.h"

namespace kiln {

class OperatorHandle;
class Tensor;

namespace profiler {

enum class ProfilerActivity : uint8_t { CPU, CUDA };

// What the profiler does during one step (PyTorch's ProfilerAction).
enum class ProfilerAction : uint8_t { None, Warmup, Record, RecordAndSave };
const char* action_name(ProfilerAction a);

// PyTorch's schedule: skip `skip_first` steps, then cycles of `wait` idle steps, `warmup` steps
// recorded and thrown away, and `active` recorded steps, the last of which ends the cycle
// (RecordAndSave: the trace is collected and on_trace_ready runs). `repeat` cycles, 0: forever.
// Negative counts or active < 1 are ValueErrors naming the argument.
struct Schedule {
  Schedule(int64_t wait, int64_t warmup, int64_t active, int64_t repeat = 0,
           int64_t skip_first = 0);
  ProfilerAction operator()(int64_t step) const;
  int64_t wait, warmup, active, repeat, skip_first;
};
using ScheduleFn = std::function<ProfilerAction(int64_t step)>;

// One op call, user range (RecordFunction) or profiler step range, after collection.
struct Event {
  enum class Kind : uint8_t { Op, UserRange, Step };
  std::string name;
  Kind kind = Kind::Op;
  int64_t start_ns = 0;  // since the profiler started
  int64_t end_ns = 0;
  int64_t self_ns = 0;  // end - start minus the direct children's durations
  uint32_t thread = 0;  // Kiln's thread number: 1, 2, ... in order of first event
  int32_t parent = -1;  // index into Trace::events(), -1: top level of its thread
  Device device;
  std::string dtype;   // the first tensor input's ("" for user ranges and tensor-less ops)
  int64_t bytes = 0;   // input plus output tensor bytes
  int64_t flops = -1;  // -1: not known for this op (Note [Profiler FLOPs] in profiler_export.cpp)
  // One entry per argument when shapes were recorded: a tensor's sizes, {} for a non-tensor or
  // an absent tensor, every element's sizes for a tensor list (input_types says which).
  std::vector<std::vector<std::vector<int64_t>>> input_shapes;
  std::vector<std::string> input_types;  // "float32", "Scalar", "None", "TensorList"
  std::vector<std::vector<int64_t>> output_shapes;
  int64_t memory = 0;       // bytes allocated minus freed while it ran, children included
  int64_t self_memory = 0;  // the same, outside its children
};

// One allocation (bytes > 0) or free (bytes < 0) of a device allocator.
struct MemoryEvent {
  int64_t ts_ns = 0;
  uint64_t addr = 0;
  int64_t bytes = 0;
  int64_t total_allocated = 0;  // the allocator's bytes in use after this event
  Device device;
  uint32_t thread = 0;
};

// key_averages(): one row per op name (and input shapes when grouped by them).
struct FunctionEventAvg {
  std::string key;
  std::string input_shapes;  // "[[16, 32], [64, 32], []]" when grouped by shape, else ""
  int64_t count = 0;
  int64_t cpu_time_total_ns = 0;
  int64_t self_cpu_time_total_ns = 0;
  int64_t flops = 0;  // summed over calls with known FLOPs
  int64_t bytes = 0;
  int64_t cpu_memory_usage = 0;
  int64_t self_cpu_memory_usage = 0;
  double cpu_time_avg_us() const { return count ? cpu_time_total_ns / 1e3 / count : 0; }
};

class KeyAverages {
 public:
  std::vector<FunctionEventAvg> rows;
  bool grouped_by_shape = false, with_memory = false, with_flops = false;
  // PyTorch's table. sort_by: "" (first call order), "count", "cpu_time", "cpu_time_total",
  // "self_cpu_time_total", "cpu_memory_usage", "self_cpu_memory_usage", "flops" (descending);
  // anything else is a ValueError listing these. row_limit < 0: every row.
  std::string table(std::string_view sort_by = "", int64_t row_limit = 100) const;
};

// The events of one recording cycle.
class Trace {
 public:
  const std::vector<Event>& events() const { return events_; }
  const std::vector<MemoryEvent>& memory_events() const { return memory_; }
  KeyAverages key_averages(bool group_by_input_shape = false) const;
  // Chrome trace / Perfetto JSON: {"traceEvents": [...]}; ops and ranges as "X" events (ts and
  // dur in us), memory as "i" events named "[memory]" plus a "C" counter of bytes in use.
  void write_chrome_trace(std::ostream& os) const;
  // RuntimeError naming the path and the reason when it cannot be written.
  void export_chrome_trace(const std::string& path) const;

  bool record_shapes = false, profile_memory = false, with_flops = false;
  int64_t first_step = -1, last_step = -1;  // the steps it covers (ProfilerStep#N ranges)

 private:
  friend class Profile;
  std::vector<Event> events_;
  std::vector<MemoryEvent> memory_;
};

class Profile;

struct ProfilerOptions {
  std::vector<ProfilerActivity> activities = {ProfilerActivity::CPU};
  ScheduleFn schedule;                           // empty: record everything from start() to stop()
  std::function<void(Profile&)> on_trace_ready;  // after each collected cycle
  bool record_shapes = false;
  bool profile_memory = false;
  bool with_flops = false;
};

// The profiler. One may run at a time in a process (a second start() is a RuntimeError).
class Profile {
 public:
  explicit Profile(ProfilerOptions opts = {});
  ~Profile();
  Profile(const Profile&) = delete;
  Profile& operator=(const Profile&) = delete;

  void start();
  // Collects the current cycle if it was recording (and runs on_trace_ready), then turns off.
  void stop();
  // Ends step step_num() and moves to the schedule's action for the next one.
  void step();
  int64_t step_num() const { return step_num_; }
  bool running() const { return running_; }
  ProfilerAction current_action() const { return action_; }

  // The last collected cycle; RuntimeError when there is none yet (saying why).
  const Trace& trace() const;
  KeyAverages key_averages(bool group_by_input_shape = false) const {
    return trace().key_averages(group_by_input_shape);
  }
  void export_chrome_trace(const std::string& path) const { trace().export_chrome_trace(path); }

 private:
  void enter(ProfilerAction a);  // turns recording on or off for action `a`
  void collect(int64_t last_step);  // moves the buffers' events into trace_
  ProfilerOptions opts_;
  bool running_ = false;
  int64_t step_num_ = 0;
  int64_t origin_ns_ = 0;  // steady_clock at start(): the trace's time zero
  int64_t step_start_ns_ = 0;
  int64_t cycle_first_step_ = 0;
  ProfilerAction action_ = ProfilerAction::None;
  std::optional<Trace> trace_;
};

// A user range: from construction to destruction, on this thread, nested like ops
// (PyTorch's record_function). Free when no profiler is recording.
class RecordFunction {
 public:
  explicit RecordFunction(std::string_view name);
  ~RecordFunction();
  RecordFunction(const RecordFunction&) = delete;
  RecordFunction& operator=(const RecordFunction&) = delete;

 private:
  int64_t start_ns_ = -1;  // -1: not recording
  uint32_t epoch_ = 0;
  std::string name_;
};

namespace detail {

// Whether op calls / allocator events are being recorded now. See Note [Profiler hook]: inside
// libkiln_tensor the hot path reads the flags directly (tensor/src/profiler_flags.h).
bool ops_on();
bool memory_on();

// Called by allocators when memory_on(): bytes > 0 an allocation, < 0 a free.
void record_memory(const void* ptr, int64_t bytes, int64_t total_allocated, Device device);

struct ThreadBuffer;

// One op call being profiled (only ever constructed by profiled_call, so only when ops_on()).
// After the call: begin_commit(), input() per argument, output() per result, end_commit().
class OpScope {
 public:
  explicit OpScope(const OperatorHandle& op) noexcept;
  ~OpScope();  // restores the thread's depth; an op that threw is dropped
  OpScope(const OpScope&) = delete;
  OpScope& operator=(const OpScope&) = delete;

  bool begin_commit();  // false: the recording cycle changed while it ran (dropped)
  void input(const Tensor& t);
  void input(const std::optional<Tensor>& t);
  void input(ArrayRef<Tensor> ts);
  void input(const std::vector<Tensor>& ts);
  template <typename T>
  void input(const T&) {
    input_other();
  }
  void output(const Tensor& t);
  void output(const std::vector<Tensor>& ts);
  void end_commit();

 private:
  void input_other();
  void tensor_entry(const Tensor& t);
  const OperatorHandle* op_;
  ThreadBuffer* buf_;
  int64_t start_ns_;
  int64_t end_ns_ = 0;
  uint32_t epoch_;
  bool locked_ = false;  // holds buf_'s mutex between begin_commit and end_commit
  bool committed_ = false;
  bool shapes_ = false;
  uint32_t arena_begin_ = 0, outputs_begin_ = 0;
  int64_t bytes_ = 0;
  int8_t dtype_ = -1;
  Device device_;
  bool have_device_ = false;
};

}  // namespace detail
}  // namespace profiler
}  // namespace kiln
