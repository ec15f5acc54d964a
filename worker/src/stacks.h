// worker/src/stacks.h: this process's threads and their native stacks, for a hang report (See
// Note [Hang detection] in coordinator/src/coordinator.cpp).
#pragma once

#include <string>

namespace kiln::worker {

// Note [Thread stacks]: each thread of the process (but the caller) is sent a real-time signal
// whose handler records its return addresses with backtrace() (preloaded once, so the handler
// does not load libgcc); the caller waits up to 200 ms for each, then symbolizes them (exported
// symbols: Kiln's shared libraries' functions are named; the executable's static ones show as
// addresses) and demangles C++ names. At most 64 threads and 32 frames each. A thread that does
// not answer (blocked with the signal masked) is listed without a stack.
std::string thread_stacks();

}  // namespace kiln::worker
