// libFuzzer harness: Session::run, the executor's entry (fuzz_entries.h), then the same input
// as a multi-tenant, multi-stream sequence (streams.h). Built and run by scripts/fuzz.
#include "fuzz_entries.h"
#include "streams.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  kiln::fuzz::session(data, size);
  kiln::fuzz::streams(data, size);
  return 0;
}
