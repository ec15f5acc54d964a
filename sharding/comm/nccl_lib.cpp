// Loads libnccl on first use (Note [Loading NCCL lazily] in nccl_lib.h).
#include "nccl_lib.h"

#include <dlfcn.h>

#include <string>

#include "kiln/error.h"

namespace kiln::dist {
namespace {

// The soname NCCL 2 installs, then the library CMake found when Kiln was built.
constexpr const char* kSoname = "libnccl.so.2";

void* open_nccl() {
  void* h = dlopen(kSoname, RTLD_NOW | RTLD_LOCAL);
  if (h) return h;
  std::string first = dlerror();
  h = dlopen(KILN_NCCL_LIBRARY_PATH, RTLD_NOW | RTLD_LOCAL);
  KILN_CHECK(h, Runtime, "init_process_group(backend=\"nccl\"): cannot load NCCL (", first, "; ",
             dlerror(), "); install NCCL 2 or put its directory on LD_LIBRARY_PATH");
  return h;
}

NcclLib load() {
  void* h = open_nccl();
  NcclLib lib;
#define KILN_NCCL_RESOLVE(name)                                                        \
  lib.name = reinterpret_cast<decltype(lib.name)>(dlsym(h, "nccl" #name));             \
  KILN_CHECK(lib.name, Runtime,                                                        \
             "init_process_group(backend=\"nccl\"): the loaded NCCL has no nccl" #name \
             " (NCCL 2.18 or newer is needed)");
  KILN_NCCL_FUNCTIONS(KILN_NCCL_RESOLVE)
#undef KILN_NCCL_RESOLVE
  return lib;
}

}  // namespace

const NcclLib& nccl_lib() {
  static const NcclLib lib = load();
  return lib;
}

}  // namespace kiln::dist
