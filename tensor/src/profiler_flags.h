// Private to libkiln_tensor: the profiler's on/off flags that the op hot path reads (See Note
// [Profiler hook] in kiln/profiler.h). Hidden symbols, so the generated ops::X::call, the
// dispatcher and the CPU allocator read them PC-relative, without a GOT load first; other
// libraries ask kiln::profiler::detail::ops_on() / memory_on().
#pragma once

#include <atomic>

namespace kiln::profiler::detail {

[[gnu::visibility("hidden")]] extern std::atomic<bool> g_ops_on;
[[gnu::visibility("hidden")]] extern std::atomic<bool> g_memory_on;
inline bool recording_ops() { return g_ops_on.load(std::memory_order_relaxed); }
inline bool recording_memory() { return g_memory_on.load(std::memory_order_relaxed); }

}  // namespace kiln::profiler::detail
