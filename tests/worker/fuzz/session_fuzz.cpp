// libFuzzer harness: Session::run, the executor's entry (fuzz_entries.h). Built and run by
// scripts/fuzz.
#include "fuzz_entries.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  kiln::fuzz::session(data, size);
  return 0;
}
