// The profiler's recording side: per-thread buffers, the op and memory hooks, RecordFunction,
// and Profile's schedule state machine. See Note [Profiler hook] and Note [Profiler buffers] in
// kiln/profiler.h; profiler_export.cpp turns the buffers into a Trace.
#include "kiln/profiler.h"

#include <chrono>
#include <memory>

#include "kiln/dispatcher.h"
#include "kiln/error.h"
#include "kiln/tensor.h"
#include "profiler_flags.h"
#include "profiler_internal.h"

namespace kiln::profiler {
namespace detail {

std::atomic<bool> g_ops_on{false};
std::atomic<bool> g_memory_on{false};
bool ops_on() { return recording_ops(); }
bool memory_on() { return recording_memory(); }

namespace {

std::atomic<uint32_t> g_epoch{1};
std::atomic<bool> g_shapes{false};
std::atomic<Profile*> g_running{nullptr};

// Initial capacity of a buffer: enough for a few GPT steps before the first reallocation.
constexpr size_t kReserveEvents = size_t{1} << 15;

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

struct Registry {
  std::mutex mu;
  std::vector<std::shared_ptr<ThreadBuffer>> buffers;
  uint32_t next_thread = 1;
};
Registry& registry() {
  static auto* r = new Registry();  // never destroyed: threads may record during exit
  return *r;
}

thread_local ThreadBuffer* tl_buffer = nullptr;
thread_local int16_t tl_depth = 0;

ThreadBuffer* this_thread_buffer() {
  if (__builtin_expect(tl_buffer != nullptr, 1)) return tl_buffer;
  auto b = std::make_shared<ThreadBuffer>();
  b->events.reserve(kReserveEvents);
  b->arena.reserve(kReserveEvents * 4);
  Registry& r = registry();
  std::lock_guard<std::mutex> g(r.mu);
  b->thread = r.next_thread++;
  r.buffers.push_back(b);
  tl_buffer = b.get();
  return tl_buffer;
}

// Moves every buffer's records out; a buffer that had any gets fresh, preallocated storage.
std::vector<Drained> drain_all() {
  std::vector<std::shared_ptr<ThreadBuffer>> bufs;
  {
    Registry& r = registry();
    std::lock_guard<std::mutex> g(r.mu);
    bufs = r.buffers;
  }
  std::vector<Drained> out;
  for (auto& b : bufs) {
    {
      // A buffer with nothing (most often a finished thread's) keeps its storage as it is.
      std::lock_guard<std::mutex> g(b->mu);
      if (b->events.empty() && b->memory.empty()) continue;
    }
    Drained d;
    d.events.reserve(kReserveEvents);
    d.arena.reserve(kReserveEvents * 4);
    {
      std::lock_guard<std::mutex> g(b->mu);
      d.thread = b->thread;
      std::swap(d.events, b->events);
      std::swap(d.arena, b->arena);
      std::swap(d.memory, b->memory);
      std::swap(d.names, b->names);
    }
    if (!d.events.empty() || !d.memory.empty()) out.push_back(std::move(d));
  }
  return out;
}

void push_range(Event::Kind kind, std::string name, int64_t start, int64_t end, int16_t depth,
                uint32_t epoch) {
  ThreadBuffer* b = this_thread_buffer();
  std::lock_guard<std::mutex> g(b->mu);
  b->names.push_back(std::move(name));
  b->events.push_back(RawEvent{nullptr, start, end, 0, 0, 0, 0, epoch,
                               static_cast<int32_t>(b->names.size() - 1), depth, -1, kind,
                               Device()});
}

}  // namespace

void record_memory(const void* ptr, int64_t bytes, int64_t total_allocated, Device device) {
  int64_t t = now_ns();
  uint32_t epoch = g_epoch.load(std::memory_order_relaxed);
  ThreadBuffer* b = this_thread_buffer();
  std::lock_guard<std::mutex> g(b->mu);
  b->memory.push_back(
      RawMemory{t, reinterpret_cast<uint64_t>(ptr), bytes, total_allocated, epoch, device});
}

OpScope::OpScope(const OperatorHandle& op) noexcept
    : op_(&op),
      buf_(this_thread_buffer()),
      start_ns_(now_ns()),
      epoch_(g_epoch.load(std::memory_order_relaxed)) {
  ++tl_depth;
}

OpScope::~OpScope() {
  --tl_depth;
  if (buf_ && !committed_ && locked_) buf_->mu.unlock();
}

bool OpScope::begin_commit() {
  int64_t end = now_ns();
  if (g_epoch.load(std::memory_order_relaxed) != epoch_) return false;
  shapes_ = g_shapes.load(std::memory_order_relaxed);
  buf_->mu.lock();
  locked_ = true;
  end_ns_ = end;
  arena_begin_ = outputs_begin_ = static_cast<uint32_t>(buf_->arena.size());
  return true;
}

void OpScope::tensor_entry(const Tensor& t) {
  if (!t.defined()) {
    if (shapes_) buf_->arena.push_back(entry_header(EntryKind::None, 0, 0));
    return;
  }
  TensorImpl* impl = t.impl();
  bytes_ += impl->numel() * static_cast<int64_t>(impl->itemsize());
  if (!have_device_) {
    device_ = impl->device();
    have_device_ = true;
    dtype_ = static_cast<int8_t>(impl->dtype());
  }
  if (!shapes_) return;
  IntArrayRef sizes = impl->sizes();
  buf_->arena.push_back(
      entry_header(EntryKind::Tensor, static_cast<int>(impl->dtype()), sizes.size()));
  buf_->arena.insert(buf_->arena.end(), sizes.begin(), sizes.end());
}

void OpScope::input(const Tensor& t) { tensor_entry(t); }

void OpScope::input(const std::optional<Tensor>& t) {
  if (t) return tensor_entry(*t);
  if (shapes_) buf_->arena.push_back(entry_header(EntryKind::None, 0, 0));
}

void OpScope::input(ArrayRef<Tensor> ts) {
  if (shapes_) buf_->arena.push_back(entry_header(EntryKind::List, 0, ts.size()));
  for (const Tensor& t : ts) tensor_entry(t);
}

void OpScope::input(const std::vector<Tensor>& ts) { input(ArrayRef<Tensor>(ts)); }

void OpScope::input_other() {
  if (shapes_) buf_->arena.push_back(entry_header(EntryKind::Other, 0, 0));
}

void OpScope::output(const Tensor& t) {
  if (outputs_begin_ == arena_begin_) outputs_begin_ = static_cast<uint32_t>(buf_->arena.size());
  tensor_entry(t);
}

void OpScope::output(const std::vector<Tensor>& ts) {
  for (const Tensor& t : ts) output(t);
}

void OpScope::end_commit() {
  auto end = static_cast<uint32_t>(buf_->arena.size());
  // No output recorded: outputs_begin_ marks the end of the inputs.
  if (outputs_begin_ == arena_begin_) outputs_begin_ = end;
  buf_->events.push_back(RawEvent{op_, start_ns_, end_ns_, bytes_, arena_begin_, outputs_begin_,
                                  end, epoch_, -1, static_cast<int16_t>(tl_depth - 1), dtype_,
                                  Event::Kind::Op, device_});
  committed_ = true;
  buf_->mu.unlock();
}

}  // namespace detail

using detail::g_epoch;
using detail::g_running;
using detail::now_ns;

const char* action_name(ProfilerAction a) {
  switch (a) {
    case ProfilerAction::None:
      return "NONE";
    case ProfilerAction::Warmup:
      return "WARMUP";
    case ProfilerAction::Record:
      return "RECORD";
    case ProfilerAction::RecordAndSave:
      return "RECORD_AND_SAVE";
  }
  return "?";
}

Schedule::Schedule(int64_t wait, int64_t warmup, int64_t active, int64_t repeat, int64_t skip_first)
    : wait(wait), warmup(warmup), active(active), repeat(repeat), skip_first(skip_first) {
  KILN_CHECK(wait >= 0, Value, "schedule: wait must be >= 0, got ", wait);
  KILN_CHECK(warmup >= 0, Value, "schedule: warmup must be >= 0, got ", warmup);
  KILN_CHECK(active >= 1, Value, "schedule: active must be >= 1, got ", active);
  KILN_CHECK(repeat >= 0, Value, "schedule: repeat must be >= 0 (0: repeat forever), got ", repeat);
  KILN_CHECK(skip_first >= 0, Value, "schedule: skip_first must be >= 0, got ", skip_first);
}

ProfilerAction Schedule::operator()(int64_t step) const {
  KILN_CHECK(step >= 0, Value, "schedule: step must be >= 0, got ", step);
  if (step < skip_first) return ProfilerAction::None;
  step -= skip_first;
  int64_t cycle = wait + warmup + active;
  if (repeat > 0 && step / cycle >= repeat) return ProfilerAction::None;
  int64_t pos = step % cycle;
  if (pos < wait) return ProfilerAction::None;
  if (pos < wait + warmup) return ProfilerAction::Warmup;
  return pos == cycle - 1 ? ProfilerAction::RecordAndSave : ProfilerAction::Record;
}

Profile::Profile(ProfilerOptions opts) : opts_(std::move(opts)) {
  for (ProfilerActivity a : opts_.activities) {
    if (a != ProfilerActivity::CUDA) continue;
    warn(
        "profile: ProfilerActivity.CUDA records CUDA ops from the host side (their launch, "
        "device and shapes); device kernel timelines are not traced yet");
    break;
  }
}

Profile::~Profile() {
  if (!running_) return;
  // No callbacks from a destructor: turn recording off and release the profiler.
  detail::g_ops_on.store(false, std::memory_order_relaxed);
  detail::g_memory_on.store(false, std::memory_order_relaxed);
  g_epoch.fetch_add(1, std::memory_order_relaxed);
  g_running.store(nullptr);
}

static bool is_recording(ProfilerAction a) {
  return a == ProfilerAction::Record || a == ProfilerAction::RecordAndSave;
}

void Profile::enter(ProfilerAction a) {
  if (a == ProfilerAction::None) {
    detail::g_ops_on.store(false, std::memory_order_relaxed);
    detail::g_memory_on.store(false, std::memory_order_relaxed);
    return;
  }
  // A new cycle unless recording simply continues: warmup's events are dropped.
  if (!(is_recording(a) && action_ == ProfilerAction::Record) &&
      !(a == ProfilerAction::Warmup && action_ == ProfilerAction::Warmup)) {
    g_epoch.fetch_add(1, std::memory_order_relaxed);
    cycle_first_step_ = step_num_;
  }
  detail::g_shapes.store(opts_.record_shapes || opts_.with_flops, std::memory_order_relaxed);
  detail::g_memory_on.store(opts_.profile_memory, std::memory_order_relaxed);
  detail::g_ops_on.store(true, std::memory_order_relaxed);
}

void Profile::start() {
  KILN_CHECK(!running_, Runtime, "profile: start() called twice");
  Profile* expected = nullptr;
  KILN_CHECK(g_running.compare_exchange_strong(expected, this), Runtime,
             "profile: another profiler is already running in this process (one at a time)");
  running_ = true;
  step_num_ = 0;
  origin_ns_ = now_ns();
  step_start_ns_ = origin_ns_;
  action_ = ProfilerAction::None;
  ProfilerAction a = opts_.schedule ? opts_.schedule(0) : ProfilerAction::Record;
  enter(a);
  action_ = a;
}

void Profile::step() {
  KILN_CHECK(running_, Runtime,
             "profile: step() called while the profiler is not running (call it inside the "
             "`with profile(...)` block, or after start())");
  int64_t now = now_ns();
  ProfilerAction prev = action_;
  if (is_recording(prev))
    detail::push_range(Event::Kind::Step, "ProfilerStep#" + std::to_string(step_num_),
                       step_start_ns_, now, -1, g_epoch.load(std::memory_order_relaxed));
  ++step_num_;
  ProfilerAction next = opts_.schedule ? opts_.schedule(step_num_) : ProfilerAction::Record;
  bool save = prev == ProfilerAction::RecordAndSave || (is_recording(prev) && !is_recording(next));
  if (save) {
    collect(step_num_ - 1);
    action_ = ProfilerAction::None;
  }
  enter(next);
  action_ = next;
  step_start_ns_ = now_ns();
  if (save && opts_.on_trace_ready) opts_.on_trace_ready(*this);
}

void Profile::stop() {
  if (!running_) return;
  bool save = is_recording(action_);
  if (save)
    detail::push_range(Event::Kind::Step, "ProfilerStep#" + std::to_string(step_num_),
                       step_start_ns_, now_ns(), -1, g_epoch.load(std::memory_order_relaxed));
  detail::g_ops_on.store(false, std::memory_order_relaxed);
  detail::g_memory_on.store(false, std::memory_order_relaxed);
  if (save) {
    collect(step_num_);
  } else {
    g_epoch.fetch_add(1, std::memory_order_relaxed);  // drop warmup's events
    detail::drain_all();
  }
  action_ = ProfilerAction::None;
  running_ = false;
  g_running.store(nullptr);
  if (save && opts_.on_trace_ready) opts_.on_trace_ready(*this);
}

void Profile::collect(int64_t last_step) {
  uint32_t epoch = g_epoch.fetch_add(1, std::memory_order_relaxed);
  std::vector<detail::Drained> drained = detail::drain_all();
  Trace t;
  t.record_shapes = opts_.record_shapes;
  t.profile_memory = opts_.profile_memory;
  t.with_flops = opts_.with_flops;
  t.first_step = cycle_first_step_;
  t.last_step = last_step;
  detail::build_trace(drained, epoch, origin_ns_, opts_.record_shapes || opts_.with_flops,
                      opts_.with_flops, t.events_, t.memory_);
  trace_ = std::move(t);
}

const Trace& Profile::trace() const {
  if (trace_) return *trace_;
  if (running_)
    KILN_FAIL(Runtime, "profile: no trace has been collected yet: the profiler is at step ",
              step_num_, " (", action_name(action_),
              "); a trace is ready after stop() (the end of the `with` block) or after the last "
              "active step of a schedule cycle");
  KILN_FAIL(Runtime, "profile: no trace: the profiler has not been started and stopped");
}

RecordFunction::RecordFunction(std::string_view name) {
  if (__builtin_expect(!detail::recording_ops(), 1)) return;
  detail::this_thread_buffer();
  name_ = std::string(name);
  epoch_ = g_epoch.load(std::memory_order_relaxed);
  start_ns_ = now_ns();
  ++detail::tl_depth;
}

RecordFunction::~RecordFunction() {
  if (start_ns_ < 0) return;
  int64_t end = now_ns();
  int16_t depth = --detail::tl_depth;
  if (g_epoch.load(std::memory_order_relaxed) != epoch_) return;
  detail::push_range(Event::Kind::UserRange, std::move(name_), start_ns_, end, depth, epoch_);
}

}  // namespace kiln::profiler
