// Private to the profiler (profiler.cpp records, profiler_export.cpp builds and writes traces):
// the raw per-thread records of Note [Profiler buffers] in kiln/profiler.h.
#pragma once

#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "kiln/profiler.h"

namespace kiln::profiler::detail {

// Arena encoding of one argument or result: a header, then the sizes. A tensor list's header
// counts its elements, each of which follows as a tensor entry.
enum class EntryKind : uint8_t { Other, Tensor, None, List };
inline int64_t entry_header(EntryKind k, int dtype, int64_t n) {
  return (static_cast<int64_t>(k) << 56) | (static_cast<int64_t>(dtype & 0xff) << 48) | n;
}
inline EntryKind entry_kind(int64_t h) { return static_cast<EntryKind>((h >> 56) & 0xff); }
inline int entry_dtype(int64_t h) { return static_cast<int>((h >> 48) & 0xff); }
inline int64_t entry_count(int64_t h) { return h & ((int64_t{1} << 48) - 1); }

struct RawEvent {
  const OperatorHandle* op;  // nullptr: a user or step range (name indexes ThreadBuffer::names)
  int64_t start_ns, end_ns;  // steady_clock
  int64_t bytes;
  uint32_t arena_begin, outputs_begin, arena_end;  // shapes, when recorded
  uint32_t epoch;
  int32_t name;
  int16_t depth;  // the thread's nesting depth when it began (step ranges: -1)
  int8_t dtype;   // -1: none
  Event::Kind kind;
  Device device;
};

struct RawMemory {
  int64_t ts_ns;
  uint64_t addr;
  int64_t bytes;
  int64_t total;
  uint32_t epoch;
  Device device;
};

struct ThreadBuffer {
  std::mutex mu;
  uint32_t thread = 0;
  std::vector<RawEvent> events;
  std::vector<int64_t> arena;
  std::vector<RawMemory> memory;
  std::vector<std::string> names;
};

// A buffer's contents, moved out by the collector.
struct Drained {
  uint32_t thread = 0;
  std::vector<RawEvent> events;
  std::vector<int64_t> arena;
  std::vector<RawMemory> memory;
  std::vector<std::string> names;
};

// Builds the events of cycle `epoch` (times relative to origin_ns) into `events` and `memory`.
void build_trace(std::vector<Drained>& drained, uint32_t epoch, int64_t origin_ns, bool shapes,
                 bool flops, std::vector<Event>& events, std::vector<MemoryEvent>& memory);

}  // namespace kiln::profiler::detail
